"""The asynchronous mode's rollout side (``rl.async``; the loop is :mod:`mobilerl.rl.async_loop`): workers
whose slots each take the next queued episode as soon as their previous one ends, and load the newest published
weights before it (per-worker refresh: no barrier stops every env at once)::

    workers    each slot: next queued Job → load the published version if newer → run it → result

Each trajectory records the version its worker held when the episode started (``Trajectory.policy_version``);
later steps of an episode in flight can come from a newer version, the per-token behaviour logprobs are the
engine's either way, and the recorded version is the oldest, so staleness is never under-counted.

Envs are the in-process simulator or env servers (:class:`~mobilerl.env.cluster.EnvServers`: placement, health,
replay of a failed step elsewhere). An episode cut short by its env or engine (error kinds ``env`` / ``engine``)
is queued again from its start, up to ``reruns`` times, with the errors it met in ``meta["reruns"]``, so it runs
elsewhere once the failed server is marked down; after that it goes to the trainer as it ended, which drops and
counts it (:func:`mobilerl.rl.groups.triage`). In screenshot observation modes each episode's screens are kept
under ``screens/d<draw>/a<attempt>/`` for the update to rebuild its prompts (:mod:`mobilerl.rl.batch`).
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import queue
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from mobilerl.agent.policy import Policy
from mobilerl.agent.runner import episode_seed, run_episode
from mobilerl.env.base import TaskSpec
from mobilerl.env.cluster import EnvServers, EnvServersConfig
from mobilerl.env.pool import EnvFactory, EnvPool
from mobilerl.rl.groups import INFRASTRUCTURE
from mobilerl.trajectory import Trajectory


@dataclass(frozen=True)
class Job:
    """One episode to run: trial ``trial`` of ``task`` from task draw ``draw`` (its group is (draw, task));
    ``failed``: the errors of its earlier attempts, cut short by their env or engine."""

    draw: int
    task: TaskSpec
    trial: int
    seed: int
    failed: tuple[str, ...] = ()


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
        # HFBackend.load_weights runs on the backend's model thread: never during one of its batches
        await asyncio.to_thread(self._policy.backend.load_weights, path)
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


async def serve(engine: Engine, envs: EnvFactory | EnvServers, slots: int, jobs: Any, results: Any,
                published: Published, stop: Any, worker: int = 0, call_timeout: float | None = 120.0,
                reruns: int = 0, screens: str | Path | None = None) -> None:
    """A rollout worker: ``slots`` episodes at a time through an env pool (of ``envs`` workers, or over the env
    servers ``envs``), each slot taking the next :class:`Job` from ``jobs`` as soon as its episode ends, until
    ``stop`` is set (episodes in flight are then cancelled). Puts ``("episode", draw, trajectory)``,
    ``("load", worker, version, seconds)`` and ``("rerun", worker, error)`` on ``results`` (the module docstring:
    ``reruns``, ``screens``). ``jobs``/``results`` are ``queue.Queue`` s (worker threads) or ``multiprocessing``
    queues."""
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
        if published.version <= engine.version or stop.is_set():  # stopping: the last version's file may be gone
            return
        async with load_lock:  # one load per version; this worker's other slots wait, the other workers go on
            version, path = published.get()
            if version <= engine.version:
                return
            t0 = time.perf_counter()
            while True:
                try:
                    await engine.load(version, path)
                    break
                except FileNotFoundError:
                    # the trainer deletes a file 3 versions on: a load queued that long loads the newest instead
                    if published.version <= version or stop.is_set():
                        raise
                    version, path = published.get()
            results.put(("load", worker, version, time.perf_counter() - t0))

    async def slot(pool: EnvPool) -> None:
        annotate = getattr(engine, "annotate", None)  # what an engine records of the episode it served
        while (job := await next_job()) is not None:
            await refresh()
            made: list[Policy] = []
            policy = functools.partial(_made, engine, made)
            shots = None if screens is None else Path(screens) / f"d{job.draw}" / f"a{len(job.failed)}"
            traj, _ = await run_episode(pool, policy, job.task, job.trial, job.seed, keep_screenshots_dir=shots)
            if annotate is not None and made:
                annotate(made[-1], traj)
            if traj.error_kind in INFRASTRUCTURE and len(job.failed) < reruns:
                jobs.put(replace(job, failed=(*job.failed, str(traj.error))))
                results.put(("rerun", worker, traj.error))
                continue
            if job.failed:
                traj.meta["reruns"] = list(job.failed)
            results.put(("episode", job.draw, traj))

    async def stopped() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)

    try:
        pool = (envs.pool(slots) if isinstance(envs, EnvServers)
                else EnvPool(envs, size=slots, call_timeout=call_timeout))
        async with pool:
            running = asyncio.gather(*(slot(pool) for _ in range(slots)))
            halt = asyncio.ensure_future(stopped())
            await asyncio.wait([running, halt], return_when=asyncio.FIRST_COMPLETED)
            for f in (running, halt):
                f.cancel()
            await asyncio.gather(running, halt, return_exceptions=True)
            # a slot's own error ends the worker; the CancelledError of the slots stopped above does not (gather
            # keeps a cancelled child's as its exception)
            error = running.exception() if running.done() and not running.cancelled() else None
            if error is not None and not isinstance(error, asyncio.CancelledError):
                raise error
    finally:
        fetcher.shutdown(wait=False, cancel_futures=True)


def _made(engine: Engine, made: list[Policy], seed: int) -> Policy:
    """``engine.policy(seed)``, kept in ``made`` (the slot annotates the trajectory with it)."""
    made.append(engine.policy(seed))
    return made[-1]


class Workers:
    """Rollout workers sharing one job queue, one result queue, the published version and a stop flag."""

    jobs: Any
    results: Any
    stop: Any
    pushes_weights = False  # True: publish() moves the trainer's weights itself (remote engines), no file
    screens: Path | None = None  # where episodes keep their screenshots (None: not kept, text modes)

    def __init__(self) -> None:
        self.published = Published()

    def publish(self, version: int, path: str | Path) -> None:
        """Make weights ``version`` (the file ``path``) the one each worker loads before its next episode."""
        self.published.set(version, path)

    def idle(self) -> None:
        """Called by the trainer's thread while it waits for groups (its weights are not changing then)."""

    def metrics(self) -> dict[str, float]:
        """The rollout side's figures since the last call (per engine, per env server); none by default."""
        return {}

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
            elif item[0] == "episode":
                got[(item[2].task_id, item[2].trial)] = item[2]
        return [got[(t.task_id, j)] for t in tasks for j in range(n)], max(loads)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _process_main(spec: Any, slots: int, jobs: Any, results: Any, published: Published, stop: Any,
                  worker: int, env_servers: list[str] | None, env_pool: EnvServersConfig | None, share: float,
                  reruns: int, screens: str | None) -> None:
    from mobilerl.env.factory import make_env
    from mobilerl.env.pool import InlineEnv
    from mobilerl.rl import rollout

    rollout._init_worker(spec)  # the synchronous workers' policy, and an exit when the trainer is killed
    results.cancel_join_thread()  # at shutdown unsent results may be lost; the process must not hang on them
    engine = ModelEngine(rollout._WORKER["policy"])
    envs: EnvFactory | EnvServers = (EnvServers(env_servers, env_pool, share=share) if env_servers else
                                     lambda: InlineEnv(make_env("sim", obs_mode=spec.obs_mode)))
    asyncio.run(serve(engine, envs, slots, jobs, results, published, stop, worker, reruns=reruns, screens=screens))


class ProcessWorkers(Workers):
    """``processes`` spawned rollout workers, each holding the policy (``PolicySpec``, as the synchronous
    :class:`~mobilerl.rl.rollout.RolloutWorkers`) and running ``slots`` episodes at a time, on the simulator or
    on ``env_servers`` (each process filling its share of their capacity)."""

    def __init__(self, spec: Any, processes: int = 2, slots: int = 64, env_servers: list[str] | None = None,
                 env_pool: EnvServersConfig | None = None, reruns: int = 0, screens: str | Path | None = None) -> None:
        super().__init__()
        if env_servers:
            EnvServers(env_servers, env_pool)  # a bad URL or a missing token fails here, not in a worker
        ctx = mp.get_context("spawn")
        self.jobs, self.results, self.stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.screens = None if screens is None else Path(screens)
        shots = None if screens is None else str(screens)
        self.procs = [ctx.Process(target=_process_main, name=f"mobilerl-rollout{i}", daemon=True,
                                  args=(spec, slots, self.jobs, self.results, self.published, self.stop, i,
                                        env_servers, env_pool, 1.0 / processes, reruns, shots))
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


