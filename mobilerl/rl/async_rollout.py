"""Decoupled rollout and training (``rl.async``): episodes go on while the trainer updates; the trainer takes
complete groups as they come, and a trajectory more than ``max_staleness`` versions behind is dropped::

    trainer    take G complete groups → drop stale → rewards, SPA, advantages → update → publish version v+1
    pump       issue groups (n episodes of one FCF-drawn task) while the admission bound allows;
               results → groups, keyed by (draw, task)
    workers    each slot: next queued episode → load the published version if newer → run it → result

Scheduling is per trajectory: a slot that finishes an episode starts the next queued one at once, and a group is
handed over when its n episodes have ended. Admission (AReaL's bound on off-policyness): while the published
version is v, at most (v − v₀ + k + 1)·G groups have been issued (k = ``max_staleness``, v₀ the version the run
started at, G the round's tasks), so the pipeline holds at most k + 1 rounds of work; a slow episode can still fall
further behind, and is then dropped and counted (``async/dropped_stale``), never silently.

Versions: each trajectory records the version its worker held when the episode started
(``Trajectory.policy_version``). Each worker loads a newer version itself, before its next episode (per-worker
refresh: no barrier stops every env at once), so later steps of an episode in flight can come from a newer
version; the per-token behaviour logprobs are the engine's either way, and the recorded version is the oldest,
so staleness is never under-counted. The correction is the trainer's (``rl.tis_cap``: ratio against π_old,
weight min(π_old/π_behaviour, C), :func:`mobilerl.rl.loss.tis_weights`).

Resume: the checkpoint is the synchronous mode's (every ``checkpoint_every`` rounds); episodes in flight and
groups not yet trained are discarded when a run is killed, and the resumed run goes on with new draws
(``async.json`` keeps the draw counter, so no draw's episode seeds repeat). Unlike the synchronous mode, a
resumed run is not the uninterrupted one: which episodes finish first depends on timing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from mobilerl.agent.policy import Policy
from mobilerl.agent.runner import episode_seed, run_episode
from mobilerl.env.base import TaskSpec
from mobilerl.env.pool import EnvFactory, EnvPool
from mobilerl.rl.config import RLConfig
from mobilerl.rl.trainer import (
    close_round,
    judge_rewards,
    make_groups,
    open_curve,
    round_metrics,
    score_groups,
)
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One episode to run: trial ``trial`` of ``task`` from task draw ``draw`` (its group is (draw, task))."""

    draw: int
    task: TaskSpec
    trial: int
    seed: int


class Engine(Protocol):
    """What a rollout worker generates with: the weights version it holds, a policy per episode (recording that
    version), and a refresh to a newer version."""

    version: int

    def policy(self, seed: int) -> Policy: ...

    async def load(self, version: int, path: str) -> None: ...


class ModelEngine:
    """An :class:`Engine` over a :class:`~mobilerl.agent.model_policy.ModelPolicy` whose backend holds the model
    (the HF backend): a new version is loaded in place from the trainer's safetensors file."""

    def __init__(self, policy: Any, version: int = 0) -> None:
        self._policy = replace(policy, version=str(version))
        self.version = version

    def policy(self, seed: int) -> Policy:
        return self._policy.with_seed(seed)

    async def load(self, version: int, path: str) -> None:
        from safetensors.torch import load_model

        backend = self._policy.backend
        # on the backend's one model thread (HFBackend's), so the load never runs during one of its batches
        executor = getattr(backend, "_executor", None)
        await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(load_model, backend.model, path, strict=True))
        self.version = version
        self._policy = replace(self._policy, version=str(version))


