"""Stage `sft_reasoning_free`: LLaMA-Factory SFT of the profile's base on the expert data (answers only).

Reads ``data/sft/dataset`` (built by `sft_data`), trains with the profile's SFT settings (paper §B.1 for
the large profiles: packing, cosine 1e-5 → 1e-6, 2 epochs; the tiny profile's CPU schedule is in
``configs/models/tiny.yaml``), writes the HF checkpoint to ``data/checkpoints/sft_reasoning_free`` and
registers it in MLflow with the alias ``reasoning-free-sft``. Loss curve and tokens/s go to MLflow.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mobilerl import tracking
from stages.common import ROOT, StageConfig, load_params, write_json

DATASET = ROOT / "data" / "sft" / "dataset"
OUT = ROOT / "data" / "checkpoints" / "sft_reasoning_free"


class SFTStageConfig(StageConfig):
    profile: str = Field("tiny", description="Model profile in configs/models/.")
    base: str | None = Field(None, description="Starting weights (repo-relative); None: the profile's weights.")
    dataset: str = Field("mobilerl_sft_train", description="Dataset name in data/sft/dataset/dataset_info.json.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="Extra LLaMA-Factory arguments (e.g. max_steps for smoke runs).")
    registered_model: str = Field("mobilerl-policy", description="MLflow registered model name.")
    alias: str = Field("reasoning-free-sft", description="MLflow alias of the registered version.")


def train(cfg: SFTStageConfig, dataset_dir, out) -> dict[str, Any]:
    from mobilerl.models.profiles import load_profile
    from mobilerl.sft.llamafactory import run, train_args

    profile = load_profile(cfg.profile)
    base = ROOT / cfg.base if cfg.base else profile.weights_path
    if not base.exists():
        raise FileNotFoundError(f"{cfg.profile}: starting weights {base} not found")
    args = train_args(profile, dataset=cfg.dataset, dataset_dir=dataset_dir, output_dir=out, model_path=base,
                      overrides=cfg.overrides)
    result = run(args)
    for step, loss in result.losses:
        tracking.log_metrics({"loss/train": loss}, step=step)
    metrics = {"first_loss": result.first_loss, "final_loss": result.final_loss, "steps": len(result.losses),
               "train_runtime_s": result.train_runtime_s, "tokens_per_s": result.tokens_per_s,
               "wall_s": result.wall_s, "base": str(base.relative_to(ROOT) if base.is_relative_to(ROOT) else base)}
    tracking.log_metrics({"sft": {k: v for k, v in metrics.items() if isinstance(v, int | float)}})
    return metrics


def main(section: str = "sft_reasoning_free") -> None:
    cfg = load_params(section, SFTStageConfig)
    out = ROOT / "data" / "checkpoints" / section
    with tracking.stage_run(section, cfg.model_dump()):
        metrics = train(cfg, DATASET, out)
        metrics["registered_version"] = tracking.register_model(out, cfg.registered_model, cfg.alias)
    write_json(out / "metrics.json", metrics)
    print(f"{section}: loss {metrics['first_loss']} -> {metrics['final_loss']} in {metrics['wall_s']:.0f}s, "
          f"{metrics['tokens_per_s']} tokens/s; registered {cfg.registered_model}@{cfg.alias}")


if __name__ == "__main__":
    main()
