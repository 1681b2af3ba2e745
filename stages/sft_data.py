"""Stage `sft_data`: the reasoning-free SFT dataset (LLaMA-Factory sharegpt multimodal) from the stores.

One sample per step — task, history of previous actions, current screenshot and/or compressed XML
(``mode``) → action, under the ``prompt_style`` system prompt (:mod:`mobilerl.agent.prompt`; the tiny
profile reads the XML alone with the compact prompt, the large profiles screenshot+xml with the full one) —
from the sources of ``data/collect/stores`` that exist (``collected``, ``human``, ``androidcontrol``),
deduplicated, split by task into train/validation, each source's train samples resampled by its mixing
weight (MobileRL Table 7 mixes human annotations with AndroidControl). The prompt format is recorded in
``stats.json``: the SFT stages check it against the profile and the reasoning stages reuse it.
Only data whose privacy audit passed is used (``data/privacy/metrics.json``).

Outs: ``data/sft/dataset/`` (``dataset_info.json``, ``train.json``, ``val.json``, ``images/``);
metrics: ``data/sft/metrics.json``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, load_params, read_json, write_json

STORES = ROOT / "data" / "collect" / "stores"
AUDIT = ROOT / "data" / "privacy" / "metrics.json"
OUT = ROOT / "data" / "sft"


class SourceConfig(StageConfig):
    weight: float = Field(1.0, ge=0, description="Mixing weight: train samples are resampled by it.")
    variant: Literal["high", "low", "both"] = Field("high", description="high: goal + history; low: step instruction.")
    only_success: bool = Field(True, description="Skip episodes that did not succeed.")


class SftDataConfig(StageConfig):
    sources: dict[Literal["collected", "human", "androidcontrol"], SourceConfig] = Field(
        default_factory=lambda: {"collected": SourceConfig(), "human": SourceConfig(),
                                 "androidcontrol": SourceConfig(variant="both")},
        description="Sources by store name, with their mixing weights (missing stores are skipped).")
    mode: Literal["xml", "screenshot", "screenshot+xml"] = Field(
        "screenshot+xml", description="Observation mode (the tiny model reads the XML; screenshots cost tokens).")
    prompt_style: Literal["full", "compact"] = Field(
        "full", description="System prompt: full (action space spelled out; large profiles) or compact (tiny).")
    coords: Literal["abs", "rel", "marks"] = Field(
        "abs", description="Coordinate frame of screen bounds and actions: abs (pixels, the paper's), rel "
                           "(the 0-999 grid) or marks (numbered lines, index actions); the base's frame.")
    reasoning: bool = Field(False, description="Keep <think> of the data (reasoning-free SFT: false).")
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Fraction of tasks held out for validation.")
    max_history: int | None = Field(
        None, ge=0, description="Previous responses shown (null: all); the profile's generation.max_history.")
    image_max_side: int | None = Field(None, ge=28, description="Downscale images (null: as stored).")
    name: str = Field("mobilerl_sft", description="Dataset name prefix in dataset_info.json.")
    action_weights: dict[str, float] = Field(
        default_factory=dict, description="Train resampling weight by action name (e.g. {Finish: 3.0}: the "
                                          "rare decision to stop seen 3x as often); unnamed actions weigh 1.")
    seed: int = Field(0, description="Split and resampling seed.")
    require_audit: bool = Field(True, description="Refuse data whose privacy audit did not pass.")


def run(cfg: SftDataConfig) -> dict:
    from mobilerl.data.sft import SftSource, build_sft

    if cfg.require_audit:
        audit = read_json(AUDIT)
        if not audit.get("passed"):
            raise SystemExit(f"sft_data: the privacy audit did not pass ({AUDIT}); no dataset is built")
    sources = [SftSource(name, STORES / name, weight=s.weight, variant=s.variant, only_success=s.only_success)
               for name, s in cfg.sources.items() if (STORES / name / "trajectories.parquet").exists()]
    if not sources:
        raise SystemExit(f"sft_data: none of the sources {list(cfg.sources)} exists under {STORES}")
    return build_sft(sources, OUT / "dataset", mode=cfg.mode, style=cfg.prompt_style, coords=cfg.coords,
                     reasoning=cfg.reasoning,
                     val_fraction=cfg.val_fraction, seed=cfg.seed, max_history=cfg.max_history,
                     image_max_side=cfg.image_max_side, name=cfg.name, action_weights=cfg.action_weights)


def main() -> None:
    cfg = load_params("sft_data", SftDataConfig)
    with tracking.stage_run("sft_data", cfg.model_dump()) as run_:
        stats = run(cfg)
        tracking.log_metrics({"sft_data": {"train": stats["train"], "val": stats["val"], "images": stats["images"],
                                           **{f"sources/{k}": v for k, v in stats["sources"].items()}}})
        stats["mlflow_run_id"] = run_.info.run_id
    write_json(OUT / "metrics.json", stats)
    print(f"sft_data: {stats['train']} train / {stats['val']} val samples, {stats['images']} images; "
          + ", ".join(f"{k}: {v.get('train_after_weight', 0)} train" for k, v in stats["sources"].items()))


if __name__ == "__main__":
    main()