class Published:
    """The newest weights the trainer has published, version and file, readable by worker threads and by spawned
    worker processes (shared memory)."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._version = ctx.Value("q", 0)
        self._path = ctx.Array("c", 4096)

    def set(self, version: int, path: str | Path) -> None:
        raw = str(path).encode()
        if len(raw) >= 4096:
            raise ValueError(f"weights path too long for the workers ({len(raw)} bytes): {path}")
        with self._version.get_lock():
            self._path.value = raw
            self._version.value = version

    def get(self) -> tuple[int, str]:
        with self._version.get_lock():
            return int(self._version.value), self._path.value.decode()

    @property
    def version(self) -> int:
        return int(self._version.value)


async def serve(engine: Engine, make_env: EnvFactory, slots: int, jobs: Any, results: Any, published: Published,
                stop: Any, worker: int = 0, call_timeout: float | None = 120.0) -> None:
    """A rollout worker: ``slots`` episodes at a time through an env pool of ``make_env`` workers, each slot
    taking the next :class:`Job` from ``jobs`` as soon as its episode ends, until ``stop`` is set (episodes in
    flight are then cancelled). Puts ``("episode", draw, trajectory)`` and ``("load", worker, version, seconds)``
    on ``results``. ``jobs``/``results`` are ``queue.Queue`` s (worker threads) or ``multiprocessing`` queues."""
    loop = asyncio.get_running_loop()
    fetcher = ThreadPoolExecutor(1, thread_name_prefix=f"mobilerl-async-jobs{worker}")
    fetch_lock, load_lock = asyncio.Lock(), asyncio.Lock()

    async def next_job() -> Job | None:
        async with fetch_lock:  # one blocking get at a time: a worker takes a job only for a free slot
            while not stop.is_set():
                try:
                    return await loop.run_in_executor(fetcher, functools.partial(jobs.get, timeout=0.05))
                except queue.Empty:
                    continue
        return None

    async def refresh() -> None:
        if published.version <= engine.version:
            return
        async with load_lock:  # one load per version; this worker's other slots wait, the other workers go on
            version, path = published.get()
            if version > engine.version:
                t0 = time.perf_counter()
                await engine.load(version, path)
                results.put(("load", worker, version, time.perf_counter() - t0))

    async def slot(pool: EnvPool) -> None:
        while (job := await next_job()) is not None:
            await refresh()
            traj, _ = await run_episode(pool, engine.policy, job.task, job.trial, job.seed)
            results.put(("episode", job.draw, traj))

    async def stopped() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)

    try:
        async with EnvPool(make_env, size=slots, call_timeout=call_timeout, start_concurrency=min(slots, 8)) as pool:
            running = asyncio.gather(*(slot(pool) for _ in range(slots)))
            halt = asyncio.ensure_future(stopped())
            await asyncio.wait([running, halt], return_when=asyncio.FIRST_COMPLETED)
            for f in (running, halt):
                f.cancel()
            await asyncio.gather(running, halt, return_exceptions=True)
            if running.done() and not running.cancelled() and running.exception() is not None:
                raise running.exception()  # type: ignore[misc]
    finally:
        fetcher.shutdown(wait=False, cancel_futures=True)


class _Workers:
    """Rollout workers sharing one job queue, one result queue, the published version and a stop flag."""

    jobs: Any
    results: Any
    stop: Any

    def __init__(self) -> None:
        self.published = Published()

    def publish(self, version: int, path: str | Path) -> None:
        """Make weights ``version`` (the file ``path``) the one each worker loads before its next episode."""
        self.published.set(version, path)

    def check(self) -> None:
        """Raise if a worker died (the run would otherwise wait for its episodes forever)."""

    def halt(self) -> None:
        """Stop taking jobs and cancel the episodes in flight."""
        self.stop.set()

    def close(self) -> None:
        self.halt()

    def run(self, tasks: Sequence[TaskSpec], n: int, base_seed: int, weights: Path | None = None,
            version: int = 0) -> tuple[list[Trajectory], float]:
        """A synchronous round (:class:`~mobilerl.rl.rollout.RolloutWorkers`' interface): ``n`` episodes of every
        task with weights ``version``, in (task, trial) order, and the slowest worker's load seconds. Seeds are
        the episode runner's (:func:`~mobilerl.agent.runner.episode_seed`)."""
        if weights is not None:
            self.publish(version, weights)
        todo = [Job(-1, t, j, episode_seed(base_seed, t.task_id, j)) for t in tasks for j in range(n)]
        for job in todo:
            self.jobs.put(job)
        got: dict[tuple[str, int], Trajectory] = {}
        loads = [0.0]
        while len(got) < len(todo):
            try:
                item = self.results.get(timeout=0.5)
            except queue.Empty:
                self.check()
                continue
            if item[0] == "load":
                loads.append(item[3])
            else:
                got[(item[2].task_id, item[2].trial)] = item[2]
        return [got[(t.task_id, j)] for t in tasks for j in range(n)], max(loads)

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ThreadWorkers(_Workers):
    """``workers`` rollout workers in threads of this process, each with its own event loop, env pool of ``slots``
    envs from ``make_env`` and engine ``make_engine(i)`` (built in its thread): for engines that live elsewhere
    (an inference server) and for tests and benchmarks with simulated ones."""

    def __init__(self, make_engine: Callable[[int], Engine], make_env: EnvFactory, workers: int = 1,
                 slots: int = 64, call_timeout: float | None = 120.0) -> None:
        super().__init__()
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        build = threading.Lock()  # one engine built at a time: model loading (transformers') is not thread-safe

        def main(i: int) -> None:
            try:
                with build:
                    engine = make_engine(i)
                asyncio.run(serve(engine, make_env, slots, self.jobs, self.results, self.published, self.stop, i,
                                  call_timeout))
            except BaseException as e:  # noqa: BLE001 - reported to the trainer by check()
                self.errors.append(e)

        self.threads = [threading.Thread(target=main, args=(i,), name=f"mobilerl-rollout{i}", daemon=True)
                        for i in range(workers)]
        for t in self.threads:
            t.start()

    def check(self) -> None:
        if self.errors:
            raise RuntimeError(f"a rollout worker thread failed: {self.errors[0]!r}") from self.errors[0]
        if not self.stop.is_set() and not all(t.is_alive() for t in self.threads):
            raise RuntimeError("a rollout worker thread ended")

    def close(self) -> None:
        self.halt()
        for t in self.threads:
            t.join(timeout=30)


def _process_main(spec: Any, slots: int, jobs: Any, results: Any, published: Published, stop: Any,
                  worker: int) -> None:
    from mobilerl.env.pool import InlineEnv
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.rl import rollout

    rollout._init_worker(spec)  # the synchronous workers' policy, and an exit when the trainer is killed
    results.cancel_join_thread()  # at shutdown unsent results may be lost; the process must not hang on them
    engine = ModelEngine(rollout._WORKER["policy"])
    asyncio.run(serve(engine, lambda: InlineEnv(SimEnv(render=False, perturb="default")), slots, jobs, results,
                      published, stop, worker))


class ProcessWorkers(_Workers):
    """``processes`` spawned rollout workers, each holding the policy (``PolicySpec``, as the synchronous
    :class:`~mobilerl.rl.rollout.RolloutWorkers`) and running ``slots`` simulator episodes at a time."""

    def __init__(self, spec: Any, processes: int = 2, slots: int = 64) -> None:
        super().__init__()
        ctx = mp.get_context("spawn")
        self.jobs, self.results, self.stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.procs = [ctx.Process(target=_process_main, name=f"mobilerl-rollout{i}", daemon=True,
                                  args=(spec, slots, self.jobs, self.results, self.published, self.stop, i))
                      for i in range(processes)]
        for p in self.procs:
            p.start()

    def check(self) -> None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead and not self.stop.is_set():
            raise RuntimeError(f"rollout worker {dead[0].name} died (exit code {dead[0].exitcode})")

    def close(self) -> None:
        self.halt()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        self.jobs.cancel_join_thread()


class Scheduler:
    """The trainer's side: issues groups within the admission bound (a pump thread), gathers the workers' results
    into groups by (draw, task), and hands complete groups to the trainer (:meth:`take`).

    ``sample(d)`` draws the tasks of draw ``d`` (the trainer's FCF sampler); it runs in the pump thread under
    :attr:`lock`, which the trainer must hold while it changes the sampler's state (the curriculum).
    """

    def __init__(self, workers: _Workers, sample: Callable[[int], Sequence[TaskSpec]], groups: int, n: int,
                 max_staleness: int, seed: int, version: int = 0, draw: int = 0) -> None:
        self.workers, self.sample, self.groups, self.n = workers, sample, groups, n
        self.max_staleness, self.seed = max_staleness, seed
        self.version = self.start_version = version
        self.draw = draw
        self.lock = threading.Lock()
        self.issued = 0  # groups
        self.completed = 0  # episodes
        self.loads: list[tuple[int, int, float]] = []  # (worker, version, seconds)
        self._queued: deque[tuple[int, int, TaskSpec]] = deque()  # (draw, base seed, task) not yet issued
        self._pending: dict[tuple[int, str], list[Trajectory]] = {}
        self._ready: deque[list[Trajectory]] = deque()
        self._cv = threading.Condition()
        self._halt = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pump, name="mobilerl-async-pump", daemon=True)

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def close(self) -> None:
        self._halt.set()
        self._thread.join(timeout=30)
        self.workers.halt()

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def bound(self) -> int:
        """Groups that may have been issued at the current version."""
        return (self.version - self.start_version + self.max_staleness + 1) * self.groups

    def publish(self, version: int, path: str | Path) -> None:
        """Weights ``version`` are in ``path``: the workers load them, and G more groups may be issued."""
        self.workers.publish(version, path)
        with self.lock:
            self.version = version

    def take(self) -> tuple[list[list[Trajectory]], float]:
        """Wait for G complete groups (completion order); returns them and the seconds waited."""
        t0 = time.perf_counter()
        with self._cv:
            while len(self._ready) < self.groups:
                if self._error is not None:
                    raise RuntimeError(f"rl async: the rollout side failed: {self._error!r}") from self._error
                self._cv.wait(0.1)
            out = [self._ready.popleft() for _ in range(self.groups)]
        return out, time.perf_counter() - t0

    def backlog(self) -> tuple[int, int]:
        """Complete groups waiting for the trainer, and episodes issued but not yet ended."""
        with self._cv:
            ready = len(self._ready)
        return ready, self.issued * self.n - self.completed

    def _issue(self) -> None:
        with self.lock:
            while self.issued < self.bound:
                if not self._queued:
                    tasks = list(self.sample(self.draw))
                    if not tasks:
                        raise RuntimeError(f"the task sampler returned no task for draw {self.draw} "
                                           "(every task removed by FCF?)")
                    base = stable_seed(self.seed, "async-rollout", self.draw)
                    self._queued.extend((self.draw, base, t) for t in tasks)
                    self.draw += 1
                d, base, task = self._queued.popleft()
                self._pending[(d, task.task_id)] = []
                for j in range(self.n):
                    self.workers.jobs.put(Job(d, task, j, episode_seed(base, task.task_id, j)))
                self.issued += 1

    def _pump(self) -> None:
        try:
            while not self._halt.is_set():
                self._issue()
                try:
                    item = self.workers.results.get(timeout=0.02)
                except queue.Empty:
                    self.workers.check()
                    continue
                if item[0] == "load":
                    self.loads.append(item[1:])
                    continue
                _, d, traj = item
                group = self._pending[(d, traj.task_id)]
                group.append(traj)
                self.completed += 1
                if len(group) == self.n:
                    del self._pending[(d, traj.task_id)]
                    with self._cv:
                        self._ready.append(group)
                        self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - the trainer thread raises it from take()
            self._error = e


