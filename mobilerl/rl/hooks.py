"""The hook protocol of the optional mechanisms (peer options: DART, BEPA, dynamic sampling, DistRL): each one
gets the round's data at four named points and returns its own metrics; the round (:mod:`mobilerl.rl.round`)
calls them in the order of :func:`mobilerl.rl.trainer.make_hooks`::

    tasks drawn      tasks_drawn(ctx, tasks)            -> (episodes per task | None, metrics)     DART
    groups scored    groups_collected(ctx, groups)      -> (groups to train on, metrics)           BEPA, DAPO
    rows built       replays(ctx, m, taken)             -> (extra off-policy (traj, A), metrics)   DistRL
                     rows_built(ctx, per_traj)          -> (per-trajectory rows, metrics)          DistRL, DART
    update done      update_done(ctx)                   -> metrics                                 DART

A hook that does not use a point inherits the no-op. The metrics of the first two points go to the round's
context (:meth:`RoundContext.add`: added up over the calls, as dynamic sampling's further draws call
``groups_collected`` again, except the hook's ``gauges``, whose latest value stands); the others are returned. State for the resume checkpoint: ``state_dict`` / ``load_state_dict`` (plain data: lists, dicts,
numbers, strings; trajectories as their ``to_dict()``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mobilerl.env.base import TaskSpec
from mobilerl.rl.batch import Row, rows_policy_stats
from mobilerl.rl.groups import Group
from mobilerl.trajectory import Trajectory

Metrics = dict[str, float]
PerTraj = list[tuple[Trajectory, list[Row]]]


@dataclass
class RoundContext:
    """What the hooks see of round ``r``: its first draw's ``tasks`` out of ``pool``. ``trainer`` is the :class:`~mobilerl.rl.trainer.Trainer` (model,
    settings, prompt format); ``rollout(tasks, n, base_seed)`` runs episodes with this round's weights (the
    synchronous loop's only; None in the asynchronous loop); ``draw(d, seen)`` is a further draw of the round (new
    tasks, their episodes, rewards and groups, the hooks before the caller applied), its on-policy groups added to
    ``groups``. ``groups`` are the round's on-policy groups (curriculum, metrics), ``train`` those trained on,
    ``fresh`` the trained on-policy ``(trajectory, advantage)`` pairs, ``replayed`` the off-policy ones."""

    r: int
    trainer: Any
    tasks: list[TaskSpec] = field(default_factory=list)
    pool: list[TaskSpec] = field(default_factory=list)
    rollout: Callable[[Sequence[TaskSpec], int, int], list[Trajectory]] | None = None
    draw: Callable[[int, set[str], Any], list[Group]] | None = None
    groups: list[Group] = field(default_factory=list)
    train: list[Group] = field(default_factory=list)
    fresh: list[tuple[Trajectory, float]] = field(default_factory=list)
    replayed: list[tuple[Trajectory, float]] = field(default_factory=list)
    env_failures: int = 0  # episodes dropped by env failures, every draw of the round
    engine_failures: int = 0  # episodes dropped by engine failures, every draw of the round
    judged: int = 0  # episodes the reward model scored, every draw of the round
    metrics: dict[str, float] = field(default_factory=dict)  # the hooks' of "tasks drawn" and "groups scored"
    _stats: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)

    def add(self, hook: Hook, m: Metrics) -> None:
        for k, v in m.items():
            self.metrics[k] = v if k in hook.gauges else self.metrics.get(k, 0.0) + v

    def policy_stats(self, rows: Sequence[Row]) -> list[tuple[list[float], list[float]]]:
        """Each row's token (logprobs, entropies) under the policy before the update, one forward a row per round
        whichever hooks ask (memoised)."""
        todo = [row for row in rows if id(row) not in self._stats]
        if todo:
            t, s = self.trainer, self.trainer.settings
            lp, ent = rows_policy_stats(t.model, todo, t.pad_id, s.temperature, t.cfg.micro_batch_tokens,
                                         t.vision)
            self._stats.update({id(row): (a, e) for row, a, e in zip(todo, lp, ent, strict=True)})
        return [self._stats[id(row)] for row in rows]


class Hook:
    """An optional mechanism of the round; every point is a no-op unless overridden."""

    name = "hook"
    gauges: frozenset[str] = frozenset()  # metrics whose latest value stands (others add up over a round's calls)

    def tasks_drawn(self, ctx: RoundContext, tasks: Sequence[TaskSpec]) -> tuple[list[int] | None, Metrics]:
        return None, {}

    def groups_collected(self, ctx: RoundContext, groups: list[Group]) -> tuple[list[Group], Metrics]:
        return groups, {}

    def replays(self, ctx: RoundContext, m: int, taken: Sequence[Trajectory]
                ) -> tuple[list[tuple[Trajectory, float]], Metrics]:
        return [], {}

    def rows_built(self, ctx: RoundContext, per_traj: PerTraj) -> tuple[PerTraj, Metrics]:
        return per_traj, {}

    def update_done(self, ctx: RoundContext) -> Metrics:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Hooks:
    """The trainer's hooks in call order."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = list(hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def get(self, name: str) -> Any:
        """The hook called ``name`` (None when off)."""
        return next((h for h in self.hooks if h.name == name), None)

    def tasks_drawn(self, ctx: RoundContext, tasks: Sequence[TaskSpec]) -> list[int] | None:
        counts = None
        for h in self.hooks:
            c, m = h.tasks_drawn(ctx, tasks)
            counts = c if c is not None else counts
            ctx.add(h, m)
        return counts

    def groups_collected(self, ctx: RoundContext, groups: list[Group], before: Hook | None = None) -> list[Group]:
        """Every hook's ``groups_collected`` in order (with ``before``: only the hooks ahead of it)."""
        for h in self.hooks:
            if h is before:
                break
            groups, m = h.groups_collected(ctx, groups)
            ctx.add(h, m)
        return groups

    def replays(self, ctx: RoundContext, m: int, taken: list[Trajectory]
                ) -> tuple[list[tuple[Trajectory, float]], Metrics]:
        out: list[tuple[Trajectory, float]] = []
        metrics: Metrics = {}
        for h in self.hooks:
            more, hm = h.replays(ctx, m, [*taken, *(t for t, _ in out)])
            out += more
            metrics |= hm
        return out, metrics

    def rows_built(self, ctx: RoundContext, per_traj: PerTraj) -> tuple[PerTraj, Metrics]:
        metrics: Metrics = {}
        for h in self.hooks:
            per_traj, m = h.rows_built(ctx, per_traj)
            metrics |= m
        return per_traj, metrics

    def update_done(self, ctx: RoundContext) -> Metrics:
        metrics: Metrics = {}
        for h in self.hooks:
            metrics |= h.update_done(ctx)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {h.name: h.state_dict() for h in self.hooks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for h in self.hooks:
            h.load_state_dict(state.get(h.name, {}))
