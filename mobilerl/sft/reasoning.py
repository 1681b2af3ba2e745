"""Reasoning SFT data: bootstrap sampling and iterative refinement (MobileRL §2.1, Appendix B.1).

Bootstrap: an instruct model M proposes K reasoning + action candidates per expert step; one whose action
matches the expert's (:func:`actions_match`) is kept; the kept set trains π₀. Refinement, rounds 1…T: π_t
proposes, its best-scored match (mean token logprob) replaces the step's explanation, π_{t+1} trains on it.
Without real weights :class:`SimTeacher` is M behind the generation interface: it explains the action
registered with :meth:`SimTeacher.register` from the screen, argues for a wrong one with probability
``p_wrong``, restates the task in a share ``restate_task``, and writes ``style`` ``prose`` or ``target``
(the step's target in the base's pretraining questions; docs/sft.md). Prompts show the chosen
explanations of earlier steps (:func:`with_history`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mobilerl.agent.policy import CompressedNode, parse_compressed
from mobilerl.agent.prompt import (
    OBSERVATION_MODES,
    PROMPT_STYLES,
    build_messages,
    mark_of,
    quote_label,
    render_response,
    sharegpt_record,
)
from mobilerl.data.sft import check_action_weights, copies, framed_steps
from mobilerl.data.step_instructions import element_label, element_name
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, ActionParseError, parse_action
from mobilerl.models.generation import ChatRequest, Generation, SamplingConfig, text_content


# ------------------------------------------------------------------------------------------- matching
def _norm(s: str | None) -> str:
    return " ".join((s or "").lower().split()).rstrip(".")


def actions_match(a: Action, expert: Action) -> bool:
    """``a`` equals the expert's action: same type and same target (box, text, direction, app, answer)."""
    if a.name != expert.name:
        return False
    if a.name in (A.TAP, A.LONG_PRESS):
        return a.element == expert.element and a.index == expert.index
    if a.name == A.TYPE:
        return a.text == expert.text
    if a.name == A.SWIPE:
        return a.direction == expert.direction
    if a.name == A.LAUNCH:
        return _norm(a.app) == _norm(expert.app)
    if a.name == A.FINISH:
        return _norm(a.message) == _norm(expert.message)
    return True


# --------------------------------------------------------------------------------------- expert steps
@dataclass(frozen=True)
class PromptFormat:
    """How a step is shown to the model (:func:`mobilerl.agent.prompt.build_messages`): observation mode,
    system-prompt style and how many previous responses are kept. Must be what the policy is trained and
    evaluated with; the reasoning stages take it from the reasoning-free SFT dataset's ``stats.json``."""

    mode: str = "xml"
    style: str = "full"
    max_history: int | None = None
    coords: str = "abs"  # the frame of screens and actions (mobilerl.agent.prompt.COORD_FRAMES)
    think_tokens: int | None = None  # the thought's budget, stated to M (the teacher's format only)

    def __post_init__(self) -> None:
        if self.mode not in OBSERVATION_MODES:
            raise ValueError(f"observation mode must be one of {OBSERVATION_MODES}, got {self.mode!r}")
        if self.style not in PROMPT_STYLES:
            raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {self.style!r}")

    @classmethod
    def of_dataset(cls, stats: Mapping[str, Any]) -> PromptFormat:
        """The format recorded in an SFT dataset's ``stats.json`` (older builds: full style, all history)."""
        return cls(stats.get("mode", "screenshot+xml"), stats.get("prompt_style", "full"), stats.get("max_history"),
                   stats.get("coords", "abs"))


@dataclass
class ExpertStep:
    """One step of an expert demonstration: the agent's state and the expert's action."""

    step_id: str
    instruction: str
    history: list[str]
    xml_compressed: str
    app: str
    action: Action
    image: str | None = None  # path of the screenshot (absolute when read with a store root), if any
    # In the marks frame (where xml_compressed numbers its lines and the action names one): the screen and
    # the action in pixels, for the teacher, which reasons about elements by their bounds.
    screen_px: str | None = None
    action_px: Action | None = None

    def messages(self, fmt: PromptFormat = PromptFormat()) -> list[dict[str, str]]:
        """The reasoning prompt of this step (system prompt asking for ``<think>``)."""
        mode = fmt.mode if self.image is not None or fmt.mode == "xml" else "xml"  # no screenshot: XML only
        messages = build_messages(self.instruction, self.history, self.xml_compressed, app=self.app, mode=mode,
                                  reasoning=True, max_history=fmt.max_history, style=fmt.style, coords=fmt.coords)
        if fmt.think_tokens is not None:
            messages[0]["content"] += f"\nKeep the thinking within {fmt.think_tokens} tokens."
        return messages

    def shows_image(self, fmt: PromptFormat) -> bool:
        return self.image is not None and "screenshot" in fmt.mode


