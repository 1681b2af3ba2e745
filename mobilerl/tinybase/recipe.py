"""The tiny base's recipe: model shape, screens, tokenizer, data and optimisation, as one typed config.

The defaults are the released recipe (run ``R1_seed1``, ``models/tiny-base/``), so ``configs/tiny.yaml`` and an
experiment's overrides name only what differs. :data:`RETIRED` lists the options that were measured, not
released, and removed, with the value the code now always has: a run's record (``tiny.json``) that names one
still reads, as long as it holds that value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mobilerl.models.tiny import TinyShape

# Question kinds of the screen-reading sequences (mobilerl.tinybase.data); "act" is the expert's next action,
# asked as the policy is asked.
KINDS: tuple[str, ...] = ("ground", "read", "checked", "app", "find", "copy", "type")
ALL_KINDS: tuple[str, ...] = (*KINDS, "act")

# Removed options -> the value the code now always has (the released one).
RETIRED: dict[str, Any] = {
    "init": None,
    "data.grounding": "bbox",
    "data.numbered": False,
    "data.prompt": "policy",
    "data.copy_well_posed": True,
    "data.min_lines": 4,
    "data.ramp": 0.0,
    "data.full_prob": 0.0,
    "data.near_copy": 0.0,
    "data.copy_punct": False,
    "data.copy_unambiguous": False,
    "data.span_ends": "first",
    "data.novel_random": False,
    "data.novel_inner": False,
    "data.act_pack": 0.0,
    "data.act_pack_from": 0.0,
    "train.stop_step": 0,
    "train.probe_window": 0,
    "train.prev_sup": 0.0,
    "train.prev_sup_layer": 0,
    "train.prev_sup_head": 0,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Shape(_Strict):
    """The Qwen2-VL architecture's size (text decoder and a tiny vision tower)."""

    hidden_size: int = Field(128, description="Width of the text decoder.")
    num_hidden_layers: int = Field(3, description="Decoder layers.")
    num_attention_heads: int = Field(4, description="Attention heads; head dim = hidden_size / heads, a multiple of 8.")
    num_key_value_heads: int = Field(4, description="KV heads (equal to the heads: no grouped-query attention).")
    intermediate_size: int = Field(384, description="MLP width.")
    rope_theta: float = Field(10000.0, description="RoPE base (sequences here are at most ~2k tokens).")
    max_position_embeddings: int = Field(4096, description="Longest position the model is built for.")
    tie_word_embeddings: bool = Field(True, description="Share the input and output embeddings.")
    vision_depth: int = Field(1, description="Vision blocks: present so screenshots take the real processor path.")
    vision_embed_dim: int = Field(32, description="Width of the vision tower.")
    vision_heads: int = Field(1, description="Attention heads of the vision tower.")

    @model_validator(mode="after")
    def _valid(self) -> Shape:
        self.tiny_shape()  # TinyShape checks the head arithmetic
        return self

    def tiny_shape(self) -> TinyShape:
        return TinyShape(**self.model_dump())


