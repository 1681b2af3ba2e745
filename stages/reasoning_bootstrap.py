"""Stage `reasoning_bootstrap`: an instruct model M explains the expert's steps; matching explanations are kept.

Bootstrap sampling (MobileRL §2.1, :mod:`mobilerl.sft.bootstrap`): M proposes ``k`` reasoning–action
candidates for every expert step of the episodes the reasoning-free SFT dataset was built from; a candidate
is kept when its action equals the expert's. The result is the reasoning set D_0 that `reasoning_refine`
starts from. M is the profile's ``reasoning.teacher``: a generation backend spec (an instruct model behind an
OpenAI-compatible server for the large profiles) or, for the embedded default, ``{kind: sim}``.

Outs: ``data/reasoning/bootstrap/`` — ``dataset_info.json`` (``<name>_train`` / ``<name>_val``), ``train.json``,
``val.json``, ``explanations.json`` (step id → kept response: the set's state), ``proposals.jsonl`` (every
candidate with its verdict); metrics ``data/reasoning/bootstrap.json`` (acceptance rates).
"""

from __future__ import annotations

import time

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, repo_path, write_json
from mobilerl.sft.bootstrap import BootstrapConfig, bootstrap

STORES = ROOT / "data" / "collect" / "stores"
OUT = ROOT / "data" / "reasoning" / "bootstrap"


def main() -> None:
    cfg = load_params("reasoning_bootstrap", BootstrapConfig)
    t0 = time.perf_counter()
    with tracking.stage_run("reasoning_bootstrap", cfg.model_dump()) as run_:
        metrics = bootstrap(cfg, repo_path(cfg.sft_dataset), STORES, OUT)
        metrics["wall_s"] = time.perf_counter() - t0
        tracking.log_metrics({"bootstrap": metrics})
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(OUT.with_suffix(".json"), metrics)
    print(f"reasoning_bootstrap: {metrics['accepted_steps']}/{metrics['steps']} steps explained "
          f"(acceptance {metrics['acceptance_rate']:.1%}, candidates {metrics['candidate_acceptance']:.1%}); "
          f"{metrics['train']} train / {metrics['val']} val records in {metrics['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
