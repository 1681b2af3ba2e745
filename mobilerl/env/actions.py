"""The closed action vocabulary (MobileRL Table 5, in AndroidLab's call syntax)::

    do(action="Tap" | "Long Press", element=[x1, y1, x2, y2])   (or index=i: screen line i, marks frame)
    do(action="Type", text="...")    do(action="Launch", app="Contacts")
    do(action="Swipe", direction="up|down|left|right", dist="short|medium|long"[, element=[...]])
    do(action="Swipe", start=[x, y], end=[x, y])   (a precise swipe, MobileRL's AndroidWorld executor)
    do(action="Type", text="...", clear=True)   (clear the field first)
    do(action="Back" | "Home" | "Wait" | "Enter")    finish(message="...")   (message optional)

:func:`parse_action` takes a bare call or a whole ``<think>…</think><answer>…</answer>`` response, parses
with :mod:`ast` (never eval) and raises :class:`ActionParseError` (an invalid step) for anything but one
such call; ``parse_action(format_action(a)) == a``. Text this strict reading rejects gets a second
reading the way the official harnesses (AndroidLab, MobileRL) read a response; see :func:`harness_body`.
Boxes are absolute pixels; :func:`to_relative`, :func:`to_absolute` and :func:`convert_action` convert to
the official harness' 0-999 grid.
"""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass, replace

TAP, TYPE, SWIPE, LONG_PRESS, LAUNCH = "Tap", "Type", "Swipe", "Long Press", "Launch"
BACK, HOME, WAIT, ENTER, FINISH = "Back", "Home", "Wait", "Enter", "Finish"
ACTION_NAMES: tuple[str, ...] = (TAP, TYPE, SWIPE, LONG_PRESS, LAUNCH, BACK, HOME, WAIT, ENTER, FINISH)
DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right")
DISTANCES: tuple[str, ...] = ("short", "medium", "long")
RELATIVE_GRID = 1000  # relative coordinates live in [0, RELATIVE_GRID - 1]
MAX_RESPONSE_CHARS = 32_768

# Which keyword arguments each action takes: (required, optional).
_SIGNATURES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    TAP: (frozenset(), frozenset({"element", "index"})),  # exactly one of element / index (checked below)
    LONG_PRESS: (frozenset(), frozenset({"element", "index"})),
    TYPE: (frozenset({"text"}), frozenset({"clear"})),
    SWIPE: (frozenset(), frozenset({"direction", "dist", "element", "start", "end"})),  # direction or start+end
    LAUNCH: (frozenset({"app"}), frozenset()),
    BACK: (frozenset(), frozenset()),
    HOME: (frozenset(), frozenset()),
    WAIT: (frozenset(), frozenset()),
    ENTER: (frozenset(), frozenset()),
}
_ALIASES = {"longpress": LONG_PRESS, "long-press": LONG_PRESS, "press back": BACK}  # "Press Back": MobileRL

