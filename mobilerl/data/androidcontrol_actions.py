"""AndroidControl's actions → ours, as ground-truth steps (MobileRL Appendix D.5, Table 8).

A :class:`GTStep` is one of our :class:`~mobilerl.env.actions.Action` s plus, for point actions (Tap /
Long Press), the point the annotator clicked. The converter (:mod:`mobilerl.data.androidcontrol`) stores
them; the offline step evaluation (:mod:`mobilerl.eval.androidcontrol`) judges predictions against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mobilerl.agent.policy import parse_compressed
from mobilerl.env import actions as A
from mobilerl.env.actions import Action

Point = tuple[int, int]

_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


@dataclass(frozen=True)
class GTStep:
    """A ground-truth step: our action, and the original point for Tap / Long Press (else the box's
    centre is used)."""

    action: Action
    point: Point | None = None

    @property
    def target_point(self) -> Point | None:
        return self.point if self.point is not None else self.action.center


def from_androidcontrol(
    d: dict[str, Any], xml_compressed: str = "", width: int = 1080, height: int = 2400
) -> GTStep:
    """Convert one AndroidControl action (``{"action_type": ..., ...}``) into a :class:`GTStep`.

    ``click`` / ``long_press`` at ``(x, y)`` become Tap / Long Press on the smallest UI box of
    ``xml_compressed`` that contains the point (App. D.5: point → bounding box), or on a 1-pixel box at
    the point when no box contains it; the point is kept. ``scroll`` inverts the direction: AndroidControl's
    names where the *content* moves into view, our ``Swipe`` where the *finger* moves; ``open_app`` → Launch, ``input_text`` → Type, ``navigate_home`` / ``navigate_back`` /
    ``wait`` → Home / Back / Wait; ``status`` / ``finish`` → Finish.
    """
    kind = str(d.get("action_type", "")).strip().lower()
    if kind in ("click", "long_press"):
        try:
            x, y = int(d["x"]), int(d["y"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"AndroidControl {kind} needs integer x and y, got {d!r}") from None
        boxes = [n.bounds for n in parse_compressed(xml_compressed) if point_in_box((x, y), n.bounds)]
        if boxes:
            box = min(boxes, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
        else:
            box = (max(0, x), max(0, y), max(0, x) + 1, max(0, y) + 1)
        return GTStep(Action(A.TAP if kind == "click" else A.LONG_PRESS, element=box), (x, y))
    if kind == "scroll":
        direction = str(d.get("direction", "")).strip().lower()
        if direction not in _OPPOSITE:
            raise ValueError(f"AndroidControl scroll needs direction up/down/left/right, got {d!r}")
        return GTStep(Action(A.SWIPE, direction=_OPPOSITE[direction], dist="medium"))
    if kind == "open_app":
        return GTStep(Action(A.LAUNCH, app=str(d.get("app_name", ""))))
    if kind == "input_text":
        return GTStep(Action(A.TYPE, text=str(d.get("text", ""))))
    simple = {
        "navigate_home": A.HOME,
        "navigate_back": A.BACK,
        "wait": A.WAIT,
        "status": A.FINISH,
        "finish": A.FINISH,
    }
    if kind in simple:
        return GTStep(Action(simple[kind]))
    raise ValueError(f"unknown AndroidControl action_type {kind!r} in {d!r}")


def point_in_box(p: Point, box: tuple[int, int, int, int]) -> bool:
    """Whether ``p`` lies inside ``box`` (bounds inclusive: Table 8's grounding rule)."""
    x, y = p
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]
