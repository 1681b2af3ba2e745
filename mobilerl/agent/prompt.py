"""The prompt format — the one module that owns it (SFT data, evaluation and RL all build prompts here).

One step is one chat (MobileRL §2 state: the task, previous responses, the current screen only)::

    system     role, observation, action space, response format (:func:`system_prompt`)
    user       Task: … / Previous actions: Step i: <response, verbatim; the last ``max_history``>
               / Current app: … / Screenshot: <image> and/or the compressed XML screen lines
    assistant  [<think>…</think>]<answer>do(...)</answer>

The ``coords`` frame: ``"abs"`` pixels, ``"rel"`` the 0-999 grid, ``"marks"`` numbered lines that
``index=i`` actions name.

Style ``"mobilerl"`` is the official MobileRL harness' format instead, to evaluate its released checkpoints:
a multi-turn chat (:func:`mobilerl_messages`) over its observation tree
(:func:`mobilerl.env.xml.compress_tree`, boxes on its own 0-999 grid), answers converted back by
:func:`mobilerl_action_to_env`. :func:`in_frame` puts a recorded step in the frame, :func:`action_to_env` turns a
response back into env pixels. ``<image>`` is LLaMA-Factory's placeholder (:func:`to_hf_messages` for HF
processors). Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mobilerl.env.actions import (
    Action,
    ActionParseError,
    convert_action,
    format_action,
    parse_action,
    to_relative,
)
from mobilerl.env.xml import TREE_GRID, compress_tree

IMAGE_TOKEN = "<image>"
OBSERVATION_MODES = ("xml", "screenshot", "screenshot+xml")

ACTION_SPACE = """\
do(action="Tap", element=[x1,y1,x2,y2])  # tap the element whose bounding box is given
do(action="Long Press", element=[x1,y1,x2,y2])  # press and hold it
do(action="Type", text="...")  # type into the focused input field (its content is replaced)
do(action="Swipe", direction="up|down|left|right", dist="short|medium|long")  # the finger's direction; "up" scrolls down
do(action="Launch", app="App Name")  # open an app by name
do(action="Back")  # the system Back button
do(action="Home")  # the system Home button
do(action="Wait")  # wait for the screen to load
finish(message="...")  # the task is done; for a question, the message is the answer"""

_OBS_TEXT = {
    "xml": "the list of on-screen UI elements (one per line: Class;flags;label;[x1,y1][x2,y2])",
    "screenshot": "a screenshot of the screen",
    "screenshot+xml": "a screenshot and the list of on-screen UI elements "
                      "(one per line: Class;flags;label;[x1,y1][x2,y2])",
}


def _check_mode(mode: str) -> None:
    if mode not in OBSERVATION_MODES:
        raise ValueError(f"observation mode must be one of {OBSERVATION_MODES}, got {mode!r}")


PROMPT_STYLES = ("full", "compact", "mobilerl")
COORD_FRAMES = ("abs", "rel", "marks")
_BOUNDS = re.compile(r"\[(\d+),(\d+)\]\[(\d+),(\d+)\]$")
LINE_FORMATS = {"abs": "Class;flags;label;[x1,y1][x2,y2]", "rel": "Class;flags;label;[x1,y1][x2,y2]",
                "marks": "Class;flags;label;[index]"}


def _check_coords(coords: str) -> None:
    if coords not in COORD_FRAMES:
        raise ValueError(f"coordinate frame must be one of {COORD_FRAMES}, got {coords!r}")


def line_boxes(xml_compressed: str) -> list[tuple[int, int, int, int] | None]:
    """Each compressed-XML line's bounds (pixels), None for a line without them; index i = line i."""
    out: list[tuple[int, int, int, int] | None] = []
    for text in xml_compressed.split("\n"):
        m = _BOUNDS.search(text)
        out.append(None if m is None else tuple(int(v) for v in m.groups()))  # type: ignore[misc]
    return out


def mark_of(xml_compressed: str, box: Sequence[int]) -> int | None:
    """The line of the compressed XML a pixel ``box`` names (:func:`mark_in` over its lines' bounds)."""
    return mark_in(line_boxes(xml_compressed), box)


