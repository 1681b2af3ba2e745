"""The policy interface the rollout loop talks to, and the non-model policies.

State (MobileRL §2): the task instruction, the *current* screen (raw XML, its compressed form and an
optional screenshot) and the agent's own previous responses — no past screens. So one turn is::

    PolicyContext(task, observation, xml_compressed, history=(r_0, ..., r_{t-1}), step=t, episode_id)
        --policy.act-->  PolicyOutput(text=r_t, logprobs=[...] | None, token_ids=[...] | None)

``text`` is the raw model response (``<think>…</think><answer>do(...)</answer>`` or a bare call); the
rollout parses it with :func:`mobilerl.env.actions.parse_action`. A policy may be shared by concurrent
episodes: per-episode state must be keyed by ``ctx.episode_id`` (as :class:`OraclePolicy` does).
Optional attributes ``name`` and ``version`` are recorded in trajectories.

Policies here:

- :class:`OraclePolicy` — the simulator's scripted expert (simulator tasks only), from the raw XML.
- :class:`RandomPolicy` — uniform over action types with plausible arguments; a floor for metrics.
- :class:`ScriptedPolicy` — fixed responses by step index (tests; malformed responses welcome).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import Observation, TaskSpec


class PolicyError(RuntimeError):
    """A policy could not produce a response (not a malformed response: that is an invalid step)."""


@dataclass(frozen=True)
class PolicyContext:
    """What a policy sees at step ``step`` of episode ``episode_id``.

    ``history`` holds the policy's previous responses of this episode, oldest first (invalid ones
    included). ``xml_compressed`` is :func:`mobilerl.env.xml.compress_xml` of ``observation.xml`` (for
    offline data ``observation.xml`` may be empty and only the compressed form is known).
    """

    task: TaskSpec
    observation: Observation
    xml_compressed: str
    history: tuple[str, ...] = ()
    step: int = 0
    episode_id: str = ""
    # The foreground app at each earlier step and the screen the last response answered: what the official
    # MobileRL chat (prompt style "mobilerl") shows of the past. Empty for offline data.
    apps: tuple[str, ...] = ()
    previous: Observation | None = None


@dataclass(frozen=True)
class PolicyOutput:
    """A response text and, for model policies, its sampled tokens' log-probabilities and ids
    (``logprobs[i]`` belongs to ``token_ids[i]``; RL's importance ratio recomputes the logprobs of those ids).
    ``token_ids`` is None where the backend did not return them."""

    text: str
    logprobs: list[float] | None = None
    token_ids: list[int] | None = None
    # the action the env executes when it is not the text's own (a response on the 0-999 grid, converted
    # to pixels by the policy); None: parse ``text``
    action_text: str | None = None
    # why the response names no executable action, when the policy already found out (e.g. its conversion to
    # pixels failed): the rollout records an invalid step with this message
    invalid: str | None = None

    def __post_init__(self) -> None:
        if self.token_ids is not None and len(self.token_ids) != len(self.logprobs or []):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs or [])} logprobs")


@runtime_checkable
class Policy(Protocol):
    """Anything with ``async def act(ctx) -> PolicyOutput``. Must not block the event loop."""

    async def act(self, ctx: PolicyContext) -> PolicyOutput: ...


def policy_name(policy: Any) -> str:
    return str(getattr(policy, "name", None) or type(policy).__name__)


def policy_version(policy: Any) -> str | None:
    v = getattr(policy, "version", None)
    return None if v is None else str(v)


# -------------------------------------------------------------------------------------- oracle


class OraclePolicy:
    """The simulator's expert for the task's template, driven from the raw XML of the current screen.

    One :class:`~mobilerl.env.sim.tasks.base.OracleAgent` per ``ctx.episode_id`` (a new one when
    ``ctx.step == 0``); it is dropped after it emits ``finish``. Only simulator suites (``world``,
    ``lab``) are supported; the agent needs ``observation.xml``.
    """

    name = "oracle"
    version = "sim"

    def __init__(self, max_episodes: int = 4096) -> None:
        self.max_episodes = max_episodes  # open episodes remembered (oldest dropped past it)
        self._agents: dict[str, Any] = {}

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        from mobilerl.env.sim.screen import Screen
        from mobilerl.env.sim.tasks.base import OracleAgent
        from mobilerl.env.sim.tasks.registry import SUITES, template

        task = ctx.task
        if task.suite not in SUITES:
            raise PolicyError(
                f"OraclePolicy only drives simulator tasks (suites {SUITES}); {task.task_id!r} is in {task.suite!r}"
            )
        if not ctx.observation.xml:
            raise PolicyError("OraclePolicy needs the raw XML of the screen (observation.xml is empty)")
        agent = self._agents.get(ctx.episode_id)
        if agent is None or ctx.step == 0:
            agent = OracleAgent(template(task.suite, task.template), task.params)
            self._agents.pop(ctx.episode_id, None)
            self._agents[ctx.episode_id] = agent
            while len(self._agents) > self.max_episodes:  # episodes cut short never say finish
                self._agents.pop(next(iter(self._agents)))
        obs = ctx.observation
        # Parsing the dump and running the script is ~2 ms of CPU: keep it off the event loop.
        action = await asyncio.to_thread(lambda: agent.act(Screen(obs.xml, obs.app, obs.width, obs.height)))
        if action.name == A.FINISH:
            self._agents.pop(ctx.episode_id, None)
        return PolicyOutput(format_action(action))


# -------------------------------------------------------------------------------------- random

# App names of the simulator plus a few AndroidWorld ones the simulator lacks (those launches fail).
DEFAULT_APPS: tuple[str, ...] = (
    "Audio Recorder",
    "Broccoli",
    "Calendar",
    "Camera",
    "Clock",
    "Contacts",
    "Files",
    "Gallery",
    "Markor",
    "Pro Expense",
    "Retro Music",
    "Settings",
    "SMS Messenger",
    "Chrome",
    "Simple Gallery Pro",
    "OpenTracks",
)
DEFAULT_WORDS: tuple[str, ...] = (
    "hello",
    "meeting",
    "alice",
    "42",
    "tomorrow",
    "groceries",
    "note",
    "test",
    "2023-10-15",
    "yes",
)

_LINE_RE = re.compile(r"^(?:\[\d+\]\s*)?([^;]*);([^;]*);(.*);\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]\s*$")


@dataclass(frozen=True, slots=True)
class CompressedNode:
    cls: str
    flags: tuple[str, ...]
    label: str
    bounds: tuple[int, int, int, int]


def parse_compressed(xml_compressed: str) -> list[CompressedNode]:
    """Parse the lines ``Class;flags;label;[x1,y1][x2,y2]`` of :func:`compress_xml` (labels may hold ';').

    Lines that do not match (or have an empty/negative box) are skipped.
    """
    out = []
    for line in xml_compressed.splitlines():
        m = _LINE_RE.match(line.strip())
        if m is None:
            continue
        x1, y1, x2, y2 = (int(v) for v in m.group(4, 5, 6, 7))
        if min(x1, y1, x2, y2) < 0 or x2 <= x1 or y2 <= y1:
            continue
        out.append(CompressedNode(m.group(1), tuple(m.group(2).split()), m.group(3), (x1, y1, x2, y2)))
    return out


@dataclass
class RandomPolicy:
    """Uniformly random actions with plausible arguments (a floor for every metric).

    With probability ``finish_prob`` the response is ``finish()`` (with a random word as message half the
    time); otherwise one of Tap, Long Press, Type, Swipe, Launch, Back, Home, Wait is drawn uniformly.
    Taps and long presses hit a random clickable (resp. long-clickable, else clickable) element of the
    compressed XML, or a random box on the screen when there is none. Deterministic given ``seed`` and the
    sequence of contexts it is asked about.
    """

    seed: int = 0
    finish_prob: float = 0.05
    apps: Sequence[str] = DEFAULT_APPS
    words: Sequence[str] = DEFAULT_WORDS
    name: str = "random"
    version: str | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.finish_prob <= 1.0:
            raise ValueError(f"finish_prob must be in [0, 1], got {self.finish_prob}")
        if not self.apps or not self.words:
            raise ValueError("apps and words must be non-empty")
        self._rng = random.Random(self.seed)

    def sample(self, ctx: PolicyContext) -> Action:
        rng = self._rng
        if rng.random() < self.finish_prob:
            return Action(A.FINISH, message=rng.choice(self.words) if rng.random() < 0.5 else None)
        name = rng.choice((A.TAP, A.LONG_PRESS, A.TYPE, A.SWIPE, A.LAUNCH, A.BACK, A.HOME, A.WAIT))
        if name in (A.TAP, A.LONG_PRESS):
            nodes = parse_compressed(ctx.xml_compressed)
            flag = "clickable" if name == A.TAP else "long-clickable"
            targets = [n for n in nodes if flag in n.flags] or [n for n in nodes if "clickable" in n.flags]
            if targets:
                box = rng.choice(targets).bounds
            else:
                w, h = ctx.observation.width, ctx.observation.height
                x, y = rng.randrange(0, max(1, w - 100)), rng.randrange(0, max(1, h - 100))
                box = (x, y, x + 100, y + 100)
            return Action(name, element=box)
        if name == A.TYPE:
            return Action(A.TYPE, text=rng.choice(self.words))
        if name == A.SWIPE:
            return Action(A.SWIPE, direction=rng.choice(A.DIRECTIONS), dist=rng.choice(A.DISTANCES))
        if name == A.LAUNCH:
            return Action(A.LAUNCH, app=rng.choice(self.apps))
        return Action(name)

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        return PolicyOutput(format_action(self.sample(ctx)))


@dataclass
class NoisyPolicy:
    """``inner`` (e.g. the oracle) that slips: at each step, with probability ``noise``, the response is
    :class:`RandomPolicy`'s instead, and ``inner`` is not asked, so a scripted expert resumes where it was
    on the next step. How online success falls with the rate of random per-step errors, for an agent that
    knows every task's procedure but does not re-plan (``scripts/eval_baselines.py --noise``)."""

    inner: Any
    noise: float
    seed: int = 0
    name: str = "noisy"
    version: str | None = None
    _rng: random.Random = field(init=False, repr=False)
    _random: RandomPolicy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise}")
        self._rng = random.Random(self.seed)
        self._random = RandomPolicy(seed=self.seed + 1)

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        if self._rng.random() < self.noise:
            return await self._random.act(ctx)
        return await self.inner.act(ctx)