def trajectory_version(t: Trajectory) -> int | None:
    """The policy version a trajectory was sampled with (None: none recorded, e.g. a policy that failed to build
    before generating anything)."""
    if t.policy_version is None:
        return None
    try:
        return int(t.policy_version)
    except ValueError:
        raise ValueError(f"trajectory {t.episode_id}: policy_version {t.policy_version!r} is not a version "
                         "number (the asynchronous mode needs its workers' versions)") from None


def drop_stale(trajectories: list[Trajectory], version: int, max_staleness: int) -> tuple[list[Trajectory], list[int]]:
    """The trajectories at most ``max_staleness`` versions behind ``version`` (kept in order), and the staleness
    (``version − v``) of each kept one; those without a version (no tokens sampled) count as current."""
    kept, ages = [], []
    for t in trajectories:
        v = trajectory_version(t)
        age = 0 if v is None else version - v
        if age <= max_staleness:
            kept.append(t)
            ages.append(age)
    return kept, ages


def train_async(cfg: RLConfig, trainer: Any, workers: _Workers, pool: list[TaskSpec], work: Path,
                log_metrics: Callable[[dict[str, float], int], None] = lambda m, r: None,
                progress: bool = True, judge: Any = None) -> list[dict[str, float]]:
    """Rounds ``trainer.round`` … ``cfg.rounds - 1`` of the asynchronous mode (the module docstring); returns the
    curve like :func:`mobilerl.rl.trainer.train`, with ``async/*`` metrics and ``time/rollout_s`` the seconds the
    trainer waited for groups."""
    from safetensors.torch import save_model

    if cfg.async_ is None:
        raise ValueError("train_async needs rl.async (max_staleness)")
    if cfg.tis_cap is None:
        log.warning("rl.async without rl.tis_cap: stale tokens are weighted as on-policy ones (ratio vs behaviour)")
    max_staleness = cfg.async_.max_staleness
    s = trainer.settings
    curve_path, curve = open_curve(work, trainer.round)
    draws_path = work / "async.json"
    draw = json.loads(draws_path.read_text())["draws"] if trainer.round and draws_path.exists() else 0
    sched = Scheduler(workers, lambda d: trainer.sample_tasks(pool, d), s.train_batch_size, s.samples_per_task,
                      max_staleness, cfg.seed, trainer.round, draw)

    def publish(v: int) -> None:
        path = work / f"policy.v{v}.safetensors"
        tmp = path.with_suffix(".tmp")
        save_model(trainer.model, str(tmp))  # tied embeddings are saved once
        os.replace(tmp, path)  # a worker never opens a half-written file
        sched.publish(v, path)
        (work / f"policy.v{v - 3}.safetensors").unlink(missing_ok=True)  # no worker still loads one that old

    if trainer.round > 0:
        publish(trainer.round)  # resumed: the workers start from the checkpoint's weights
    seen_loads = 0
    bar = tqdm(range(trainer.round, cfg.rounds), initial=trainer.round, total=cfg.rounds, desc="adagrpo-async",
               disable=not progress, dynamic_ncols=True)
    try:
        with sched:
            for r in bar:
                t0 = time.perf_counter()
                raw, wait_s = sched.take()
                trajs = [t for g in raw for t in g]
                tj = time.perf_counter()
                kept, ages = [], []
                for g in raw:
                    fresh, a = drop_stale(g, r, max_staleness)
                    kept.append(fresh)
                    ages += a
                stale = len(trajs) - sum(map(len, kept))
                if stale:
                    log.warning("rl async: round %d dropped %d of %d trajectories older than max_staleness = %d",
                                r, stale, len(trajs), max_staleness)
                judged = judge_rewards([t for g in kept for t in g], judge) if judge is not None else 0
                groups, env_failures = [], 0
                for g in kept:  # one group per (draw, task): a task drawn twice is two groups
                    gs, dropped = make_groups(g)
                    groups += gs
                    env_failures += dropped
                reward_s = time.perf_counter() - tj
                gen = torch.Generator().manual_seed(stable_seed(cfg.seed, "prune", r) % (2**63))
                score_groups(groups, s.spa_alpha if cfg.spa else None, cfg.prune_negatives, gen)
                with sched.lock:  # the pump samples from the curriculum
                    for g in groups:
                        trainer.curriculum.update(g.task_id, g.successes)
                tt = time.perf_counter()
                rows, bm = trainer.batch(groups, r)
                um = trainer.update(rows)
                train_s = time.perf_counter() - tt
                trainer.round = r + 1
                ts = time.perf_counter()
                publish(r + 1)
                sync_s = time.perf_counter() - ts
                counts = trainer.curriculum.counts([t.task_id for t in pool])
                ready, in_flight = sched.backlog()
                loads, seen_loads = sched.loads[seen_loads:], len(sched.loads)
                m = {"round": r, **round_metrics(groups, trajs, env_failures), **bm, **um,
                     "buffer/size": float(len(trainer.buffer)), "buffer/age": trainer.buffer.mean_age(r),
                     "curriculum/active": float(counts["active"]), "curriculum/cooldown": float(counts["cooldown"]),
                     "curriculum/removed": float(counts["removed"]), "reward/judged": float(judged),
                     "async/dropped_stale": float(stale), "async/staleness_mean": float(np.mean(ages)) if ages else 0.0,
                     "async/staleness_max": float(max(ages, default=0)), "async/groups_waiting": float(ready),
                     "async/episodes_in_flight": float(in_flight), "async/worker_loads": float(len(loads)),
                     "async/worker_load_s": max((x[2] for x in loads), default=0.0),
                     "time/rollout_s": wait_s, "time/reward_s": reward_s, "time/train_s": train_s,
                     "time/sync_s": sync_s}
                def save_draws() -> None:  # first: a count ahead of the checkpoint is harmless
                    tmp = draws_path.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"draws": sched.draw}))
                    os.replace(tmp, draws_path)

                close_round(cfg, trainer, work, m, t0, curve, curve_path, log_metrics, save_draws)
                bar.set_postfix(sr=f"{m['rollout/success']:.3f}", stale=int(stale), refresh=False)
    finally:
        bar.close()
        for p in work.glob("policy.v*.safetensors"):
            p.unlink(missing_ok=True)
    return curve
