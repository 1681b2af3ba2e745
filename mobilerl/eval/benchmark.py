"""The `evaluate` stage: every policy × every benchmark, all episodes concurrent through the env pool.

Policies are named in the config: ``oracle`` and ``random`` are the baselines, any other name is a checkpoint
(:mod:`mobilerl.eval.checkpoints`). Each (policy, suite) keeps its trajectories in
``<policy>__<suite>.jsonl`` and its summary in a nested MLflow run.

pass@k for k > 1 needs k sampled trials of every task. The main evaluation is greedy with one trial (pass@1),
so :func:`pass_k_study` samples the ``pass_k`` checkpoints ``n_trials`` times at ``temperature`` on
``max_tasks`` tasks of each of its suites (``<name>__<suite>__sampled.jsonl``). The checkpoints, and the random
baseline as the floor of that table, are also scored offline step by step (:mod:`mobilerl.eval.offline`; the
oracle is not: the steps are its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mobilerl import tracking
from mobilerl.env.androidworld import SUITE as ANDROIDWORLD
from mobilerl.env.androidworld import androidworld_tasks
from mobilerl.env.base import TaskSpec
from mobilerl.env.factory import env_factory
from mobilerl.eval.checkpoints import (
    checkpoint_policy,
    make_policy_factory,
    obs_mode_of,
    policy_tasks,
    run_checkpoint,
)
from mobilerl.eval.config import EvaluateConfig
from mobilerl.eval.metrics import summarize
from mobilerl.eval.offline import evaluate_offline, offline_episodes
from mobilerl.eval.runner import evaluate_sync, sim_template_texts
from mobilerl.tasks import load_tasks, spread


def evaluate_policies(cfg: EvaluateConfig, out_dir: Path) -> tuple[dict, dict, dict]:
    """The whole `evaluate` stage (inside its MLflow run): every policy on every suite, trajectories kept in
    ``out_dir``; returns the summaries ``{policy: {suite: summary}}``, the offline step metrics
    ``{policy: metrics}`` and the pass@k study's summaries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks_by_suite = {suite: suite_tasks(suite, cfg) for suite in cfg.suites}
    summary: dict[str, dict] = {}
    offline: dict[str, dict] = {}
    stepwise = offline_style(cfg)
    episodes = (offline_episodes(cfg) if cfg.offline_per_template and stepwise
                and any(n in cfg.checkpoints for n in cfg.policies) else [])
    for name in cfg.policies:
        factory, concurrency = make_policy_factory(name, cfg)
        for suite, tasks in tasks_by_suite.items():
            summary.setdefault(name, {})[suite] = run_policy(
                name, factory, concurrency, policy_tasks(name, tasks, cfg), cfg, f"{name}/{suite}",
                out_dir / f"{name}__{suite}.jsonl")
        if (name in cfg.checkpoints or name == "random") and episodes:  # the same policy, step by step
            offline[name] = evaluate_offline(name, factory(cfg.seed), episodes, cfg)
    if not stepwise:
        print(f"evaluate: no offline step evaluation for profile {cfg.profile}: its prompt style (mobilerl) builds "
              "its observation tree from the raw UI dump, which offline step data does not hold")
    summary_all = world_all(cfg, out_dir)
    for name, s in summary_all.items():
        summary.setdefault(name, {})["world_all"] = s
    sampled = pass_k_study(cfg, tasks_by_suite, out_dir)
    return summary, offline, sampled


def world_all(cfg: EvaluateConfig, out_dir: Path) -> dict[str, dict]:
    """``evaluate.world_all``: each listed checkpoint greedy on every world task of ``cfg.split`` (no per-template or
    per-checkpoint cap), kept in ``<name>__world_all.jsonl``; ``{policy: summary}``."""
    greedy = cfg.model_copy(update={"n_trials": 1, "temperature": 0.0})
    tasks = load_tasks("world", cfg.split) if cfg.world_all else []
    out: dict[str, dict] = {}
    for name in cfg.world_all:
        factory, concurrency = make_policy_factory(name, greedy)
        out[name] = run_policy(name, factory, concurrency, tasks, greedy, f"{name}/world_all",
                               out_dir / f"{name}__world_all.jsonl")
    return out


def suite_tasks(suite: str, cfg: EvaluateConfig) -> list[TaskSpec]:
    """The ``cfg.split`` tasks of ``suite`` (at most ``max_per_template`` a template): the simulator's from the task
    lists, AndroidWorld's from its servers (each task type a template)."""
    if suite == ANDROIDWORLD:
        assert cfg.androidworld is not None
        return androidworld_tasks(cfg.androidworld, cfg.split, cfg.max_per_template)
    return load_tasks(suite, cfg.split, cfg.max_per_template)


def offline_style(cfg: EvaluateConfig) -> bool:
    """Whether the checkpoints' prompt can be built from offline step data (the compressed screen): not the
    official MobileRL style's, whose observation tree is built from the raw UI dump."""
    from mobilerl.models.profiles import load_profile

    return load_profile(cfg.profile).generation.prompt_style != "mobilerl"