# ------------------------------------------------------------------------------------ scripted


class ScriptedPolicy:
    """Returns ``responses[ctx.step]`` verbatim (malformed texts included), so it is stateless and may be
    shared by episodes. Past the end: the last response again if ``repeat_last``, else :class:`PolicyError`.
    ``logprobs`` and ``token_ids`` (optional) are returned alongside, by step index.
    """

    name = "scripted"
    version = None

    def __init__(
        self,
        responses: Sequence[str],
        repeat_last: bool = False,
        logprobs: Sequence[list[float] | None] | None = None,
        token_ids: Sequence[list[int] | None] | None = None,
    ):
        if not responses:
            raise ValueError("ScriptedPolicy needs at least one response")
        self.responses = list(responses)
        self.repeat_last = repeat_last
        self.logprobs = list(logprobs) if logprobs is not None else None
        self.token_ids = list(token_ids) if token_ids is not None else None
        self.calls = 0

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        self.calls += 1
        i = ctx.step
        if i >= len(self.responses):
            if not self.repeat_last:
                raise PolicyError(f"ScriptedPolicy has {len(self.responses)} responses; asked for step {i}")
            i = len(self.responses) - 1
        lp = self.logprobs[i] if self.logprobs is not None and i < len(self.logprobs) else None
        ids = self.token_ids[i] if self.token_ids is not None and i < len(self.token_ids) else None
        return PolicyOutput(self.responses[i], lp, ids)