def mark_in(boxes: Sequence[Sequence[int] | None], box: Sequence[int]) -> int | None:
    """Which of the lines' ``boxes`` a ``box`` names: the line with exactly these bounds, else the smallest
    line whose bounds hold the box's centre; None when no line does."""
    boxes = [None if b is None else tuple(b) for b in boxes]
    target = tuple(box)
    for i, b in enumerate(boxes):
        if b == target:
            return i
    cx, cy = (target[0] + target[2]) // 2, (target[1] + target[3]) // 2
    inside = [(abs(b[2] - b[0]) * abs(b[3] - b[1]), i) for i, b in enumerate(boxes)
              if b is not None and b[0] <= cx <= b[2] and b[1] <= cy <= b[3]]
    return min(inside)[1] if inside else None


def quote_label(s: str) -> str:
    """A label as questions and thoughts quote it (``tap "Alice Smith"``): the tiny base's pretraining
    questions, the step instructions and the reasoning stage's thoughts share this quoting."""
    return '"' + s.replace('"', "'") + '"'


def screen_in_frame(xml_compressed: str, size: Sequence[int] | None, coords: str = "abs") -> str:
    """The compressed XML with each line's bounds in the ``coords`` frame (``size`` = screen width, height;
    not needed for ``abs`` and ``marks``)."""
    _check_coords(coords)
    if coords == "abs":
        return xml_compressed
    if coords == "marks":
        lines = xml_compressed.split("\n")
        return "\n".join(t if (m := _BOUNDS.search(t)) is None else f"{t[: m.start()]}[{i}]"
                         for i, t in enumerate(lines))
    if not size:
        raise ValueError("coords='rel' needs the screen size (width, height)")
    w, h = int(size[0]), int(size[1])

    def line(text: str) -> str:
        m = _BOUNDS.search(text)
        if m is None:
            return text
        x1, y1, x2, y2 = to_relative(tuple(int(v) for v in m.groups()), w, h)
        return f"{text[: m.start()]}[{x1},{y1}][{x2},{y2}]"

    return "\n".join(line(t) for t in xml_compressed.split("\n"))


def in_frame(xml_compressed: str, action: Action | None, size: Sequence[int] | None, coords: str = "abs"
             ) -> tuple[str, Action | None]:
    """A recorded step's screen and (pixel) action in the ``coords`` frame: what the model sees and answers."""
    xml = screen_in_frame(xml_compressed, size, coords)
    if coords == "rel" and action is not None and action.element is not None:
        action = convert_action(action, int(size[0]), int(size[1]), "relative")  # type: ignore[index]
    if coords == "marks" and action is not None and action.element is not None:
        i = mark_of(xml_compressed, action.element)
        if i is None:
            raise ActionParseError(f"{format_action(action)} names no line of the screen")
        action = replace(action, element=None, index=i)
    return xml, action


def action_to_env(text: str, size: Sequence[int], coords: str = "abs", screen: str | None = None) -> str:
    """A model response's action as the env takes it (pixels): ``format_action`` of the parsed action,
    converted from the grid when ``coords="rel"``, its ``index=i`` replaced by line i's bounds of
    ``screen`` (the step's compressed XML, pixels) when ``coords="marks"``. Raises
    :class:`ActionParseError` (an invalid step), e.g. for an index that names no line."""
    _check_coords(coords)
    action = parse_action(text)
    if coords == "rel" and action.element is not None:
        action = convert_action(action, int(size[0]), int(size[1]), "absolute")
    if coords == "marks":
        if action.element is not None:
            raise ActionParseError("in the 'marks' frame an action names a line (index=i), not a box")
        if action.index is not None:
            if screen is None:
                raise ValueError("coords='marks' needs the screen to resolve index=i")
            boxes = line_boxes(screen)
            box = boxes[action.index] if action.index < len(boxes) else None
            if box is None:
                raise ActionParseError(f"index={action.index} names no element (the screen has {len(boxes)} lines)")
            action = replace(action, element=box, index=None)
    return format_action(action)


