"""Stage `evaluate`: every policy × every benchmark, all episodes concurrent through the env pool.

Policies are named in params: ``oracle`` and ``random`` are the baselines that are always present; any other
name is a checkpoint listed under ``checkpoints`` (name -> repo-relative model directory), served by the
generation backend of the model ``profile`` and prompted the way that profile's checkpoints are trained
(observation mode, prompt style, history; ``configs/models/<profile>.yaml`` → ``generation:``). Outs: one
JSONL of trajectories per (policy, suite) under ``data/eval/trajectories/``; metrics:
``data/eval/summary.json`` — the summary of each (policy, suite) with the id of the nested MLflow run it was
logged to.

pass@k for k > 1 needs k sampled trials of every task. The main evaluation is greedy with one trial (pass@1), so
``pass_k`` names checkpoints that are also sampled ``n_trials`` times at ``temperature`` on ``max_tasks`` tasks of
each of its suites (trajectories ``<name>__<suite>__sampled.jsonl``; metrics ``data/eval/sampled.json``).

Offline step accuracy (AndroidControl-style, high mode, Table 8 rules): each checkpoint also answers every
step of expert rollouts of ``offline_per_template`` test tasks per template of ``offline_suite``, with the
expert's history (wrong answers replaced by the expert's); ``data/eval/offline.json``. When every checkpoint
fails online, this still tells them apart. The random baseline is scored on the same steps, as the floor of
that table (the oracle is not: the steps are its own).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from mobilerl import tracking
from mobilerl.env.base import TaskSpec
from mobilerl.config import ROOT, StageConfig, load_params, repo_path, write_json

TASKS = ROOT / "data" / "tasks" / "suites"
OUT = ROOT / "data" / "eval"


BASELINES = ("oracle", "random")


class CheckpointSpec(StageConfig):
    """A checkpoint policy (``evaluate.checkpoints.<name>``); a bare string is its ``path``."""

    path: str = Field(description="Model directory, relative to the repo (or absolute).")
    reasoning: bool = Field(False, description="Prompt for <think> before the answer (reasoning checkpoints).")
    max_new_tokens: int | None = Field(None, ge=1, description="Response cap (default: the profile's).")
    max_tasks: int | None = Field(None, ge=1, description="Cap on tasks per suite for this checkpoint "
                                                          "(default: model_max_tasks).")


class PassKConfig(StageConfig):
    """``evaluate.pass_k``: a sampling study beside the greedy evaluation. pass@k for k > 1 needs k sampled
    trials of every task; the main evaluation runs ``n_trials`` (1, greedy), so its pass@k is pass@1 only."""

    policies: list[str] = Field([], description="Checkpoint policies to sample (names under evaluate.checkpoints).")
    suites: list[Literal["world", "lab"]] = Field(["world"], description="Benchmarks of the study.")
    n_trials: int = Field(8, ge=2, description="Sampled trials per task (pass@k for k up to n_trials).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of the trials.")
    max_tasks: int = Field(40, ge=1, description="Tasks per suite, spread evenly over the suite's templates.")


class EvaluateConfig(StageConfig):
    suites: list[Literal["world", "lab"]] = Field(["world", "lab"], description="Benchmarks to run.")
    split: Literal["test", "train"] = Field("test", description="Which split of each suite.")
    policies: list[str] = Field(["oracle", "random"], description="Policy names (baselines or checkpoints).")
    checkpoints: dict[str, CheckpointSpec] = Field(
        {}, description="Checkpoint policies: name -> model directory (or {path, reasoning, max_new_tokens, max_tasks}).")
    profile: str = Field("tiny", description="Model profile of the checkpoints (backend, prompt format).")
    n_trials: int = Field(1, ge=1, description="Trials per task (pass@k needs n ≥ k).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of model policies.")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(16, ge=1, description="Episodes in flight (env pool size) for the baselines.")
    model_concurrency: int = Field(
        128, ge=1, description="Episodes in flight for checkpoint policies (≥ 2 × the profile's max_batch keeps "
                               "the model busy while the other half of the episodes step their envs).")
    max_per_template: int | None = Field(None, ge=1, description="Cap on tasks per template (smoke runs).")
    model_max_tasks: int | None = Field(
        None, ge=1, description="Cap on tasks per suite for checkpoint policies, spread evenly over the task list "
                                "(smoke runs: an untrained checkpoint runs every episode to its budget).")
    model_processes: int = Field(
        1, ge=1, description="Worker processes for checkpoint policies: each loads the model, runs every N-th task "
                             "with its own env pool and torch threads (cores / N). On 2 cores, 2 processes run the "
                             "simulator and each model's Python-bound decoding side by side (docs/evaluation.md).")
    seed: int = Field(0, description="Base seed of the policies' sampling.")
    reuse_greedy: bool = Field(
        True, description="At temperature 0, a checkpoint policy answers a prompt it already answered in the same "
                          "episode from memory (an agent repeating one action on an unchanged screen): the same "
                          "trajectory, fewer model calls (mobilerl.agent.model_policy).")
    offline_suite: Literal["world", "lab"] = Field("world", description="Suite of the offline step evaluation.")
    offline_per_template: int = Field(
        1, ge=0, description="Expert-rolled test tasks per template scored step by step (0: no offline evaluation).")
    offline_modes: list[Literal["high", "low"]] = Field(
        ["high", "low"], min_length=1,
        description="AndroidControl modes of the offline evaluation: high (goal + history) and/or low (the step's "
                    "own instruction, derived from the expert's action where the record has none; no history).")

    pass_k: PassKConfig = Field(default_factory=PassKConfig,
                                description="Sampling study: n trials per task at a temperature, for pass@k.")

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _bare_paths(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: {"path": c} if isinstance(c, str) else c for k, c in v.items()}
        return v


def load_tasks(suite: str, split: str, max_per_template: int | None = None) -> list[TaskSpec]:
    path = TASKS / f"{suite}_{split}.jsonl"
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            try:
                t = TaskSpec.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: corrupt task record: {e}") from None
            seen[t.template] = seen.get(t.template, 0) + 1
            if max_per_template is None or seen[t.template] <= max_per_template:
                tasks.append(t)
    return tasks


def check_policies(cfg: EvaluateConfig, root: Path = ROOT) -> None:
    """Every policy name is a baseline or a listed checkpoint whose directory holds a model (checked before
    anything runs, so a typo does not surface after an hour of baselines)."""
    for name in cfg.checkpoints:
        if name in BASELINES:
            raise ValueError(f"evaluate.checkpoints.{name}: {name!r} is a baseline name; pick another")
    for i, name in enumerate(cfg.policies):
        if name in BASELINES:
            continue
        if name not in cfg.checkpoints:
            known = ", ".join([*BASELINES, *cfg.checkpoints])
            raise ValueError(f"evaluate.policies[{i}]: unknown policy {name!r} (known: {known}; a checkpoint "
                             f"needs an entry under evaluate.checkpoints)")
        _check_model_dir(name, cfg, root)
    for i, name in enumerate(cfg.pass_k.policies):
        if name not in cfg.checkpoints:
            raise ValueError(f"evaluate.pass_k.policies[{i}]: {name!r} is not a checkpoint (known: "
                             f"{', '.join(cfg.checkpoints) or 'none'}); the baselines need no sampling study")
        _check_model_dir(name, cfg, root)


def _check_model_dir(name: str, cfg: EvaluateConfig, root: Path) -> None:
    path = checkpoint_path(cfg.checkpoints[name], root)
    if not (path / "config.json").is_file():
        raise ValueError(f"evaluate.checkpoints.{name}: {path} is not a model directory (no config.json); "
                         f"run the stage that trains it (dvc repro)")


def checkpoint_path(spec: CheckpointSpec, root: Path = ROOT) -> Path:
    return repo_path(spec.path, root)


def make_policy_factory(name: str, cfg: EvaluateConfig, root: Path = ROOT) -> tuple[Callable[[int], Any], int]:
    """``(seed -> policy, episodes in flight)`` for a baseline or a checkpoint (loaded here)."""
    from mobilerl.agent import OraclePolicy, RandomPolicy

    if name == "oracle":
        return (lambda seed: OraclePolicy()), cfg.concurrency
    if name == "random":
        return (lambda seed: RandomPolicy(seed)), cfg.concurrency
    if name not in cfg.checkpoints:
        raise ValueError(f"evaluate.policies: unknown policy {name!r} (known: "
                         f"{', '.join([*BASELINES, *cfg.checkpoints])})")
    return checkpoint_policy(name, cfg.checkpoints[name], cfg, root).with_seed, cfg.model_concurrency


def checkpoint_policy(name: str, spec: CheckpointSpec, cfg: EvaluateConfig, root: Path = ROOT,
                      backend_overrides: dict[str, Any] | None = None):
    """A :class:`~mobilerl.agent.model_policy.ModelPolicy` over the checkpoint, with the profile's backend
    settings and prompt format (``backend_overrides``: :func:`~mobilerl.models.backends.make_backend` keys over the
    profile's, e.g. ``dtype`` in benchmarks)."""
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.backends import make_backend, profile_spec
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.profiles import load_profile

    try:
        profile = load_profile(cfg.profile)
    except KeyError as e:
        raise ValueError(f"evaluate.profile: {e.args[0]}") from None
    g = profile.generation
    if g.kind == "openai":
        raise ValueError(f"evaluate.profile: {cfg.profile!r} serves through kind 'openai' (a server with its own "
                         f"weights); checkpoint policies need kind 'hf' or 'vllm'")
    path = checkpoint_path(spec, root)
    backend = make_backend({**profile_spec(profile), "model": str(path), "name": name, **(backend_overrides or {})})
    sampling = SamplingConfig(temperature=cfg.temperature, max_new_tokens=spec.max_new_tokens or g.max_new_tokens,
                              seed=cfg.seed)
    return ModelPolicy(backend, obs_mode=g.obs_mode, sampling=sampling, name=name, version=spec.path,
                       reasoning=spec.reasoning, max_history=g.max_history, prompt_style=g.prompt_style,
                       coords=g.coords, reuse_greedy=cfg.reuse_greedy)


def checkpoint_factory(name: str, cfg: dict[str, Any], root: str,
                       backend_overrides: dict[str, Any] | None = None) -> Callable[[int], Any]:
    """``seed -> policy`` of checkpoint ``name`` built from a dumped :class:`EvaluateConfig` (picklable: what
    each worker of :func:`run_checkpoint` calls to load its own copy of the model)."""
    c = EvaluateConfig.model_validate(cfg)
    return checkpoint_policy(name, c.checkpoints[name], c, Path(root), backend_overrides).with_seed


def run_checkpoint(name: str, tasks: list[TaskSpec], cfg: EvaluateConfig, root: Path = ROOT,
                   processes: int | None = None, concurrency: int | None = None,
                   backend_overrides: dict[str, Any] | None = None, **kwargs: Any) -> list:
    """The episodes of checkpoint ``name`` on ``tasks`` in ``processes`` (default ``model_processes``) worker
    processes (:func:`mobilerl.eval.evaluate_in_processes`), ``concurrency`` episodes in flight in each (default
    ``model_concurrency`` shared out; ``backend_overrides`` as for :func:`checkpoint_policy`); ``kwargs`` go to
    :func:`mobilerl.eval.evaluate`."""
    import functools
    import os

    from mobilerl.eval.runner import evaluate_in_processes

    n = processes or cfg.model_processes
    threads = max(1, (os.cpu_count() or 1) // n)
    factory = functools.partial(checkpoint_factory, name, cfg.model_dump(), str(root), backend_overrides)
    return evaluate_in_processes(factory, tasks,
                                 processes=n, threads=threads, n_trials=cfg.n_trials,
                                 concurrency=concurrency or max(1, cfg.model_concurrency // n), perturb=cfg.perturb,
                                 base_seed=cfg.seed, **kwargs)


def offline_episodes(cfg: EvaluateConfig) -> list:
    """Expert rollouts of the offline tasks as AndroidControl-style step data (XML only, seeded)."""
    from mobilerl.agent import OraclePolicy
    from mobilerl.eval import evaluate_sync
    from mobilerl.eval.androidcontrol import from_trajectory

    tasks = spread(load_tasks(cfg.offline_suite, cfg.split, cfg.offline_per_template), cfg.model_max_tasks)
    trajs = evaluate_sync(lambda seed: OraclePolicy(), tasks, concurrency=cfg.concurrency, perturb=cfg.perturb,
                          base_seed=cfg.seed, progress=False)
    bad = [t.task_id for t in trajs if not t.success]
    if bad:
        raise RuntimeError(f"evaluate: the expert failed offline tasks {bad[:5]} (of {len(bad)})")
    return [from_trajectory(t) for t in trajs]


def spread(tasks: list[TaskSpec], cap: int | None) -> list[TaskSpec]:
    """At most ``cap`` of ``tasks``, spread evenly over the list (so over its templates); None: all."""
    if not cap or len(tasks) <= cap:
        return tasks
    return [tasks[i * len(tasks) // cap] for i in range(cap)]


def policy_tasks(name: str, tasks: list[TaskSpec], cfg: EvaluateConfig) -> list[TaskSpec]:
    """The tasks ``name`` runs: all for a baseline; for a checkpoint at most its ``max_tasks`` (else
    ``model_max_tasks``), spread over the templates."""
    if name not in cfg.checkpoints:
        return tasks
    return spread(tasks, cfg.checkpoints[name].max_tasks or cfg.model_max_tasks)


def evaluate_offline(name: str, policy: Any, episodes: list, cfg: EvaluateConfig) -> dict[str, Any]:
    """A policy's offline step metrics on ``episodes`` (a checkpoint's, or the random baseline's, which answers in
    pixels), logged to a nested MLflow run ``<name>/offline``."""
    import asyncio

    from mobilerl.eval.androidcontrol import run_androidcontrol

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


def run_policy(name: str, factory: Callable[[int], Any], concurrency: int, tasks: list[TaskSpec], cfg: EvaluateConfig,
               run_name: str, out_path: Path) -> dict[str, Any]:
    """``name``'s episodes on ``tasks`` (``cfg.n_trials`` each, at ``cfg.temperature``), kept in ``out_path`` and
    summarised into a nested MLflow run ``run_name``; the summary carries that run's id."""
    from mobilerl.eval import evaluate_sync, sim_template_texts, summarize

    suite = tasks[0].suite if tasks else ""
    with tracking.child_run(run_name, "evaluate", policy=name, suite=suite) as run:
        t0 = time.perf_counter()
        if name in cfg.checkpoints and cfg.model_processes > 1:
            trajs = run_checkpoint(name, tasks, cfg, out_path=out_path)
        else:
            trajs = evaluate_sync(factory, tasks, n_trials=cfg.n_trials, concurrency=concurrency,
                                  perturb=cfg.perturb, base_seed=cfg.seed, progress=False, out_path=out_path)
        wall = time.perf_counter() - t0
        s = summarize(trajs, template_texts=sim_template_texts(tasks))
        s |= {"wall_s": wall, "n_tasks": len(tasks), "n_trials": cfg.n_trials, "temperature": cfg.temperature}
        tracking.log_metrics(s)
        s["mlflow_run_id"] = run.info.run_id
    print(f"evaluate: {run_name} ({cfg.split} split): success {s['eval/success_rate']:.3f} over {len(trajs)} "
          f"episodes in {wall:.1f}s")
    return s


def pass_k_study(cfg: EvaluateConfig, tasks_by_suite: dict[str, list[TaskSpec]]) -> dict[str, dict]:
    """``evaluate.pass_k``: each listed checkpoint sampled ``n_trials`` times at ``temperature`` on ``max_tasks``
    tasks of each suite (spread over the templates); ``{policy: {suite: summary}}`` (pass@k for k ≤ n_trials)."""
    study = cfg.model_copy(update={"n_trials": cfg.pass_k.n_trials, "temperature": cfg.pass_k.temperature})
    out: dict[str, dict] = {}
    for name in cfg.pass_k.policies:
        factory = None if cfg.model_processes > 1 else checkpoint_policy(name, cfg.checkpoints[name], study).with_seed
        for suite in cfg.pass_k.suites:
            tasks = spread(tasks_by_suite.get(suite) or load_tasks(suite, cfg.split, cfg.max_per_template),
                           cfg.pass_k.max_tasks)
            out.setdefault(name, {})[suite] = run_policy(
                name, factory, study.model_concurrency, tasks, study, f"{name}/{suite}/sampled",
                OUT / "trajectories" / f"{name}__{suite}__sampled.jsonl")
    return out


def main() -> None:
    cfg = load_params("evaluate", EvaluateConfig)
    check_policies(cfg)
    summary: dict = {}
    (OUT / "trajectories").mkdir(parents=True, exist_ok=True)
    tasks_by_suite = {suite: load_tasks(suite, cfg.split, cfg.max_per_template) for suite in cfg.suites}
    offline: dict[str, dict] = {}
    with tracking.stage_run("evaluate", cfg.model_dump()):
        episodes = (offline_episodes(cfg) if cfg.offline_per_template and any(n in cfg.checkpoints for n in cfg.policies)
                    else [])
        for name in cfg.policies:
            factory, concurrency = make_policy_factory(name, cfg)
            for suite, tasks in tasks_by_suite.items():
                summary.setdefault(name, {})[suite] = run_policy(
                    name, factory, concurrency, policy_tasks(name, tasks, cfg), cfg, f"{name}/{suite}",
                    OUT / "trajectories" / f"{name}__{suite}.jsonl")
            if (name in cfg.checkpoints or name == "random") and episodes:  # the same policy, step by step
                offline[name] = evaluate_offline(name, factory(cfg.seed), episodes, cfg)
        sampled = pass_k_study(cfg, tasks_by_suite)
    write_json(OUT / "summary.json", summary)
    write_json(OUT / "offline.json", offline)
    write_json(OUT / "sampled.json", sampled)


if __name__ == "__main__":
    main()
