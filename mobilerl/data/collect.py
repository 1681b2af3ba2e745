"""Data collection with privacy masking before storage (MobileRL Appendix D, D.2).

:func:`collect` runs a policy (the simulator's oracle by default) over a task list and writes a trajectory
store (:mod:`mobilerl.data.store`). Nothing raw reaches the disk: every env is a
:class:`~mobilerl.data.recording.RecordingEnv` that masks screenshots in memory; an ended episode's texts
are masked with its :class:`~mobilerl.data.privacy.TextMasker`; an episode that still holds a canary (a raw
value the simulator planted) is not written (``leaks_blocked``; the stage then fails).

Canaries and raw actions stay in memory (:class:`~mobilerl.data.masking.EpisodeSecrets`) so that
:func:`replay_check` can replay the stored episodes. :func:`collect_stores` is the ``collect`` stage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mobilerl.agent.runner import Episode, run_episodes
from mobilerl.data.masking import (
    SURROGATE_REGISTRY,
    CollectResult,
    EpisodeSecrets,
    MaskingOptions,
    canary_patterns,
    find_canaries,
    mask_trajectory,
    surrogate_fingerprints,
    trajectory_texts,
)
from mobilerl.data.recording import EpisodeCapture, RecordingEnv
from mobilerl.data.store import IMAGES, StoreWriter, episode_dir
from mobilerl.env import factory as envs
from mobilerl.env.actions import Action
from mobilerl.env.base import Env, TaskSpec
from mobilerl.env.pool import EnvPool, PooledEnv, ThreadEnv
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


# ===================================================================================== collection


async def collect(
    policy_factory: Callable[[int], Any],
    tasks: Sequence[TaskSpec],
    out_dir: str | os.PathLike,
    *,
    masking: MaskingOptions | None = None,
    n_trials: int = 1,
    concurrency: int = 4,
    env_factory: Callable[[], Env] | None = None,
    perturb: str = "default",
    obs_mode: str = "screenshot+xml",
    base_seed: int = 0,
    mask_workers: int = 2,
    progress: bool = True,
    call_timeout: float | None = 120.0,
    source: str = "collected",
    keep_secrets: bool = True,
) -> CollectResult:
    """Collect ``n_trials`` episodes of every task into the store ``out_dir`` (see the module docstring).

    ``policy_factory(seed)`` builds the policy of one episode (the seed is
    :func:`~mobilerl.agent.runner.episode_seed`). Returns counts, masking statistics and (when
    ``keep_secrets``) the in-memory :class:`~mobilerl.data.masking.EpisodeSecrets` per episode id. An episode
    that fails outside its rollout (no policy, no env) is counted in ``n_errors`` and not stored.

    Without an ``env_factory`` the envs are the simulator's (:func:`~mobilerl.env.factory.env_factory`, ``perturb``),
    rendering screenshots iff ``obs_mode`` shows them: the default keeps them in the store for any profile's SFT.
    """
    opts = masking or MaskingOptions()
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / IMAGES).mkdir(parents=True)
    make_env = env_factory or envs.env_factory("sim", obs_mode=obs_mode, perturb=perturb)
    n_episodes = len(tasks) * n_trials
    result = CollectResult()
    registry: set[str] = set()
    size = max(1, min(concurrency, n_episodes or 1))
    env_pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="mobilerl-collect-env")
    mask_pool = ThreadPoolExecutor(max_workers=max(1, mask_workers), thread_name_prefix="mobilerl-mask")
    writer = StoreWriter(out, manifest={"source": source, "masking": {
        "mode": opts.mode, "known_categories": list(opts.known_categories), "faces": opts.faces, "qr": opts.qr,
        "ocr": opts.ocr, "style": opts.style}})
    t_start = time.perf_counter()

    slots = threading.BoundedSemaphore(2 * max(1, mask_workers) + 2)

    def worker() -> ThreadEnv:
        return ThreadEnv(RecordingEnv(make_env(), opts, out / IMAGES, mask_pool, slots), executor=env_pool)

    # _finish runs in worker threads (asyncio.to_thread), several at once: the store, the registry and the
    # counters are updated under this lock (unguarded, two threads could interleave row groups in the file).
    finish_lock = threading.Lock()

    def take(env: PooledEnv) -> EpisodeCapture | None:
        rec: RecordingEnv = env.worker.env  # type: ignore[attr-defined]
        return rec.take()  # before the env is released to the next episode

    async def store(ep: Episode) -> None:
        cap, ep.taken = ep.taken, None  # nothing raw is held longer than needed
        try:
            if cap is None:
                raise RuntimeError(ep.trajectory.error or f"no capture for {ep.task.task_id}")
            frames = [await asyncio.wrap_future(f) for f in cap.frames]
            ep.trajectory.source = source
            await asyncio.to_thread(_finish, ep.trajectory, cap, frames)
        except Exception as e:  # noqa: BLE001 - one bad episode must not end the collection
            log.warning("collect: episode %s#%d failed: %r", ep.task.task_id, ep.trial, e)
            with finish_lock:
                result.n_errors += 1

    def _finish(traj: Trajectory, cap: EpisodeCapture, frames: list[dict[str, Any] | None]) -> None:
        # screenshots: frame k is the screen of the k-th env observation; invalid steps did not step
        final_dir = out / IMAGES / episode_dir(traj.episode_id)
        if cap.tmp_dir.exists():
            if final_dir.exists():
                shutil.rmtree(final_dir)
            os.replace(cap.tmp_dir, final_dir)
        k = 0
        shots_s = 0.0
        for s in traj.steps:
            fr = frames[k] if k < len(frames) else None
            if fr is not None:
                s.screenshot_path = f"{IMAGES}/{final_dir.name}/{fr['file']}"
            if s.action is not None:  # the env was stepped: the next step sees the next frame
                k += 1
                if k < len(cap.waits):  # the step's env time without waiting for a masking slot
                    s.latency_s = max(0.0, s.latency_s - cap.waits[k])
        regions: Counter = Counter()
        for fr in frames:
            if fr is not None:
                shots_s += fr["mask_s"]
                regions.update(fr["regions"])
        raw_actions = [s.action for s in traj.steps]
        masked = mask_trajectory(traj, cap.masker)
        masked.meta = {**masked.meta, "mask_mode": opts.mode, "masked_spans": dict(cap.masker.counts)}
        # pre-write check: no canary may survive in the stored texts
        pats = canary_patterns(cap.canaries)
        leaks = Counter()
        for _, text in trajectory_texts(masked):
            for c in find_canaries(text, cap.canaries, pats):
                leaks[cap.canaries[c]] += 1
        with finish_lock:
            result.image_mask_s += shots_s
            result.image_regions.update(regions)
            if leaks:
                result.leaks_blocked += 1
                result.leaked_categories.update(leaks)
                shutil.rmtree(final_dir, ignore_errors=True)
                log.error("episode %s still holds planted values of %s after masking: not stored",
                          masked.episode_id, dict(leaks))
                return
            writer.write(masked)
            registry.update(surrogate_fingerprints(cap.masker))
            result.n_episodes += 1
            result.n_steps += masked.n_steps
            result.n_success += bool(masked.success)
            result.n_errors += masked.error is not None
            result.mask_counts.update(cap.masker.counts)
            if keep_secrets:
                result.secrets[masked.episode_id] = EpisodeSecrets(cap.task, dict(cap.canaries), cap.masker,
                                                                   raw_actions, traj.reward)

    try:
        async with EnvPool(worker, size=size, call_timeout=call_timeout) as pool:
            await run_episodes(pool, policy_factory, tasks, n_trials=n_trials, base_seed=base_seed, take=take,
                               on_episode=store, progress=progress, desc=f"collect {source}")
    finally:
        mask_pool.shutdown(wait=True)
        env_pool.shutdown(wait=False, cancel_futures=True)
        for tmp in (out / IMAGES).glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        result.wall_s = time.perf_counter() - t_start
        writer.manifest["summary"] = result.summary(timings=not writer.reproducible)
        writer.close()
        (out / SURROGATE_REGISTRY).write_text("".join(f"{h}\n" for h in sorted(registry)))
    return result


def collect_sync(*args: Any, **kwargs: Any) -> CollectResult:
    return asyncio.run(collect(*args, **kwargs))


# ================================================================================== replay


def replay_actions(traj: Trajectory, secrets: EpisodeSecrets) -> list[Action]:
    """The actions of a *stored* episode, with masked text put back from memory: surrogates through the
    episode's masker, tokens from the raw actions (the only place they are)."""
    out = []
    for i, s in enumerate(traj.steps):
        if s.action is None:
            continue
        a = dict(s.action)
        for key in ("text", "message"):
            if a.get(key):
                if secrets.masker is not None and secrets.masker.mode == "surrogate":
                    a[key] = secrets.masker.unmask(a[key])
                elif i < len(secrets.raw_actions) and secrets.raw_actions[i] is not None:
                    raw = secrets.raw_actions[i].get(key)  # type: ignore[union-attr]
                    if raw is not None and secrets.masker is not None and secrets.masker(raw) == a[key]:
                        a[key] = raw
        out.append(Action.from_dict(a))
    return out


