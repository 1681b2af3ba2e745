"""Stage `sft_reasoning`: the final reasoning corpus trained from the reasoning-free checkpoint (MobileRL §2.1).

"The resulting reasoning-oriented fine-tuning corpus is trained for two epochs to produce the reasoning
warm-up model": the refined set D_T (``data/reasoning/refine``, `reasoning_refine`) is trained with
LLaMA-Factory from ``data/checkpoints/sft_reasoning_free`` with the profile's SFT settings (2 epochs for
the large profiles; the tiny profile's CPU budget is in ``configs/models/tiny.yaml`` and ``overrides``).
Writes ``data/checkpoints/sft_reasoning`` and registers it with the MLflow alias ``reasoning-sft``; the same
training as `sft_reasoning_free` (:func:`mobilerl.sft.train.train`). Metrics: ``data/checkpoints/sft_reasoning.json``.
"""

from __future__ import annotations

from mobilerl.config import ROOT, load_params, write_json
from mobilerl.sft.train import SFTConfig, summary_line, train_registered

CHECKPOINTS = ROOT / "data" / "checkpoints"
SECTION = "sft_reasoning"


def main() -> None:
    cfg = load_params(SECTION, SFTConfig)
    out = CHECKPOINTS / SECTION
    metrics = train_registered(SECTION, cfg, out)
    write_json(CHECKPOINTS / f"{SECTION}.json", metrics)
    print(summary_line(SECTION, cfg, metrics))


if __name__ == "__main__":
    main()
