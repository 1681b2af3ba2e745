"""Offline AndroidControl-style step evaluation (MobileRL Appendix D.5, Table 8).

A step is correct iff the predicted type matches and: Tap / Long Press, the GT point lies in the predicted
box; Swipe, the same *finger* direction (AndroidControl's ``scroll down`` is our ``Swipe up``); Launch, the
same app (case-insensitive); Type, token F1 > 0.5; others, the type alone. Metrics: ``type_accuracy``,
``step_success_rate``, ``invalid_rate``, ``episode_success_rate``; ``grounding_accuracy`` over the
type-matched GT Tap / Long Press steps (``grounding_accuracy_all``: over all of them), whose misses on a
known screen are ``grounding_wrong_element`` (another element's box) or ``grounding_off_element``, summing
to 1 with it. Modes: **low**, the step instruction and no history; **high**, the goal and a history in
which wrong predictions are replaced by the ground truth.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from mobilerl.agent import prompt
from mobilerl.agent.policy import Policy, PolicyContext, PolicyOutput, parse_compressed
from mobilerl.data.androidcontrol_actions import GTStep, point_in_box
from mobilerl.data.sft import framed_steps
from mobilerl.data.step_instructions import step_instruction
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, ActionParseError, format_action, parse_action
from mobilerl.env.base import Observation, TaskSpec


@dataclass
class ACEpisode:
    """One AndroidControl episode: goal, per-step instructions, per-step screens (compressed XML) and GT.

    ``observations[i]``, ``step_instructions[i]`` and ``actions[i]`` describe step ``i``; the lists must
    have the same length. ``screenshots[i]``, when given, is step ``i``'s screenshot (PNG bytes: a policy that
    reads the screen is shown it; kept encoded, 30-60 kB a screen instead of 8 MB decoded).
    """

    episode_id: str
    goal: str
    step_instructions: list[str]
    observations: list[str]
    actions: list[GTStep]
    width: int = 1080
    height: int = 2400
    screenshots: list[bytes | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.actions)
        if len(self.observations) != n or len(self.step_instructions) != n:
            raise ValueError(
                f"episode {self.episode_id!r}: {n} actions, {len(self.observations)} observations and "
                f"{len(self.step_instructions)} step instructions; they must match"
            )
        if self.screenshots is not None and len(self.screenshots) != n:
            raise ValueError(f"episode {self.episode_id!r}: {n} actions but {len(self.screenshots)} screenshots")

    def screenshot(self, i: int) -> Any:
        """Step ``i``'s screenshot as an image (None when the episode has none)."""
        png = self.screenshots[i] if self.screenshots is not None else None
        if png is None:
            return None
        import io

        from PIL import Image

        with Image.open(io.BytesIO(png)) as im:
            return im.convert("RGB")


_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def _tokens(s: str) -> list[str]:
    return _PUNCT.sub(" ", s.lower()).split()


def token_f1(pred: str, gold: str) -> float:
    """Token-level F1 (lower-cased, punctuation removed, whitespace split, multiset overlap):
    ``2PR / (P + R)`` with ``P = overlap/|pred|``, ``R = overlap/|gold|``; two empty texts give 1.0."""
    p, g = _tokens(pred), _tokens(gold)
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    overlap = sum((Counter(p) & Counter(g)).values())
    if overlap == 0:
        return 0.0
    prec, rec = overlap / len(p), overlap / len(g)
    return 2 * prec * rec / (prec + rec)


MissKind = Literal["wrong_element", "off_element"]


@dataclass(frozen=True)
class StepJudgement:
    type_match: bool
    grounded: bool | None  # None unless the GT is Tap / Long Press
    success: bool
    invalid: bool = False
    miss: MissKind | None = None  # a type-matched grounding miss on a known screen: see the module docstring


def _iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def miss_kind(box: tuple[int, int, int, int] | None, screen: str) -> MissKind:
    """``wrong_element`` if ``box`` is (IoU >= 0.9) the box of an element of the compressed ``screen``, else
    ``off_element``."""
    if box is not None and box[2] > box[0] and box[3] > box[1]:
        if any(_iou(box, n.bounds) >= 0.9 for n in parse_compressed(screen)):
            return "wrong_element"
    return "off_element"


