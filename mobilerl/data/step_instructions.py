"""Low-level step instructions for expert steps that have none (AndroidControl's "Low" variant).

AndroidControl pairs every step with a human-written instruction for that step alone ("Click on Wi-Fi").
The simulator's scripted expert and the collector record none, so :func:`step_instruction` derives one
from the step's action and the screen it was taken on: the element a Tap acts on is named by its label
on that screen (qualified by a uniquely labelled line just above it when the label repeats), in the
words of the tiny base's pretraining questions (``tap "Alice Smith"``, ``type "…"``, ``open Clock``).

    step_instruction(Action(A.TAP, element=(0, 120, 999, 180)), xml_compressed)   # 'Tap "Wi-Fi"'

The SFT data uses them for ``variant: low`` / ``both`` samples (the step instruction as the task, no
history); the reasoning stage's simulator teacher names targets with the same functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mobilerl.agent.policy import CompressedNode, parse_compressed
from mobilerl.agent.prompt import quote_label
from mobilerl.env import actions as A
from mobilerl.env.actions import Action

Box = tuple[int, int, int, int]


def _first(label: str) -> str:
    return label.split(" | ")[0]


def element_label(lines: Sequence[CompressedNode], box: Box | None) -> str | None:
    """The label of the element at ``box``; for an unlabelled container, the first labelled line inside
    it; None when nothing names it."""
    if box is None:
        return None
    for ln in lines:
        if ln.bounds == box and ln.label:
            return _first(ln.label)
    for ln in lines:
        b = ln.bounds
        if ln.label and box[0] <= b[0] and box[1] <= b[1] and b[2] <= box[2] and b[3] <= box[3]:
            return _first(ln.label)
    return None


def element_name(lines: Sequence[CompressedNode], box: Box | None, instruction: str = "") -> str | None:
    """A quoted name that picks out the element at ``box`` on this screen: its label when no other line
    carries it, else the label qualified by a uniquely labelled line just above it (the one
    ``instruction`` mentions if any: ``"More options" of "Bird song"``). None when nothing names it."""
    label = element_label(lines, box)
    if label is None:
        return None
    count = Counter(_first(ln.label) for ln in lines if ln.label)
    if count.get(label, 0) <= 1:
        return quote_label(label)
    at = next((i for i, ln in enumerate(lines) if ln.bounds == box), len(lines))
    near = [_first(ln.label) for ln in reversed(lines[max(0, at - 4):at])
            if ln.label and count[_first(ln.label)] == 1]
    if not near:
        return quote_label(label)
    named = [lab for lab in near if lab.lower() in instruction.lower()]
    return f"{quote_label(label)} of {quote_label((named or near)[0])}"


def step_instruction(action: Action, xml_compressed: str, instruction: str = "") -> str | None:
    """The low-level instruction of one expert step; None for a Tap / Long Press on an element nothing on
    the screen names (a sample with no instruction is better left out than taught as "tap that")."""
    n = action.name
    if n in (A.TAP, A.LONG_PRESS):
        name = element_name(parse_compressed(xml_compressed), action.element, instruction)
        if name is None:
            return None
        return f"{'Tap' if n == A.TAP else 'Long-press'} {name}"
    if n == A.TYPE:
        return f"Type {quote_label(action.text or '')}"
    if n == A.SWIPE:
        return f"Swipe {action.direction}"
    if n == A.LAUNCH:
        return f"Open {action.app}"
    if n == A.BACK:
        return "Go back"
    if n == A.HOME:
        return "Go to the home screen"
    if n == A.WAIT:
        return "Wait for the screen to load"
    if n == A.FINISH:
        return f"Answer {quote_label(action.message)}" if action.message else "Stop: the task is done"
    return None
