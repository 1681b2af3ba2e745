"""Checkpoint policies of the `evaluate` stage: a model directory served by the generation backend of the
model profile and prompted the way that profile's checkpoints are trained (observation mode, prompt style,
history, coordinate frame: ``configs/models/<profile>.yaml`` → ``generation:``), next to the baselines.

:func:`checkpoint_policy` builds one in this process; :func:`run_checkpoint` runs its episodes in worker
processes, each loading its own copy (:func:`mobilerl.eval.runner.evaluate_in_processes`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mobilerl.config import ROOT
from mobilerl.env.base import TaskSpec
from mobilerl.eval.config import BASELINES, CheckpointSpec, EvaluateConfig, checkpoint_path
from mobilerl.eval.runner import evaluate_in_processes
from mobilerl.tasks import spread


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


def obs_mode_of(name: str, cfg: EvaluateConfig) -> str:
    """The observation mode ``name``'s episodes run in: its profile's ``generation.obs_mode`` for a checkpoint, XML
    for the baselines (they read the XML only), so the envs render screenshots exactly when the policy reads them."""
    if name not in cfg.checkpoints:
        return "xml"
    from mobilerl.models.profiles import load_profile

    try:
        return load_profile(cfg.profile).generation.obs_mode
    except KeyError as e:
        raise ValueError(f"evaluate.profile: {e.args[0]}") from None


def checkpoint_policy(name: str, spec: CheckpointSpec, cfg: EvaluateConfig, root: Path = ROOT,
                      backend_overrides: dict[str, Any] | None = None):
    """A :class:`~mobilerl.agent.model_policy.ModelPolicy` over the checkpoint, with the profile's backend
    settings and prompt format (``backend_overrides``: :func:`~mobilerl.models.backends.make_backend` keys over the
    profile's, e.g. ``dtype`` in benchmarks)."""
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.backends import make_backend, profile_spec
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.profiles import load_profile, system_prompt_of

    try:
        profile = load_profile(cfg.profile)
    except KeyError as e:
        raise ValueError(f"evaluate.profile: {e.args[0]}") from None
    g = profile.generation
    # through kind 'openai' the server holds the weights: the checkpoint's path is the model name it serves
    model = spec.path if g.kind == "openai" else str(checkpoint_path(spec, root))
    backend = make_backend({**profile_spec(profile), "model": model, "name": name, **(backend_overrides or {})})
    cap = spec.max_new_tokens or (profile.reasoning.max_new_tokens if spec.reasoning else g.max_new_tokens)
    sampling = SamplingConfig(temperature=cfg.temperature, max_new_tokens=cap, seed=cfg.seed)
    return ModelPolicy(backend, obs_mode=g.obs_mode, sampling=sampling, name=name, version=spec.path,
                       reasoning=spec.reasoning, max_history=g.max_history, prompt_style=g.prompt_style,
                       coords=g.coords, system_prompt=system_prompt_of(profile), reuse_greedy=cfg.reuse_greedy)


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
    processes (:func:`mobilerl.eval.runner.evaluate_in_processes`), ``concurrency`` episodes in flight in each (default
    ``model_concurrency`` shared out; ``backend_overrides`` as for :func:`checkpoint_policy`); ``kwargs`` go to
    :func:`mobilerl.eval.runner.evaluate`."""
    n = processes or cfg.model_processes
    threads = max(1, (os.cpu_count() or 1) // n)
    factory = functools.partial(checkpoint_factory, name, cfg.model_dump(), str(root), backend_overrides)
    return evaluate_in_processes(factory, tasks,
                                 processes=n, threads=threads, n_trials=cfg.n_trials,
                                 concurrency=concurrency or max(1, cfg.model_concurrency // n), perturb=cfg.perturb,
                                 obs_mode=obs_mode_of(name, cfg), base_seed=cfg.seed,
                                 **{"env_retries": cfg.env_retries, **kwargs})


def policy_tasks(name: str, tasks: list[TaskSpec], cfg: EvaluateConfig) -> list[TaskSpec]:
    """The tasks ``name`` runs: all for a baseline; for a checkpoint at most its ``max_tasks`` (else
    ``model_max_tasks``), spread over the templates."""
    if name not in cfg.checkpoints:
        return tasks
    return spread(tasks, cfg.checkpoints[name].max_tasks or cfg.model_max_tasks)
