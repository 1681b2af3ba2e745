"""Stage `sft_reasoning`: the final reasoning corpus trained from the reasoning-free checkpoint (MobileRL §2.1).

"The resulting reasoning-oriented fine-tuning corpus is trained for two epochs to produce the reasoning
warm-up model": the refined set D_T (``data/reasoning/refine``, `reasoning_refine`) is trained with
LLaMA-Factory from ``data/checkpoints/sft_reasoning_free`` with the profile's SFT settings (2 epochs for
the large profiles; the tiny profile's CPU budget is in ``configs/models/tiny.yaml`` and ``overrides``).
Writes ``data/checkpoints/sft_reasoning`` and registers it with the MLflow alias ``reasoning-sft``; the same
training as `sft_reasoning_free` (:func:`mobilerl.sft.train.train`). Metrics: ``data/checkpoints/sft_reasoning.json``.
"""

from __future__ import annotations

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, write_json
from mobilerl.sft.train import SFTConfig, train

CHECKPOINTS = ROOT / "data" / "checkpoints"
SECTION = "sft_reasoning"


def main() -> None:
    cfg = load_params(SECTION, SFTConfig)
    out = CHECKPOINTS / SECTION
    with tracking.stage_run(SECTION, cfg.model_dump()) as run_:
        metrics = train(cfg, out)
        metrics["registered_version"] = tracking.register_model(out, cfg.registered_model, cfg.alias)
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(CHECKPOINTS / f"{SECTION}.json", metrics)
    tps = metrics["tokens_per_s"]
    print(f"{SECTION}: loss {metrics['first_loss']:.3f} -> {metrics['final_loss']:.3f} in {metrics['steps']} steps, "
          f"{metrics['wall_s']:.0f}s, {tps:.0f} tokens/s; registered {cfg.registered_model}@{cfg.alias} "
          f"v{metrics['registered_version']}")


if __name__ == "__main__":
    main()
