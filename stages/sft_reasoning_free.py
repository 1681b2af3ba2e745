"""Stage `sft_reasoning_free`: LLaMA-Factory SFT of the profile's base on the expert data (answers only).

Reads ``data/sft/dataset`` (built by `sft_data`), trains with the profile's SFT settings (paper §B.1 for
the large profiles: packing, cosine 1e-5 → 1e-6, 2 epochs, DeepSpeed; the tiny profile's CPU schedule is
in ``configs/models/tiny.yaml``), writes the HF checkpoint to ``data/checkpoints/sft_reasoning_free``
(loadable by :func:`mobilerl.models.backends.make_backend`) and registers it in MLflow with the alias
``reasoning-free-sft``. Loss curve and tokens/s go to MLflow; metrics: ``data/checkpoints/sft_reasoning_free.json``.
The dataset's prompt format must be the one the profile evaluates with (:mod:`mobilerl.sft.train`).

``python -m stages.sft_reasoning_free sft_random_init`` runs the same training on the ``sft_random_init``
params section (``init: random``: the counterfactual of the tiny base) into ``data/checkpoints/sft_random_init``.
"""

from __future__ import annotations

import sys

from mobilerl.config import ROOT, load_params, write_json
from mobilerl.sft.train import SFTConfig, summary_line, train_registered

CHECKPOINTS = ROOT / "data" / "checkpoints"


def main() -> None:
    section = sys.argv[1] if len(sys.argv) > 1 else "sft_reasoning_free"
    cfg = load_params(section, SFTConfig)
    out = CHECKPOINTS / section
    metrics = train_registered(section, cfg, out)
    write_json(CHECKPOINTS / f"{section}.json", metrics)
    print(summary_line(section, cfg, metrics))


if __name__ == "__main__":
    main()
