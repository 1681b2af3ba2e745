"""A round's episodes as GRPO groups: what each error kind does to them, the judge's rewards, SPA and the
group-relative advantages (MobileRL §2.2, Eq. 1), and the round's ``rollout/*`` metrics.

Error kinds (:data:`mobilerl.trajectory.ErrorKind`) are decided here and nowhere else (:func:`triage`):

- ``env`` / ``engine``: the episode says nothing about the policy (its env, or the inference engine serving its
  policy, failed); it leaves its group and is counted (``rollout/env_failures``, ``rollout/engine_failures``),
  never scored 0 (the asynchronous workers first run it again elsewhere, ``rl.async.reruns``);
- ``policy``: the policy could not run (a screenshot model given no screenshot, an engine that refuses the
  request): a configuration fault, so the round stops with :class:`RoundError` naming the cause;
- ``parse`` / ``budget``: the policy's own failures (nothing it said parsed / its step budget spent), scored as
  failures like any other and counted (``rollout/parse_failures``, ``rollout/budget_spent``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mobilerl.rl.loss import group_advantages, prune_negatives, whiten
from mobilerl.rl.spa import shortest_path_rewards
from mobilerl.trajectory import Trajectory


class RoundError(RuntimeError):
    """A round cannot go on: its policy failed to run (the message names the episode and the cause)."""


@dataclass
class Group:
    """One task's on-policy episodes of a round (env failures removed) and their training signal."""

    task_id: str
    trajectories: list[Trajectory]
    rewards: list[float] = field(default_factory=list)  # after SPA
    advantages: list[float] = field(default_factory=list)
    keep: list[float] = field(default_factory=list)  # 1: gives loss, 0: muted (negative pruning)

    @property
    def successes(self) -> list[float]:
        return [1.0 if t.success else 0.0 for t in self.trajectories]


INFRASTRUCTURE = ("env", "engine")  # error kinds that leave their group, counted, never scored


def triage(trajectories: Sequence[Trajectory], whole: bool = False) -> tuple[list[Trajectory], int]:
    """The episodes that train (order kept) and how many env and engine failures left; raises
    :class:`RoundError` on a policy failure and, for a ``whole`` draw, when every episode failed on its env or
    engine (an outage: the round would train on nothing, unseen) (the module docstring)."""
    failed = [t for t in trajectories if t.error_kind == "policy"]
    if failed:
        t = failed[0]
        raise RoundError(f"rl: {len(failed)} of {len(trajectories)} episodes could not run the policy, e.g. "
                         f"{t.task_id} trial {t.trial}: {t.error}")
    kept = [t for t in trajectories if t.error_kind not in INFRASTRUCTURE]
    if whole and trajectories and not kept:
        t = trajectories[0]
        raise RoundError(f"rl: all {len(trajectories)} episodes failed on their env or engine, e.g. {t.task_id} "
                         f"trial {t.trial}: {t.error}")
    return kept, len(trajectories) - len(kept)


def make_groups(trajectories: Sequence[Trajectory]) -> tuple[list[Group], int]:
    """Group a round's episodes by task (order kept) after :func:`triage`; returns the groups and how many
    episodes env and engine failures dropped."""
    kept, dropped = triage(trajectories)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in kept:
        by_task[t.task_id].append(t)
    return [Group(k, v) for k, v in by_task.items()], dropped


def judge_rewards(trajectories: Sequence[Trajectory], judge: Any, everyone: bool = False) -> int:
    """Rewards of the episodes whose task hides its verifier (lab/train; ``everyone``: of all episodes, the
    verifier's verdict kept in ``meta["verified"]``): the reward model's verdict, binary as the verifier's
    (P(completed) above the judge's ``threshold``, 0.5 for a judge without one), in place; an episode cut short by a
    failure stays a failure. Returns how many were judged."""
    todo = [t for t in trajectories if (everyone or not t.has_verifier) and t.error is None]
    for t in todo:
        if t.has_verifier:
            t.meta["verified"] = bool(t.success)
    threshold = getattr(judge, "threshold", 0.5)
    for t, p in zip(todo, judge.score(todo) if todo else [], strict=True):
        t.reward = 1.0 if p > threshold else 0.0
        t.success = t.reward == 1.0
        t.meta["judge_p"] = float(p)
    return len(todo)


def score_groups(groups: Sequence[Group], spa_alpha: float | None, prune_ratio: float | None,
                 generator: torch.Generator, step_stats: bool = False, prune_rows: bool = False,
                 per_source: bool = False) -> None:
    """SPA rewards (§2.2.1), group-relative advantages (Eq. 1) and the loss mask of every group, in place.
    ``step_stats``: the group's statistics over step rows; ``prune_rows``: negative pruning counts rows;
    ``per_source``: the advantages whitened again within each data source (``rl.algo``, mobilerl/rl/recipe.py)."""
    for g in groups:
        binary = g.successes
        lengths = [max(1, t.n_steps) for t in g.trajectories]
        g.rewards = shortest_path_rewards(binary, lengths, spa_alpha) if spa_alpha is not None else binary
        r = torch.tensor(g.rewards)
        n = len(r)
        w = torch.tensor(lengths, dtype=torch.float32)
        g.advantages = group_advantages(r, n, weights=w if step_stats else None).tolist() if n > 1 else [0.0] * n
        g.keep = prune_negatives(torch.tensor(binary), n, prune_ratio, generator, rows=w if prune_rows else None).tolist()
    if per_source:
        by_source: dict[str, list[tuple[Group, int]]] = defaultdict(list)
        for g in groups:
            for i, t in enumerate(g.trajectories):
                if g.keep[i] > 0:
                    by_source[t.suite].append((g, i))
        for members in by_source.values():
            a = torch.tensor([g.advantages[i] for g, i in members])
            rows = torch.tensor([float(max(1, g.trajectories[i].n_steps)) for g, i in members])
            for (g, i), v in zip(members, whiten(a, rows).tolist(), strict=True):
                g.advantages[i] = v


def round_metrics(groups: Sequence[Group], dropped: int, engine_failures: int = 0) -> dict[str, float]:
    """``rollout/*``: binary on-policy success before SPA (the paper's Figure 4b), steps, groups with signal;
    ``dropped`` env failures and ``engine_failures`` engine ones."""
    ok = [t for g in groups for t in g.trajectories]
    succ = [t for t in ok if t.success]
    return {
        "rollout/success": len(succ) / len(ok) if ok else 0.0,
        "rollout/episodes": float(len(ok)),
        "rollout/env_failures": float(dropped),
        "rollout/engine_failures": float(engine_failures),
        "rollout/parse_failures": float(sum(t.error_kind == "parse" for t in ok)),
        "rollout/budget_spent": float(sum(t.error_kind == "budget" for t in ok)),
        "rollout/steps": float(np.mean([t.n_steps for t in ok])) if ok else 0.0,
        "rollout/steps_success": float(np.mean([t.n_steps for t in succ])) if succ else 0.0,
        "rollout/invalid_steps": (sum(1 for t in ok for s in t.steps if not s.valid)
                                  / max(1, sum(t.n_steps for t in ok))),
        "rollout/groups_with_signal": float(sum(0 < sum(g.successes) < len(g.trajectories) for g in groups)),
    }
