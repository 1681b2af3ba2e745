"""AdaGRPO's training loop (MobileRL §2.2, Appendix B.3), one round at a time::

    FCF samples tasks → n rollouts a task (rollout workers, T = 1, token ids + logprobs)
      → verifier rewards (the reward model's where the verifier is hidden; env failures dropped, never
        scored 0) → SPA → group advantages
      → AdaPR: replay ≤ ⌊γ·M⌋ buffered successes, push this round's top κ
      → clipped surrogate against behaviour logprobs + k3 KL → one optimiser step
      → weights to the rollout workers → resumable checkpoint every ``checkpoint_every`` rounds

Peer systems' mechanisms are switches, off by default (docs/rl.md, "Peer options"): DART (``rl.dart``,
:mod:`mobilerl.rl.dart`) at the rollout counts and the update's rows, DistRL (``rl.distrl``,
:mod:`mobilerl.rl.distrl`) at the replayed rows, BEPA and DAPO's dynamic sampling between the groups and SPA
(:func:`peer_options`).

Every random choice of round r is seeded by (seed, r), so a run resumed from its checkpoint of round r
continues exactly as the uninterrupted run would (weights, optimiser, buffer and curriculum are restored).
With ``rl.async`` the rounds are :func:`mobilerl.rl.async_rollout.train_async`'s instead (rollouts decoupled).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mobilerl.env.base import TaskSpec
from mobilerl.rl.adapr import PositiveReplay
from mobilerl.rl.batch import (
    PromptFormat,
    Row,
    collate,
    micro_batches,
    rows_logprobs,
    rows_policy_stats,
    trajectory_rows,
)
from mobilerl.rl.bepa import BEPA, old_policy_logprobs
from mobilerl.rl.config import RLConfig
from mobilerl.rl.dart import DartCurator
from mobilerl.rl.distrl import DistRL
from mobilerl.rl.dynamic_sampling import fill_batch, has_signal
from mobilerl.rl.fcf import FailureCurriculum
from mobilerl.rl.loss import group_advantages, policy_loss, prune_negatives, tis_weights
from mobilerl.rl.spa import shortest_path_rewards
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


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


def make_groups(trajectories: list[Trajectory]) -> tuple[list[Group], int]:
    """Group a round's episodes by task (order kept), dropping those an env failure cut short; returns the
    groups and how many episodes were dropped."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    dropped = 0
    for t in trajectories:
        if t.error is not None and t.error.split(":", 1)[0] == "env":
            dropped += 1
            continue
        by_task[t.task_id].append(t)
    return [Group(k, v) for k, v in by_task.items()], dropped


def judge_rewards(trajectories: list[Trajectory], judge: Any, everyone: bool = False) -> int:
    """Rewards of the episodes whose task hides its verifier (lab/train; ``everyone``: of all episodes, the
    verifier's verdict kept in ``meta["verified"]``): the reward model's verdict, binary as the verifier's
    (P(completed) ≥ 0.5), in place; an episode that ended in an error stays a failure. Returns how many were
    judged."""
    todo = [t for t in trajectories if (everyone or not t.has_verifier) and t.error is None]
    for t in todo:
        if t.has_verifier:
            t.meta["verified"] = bool(t.success)
    for t, p in zip(todo, judge.score(todo) if todo else [], strict=True):
        t.reward = 1.0 if p >= 0.5 else 0.0
        t.success = t.reward == 1.0
        t.meta["judge_p"] = float(p)
    return len(todo)


def score_groups(groups: list[Group], spa_alpha: float | None, prune_ratio: float | None,
                 generator: torch.Generator) -> None:
    """SPA rewards, group-relative advantages and the loss mask of every group, in place."""
    for g in groups:
        binary = g.successes
        lengths = [max(1, t.n_steps) for t in g.trajectories]
        g.rewards = shortest_path_rewards(binary, lengths, spa_alpha) if spa_alpha is not None else binary
        r = torch.tensor(g.rewards)
        n = len(r)
        g.advantages = group_advantages(r, n).tolist() if n > 1 else [0.0] * n
        g.keep = prune_negatives(torch.tensor(binary), n, prune_ratio, generator).tolist()