def replay_check(store: str | os.PathLike, secrets: Mapping[str, EpisodeSecrets], perturb: str = "default",
                 env_factory: Callable[[], Env] | None = None) -> dict[str, Any]:
    """Replay every stored episode (read back from ``store``) in a fresh env and compare the verifier
    result with the stored one. Returns counts and the ids that differ."""
    from mobilerl.data.store import iter_store

    make_env = env_factory or envs.env_factory("sim", obs_mode="xml", perturb=perturb)  # the verifier reads no pixels
    n = same = 0
    differ: list[str] = []
    skipped = 0
    for traj in iter_store(store):
        sec = secrets.get(traj.episode_id)
        if sec is None or traj.error is not None or not traj.has_verifier:
            skipped += 1
            continue
        env = make_env()
        env.reset(sec.task)
        reward = None
        try:
            for a in replay_actions(traj, sec):
                res = env.step(a)
                if res.done:
                    break
            reward = env.evaluate()
        finally:
            env.close()
        n += 1
        if (reward is None and traj.reward is None) or (reward is not None and traj.reward is not None
                                                        and abs(reward - traj.reward) < 1e-9):
            same += 1
        else:
            differ.append(traj.episode_id)
    return {"replayed": n, "same_result": same, "differ": differ, "skipped": skipped}


