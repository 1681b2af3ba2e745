"""The `rl` stage's entry (:func:`run`): the training pool, the trainer from ``rl.init`` (resumed from ``rl.work``
when it holds a checkpoint of the same config), the rollout side that ``rl`` configures — local rollout workers
over the in-process simulator, env servers or AndroidWorld's servers, remote engines with weight sync, or the
asynchronous workers (local processes, or remote engines: :mod:`mobilerl.rl.async_engines`) —
then the loop, and the trained policy written to ``rl.out``."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mobilerl.env.base import TaskSpec
from mobilerl.rl.batch import PromptFormat
from mobilerl.rl.checkpoint import remove_state, resume_or_start
from mobilerl.rl.config import RLConfig
from mobilerl.rl.loop import LogImages, LogMetrics, train
from mobilerl.rl.rollout import PolicySpec, RolloutWorkers, kept_screens
from mobilerl.rl.trainer import Trainer

log = logging.getLogger(__name__)


def training_pool(cfg: RLConfig, root: Path) -> list[TaskSpec]:
    """The train tasks of ``cfg.suite`` (with ``test_half``: that half of its test tasks; and lab/train when
    ``lab_share`` > 0), per template at most ``tasks_per_template``, of the templates whose test tasks need at most
    ``templates_max_steps`` optimal steps; with ``curriculum``, each task's own optimal steps (the reverse curriculum's
    L; train lists do not carry them)."""
    from mobilerl.env.androidworld import androidworld_tasks
    from mobilerl.tasks import halves, load_tasks

    lists = root / "data" / "tasks" / "suites"
    pool: list[TaskSpec] = []
    for suite in [cfg.suite, *(["lab"] if cfg.lab_share > 0 and cfg.suite != "lab" else [])]:
        split = "test" if cfg.test_half is not None and suite == cfg.suite else "train"
        if cfg.androidworld is not None:  # its servers list the suite (the same on each; rl.androidworld.seed)
            tasks = androidworld_tasks(cfg.androidworld, split, per_type=cfg.tasks_per_template)
        else:
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
    if cfg.curriculum is not None and cfg.androidworld is None:  # train lists skip the oracle's run: L measured here
        from mobilerl.env.sim.tasks import optimal_steps

        pool = [t if t.optimal_steps else dataclasses.replace(t, optimal_steps=optimal_steps(t.task_id)) for t in pool]
    return pool


def policy_spec(cfg: RLConfig, init: Path, work: Path) -> PolicySpec:
    """What a rollout worker builds its policy from: the init and the profile's backend and prompt settings; in a
    screenshot mode the episodes keep their screenshots under ``work/screens`` (the trainer's rows read them)."""
    from mobilerl.env.factory import renders
    from mobilerl.models.backends import profile_spec
    from mobilerl.models.profiles import load_profile

    profile, s = load_profile(cfg.profile), cfg.settings()
    g = profile.generation
    screens, key = kept_screens(cfg, work) if renders(g.obs_mode) else (None, None)
    return PolicySpec(
        init=str(init), backend={**profile_spec(profile), **({"max_batch": cfg.max_batch} if cfg.max_batch else {})},
        obs_mode=g.obs_mode, prompt_style=g.prompt_style, max_history=g.max_history, coords=g.coords,
        reasoning=cfg.reasoning, temperature=s.temperature, max_new_tokens=s.max_new_tokens,
        threads=max(1, (os.cpu_count() or 1) // cfg.rollout_processes), concurrency=cfg.rollout_concurrency,
        screens=None if screens is None else str(screens), screens_key=key)


def _loop(cfg: RLConfig, trainer: Trainer, spec: PolicySpec, pool: list[TaskSpec], work: Path,
          log_metrics: LogMetrics, progress: bool, judge: Any, log_images: LogImages | None) -> list[dict[str, float]]:
    """The loop over the rollout side ``cfg`` configures."""
    if cfg.async_ is not None:  # decoupled rollout and training
        from mobilerl.rl.async_loop import train_async
        from mobilerl.rl.async_workers import ProcessWorkers

        if cfg.engines:
            from mobilerl.rl.async_engines import remote_workers

            aworkers: Any = remote_workers(cfg, spec, trainer, work)
        else:
            aworkers = ProcessWorkers(spec, cfg.rollout_processes, cfg.rollout_concurrency, cfg.env_servers,
                                      cfg.env_pool, cfg.async_.reruns,
                                      spec.screens)
        with aworkers as w:
            return train_async(trainer, w, pool, work, log_metrics, progress, judge, log_images)
    if cfg.engines:
        from mobilerl.rl.engine import remote_engines

        rollouts: Any = remote_engines(cfg, spec, trainer, work)
    else:
        rollouts = RolloutWorkers(spec, cfg.rollout_processes, cfg.env_servers, cfg.env_pool, cfg.androidworld)
    with rollouts as workers:
        return train(trainer, workers, pool, work, log_metrics, progress, judge, log_images)


def run(cfg: RLConfig, root: Path, log_metrics: LogMetrics = lambda m, r: None, progress: bool = True,
        log_images: LogImages | None = None) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The whole `rl` stage: train from ``cfg.init`` (resuming from ``cfg.work`` when it holds a checkpoint of
    the same config), write the policy to ``cfg.out``; returns the summary and the curve. ``log_images`` takes a
    round's episode images (``rl.log_episodes_every``). With ``rl.cluster: ray`` the engines, env servers and
    trainer ranks of ``rl.ray`` run as Ray actors for the run (:mod:`mobilerl.rl.ray_cluster`)."""
    if cfg.cluster != "ray":
        return _run(cfg, root, log_metrics, progress, log_images)
    from mobilerl.env.factory import renders
    from mobilerl.models.profiles import load_profile
    from mobilerl.rl.ray_cluster import RayCluster

    def rank_failed(err: BaseException) -> None:  # as a launcher does: a lost rank ends the job (it resumes)
        log.error("rl: a trainer rank ended before rank 0: %s", err)
        print(f"rl: a trainer rank ended before rank 0, stopping: {err}", file=sys.stderr, flush=True)
        os._exit(1)

    render = renders(load_profile(cfg.profile).generation.obs_mode)
    with RayCluster(cfg.ray, model=root / cfg.init, render=render, token_env=cfg.env_pool.token_env,
                    api_key_env=cfg.engines_api_key_env) as cluster:
        configured = cluster.configure(cfg)
        cluster.start_ranks(run, configured, root, rank_failed)
        out = _run(configured, root, log_metrics, progress, log_images)
        cluster.join_ranks()
    return out


def _run(cfg: RLConfig, root: Path, log_metrics: LogMetrics, progress: bool,
         log_images: LogImages | None) -> tuple[dict[str, Any], list[dict[str, float]]]:
    from mobilerl.env.factory import renders
    from mobilerl.models import tiny
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.profiles import load_profile

    torch.manual_seed(cfg.seed)
    g = load_profile(cfg.profile).generation
    init = root / cfg.init
    work, out = root / cfg.work, root / cfg.out
    fmt = PromptFormat(g.obs_mode, g.prompt_style, g.max_history, g.coords, cfg.reasoning)
    backend = HFBackend.from_pretrained(init, device=cfg.device, fast_prefill=False, prefix_cache_tokens=0)
    vision = backend.image_inputs if renders(g.obs_mode) else None  # the rows' screenshots, as generation reads them
    trainer = Trainer(cfg, backend.model, backend.prompt_ids, backend.pad_id, fmt, vision)
    if trainer.dp is not None and trainer.dp.rank != 0:
        trainer.follow()  # the updates, checkpoints and weight gathers rank 0 runs; then rank 0 stops it
        return {}, []
    pool = training_pool(cfg, root)
    if not resume_or_start(trainer, work) and cfg.curriculum_init:
        trainer.curriculum.load_state_dict(json.loads((root / cfg.curriculum_init).read_text()))
    judge = None
    if cfg.reward_model:
        from mobilerl.reward.judge import RewardModel

        judge = RewardModel.from_checkpoint(root / cfg.reward_model)
    t0 = time.perf_counter()
    curve = _loop(cfg, trainer, policy_spec(cfg, init, work), pool, work, log_metrics, progress, judge, log_images)
    wall = time.perf_counter() - t0
    if out.exists():
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
    remove_state(work)
    first = [c["rollout/success"] for c in curve[:5]]
    last = [c["rollout/success"] for c in curve[-5:]]
    return {"rounds": len(curve), "pool": len(pool), "wall_s": wall, "init": cfg.init,
            "success_first5": float(np.mean(first)) if first else 0.0,
            "success_last5": float(np.mean(last)) if last else 0.0,
            "curriculum_removed": sum(trainer.curriculum.removed(t.task_id) for t in pool),
            "buffer_size": len(trainer.buffer)}, curve
