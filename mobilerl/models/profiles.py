"""Model profiles (``configs/models/<name>.yaml``): weights, template, image limits, SFT and RL settings.

``tiny`` is the embedded default (CPU, the committed pretrained base); ``qwen2_5_vl_7b`` and
``glm4_1v_9b`` are the paper's bases with its §B.1 / Table 4 hyperparameters; ``vl_smoke`` is the 7B's shape
(class, template, screenshots, prompt frame) at a tiny random size, its weights built from its ``random_init:``
section on first use (:mod:`mobilerl.models.random_init`). Profiles validate on load: an unknown or ill-typed
key is an error naming ``<file>: <key>``. Weights are local directories only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mobilerl.models.options import HFOptions, validate_spec

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "configs" / "models"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SFTSettings(_Strict):
    finetuning_type: Literal["full", "lora", "freeze"] = Field("full", description="LLaMA-Factory finetuning type.")
    deepspeed: str | None = Field(None, description="DeepSpeed JSON (repo-relative); None on CPU.")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate.")
    min_lr: float = Field(1e-6, ge=0, description="Floor of the cosine schedule.")
    lr_scheduler_type: str = Field("cosine_with_min_lr", description="transformers scheduler name.")
    num_train_epochs: float = Field(2, gt=0, description="Epochs over the SFT set.")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps; when set it bounds the run (and "
                                  "the schedule) instead of the epochs (the tiny profile's CPU budget).")
    packing: bool = Field(True, description="Pack several samples per sequence.")
    cutoff_len: int = Field(16384, ge=64, description="Max tokens per (packed) sequence.")
    per_device_train_batch_size: int = Field(1, ge=1, description="Micro batch per device.")
    gradient_accumulation_steps: int = Field(8, ge=1, description="Accumulation steps.")
    warmup_ratio: float = Field(0.03, ge=0, le=1, description="Warm-up share of the steps.")
    freeze_vision_tower: bool = Field(True, description="Keep the vision encoder frozen.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass "
                                         "(saves GPU memory; pure overhead for the tiny model on CPU).")

    @model_validator(mode="after")
    def _lr_order(self) -> SFTSettings:
        if self.min_lr > self.learning_rate:
            raise ValueError("min_lr must not exceed learning_rate")
        return self


class RLSettings(_Strict):
    learning_rate: float = Field(1e-6, gt=0, description="Actor learning rate (Table 4).")
    grad_clip: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    ppo_epochs: int = Field(1, ge=1, description="Optimisation epochs per batch.")
    kl_coef: float = Field(0.001, ge=0, description="KL loss coefficient β.")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature.")
    max_new_tokens: int = Field(4096, ge=1, description="Max tokens per response.")
    samples_per_task: int = Field(16, ge=2, description="Group size n of GRPO.")
    train_batch_size: int = Field(256, ge=1, description="Tasks per update.")
    adapr_buffer_size: int = Field(256, ge=0, description="AdaPR replay buffer capacity.")
    adapr_gamma: float = Field(1.0, ge=0, description="AdaPR γ.")
    adapr_kappa: float = Field(0.25, gt=0, le=1, description="AdaPR κ: top share eligible for the buffer.")


class GenerationSettings(_Strict):
    """How the profile's checkpoints are served and prompted (evaluation, RL rollouts).

    ``obs_mode`` / ``prompt_style`` / ``max_history`` must be what the checkpoints were trained on: they
    are part of the prompt format (:mod:`mobilerl.agent.prompt`), not a speed knob. ``prompt_style:
    mobilerl`` is the official MobileRL harness' chat and observation tree (its released checkpoints).
    """

    kind: Literal["hf", "vllm", "openai"] = Field("hf", description="Generation backend.")
    max_batch: int = Field(16, ge=1, description="Most requests per generate call (HF and vLLM micro-batcher).")
    obs_mode: Literal["xml", "screenshot", "screenshot+xml"] = Field(
        "screenshot+xml", description="What the policy sees of the screen.")
    prompt_style: Literal["full", "compact", "mobilerl"] = Field(
        "full", description="Prompt style: full / compact system prompt, or mobilerl (the official MobileRL chat, "
                            "its observation tree and 0-999 answers; needs coords rel).")
    system_prompt_file: str | None = Field(
        None, description="A text file (absolute, or relative to the repo) whose contents replace the style's "
                          "system prompt, e.g. the official harness' own prompt text saved by the user.")
    max_history: int | None = Field(None, ge=0, description="Previous responses shown (None: all).")
    coords: Literal["abs", "rel", "marks"] = Field(
        "abs", description="Coordinate frame: pixels, the 0-999 grid, or marks (numbered lines, index actions).")
    max_new_tokens: int = Field(512, ge=1, description="Cap on a response's tokens in evaluation.")
    dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        None, description="Inference dtype of the hf / vllm backends (None: the profile's training dtype).")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism.")
    max_model_len: int | None = Field(None, description="vLLM context length.")
    base_url: str | None = Field(None, description="OpenAI-compatible server (kind=openai).")
    hf: HFOptions = Field(default_factory=HFOptions, description="HF backend options (kind=hf): prefill, caches, "
                                                                 "speculation (mobilerl.models.options.HFOptions).")

    @model_validator(mode="after")
    def _mobilerl_grid(self) -> GenerationSettings:
        if self.prompt_style == "mobilerl" and self.coords != "rel":
            raise ValueError("coords: prompt_style mobilerl answers on its 0-999 grid, so coords must be rel")
        return self


SIM_TEACHER_KEYS = ("p_wrong", "restate_task", "style")


class ReasoningSettings(_Strict):
    """The reasoning stages' format, ``<think>thought</think><answer>action</answer>`` (MobileRL §2.1), its
    budget and the instruct model M that writes the first thoughts (`reasoning_bootstrap`)."""

    think_tokens: int = Field(512, ge=1, description="A thought's token budget: M is asked to keep within it, and "
                                                     "a response longer than think_tokens + answer_tokens is cut "
                                                     "and rejected.")
    answer_tokens: int = Field(64, ge=1, description="The answer's token budget after the thought.")
    teacher: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "sim", "p_wrong": 0.3, "restate_task": 0.0, "style": "target"},
        description="M: {kind: sim, p_wrong, restate_task, style} (the simulator teacher) or a make_backend "
                    "spec, e.g. {kind: openai, base_url, model} for an instruct model behind vLLM's server.")
    teacher_prompt_style: Literal["full", "compact"] | None = Field(
        None, description="System prompt style shown to M (null: the dataset's; full for an off-the-shelf "
                          "instruct model, which needs the action space spelled out).")

    @field_validator("teacher")
    @classmethod
    def _teacher(cls, spec: dict[str, Any]) -> dict[str, Any]:
        if spec.get("kind") == "sim":
            unknown = sorted(set(spec) - {"kind", *SIM_TEACHER_KEYS})
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r} for kind 'sim' (known: {', '.join(SIM_TEACHER_KEYS)})")
        else:
            validate_spec(spec)
        return spec

    @property
    def max_new_tokens(self) -> int:
        """The cap on a reasoning response: the thought's budget and the answer's."""
        return self.think_tokens + self.answer_tokens


class RandomInit(_Strict):
    """Weights built from a config instead of downloaded: a randomly initialised model of ``architecture``
    around the project tokenizer, deterministic in ``seed`` (:mod:`mobilerl.models.random_init`)."""

    architecture: Literal["Qwen2_5_VLForConditionalGeneration"] = Field(
        description="transformers model class (the large profile whose shape this one has).")
    tokenizer: str = Field("models/tiny-base", description="Directory of the project tokenizer (repo-relative).")
    seed: int = Field(0, description="Torch seed of the initialisation.")
    hidden_size: int = Field(64, ge=8, description="Decoder width.")
    num_hidden_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(4, ge=1, description="Decoder attention heads.")
    num_key_value_heads: int = Field(2, ge=1, description="Decoder key/value heads (grouped-query attention).")
    intermediate_size: int = Field(128, ge=8, description="Decoder MLP width.")
    max_position_embeddings: int = Field(8192, ge=64, description="Longest sequence (positions).")
    vision_depth: int = Field(1, ge=1, description="Vision transformer blocks.")
    vision_hidden_size: int = Field(32, ge=8, description="Vision transformer width.")
    vision_intermediate_size: int = Field(64, ge=8, description="Vision MLP width.")
    vision_heads: int = Field(1, ge=1, description="Vision attention heads.")

    @model_validator(mode="after")
    def _heads(self) -> RandomInit:
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 8:
            raise ValueError("hidden_size / num_attention_heads must be a whole multiple of 8 (M-RoPE sections)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.vision_hidden_size % self.vision_heads:
            raise ValueError("vision_hidden_size must be a multiple of vision_heads")
        return self


class ModelProfile(_Strict):
    name: str
    weights: str = Field(description="Local weight directory (absolute, or relative to the repo); with "
                                      "random_init, where the built weights are cached.")
    random_init: RandomInit | None = Field(
        None, description="Build the weights from this config on first use (no download); null: they exist.")
    template: str = Field(description="LLaMA-Factory template name.")
    image_max_pixels: int = Field(ge=1, description="Max pixels per image.")
    image_min_pixels: int = Field(ge=1, description="Min pixels per image.")
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    sft: SFTSettings = SFTSettings()
    rl: RLSettings = RLSettings()
    generation: GenerationSettings = GenerationSettings()
    reasoning: ReasoningSettings = ReasoningSettings()

    @model_validator(mode="after")
    def _pixels(self) -> ModelProfile:
        if self.image_min_pixels > self.image_max_pixels:
            raise ValueError("image_min_pixels must not exceed image_max_pixels")
        return self

    @property
    def inference_dtype(self) -> str:
        """The dtype generation runs in: ``generation.dtype``, else the training ``dtype``."""
        return self.generation.dtype or self.dtype

    @property
    def weights_path(self) -> Path:
        p = Path(self.weights)
        return p if p.is_absolute() else ROOT / p


def reasoning_settings(profile: str, overrides: dict[str, Any]) -> ReasoningSettings:
    """The ``profile``'s reasoning section with a stage's ``reasoning_overrides`` over it (a null value keeps the
    profile's); :func:`mobilerl.config.checked_settings` names a bad key."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return ReasoningSettings.model_validate({**load_profile(profile).reasoning.model_dump(), **given})


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def load_profile(name: str) -> ModelProfile:
    path = PROFILES / f"{name}.yaml"
    if not path.exists():
        raise KeyError(f"unknown model profile {name!r}; available: {', '.join(available())}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        profile = ModelProfile.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{path}: {problems}") from None
    if profile.name != name:
        raise ValueError(f"{path}: name {profile.name!r} does not match the file name")
    if profile.sft.deepspeed and not (ROOT / profile.sft.deepspeed).is_file():
        raise ValueError(f"{path}: sft.deepspeed: {profile.sft.deepspeed} does not exist")
    return profile


def system_prompt_of(profile: ModelProfile) -> str | None:
    """The text of ``generation.system_prompt_file`` (None when unset); a missing file is an error naming it."""
    f = profile.generation.system_prompt_file
    if f is None:
        return None
    p = Path(f) if Path(f).is_absolute() else ROOT / f
    if not p.is_file():
        raise ValueError(f"profile {profile.name}: generation.system_prompt_file: {p} does not exist")
    return p.read_text(encoding="utf-8").strip()