class DataConfig(_Strict):
    """How the screen-reading sequences are drawn (mobilerl.tinybase.data)."""

    coords: Literal["marks", "rel", "abs"] = Field(
        "marks", description="Screen frame: line numbers (marks), boxes on the 0-999 grid (rel) or in pixels (abs).")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"ground": 4.0, "read": 3.0, "checked": 1.0, "app": 0.5, "find": 1.5, "copy": 2.0,
                                 "type": 4.0, "act": 20.0},
        description="Question-kind mix (act: the expert's next action, asked first on every oracle screen).")
    questions: int = Field(24, description="Questions per screen (turns beyond max_len are dropped).")
    max_len: int = Field(1536, description="Tokens per sequence.")
    lm_weight: float = Field(0.1, description="Loss weight of non-answer text tokens (answers weigh 1).")
    image_prob: float = Field(0.1, description="Share of sequences (of screens with a screenshot) that include it.")
    type_frac: float = Field(0.1, description="Share of sequences drawn from screens where the expert types a span.")
    system_prob: float = Field(0.25, description="Share of sequences that start with the agent's system prompt.")
    max_history: int | None = Field(4, description="Previous actions in the prompt (the SFT data's max_history).")
    system_style: str = Field("compact", description="System prompt style (mobilerl.agent.prompt.PROMPT_STYLES).")
    random_spans: int = Field(3, description="Extra random instruction spans per screen asked as span copies.")
    span_words: int = Field(8, description="Longest random copy span, in words.")
    novel_spans: float = Field(0.5, description="Share of sequences whose instruction spans become random words.")

    @field_validator("weights")
    @classmethod
    def _kinds(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(set(v) - set(ALL_KINDS))
        if bad:
            raise ValueError(f"unknown question kind(s) {bad} (kinds: {list(ALL_KINDS)})")
        return v


class TrainConfig(_Strict):
    """Optimisation, in-training probe and the operational knobs of a run (mobilerl.tinybase.train)."""

    lr: float = Field(3e-3, description="Peak AdamW learning rate.")
    min_lr_ratio: float = Field(0.02, description="The cosine decays to lr * min_lr_ratio.")
    warmup_steps: int = Field(50, description="Linear warm-up steps.")
    weight_decay: float = Field(0.05, description="AdamW weight decay, on matrices only.")
    beta2: float = Field(0.98, description="AdamW beta2.")
    grad_clip: float = Field(1.0, description="Gradient-norm clip.")
    batch_tokens: int = Field(6144, description="Padded tokens per optimizer step (whole sequences).")
    max_steps: int = Field(8000, description="Length of the schedule in steps.")
    max_minutes: float = Field(100.0, description="The cosine also follows the clock and the run stops there.")
    log_every: int = Field(20, description="Steps between train rows of curve.jsonl.")
    probe_every: int = Field(300, description="Steps between held-out probes (teacher-forced exact answers).")
    probe_items: int = Field(40, description="Held-out items per question kind in the in-training probe.")
    probe_kinds: list[str] | None = Field(None, description="Question kinds the in-training probe asks (None: all).")
    save_every_minutes: float = Field(10.0, description="Minutes between resumable checkpoints (work/last.pt).")
    threads: int = Field(2, description="Torch CPU threads (and screen-collection processes).")
    seed: int = Field(1, description="Seeds the initial weights and the data stream (not the screens).")
    device: str = Field("cpu", description="Torch device of the model and batches (cuda where a GPU is lent).")
    data_workers: int = Field(0, description="Processes drawing sequences beside the loop (0: in the loop).")
    attn_sup: float = Field(0.1, description="Weight of the loss pointing the copy head at a copied token's source.")
    attn_sup_layer: int = Field(-1, description="Decoder layer of the supervised copy head (negative: from the top).")
    attn_sup_heads: int = Field(1, description="How many of that layer's heads are supervised (the first ones).")
    copy_readout: float = Field(0.1, description="Weight of the loss on what the copy head writes from its source.")

    @model_validator(mode="after")
    def _readout_needs_attn(self) -> TrainConfig:
        if self.copy_readout > 0 and self.attn_sup <= 0:
            raise ValueError("copy_readout reads the supervised head: it needs attn_sup > 0")
        return self


class Recipe(_Strict):
    """The tiny base's recipe (``configs/tiny.yaml``); the defaults are the released one."""

    model: Shape = Field(default_factory=Shape, description="Model shape.")
    data: DataConfig = Field(default_factory=DataConfig, description="Screen-reading sequences.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation and run settings.")
    vocab_size: int = Field(4096, description="Byte-level BPE vocabulary trained on train-split screens.")
    spaces: Literal["prefix", "split"] = Field("split", description="Tokenizer: a space is its own token (split).")
    n_train_per_template: int | None = Field(None, description="Train tasks per template for screens (None: all).")
    explore: float = Field(0.5, description="Share of tasks that add 1-3 off-policy screens.")
    render: float = Field(0.1, description="Share of train tasks whose screens keep a screenshot.")
    probe_per_template: int = Field(3, description="Test-split tasks per template for the held-out screens.")
    states_seed: int = Field(0, description="Seeds the screens (held out: +1) and the tokenizer's sample.")

    @field_validator("model", mode="before")
    @classmethod
    def _from_tiny_shape(cls, v: Any) -> Any:
        return asdict(v) if isinstance(v, TinyShape) else v

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Recipe:
        """Validate ``d``; a ``ValueError`` names each bad key (``data.copy_punct: Extra inputs ...``)."""
        try:
            return cls.model_validate(d)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise ValueError(f"tiny-base recipe: {problems}") from None

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> Recipe:
        """A recipe recorded by a run (``tiny.json``'s ``profile``, ``last.pt``): retired options are dropped
        where they hold the value the code now has; any other value is an error naming the key."""
        d = {k: dict(v) if isinstance(v, Mapping) else v for k, v in d.items()}
        for key, value in RETIRED.items():
            part, _, name = key.rpartition(".")
            where = d.get(part) if part else d
            if isinstance(where, dict) and name in where:
                if where[name] != value:
                    raise ValueError(f"tiny-base recipe: {key}={where[name]!r} is a removed option "
                                     f"(the code now always has {value!r})")
                del where[name]
        return cls.parse(d)


def load_recipe(path: Path | str, overrides: Sequence[str] = ()) -> Recipe:
    """Read a recipe YAML; ``overrides`` are ``section.key=value`` strings (YAML values)."""
    import yaml

    d = yaml.safe_load(Path(path).read_text()) or {}
    for o in overrides:
        key, _, val = o.partition("=")
        parts = key.split(".")
        cur = d
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = yaml.safe_load(val)
    return Recipe.parse(d)
