"""AdaGRPO's training loop (MobileRL §2.2, Appendix B.3), one round at a time::

    FCF samples tasks → n rollouts a task (rollout workers, T = 1, token ids + logprobs)
      → verifier rewards (the reward model's where the verifier is hidden; env failures dropped, never
        scored 0) → SPA → group advantages
      → AdaPR: replay ≤ ⌊γ·M⌋ buffered successes, push this round's top κ
      → clipped surrogate against behaviour logprobs + k3 KL → one optimiser step
      → weights to the rollout workers → resumable checkpoint every ``checkpoint_every`` rounds

Every random choice of round r is seeded by (seed, r), so a run resumed from its checkpoint of round r
continues exactly as the uninterrupted run would (weights, optimiser, buffer and curriculum are restored).
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from mobilerl.rl.batch import PromptFormat, Row, collate, micro_batches, rows_logprobs, trajectory_rows
from mobilerl.rl.config import RLConfig
from mobilerl.rl.fcf import FailureCurriculum
from mobilerl.rl.loss import group_advantages, policy_loss, prune_negatives
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


def judge_rewards(trajectories: list[Trajectory], judge: Any) -> int:
    """Rewards of the episodes whose task hides its verifier (lab/train): the reward model's verdict, binary as
    the verifier's (P(completed) ≥ 0.5), in place; an episode that ended in an error stays a failure. Returns
    how many were judged."""
    todo = [t for t in trajectories if not t.has_verifier and t.error is None]
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
        self.round = 0
        self.dp = None  # the data-parallel group of rl.trainer_backend ddp / deepspeed (it wraps the optimiser)
        if cfg.trainer_backend != "single":
            from mobilerl.rl.distributed import DataParallel

            self.dp = DataParallel(self, cfg.trainer_backend, cfg.deepspeed_config)

    # ----------------------------------------------------------------------------------------- sampling

    def sample_tasks(self, pool: list[TaskSpec], r: int) -> list[TaskSpec]:
        """The round's tasks: ``lab_share`` of them from the pool's unverified (lab/train) tasks, the rest from
        its verifiable ones; by FCF weight, or uniformly without FCF."""
        rng = np.random.default_rng(stable_seed(self.cfg.seed, "tasks", r))
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

    def batch(self, groups: list[Group], r: int) -> tuple[list[Row], dict[str, float]]:
        """The update's rows: up to ⌊γ·M⌋ replayed trajectories (AdaPR, M the round's configured batch of
        tasks × n, drawn before this round's push), then the kept on-policy ones."""
        fresh = [(t, a) for g in groups for t, a, k in zip(g.trajectories, g.advantages, g.keep, strict=True)
                 if k > 0]
        m = self.settings.train_batch_size * self.settings.samples_per_task  # M: the round's on-policy batch
        replay = self.buffer.sample(m) if self.cfg.adapr else []
        if self.cfg.adapr:
            flat = [(t, a) for g in groups for t, a in zip(g.trajectories, g.advantages, strict=True)]
            self.buffer.push([t for t, _ in flat], [a for _, a in flat], r)
        per_traj = [(t, trajectory_rows(t, a, self.fmt, self.prompt_ids, on))
                    for (t, a), on in [*((x, False) for x in replay), *((x, True) for x in fresh)]]
        rows = [row for _, rs in per_traj for row in rs]
        if self.ref is not None:
            self.reference_logprobs(rows)
            for t, rs in per_traj:  # a buffered trajectory keeps them for its replays (and the resume state)
                t.meta["ref_logprobs"] = [row.ref_logprobs for row in rs]
        return rows, {"buffer/replayed": float(len(replay)), "train/trajectories": float(len(fresh) + len(replay))}

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
        self.model.train()
        for epoch in range(s.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in micro_batches(rows, self.cfg.micro_batch_tokens):
                self.micro_step(mb, epoch, total_tokens, len(rows), stats).backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
            stats["loss/grad_norm"] += float(gn) / s.ppo_epochs
            self.optimizer.step()
        self.model.eval()
        stats["train/rows"] = float(len(rows))
        stats["train/tokens"] = float(total_tokens)
        return dict(stats)

    def micro_step(self, mb: list[Row], epoch: int, total_tokens: int, total_rows: int, stats: dict[str, float],
                   model: Any = None) -> torch.Tensor:
        """The loss of micro-batch ``mb`` scaled by its share of the step (of the step's ``total_tokens`` response
        tokens, or ``total_rows`` rows for the seq-mean aggregations: all ranks' under data parallelism), for the
        caller to backpropagate; adds its part of the metrics to ``stats``. ``model`` computes the logprobs
        (default ``self.model``; the DeepSpeed engine, which must run every forward, under ZeRO)."""
        s = self.settings
        b = collate(mb, self.pad_id, next(self.model.parameters()).device)
        if epoch == 0:
            stats["train/sequences"] += float(b["input_ids"].shape[0])  # distinct forwards
        logp, ent = rows_logprobs(self.model if model is None else model, b, s.temperature, entropy=True)
        ref = b.get("ref_logprobs")
        loss, m = policy_loss(logp, b["behaviour_logprobs"], b["advantages"], b["response_mask"], ref,
                              clip_eps=s.clip_ratio, kl_coef=s.kl_coef, agg=self.cfg.aggregation)
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
                "buffer": self.buffer.state_dict(lambda t: t.to_dict()), "curriculum": self.curriculum.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        if self.dp is not None:  # into every rank (partitioned under ZeRO)
            self.dp.load_full_state(self, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"], Trajectory.from_dict)
        self.curriculum.load_state_dict(state["curriculum"])

    def gathered(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``self.model`` holds its whole weights (ZeRO-3 keeps a shard on each rank)."""
        return self.dp.gathered(self) if self.dp is not None else contextlib.nullcontext()


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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


def train(cfg: RLConfig, trainer: Trainer, workers: Any, pool: list[TaskSpec], work: Path,
          log_metrics: Callable[[dict[str, float], int], None] = lambda m, r: None,
          progress: bool = True, judge: Any = None) -> list[dict[str, float]]:
    """Rounds ``trainer.round`` … ``cfg.rounds - 1``; returns every round's metrics (the curve, resumed runs
    included: earlier rounds come from ``work/curve.jsonl``)."""
    from safetensors.torch import save_model

    work.mkdir(parents=True, exist_ok=True)
    curve_path = work / "curve.jsonl"
    curve = [json.loads(x) for x in curve_path.read_text().splitlines()] if curve_path.exists() else []
    curve = [c for c in curve if c["round"] < trainer.round]  # rounds after the restored checkpoint run again
    curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))
    weights = work / "policy.safetensors"
    s = trainer.settings
    bar = tqdm(range(trainer.round, cfg.rounds), initial=trainer.round, total=cfg.rounds, desc="adagrpo",
               disable=not progress, dynamic_ncols=True)
    for r in bar:
        t0 = time.perf_counter()
        sync_s = 0.0
        if r > 0:
            ts = time.perf_counter()
            with trainer.gathered():
                save_model(trainer.model, str(weights))  # tied embeddings are saved once
            sync_s += time.perf_counter() - ts
        tasks = trainer.sample_tasks(pool, r)
        tr = time.perf_counter()
        trajs, load_s = workers.run(tasks, s.samples_per_task, stable_seed(cfg.seed, "rollout", r),
                                    weights if r > 0 else None, r)
        rollout_s = time.perf_counter() - tr - load_s
        sync_s += load_s
        tj = time.perf_counter()
        judged = judge_rewards(trajs, judge) if judge is not None else 0
        reward_s = time.perf_counter() - tj
        groups, dropped = make_groups(trajs)
        gen = torch.Generator().manual_seed(stable_seed(cfg.seed, "prune", r) % (2**63))
        score_groups(groups, s.spa_alpha if cfg.spa else None, cfg.prune_negatives, gen)
        for g in groups:
            trainer.curriculum.update(g.task_id, g.successes)
        tt = time.perf_counter()
        rows, bm = trainer.batch(groups, r)
        um = trainer.update(rows)
        train_s = time.perf_counter() - tt
        trainer.round = r + 1
        counts = trainer.curriculum.counts([t.task_id for t in pool])
        m = {"round": r, **round_metrics(groups, trajs, dropped), **bm, **um,
             "buffer/size": float(len(trainer.buffer)), "buffer/age": trainer.buffer.mean_age(r),
             "curriculum/active": float(counts["active"]), "curriculum/cooldown": float(counts["cooldown"]),
             "curriculum/removed": float(counts["removed"]),
             "reward/judged": float(judged),
             "time/rollout_s": rollout_s, "time/reward_s": reward_s, "time/train_s": train_s, "time/sync_s": sync_s}
        if um.get("train/tokens") and train_s > 0:
            m["train/tokens_per_s"] = um["train/tokens"] / train_s
        if trainer.round % cfg.checkpoint_every == 0 or trainer.round == cfg.rounds:
            tc = time.perf_counter()
            save_atomic(trainer.state_dict(), work / "state.pt")
            m["time/checkpoint_s"] = time.perf_counter() - tc
        m["time/step_s"] = time.perf_counter() - t0
        m["time/other_s"] = m["time/step_s"] - rollout_s - reward_s - train_s - sync_s
        curve.append(m)
        with curve_path.open("a") as f:
            f.write(json.dumps(m) + "\n")
        log_metrics({k: v for k, v in m.items() if k != "round"}, r)
        bar.set_postfix(sr=f"{m['rollout/success']:.3f}", buf=len(trainer.buffer), refresh=False)
    bar.close()
    return curve


def training_pool(cfg: RLConfig, root: Path) -> list[TaskSpec]:
    """The train tasks of ``cfg.suite`` (and of lab when ``lab_share`` > 0), per template at most
    ``tasks_per_template``, of the templates whose test tasks need at most ``templates_max_steps`` optimal steps."""
    from mobilerl.tasks import load_tasks

    lists = root / "data" / "tasks" / "suites"
    pool: list[TaskSpec] = []
    for suite in [cfg.suite, *(["lab"] if cfg.lab_share > 0 and cfg.suite != "lab" else [])]:
        tasks = load_tasks(suite, "train", per_template=cfg.tasks_per_template, root=lists)
        if cfg.templates_max_steps is not None:
            longest: dict[str, int] = defaultdict(int)
            for t in load_tasks(suite, "test", root=lists):
                longest[t.template] = max(longest[t.template], t.optimal_steps)
            tasks = [t for t in tasks if longest.get(t.template, 10**9) <= cfg.templates_max_steps]
        if not tasks:
            raise ValueError(f"rl: no {suite}/train task passes templates_max_steps={cfg.templates_max_steps}")
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
    # how the update is spread over processes does not change it: a run resumes under another backend/world size
    same = cfg.model_dump(exclude={"trainer_backend", "deepspeed_config"})
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
    with RolloutWorkers(spec, cfg.rollout_processes) as workers:
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