@dataclass
class Candidate:
    step_id: str
    text: str
    action: Action | None
    accepted: bool
    score: float | None = None
    truncated: bool = False  # cut at the token budget (rejected)


@dataclass
class RoundStats:
    round: int
    steps: int
    candidates: int
    accepted_steps: int
    accepted_candidates: int
    parse_failures: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_steps / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "steps": self.steps, "candidates": self.candidates,
                "accepted_steps": self.accepted_steps, "accepted_candidates": self.accepted_candidates,
                "parse_failures": self.parse_failures, "acceptance_rate": self.acceptance_rate}


# ----------------------------------------------------------------------------------------- proposals
async def propose(backend: Any, steps: Sequence[ExpertStep], k: int, sampling: SamplingConfig,
                  fmt: PromptFormat = PromptFormat(), images: Mapping[str, Any] | None = None) -> list[list[Candidate]]:
    """K candidates per step from ``backend`` (one call of K requests per step, all steps concurrently:
    backends batch concurrent work). ``images`` maps a step's ``image`` to the loaded screenshot (needed
    in screenshot modes). A candidate is accepted when its action matches the expert's, it has a thought,
    and it ended within ``sampling.max_new_tokens`` (the reasoning budget)."""
    import asyncio

    async def one(i: int, st: ExpertStep) -> list[Candidate]:
        req = _request(st, fmt, images)
        reqs = [req] * k
        seeded = SamplingConfig(temperature=sampling.temperature, top_p=sampling.top_p,
                                max_new_tokens=sampling.max_new_tokens,
                                seed=None if sampling.seed is None else sampling.seed + 1000 * i,
                                stop=sampling.stop)
        gens: list[Generation] = await backend.generate(reqs, seeded)
        out = []
        for g in gens:
            try:
                act: Action | None = parse_action(g.text)
            except ActionParseError:
                act = None
            cut = g.finish_reason == "length"
            ok = (act is not None and not cut and actions_match(act, st.action)
                  and canonical_response(g.text, act) is not None)
            out.append(Candidate(st.step_id, g.text, act, ok, truncated=cut))
        return out

    return list(await asyncio.gather(*(one(i, st) for i, st in enumerate(steps))))


def _request(st: ExpertStep, fmt: PromptFormat, images: Mapping[str, Any] | None) -> ChatRequest:
    if st.shows_image(fmt):
        if images is None or st.image not in images:
            raise KeyError(f"{st.step_id}: screenshot {st.image} not loaded (pass images= in screenshot modes)")
        return ChatRequest(st.messages(fmt), images=[images[st.image]])
    return ChatRequest(st.messages(fmt))


def bootstrap_select(steps: Sequence[ExpertStep], cands: Sequence[Sequence[Candidate]],
                     seed: int = 0) -> tuple[dict[str, str], RoundStats]:
    """Bootstrap filtering: for each step keep one matching candidate (uniformly among the matches)."""
    rng = random.Random(seed)
    chosen: dict[str, str] = {}
    acc_c = fails = 0
    for st, cs in zip(steps, cands, strict=True):
        good = [c for c in cs if c.accepted]
        acc_c += len(good)
        fails += sum(c.action is None for c in cs)
        if good:
            chosen[st.step_id] = rng.choice(good).text
    stats = RoundStats(0, len(steps), sum(len(c) for c in cands), len(chosen), acc_c, fails)
    return chosen, stats


