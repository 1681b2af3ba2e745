"""The `evaluate` stage's typed config: benchmarks, policies (baselines and checkpoints), the pass@k study and
the offline step evaluation. It lives in the library because the checkpoint policies
(:mod:`mobilerl.eval.checkpoints`) and the scripts that build a policy the way the stage does read it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mobilerl.config import ROOT, StageConfig, repo_path
from mobilerl.env.androidworld import SUITE as ANDROIDWORLD
from mobilerl.env.androidworld import AndroidWorldConfig

BASELINES = ("oracle", "random")


class CheckpointSpec(StageConfig):
    """A checkpoint policy (``evaluate.checkpoints.<name>``); a bare string is its ``path``."""

    path: str = Field(description="Model directory, relative to the repo (or absolute); for a profile served "
                                  "through kind 'openai', the model name the server serves.")
    reasoning: bool = Field(False, description="Prompt for <think> before the answer (reasoning checkpoints).")
    max_new_tokens: int | None = Field(None, ge=1, description="Response cap (default: the profile's; with reasoning, "
                                                                "its reasoning budget, think + answer tokens).")
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
    suites: list[Literal["world", "lab", "androidworld"]] = Field(["world", "lab"], description=(
        "Benchmarks to run: the simulator's world and lab, AndroidWorld on its own servers (evaluate.androidworld)."))
    androidworld: AndroidWorldConfig | None = Field(None, description=(
        "AndroidWorld's env servers and suite, for the androidworld benchmark (None: not run)."))
    split: Literal["test", "train"] = Field("test", description="Which split of each suite.")
    policies: list[str] = Field(["oracle", "random"], description="Policy names (baselines or checkpoints).")
    checkpoints: dict[str, CheckpointSpec] = Field(
        {}, description="Checkpoint policies: name -> model directory (or {path, reasoning, max_new_tokens, max_tasks}).")
    profile: str = Field("tiny", description="Model profile of the checkpoints (configs/models/<profile>.yaml: "
                                             "backend and prompt format).")
    n_trials: int = Field(1, ge=1, description="Trials per task (pass@k needs n ≥ k).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of model policies (0: greedy, pass@1).")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(16, ge=1, description="Episodes in flight (env pool size) for the baselines.")
    model_concurrency: int = Field(
        128, ge=1, description="Episodes in flight for checkpoint policies (≥ 2 × the profile's max_batch keeps "
                               "the model busy while the other half of the episodes step their envs).")
    max_per_template: int | None = Field(
        None, ge=1, description="Cap on tasks per template (null: all, 20 of world/test; smoke runs use 1).")
    model_max_tasks: int | None = Field(
        None, ge=1, description="Cap on tasks per suite for checkpoint policies, spread evenly over the templates "
                                "(null: all; an untrained checkpoint runs every episode to its budget).")
    model_processes: int = Field(
        1, ge=1, description="Worker processes for checkpoint policies, each loading the model and running every "
                             "N-th task with its own env pool and cores / N torch threads (docs/evaluation.md).")
    seed: int = Field(0, description="Base seed of the policies' sampling.")
    env_retries: int = Field(2, ge=0, description="Times an episode whose env failed (crashed, timed out, no "
                                                  "worker) is run again with the same seed before it is lost.")
    max_env_failed_share: float = Field(
        0.05, ge=0.0, le=1.0, description="Largest share of a (policy, suite)'s episodes that may be lost to env "
                                          "failures (left out of the success rate); more fails the stage.")
    failure_images: int = Field(
        50, ge=0, description="Templates (at most) whose first failure a checkpoint's run logs as a masked MLflow "
                              "image, failures/<template> (0: none).")
    reuse_greedy: bool = Field(
        True, description="At temperature 0, a prompt already answered in the episode is answered from memory "
                          "(the same trajectory, fewer model calls; mobilerl.agent.model_policy).")
    offline_suite: Literal["world", "lab"] = Field("world", description="Suite of the offline step evaluation.")
    offline_per_template: int = Field(
        1, ge=0, description="Expert-rolled test tasks per template scored step by step (0: no offline evaluation).")
    offline_modes: list[Literal["high", "low"]] = Field(
        ["high", "low"], min_length=1,
        description="AndroidControl modes of the offline evaluation: high (goal + history) and/or low (the step's "
                    "own instruction, derived from the expert's action where the record has none; no history).")

    world_all: list[str] = Field([], description=(
        "Checkpoints also run greedy on every world task of the split (summary key world_all: the RL target's figures)."))
    pass_k: PassKConfig = Field(default_factory=PassKConfig,
                                description="Sampling study: n trials per task at a temperature, for pass@k.")

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _bare_paths(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: {"path": c} if isinstance(c, str) else c for k, c in v.items()}
        return v

    @model_validator(mode="after")
    def _androidworld(self) -> EvaluateConfig:
        if (ANDROIDWORLD in self.suites) != (self.androidworld is not None):
            raise ValueError("evaluate.androidworld (the servers' URLs) is needed by, and only by, the androidworld "
                             f"suite in evaluate.suites (suites: {self.suites})")
        if self.androidworld is not None and not self.androidworld.urls:
            raise ValueError("evaluate.androidworld.urls: empty; list AndroidWorld's servers")
        return self


def check_policies(cfg: EvaluateConfig, root: Path = ROOT) -> None:
    """Every policy name is a baseline or a listed checkpoint whose directory holds a model (checked before
    anything runs, so a typo does not surface after an hour of baselines)."""
    for name in cfg.checkpoints:
        if name in BASELINES:
            raise ValueError(f"evaluate.checkpoints.{name}: {name!r} is a baseline name; pick another")
    for i, name in enumerate(cfg.policies):
        if name == "oracle" and ANDROIDWORLD in cfg.suites:
            raise ValueError(f"evaluate.policies[{i}]: the oracle is the simulator's expert; it cannot run the "
                             "androidworld suite (drop one of them)")
        if name in BASELINES:
            continue
        if name not in cfg.checkpoints:
            known = ", ".join([*BASELINES, *cfg.checkpoints])
            raise ValueError(f"evaluate.policies[{i}]: unknown policy {name!r} (known: {known}; a checkpoint "
                             f"needs an entry under evaluate.checkpoints)")
        _check_model_dir(name, cfg, root)
        _check_reads_pixels(cfg)
    _check_checkpoints("world_all", cfg.world_all, "", cfg, root)
    _check_checkpoints("pass_k.policies", cfg.pass_k.policies, "; the baselines need no sampling study", cfg, root)


def _check_checkpoints(key: str, names: list[str], why: str, cfg: EvaluateConfig, root: Path) -> None:
    """Every name of ``evaluate.<key>`` is a listed checkpoint whose directory holds a model."""
    for i, name in enumerate(names):
        if name not in cfg.checkpoints:
            raise ValueError(f"evaluate.{key}[{i}]: {name!r} is not a checkpoint (known: "
                             f"{', '.join(cfg.checkpoints) or 'none'}){why}")
        _check_model_dir(name, cfg, root)


def _check_model_dir(name: str, cfg: EvaluateConfig, root: Path) -> None:
    from mobilerl.models.profiles import load_profile  # lazy: config parsing needs no profile otherwise

    if load_profile(cfg.profile).generation.kind == "openai":
        return  # the server holds the weights; the checkpoint names its model
    path = checkpoint_path(cfg.checkpoints[name], root)
    if not (path / "config.json").is_file():
        raise ValueError(f"evaluate.checkpoints.{name}: {path} is not a model directory (no config.json); "
                         f"run the stage that trains it (dvc repro)")


def _check_reads_pixels(cfg: EvaluateConfig) -> None:
    from mobilerl.models.profiles import load_profile

    if ANDROIDWORLD in cfg.suites and load_profile(cfg.profile).generation.obs_mode == "xml":
        raise ValueError(f"evaluate.profile: {cfg.profile!r} reads the UI tree only (obs_mode xml), which "
                         "AndroidWorld's server does not serve: the androidworld suite needs a screenshot profile")


def checkpoint_path(spec: CheckpointSpec, root: Path = ROOT) -> Path:
    return repo_path(spec.path, root)