def run_policy(name: str, factory: Callable[[int], Any], concurrency: int, tasks: list[TaskSpec], cfg: EvaluateConfig,
               run_name: str, out_path: Path) -> dict[str, Any]:
    """``name``'s episodes on ``tasks`` (``cfg.n_trials`` each, at ``cfg.temperature``), kept in ``out_path`` and
    summarised into a nested MLflow run ``run_name``; the summary carries that run's id. AndroidWorld's tasks run on
    its servers from this process (``model_processes`` splits the simulator's work, not remote emulators')."""
    suite = tasks[0].suite if tasks else ""
    with tracking.child_run(run_name, "evaluate", policy=name, suite=suite) as run:
        t0 = time.perf_counter()
        if suite == ANDROIDWORLD:
            assert cfg.androidworld is not None
            envs = env_factory(ANDROIDWORLD, obs_mode=obs_mode_of(name, cfg), androidworld=cfg.androidworld)
            # no pool timeout: each of the client's HTTP calls has its own (androidworld.timeout_s)
            trajs = evaluate_sync(factory, tasks, n_trials=cfg.n_trials, concurrency=concurrency, env_factory=envs,
                                  base_seed=cfg.seed, desc=run_name, out_path=out_path, env_retries=cfg.env_retries,
                                  call_timeout=None)
        elif name in cfg.checkpoints and cfg.model_processes > 1:
            trajs = run_checkpoint(name, tasks, cfg, out_path=out_path, desc=run_name)
        else:
            trajs = evaluate_sync(factory, tasks, n_trials=cfg.n_trials, concurrency=concurrency,
                                  perturb=cfg.perturb, obs_mode=obs_mode_of(name, cfg), base_seed=cfg.seed,
                                  desc=run_name, out_path=out_path, env_retries=cfg.env_retries)
        wall = time.perf_counter() - t0
        s = summarize(trajs, template_texts=sim_template_texts(tasks))
        check_env_failures(s["eval/n_env_failed"], len(trajs), cfg, run_name)
        s |= {"wall_s": wall, "n_tasks": len(tasks), "n_trials": cfg.n_trials, "temperature": cfg.temperature}
        tracking.log_metrics(s)
        if name in cfg.checkpoints and cfg.failure_images:
            from mobilerl.eval.episode_images import failure_images

            try:
                tracking.log_images(failure_images(trajs, cfg.failure_images))
            except Exception as e:  # noqa: BLE001 — pictures of the run; never lose its figures over them
                print(f"evaluate: {run_name}: failure images not logged: {e!r}")
        s["mlflow_run_id"] = run.info.run_id
    print(f"evaluate: {run_name} ({cfg.split} split): success {s['eval/success_rate']:.3f} over {len(trajs)} "
          f"episodes in {wall:.1f}s")
    return s


def check_env_failures(n_failed: int, n_episodes: int, cfg: EvaluateConfig, run_name: str) -> None:
    """Fail the stage when more than ``evaluate.max_env_failed_share`` of a run's episodes were lost to env
    failures: a success rate over the rest would silently measure a different task set."""
    share = n_failed / n_episodes if n_episodes else 0.0
    if share > cfg.max_env_failed_share:
        raise RuntimeError(
            f"evaluate: {run_name}: {n_failed} of {n_episodes} episodes ({share:.1%}) lost to env failures after "
            f"{cfg.env_retries} re-run(s) each, more than evaluate.max_env_failed_share = "
            f"{cfg.max_env_failed_share:g}; fix the env workers (or raise the share) and run the stage again")


def pass_k_study(cfg: EvaluateConfig, tasks_by_suite: dict[str, list[TaskSpec]], out_dir: Path) -> dict[str, dict]:
    """``evaluate.pass_k``: each listed checkpoint sampled ``n_trials`` times at ``temperature`` on ``max_tasks``
    tasks of each suite (spread over the templates), trajectories kept in ``out_dir``; ``{policy: {suite: summary}}``
    (pass@k for k ≤ n_trials)."""
    study = cfg.model_copy(update={"n_trials": cfg.pass_k.n_trials, "temperature": cfg.pass_k.temperature})
    out: dict[str, dict] = {}
    for name in cfg.pass_k.policies:
        factory = None if cfg.model_processes > 1 else checkpoint_policy(name, cfg.checkpoints[name], study).with_seed
        for suite in cfg.pass_k.suites:
            tasks = spread(tasks_by_suite.get(suite) or suite_tasks(suite, cfg), cfg.pass_k.max_tasks)
            out.setdefault(name, {})[suite] = run_policy(
                name, factory, study.model_concurrency, tasks, study, f"{name}/{suite}/sampled",
                out_dir / f"{name}__{suite}__sampled.jsonl")
    return out
