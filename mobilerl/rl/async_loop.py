"""Decoupled rollout and training (``rl.async``): episodes go on while the trainer updates; the trainer takes
complete groups as they come, and a trajectory more than ``max_staleness`` versions behind is dropped::

    trainer    take G complete groups → drop stale → rewards, SPA, advantages → update → publish version v+1
    pump       issue groups (n episodes of one FCF-drawn task) while the admission bound allows;
               results → groups, keyed by (draw, task)
    workers    each slot: next queued episode → load the published version if newer → run it → result
               (mobilerl.rl.async_workers; over remote engines, mobilerl.rl.async_engines: there the trainer
               pushes each version to the engines before it publishes, and while it waits rejoins restarted ones)

Scheduling is per trajectory: a slot that finishes an episode starts the next queued one at once, and a group is
handed over when its n episodes have ended. Admission (AReaL's bound on off-policyness): while the published
version is v, at most (v − v₀ + k + 1)·G groups have been issued (k = ``max_staleness``, v₀ the version the run
started at, G the round's tasks), so the pipeline holds at most k + 1 rounds of work; a slow episode can still fall
further behind, and is then dropped and counted (``async/dropped_stale``), never silently.

Versions: each trajectory records the version its worker held when the episode started
(``Trajectory.policy_version``). Each worker loads a newer version itself, before its next episode (per-worker
refresh: no barrier stops every env at once), so later steps of an episode in flight can come from a newer
version; the per-token behaviour logprobs are the engine's either way, and the recorded version is the oldest,
so staleness is never under-counted (over remote engines: the oldest version that sampled one of its steps, as the
completions report it). An episode cut short by its env or engine runs again (``rl.async.reruns``) before it
reaches the trainer, which then drops and counts it. The correction is the trainer's (``rl.algo.tis_cap``: ratio against π_old,
weight min(π_old/π_behaviour, C), :func:`mobilerl.rl.loss.tis_weights`).

Order: a round trains its groups, and each group its episodes, in the order they ended (reproducible with one
worker and one-row decoding batches, not by construction). Resume: the checkpoint is the synchronous mode's (every ``checkpoint_every`` rounds), with
``async.json`` (:meth:`Scheduler.resume_point`): the oldest draw with a group not yet trained and the groups of
it that were. Episodes in flight when a run is killed are lost; the resumed run issues those groups again with
their own seeds. With ``max_staleness`` 0 (each round's groups sampled by the weights of the round before) a
resumed run is the uninterrupted one; with more, which episodes end first, and so which version samples them,
depends on timing.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from mobilerl.agent.runner import episode_seed
from mobilerl.env.base import TaskSpec
from mobilerl.rl.async_workers import Job, Workers
from mobilerl.rl.hooks import RoundContext
from mobilerl.rl.loop import LogImages, LogMetrics, close_round, open_curve, round_line
from mobilerl.rl.round import collect, learn
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


class Scheduler:
    """The trainer's side: issues groups within the admission bound (a pump thread), gathers the workers' results
    into groups by (draw, task), and hands complete groups to the trainer (:meth:`take`).

    ``sample(d)`` draws the tasks of draw ``d`` (the trainer's FCF sampler); it runs in the pump thread under
    :attr:`lock`, which the trainer must hold while it changes the sampler's state (the curriculum).
    """

    def __init__(self, workers: Workers, sample: Callable[[int], Sequence[TaskSpec]], groups: int, n: int,
                 max_staleness: int, seed: int, version: int = 0, draw: int = 0,
                 trained: set[tuple[int, str]] | None = None) -> None:
        self.workers, self.sample, self.groups, self.n = workers, sample, groups, n
        self.max_staleness, self.seed = max_staleness, seed
        self.version = self.start_version = version
        self.draw = draw
        self.trained = set(trained or ())  # (draw, task) of draw >= ``draw`` a resumed run trained already
        self.lock = threading.Lock()
        self.issued = 0  # groups
        self.completed = 0  # episodes
        self.reruns = 0  # episodes queued again after their env or engine failed
        self.loads: list[tuple[int, int, float]] = []  # (worker, version, seconds)
        self._queued: deque[tuple[int, int, int, TaskSpec]] = deque()  # (draw, position, base seed, task)
        self._pending: dict[tuple[int, str], tuple[int, list[Trajectory]]] = {}  # (draw, task) -> position, episodes
        self._ready: deque[tuple[int, int, list[Trajectory]]] = deque()  # (draw, position, episodes by trial)
        self._done: set[tuple[int, str]] = set()  # groups taken by the trainer, of draws not yet all taken
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
        """Wait for G complete groups; returns them in completion order, and the seconds waited."""
        t0 = time.perf_counter()
        while True:
            with self._cv:
                if self._error is not None:
                    raise RuntimeError(f"rl async: the rollout side failed: {self._error!r}") from self._error
                if len(self._ready) >= self.groups:
                    out = [self._ready.popleft() for _ in range(self.groups)]
                    break
                self._cv.wait(0.1)
            self.workers.idle()  # outside the lock: a rejoining engine's push may take a while
        with self.lock:
            self._done |= {(d, g[0].task_id) for d, _, g in out}
        return [g for _, _, g in out], time.perf_counter() - t0

    def resume_point(self) -> dict[str, Any]:
        """Where a resumed run starts issuing: the oldest draw with a group not yet trained, and the groups of
        that draw on that the trainer took already (they are not issued again)."""
        with self.lock, self._cv:
            open_draws = [d for d, *_ in self._queued] + [d for d, _ in self._pending] + [d for d, *_ in self._ready]
            oldest = min(open_draws, default=self.draw)
            self._done = {(d, t) for d, t in self._done if d >= oldest}
            return {"draws": oldest, "trained": sorted([d, t] for d, t in self._done)}

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
                    self._queued.extend((self.draw, i, base, t) for i, t in enumerate(tasks)
                                        if (self.draw, t.task_id) not in self.trained)
                    self.draw += 1
                    continue
                d, pos, base, task = self._queued.popleft()
                self._pending[(d, task.task_id)] = (pos, [])
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
                if item[0] == "rerun":
                    self.reruns += 1
                    continue
                _, d, traj = item
                pos, group = self._pending[(d, traj.task_id)]
                group.append(traj)
                self.completed += 1
                if len(group) == self.n:
                    with self.lock:
                        del self._pending[(d, traj.task_id)]
                    with self._cv:
                        self._ready.append((d, pos, group))
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


def train_async(trainer: Any, workers: Workers, pool: list[TaskSpec], work: Path,
                log_metrics: LogMetrics = lambda m, r: None, progress: bool = True,
                judge: Any = None, log_images: LogImages | None = None) -> list[dict[str, float]]:
    """Rounds ``trainer.round`` … ``cfg.rounds - 1`` of the asynchronous mode (the module docstring); returns the
    curve like :func:`mobilerl.rl.loop.train`, with ``async/*`` metrics and ``time/rollout_s`` the seconds the
    trainer waited for groups."""
    cfg, s = trainer.cfg, trainer.settings
    if cfg.async_ is None:
        raise ValueError("train_async needs rl.async (max_staleness)")
    if cfg.algo.tis_cap is None:
        log.warning("rl.async without rl.algo.tis_cap: stale tokens are weighted as on-policy ones (ratio vs behaviour)")
    max_staleness = cfg.async_.max_staleness
    curve_path, curve = open_curve(work, trainer.round)
    draws_path = work / "async.json"
    point = json.loads(draws_path.read_text()) if trainer.round and draws_path.exists() else {"draws": 0}
    sched = Scheduler(workers, lambda d: trainer.sample_tasks(pool, d), s.train_batch_size, s.samples_per_task,
                      max_staleness, cfg.seed, trainer.round, point["draws"],
                      {(d, t) for d, t in point.get("trained", [])})

    def publish(v: int) -> None:
        if workers.pushes_weights:  # remote engines: the weights move by rl.weight_sync, no file for workers
            sched.publish(v, "")
            return
        path = work / f"policy.v{v}.safetensors"
        trainer.save_weights(path)
        sched.publish(v, path)
        (work / f"policy.v{v - 3}.safetensors").unlink(missing_ok=True)  # no worker still loads one that old

    def save_draws() -> None:  # with the checkpoint: the resumed run issues what this one had not trained yet
        tmp = draws_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sched.resume_point()))
        tmp.replace(draws_path)

    if trainer.round > 0 or workers.pushes_weights:
        publish(trainer.round)  # resumed: the checkpoint's weights; engines: the trainer's, whatever they serve
    seen_loads, seen_reruns, start = 0, 0, trainer.round
    bar = tqdm(range(start, cfg.rounds), initial=start, total=cfg.rounds, desc="adagrpo-async", disable=not progress,
               dynamic_ncols=True)
    try:
        with sched:
            for r in bar:
                t0 = time.perf_counter()
                raw, wait_s = sched.take()
                tj = time.perf_counter()
                kept, ages = [], []
                for g in raw:
                    fresh, a = drop_stale(g, r, max_staleness)
                    kept.append(fresh)
                    ages += a
                stale = sum(map(len, raw)) - sum(map(len, kept))
                if stale:
                    log.warning("rl async: round %d dropped %d of %d trajectories older than max_staleness = %d",
                                r, stale, sum(map(len, raw)), max_staleness)
                ctx = RoundContext(r, trainer)
                ctx.train = collect(trainer, ctx, kept, judge)  # one group per (draw, task)
                reward_s = time.perf_counter() - tj
                m = learn(trainer, ctx, pool, lock=sched.lock)  # the pump samples from the curriculum
                ts = time.perf_counter()
                publish(r + 1)
                ready, in_flight = sched.backlog()
                loads, seen_loads = sched.loads[seen_loads:], len(sched.loads)
                reruns, seen_reruns = sched.reruns - seen_reruns, sched.reruns
                m |= {"async/dropped_stale": float(stale), "async/staleness_mean": float(np.mean(ages)) if ages else 0.0,
                      "async/staleness_max": float(max(ages, default=0)), "async/groups_waiting": float(ready),
                      **{f"async/staleness_{a}": float(ages.count(a)) for a in range(max_staleness + 1)},
                      "async/episodes_in_flight": float(in_flight), "async/worker_loads": float(len(loads)),
                      "async/worker_load_s": max((x[2] for x in loads), default=0.0), "async/reruns": float(reruns),
                      "time/rollout_s": wait_s, "time/reward_s": reward_s, "time/sync_s": time.perf_counter() - ts,
                      **workers.metrics()}  # engines/<engine>/..., envs/<server>/..., sync/...: the rollout side's
                close_round(trainer, work, m, t0, curve, curve_path, log_metrics, save_draws,
                            open_from=sched.resume_point()["draws"], groups=ctx.train, log_images=log_images)
                if progress:
                    round_line(bar, m, curve, start)
                bar.set_postfix(sr=f"{m['rollout/success']:.3f}", stale=int(stale), refresh=False)
    finally:
        bar.close()
        for p in work.glob("policy.v*.safetensors"):
            p.unlink(missing_ok=True)
    return curve