# ================================================================================== the collect stage


def collect_stores(
    stores: Path,
    tasks: Sequence[TaskSpec],
    masking: MaskingOptions,
    policy_factory: Callable[[int], Any],
    *,
    n_trials: int = 1,
    concurrency: int = 4,
    perturb: str = "default",
    obs_mode: str = "screenshot+xml",
    base_seed: int = 0,
    mask_workers: int = 2,
    replay: bool = True,
    human_dirs: Sequence[Path] = (),
    androidcontrol: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `collect` stage's stores under ``stores`` (replaced), and their metrics.

    ``collected``: :func:`collect` over ``tasks``, then (``replay``) :func:`replay_check` of what was stored,
    after which the episodes' secrets are dropped. ``human`` (``human<i>`` for several): each export of
    ``human_dirs`` through :func:`~mobilerl.data.human.import_human`. ``androidcontrol``: when its ``paths`` are
    given, :func:`~mobilerl.data.androidcontrol.convert_to_store` with these keyword arguments.
    """
    from mobilerl.data.androidcontrol import convert_to_store
    from mobilerl.data.human import import_human

    if stores.exists():
        shutil.rmtree(stores)
    stores.mkdir(parents=True)
    res = collect_sync(policy_factory, tasks, stores / "collected", masking=masking, n_trials=n_trials,
                       concurrency=concurrency, perturb=perturb, obs_mode=obs_mode, base_seed=base_seed,
                       mask_workers=mask_workers, source="collected")
    metrics: dict[str, Any] = {"collected": res.summary(), "tasks": len(tasks)}
    if replay:
        rep = replay_check(stores / "collected", res.secrets, perturb=perturb)
        metrics["replay"] = {k: (len(v) if isinstance(v, list) else v) for k, v in rep.items()}
        metrics["replay"]["differ_ids"] = rep["differ"][:20]
    res.secrets.clear()  # the raw values live no longer than needed
    for i, d in enumerate(human_dirs):
        name = "human" if len(human_dirs) == 1 else f"human{i}"
        metrics[name] = import_human(d, stores / name, masking=masking).summary()
    if androidcontrol and androidcontrol.get("paths"):
        ac = dict(androidcontrol)
        metrics["androidcontrol"] = convert_to_store(ac.pop("paths"), stores / "androidcontrol", masking=masking,
                                                     **ac).summary()
    return metrics
