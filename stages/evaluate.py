"""Stage `evaluate`: every policy × every benchmark, all episodes concurrent through the env pool.

Policies are named in params: ``oracle`` and ``random`` are the baselines that are always present; any other
name is a checkpoint listed under ``checkpoints`` (name -> repo-relative model directory), served and prompted
as the model ``profile`` says (:mod:`mobilerl.eval.checkpoints`). The run itself is
:func:`mobilerl.eval.benchmark.evaluate_policies`; the config is :class:`mobilerl.eval.config.EvaluateConfig`.

Outs: one JSONL of trajectories per (policy, suite) under ``data/eval/trajectories/`` (and
``<name>__<suite>__sampled.jsonl`` of the pass@k study); metrics: ``data/eval/summary.json`` (the summary of
each (policy, suite) with the id of the nested MLflow run it was logged to), ``data/eval/offline.json``
(offline step accuracy, AndroidControl-style) and ``data/eval/sampled.json`` (the pass@k study).
"""

from __future__ import annotations

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, write_json
from mobilerl.eval.benchmark import evaluate_policies
from mobilerl.eval.config import EvaluateConfig, check_policies

OUT = ROOT / "data" / "eval"


def main() -> None:
    cfg = load_params("evaluate", EvaluateConfig)
    check_policies(cfg)  # before anything runs: a typo must not surface after an hour of baselines
    with tracking.stage_run("evaluate", cfg.model_dump()):
        summary, offline, sampled = evaluate_policies(cfg, OUT / "trajectories")
    write_json(OUT / "summary.json", summary)
    write_json(OUT / "offline.json", offline)
    write_json(OUT / "sampled.json", sampled)


if __name__ == "__main__":
    main()