def system_prompt(mode: str = "screenshot+xml", reasoning: bool = False, style: str = "full",
                  coords: str = "abs") -> str:
    """The system prompt for an observation ``mode``; ``reasoning`` asks for ``<think>`` before the answer.

    ``style="full"`` (the large profiles) spells out the action space; ``"compact"`` (the tiny profile,
    trained from scratch on this format, where every prompt token costs CPU time in SFT, evaluation and
    RL) states only the response format.
    """
    _check_mode(mode)
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "mobilerl":
        return MOBILERL_SYSTEM_PROMPT
    if style == "compact":
        return ("Android agent. Think inside <think></think>, then give one action inside <answer></answer>."
                if reasoning else "Android agent. Give one action inside <answer></answer>.")
    fmt = ("First think step by step inside <think></think>, then give exactly one action inside "
           "<answer></answer>:\n<think>...</think><answer>do(...)</answer>"
           if reasoning else
           "Give exactly one action inside <answer></answer>:\n<answer>do(...)</answer>")
    _check_coords(coords)
    obs, space = _OBS_TEXT[mode], ACTION_SPACE
    if coords == "marks":
        obs = obs.replace("[x1,y1][x2,y2]", "[index]")
        space = space.replace("element=[x1,y1,x2,y2])  # tap the element whose bounding box is given",
                              "index=i)  # tap the element of screen line [i]")
        space = space.replace("element=[x1,y1,x2,y2])", "index=i)")
        where = "index=i names the element of the screen line marked [i]."
    else:
        where = ("Coordinates are screen pixels" if coords == "abs" else "Coordinates are on a 0-999 grid") + \
            "; element=[x1,y1,x2,y2] is the bounding box of the target element."
    return (
        "You are an agent that operates an Android phone to complete the user's task. At each step you "
        f"see the task, your previous actions and the current screen: {obs}. {where}\n\n"
        f"Actions:\n{space}\n\n{fmt}"
    )


def render_response(action: Action | str, think: str | None = None) -> str:
    """``<think>…</think><answer>…</answer>`` with reasoning, ``<answer>…</answer>`` without. ``action``
    is an :class:`Action` or an action call string (used as given)."""
    call = format_action(action) if isinstance(action, Action) else action.strip()
    if think is not None and think.strip():
        return f"<think>{think.strip()}</think><answer>{call}</answer>"
    return f"<answer>{call}</answer>"


def split_response(text: str) -> tuple[str | None, str]:
    """``(think, action call)`` of a response (think is None without a ``<think>`` block). Raises
    :class:`~mobilerl.env.actions.ActionParseError` when no action can be parsed."""
    think = None
    if "<think>" in text and "</think>" in text:
        think = text.split("<think>", 1)[1].split("</think>", 1)[0].strip()
    return think, format_action(parse_action(text))


def user_prompt(
    instruction: str,
    history: Sequence[str] = (),
    xml_compressed: str = "",
    *,
    app: str = "",
    mode: str = "screenshot+xml",
    max_history: int | None = None,
    coords: str = "abs",
) -> str:
    """The user turn of one step (see the module docstring); holds one ``<image>`` in screenshot modes.
    ``xml_compressed`` is already in the ``coords`` frame, which names the line format in its header."""
    _check_mode(mode)
    _check_coords(coords)
    lines = [f"Task: {instruction.strip()}"]
    past = list(history)
    header = "Previous actions:"
    if max_history is not None and len(past) > max_history:
        past = past[len(past) - max_history:] if max_history > 0 else []
        header = f"Previous actions (the last {len(past)}):"
    if past:
        lines.append(header)
        lines.extend(f"Step {i + 1}: {h.strip()}" for i, h in enumerate(past))
    else:
        lines.append("Previous actions: none")
    if app:
        lines.append(f"Current app: {app}")
    if mode in ("screenshot", "screenshot+xml"):
        lines.append(f"Screenshot: {IMAGE_TOKEN}")
    if mode in ("xml", "screenshot+xml"):
        lines.append(f"Screen elements ({LINE_FORMATS[coords]}):")
        lines.append(xml_compressed.strip() or "(none)")
    return "\n".join(lines)


