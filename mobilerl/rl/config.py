"""The `rl` stage's typed config: what to train from, on which tasks, and which AdaGRPO mechanisms are on.

Hyper-parameters of the optimiser and the mechanisms (learning rate, clip ε, β, tasks a round, n, α, κ, γ, buffer size)
come from the model profile's ``rl:`` section (``configs/models/<profile>.yaml``); ``overrides`` changes them
for one run. Every mechanism is a switch here, so an ablation is an override (``rl.adapr=false``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mobilerl.config import StageConfig
from mobilerl.models.profiles import RLSettings, load_profile


class RLConfig(StageConfig):
    profile: str = Field("tiny", description="Model profile whose rl: and generation: sections apply.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="Keys of the profile's rl: section changed for this run.")
    init: str = Field("data/checkpoints/sft_reasoning_free", description="Checkpoint the policy starts from.")
    reasoning: bool = Field(False, description="Prompt for <think> before the answer (a reasoning-SFT init).")
    out: str = Field("data/checkpoints/adagrpo", description="Where the trained policy is written.")
    work: str = Field(".cache/rl", description="Resumable run folder: checkpoints, rollouts' weights.")
    suite: str = Field("world", description="Task suite of the training pool (its train split).")
    templates_max_steps: int | None = Field(
        None, ge=1, description="Keep templates whose test tasks need at most this many optimal steps (None: all).")
    tasks_per_template: int | None = Field(None, ge=1, description="Train tasks per template in the pool (None: all).")
    rounds: int = Field(100, ge=1, description="Training rounds (rollout + update each).")
    spa: bool = Field(True, description="Shortest-path reward adjustment of successes (§2.2.1).")
    adapr: bool = Field(True, description="Difficulty-adaptive positive replay (§2.2.2).")
    fcf: bool = Field(True, description="Failure curriculum filtering of the task sampling (§2.2.3).")
    fcf_patience: int = Field(2, ge=1, description="All-zero rounds before a task's cooldown starts.")
    fcf_cooldown: int = Field(3, ge=0, description="Cooldown rounds (weight exp(-f)) before removal.")
    curriculum_init: str | None = Field(None, description="A previous run's curriculum.json to start FCF from.")
    lab_share: float = Field(0.0, ge=0, le=1, description=(
        "Share of a round's tasks drawn from lab/train, whose verifier is hidden (the authors mix 4:1: 0.2)."))
    reward_model: str | None = Field(None, description="Judge checkpoint (the reward_model stage's) scoring lab/train.")
    prune_negatives: float | None = Field(
        2.0, ge=0, description="Keep at most this many negatives per positive in a group (None: all).")
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        Field("token-mean", description="How per-token losses are reduced (verl's agg_loss modes)."))
    micro_batch_tokens: int = Field(16384, ge=256, description="Padded tokens per forward in the update.")
    rollout_processes: int = Field(2, ge=1, description="Rollout worker processes (each holds the policy).")
    rollout_concurrency: int = Field(64, ge=1, description="Episodes in flight per rollout worker.")
    max_batch: int | None = Field(None, ge=1, description="Rows a rollout worker decodes together (None: profile's).")
    checkpoint_every: int = Field(5, ge=1, description="Rounds between resumable checkpoints.")
    trainer_backend: Literal["single", "ddp", "deepspeed"] = Field("single", description=(
        "How the update runs: one process, or data-parallel over the processes a launcher started (torchrun, "
        "deepspeed, accelerate launch) with torch.distributed (ddp) or DeepSpeed ZeRO (deepspeed_config)."))
    deepspeed_config: str | None = Field(None, description=(
        "DeepSpeed JSON (repo-relative, e.g. configs/deepspeed/zero2.json) of the deepspeed trainer backend."))
    seed: int = Field(0, description="Seeds task sampling, rollouts and negative pruning.")
    registered_model: str = Field("mobilerl-policy", description="MLflow registered model name.")
    alias: str = Field("adagrpo", description="MLflow alias of the trained policy.")

    @model_validator(mode="after")
    def _judge_for_lab(self) -> RLConfig:
        if self.lab_share > 0 and not self.reward_model:
            raise ValueError("rl.lab_share > 0 needs rl.reward_model: lab/train tasks have no verifier")
        return self

    @model_validator(mode="after")
    def _deepspeed_config(self) -> RLConfig:
        if (self.trainer_backend == "deepspeed") != (self.deepspeed_config is not None):
            raise ValueError("rl.deepspeed_config is needed by, and only by, rl.trainer_backend: deepspeed")
        return self

    def settings(self) -> RLSettings:
        """The profile's rl: section with ``overrides`` applied (errors name ``rl.overrides.<key>``)."""
        base = load_profile(self.profile).rl.model_dump()
        unknown = sorted(set(self.overrides) - set(base))
        if unknown:
            raise ValueError(f"rl.overrides: unknown key(s) {unknown} (known: {sorted(base)})")
        return RLSettings.model_validate({**base, **self.overrides})