def judge_step(gt: GTStep, pred: Action | None, screen: str | None = None) -> StepJudgement:
    """Apply Table 8's rule of ``gt``'s action type to a predicted action (``None``: unparseable).
    ``screen``: the step's compressed XML, in the predicted action's pixels; with it a grounding miss is
    classified (:func:`miss_kind`)."""
    g = gt.action
    grounding = g.name in (A.TAP, A.LONG_PRESS)
    if pred is None:
        return StepJudgement(False, False if grounding else None, False, invalid=True)
    if pred.name != g.name:
        return StepJudgement(False, False if grounding else None, False)
    if grounding:
        point = gt.target_point
        ok = point is not None and pred.element is not None and point_in_box(point, pred.element)
        miss = None if ok or screen is None else miss_kind(pred.element, screen)
        return StepJudgement(True, ok, ok, miss=miss)
    if g.name == A.SWIPE:
        ok = pred.direction == g.direction
    elif g.name == A.LAUNCH:
        ok = (pred.app or "").strip().lower() == (g.app or "").strip().lower()
    elif g.name == A.TYPE:
        ok = token_f1(pred.text or "", g.text or "") > 0.5
    else:  # Back, Home, Wait, Finish
        ok = True
    return StepJudgement(True, None, ok)


def judge_response(gt: GTStep, response: str, screen: str | None = None) -> StepJudgement:
    try:
        pred = parse_action(response)
    except ActionParseError:
        pred = None
    return judge_step(gt, pred, screen)


def step_metrics(judgements: Sequence[StepJudgement]) -> dict[str, float | int | None]:
    """Aggregate step judgements (see the module docstring for the definitions)."""
    n = len(judgements)
    ground = [j for j in judgements if j.grounded is not None]
    ground_typed = [j for j in ground if j.type_match]
    return {
        "n_steps": n,
        "type_accuracy": sum(j.type_match for j in judgements) / n if n else None,
        "grounding_accuracy": sum(bool(j.grounded) for j in ground_typed) / len(ground_typed)
        if ground_typed
        else None,
        "grounding_accuracy_all": sum(bool(j.grounded) for j in ground) / len(ground) if ground else None,
        **{f"grounding_{kind}": sum(j.miss == kind for j in ground_typed) / len(ground_typed) if ground_typed else None
           for kind in get_args(MissKind)},
        "step_success_rate": sum(j.success for j in judgements) / n if n else None,
        "invalid_rate": sum(j.invalid for j in judgements) / n if n else None,
    }


@dataclass
class ACStepResult:
    episode_id: str
    index: int
    response: str
    gt: str  # format_action of the GT action
    judgement: StepJudgement


@dataclass
class ACResult:
    mode: str
    steps: list[ACStepResult] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


def from_trajectory(traj: Any) -> ACEpisode:
    """One of our trajectories (:class:`~mobilerl.trajectory.Trajectory`, e.g. an expert rollout) as offline
    step data: each valid step's compressed screen and action (pixels), the task's instruction as the goal, and
    the screenshots the rollout kept (``screenshot_path``; none kept: none shown).
    A step's low-level instruction is the recorded one, else one derived from its action and screen
    (:func:`mobilerl.data.step_instructions.step_instruction`, as the SFT data derives it), else the goal."""
    from pathlib import Path

    steps = list(framed_steps(traj))  # the valid steps, as the SFT data takes them
    size = traj.meta.get("screen_size") or (1080, 2400)
    kept = any(s.screenshot_path for s, _, _ in steps)
    return ACEpisode(
        episode_id=f"{traj.task_id}#{traj.trial}",
        goal=traj.instruction,
        step_instructions=[s.step_instruction or step_instruction(a, xml_c, traj.instruction) or traj.instruction
                           for s, xml_c, a in steps],
        observations=[xml_c for _, xml_c, _ in steps],
        actions=[GTStep(action) for _, _, action in steps],
        width=int(size[0]),
        height=int(size[1]),
        screenshots=[Path(s.screenshot_path).read_bytes() if s.screenshot_path else None for s, _, _ in steps]
        if kept else None,
    )