def build_messages(
    instruction: str,
    history: Sequence[str] = (),
    xml_compressed: str = "",
    *,
    app: str = "",
    mode: str = "screenshot+xml",
    reasoning: bool = False,
    max_history: int | None = None,
    style: str = "full",
    coords: str = "abs",
) -> list[dict[str, str]]:
    """``[{"role": "system", ...}, {"role": "user", ...}]`` for one step (string contents, ``<image>``
    placeholder in screenshot modes; ``xml_compressed`` already in the ``coords`` frame)."""
    if style == "mobilerl":
        raise ValueError("prompt style 'mobilerl' is a multi-turn chat of its own: use mobilerl_messages")
    return [
        {"role": "system", "content": system_prompt(mode, reasoning, style, coords)},
        {"role": "user", "content": user_prompt(instruction, history, xml_compressed, app=app, mode=mode,
                                                max_history=max_history, coords=coords)},
    ]


def messages_for_context(ctx: Any, *, mode: str = "screenshot+xml", reasoning: bool = False,
                         max_history: int | None = None, style: str = "full", coords: str = "abs"
                         ) -> list[dict[str, str]]:
    """:func:`build_messages` for a :class:`~mobilerl.agent.policy.PolicyContext` (the rollout's state)."""
    size = (ctx.observation.width, ctx.observation.height)
    return build_messages(ctx.task.instruction, ctx.history, screen_in_frame(ctx.xml_compressed, size, coords),
                          app=ctx.observation.app,
                          mode=mode, reasoning=reasoning, max_history=max_history, style=style, coords=coords)