async def refine_select(backend: Any, steps: Sequence[ExpertStep], cands: Sequence[Sequence[Candidate]],
                        current: dict[str, str], round_no: int, fmt: PromptFormat = PromptFormat(),
                        images: Mapping[str, Any] | None = None) -> tuple[dict[str, str], RoundStats]:
    """Refinement: score the matching candidates by the policy's mean token logprob and keep the best
    explanation per step (steps with no match keep their current one)."""
    updated = dict(current)
    acc_steps = acc_c = fails = 0
    for st, cs in zip(steps, cands, strict=True):
        good = [c for c in cs if c.accepted]
        fails += sum(c.action is None for c in cs)
        if not good:
            continue
        acc_steps += 1
        acc_c += len(good)
        req = _request(st, fmt, images)
        for c in {c.text: c for c in good}.values():
            lps = await backend.score(req, c.text)
            c.score = sum(lps) / max(1, len(lps))
        best = max((c for c in good if c.score is not None), key=lambda c: c.score)  # type: ignore[arg-type]
        updated[st.step_id] = best.text
    return updated, RoundStats(round_no, len(steps), sum(len(c) for c in cands), acc_steps, acc_c, fails)


# ---------------------------------------------------------------------------------- simulator teacher
@dataclass
class _Known:
    action: Action
    instruction: str
    lines: list[CompressedNode] = field(default_factory=list)
    app: str = ""
    marks_of: str | None = None  # marks frame: the pixel screen whose line numbers the answers name


class SimTeacher:
    """The embedded default's instruct model M (see the module docstring). Implements ``generate`` of the
    generation interface; ``score`` is not offered (M only proposes)."""

    STYLES = ("prose", "target")

    def __init__(self, p_wrong: float = 0.3, restate_task: float = 1.0, style: str = "prose"):
        if not 0 <= restate_task <= 1:
            raise ValueError(f"restate_task must be in [0, 1], got {restate_task}")
        if style not in self.STYLES:
            raise ValueError(f"style must be one of {self.STYLES}, got {style!r}")
        self.p_wrong = p_wrong
        self.restate_task = restate_task
        self.style = style
        self._known: dict[str, _Known] = {}

    @staticmethod
    def _key(messages: Sequence[dict[str, Any]]) -> str:
        user = next(text_content(m["content"]) for m in messages if m["role"] == "user")
        return hashlib.sha1(user.encode()).hexdigest()

    def register(self, step: ExpertStep, fmt: PromptFormat = PromptFormat()) -> None:
        marks = step.screen_px is not None and step.action_px is not None
        self._known[self._key(step.messages(fmt))] = _Known(
            step.action_px if marks else step.action, step.instruction,  # type: ignore[arg-type]
            parse_compressed(step.screen_px if marks else step.xml_compressed), step.app,
            step.screen_px if marks else None)

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for i, req in enumerate(requests):
            known = self._known.get(self._key(req.messages))
            if known is None:
                raise KeyError("SimTeacher: no expert step registered for this prompt (call register first)")
            seed = sampling.request_seed(i)
            rng = random.Random(seed if seed is not None else random.random())
            action, think = self._explain(known, rng)
            out.append(Generation(render_response(self._in_frame(known, action), think), [], [], "stop"))
        return out

    async def score(self, request: ChatRequest, completion: Any, *, temperature: float = 1.0) -> list[float]:
        raise NotImplementedError("SimTeacher proposes candidates only; score with the policy being trained")

    @staticmethod
    def _in_frame(known: _Known, action: Action) -> Action:
        """The teacher reasons in pixels; in the marks frame its answer names the element's line."""
        if known.marks_of is None or action.element is None:
            return action
        i = mark_of(known.marks_of, action.element)
        return action if i is None else replace(action, element=None, index=i)

    # -- the explanations
    def _label(self, known: _Known, box: tuple[int, int, int, int] | None) -> str:
        return element_label(known.lines, box) or "that element"

    def _wrong(self, known: _Known, rng: random.Random) -> Action:
        clickable = [ln.bounds for ln in known.lines if "clickable" in ln.flags and ln.bounds != known.action.element]
        options: list[Action] = [Action(A.SWIPE, direction="up", dist="medium"), Action(A.BACK)]
        if clickable:
            options += [Action(A.TAP, element=rng.choice(clickable))] * 3
        if known.action.name != A.FINISH:
            options.append(Action(A.FINISH, message=None))
        return rng.choice(options)

    def _place(self, known: _Known, action: Action) -> str:
        """Where the element is, as the prompt shows it: its box, or its line number in the marks frame."""
        framed = self._in_frame(known, action)
        return f"[{framed.index}]" if framed.index is not None else str(list(action.element or ()))

    def _name(self, known: _Known, box: tuple[int, int, int, int] | None) -> str:
        return element_name(known.lines, box, known.instruction) or quote_label("that element")

    def _target(self, known: _Known, action: Action, rng: random.Random) -> str:
        """Style ``target``: the step's decision in the words of the base's pretraining questions
        (``tap "Stopwatch"``, ``type "…"``): the thought names *what* to act on, the answer grounds it."""
        n = action.name
        if n in (A.TAP, A.LONG_PRESS):
            core = f"{'tap' if n == A.TAP else 'long-press'} {self._name(known, action.element)}"
        elif n == A.TYPE:
            core = f"type {quote_label(action.text or '')}"
        elif n == A.SWIPE:
            core = f"swipe {action.direction}"
        elif n == A.LAUNCH:
            core = f"open {action.app}"
        elif n == A.FINISH:
            core = f"answer {quote_label(action.message)}" if action.message else "done"
        else:
            core = n.lower()
        return rng.choice(["", "next: ", "now "]) + core

    def _explain(self, known: _Known, rng: random.Random) -> tuple[Action, str]:
        action = known.action if rng.random() >= self.p_wrong else self._wrong(known, rng)
        if self.style == "target":
            return action, self._target(known, action, rng)
        task = known.instruction.rstrip(".")
        where = rng.choice([f"The {known.app} app is open." if known.app and known.app != "Home"
                            else "I am on the home screen.",
                            f"Current screen: {known.app or 'home'}.",
                            ""])
        goal = rng.choice([f"The task: {task}.", f"I need to: {task[0].lower() + task[1:]}.",
                           f"Goal — {task}."])
        if self.restate_task < 1 and rng.random() >= self.restate_task:
            goal = ""
        n = action.name
        if n in (A.TAP, A.LONG_PRESS):
            label = self._label(known, action.element)
            verb = "tap" if n == A.TAP else "long-press"
            why = rng.choice([f"'{label}' is the next thing to use, so I {verb} it.",
                              f"To move forward I {verb} '{label}' at {self._place(known, action)}.",
                              f"The element '{label}' leads toward the goal; {verb} it."])
        elif n == A.TYPE:
            why = rng.choice([f"The input field is focused, so I type \"{action.text}\".",
                              f"Now I enter the text \"{action.text}\" into the field."])
        elif n == A.SWIPE:
            why = rng.choice(["What I need is not on screen yet, so I scroll to see more.",
                              f"I swipe {action.direction} to reveal more of the list."])
        elif n == A.LAUNCH:
            why = rng.choice([f"I need the {action.app} app, so I launch it.",
                              f"First open {action.app}."])
        elif n == A.BACK:
            why = rng.choice(["I go back to the previous screen.", "Back closes this and returns me."])
        elif n == A.HOME:
            why = "I return to the home screen."
        elif n == A.WAIT:
            why = rng.choice(["The screen is still loading; I wait.", "Waiting for the content to load."])
        else:
            why = (f"The answer is on screen: {action.message}." if action.message
                   else rng.choice(["Everything the task asked for is done.", "The task is complete."]))
        return action, " ".join(p for p in (where, goal, why) if p)


