"""Evaluate a policy on a task set: every (task, trial) episode runs concurrently through an EnvPool.

    trajs = await evaluate(lambda seed: RandomPolicy(seed), list_tasks("world", "test"), n_trials=8)
    summary = summarize(trajs)

The episodes, their seeds and their failures are the episode runner's
(:func:`~mobilerl.agent.runner.run_episodes`); this module picks the env workers and keeps the trajectories.

Workers: by default each is the simulator of :func:`~mobilerl.env.factory.env_factory` (``obs_mode``: it renders
screenshots iff the policy's observation mode shows them; ``perturb``) run on the event loop
(:class:`~mobilerl.env.pool.InlineEnv`: the simulator's calls are short Python, and a thread hop per call
cost half as much again); an ``env_factory`` of your own runs in a :class:`~mobilerl.env.pool.ThreadEnv`
(threads on one bounded executor, calls time out) unless ``inline_env=True``; ``use_processes=True`` runs
each env in its own child process (:class:`~mobilerl.env.process_env.ProcessEnv`; ``env_factory`` must then be
picklable, e.g. a class or ``functools.partial``). ``obs_mode`` and ``perturb`` only configure the default
factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobilerl.agent.runner import Episode, PolicyFactory, run_episode, run_episodes, trial_counts
from mobilerl.env import factory as envs
from mobilerl.env.base import Env, TaskSpec
from mobilerl.env.pool import EnvPool, InlineEnv, ThreadEnv
from mobilerl.env.process_env import ProcessEnv
from mobilerl.eval.metrics import is_env_error
from mobilerl.trajectory import JsonlWriter, Trajectory

if TYPE_CHECKING:
    from mobilerl.env.cluster import EnvServers


async def evaluate(
    policy_factory: PolicyFactory,
    tasks: Sequence[TaskSpec],
    *,
    n_trials: int | Sequence[int] = 1,
    concurrency: int = 16,
    env_factory: Callable[[], Env] | None = None,
    perturb: str = "default",
    obs_mode: str = "xml",
    out_path: str | Path | None = None,
    progress: bool = True,
    use_processes: bool = False,
    base_seed: int = 0,
    call_timeout: float | None = 120.0,
    keep_screenshots_dir: str | Path | None = None,
    append: bool = False,
    inline_env: bool | None = None,
    env_servers: EnvServers | None = None,
    env_retries: int = 0,
    desc: str = "eval",
) -> list[Trajectory]:
    """Run ``n_trials`` episodes of every task and return the trajectories in (task, trial) order.

    Args:
        policy_factory: ``seed -> Policy``, called once per episode with that episode's seed
            (:func:`~mobilerl.agent.runner.episode_seed`).
        tasks: the tasks (e.g. ``list_tasks("world", "test")``).
        n_trials: episodes per task (pass@k needs ``n_trials >= k``); a sequence gives each task its own.
        concurrency: episodes in flight at once (= env workers in the pool).
        env_factory: builds one synchronous env (default: the simulator,
            ``mobilerl.env.factory.env_factory("sim", obs_mode=obs_mode, perturb=perturb)``); one with a
            ``capacity`` (the ``androidworld`` backend: its servers) caps the pool at it.
        perturb: perturbation profile of the default factory (``none`` / ``default`` / ``heavy``).
        obs_mode: the policy's observation mode (its profile's ``generation.obs_mode``); the default factory
            renders screenshots iff the mode shows them.
        out_path: if set, each trajectory is appended to this JSONL file as soon as it ends
            (completion order; the file is truncated first unless ``append``).
        progress: show a tqdm bar with the running success rate.
        use_processes: one child process per env worker instead of threads.
        base_seed: mixed into every episode's policy seed.
        call_timeout: seconds allowed per env call (a timed-out worker is replaced; the episode records
            the error).
        keep_screenshots_dir: passed to :func:`~mobilerl.agent.rollout.rollout` (needs a rendering env).
        inline_env: run each env's calls on the event loop (:class:`~mobilerl.env.pool.InlineEnv`: no
            timeouts) instead of in threads; default: inline for the built-in simulator (no ``env_factory``),
            threads otherwise. Ignored with ``use_processes``.
        env_servers: run the episodes on these env servers instead (:mod:`mobilerl.env.cluster`: placement by
            free capacity, health checks, retries); the env options above are then unused.
        env_retries: times an episode whose env failed (:func:`~mobilerl.eval.metrics.is_env_error`) is run
            again, same task, trial and seed, after the others; one still failing keeps its error (0: none; RL drops
            and counts them instead, the evaluate stage sets its own).

    An episode whose env crashes, times out or cannot be leased (``error="env: ..."``), or whose policy
    cannot be built (``"policy: ..."``), ends with ``Trajectory.error`` set; the others go on. The pool
    replaces crashed workers. ``out_path`` holds each episode once, as it finally ended.
    """
    if env_retries < 0:
        raise ValueError(f"env_retries must be >= 0, got {env_retries}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    n_episodes = sum(trial_counts(tasks, n_trials))
    if not n_episodes:
        return []
    make_env = env_factory if env_factory is not None else envs.env_factory(
        "sim", obs_mode=obs_mode, perturb=perturb)
    # a factory over a fixed set of devices (AndroidWorld's servers) builds at most ``capacity`` envs at once
    size = min(concurrency, n_episodes, getattr(make_env, "capacity", None) or n_episodes)
    executor: ThreadPoolExecutor | None = None
    if inline_env is None:
        inline_env = env_factory is None
    if use_processes:

        def worker_factory() -> Any:
            return ProcessEnv.create(make_env)
    elif inline_env:

        def worker_factory() -> Any:
            return InlineEnv(make_env())
    else:
        executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="mobilerl-eval-env")

        def worker_factory() -> Any:
            return ThreadEnv(make_env(), executor=executor)

    writer = JsonlWriter(out_path, append=append) if out_path is not None else None

    async def write(ep: Episode) -> None:
        assert writer is not None
        if not (env_retries and is_env_error(ep.trajectory)):  # written once it has been re-run
            writer.write(ep.trajectory)

    pool = (env_servers.pool(size) if env_servers is not None else
            EnvPool(worker_factory, size=size, call_timeout=call_timeout))
    try:
        async with pool:
            episodes = await run_episodes(pool, policy_factory, tasks, n_trials=n_trials, base_seed=base_seed,
                                          on_episode=write if writer is not None else None,
                                          keep_screenshots_dir=keep_screenshots_dir, progress=progress, desc=desc)
            rerun = failed = [ep for ep in episodes if is_env_error(ep.trajectory)] if env_retries else []
            for _ in range(env_retries):
                if not failed:
                    break
                reruns = await asyncio.gather(*(
                    run_episode(pool, policy_factory, ep.task, ep.trial, ep.seed,
                                keep_screenshots_dir=keep_screenshots_dir) for ep in failed))
                for ep, (traj, _taken) in zip(failed, reruns, strict=True):
                    ep.trajectory = traj
                failed = [ep for ep in failed if is_env_error(ep.trajectory)]
            if writer is not None:
                for ep in rerun:
                    writer.write(ep.trajectory)
    finally:
        if writer is not None:
            writer.close()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
    return [ep.trajectory for ep in episodes]


def evaluate_sync(
    policy_factory: PolicyFactory, tasks: Sequence[TaskSpec], **kwargs: Any
) -> list[Trajectory]:
    """:func:`evaluate` from synchronous code (starts its own event loop; not from inside a running one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("evaluate_sync() called from a running event loop; await evaluate(...) instead")
    return asyncio.run(evaluate(policy_factory, tasks, **kwargs))


def _shard_worker(args: tuple) -> list[dict[str, Any]]:
    """One process of :func:`evaluate_in_processes`: its own policy (model) and env pool over its shard."""
    make_factory, shard, threads, part, kwargs = args
    if threads is not None:
        try:
            import torch

            torch.set_num_threads(threads)
        except ImportError:  # a policy without torch: nothing to pin
            pass
    trajs = evaluate_sync(make_factory(), shard, out_path=part, **kwargs)
    return [t.to_dict() for t in trajs]


def evaluate_in_processes(
    make_factory: Callable[[], PolicyFactory],
    tasks: Sequence[TaskSpec],
    *,
    processes: int = 2,
    threads: int | None = 1,
    out_path: str | Path | None = None,
    **kwargs: Any,
) -> list[Trajectory]:
    """:func:`evaluate` split over ``processes`` worker processes, each with its own policy built by
    ``make_factory()`` (picklable, e.g. a ``functools.partial``; a model policy loads its checkpoint
    there), ``threads`` torch threads, and every ``processes``-th task. On a small CPU machine this runs
    the simulator, the event loop and each model's Python-bound decoding in parallel, where one process
    shares one interpreter between them.

    The trajectories are the ones :func:`evaluate` would return (episode seeds depend on the task and trial
    only), in the same (task, trial) order. ``out_path``: each process appends its episodes to
    ``<out_path>.part<k>`` as they end; the parts are joined into ``out_path`` at the end. ``kwargs`` go to
    :func:`evaluate` (``progress`` is off in the workers). A worker that dies raises ``RuntimeError``
    naming it; the others' episodes are kept in their part files.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    show, desc = kwargs.pop("progress", True), kwargs.pop("desc", "eval")
    kwargs = {**kwargs, "progress": False}
    kwargs.pop("append", None)
    n = max(1, min(processes, len(tasks)))
    shards = [list(tasks[k::n]) for k in range(n)]
    parts = [None if out_path is None else Path(f"{out_path}.part{k}") for k in range(n)]
    for part in parts:
        if part is not None:
            part.unlink(missing_ok=True)  # a killed run's: the bar would count its episodes as this run's
    jobs = [(make_factory, shard, threads, part, kwargs) for shard, part in zip(shards, parts, strict=True)]
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as ex:
        futures = [ex.submit(_shard_worker, job) for job in jobs]
        if show and out_path is not None:  # the workers' bars are off: count the episodes their part files hold
            _follow(futures, [p for p in parts if p is not None],
                    sum(trial_counts(tasks, kwargs.get("n_trials", 1))), desc)
        results: list[list[dict[str, Any]]] = []
        for k, fut in enumerate(futures):
            try:
                results.append(fut.result())
            except BrokenProcessPool as e:
                raise RuntimeError(f"evaluation worker {k} of {n} died ({e}); its episodes so far are in "
                                   f"{parts[k]}") from None
    by_key = {(d["task_id"], d["trial"]): Trajectory.from_dict(d) for r in results for d in r}
    order = [(t.task_id, trial) for t in tasks for trial in range(kwargs.get("n_trials", 1))]
    out = [by_key[key] for key in order if key in by_key]
    if out_path is not None:
        with JsonlWriter(out_path) as w:
            for t in out:
                w.write(t)
        for part in parts:
            if part is not None:
                part.unlink(missing_ok=True)
    return out


def _follow(futures: list, parts: list[Path], total: int, desc: str, poll_s: float = 2.0) -> None:
    """A bar of the episodes written to ``parts`` (one line each, appended) until every future is done."""
    from concurrent.futures import wait

    from tqdm.auto import tqdm

    offsets = dict.fromkeys(parts, 0)
    with tqdm(total=total, desc=desc, unit="episode", dynamic_ncols=True) as bar:
        while True:
            running = wait(futures, timeout=poll_s).not_done
            for part in parts:
                try:
                    with part.open("rb") as f:
                        f.seek(offsets[part])
                        new = f.read()
                except FileNotFoundError:
                    continue
                offsets[part] += len(new)
                bar.update(new.count(b"\n"))
            if not running:
                return


def sim_template_texts(tasks: Sequence[TaskSpec]) -> dict[str, str]:
    """Instruction templates (with ``{placeholders}``) of simulator tasks, for the semantic features of
    :func:`mobilerl.eval.metrics.summarize`. Tasks of other suites are skipped."""
    from mobilerl.env.sim.tasks.registry import SUITES, template

    out: dict[str, str] = {}
    for t in tasks:
        if t.suite in SUITES and t.template not in out:
            try:
                out[t.template] = template(t.suite, t.template).template or t.instruction
            except KeyError:
                continue
    return out