def to_hf_messages(messages: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    """Content-part form for HF processors: each ``<image>`` becomes ``{"type": "image"}`` (pass the
    images to the processor in the same order) and the text around it ``{"type": "text", ...}``."""
    out = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        chunks = m["content"].split(IMAGE_TOKEN)
        for i, chunk in enumerate(chunks):
            if chunk:
                parts.append({"type": "text", "text": chunk})
            if i < len(chunks) - 1:
                parts.append({"type": "image"})
        out.append({"role": m["role"], "content": parts})
    return out


def sharegpt_record(messages: Sequence[dict[str, str]], response: str, images: Sequence[str] = ()) -> dict[str, Any]:
    """A LLaMA-Factory sharegpt record: ``{"messages": [system, user, assistant], "images": [...]}``.

    Raises ``ValueError`` when the number of ``<image>`` placeholders does not match ``images``."""
    n = sum(m["content"].count(IMAGE_TOKEN) for m in messages)
    if n != len(images):
        raise ValueError(f"{n} {IMAGE_TOKEN} placeholders but {len(images)} images")
    return {"messages": [*({"role": m["role"], "content": m["content"]} for m in messages),
                         {"role": "assistant", "content": response}],
            "images": list(images)}


# -- the official MobileRL format (prompt style "mobilerl") ---------------------------------------------

# Written for this project after the official harness' thinking prompt for AndroidWorld: the same response
# layout and action set. Its own text can replace this one (the profile's generation.system_prompt_file).
MOBILERL_SYSTEM_PROMPT = """\
You operate an Android phone for the user. At each step you get a screenshot of the phone and a tree of its \
on-screen UI elements; reason about the screen, then act with one line of Python-style pseudo-code.

Answer in exactly this layout:
<think>
[your analysis of the screen and your plan]
</think>
<answer>
[one line of code]
</answer>

The code is one of these calls. An element is [x1, y1, x2, y2], the top-left and bottom-right corners of a \
box from the element tree, whose coordinates run from 0 to 999 across the screen; choose it from the current \
screen.
- do(action="Tap", element=[x1, y1, x2, y2]): tap the element.
- do(action="Type", text="..."): type into the focused input field.
- do(action="Swipe", direction="up", dist="medium", element=[x1, y1, x2, y2]): swipe "up", "down", "left" \
or "right"; dist is "short", "medium" (the default) or "long"; the element, optional, is where to swipe.
- do(action="Long Press", element=[x1, y1, x2, y2]): press and hold the element.
- do(action="Launch", app="..."): open an app by its name; prefer this to finding its icon.
- do(action="Back"): press the Back button.
- finish(message="..."): end the task; the message answers a question, if the task asked one.

Rules: think before every action; one line of code in <answer>, never more; follow the layout exactly; when \
an action needs a place, take the box of a known element from the tree."""

MOBILERL_SCREEN = "** Screen Info **"  # the text of every user turn after the first


def _mobilerl_turn(instruction: str | None, app: str) -> str:
    """A user turn's text: the instruction (first turn) or the screen marker, then the foreground app."""
    return f"{instruction if instruction is not None else MOBILERL_SCREEN}\n\n" + \
        json.dumps({"current_app": app}, ensure_ascii=False)


def mobilerl_messages(instruction: str, history: Sequence[str], apps: Sequence[str], app: str, tree: str = "",
                      *, screenshots: bool = True, system: str | None = None) -> list[dict[str, str]]:
    """The official harness' chat at step ``len(history)`` (AndroidWorld config: the last two screens shown,
    with the element tree): system; for each earlier step its user turn (the instruction then, or the screen
    marker, with that step's app ``apps[i]``) and the response verbatim, the previous turn with its screenshot;
    then the current turn: ``<image>``, its text, a newline and ``tree`` (:func:`compress_tree`; empty:
    no tree). ``screenshots=False`` drops the ``<image>`` placeholders (a text-only variant, not the official
    one). As observed in THUDM/MobileRL's ``Multi_ScreenshotTask.run_step``, the first turn shown again
    with its screenshot names the current app, not its own."""
    if len(apps) != len(history):
        raise ValueError(f"one app per earlier step: {len(apps)} apps for {len(history)} responses")
    image = IMAGE_TOKEN if screenshots else ""
    msgs = [{"role": "system", "content": MOBILERL_SYSTEM_PROMPT if system is None else system}]
    last = len(history) - 1
    for i, (response, past_app) in enumerate(zip(history, apps, strict=True)):
        text = _mobilerl_turn(instruction if i == 0 else None, app if i == last == 0 else past_app)
        msgs.append({"role": "user", "content": image + text if i == last else text})
        msgs.append({"role": "assistant", "content": response})
    current = _mobilerl_turn(instruction if not history else None, app) + (f"\n{tree}" if tree else "")
    msgs.append({"role": "user", "content": image + current})
    return msgs


def mobilerl_messages_for_context(ctx: Any, *, mode: str = "screenshot+xml", system: str | None = None
                                  ) -> list[dict[str, str]]:
    """:func:`mobilerl_messages` for a :class:`~mobilerl.agent.policy.PolicyContext`: the tree of its raw XML
    when ``mode`` shows XML, screenshots when it shows them (the current one, and the previous screen's)."""
    _check_mode(mode)
    obs = ctx.observation
    tree = compress_tree(obs.xml, obs.width, obs.height) if mode != "screenshot" else ""
    return mobilerl_messages(ctx.task.instruction, ctx.history, ctx.apps, obs.app, tree,
                             screenshots=mode != "xml", system=system)


def mobilerl_action_to_env(text: str, size: Sequence[int]) -> str:
    """A response in the official format as the env takes it (pixels): its ``<answer>`` action with each box
    taken from the tree's grid (``v * size / 999``); a box with a coordinate past 999 is pixels already, as
    the tree prints a repeated box (the official executor passes such boxes through too). Raises
    :class:`ActionParseError` for a response with no action."""
    action = parse_action(text)
    if action.element is None or any(v > TREE_GRID for v in action.element):
        return format_action(action)
    w, h = int(size[0]), int(size[1])
    x1, y1, x2, y2 = action.element
    box = (round(x1 * w / TREE_GRID), round(y1 * h / TREE_GRID), round(x2 * w / TREE_GRID),
           round(y2 * h / TREE_GRID))
    return format_action(replace(action, element=box))
