"""Rollout workers: persistent processes that hold the policy and run a round's episodes through the episode
runner, with the trainer's latest weights.

Each worker loads the init checkpoint once; before a round it loads the weights file the trainer wrote if its
version is newer (``HFBackend.load_weights``: in place, between batches, its caches dropped). The
episodes of a round are split over the workers task by task; an episode's sampling seed depends on its task,
trial and the round's base seed only, so the split does not change what is sampled.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobilerl import sealed
from mobilerl.env.androidworld import AndroidWorldConfig
from mobilerl.env.base import TaskSpec
from mobilerl.env.cluster import EnvServers, EnvServersConfig, merge_stats, server_metrics
from mobilerl.trajectory import Trajectory


@dataclass(frozen=True)
class PolicySpec:
    """What a worker needs to build the policy (picklable)."""

    init: str
    backend: dict[str, Any]
    obs_mode: str
    prompt_style: str
    max_history: int | None
    coords: str
    reasoning: bool
    temperature: float
    max_new_tokens: int
    threads: int = 1
    concurrency: int = 64
    screens: str | None = None  # where episodes keep each step's screenshot (screenshot modes: the trainer
    # rebuilds their prompts from them); None: not kept
    screens_key: bytes | None = None  # the key those files are sealed with (kept_screens)


SCREENS = "screens"  # the kept screenshots' folder in rl.work (pruned every round: prune_screens)
_WORKER: dict[str, Any] = {}


def kept_screens(cfg: Any, work: Path) -> tuple[Path, bytes]:
    """``work/screens`` and the run's key (``rl.state_key``), the folder registered in this process as sealed
    with it: the episodes' screenshots show the device's personal data (:mod:`mobilerl.sealed`)."""
    from mobilerl.rl.checkpoint import state_key

    key = state_key(cfg.state_key)
    return sealed.seal(work / SCREENS, key), key


def _exit_with_parent() -> None:
    """A killed trainer (``kill -9``) cannot shut its pool down: each worker leaves when its parent is gone."""
    import os
    import threading

    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(0)), daemon=True).start()


def _init_worker(spec: PolicySpec, env_servers: list[str] | None = None, env_pool: EnvServersConfig | None = None,
                 share: float = 1.0) -> None:
    import torch

    _exit_with_parent()

    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.backends import make_backend
    from mobilerl.models.generation import SamplingConfig

    torch.set_num_threads(spec.threads)
    if spec.screens is not None and spec.screens_key is not None:
        sealed.seal(spec.screens, spec.screens_key)
    backend = make_backend({**spec.backend, "model": spec.init, "name": "adagrpo"})
    _WORKER.update(spec=spec, backend=backend, version=-1, policy=ModelPolicy(
        backend, obs_mode=spec.obs_mode, name="adagrpo", reasoning=spec.reasoning, max_history=spec.max_history,
        prompt_style=spec.prompt_style, coords=spec.coords, reuse_greedy=False,
        sampling=SamplingConfig(temperature=spec.temperature, max_new_tokens=spec.max_new_tokens, seed=0)))
    if env_servers:
        _WORKER["envs"] = EnvServers(env_servers, env_pool, share=share)  # health state lasts across rounds


def _run_shard(args: tuple) -> tuple[list[dict[str, Any]], float, dict[str, Any] | None]:
    tasks, n, base_seed, weights, version, env_factory = args
    from mobilerl.eval.runner import evaluate_sync

    t0 = time.perf_counter()
    if weights is not None and version != _WORKER["version"]:
        _WORKER["backend"].load_weights(weights)
        _WORKER["version"] = version
    sync_s = time.perf_counter() - t0
    policy = _WORKER["policy"]
    policy.version = str(version)
    envs = _WORKER.get("envs")
    trajs = evaluate_sync(policy.with_seed, tasks, n_trials=n, base_seed=base_seed, progress=False,
                          obs_mode=_WORKER["spec"].obs_mode, env_factory=env_factory,
                          concurrency=_WORKER["spec"].concurrency, env_servers=envs,
                          keep_screenshots_dir=screens_dir(_WORKER["spec"].screens, f"s{base_seed}"),
                          **({"call_timeout": None} if env_factory is not None else {}))
    return [t.to_dict() for t in trajs], sync_s, envs.take_stats() if envs is not None else None


def screens_dir(root: str | Path | None, batch: str) -> Path | None:
    """The folder of one batch of episodes' screenshots under ``root`` (a shard of a round: ``s<base seed>``; a
    task draw of the asynchronous mode: ``d<draw>``), None when none are kept."""
    return Path(root) / batch if root is not None else None


def prune_screens(root: Path, trainer: Any, open_from: int | None = None) -> int:
    """Delete the batches of kept screenshots under ``root`` that no trajectory can need again: those no trajectory
    the trainer holds names (AdaPR's buffer, the hooks' replays), except, in the asynchronous mode, the draws from
    ``open_from`` on (still running or waiting). Returns the batches deleted. Without it a screenshot run keeps
    every screen it ever showed (a 1080x2400 PNG is 30-60 kB)."""
    import shutil

    if not root.is_dir():
        return 0
    used = {Path(p).relative_to(root).parts[0] for p in _screenshot_paths(
        [trainer.buffer.state_dict(lambda t: t.to_dict()), trainer.hooks.state_dict()]) if Path(p).is_relative_to(root)}
    gone = 0
    for d in root.iterdir():
        draw = d.name[1:] if d.name.startswith("d") else ""
        if d.name in used or (open_from is not None and draw.isdigit() and int(draw) >= open_from):
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone += 1
    return gone


def _screenshot_paths(obj: Any) -> list[str]:
    """Every ``screenshot_path`` value in a tree of dicts and lists (trajectories in their dict form)."""
    out: list[str] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            p = x.get("screenshot_path")
            if isinstance(p, str):
                out.append(p)
            stack.extend(v for v in x.values() if isinstance(v, dict | list | tuple))
        elif isinstance(x, list | tuple):
            stack.extend(v for v in x if isinstance(v, dict | list | tuple))
    return out


class RolloutWorkers:
    """``processes`` spawned workers, each with its own copy of the policy (``PolicySpec``); their episodes run
    on ``env_servers`` (URLs, token from ``env_pool.token_env``) when given, on ``androidworld``'s servers (each
    concurrent shard of a round on its own share of them) when given, else on the in-process simulator."""

    def __init__(self, spec: PolicySpec, processes: int = 2, env_servers: list[str] | None = None,
                 env_pool: EnvServersConfig | None = None, androidworld: AndroidWorldConfig | None = None) -> None:
        from mobilerl.env.factory import env_factory

        self.processes = processes
        if env_servers:
            EnvServers(env_servers, env_pool)  # a bad URL or a missing token fails here, not in a worker
        self._aw = None if androidworld is None else env_factory(
            "androidworld", obs_mode=spec.obs_mode, androidworld=androidworld)
        self._env_stats: dict[str, dict[str, Any]] = {}
        self._pool = ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                         initargs=(spec, env_servers, env_pool, 1.0 / processes))

    def run(self, tasks: Sequence[TaskSpec], n: int | Sequence[int], base_seed: int, weights: Path | None = None,
            version: int = 0) -> tuple[list[Trajectory], float]:
        """``n`` episodes of every task (a sequence: ``n[i]`` of task ``i``, DART's dynamic rollout counts), in
        (task, trial) order, with weights ``version`` from ``weights`` (None: the init). Returns the
        trajectories and the slowest worker's weight-loading seconds."""
        counts = [n] * len(tasks) if isinstance(n, int) else list(n)
        k = max(1, min(self.processes, len(tasks)))
        shards = [list(tasks[i::k]) for i in range(k)]
        # a plain int keeps the shard's call as it was; per-task counts are split like the tasks
        per = [n if isinstance(n, int) else counts[i::k] for i in range(k)]
        w = str(weights) if weights is not None else None
        # the k shards run at once, each on every k-th AndroidWorld server: no server holds two episodes
        aw = [None] * k if self._aw is None else [self._aw.shard(i, k) for i in range(k)]
        jobs = [(s, c, base_seed, w, version, e) for s, c, e in zip(shards, per, aw, strict=True)]
        results = list(self._pool.map(_run_shard, jobs))
        by_key = {(d["task_id"], d["trial"]): Trajectory.from_dict(d) for r, _, _ in results for d in r}
        out = [by_key[(t.task_id, j)] for t, c in zip(tasks, counts, strict=True) for j in range(c)
               if (t.task_id, j) in by_key]
        self._env_stats = merge_stats([e for _, _, e in results])
        return out, max(s for _, s, _ in results)

    def metrics(self) -> dict[str, float]:
        """The last round's per-server figures (``envs/<server>/<figure>``); empty without env servers."""
        return server_metrics(self._env_stats)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)

    def __enter__(self) -> RolloutWorkers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