def expert_episodes(trajectories: Sequence[Any], root: str | Path | None = None,
                    only_success: bool = True, prefix: str = "", coords: str = "abs") -> list[list[ExpertStep]]:
    """Expert steps per episode of trajectories in :class:`mobilerl.trajectory.Trajectory` form (skipping
    unsuccessful ones unless ``only_success`` is off). A step's history is the expert's previous bare
    responses (:func:`with_history` puts explanations in); ``root``: the store, to make screenshot paths
    absolute; ``prefix`` goes before every step id (e.g. the store's name)."""
    out: list[list[ExpertStep]] = []
    for t in trajectories:
        if only_success and not t.success:
            continue
        history: list[str] = []
        ep: list[ExpertStep] = []
        for s, xml_c, action in framed_steps(t, coords):  # as the SFT data does: invalid steps left out
            image = s.screenshot_path
            if image and root is not None:
                image = str(Path(root) / image)
            marks = coords == "marks"
            ep.append(ExpertStep(f"{prefix}{t.task_id}#{t.trial}/{s.index}", t.instruction, list(history),
                                 xml_c, s.app, action, image or None,
                                 s.xml_compressed if marks else None,
                                 Action.from_dict(s.action) if marks else None))
            history.append(render_response(action))
        if ep:
            out.append(ep)
    return out


