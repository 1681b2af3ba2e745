"""The closed action vocabulary (MobileRL Table 5, in AndroidLab's call syntax)::

    do(action="Tap" | "Long Press", element=[x1, y1, x2, y2])   (or index=i: screen line i, marks frame)
    do(action="Type", text="...")    do(action="Launch", app="Contacts")
    do(action="Swipe", direction="up|down|left|right", dist="short|medium|long"[, element=[...]])
    do(action="Back" | "Home" | "Wait")    finish(message="...")   (message optional)

:func:`parse_action` takes a bare call or a whole ``<think>…</think><answer>…</answer>`` response, parses
with :mod:`ast` (never eval) and raises :class:`ActionParseError` (an invalid step) for anything but one
such call; ``parse_action(format_action(a)) == a``. Boxes are absolute pixels; :func:`to_relative`,
:func:`to_absolute` and :func:`convert_action` convert to the official harness' 0-999 grid.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

TAP, TYPE, SWIPE, LONG_PRESS, LAUNCH = "Tap", "Type", "Swipe", "Long Press", "Launch"
BACK, HOME, WAIT, FINISH = "Back", "Home", "Wait", "Finish"
ACTION_NAMES: tuple[str, ...] = (TAP, TYPE, SWIPE, LONG_PRESS, LAUNCH, BACK, HOME, WAIT, FINISH)
DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right")
DISTANCES: tuple[str, ...] = ("short", "medium", "long")
RELATIVE_GRID = 1000  # relative coordinates live in [0, RELATIVE_GRID - 1]
MAX_RESPONSE_CHARS = 32_768

# Which keyword arguments each action takes: (required, optional).
_SIGNATURES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    TAP: (frozenset(), frozenset({"element", "index"})),  # exactly one of element / index (checked below)
    LONG_PRESS: (frozenset(), frozenset({"element", "index"})),
    TYPE: (frozenset({"text"}), frozenset()),
    SWIPE: (frozenset({"direction"}), frozenset({"dist", "element"})),
    LAUNCH: (frozenset({"app"}), frozenset()),
    BACK: (frozenset(), frozenset()),
    HOME: (frozenset(), frozenset()),
    WAIT: (frozenset(), frozenset()),
}

Box = tuple[int, int, int, int]


class ActionParseError(ValueError):
    """Model output that is not exactly one well-formed action."""


@dataclass(frozen=True, slots=True)
class Action:
    """One agent action. Only the fields its ``name`` uses are set."""

    name: str
    element: Box | None = None
    text: str | None = None
    app: str | None = None
    direction: str | None = None
    dist: str | None = None
    message: str | None = None
    index: int | None = None  # Set-of-Mark: the screen line the action names (instead of ``element``)

    def __post_init__(self) -> None:
        if self.name not in ACTION_NAMES:
            raise ActionParseError(f"unknown action {self.name!r}; expected one of {', '.join(ACTION_NAMES)}")
        if self.element is not None:
            object.__setattr__(self, "element", _check_box(self.element))
        if self.index is not None and (isinstance(self.index, bool) or not isinstance(self.index, int)
                                       or self.index < 0):
            raise ActionParseError(f"index must be a non-negative integer, got {self.index!r}")
        if self.direction is not None and self.direction not in DIRECTIONS:
            raise ActionParseError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.dist is not None and self.dist not in DISTANCES:
            raise ActionParseError(f"dist must be one of {DISTANCES}, got {self.dist!r}")

    @property
    def center(self) -> tuple[int, int] | None:
        if self.element is None:
            return None
        x1, y1, x2, y2 = self.element
        return (x1 + x2) // 2, (y1 + y2) // 2

    def to_dict(self) -> dict:
        d = {k: (list(v) if k == "element" and v is not None else v) for k, v in _fields(self).items()}
        if d["index"] is None:
            del d["index"]  # records written before index actions existed stay byte-identical
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Action:
        element = d.get("element")
        return cls(
            name=d["name"],
            element=tuple(element) if element is not None else None,  # type: ignore[arg-type]
            text=d.get("text"),
            app=d.get("app"),
            direction=d.get("direction"),
            dist=d.get("dist"),
            message=d.get("message"),
            index=d.get("index"),
        )

    def __str__(self) -> str:
        return format_action(self)


def _fields(a: Action) -> dict:
    return {
        "name": a.name,
        "element": a.element,
        "text": a.text,
        "app": a.app,
        "direction": a.direction,
        "dist": a.dist,
        "message": a.message,
        "index": a.index,
    }


def _check_box(value: object) -> Box:
    if not isinstance(value, list | tuple) or len(value) != 4:
        raise ActionParseError(f"element must be a list of 4 integers [x1,y1,x2,y2], got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ActionParseError(f"element coordinates must be integers, got {value!r}")
    x1, y1, x2, y2 = value
    if min(value) < 0:
        raise ActionParseError(f"element coordinates must be non-negative, got {list(value)}")
    if x2 < x1 or y2 < y1:
        raise ActionParseError(f"element must have x1<=x2 and y1<=y2, got {list(value)}")
    return (x1, y1, x2, y2)


_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CALL_RE = re.compile(r"\b(do|finish)\s*\(", re.DOTALL)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def extract_answer(text: str) -> str:
    """The action part of a response: the ``<answer>`` body if present, else the text itself."""
    if "<answer>" in text or "</answer>" in text:
        m = _ANSWER_RE.search(text)
        if m is None:
            raise ActionParseError("response has an unterminated <answer> tag")
        return m.group(1).strip()
    if "<think>" in text:
        # Reasoning without answer tags: take what follows the reasoning.
        _, sep, rest = text.partition("</think>")
        if not sep:
            raise ActionParseError("response has <think> but no </think> and no <answer>")
        return rest.strip()
    return text.strip()


def parse_action(text: str) -> Action:
    """Parse one action from a bare call or a full ``<think>…</think><answer>…</answer>`` response."""
    if not isinstance(text, str):
        raise ActionParseError(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_RESPONSE_CHARS:
        raise ActionParseError(f"response longer than {MAX_RESPONSE_CHARS} characters")
    body = _FENCE_RE.sub("", extract_answer(text)).strip()
    if not body:
        raise ActionParseError("empty action")
    calls = _CALL_RE.findall(body)
    if not calls:
        raise ActionParseError(f"no do(...) or finish(...) call in {body[:80]!r}")
    try:
        tree = ast.parse(_literal_backslashes(body), mode="eval")
    except SyntaxError as e:
        raise ActionParseError(f"malformed action {body[:80]!r}: {e.msg}") from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionParseError(f"expected exactly one do(...) or finish(...) call, got {body[:80]!r}")
    if call.args:
        raise ActionParseError(f"{call.func.id}() takes keyword arguments only")
    kwargs: dict[str, object] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionParseError("**kwargs are not allowed in an action")
        if kw.arg in kwargs:
            raise ActionParseError(f"argument {kw.arg!r} given twice")
        kwargs[kw.arg] = _literal(kw.arg, kw.value)

    if call.func.id == "finish":
        unknown = set(kwargs) - {"message"}
        if unknown:
            raise ActionParseError(f"finish() got unexpected argument(s) {sorted(unknown)}")
        message = kwargs.get("message")
        if message is not None and not isinstance(message, str):
            raise ActionParseError("finish(message=...) must be a string")
        return Action(FINISH, message=message)
    if call.func.id != "do":
        raise ActionParseError(f"unknown function {call.func.id!r}; expected do(...) or finish(...)")

    name = kwargs.pop("action", None)
    if not isinstance(name, str):
        raise ActionParseError('do(...) needs action="<name>" as a string')
    name = _canonical_name(name)
    if name == FINISH:  # do(action="Finish", message=...) is accepted as an alias
        message = kwargs.pop("message", None)
        if kwargs:
            raise ActionParseError(f"Finish got unexpected argument(s) {sorted(kwargs)}")
        return Action(FINISH, message=message if isinstance(message, str) else None)
    required, optional = _SIGNATURES[name]
    missing = required - kwargs.keys()
    if missing:
        raise ActionParseError(f"{name} needs argument(s) {sorted(missing)}")
    unknown = kwargs.keys() - required - optional
    if unknown:
        raise ActionParseError(f"{name} got unexpected argument(s) {sorted(unknown)}")
    for key in ("text", "app", "direction", "dist"):
        if key in kwargs and not isinstance(kwargs[key], str):
            raise ActionParseError(f"{name}: {key} must be a string")
    element = kwargs.get("element")
    if element is not None and not isinstance(element, list):
        raise ActionParseError(f"{name}: element must be a list [x1,y1,x2,y2]")
    index = kwargs.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise ActionParseError(f"{name}: index must be an integer")
    if name in (TAP, LONG_PRESS) and element is None and index is None:
        raise ActionParseError(f"{name} needs argument element=[x1,y1,x2,y2] (or index=i)")
    if element is not None and index is not None:
        raise ActionParseError(f"{name} takes element=[...] or index=i, not both")
    if name == SWIPE and "dist" not in kwargs:
        kwargs["dist"] = "medium"
    return Action(
        name,
        element=tuple(element) if element is not None else None,  # type: ignore[arg-type]
        text=kwargs.get("text"),  # type: ignore[arg-type]
        app=kwargs.get("app"),  # type: ignore[arg-type]
        direction=kwargs.get("direction"),  # type: ignore[arg-type]
        dist=kwargs.get("dist"),  # type: ignore[arg-type]
        index=index,  # type: ignore[arg-type]
    )


# Inside a string literal, the escapes format_action writes (and \' in a single-quoted one); any other
# backslash is the character itself, as the model wrote it.
_ESCAPES = frozenset("\\\"'n")


def _literal_backslashes(body: str) -> str:
    r"""``body`` with each backslash in a string literal that starts none of the escapes :func:`_quote`
    writes (``\\``, ``\"``, ``\n``; and ``\'``) doubled, so that :mod:`ast` reads the literal in that
    grammar, not Python's: ``text="555-\2"`` ends in the two characters ``\2``, not in U+0002, and
    ``text="C:\x"`` is a path, not a truncated ``\x`` escape. Raw literals (``r"..."``) are left as they are."""
    out: list[str] = []
    quote, raw, i, n = "", False, 0, len(body)
    while i < n:
        c = body[i]
        if not quote:
            if c in "\"'":
                quote, raw = c, i > 0 and body[i - 1] in "rR"
            out.append(c)
            i += 1
        elif c == "\\":
            nxt = body[i + 1:i + 2]
            if raw or nxt in _ESCAPES:
                out.append(body[i:i + 2])  # a raw literal's backslash still keeps a quote from ending it
                i += 2
            else:
                out.append("\\\\")
                i += 1
        else:
            if c == quote:
                quote = ""
            out.append(c)
            i += 1
    return "".join(out)


def _canonical_name(name: str) -> str:
    key = name.strip().lower().replace("_", " ")
    for n in ACTION_NAMES:
        if n.lower() == key:
            return n
    if key in {"longpress", "long-press"}:
        return LONG_PRESS
    raise ActionParseError(f"unknown action {name!r}; expected one of {', '.join(ACTION_NAMES)}")


def _literal(arg: str, node: ast.expr) -> object:
    if isinstance(node, ast.Constant) and (isinstance(node.value, str) or node.value is None):
        return node.value
    if arg == "index" and isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        values = []
        for elt in node.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, int) and not isinstance(elt.value, bool):
                values.append(elt.value)
            elif (
                isinstance(elt, ast.UnaryOp)
                and isinstance(elt.op, ast.USub)
                and isinstance(elt.operand, ast.Constant)
                and isinstance(elt.operand.value, int)
            ):
                values.append(-elt.operand.value)
            else:
                raise ActionParseError(f"{arg}: list items must be integer literals")
        return values
    raise ActionParseError(f"{arg}: only string literals, integer lists and an integer index are allowed")


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def format_action(action: Action) -> str:
    """The canonical text of an action; ``parse_action(format_action(a)) == a``."""
    if action.name == FINISH:
        return "finish()" if action.message is None else f"finish(message={_quote(action.message)})"
    parts = [f"action={_quote(action.name)}"]
    if action.element is not None:
        parts.append("element=[" + ",".join(str(v) for v in action.element) + "]")
    if action.index is not None:
        parts.append(f"index={action.index}")
    for key in ("text", "app", "direction", "dist"):
        value = getattr(action, key)
        if value is not None:
            parts.append(f"{key}={_quote(value)}")
    return "do(" + ", ".join(parts) + ")"


def to_relative(box: Box, width: int, height: int) -> Box:
    """Absolute pixels → the 0-999 grid of the official harness."""

    def conv(v: int, size: int) -> int:
        return max(0, min(RELATIVE_GRID - 1, round(v * RELATIVE_GRID / size)))

    x1, y1, x2, y2 = box
    return (conv(x1, width), conv(y1, height), conv(x2, width), conv(y2, height))


def to_absolute(box: Box, width: int, height: int) -> Box:
    """0-999 grid → absolute pixels (inverse of :func:`to_relative` up to one grid cell)."""
    for v in box:
        if not 0 <= v < RELATIVE_GRID:
            raise ActionParseError(f"relative coordinate {v} outside [0, {RELATIVE_GRID - 1}]")
    x1, y1, x2, y2 = box
    return (
        round(x1 * width / RELATIVE_GRID),
        round(y1 * height / RELATIVE_GRID),
        round(x2 * width / RELATIVE_GRID),
        round(y2 * height / RELATIVE_GRID),
    )


def convert_action(action: Action, width: int, height: int, to: str) -> Action:
    """Convert an action's element between ``"relative"`` and ``"absolute"`` coordinates."""
    if action.element is None:
        return action
    if to == "relative":
        return replace(action, element=to_relative(action.element, width, height))
    if to == "absolute":
        return replace(action, element=to_absolute(action.element, width, height))
    raise ValueError(f"to must be 'relative' or 'absolute', got {to!r}")