class Trainer:
    """The policy under training, its reference copy, optimiser, buffer and curriculum."""

    def __init__(self, cfg: RLConfig, model: Any, prompt_ids: Callable[[Any], list[int]], pad_id: int,
                 fmt: PromptFormat) -> None:
        self.cfg = cfg
        self.settings = cfg.settings()
        self.model = model
        self.prompt_ids = prompt_ids
        self.pad_id = pad_id
        self.fmt = fmt
        self.ref = None
        if self.settings.kl_coef > 0:
            import copy

            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                           lr=self.settings.learning_rate, weight_decay=0.0)
        self.buffer: PositiveReplay[Trajectory] = PositiveReplay(
            self.settings.adapr_buffer_size, self.settings.adapr_kappa, self.settings.adapr_gamma)
        self.curriculum = FailureCurriculum(cfg.fcf_patience, cfg.fcf_cooldown)
        self.bepa = BEPA(cfg.bepa_seed_rollouts, cfg.seed) if cfg.bepa else None
        self.round = 0
        # peer systems' mechanisms (rl.dart, rl.distrl), off by default: their logic is in dart.py, distrl.py
        self.dart = DartCurator.from_config(cfg, self.settings.samples_per_task) if cfg.dart else None
        self.distrl = DistRL.from_config(cfg) if cfg.distrl else None
        self.dp = None  # the data-parallel group of rl.trainer_backend ddp / deepspeed (it wraps the optimiser)
        if cfg.trainer_backend != "single":
            from mobilerl.rl.distributed import DataParallel

            self.dp = DataParallel(self, cfg.trainer_backend, cfg.deepspeed_config)

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
        return [t for t in pool if t.task_id in chosen]

    # ------------------------------------------------------------------------------------------- update

    def old_policy_logprobs(self, traj: Trajectory) -> Trajectory:
        """``traj`` with π_θold's logprobs, the weights before this round's update (BEPA's replayed trajectory)."""
        return old_policy_logprobs(traj, self.model, self.fmt, self.prompt_ids, self.pad_id,
                                   self.settings.temperature, self.cfg.micro_batch_tokens)

    def batch(self, groups: list[Group], r: int) -> tuple[list[Row], dict[str, float]]:
        """The update's rows: up to ⌊γ·M⌋ replayed trajectories (AdaPR, M the round's configured batch of
        tasks × n, drawn before this round's push), then the kept on-policy ones."""
        fresh = [(t, a) for g in groups for t, a, k in zip(g.trajectories, g.advantages, g.keep, strict=True)
                 if k > 0]
        m = self.settings.train_batch_size * self.settings.samples_per_task  # M: the round's on-policy batch
        replay = self.buffer.sample(m) if self.cfg.adapr else []
        n_adapr = len(replay)
        if self.distrl is not None:  # DPER draws before this round's pushes, none that AdaPR replays
            replay = replay + self.distrl.draw(m, r, [t for t, _ in replay])
        if self.cfg.adapr:
            flat = [(t, a) for g in groups for t, a in zip(g.trajectories, g.advantages, strict=True)]
            self.buffer.push([t for t, _ in flat], [a for _, a in flat], r)
        # a fresh trajectory of an older policy version (the asynchronous mode's) is off-policy, like a replay
        per_traj = [(t, trajectory_rows(t, a, self.fmt, self.prompt_ids, on))
                    for (t, a), on in [*((x, False) for x in replay),
                                       *((x, x[0].policy_version in (None, str(r))) for x in fresh)]]
        rows = [row for _, rs in per_traj for row in rs]
        if self.ref is not None:
            self.reference_logprobs(rows)
            for t, rs in per_traj:  # a buffered trajectory keeps them for its replays (and the resume state)
                t.meta["ref_logprobs"] = [row.ref_logprobs for row in rs]
        bm = {"buffer/replayed": float(n_adapr), "train/trajectories": float(len(fresh) + len(replay))}
        if self.dart is not None or self.distrl is not None:
            rows = self.peer_rows(per_traj)
            if self.distrl is not None:  # after the draw's entries are refreshed: a push may overwrite them
                self.distrl.push([t for t, _ in fresh], [a for _, a in fresh], r)
            bm |= {**(self.dart.metrics if self.dart else {}), **(self.distrl.metrics if self.distrl else {})}
        return rows, bm

    def peer_rows(self, per_traj: list[tuple[Trajectory, list[Row]]]) -> list[Row]:
        """The rows after DistRL's Retrace weights (replayed rows' advantages) and DART's high-entropy step
        selection; both read the policy's logprobs and entropies before the update (one forward, no gradient)."""
        need = [row for _, rs in per_traj for row in rs if self.dart is not None or not row.on_policy]
        lp, ent = rows_policy_stats(self.model, need, self.pad_id, self.settings.temperature,
                                    self.cfg.micro_batch_tokens)
        cur = {id(row): (a, e) for row, a, e in zip(need, lp, ent, strict=True)}
        if self.distrl is not None:
            off = [rs for _, rs in per_traj if rs and not rs[0].on_policy]
            self.distrl.correct(off, [[cur[id(row)][0] for row in rs] for rs in off])
        flat = [(t.task_id, row) for t, rs in per_traj for row in rs]
        if self.dart is None:
            return [row for _, row in flat]
        keep = self.dart.select([k for k, _ in flat], [cur[id(row)][1] for _, row in flat])
        return [row for (_, row), k in zip(flat, keep, strict=True) if k]

    @torch.no_grad()
    def reference_logprobs(self, rows: list[Row]) -> None:
        """Fill ``ref_logprobs`` of the rows that lack them, under the frozen reference policy."""
        todo = [r for r in rows if r.ref_logprobs is None]
        device = next(self.ref.parameters()).device
        for mb in micro_batches(todo, self.cfg.micro_batch_tokens):
            ref, _ = rows_logprobs(self.ref, collate(mb, self.pad_id, device), self.settings.temperature)
            for r, lp in zip(mb, ref.tolist(), strict=True):
                r.ref_logprobs = lp[: len(r.response_ids)]

    def update(self, rows: list[Row]) -> dict[str, float]:
        """``ppo_epochs`` optimiser steps over ``rows`` (micro-batches accumulated into one step each)."""
        if not rows:
            return {}
        if self.dp is not None:  # every rank runs micro_step on its shard of the rows: distributed.py
            return self.dp.update(self, rows)
        s = self.settings
        if self.ref is not None:
            self.reference_logprobs(rows)
        total_tokens = sum(len(r.response_ids) for r in rows)
        stats: dict[str, float] = defaultdict(float)
        old: dict[int, torch.Tensor] = {}  # π_old of each micro-batch: epoch 0's logprobs, before any step
        self.model.train()
        for epoch in range(s.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(micro_batches(rows, self.cfg.micro_batch_tokens)):
                self.micro_step(mb, epoch, total_tokens, len(rows), stats, old=old, key=i).backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
            stats["loss/grad_norm"] += float(gn) / s.ppo_epochs
            self.optimizer.step()
        self.model.eval()
        stats["train/rows"] = float(len(rows))
        stats["train/tokens"] = float(total_tokens)
        return dict(stats)

    def micro_step(self, mb: list[Row], epoch: int, total_tokens: int, total_rows: int, stats: dict[str, float],
                   model: Any = None, old: dict[int, torch.Tensor] | None = None, key: int = 0) -> torch.Tensor:
        """The loss of micro-batch ``mb`` scaled by its share of the step (of the step's ``total_tokens`` response
        tokens, or ``total_rows`` rows for the seq-mean aggregations: all ranks' under data parallelism), for the
        caller to backpropagate; adds its part of the metrics to ``stats``. ``model`` computes the logprobs
        (default ``self.model``; the DeepSpeed engine, which must run every forward, under ZeRO). With
        ``rl.tis_cap``, ``old[key]`` keeps the micro-batch's π_old: epoch 0's logprobs, before any step."""
        s = self.settings
        b = collate(mb, self.pad_id, next(self.model.parameters()).device)
        if epoch == 0:
            stats["train/sequences"] += float(b["input_ids"].shape[0])  # distinct forwards
        logp, ent = rows_logprobs(self.model if model is None else model, b, s.temperature, entropy=True)
        ref = b.get("ref_logprobs")
        denom, tis, cap = b["behaviour_logprobs"], None, self.cfg.tis_cap
        if cap is not None:  # three policies: ratio π_θ/π_old, times min(π_old/π_behaviour, C) (loss.py)
            denom = (old if old is not None else {}).setdefault(key, logp.detach())
            tis = tis_weights(denom, b["behaviour_logprobs"], cap)
            if epoch == 0:
                capped = (denom - b["behaviour_logprobs"]) >= math.log(cap)
                stats["loss/tis_capped_frac"] += float((capped * b["response_mask"]).sum()) / total_tokens
        loss, m = policy_loss(logp, denom, b["advantages"], b["response_mask"], ref, clip_eps=s.clip_ratio,
                              kl_coef=s.kl_coef, agg=self.cfg.aggregation, tis_weight=tis)
        n_tok = float(b["response_mask"].sum())
        share = n_tok / total_tokens if self.cfg.aggregation == "token-mean" else len(mb) / total_rows
        w = n_tok / total_tokens / s.ppo_epochs
        stats["loss/policy"] += loss.item() * share / s.ppo_epochs
        for k, v in m.items():
            stats[f"loss/{k}"] += v * w
        with torch.no_grad():
            mask = b["response_mask"]
            stats["loss/entropy"] += float((ent * mask).sum()) / total_tokens / s.ppo_epochs
            if epoch == 0:  # the rollout/trainer mismatch, on-policy rows before any step
                fresh = mask * b["on_policy"].unsqueeze(1)
                gap = ((logp.detach() - b["behaviour_logprobs"]).abs() * fresh).max().item()
                stats["loss/logprob_gap_max"] = max(stats["loss/logprob_gap_max"], gap)
        return loss * share

    # --------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The resume state; its model and optimiser parts are the single process's whatever the world size
        (gathered from the ranks under ZeRO)."""
        model, optimizer = (self.dp.full_state(self) if self.dp is not None
                            else (self.model.state_dict(), self.optimizer.state_dict()))
        return {"round": self.round, "model": model, "optimizer": optimizer,
                "buffer": self.buffer.state_dict(lambda t: t.to_dict()), "curriculum": self.curriculum.state_dict(),
                **({"dart": self.dart.state_dict()} if self.dart else {}),
                **({"distrl": self.distrl.buffer.state_dict(lambda t: t.to_dict())} if self.distrl else {}),
                **({"bepa": self.bepa.state_dict()} if self.bepa is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        if self.dp is not None:  # into every rank (partitioned under ZeRO)
            self.dp.load_full_state(self, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"], Trajectory.from_dict)
        self.curriculum.load_state_dict(state["curriculum"])
        if self.dart is not None:
            self.dart.load_state_dict(state["dart"])
        if self.distrl is not None:
            self.distrl.buffer.load_state_dict(state["distrl"], Trajectory.from_dict)
        if self.bepa is not None:
            self.bepa.load_state_dict(state.get("bepa", {}))

    def gathered(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``self.model`` holds its whole weights (ZeRO-3 keeps a shard on each rank)."""
        return self.dp.gathered(self) if self.dp is not None else contextlib.nullcontext()


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _episodes(workers: Any, tasks: list[TaskSpec], n: int, base_seed: int, weights: Path | None,
              version: int) -> list[Trajectory]:
    return workers.run(tasks, n, base_seed, weights, version)[0]


def _draw(trainer: Trainer, pool: list[TaskSpec], r: int, rollout: Callable[..., list[Trajectory]], judge: Any,
          on_policy: list[Group], metrics: dict[str, float], d: int, seen: set[str]) -> list[Group]:
    """Dynamic sampling's draw ``d`` > 0 of round ``r``: new tasks, their rollouts (seeded by (seed, r, d)),
    rewards and groups to train on (BEPA applied when on); the on-policy groups are appended to
    ``on_policy``, env failures and ``bepa/*`` counts added to ``metrics``."""
    tasks = trainer.sample_tasks([t for t in pool if t.task_id not in seen], r, draw=d)
    if not tasks:
        return []
    trajs = rollout(tasks, trainer.settings.samples_per_task, stable_seed(trainer.cfg.seed, "rollout", r, d))
    judged = judge_rewards(trajs, judge, trainer.cfg.judge_all) if judge is not None else 0
    groups, dropped = make_groups(trajs)
    on_policy += groups
    metrics["rollout/env_failures"] = metrics.get("rollout/env_failures", 0.0) + dropped
    metrics["reward/judged"] = metrics.get("reward/judged", 0.0) + judged
    if trainer.bepa is None:
        return groups
    train_groups, bm = trainer.bepa.assimilate(groups, tasks, r, rollout, trainer.old_policy_logprobs)
    for k, v in bm.items():  # counts add up over the draws; the cache's size is the latest
        metrics[k] = v if k == "bepa/cache_tasks" else metrics.get(k, 0.0) + v
    return train_groups


def peer_options(trainer: Trainer, workers: Any, pool: list[TaskSpec], tasks: list[TaskSpec], groups: list[Group],
                 r: int, weights: Path | None, judge: Any) -> tuple[list[Group], list[Group], dict[str, float]]:
    """BEPA (bepa.py) and dynamic sampling (dynamic_sampling.py) on a round's first draw ``groups``: returns the
    groups to train on, the further draws' on-policy groups, and their metrics (``bepa/*``, ``sampling/*``, and
    ``rollout/env_failures`` and ``reward/judged`` of the further draws for the caller to add up)."""
    cfg, s = trainer.cfg, trainer.settings
    rollout = functools.partial(_episodes, workers, weights=weights, version=r)
    train_groups, metrics, more = groups, {}, []
    if trainer.bepa is not None:
        train_groups, metrics = trainer.bepa.assimilate(groups, tasks, r, rollout, trainer.old_policy_logprobs)
    if cfg.dynamic_sampling:
        draw = functools.partial(_draw, trainer, pool, r, rollout, judge, more, metrics)
        train_groups, _, dm = fill_batch(train_groups, draw, s.train_batch_size, cfg.dynamic_sampling_max_draws,
                                         functools.partial(has_signal, spa_alpha=s.spa_alpha if cfg.spa else None))
        metrics.update(dm)
    return train_groups, more, metrics


def round_metrics(groups: list[Group], trajectories: list[Trajectory], dropped: int) -> dict[str, float]:
    """``rollout/*``: binary on-policy success before SPA (the paper's Figure 4b), steps, groups with signal."""
    ok = [t for g in groups for t in g.trajectories]
    succ = [t for t in ok if t.success]
    return {
        "rollout/success": len(succ) / len(ok) if ok else 0.0,
        "rollout/episodes": float(len(ok)),
        "rollout/env_failures": float(dropped),
        "rollout/steps": float(np.mean([t.n_steps for t in ok])) if ok else 0.0,
        "rollout/steps_success": float(np.mean([t.n_steps for t in succ])) if succ else 0.0,
        "rollout/invalid_steps": (sum(1 for t in ok for s in t.steps if not s.valid)
                                  / max(1, sum(t.n_steps for t in ok))),
        "rollout/groups_with_signal": float(sum(0 < sum(g.successes) < len(g.trajectories) for g in groups)),
    }


def open_curve(work: Path, start: int) -> tuple[Path, list[dict[str, float]]]:
    """``work/curve.jsonl`` and its rounds before ``start``, the round a restored checkpoint resumes at (later
    lines are cut from the file: those rounds run again)."""
    work.mkdir(parents=True, exist_ok=True)
    curve_path = work / "curve.jsonl"
    curve = [json.loads(x) for x in curve_path.read_text().splitlines()] if curve_path.exists() else []
    curve = [c for c in curve if c["round"] < start]
    curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))
    return curve_path, curve


