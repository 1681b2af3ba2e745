"""AdaGRPO's synchronous loop (MobileRL §2.2, Appendix B.3), one round at a time::

    weights → rollout side;  FCF draws tasks [hooks: tasks drawn] → n rollouts a task (T = 1, token ids +
    logprobs) → round.collect → [hooks: groups scored, with further draws] → round.learn → checkpoint, curve

:func:`close_round` (checkpoint, timings, curve line, metrics), :func:`round_line` (the line a round a watched run
prints) and :func:`prune_screens` (the kept screenshots of trained rounds) are the asynchronous loop's too.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mobilerl.env.base import TaskSpec
from mobilerl.rl.checkpoint import save_state, state_key
from mobilerl.rl.groups import Group
from mobilerl.rl.hooks import Hook, RoundContext
from mobilerl.rl.rollout import SCREENS, prune_screens
from mobilerl.rl.round import collect, learn
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)
LogMetrics = Callable[[dict[str, float], int], None]
LogImages = Callable[[dict[str, Any], int], None]  # {key: PIL image}, round


def open_curve(work: Path, start: int) -> tuple[Path, list[dict[str, float]]]:
    """``work/curve.jsonl`` and its rounds before ``start``, the round a restored checkpoint resumes at (later
    lines are cut from the file: those rounds run again)."""
    work.mkdir(parents=True, exist_ok=True)
    curve_path = work / "curve.jsonl"
    curve = [json.loads(x) for x in curve_path.read_text().splitlines()] if curve_path.exists() else []
    curve = [c for c in curve if c["round"] < start]
    curve_path.write_text("".join(json.dumps(c) + "\n" for c in curve))
    return curve_path, curve


def close_round(trainer: Any, work: Path, m: dict[str, float], t0: float, curve: list[dict[str, float]],
                curve_path: Path, log_metrics: LogMetrics, before_save: Callable[[], None] | None = None,
                open_from: int | None = None, groups: Sequence[Group] = (), log_images: LogImages | None = None) -> None:
    """A round's bookkeeping: every ``log_episodes_every`` rounds, images of two of its episodes (``groups``';
    :mod:`mobilerl.eval.episode_images`) to ``log_images``; the kept screenshots no trajectory needs any more deleted
    (:func:`prune_screens`; ``open_from``: the asynchronous mode's oldest draw still open), tokens/s, the resumable
    checkpoint every ``checkpoint_every`` rounds (``before_save`` first), step and other seconds, the curve line,
    the metrics."""
    cfg = trainer.cfg
    r, every = int(m["round"]), cfg.log_episodes_every
    if log_images is not None and every and (r % every == 0 or r == cfg.rounds - 1):
        from mobilerl.eval.episode_images import round_images

        try:  # before their screens are pruned
            log_images(round_images(t for g in groups for t in g.trajectories), r)
        except Exception as e:  # noqa: BLE001 — a picture of the round; never end a run over it
            log.warning("rl: round %d's episode images failed: %r", r, e)
    m["screens/pruned"] = float(prune_screens(work / SCREENS, trainer, open_from))
    if m.get("train/tokens") and m["time/train_s"] > 0:
        m["train/tokens_per_s"] = m["train/tokens"] / m["time/train_s"]
    if trainer.round % cfg.checkpoint_every == 0 or trainer.round == cfg.rounds:
        tc = time.perf_counter()
        if before_save is not None:
            before_save()
        save_state(trainer.state_dict(), work, state_key(cfg.state_key))
        m["time/checkpoint_s"] = time.perf_counter() - tc
    m["time/step_s"] = time.perf_counter() - t0
    m["time/other_s"] = m["time/step_s"] - sum(m[k] for k in ("time/rollout_s", "time/reward_s", "time/train_s",
                                                               "time/sync_s"))
    curve.append(m)
    with curve_path.open("a") as f:
        f.write(json.dumps(m) + "\n")
    log_metrics({k: v for k, v in m.items() if k != "round"}, int(m["round"]))


def round_line(bar: Any, m: dict[str, float], curve: list[dict[str, float]], start: int) -> None:
    """One line a round above the bar (a captured log, e.g. ``make run``'s, keeps them all): the round, its success
    and trained rows, its seconds, the ETA at this run's mean seconds a round (rounds since ``start``)."""
    r, rounds = int(m["round"]), bar.total
    mine = [c["time/step_s"] for c in curve if c["round"] >= start]
    eta = sum(mine) / len(mine) * (rounds - r - 1)
    bar.write(f"{bar.desc} round {r + 1}/{rounds}: rollout/success {m['rollout/success']:.3f}, "
              f"train/rows {int(m.get('train/rows', 0))}, {m['time/step_s']:.1f} s, ETA {eta / 60:.1f} min")


def _episodes(workers: Any, tasks: Sequence[TaskSpec], n: int, base_seed: int, weights: Path | None,
              version: int) -> list[Trajectory]:
    return workers.run(tasks, n, base_seed, weights, version)[0]


def further_draw(trainer: Any, ctx: RoundContext, pool: list[TaskSpec], judge: Any, d: int, seen: set[str],
                 caller: Hook) -> list[Group]:
    """Draw ``d`` > 0 of round ``ctx.r`` (dynamic sampling's): new tasks outside ``seen``, their rollouts (seeded
    by (seed, r, d)), rewards and groups, the hooks ahead of ``caller`` applied."""
    tasks = trainer.sample_tasks([t for t in pool if t.task_id not in seen], ctx.r, draw=d)
    if not tasks:
        return []
    trajs = ctx.rollout(tasks, trainer.settings.samples_per_task, stable_seed(trainer.cfg.seed, "rollout", ctx.r, d))
    return trainer.hooks.groups_collected(ctx, collect(trainer, ctx, [trajs], judge), before=caller)


def train(trainer: Any, workers: Any, pool: list[TaskSpec], work: Path, log_metrics: LogMetrics = lambda m, r: None,
          progress: bool = True, judge: Any = None, log_images: LogImages | None = None) -> list[dict[str, float]]:
    """Rounds ``trainer.round`` … ``cfg.rounds - 1``; returns every round's metrics (the curve, resumed runs
    included: earlier rounds come from ``work/curve.jsonl``)."""
    cfg, s = trainer.cfg, trainer.settings
    curve_path, curve = open_curve(work, trainer.round)
    weights = work / "policy.safetensors"
    start = trainer.round
    bar = tqdm(range(start, cfg.rounds), initial=start, total=cfg.rounds, desc="adagrpo", disable=not progress,
               dynamic_ncols=True)
    for r in bar:
        t0 = time.perf_counter()
        sync_s = 0.0
        if r > 0 and not getattr(workers, "pushes_weights", False):  # remote engines take a push instead
            trainer.save_weights(weights)
            sync_s += time.perf_counter() - t0
        w = weights if r > 0 else None
        ctx = RoundContext(r, trainer, trainer.sample_tasks(pool, r), pool,
                           rollout=functools.partial(_episodes, workers, weights=w, version=r))
        ctx.draw = functools.partial(further_draw, trainer, ctx, pool, judge)
        n = trainer.hooks.tasks_drawn(ctx, ctx.tasks) or s.samples_per_task
        tr = time.perf_counter()
        trajs, load_s = workers.run(ctx.tasks, n, stable_seed(cfg.seed, "rollout", r), w, r)
        rollout_s = time.perf_counter() - tr - load_s
        sync_s += load_s
        tj = time.perf_counter()
        groups = collect(trainer, ctx, [trajs], judge)
        reward_s = time.perf_counter() - tj
        tp = time.perf_counter()
        ctx.train = trainer.hooks.groups_collected(ctx, groups)
        rollout_s += time.perf_counter() - tp  # BEPA's seeding and further draws are rollouts
        m = learn(trainer, ctx, pool)
        m |= {"time/rollout_s": rollout_s, "time/reward_s": reward_s, "time/sync_s": sync_s,
              **getattr(workers, "metrics", dict)()}  # envs/<server>/..., sync/...: the rollout side's
        close_round(trainer, work, m, t0, curve, curve_path, log_metrics, groups=ctx.train, log_images=log_images)
        if progress:
            round_line(bar, m, curve, start)
        bar.set_postfix(sr=f"{m['rollout/success']:.3f}", buf=len(trainer.buffer), refresh=False)
    bar.close()
    return curve