def _gt_response(action: Action, ep: ACEpisode, frame: str, screen: str = "") -> str:
    """The ground-truth action as the policy's own response would show it in the history (``screen``: the
    step's compressed XML, whose line the action names in the marks frame; a box on no line stays a box)."""
    try:
        _, framed = prompt.in_frame(screen, action, (ep.width, ep.height), frame)
    except ActionParseError:
        framed = action
    return prompt.render_response(framed)  # type: ignore[arg-type]


def _task(ep: ACEpisode, instruction: str, index: int | None) -> TaskSpec:
    tid = f"androidcontrol/test/{ep.episode_id}" + (f"/{index}" if index is not None else "")
    return TaskSpec(
        task_id=tid, suite="androidcontrol", split="test", template="androidcontrol", instruction=instruction
    )


async def _run_episode(policy: Policy, ep: ACEpisode, mode: str, frame: str = "abs") -> list[ACStepResult]:
    out: list[ACStepResult] = []
    history: list[str] = []
    goal_task = _task(ep, ep.goal, None)
    for i, (gt, xml_c) in enumerate(zip(ep.actions, ep.observations, strict=True)):
        obs = Observation(xml="", app="", width=ep.width, height=ep.height, screenshot=ep.screenshot(i), step=i)
        if mode == "low":
            ctx = PolicyContext(
                _task(ep, ep.step_instructions[i], i), obs, xml_c, (), 0, f"{ep.episode_id}/{i}"
            )
        else:
            ctx = PolicyContext(goal_task, obs, xml_c, tuple(history), i, ep.episode_id)
        resp = await policy.act(ctx)
        if not isinstance(resp, PolicyOutput):
            raise TypeError(f"{type(policy).__name__}.act returned {type(resp).__name__}, not PolicyOutput")
        if resp.invalid is not None:  # the policy found no executable action in its response (e.g. a bad index)
            j = judge_step(gt, None, xml_c)
        else:
            j = judge_response(gt, resp.text if resp.action_text is None else resp.action_text, xml_c)
        out.append(ACStepResult(ep.episode_id, i, resp.text, format_action(gt.action), j))
        history.append(resp.text if j.success else _gt_response(gt.action, ep, frame, xml_c))
    return out


async def run_androidcontrol(
    policy: Policy, episodes: Sequence[ACEpisode], mode: str = "high", concurrency: int = 8, frame: str = "abs"
) -> ACResult:
    """Query ``policy`` on every step of ``episodes`` in ``mode`` (``"low"`` or ``"high"``) and score it.

    Episodes run concurrently (at most ``concurrency`` at once); the steps of one episode run in order
    (high mode's history depends on the previous judgements). A policy exception propagates. ``frame``:
    the coordinate frame the policy answers in (``abs`` / ``rel`` / ``marks``), for the history's replacements.
    Metrics: :func:`step_metrics` plus ``episode_success_rate`` and ``n_episodes``.
    """
    if mode not in ("low", "high"):
        raise ValueError(f"mode must be 'low' or 'high', got {mode!r}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    sem = asyncio.Semaphore(concurrency)

    async def one(ep: ACEpisode) -> list[ACStepResult]:
        async with sem:
            return await _run_episode(policy, ep, mode, frame)

    per_episode = await asyncio.gather(*(one(ep) for ep in episodes))
    result = ACResult(mode=mode, steps=[s for eps in per_episode for s in eps])
    metrics: dict[str, Any] = dict(step_metrics([s.judgement for s in result.steps]))
    metrics["n_episodes"] = len(episodes)
    metrics["episode_success_rate"] = (
        sum(all(s.judgement.success for s in eps) for eps in per_episode) / len(per_episode)
        if per_episode
        else None
    )
    result.metrics = {f"androidcontrol/{mode}/{k}": v for k, v in metrics.items()}
    return result