def close_round(cfg: RLConfig, trainer: Trainer, work: Path, m: dict[str, float], t0: float,
                curve: list[dict[str, float]], curve_path: Path, log_metrics: Callable[[dict[str, float], int], None],
                before_save: Callable[[], None] | None = None) -> None:
    """A round's bookkeeping, the same in the synchronous and asynchronous loops: tokens/s, the resumable checkpoint
    every ``checkpoint_every`` rounds (``before_save`` first), step and other seconds, the curve line, the metrics."""
    if m.get("train/tokens") and m["time/train_s"] > 0:
        m["train/tokens_per_s"] = m["train/tokens"] / m["time/train_s"]
    if trainer.round % cfg.checkpoint_every == 0 or trainer.round == cfg.rounds:
        tc = time.perf_counter()
        if before_save is not None:
            before_save()
        save_atomic(trainer.state_dict(), work / "state.pt")
        m["time/checkpoint_s"] = time.perf_counter() - tc
    m["time/step_s"] = time.perf_counter() - t0
    m["time/other_s"] = m["time/step_s"] - sum(m[k] for k in ("time/rollout_s", "time/reward_s", "time/train_s",
                                                               "time/sync_s"))
    curve.append(m)
    with curve_path.open("a") as f:
        f.write(json.dumps(m) + "\n")
    log_metrics({k: v for k, v in m.items() if k != "round"}, int(m["round"]))


