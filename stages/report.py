"""Stage `report`: the Markdown report, its plots and the DVC metrics file, from the evaluation summary.

Reads ``data/eval/summary.json`` (one summary per policy × suite; beside it ``offline.json``, the
checkpoints' offline step accuracy, and ``sampled.json``, the pass@k sampling study) and writes
``reports/report.md``, ``reports/figures/*.png`` and ``reports/metrics.json``
(:func:`mobilerl.eval.report.build_report`), with the `rl` stage's curve and, per template, the RL init's and the RL
policy's world/test episodes when they exist, and the ablation study's aggregate
(``experiments/ablation/summary.json``, written by deployment ``mobilerl/ablation``); the report folder goes to MLflow
as artifacts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, read_json, write_json
from mobilerl.eval.report import RL_AFTER, RL_BEFORE, ReportConfig, build_report, template_table
from mobilerl.trajectory import read_jsonl

SUMMARY = ROOT / "data" / "eval" / "summary.json"
OFFLINE = ROOT / "data" / "eval" / "offline.json"  # checkpoint policies only; absent in older runs
SAMPLED = ROOT / "data" / "eval" / "sampled.json"  # the pass@k sampling study (evaluate.pass_k); absent in older runs
RL_CURVE = ROOT / "data" / "checkpoints" / "adagrpo.curve.jsonl"
TRAJECTORIES = ROOT / "data" / "eval" / "trajectories"
REWARD = ROOT / "data" / "reward" / "metrics.json"  # the reward_model stage's held-out figures
REWARD_EXAMPLES = ROOT / "data" / "reward" / "eval" / "examples"
ABLATION = ROOT / "experiments" / "ablation" / "summary.json"  # the `ablation` deployment's aggregate (git-tracked)
REPORTS = ROOT / "reports"


def world_episodes(policy: str) -> Path | None:
    """``policy``'s world/test episodes: all tasks' where ``evaluate.world_all`` ran it, else the spread subset's."""
    return next((f for s in ("world_all", "world") if (f := TRAJECTORIES / f"{policy}__{s}.jsonl").is_file()), None)


def main() -> None:
    cfg = load_params("report", ReportConfig)
    summary = read_json(SUMMARY)
    offline = read_json(OFFLINE) if OFFLINE.is_file() else {}
    sampled = read_json(SAMPLED) if SAMPLED.is_file() else {}
    curve = [json.loads(x) for x in RL_CURVE.read_text().splitlines()] if RL_CURVE.is_file() else []
    world = {p: read_jsonl(f) for p in (RL_BEFORE, RL_AFTER) if (f := world_episodes(p))}
    reward = read_json(REWARD) if REWARD.is_file() else None
    ablation = read_json(ABLATION) if ABLATION.is_file() else None
    examples = []
    if reward and REWARD_EXAMPLES.is_dir():
        (REPORTS / "figures").mkdir(parents=True, exist_ok=True)
        for png in sorted(REWARD_EXAMPLES.glob("right_*.png"))[:2] + sorted(REWARD_EXAMPLES.glob("wrong_*.png"))[:2]:
            shutil.copyfile(png, REPORTS / "figures" / f"reward_{png.name}")
            examples.append(f"reward_{png.name}")
    with tracking.stage_run("report", cfg.model_dump()) as run:
        md, metrics = build_report(summary, cfg, REPORTS / "figures", offline, sampled, curve,
                                   template_table(world, RL_BEFORE, RL_AFTER), reward, examples, ablation)
        (REPORTS / "report.md").write_text(md)
        metrics["report_mlflow_run_id"] = run.info.run_id
        write_json(REPORTS / "metrics.json", metrics)
        import mlflow

        mlflow.log_artifacts(str(REPORTS), artifact_path="report")
    print(f"report: {REPORTS / 'report.md'}")


if __name__ == "__main__":
    main()
