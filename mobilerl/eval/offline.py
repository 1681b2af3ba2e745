"""The `evaluate` stage's offline step evaluation (AndroidControl-style, Table 8 rules) on our own tasks.

Expert rollouts of ``offline_per_template`` test tasks per template become step data
(:func:`offline_episodes`); a policy answers every step with the expert's history, wrong answers replaced by
the expert's (:func:`evaluate_offline`). When every checkpoint fails online, this still tells them apart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mobilerl import tracking
from mobilerl.agent import OraclePolicy
from mobilerl.eval.androidcontrol import ACEpisode, from_trajectory, run_androidcontrol
from mobilerl.eval.config import EvaluateConfig
from mobilerl.eval.runner import evaluate_sync
from mobilerl.tasks import load_tasks, spread


def offline_episodes(cfg: EvaluateConfig) -> list[ACEpisode]:
    """Expert rollouts of the offline tasks as AndroidControl-style step data (seeded), with their screenshots
    when the checkpoints' profile reads the screen."""
    import tempfile

    from mobilerl.env.factory import renders
    from mobilerl.models.profiles import load_profile

    mode = load_profile(cfg.profile).generation.obs_mode
    tasks = spread(load_tasks(cfg.offline_suite, cfg.split, cfg.offline_per_template), cfg.model_max_tasks)
    with tempfile.TemporaryDirectory(prefix="mobilerl-offline-") as shots:
        trajs = evaluate_sync(lambda seed: OraclePolicy(), tasks, concurrency=cfg.concurrency, perturb=cfg.perturb,
                              obs_mode=mode, base_seed=cfg.seed, progress=False,
                              keep_screenshots_dir=shots if renders(mode) else None)
        bad = [t.task_id for t in trajs if not t.success]
        if bad:
            raise RuntimeError(f"evaluate: the expert failed offline tasks {bad[:5]} (of {len(bad)})")
        return [from_trajectory(t) for t in trajs]  # the screenshots read while their folder exists


def evaluate_offline(name: str, policy: Any, episodes: list[ACEpisode], cfg: EvaluateConfig) -> dict[str, Any]:
    """A policy's offline step metrics on ``episodes`` (a checkpoint's, or the random baseline's, which answers in
    pixels), logged to a nested MLflow run ``<name>/offline``."""
    with tracking.child_run(f"{name}/offline", "evaluate", policy=name, suite=f"{cfg.offline_suite}-offline") as run:
        m: dict[str, Any] = {"suite": f"{cfg.offline_suite}/{cfg.split}"}
        for mode in cfg.offline_modes:
            t0 = time.perf_counter()
            res = asyncio.run(run_androidcontrol(policy, episodes, mode, cfg.model_concurrency,
                                                 frame=getattr(policy, "coords", "abs")))
            m |= res.metrics | {f"androidcontrol/{mode}/wall_s": time.perf_counter() - t0}
            print(f"evaluate: {name} offline {mode} ({len(episodes)} expert episodes, "
                  f"{m[f'androidcontrol/{mode}/n_steps']} steps): step success "
                  f"{m[f'androidcontrol/{mode}/step_success_rate']:.3f}")
        tracking.log_metrics({k: v for k, v in m.items() if isinstance(v, int | float)})
        m["mlflow_run_id"] = run.info.run_id
    return m