def train(cfg: RLConfig, trainer: Trainer, workers: Any, pool: list[TaskSpec], work: Path,
          log_metrics: Callable[[dict[str, float], int], None] = lambda m, r: None,
          progress: bool = True, judge: Any = None) -> list[dict[str, float]]:
    """Rounds ``trainer.round`` … ``cfg.rounds - 1``; returns every round's metrics (the curve, resumed runs
    included: earlier rounds come from ``work/curve.jsonl``)."""
    from safetensors.torch import save_model

    curve_path, curve = open_curve(work, trainer.round)
    weights = work / "policy.safetensors"
    s = trainer.settings
    bar = tqdm(range(trainer.round, cfg.rounds), initial=trainer.round, total=cfg.rounds, desc="adagrpo",
               disable=not progress, dynamic_ncols=True)
    for r in bar:
        t0 = time.perf_counter()
        sync_s = 0.0
        if r > 0 and not getattr(workers, "pushes_weights", False):  # remote engines take a push instead
            ts = time.perf_counter()
            with trainer.gathered():
                save_model(trainer.model, str(weights))  # tied embeddings are saved once
            sync_s += time.perf_counter() - ts
        tasks = trainer.sample_tasks(pool, r)
        tr = time.perf_counter()
        n = trainer.dart.rollout_counts([t.task_id for t in tasks]) if trainer.dart else s.samples_per_task
        trajs, load_s = workers.run(tasks, n, stable_seed(cfg.seed, "rollout", r), weights if r > 0 else None, r)
        rollout_s = time.perf_counter() - tr - load_s
        sync_s += load_s
        tj = time.perf_counter()
        judged = judge_rewards(trajs, judge, cfg.judge_all) if judge is not None else 0
        reward_s = time.perf_counter() - tj
        groups, dropped = make_groups(trajs)
        train_groups, peer = groups, {}
        if trainer.bepa is not None or cfg.dynamic_sampling:  # docs/rl.md "Peer options"
            tp = time.perf_counter()
            train_groups, more, peer = peer_options(trainer, workers, pool, tasks, groups, r,
                                                    weights if r > 0 else None, judge)
            groups = groups + more  # on-policy, as sampled: the curriculum and rollout/* see these
            dropped += int(peer.pop("rollout/env_failures", 0))
            judged += int(peer.pop("reward/judged", 0))
            rollout_s += time.perf_counter() - tp  # their rollouts: BEPA's seeding, further draws
        gen = torch.Generator().manual_seed(stable_seed(cfg.seed, "prune", r) % (2**63))
        score_groups(train_groups, s.spa_alpha if cfg.spa else None, cfg.prune_negatives, gen)
        for g in groups:
            trainer.curriculum.update(g.task_id, g.successes)
            if trainer.dart is not None:
                trainer.dart.update(g.task_id, g.successes)
        tt = time.perf_counter()
        rows, bm = trainer.batch(train_groups, r)
        um = trainer.update(rows)
        train_s = time.perf_counter() - tt
        trainer.round = r + 1
        counts = trainer.curriculum.counts([t.task_id for t in pool])
        m = {"round": r, **round_metrics(groups, trajs, dropped), **peer, **bm, **um,
             "buffer/size": float(len(trainer.buffer)), "buffer/age": trainer.buffer.mean_age(r),
             "curriculum/active": float(counts["active"]), "curriculum/cooldown": float(counts["cooldown"]),
             "curriculum/removed": float(counts["removed"]),
             "reward/judged": float(judged),
             "time/rollout_s": rollout_s, "time/reward_s": reward_s, "time/train_s": train_s, "time/sync_s": sync_s,
             **getattr(workers, "env_metrics", dict)()}  # envs/<server>/...: with rl.env_servers
        if cfg.judge_all:  # E.5: the verifier's success of the episodes the judge rewarded
            ok = [t for g in groups for t in g.trajectories]
            m["rollout/verified_success"] = float(np.mean([t.meta.get("verified", t.success) for t in ok])) if ok else 0.0
        close_round(cfg, trainer, work, m, t0, curve, curve_path, log_metrics)
        bar.set_postfix(sr=f"{m['rollout/success']:.3f}", buf=len(trainer.buffer), refresh=False)
    bar.close()
    return curve