def episodes_by_split(stores: Mapping[str, str | Path], val_fraction: float, seed: int, coords: str = "abs"
                      ) -> dict[str, list[list[ExpertStep]]]:
    """The expert episodes of trajectory stores (name → folder), split into ``train`` / ``val`` by task
    exactly as the SFT dataset is (:func:`mobilerl.data.sft.split_of`), using the episodes it uses
    (successful, or finished without error where the source has no verifier). Step ids are
    ``<store>:<task>#<trial>/<step>``."""
    from mobilerl.data.sft import split_of
    from mobilerl.data.store import iter_store

    out: dict[str, list[list[ExpertStep]]] = {"train": [], "val": []}
    for name, root in stores.items():
        for t in iter_store(root):
            if not (t.success or (not t.has_verifier and t.error is None)):
                continue
            try:
                eps = expert_episodes([t], root, only_success=False, prefix=f"{name}:", coords=coords)
            except ValueError:
                continue  # no screen size recorded: not shown on the grid (the SFT dataset skips it too)
            out[split_of(t.task_id, val_fraction, seed)].extend(eps)
    return out


def load_images(steps: Sequence[ExpertStep], fmt: PromptFormat) -> dict[str, Any] | None:
    """The screenshots ``propose`` / ``refine_select`` need in screenshot modes (None in mode ``xml``)."""
    if "screenshot" not in fmt.mode:
        return None
    from PIL import Image

    out: dict[str, Any] = {}
    for st in steps:
        if st.image and st.image not in out:
            with Image.open(st.image) as im:
                out[st.image] = im.convert("RGB")
    return out


def expert_steps(trajectories: Sequence[Any]) -> list[ExpertStep]:
    """All expert steps of (successful) trajectories, flattened (see :func:`expert_episodes`)."""
    return [st for ep in expert_episodes(trajectories) for st in ep]


def canonical_response(text: str | None, action: Action) -> str | None:
    """``<think>…</think><answer>a*</answer>`` from an explanation's think and the expert's action ``a*``
    (a match may spell it differently, e.g. the app name's case); None without a think."""
    if not text or "<think>" not in text or "</think>" not in text:
        return None
    think = text.split("<think>", 1)[1].split("</think>", 1)[0].strip()
    return render_response(action, think) if think else None


def with_history(episode: Sequence[ExpertStep], explanations: Mapping[str, str]) -> list[ExpertStep]:
    """The episode's steps with histories rebuilt from ``explanations`` (step id → full response): an
    earlier step with one shows it (:func:`canonical_response`), one without shows its bare answer."""
    shown = [canonical_response(explanations.get(st.step_id), st.action) or render_response(st.action)
             for st in episode]
    return [replace(st, history=shown[:i]) for i, st in enumerate(episode)]


def reasoning_records(episodes: Sequence[Sequence[ExpertStep]], explanations: Mapping[str, str],
                      fmt: PromptFormat, action_weights: dict[str, float] | None = None,
                      seed: int = 0) -> list[dict[str, Any]]:
    """LLaMA-Factory sharegpt records of every step that has an explanation (``images`` hold the
    screenshot's own path until :func:`mobilerl.data.sft.write_sharegpt` copies it into the dataset),
    prompts rendered with the explanations' own histories; responses are :func:`canonical_response`.
    ``action_weights`` resamples records by the step's action (the SFT dataset's ``action_weights``,
    :func:`mobilerl.data.sft.build_sft`), seeded by ``seed``."""
    weights = check_action_weights(action_weights)
    rng = random.Random(seed)
    out = []
    for ep in episodes:
        for st in with_history(ep, explanations):
            response = canonical_response(explanations.get(st.step_id), st.action)
            if response is None:
                continue
            images = [st.image] if st.shows_image(fmt) and st.image else []
            rec = sharegpt_record(st.messages(fmt), response, images)
            out.extend([rec] * (copies(weights[st.action.name], rng) if st.action.name in weights else 1))
    return out


def acceptance_by_action(steps: Sequence[ExpertStep], cands: Sequence[Sequence[Candidate]]) -> dict[str, float]:
    """Share of steps with at least one matching candidate, per expert action type."""
    hit: dict[str, list[int]] = {}
    for st, cs in zip(steps, cands, strict=True):
        hit.setdefault(st.action.name, []).append(any(c.accepted for c in cs))
    return {name: sum(v) / len(v) for name, v in sorted(hit.items())}
