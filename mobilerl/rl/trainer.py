"""The trainer's state in one place: the policy, its frozen reference, the optimiser, AdaPR's buffer, FCF's
curriculum, the optional mechanisms' hooks and the round counter, with what acts on them: the round's task
draw, the update's rows (AdaPR replay + push, reference logprobs, the hooks' replays and row edits), the
update (:func:`mobilerl.rl.update.update` through the process backend's :class:`~mobilerl.rl.update.Stepper`),
the weights published to the rollout side, and the resume state (:mod:`mobilerl.rl.checkpoint`).

Every random choice of round r is seeded by (seed, r), so a run resumed from its checkpoint of round r
continues exactly as the uninterrupted run would (weights, optimiser, buffer, curriculum and hooks restored).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mobilerl.env.base import TaskSpec
from mobilerl.rl.adapr import PositiveReplay
from mobilerl.rl.batch import (
    PromptFormat,
    Row,
    Vision,
    collate,
    micro_batches,
    rows_logprobs,
    trajectory_rows,
)
from mobilerl.rl.bepa import BEPA
from mobilerl.rl.config import RLConfig
from mobilerl.rl.dart import DartCurator
from mobilerl.rl.distrl import DistRL
from mobilerl.rl.dynamic_sampling import DynamicSampling
from mobilerl.rl.fcf import FailureCurriculum
from mobilerl.rl.groups import Group
from mobilerl.rl.hooks import Hook, Hooks, RoundContext
from mobilerl.rl.judge_monitor import JudgeMonitor
from mobilerl.rl.reverse import ReverseCurriculum
from mobilerl.rl.update import SingleProcess, update
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory


def make_hooks(cfg: RLConfig, samples_per_task: int, spa_alpha: float | None, batch: int) -> list[Hook]:
    """The optional mechanisms that are on, in call order (BEPA's injection before dynamic sampling's check of
    the groups; DistRL's Retrace weights before DART's selection of the rows)."""
    hooks: list[Hook] = []
    if cfg.bepa is not None:
        hooks.append(BEPA(cfg.bepa.seed_rollouts, cfg.seed))
    if cfg.dynamic_sampling is not None:
        hooks.append(DynamicSampling(cfg.dynamic_sampling.max_draws, batch, spa_alpha))
    if cfg.distrl is not None:
        hooks.append(DistRL.from_config(cfg.distrl, cfg.seed))
    if cfg.dart is not None:
        hooks.append(DartCurator.from_config(cfg.dart, samples_per_task))
    if cfg.reward_model and cfg.judge_monitor.share > 0:
        hooks.append(JudgeMonitor(cfg.judge_monitor, cfg.seed))
    return hooks


class Trainer:
    """The policy under training and everything a resumed run must restore (the module docstring)."""

    def __init__(self, cfg: RLConfig, model: Any, prompt_ids: Callable[[Any], list[int]], pad_id: int,
                 fmt: PromptFormat, vision: Vision | None = None) -> None:
        self.cfg = cfg
        self.settings = s = cfg.settings()
        self.model = model
        self.prompt_ids = prompt_ids
        self.vision = vision  # the rows' screenshots -> pixel values (the backend's image processor)
        self.pad_id = pad_id
        self.fmt = fmt
        self.ref = copy.deepcopy(model).eval().requires_grad_(False) if s.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                           lr=s.learning_rate, weight_decay=0.0)
        self.buffer: PositiveReplay[Trajectory] = PositiveReplay(s.adapr_buffer_size, s.adapr_kappa, s.adapr_gamma,
                                                                 cfg.algo.adapr_recency)
        self.curriculum = FailureCurriculum(cfg.fcf_patience, cfg.fcf_cooldown, cfg.algo.fcf_rule)
        c = cfg.curriculum
        self.reverse = ReverseCurriculum(c.start, c.step, c.grow_at, c.per) if c is not None else None
        self.hooks = Hooks(make_hooks(cfg, s.samples_per_task, cfg.algo.spa_alpha if cfg.spa else None,
                                      s.train_batch_size))
        self.round = 0
        self.dp: Any = None  # the data-parallel group of rl.trainer_backend ddp / deepspeed
        if cfg.trainer_backend != "single":
            from mobilerl.rl.distributed import DataParallel

            self.dp = DataParallel(model, self.optimizer, s.grad_clip, cfg.trainer_backend, cfg.deepspeed_config)
            if self.dp.rank != 0:
                self.ref = None  # rank 0 fills the rows' reference logprobs before it broadcasts them
        if self.ref is not None:
            self.ref.to(next(model.parameters()).device)
        self.stepper = self.dp if self.dp is not None else SingleProcess(model, self.optimizer, s.grad_clip)

    # ----------------------------------------------------------------------------------------- sampling

    def sample_tasks(self, pool: list[TaskSpec], r: int, draw: int = 0) -> list[TaskSpec]:
        """The round's tasks: ``lab_share`` of them from the pool's unverified (lab/train) tasks, the rest from
        its verifiable ones; by FCF weight, or uniformly without FCF. ``draw`` > 0: dynamic sampling's further
        draws of the round, seeded apart."""
        rng = np.random.default_rng(stable_seed(self.cfg.seed, "tasks", r, *([draw] if draw else [])))
        n = self.settings.train_batch_size
        n_lab = round(self.cfg.lab_share * n)
        chosen: set[str] = set()
        for verified, k in ((True, n - n_lab), (False, n_lab)):
            ids = [t.task_id for t in pool if t.has_verifier == verified]
            if k <= 0 or not ids:
                continue
            if self.cfg.fcf:
                chosen |= set(self.curriculum.sample(ids, k, rng))
            else:
                chosen |= {ids[i] for i in rng.choice(len(ids), size=min(k, len(ids)), replace=False)}
        tasks = [t for t in pool if t.task_id in chosen]
        return self.reverse.assign(tasks) if self.reverse is not None else tasks

    # ------------------------------------------------------------------------------------------- update

    def batch(self, groups: Sequence[Group], r: int, ctx: RoundContext | None = None
              ) -> tuple[list[Row], dict[str, float]]:
        """The update's rows: up to ⌊γ·M⌋ replayed trajectories (AdaPR, M the round's configured batch of
        tasks × n, drawn before this round's push, or after it with ``rl.algo.adapr_push_first``) and the hooks' replays, then the kept on-policy ones; the
        hooks' edits of the rows last. Fills ``ctx.fresh`` / ``ctx.replayed`` (round ``r``'s context; a new one by
        default); returns the rows and their metrics (the hooks' of these points included)."""
        ctx = ctx if ctx is not None else RoundContext(r, self)
        fresh = [(t, a) for g in groups for t, a, k in zip(g.trajectories, g.advantages, g.keep, strict=True)
                 if k > 0]
        m = self.settings.train_batch_size * self.settings.samples_per_task  # M: the round's on-policy batch
        push_first = self.cfg.algo.adapr_push_first
        if self.cfg.adapr and push_first:
            self._push(groups, r)
        replay = self.buffer.sample(m) if self.cfg.adapr else []  # push first: this round's best twice (age 0)
        n_adapr = len(replay)
        more, hm = self.hooks.replays(ctx, m, [t for t, _ in replay])
        replay += more
        if self.cfg.adapr and not push_first:
            self._push(groups, r)
        ctx.fresh, ctx.replayed = fresh, replay
        # a fresh trajectory of an older policy version (the asynchronous mode's) is off-policy, like a replay
        per_traj = [(t, trajectory_rows(t, a, self.fmt, self.prompt_ids, on))
                    for (t, a), on in [*((x, False) for x in replay),
                                       *((x, x[0].policy_version in (None, str(r))) for x in fresh)]]
        if self.ref is not None:
            self.reference_logprobs([row for _, rs in per_traj for row in rs])
            for t, rs in per_traj:  # a buffered trajectory keeps them for its replays (and the resume state)
                t.meta["ref_logprobs"] = [row.ref_logprobs for row in rs]
        per_traj, rm = self.hooks.rows_built(ctx, per_traj)
        rows = [row for _, rs in per_traj for row in rs]
        return rows, {"buffer/replayed": float(n_adapr), "train/trajectories": float(len(fresh) + len(replay)),
                      **hm, **rm}

    def _push(self, groups: Sequence[Group], r: int) -> None:
        flat = [(t, a) for g in groups for t, a in zip(g.trajectories, g.advantages, strict=True)]
        self.buffer.push([t for t, _ in flat], [a for _, a in flat], r)

    @torch.no_grad()
    def reference_logprobs(self, rows: list[Row]) -> None:
        """Fill ``ref_logprobs`` of the rows that lack them, under the frozen reference policy."""
        todo = [r for r in rows if r.ref_logprobs is None]
        device = next(self.ref.parameters()).device
        for mb in micro_batches(todo, self.cfg.micro_batch_tokens):
            ref, _ = rows_logprobs(self.ref, collate(mb, self.pad_id, device, self.vision), self.settings.temperature)
            for r, lp in zip(mb, ref.tolist(), strict=True):
                r.ref_logprobs = lp[: len(r.response_ids)]

    def update(self, rows: list[Row]) -> dict[str, float]:
        """One update over ``rows`` on every process of the backend (rank 0 drives; the others follow)."""
        if not rows:
            return {}
        if self.ref is not None:
            self.reference_logprobs(rows)
        if self.dp is not None:
            rows = self.dp.begin_update(rows)  # every rank gets rank 0's rows
        return update(self.model, rows, self.stepper, self.settings, self.pad_id, self.cfg.aggregation,
                      self.cfg.algo, self.cfg.micro_batch_tokens, self.vision)

    def follow(self) -> None:
        """Ranks > 0 of a data-parallel run: the updates, checkpoints and gathers rank 0 announces, until it stops."""
        self.dp.follow(lambda rows: update(self.model, rows, self.stepper, self.settings, self.pad_id,
                                           self.cfg.aggregation, self.cfg.algo, self.cfg.micro_batch_tokens,
                                           self.vision))

    # ------------------------------------------------------------------------------------ weights, state

    def gathered(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``self.model`` holds its whole weights (ZeRO-3 keeps a shard on each rank)."""
        return self.dp.gathered() if self.dp is not None else contextlib.nullcontext()

    def save_weights(self, path: Path) -> None:
        """The policy's whole weights as one safetensors file (gathered under ZeRO-3), written atomically so a
        rollout worker never opens a half-written one; tied embeddings are saved once."""
        from safetensors.torch import save_model

        tmp = path.with_name(path.name + ".tmp")
        with self.gathered():
            save_model(self.model, str(tmp))
        os.replace(tmp, path)

    def state_dict(self) -> dict[str, Any]:
        """The resume state; its model and optimiser parts are the single process's whatever the world size
        (gathered from the ranks under ZeRO)."""
        model, optimizer = (self.dp.full_state() if self.dp is not None
                            else (self.model.state_dict(), self.optimizer.state_dict()))
        return {"round": self.round, "model": model, "optimizer": optimizer,
                "buffer": self.buffer.state_dict(lambda t: t.to_dict()), "curriculum": self.curriculum.state_dict(),
                **({"reverse": self.reverse.state_dict()} if self.reverse is not None else {}),
                **({"hooks": self.hooks.state_dict()} if self.hooks else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        if self.dp is not None:  # into every rank (partitioned under ZeRO)
            self.dp.load_full_state(state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"], Trajectory.from_dict)
        self.curriculum.load_state_dict(state["curriculum"])
        if self.reverse is not None:
            self.reverse.load_state_dict(state.get("reverse", {}))
        self.hooks.load_state_dict(state.get("hooks", {}))