def training_pool(cfg: RLConfig, root: Path) -> list[TaskSpec]:
    """The train tasks of ``cfg.suite`` (with ``test_half``: that half of its test tasks; and lab/train when
    ``lab_share`` > 0), per template at most ``tasks_per_template``, of the templates whose test tasks need at most
    ``templates_max_steps`` optimal steps."""
    from mobilerl.tasks import halves, load_tasks

    lists = root / "data" / "tasks" / "suites"
    pool: list[TaskSpec] = []
    for suite in [cfg.suite, *(["lab"] if cfg.lab_share > 0 and cfg.suite != "lab" else [])]:
        split = "test" if cfg.test_half is not None and suite == cfg.suite else "train"
        tasks = load_tasks(suite, split, per_template=cfg.tasks_per_template, root=lists)
        if split == "test":  # E.5: one half of the test split, the other one evaluates
            tasks = halves(tasks)[cfg.test_half]
        if cfg.templates_max_steps is not None:
            longest: dict[str, int] = defaultdict(int)
            for t in load_tasks(suite, "test", root=lists):
                longest[t.template] = max(longest[t.template], t.optimal_steps)
            tasks = [t for t in tasks if longest.get(t.template, 10**9) <= cfg.templates_max_steps]
        if not tasks:
            raise ValueError(f"rl: no {suite}/{split} task passes templates_max_steps={cfg.templates_max_steps}")
        pool += tasks
    return pool


