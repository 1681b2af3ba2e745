"""Stage `sft_reasoning`: the final reasoning corpus trained from the reasoning-free checkpoint (MobileRL §2.1).

"The resulting reasoning-oriented fine-tuning corpus is trained for two epochs to produce the reasoning
warm-up model": the refined set D_T (``data/reasoning/refine``, `reasoning_refine`) is trained with
LLaMA-Factory from ``data/checkpoints/sft_reasoning_free`` with the profile's SFT settings (2 epochs for
the large profiles; the tiny profile's CPU budget is in ``configs/models/tiny.yaml`` and ``overrides``).
Writes ``data/checkpoints/sft_reasoning`` and registers it with the MLflow alias ``reasoning-sft``; the same
code as `sft_reasoning_free` (:func:`stages.sft_reasoning_free.main`). Metrics: ``data/checkpoints/sft_reasoning.json``.
"""

from __future__ import annotations

from stages.sft_reasoning_free import main

if __name__ == "__main__":
    main("sft_reasoning")