Box = tuple[int, int, int, int]
Point = tuple[int, int]


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
    clear: bool = False  # Type: clear the field before typing
    start: Point | None = None  # precise Swipe: where the finger goes down ...
    end: Point | None = None  # ... and where it lifts

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
        if not isinstance(self.clear, bool):
            raise ActionParseError(f"clear must be True or False, got {self.clear!r}")
        if (self.start is None) != (self.end is None):
            raise ActionParseError("a precise swipe needs both start=[x, y] and end=[x, y]")
        if self.start is not None and self.end is not None:
            start, end = _check_point("start", self.start), _check_point("end", self.end)
            object.__setattr__(self, "start", start)
            object.__setattr__(self, "end", end)
            if self.direction is None:  # backends that only swipe by direction (simulator, AndroidWorld) need one
                object.__setattr__(self, "direction", _finger_direction(start, end))

    @property
    def center(self) -> tuple[int, int] | None:
        if self.element is None:
            return None
        x1, y1, x2, y2 = self.element
        return (x1 + x2) // 2, (y1 + y2) // 2

    def to_dict(self) -> dict:
        d = {k: (list(v) if k == "element" and v is not None else v) for k, v in _fields(self).items()}
        for key, unset in (("index", None), ("clear", False), ("start", None), ("end", None)):
            if d[key] == unset:
                del d[key]  # records written before these fields existed stay byte-identical
            elif key in ("start", "end"):
                d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Action:
        element, start, end = d.get("element"), d.get("start"), d.get("end")
        return cls(
            name=d["name"],
            element=tuple(element) if element is not None else None,  # type: ignore[arg-type]
            text=d.get("text"),
            app=d.get("app"),
            direction=d.get("direction"),
            dist=d.get("dist"),
            message=d.get("message"),
            index=d.get("index"),
            clear=d.get("clear", False),
            start=tuple(start) if start is not None else None,  # type: ignore[arg-type]
            end=tuple(end) if end is not None else None,  # type: ignore[arg-type]
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
        "clear": a.clear,
        "start": a.start,
        "end": a.end,
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


def _check_point(name: str, value: object) -> Point:
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise ActionParseError(f"{name} must be a point [x, y] of 2 non-negative integers, got {value!r}")
    return (value[0], value[1])


def _finger_direction(start: Point, end: Point) -> str:
    """The way the finger moves along the longer axis ("up" when it moves up the screen)."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    if dx == dy == 0:
        raise ActionParseError(f"a precise swipe needs distinct start and end points, got {list(start)} twice")
    if abs(dy) >= abs(dx):
        return "up" if dy < 0 else "down"
    return "left" if dx < 0 else "right"


# Every pattern here runs in linear time on any input (each quantifier is followed by something it cannot
# match, so nothing backtracks over a long run twice); tags and fences are found with str.find, not with a
# lazy ".*?" between two delimiters, which is quadratic when the closing one is missing.
_CALL_RE = re.compile(r"\b(do|finish)\s*\(")
_FENCE_OPEN_RE = re.compile(r"```[a-zA-Z]*\s*")
# The harness reading: an <answer> or <ans> body, closed or running to the end (MobileRL's extract_think_ans);
# the last line of a fenced block (AndroidLab's "* Operation:" block); the call after "Action:".
_HARNESS_ANSWER_RE = re.compile(r"<(answer|ans)>")
_ACTION_PREFIX_RE = re.compile(r"^\s*Action:\s*")
# A text= / message= string that ends the call runs to the first '")' (MobileRL's v4 executor).
_LAST_STRING_OPEN_RE = re.compile(r'\b(?:text|message)\s*=\s*"')
_LAST_STRING_CLOSE_RE = re.compile(r'"\s*\)')
_NEXT_ARG_RE = re.compile(r'"\s*,\s*[A-Za-z_]\w*\s*=')  # `", app="…`: another argument, not an inner quote


BOX_MARKERS = ("<|begin_of_box|>", "<|end_of_box|>")  # GLM-4.1V-Thinking wraps its answer in them


def extract_answer(text: str) -> str:
    """The action part of a response: the ``<answer>`` body if present (without GLM's box markers), else the
    text itself."""
    if "<answer>" in text or "</answer>" in text:
        start = text.find("<answer>")
        end = -1 if start < 0 else text.find("</answer>", start + len("<answer>"))
        if end < 0:
            raise ActionParseError("response has an unterminated <answer> tag")
        body = text[start + len("<answer>"):end]
        for marker in BOX_MARKERS:
            body = body.replace(marker, "")
        return body.strip()
    if "<think>" in text:
        # Reasoning without answer tags: take what follows the reasoning.
        _, sep, rest = text.partition("</think>")
        if not sep:
            raise ActionParseError("response has <think> but no </think> and no <answer>")
        return rest.strip()
    return text.strip()


def harness_body(text: str) -> str:
    """The action text the official harnesses would execute from a response.

    MobileRL (``android_lab/evaluation``): the ``<answer>`` or ``<ans>`` body, also when unterminated; else
    what follows ``</think>``. AndroidLab (``evaluation/definition.py``, ``page_executor``): the last line
    of the first fenced block; of several lines, the first holding ``Action:``, read without that label.
    MobileRL's v4 executor: quotes inside a ``text=``/``message=`` string that ends the call are the text's
    own, unless one is followed by ``, name=`` (MobileRL would type ``a", clear="yes``; here that is a
    malformed argument list). Leading zeros (``[012, …]``) and raw newlines in strings are handled by
    :func:`_parse_call` with ``lenient=True``.
    """
    m = _HARNESS_ANSWER_RE.search(text)
    if m is not None:
        end = text.find(f"</{m.group(1)}>", m.end())
        if end < 0:  # unterminated: the rest of the response (less a final newline, as the harness' "$" reads)
            end = len(text) - 1 if text.endswith("\n") and len(text) > m.end() else len(text)
        body = text[m.end():end]
    else:
        _, sep, rest = text.partition("</think>")
        body = rest if sep else text
    fence = _fenced_block(body)
    if fence is not None:
        body = fence.strip().split("\n")[-1]
    lines = body.strip().split("\n")
    if len(lines) > 1:
        body = next((line for line in lines if "Action:" in line), body)
    body = _ACTION_PREFIX_RE.sub("", body).strip()
    last = _last_string(body)
    if last is not None and not _NEXT_ARG_RE.search(last[1]):
        head, value, tail = last
        body = f'{head}"{_escape_bare_quotes(value)}"{tail}'
    return body


def _strip_fences(body: str) -> str:
    """``body`` without a leading code fence (three backticks and a language name) and a trailing one, with
    the whitespace next to them."""
    m = _FENCE_OPEN_RE.match(body)
    start = m.end() if m is not None else 0
    end = len(body)
    if body.endswith("```") and end - 3 >= start:
        end = len(body[start:end - 3].rstrip()) + start
    return body[start:end]


def _fenced_block(body: str) -> str | None:
    """What lies between the first code fence (three backticks) and the next (at least one character), or None."""
    start = body.find("```")
    if start < 0:
        return None
    end = body.find("```", start + 4)
    return None if end < 0 else body[start + 3:end]


def _last_string(body: str) -> tuple[str, str, str] | None:
    """``(head, value, tail)`` of the first ``text="`` / ``message="`` string, read to the first ``")``."""
    opening = _LAST_STRING_OPEN_RE.search(body)
    if opening is None:
        return None
    closing = _LAST_STRING_CLOSE_RE.search(body, opening.end())
    if closing is None:
        return None
    return body[:opening.end() - 1], body[opening.end():closing.start()], body[closing.start() + 1:]


def _escape_bare_quotes(value: str) -> str:
    """``value`` with each ``"`` that no backslash escapes written ``\\"``."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\":
            out.append(value[i:i + 2])
            i += 2
            continue
        out.append('\\"' if value[i] == '"' else value[i])
        i += 1
    return "".join(out)


def parse_action(text: str) -> Action:
    """Parse one action from a bare call or a full ``<think>…</think><answer>…</answer>`` response.

    The strict reading (:func:`extract_answer`) decides whenever it yields an action, so what it accepted
    before the harness reading existed parses exactly as it did; only text it rejects is read again by
    :func:`harness_body`, and its error is the one raised when neither reading yields an action.
    """
    if not isinstance(text, str):
        raise ActionParseError(f"expected a string, got {type(text).__name__}")
    if len(text) > MAX_RESPONSE_CHARS:
        raise ActionParseError(f"response longer than {MAX_RESPONSE_CHARS} characters")
    try:
        try:
            return _parse_call(_strip_fences(extract_answer(text)).strip(), lenient=False)
        except ActionParseError as strict_error:
            try:
                return _parse_call(harness_body(text), lenient=True)
            except ActionParseError:
                raise strict_error from None
    except ActionParseError:
        raise
    except Exception as e:  # defence in depth: model output must never raise anything but an invalid step
        raise ActionParseError(f"unparseable action ({type(e).__name__})") from None


# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: concurrent parses in
# threads (rollout workers in threads, RL's ThreadWorkers) can raise "SystemError: AST constructor recursion depth
# mismatch" (cpython gh-106905)
_AST_LOCK = threading.Lock()


def _parse_call(body: str, *, lenient: bool) -> Action:
    if not body:
        raise ActionParseError("empty action")
    calls = _CALL_RE.findall(body)
    if not calls:
        raise ActionParseError(f"no do(...) or finish(...) call in {body[:80]!r}")
    source = _normalize_literals(body, lenient=lenient)
    _check_shape(source)
    try:
        with _AST_LOCK:
            tree = ast.parse(source, mode="eval")
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
    if name == SWIPE and "direction" not in kwargs and not {"start", "end"} <= kwargs.keys():
        missing = {"direction"}
    if missing:
        raise ActionParseError(f"{name} needs argument(s) {sorted(missing)}")
    unknown = kwargs.keys() - required - optional
    if unknown:
        raise ActionParseError(f"{name} got unexpected argument(s) {sorted(unknown)}")
    for key in ("text", "app", "direction", "dist"):
        if key in kwargs and not isinstance(kwargs[key], str):
            raise ActionParseError(f"{name}: {key} must be a string")
    if "clear" in kwargs and not isinstance(kwargs["clear"], bool):
        raise ActionParseError(f"{name}: clear must be True or False")
    element = kwargs.get("element")
    if element is not None and not isinstance(element, list):
        raise ActionParseError(f"{name}: element must be a list [x1,y1,x2,y2]")
    if isinstance(element, list) and len(element) == 2:
        element = element * 2  # a point [x, y] is the box [x, y, x, y], as MobileRL's evaluation reads it
    index = kwargs.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise ActionParseError(f"{name}: index must be an integer")
    if name in (TAP, LONG_PRESS) and element is None and index is None:
        raise ActionParseError(f"{name} needs argument element=[x1,y1,x2,y2] (or index=i)")
    if element is not None and index is not None:
        raise ActionParseError(f"{name} takes element=[...] or index=i, not both")
    start, end = kwargs.get("start"), kwargs.get("end")
    if name == SWIPE and "dist" not in kwargs and start is None:
        kwargs["dist"] = "medium"
    return Action(
        name,
        element=tuple(element) if element is not None else None,  # type: ignore[arg-type]
        text=kwargs.get("text"),  # type: ignore[arg-type]
        app=kwargs.get("app"),  # type: ignore[arg-type]
        direction=kwargs.get("direction"),  # type: ignore[arg-type]
        dist=kwargs.get("dist"),  # type: ignore[arg-type]
        index=index,  # type: ignore[arg-type]
        clear=kwargs.get("clear", False),  # type: ignore[arg-type]
        start=tuple(start) if isinstance(start, list) else start,  # type: ignore[arg-type]
        end=tuple(end) if isinstance(end, list) else end,  # type: ignore[arg-type]
    )


# Bounds on the code (outside string literals) handed to ast.parse. An action is a call with a few literal
# arguments (depth 2, under 20 operators and brackets, coordinates of a few digits); ast.parse of thousands of
# nested levels (a chain of "-", "+", "()", "[0]", "not", ".") raises RecursionError or MemoryError while
# building the tree, and a literal of thousands of digits a ValueError (int's digit limit). Checked first,
# in one linear pass, so parsing stays fast and every failure is an ActionParseError.
MAX_NESTING = 16  # open brackets ( [ { at once
MAX_OPERATORS = 64  # operator characters, keyword operators and opening brackets in all
MAX_NUMBER_CHARS = 32  # characters of one numeric literal
MAX_TOKENS = 256  # names, literals, operators and brackets in all (keeps ast.parse's own work small too)
_OPERATOR_WORDS = frozenset({"not", "and", "or", "if", "else", "lambda", "await", "for", "in", "is", "async",
                             "yield"})
_F_PREFIXES = frozenset({"f", "rf", "fr"})
_STRING_PREFIXES = frozenset({"r", "u", "b", "br", "rb"}) | _F_PREFIXES
# The next thing the pass below looks at: a quote, a word (a name, a keyword, a string prefix or a number), a
# comment, a bracket or an operator character; what lies between (spaces, commas, "=") is skipped in C.
_SHAPE_TOKEN_RE = re.compile(r"""["']|\w+|[#()\[\]{}+\-*/%@&|^~<>!.:]""")
_NUMBER_RE = re.compile(r"[0-9][\w.]*")
# The rest of a string literal's body up to its closing quote (unrolled loops: linear, never backtrack).
_STRING_BODY_RE = {
    '"': re.compile(r'[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*'),
    "'": re.compile(r"[^'\\\n]*(?:\\[\s\S][^'\\\n]*)*"),
    '"""': re.compile(r'[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*'),
    "'''": re.compile(r"[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*"),
}


def _check_shape(source: str) -> None:
    """Raise :class:`ActionParseError` unless ``source`` is within the bounds above; one pass, skipping
    string literals and comments the way Python's tokenizer does. f-strings are refused here: their
    ``{…}`` parts are code this pass would not see (and no action argument may be one)."""
    depth = operators = tokens = i = 0
    n = len(source)
    while True:
        token = _SHAPE_TOKEN_RE.search(source, i)
        if token is None:
            return
        i, c = token.end(), token.group()
        tokens += 1
        if tokens > MAX_TOKENS:
            raise ActionParseError(f"action has more than {MAX_TOKENS} tokens")
        if c[0].isalnum() or c[0] == "_":
            if source[i:i + 1] in ("\"", "'") and c.lower() in _STRING_PREFIXES:
                if c.lower() in _F_PREFIXES:
                    raise ActionParseError("f-strings are not allowed in an action")
                continue  # the quote comes next
            if "0" <= c[0] <= "9":
                number = _NUMBER_RE.match(source, token.start())
                i = number.end() if number is not None else i
                if i - token.start() > MAX_NUMBER_CHARS:
                    raise ActionParseError(f"numeric literal longer than {MAX_NUMBER_CHARS} characters")
            elif c in _OPERATOR_WORDS:
                operators += 1
        elif c in "\"'":
            quote = source[i - 1:i + 2] if source[i - 1:i + 2] in ('"""', "'''") else c
            i += len(quote) - 1
            body = _STRING_BODY_RE[quote].match(source, i)
            i = body.end() if body is not None else n
            if not source.startswith(quote, i):
                return  # unterminated: ast.parse stops there with a SyntaxError
            i += len(quote)
        elif c == "#":
            newline = source.find("\n", i)
            i = n if newline < 0 else newline + 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        else:
            operators += 1  # an operator character, or an opening bracket (a call or subscript chain)
            if c in "([{":
                depth += 1
                if depth > MAX_NESTING:
                    raise ActionParseError(f"action nested deeper than {MAX_NESTING} brackets")
        if operators > MAX_OPERATORS:
            raise ActionParseError(f"action has more than {MAX_OPERATORS} operators and brackets")


# Inside a string literal, the escapes format_action writes (and \' in a single-quoted one); any other
# backslash is the character itself, as the model wrote it.
_ESCAPES = frozenset("\\\"'n")
_OUTSIDE_RE = re.compile(r"[\"']")
_OUTSIDE_LENIENT_RE = re.compile(r"[\"']|(?<![\w.])0")  # a quote, or a zero that may lead an integer
# A literal's body: up to the first quote no backslash escapes (a backslash keeps any next character from
# ending it, as in Python, also in a raw literal).
_LITERAL_BODY_RE = {'"': re.compile(r'[^"\\]*(?:\\[\s\S][^"\\]*)*'), "'": re.compile(r"[^'\\]*(?:\\[\s\S][^'\\]*)*")}
_ESCAPE_PAIR_RE = re.compile(r"(\\[\\\"'n])")  # the escapes kept as written, left to right
_RAW_PAIR_RE = re.compile(r"(\\[\s\S])")  # in a raw literal a backslash and the next character stay together


def _normalize_string(content: str, *, raw: bool, lenient: bool) -> str:
    """A literal's body with other backslashes doubled (not in a raw literal) and, if ``lenient``, raw
    newlines written ``\\n`` (not one a raw literal's backslash precedes)."""
    if "\\" not in content and not (lenient and "\n" in content):
        return content
    parts = (_RAW_PAIR_RE if raw else _ESCAPE_PAIR_RE).split(content)  # [plain, pair, plain, ..., plain]
    for k in range(0, len(parts), 2):
        plain = parts[k] if raw else parts[k].replace("\\", "\\\\")
        parts[k] = plain.replace("\n", "\\n") if lenient else plain
    return "".join(parts)


def _normalize_literals(body: str, *, lenient: bool) -> str:
    r"""``body`` with each backslash in a string literal that starts none of the escapes :func:`_quote`
    writes (``\\``, ``\"``, ``\n``; and ``\'``) doubled, so that :mod:`ast` reads the literal in that
    grammar, not Python's: ``text="555-\2"`` ends in the two characters ``\2``, not in U+0002, and
    ``text="C:\x"`` is a path, not a truncated ``\x`` escape. Raw literals (``r"..."``) are left as they are.

    ``lenient`` (the harness reading) also writes a raw newline in a string as ``\n`` and drops leading
    zeros from integers outside strings (``[012, 0450]``), as MobileRL's and AndroidLab's executors do."""
    out: list[str] = []
    i, n, literals = 0, len(body), 0
    outside = _OUTSIDE_LENIENT_RE if lenient else _OUTSIDE_RE
    while i < n:  # from one quote or leading zero to the next, each literal's body in one step (linear, in C)
        m = outside.search(body, i)
        j = n if m is None else m.start()
        out.append(body[i:j])
        if m is None:
            break
        if body[j] == "0":
            if not body[j + 1:j + 2].isdigit():
                out.append("0")
                i = j + 1
                continue
            while body[j + 1:j + 2] == "0" and body[j + 2:j + 3].isdigit():
                j += 1  # keep the last zero of "000" and the digits of "0012"
            i = j + 1
            continue
        literals += 1
        if literals > MAX_TOKENS:
            raise ActionParseError(f"action has more than {MAX_TOKENS} tokens")
        quote, raw = body[j], j > 0 and body[j - 1] in "rR"
        end = _LITERAL_BODY_RE[quote].match(body, j + 1).end()  # type: ignore[union-attr]  # `*` always matches
        closed = body.startswith(quote, end)
        if not closed:
            end = n  # unterminated (or a lone backslash at the very end): the literal runs to the end
        out += [quote, _normalize_string(body[j + 1:end], raw=raw, lenient=lenient), quote if closed else ""]
        i = end + closed
    return "".join(out)


def _canonical_name(name: str) -> str:
    key = name.strip().lower().replace("_", " ")
    for n in ACTION_NAMES:
        if n.lower() == key:
            return n
    if key in _ALIASES:
        return _ALIASES[key]
    raise ActionParseError(f"unknown action {name!r}; expected one of {', '.join(ACTION_NAMES)}")


def _literal(arg: str, node: ast.expr) -> object:
    if isinstance(node, ast.Constant) and (isinstance(node.value, str) or node.value is None):
        return node.value
    if arg == "index" and isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if arg == "clear" and isinstance(node, ast.Constant) and isinstance(node.value, bool):
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
    raise ActionParseError(
        f"{arg}: only string literals, integer lists, an integer index and clear=True/False are allowed"
    )


def _quote(s: str) -> str:
    r"""``s`` as a string literal both this parser and MobileRL's v4 executor read back: in double quotes
    unless it holds a quote or a backslash, then in single quotes. (MobileRL rewrites the body of
    ``text="…")`` with :func:`re.sub`, which turns ``\"`` into a syntax error and ``\\`` into an escape
    of the next character; it leaves single-quoted strings to Python.)"""
    q = "'" if '"' in s or "\\" in s else '"'
    return q + s.replace("\\", "\\\\").replace(q, "\\" + q).replace("\n", "\\n") + q


def format_action(action: Action) -> str:
    """The canonical text of an action; ``parse_action(format_action(a)) == a``."""
    if action.name == FINISH:
        return "finish()" if action.message is None else f"finish(message={_quote(action.message)})"
    parts = [f"action={_quote(action.name)}"]
    if action.element is not None:
        parts.append("element=[" + ",".join(str(v) for v in action.element) + "]")
    if action.index is not None:
        parts.append(f"index={action.index}")
    if action.start is not None and action.end is not None:
        parts.append(f"start=[{action.start[0]},{action.start[1]}], end=[{action.end[0]},{action.end[1]}]")
    for key in ("text", "app", "direction", "dist"):
        value = getattr(action, key)
        if value is not None:
            parts.append(f"{key}={_quote(value)}")
    if action.clear:
        parts.append("clear=True")
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
    """Convert an action's element and precise-swipe points between ``"relative"`` and ``"absolute"``."""
    if action.element is None and action.start is None:
        return action
    if to not in ("relative", "absolute"):
        raise ValueError(f"to must be 'relative' or 'absolute', got {to!r}")
    conv = to_relative if to == "relative" else to_absolute

    def point(p: Point | None) -> Point | None:
        return None if p is None else conv((*p, *p), width, height)[:2]

    element = None if action.element is None else conv(action.element, width, height)
    return replace(action, element=element, start=point(action.start), end=point(action.end))