def run(cfg: RLConfig, root: Path, log_metrics: Callable[[dict[str, float], int], None] = lambda m, r: None,
        progress: bool = True) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The whole `rl` stage: train from ``cfg.init`` (resuming from ``cfg.work`` when it holds a checkpoint of
    the same config), write the policy to ``cfg.out``; returns the summary and the curve."""
    from mobilerl.models import tiny
    from mobilerl.models.backends import profile_spec
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.profiles import load_profile
    from mobilerl.rl.rollout import PolicySpec, RolloutWorkers

    torch.manual_seed(cfg.seed)
    profile = load_profile(cfg.profile)
    s = cfg.settings()
    g = profile.generation
    init = root / cfg.init
    work, out = root / cfg.work, root / cfg.out
    fmt = PromptFormat(g.obs_mode, g.prompt_style, g.max_history, g.coords, cfg.reasoning)
    backend = HFBackend.from_pretrained(init, device="cpu", fast_prefill=False, prefix_cache_tokens=0)
    pad = backend.pad_id
    trainer = Trainer(cfg, backend.model, backend.prompt_ids, pad, fmt)
    if trainer.dp is not None and trainer.dp.rank != 0:
        trainer.dp.follow(trainer)  # the updates, checkpoints and weight gathers rank 0 runs; then rank 0 stops it
        return {}, []
    pool = training_pool(cfg, root)
    # where the episodes run and how the update is spread over processes do not change what is trained: a run
    # resumes with a replaced env server, or under another backend / world size
    same = cfg.model_dump(exclude={"env_servers", "env_pool", "trainer_backend", "deepspeed_config"})
    fingerprint = json.dumps({"cfg": same, "settings": s.model_dump()}, sort_keys=True)
    state_path = work / "state.pt"
    if state_path.exists() and (work / "config.json").exists() and (work / "config.json").read_text() == fingerprint:
        trainer.load_state_dict(torch.load(state_path, weights_only=False))
        log.info("rl: resumed from %s at round %d", state_path, trainer.round)
    else:
        if work.exists():
            import shutil

            shutil.rmtree(work)
        work.mkdir(parents=True)
        (work / "config.json").write_text(fingerprint)
        if cfg.curriculum_init:
            trainer.curriculum.load_state_dict(json.loads((root / cfg.curriculum_init).read_text()))
    spec = PolicySpec(
        init=str(init), backend={**profile_spec(profile), **({"max_batch": cfg.max_batch} if cfg.max_batch else {})},
        obs_mode=g.obs_mode, prompt_style=g.prompt_style, max_history=g.max_history, coords=g.coords,
        reasoning=cfg.reasoning, temperature=s.temperature, max_new_tokens=s.max_new_tokens,
        threads=max(1, (os.cpu_count() or 1) // cfg.rollout_processes), concurrency=cfg.rollout_concurrency)
    judge = None
    if cfg.reward_model:
        from mobilerl.reward.judge import RewardModel

        judge = RewardModel.from_checkpoint(root / cfg.reward_model)
    t0 = time.perf_counter()
    if cfg.async_ is not None:  # decoupled rollout and training (async_rollout.py)
        from mobilerl.rl.async_rollout import ProcessWorkers, train_async

        with ProcessWorkers(spec, cfg.rollout_processes, cfg.rollout_concurrency) as aworkers:
            curve = train_async(cfg, trainer, aworkers, pool, work, log_metrics, progress, judge)
    else:
        if cfg.engines:
            from mobilerl.rl.engine import remote_engines

            rollouts: Any = remote_engines(cfg, spec, trainer.model, work)
        else:
            rollouts = RolloutWorkers(spec, cfg.rollout_processes, cfg.env_servers, cfg.env_pool)
        with rollouts as workers:
            curve = train(cfg, trainer, workers, pool, work, log_metrics, progress, judge)
    wall = time.perf_counter() - t0
    if out.exists():
        import shutil

        shutil.rmtree(out)
    recorded = json.loads((init / "tiny.json").read_text()) if (init / "tiny.json").exists() else None
    with trainer.gathered():
        if recorded is not None:
            tiny.save(trainer.model, backend.processor, out, extra={**recorded, "adagrpo_of": cfg.init})
        else:
            trainer.model.save_pretrained(out)
            backend.processor.save_pretrained(out)
    if trainer.dp is not None:
        trainer.dp.stop()
    (out / "curriculum.json").write_text(json.dumps(trainer.curriculum.state_dict(), indent=1) + "\n")
    # the resume state holds the replay buffer's unmasked trajectories (exact prompts and sampled tokens):
    # it lives only while the run can still be resumed
    for name in ("state.pt", "policy.safetensors"):
        (work / name).unlink(missing_ok=True)
    first = [c["rollout/success"] for c in curve[:5]]
    last = [c["rollout/success"] for c in curve[-5:]]
    return {"rounds": len(curve), "pool": len(pool), "wall_s": wall, "init": cfg.init,
            "success_first5": float(np.mean(first)) if first else 0.0,
            "success_last5": float(np.mean(last)) if last else 0.0,
            "curriculum_removed": sum(trainer.curriculum.removed(t.task_id) for t in pool),
            "buffer_size": len(trainer.buffer)}, curve
