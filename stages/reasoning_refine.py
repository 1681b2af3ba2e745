"""Stage `reasoning_refine`: iterative refinement of the reasoning set by the policy itself (MobileRL §2.1).

Starting from the bootstrap set D_0 (`reasoning_bootstrap`), each of T rounds trains π_t on D_{t-1}, lets
π_t propose explanations for the train steps and keeps the best-scored matching one per step: D_t
(:mod:`mobilerl.sft.refine`). The acceptance rate is recorded per round. D_T is the final reasoning corpus
(`sft_reasoning` trains it from the reasoning-free checkpoint); π_T's weights are kept as
``data/checkpoints/reasoning_refine``.

Outs: ``data/reasoning/refine/`` (the dataset, ``explanations.json``, ``rounds.json``),
``data/checkpoints/reasoning_refine/``; metrics ``data/reasoning/refine.json``.
"""

from __future__ import annotations

import time

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, repo_path, write_json
from mobilerl.sft.refine import RefineConfig, refine

STORES = ROOT / "data" / "collect" / "stores"
OUT = ROOT / "data" / "reasoning" / "refine"
CHECKPOINT = ROOT / "data" / "checkpoints" / "reasoning_refine"


def main() -> None:
    cfg = load_params("reasoning_refine", RefineConfig)
    t0 = time.perf_counter()
    with tracking.stage_run("reasoning_refine", cfg.model_dump()) as run_:
        metrics = refine(cfg, repo_path(cfg.bootstrap), STORES, OUT, CHECKPOINT)
        metrics["wall_s"] = time.perf_counter() - t0
        tracking.log_metrics({"refine/final": {"train": metrics["train"], "val": metrics["val"],
                                               "wall_s": metrics["wall_s"]}})
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(OUT.with_suffix(".json"), metrics)
    print(f"reasoning_refine: {cfg.rounds} rounds, acceptance per round "
          + ", ".join(f"{a:.1%}" for a in metrics["acceptance_rate"].values())
          + f"; {metrics['train']} train records in {metrics['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
