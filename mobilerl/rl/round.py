"""One AdaGRPO round after its episodes are in, written once for the synchronous and the asynchronous loop
(MobileRL §2.2, Appendix B.3)::

    episodes → rewards (the verifier's; the reward model's where it is hidden) → groups (error kinds triaged:
      groups.py) → [hooks: groups scored] → SPA → group advantages → FCF curriculum
      → rows: AdaPR replay ≤ ⌊γ·M⌋ + push of the top κ, [hooks: replays, rows built] → update → [hooks: update done]

The loops differ only in how the episodes arrive (:func:`mobilerl.rl.loop.train`: a round's rollouts with the
round's weights; :func:`mobilerl.rl.async_loop.train_async`: complete groups as they finish, stale ones dropped)
and how the weights leave.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mobilerl.env.base import TaskSpec
from mobilerl.rl.groups import Group, judge_rewards, make_groups, round_metrics, score_groups, triage
from mobilerl.rl.hooks import RoundContext
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory


def collect(trainer: Any, ctx: RoundContext, batches: Sequence[Sequence[Trajectory]], judge: Any) -> list[Group]:
    """The rewards and groups of episodes that came in together (one :func:`make_groups` per batch: a task drawn
    twice is two groups); counts env and engine failures and judged episodes on ``ctx``, adds the groups to
    ``ctx.groups``."""
    flat = [t for b in batches for t in b]
    triage(flat, whole=True)  # the policy's failures and an outage stop the round before anything is judged
    ctx.judged += judge_rewards(flat, judge, trainer.cfg.judge_all) if judge is not None else 0
    groups: list[Group] = []
    for b in batches:
        gs, dropped = make_groups(b)
        groups += gs
        engine = sum(t.error_kind == "engine" for t in b)
        ctx.env_failures += dropped - engine
        ctx.engine_failures += engine
    ctx.groups += groups
    return groups


def learn(trainer: Any, ctx: RoundContext, pool: Sequence[TaskSpec],
          lock: contextlib.AbstractContextManager[Any] | None = None) -> dict[str, float]:
    """SPA, advantages, curriculum, rows, the update and the hooks' last point for ``ctx.train`` (the groups
    trained on) and ``ctx.groups`` (the round's on-policy groups); ``lock`` guards the curriculum (the
    asynchronous loop samples from it in another thread). Advances ``trainer.round``; returns the metrics."""
    cfg, r = trainer.cfg, ctx.r
    gen = torch.Generator().manual_seed(stable_seed(cfg.seed, "prune", r) % (2**63))
    a = cfg.algo
    score_groups(ctx.train, a.spa_alpha if cfg.spa else None, cfg.prune_negatives, gen,
                 step_stats=a.adv_stats == "step", prune_rows=a.prune_unit == "row", per_source=a.adv_per_source)
    with lock or contextlib.nullcontext():
        for g in ctx.groups:
            trainer.curriculum.update(g.task_id, g.successes, rows=sum(max(1, t.n_steps) for t in g.trajectories))
            if trainer.reverse is not None:
                trainer.reverse.update(g.task_id, g.successes)
    tt = time.perf_counter()
    rows, bm = trainer.batch(ctx.train, r, ctx)
    um = trainer.update(rows)
    dm = trainer.hooks.update_done(ctx)
    train_s = time.perf_counter() - tt
    trainer.round = r + 1
    counts = trainer.curriculum.counts([t.task_id for t in pool])
    m = {"round": r, **round_metrics(ctx.groups, ctx.env_failures, ctx.engine_failures), **ctx.metrics, **bm, **dm, **um,
         "buffer/size": float(len(trainer.buffer)), "buffer/age": trainer.buffer.mean_age(r),
         "curriculum/active": float(counts["active"]), "curriculum/cooldown": float(counts["cooldown"]),
         "curriculum/removed": float(counts["removed"]), "reward/judged": float(ctx.judged), "time/train_s": train_s}
    if trainer.reverse is not None:
        m |= trainer.reverse.metrics(pool)
    if cfg.judge_all:  # E.5: the verifier's success of the episodes the judge rewarded
        ok = [t for g in ctx.groups for t in g.trajectories]
        m["rollout/verified_success"] = float(np.mean([t.meta.get("verified", t.success) for t in ok])) if ok else 0.0
    return m
