"""The episode runner: every (task, trial) episode of a task list, concurrently, through one env pool.

    async with EnvPool(make_worker, size=16) as pool:
        episodes = await run_episodes(pool, lambda seed: RandomPolicy(seed), tasks, n_trials=4)

Collection (:mod:`mobilerl.data.collect`), evaluation (:mod:`mobilerl.eval.runner`) and RL gather their
episodes here, each one through the one rollout loop (:func:`~mobilerl.agent.rollout.rollout`).

Seeds: the env side of an episode is fixed by the task (the simulator draws its state and perturbations from
``task.seed``), so all trials of a task meet the same device. Trials differ through the policy only: trial
``t`` of task ``id`` gets the policy seed ``episode_seed(base_seed, id, t)``, passed to
``policy_factory(seed)``, called once per episode (it may return a shared instance: policies key their
per-episode state by ``ctx.episode_id``; sampling temperature is the policy's).

Failures: an episode that cannot run ends as a trajectory with ``error`` set and the others go on;
:attr:`Episode.failed_in` tells whose failure it was. ``"env"`` (a crashed, timed-out or unleasable env:
infrastructure, so RL drops the episode instead of scoring it 0), ``"policy"`` (the policy raised or could
not be built) or ``"runner"``. Anything else (a hook that raises, a cancellation) cancels every episode
still running and propagates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mobilerl.agent.policy import Policy
from mobilerl.agent.rollout import rollout
from mobilerl.env.base import TaskSpec
from mobilerl.env.pool import EnvPool, PooledEnv
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)

PolicyFactory = Callable[[int], Policy]

def episode_seed(base_seed: int, task_id: str, trial: int) -> int:
    """A stable 63-bit policy seed for trial ``trial`` of ``task_id`` (independent of run order)."""
    return stable_seed(base_seed, task_id, trial)


def trial_counts(tasks: Sequence[TaskSpec], n_trials: int | Sequence[int]) -> list[int]:
    """Episodes of each task: ``n_trials`` of every one, or ``n_trials[i]`` of task ``i`` (DART's per-task
    rollout counts); each at least 1."""
    counts = [n_trials] * len(tasks) if isinstance(n_trials, int) else [int(n) for n in n_trials]
    if len(counts) != len(tasks):
        raise ValueError(f"n_trials has {len(counts)} counts for {len(tasks)} tasks")
    if any(n < 1 for n in counts):
        raise ValueError(f"n_trials must be >= 1, got {n_trials}")
    return counts


@dataclass
class Episode:
    """One finished episode: its place in (task, trial) order, its seed, its trajectory, and what the
    ``take`` hook took off its env."""

    index: int
    task: TaskSpec
    trial: int
    seed: int
    trajectory: Trajectory
    taken: Any = None

    @property
    def failed_in(self) -> str | None:
        """``"env"``, ``"policy"`` or ``"runner"`` when the episode was cut short (see the module docstring);
        None when it ran to its end, so its reward stands (a wrong answer is the policy's, not a failure)."""
        err = self.trajectory.error
        return None if err is None else err.split(":", 1)[0]  # the message names the side; error_kind its kind


async def run_episode(
    pool: EnvPool,
    policy_factory: PolicyFactory,
    task: TaskSpec,
    trial: int,
    seed: int,
    *,
    take: Callable[[PooledEnv], Any] | None = None,
    keep_screenshots_dir: str | Path | None = None,
) -> tuple[Trajectory, Any]:
    """One episode: lease an env from ``pool``, run ``policy_factory(seed)`` on ``task`` through
    :func:`~mobilerl.agent.rollout.rollout`; returns the trajectory and what ``take`` took off the env. A failure
    outside the rollout (the policy cannot be built, no env can be leased) ends as a trajectory with ``error``
    set (see the module docstring); cancellation propagates. :func:`run_episodes` runs each of its episodes
    here, and so does RL's asynchronous scheduler (:mod:`mobilerl.rl.async_rollout`), one episode at a time."""
    t0 = time.perf_counter()
    taken = None
    stage = "policy"  # which side failed, if something fails outside the rollout
    try:
        policy = policy_factory(seed)
        stage = "env"
        async with pool.acquire() as env:
            stage = "runner"
            traj = await rollout(env, policy, task, trial=trial, seed=seed, keep_screenshots_dir=keep_screenshots_dir)
            if take is not None:
                taken = take(env)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - one bad episode must not end the run
        log.warning("episode %s trial %d failed outside the rollout: %r", task.task_id, trial, e)
        # the runner's own failures are infrastructure, as the env's: never the policy's doing
        traj = Trajectory.for_task(task, trial=trial, seed=seed, error=f"{stage}: {type(e).__name__}: {e}",
                                   error_kind="policy" if stage == "policy" else "env")
        traj.wall_time_s = time.perf_counter() - t0
    return traj, taken


async def run_episodes(
    pool: EnvPool,
    policy_factory: PolicyFactory,
    tasks: Sequence[TaskSpec],
    *,
    n_trials: int | Sequence[int] = 1,
    base_seed: int = 0,
    take: Callable[[PooledEnv], Any] | None = None,
    on_episode: Callable[[Episode], Awaitable[None]] | None = None,
    keep_screenshots_dir: str | Path | None = None,
    progress: bool = True,
    desc: str = "episodes",
) -> list[Episode]:
    """Run ``n_trials`` episodes of every task in ``pool`` (started; as many in flight as it has workers)
    and return them in (task, trial) order.

    Args:
        pool: the started env pool the episodes lease their envs from (the caller owns its lifetime).
        policy_factory: ``seed -> Policy``, called once per episode with that episode's seed.
        tasks: the tasks; ``n_trials`` episodes each (a sequence: that many of each task, in order).
        base_seed: mixed into every episode's policy seed (:func:`episode_seed`).
        take: called with the leased env right after the rollout, before another episode can reuse the env
            (e.g. to take a recording wrapper's capture); its value is :attr:`Episode.taken`.
        on_episode: awaited with each episode as it ends (completion order), e.g. to write it out.
        keep_screenshots_dir: passed to :func:`~mobilerl.agent.rollout.rollout`.
        progress: a tqdm bar with the running success rate, labelled ``desc``.
    """
    counts = trial_counts(tasks, n_trials)
    pairs = [(task, trial) for task, n in zip(tasks, counts, strict=True) for trial in range(n)]
    done: list[Episode | None] = [None] * len(pairs)
    bar = tqdm(total=len(pairs), disable=not progress, desc=desc, unit="ep", dynamic_ncols=True)
    n_success = n_done = 0

    async def one(i: int, task: TaskSpec, trial: int) -> None:
        nonlocal n_success, n_done
        seed = episode_seed(base_seed, task.task_id, trial)
        traj, taken = await run_episode(pool, policy_factory, task, trial, seed, take=take,
                                        keep_screenshots_dir=keep_screenshots_dir)
        ep = Episode(i, task, trial, seed, traj, taken)
        if on_episode is not None:
            await on_episode(ep)
        done[i] = ep
        n_done += 1
        n_success += traj.success
        bar.update(1)
        bar.set_postfix(sr=f"{n_success / n_done:.3f}", refresh=False)

    try:
        jobs = [asyncio.create_task(one(i, task, trial)) for i, (task, trial) in enumerate(pairs)]
        try:
            await asyncio.gather(*jobs)
        except BaseException:
            # A failure outside any episode (a hook) or a cancellation: stop the rest before the caller's
            # pool closes under them.
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
    finally:
        bar.close()
    return [ep for ep in done if ep is not None]
