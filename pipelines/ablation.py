"""Deployment ``mobilerl/ablation``: AdaGRPO's ablations and peer options, variants × seeds (MobileRL Table 4c).

Each cell (variant × seed, ``configs/ablation.yaml``) runs in its own process, ``python -m mobilerl.rl.ablation
<cell dir>``: the `rl` stage's code with the variant's overrides, training in ``experiments/ablation/<variant>/
seed<k>/`` (its own ``work``/``out``), then the greedy evaluation (:mod:`mobilerl.rl.ablation`); the reference
cell ``init/seed0`` evaluates the RL init the same way, untrained (what the variants add to it). The flow is
resumable: a cell whose ``result.json`` matches its config is skipped, a killed one resumes from its last rl
checkpoint, and a failed cell leaves the others' results in place (the flow fails at the end, naming it).

MLflow: one parent run ``ablation``; a nested run per cell, ``<variant>/seed<k>``, tagged ``variant`` and
``seed``, params the variant's overrides, metrics the rl curve's keys per round and ``eval/*``: the same keys in
every cell, so the UI's compare view overlays them. Then ``experiments/ablation/summary.json``
(:func:`mobilerl.eval.ablation.aggregate`) and the `report` stage (``dvc repro --single-item report``).

    python -m pipelines.ablation --variants full no_spa --seeds 0 --rounds 2 --eval-per-template 1
    prefect deployment run mobilerl/ablation -p variants='["full","no_spa"]' -p seeds='[0]'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task

from mobilerl import tracking
from mobilerl.config import PARAMS, write_json
from mobilerl.eval.ablation import aggregate, read_cells
from mobilerl.rl.ablation import CELLS, INIT, TABLE, cell_dir, cell_spec, is_done, load_table
from pipelines.flow import OFFLINE_ENV, ROOT

CELL_CMD = [sys.executable, "-m", "mobilerl.rl.ablation"]  # + the cell's folder


@task(retries=1, retry_delay_seconds=5, task_run_name="cell-{variant}-seed{seed}")
def run_cell(variant: str, seed: int, where: str, env: dict[str, str]) -> dict[str, Any]:
    """One cell in its own process (its output in ``<cell>/log.txt``); a retry resumes from its checkpoint."""
    log = get_run_logger()
    out = Path(where) / "log.txt"
    with out.open("a") as f:
        proc = subprocess.run([*CELL_CMD, where], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    tail = out.read_text().splitlines()[-15:]
    if proc.returncode != 0:
        for line in tail:
            log.error("%s/seed%d | %s", variant, seed, line)
        raise RuntimeError(f"cell {variant}/seed{seed} failed (exit {proc.returncode}); log: {out}")
    result = json.loads((Path(where) / "result.json").read_text())
    log.info("%s/seed%d: eval success %.3f on %d tasks in %.1f min", variant, seed, result["eval"]["success_rate"],
             result["eval"]["n_tasks"], result["time"]["total_s"] / 60)
    return result


def log_cell(spec: dict[str, Any], where: Path, result: dict[str, Any] | None, parent: str) -> str:
    """The cell's nested MLflow run: its whole curve (a failed cell: the rounds it finished) and evaluation."""
    partial = where / "work" / "curve.jsonl"
    if result is not None:
        curve = result["curve"]
    else:
        curve = [json.loads(x) for x in partial.read_text().splitlines()] if partial.is_file() else []
    metrics = {}
    if result:
        metrics = {**result["eval_summary"], "eval/steps_success": result["eval"]["steps_success"],
                   "time/cell_s": result["time"]["total_s"]}
    params = {**spec["overrides"], "seed": spec["seed"], "rounds": spec["rl"]["rounds"] if spec.get("train", True) else 0,
              "eval_per_template": spec["eval"]["per_template"]}
    tags = {"variant": spec["variant"], "seed": str(spec["seed"]), "mobilerl.stage": "ablation",
            "mobilerl.cell": str(where.relative_to(ROOT) if where.is_relative_to(ROOT) else where)}
    return tracking.log_run(f"{spec['variant']}/seed{spec['seed']}", parent, params, tags, curve, metrics,
                            failed=result is None)


@flow(name="mobilerl", log_prints=True)
def ablation(variants: list[str] | None = None, seeds: list[int] | None = None, rounds: int | None = None,
             eval_per_template: int | None = None, report: bool = True, dry_run: bool = False) -> dict[str, Any]:
    """AdaGRPO ablations: ``variants`` (None: configs/ablation.yaml's ``default``) × ``seeds`` (None: 0, 1, 2),
    ``rounds`` RL rounds a cell (None: the table's ``cell.rounds``) and ``eval_per_template`` greedy test tasks per
    template (None: the table's); ``dry_run`` lists the cells and which are done without running any."""
    log = get_run_logger()
    table = load_table(TABLE)
    names = list(table.default if variants is None else variants)
    seeds = [0, 1, 2] if seeds is None else list(seeds)
    base = (yaml.safe_load(PARAMS.read_text()) or {}).get("rl") or {}
    # every cell's config is validated before the first one runs: a typo must not surface after an hour; the
    # reference cell (the RL init, greedy evaluation only: one seed) first
    cells = [(cell_spec(table, v, s, base, ROOT, CELLS, rounds, eval_per_template), cell_dir(v, s, CELLS))
             for v, ss in [(INIT, [0]), *((v, seeds) for v in names)] for s in ss]
    plan = [{"variant": sp["variant"], "seed": sp["seed"], "done": is_done(sp, w)} for sp, w in cells]
    log.info("%d cell(s), %d done: %s", len(plan), sum(p["done"] for p in plan),
             ", ".join(f"{p['variant']}/seed{p['seed']}{' (done)' if p['done'] else ''}" for p in plan))
    if dry_run:
        return {"cells": plan}
    from prefect.runtime import flow_run

    os.environ[tracking.FLOW_RUN_ENV] = str(flow_run.get_id() or "")  # the runs' mobilerl.prefect_flow_run_id tag
    env = {**os.environ, **OFFLINE_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "MLFLOW_TRACKING_URI": tracking.tracking_uri()}
    statuses, failed = [], []
    params = {"variants": names, "seeds": seeds, "rounds": rounds or table.cell.get("rounds"),
              "eval_per_template": eval_per_template or table.eval.per_template}
    with tracking.pipeline_run("ablation", params) as parent:
        for spec, where in cells:
            status = "done earlier"
            if not is_done(spec, where):
                where.mkdir(parents=True, exist_ok=True)
                write_json(where / "cell.json", spec)
                state = run_cell(spec["variant"], spec["seed"], str(where), env, return_state=True)
                status = "ran" if state.is_completed() else "failed"
            result = json.loads((where / "result.json").read_text()) if status != "failed" else None
            if result is None:
                failed.append(f"{spec['variant']}/seed{spec['seed']}")
            run_id = log_cell(spec, where, result, parent.info.run_id)
            statuses.append({"variant": spec["variant"], "seed": spec["seed"], "status": status,
                             "success_rate": result["eval"]["success_rate"] if result else None,
                             "mlflow_run_id": run_id})
        summary = aggregate(read_cells(CELLS), [INIT, *table.variants])
        write_json(CELLS / "summary.json", summary)
        import mlflow

        mlflow.log_artifact(str(CELLS / "summary.json"))
        out = {"cells": statuses, "summary": str(CELLS / "summary.json"), "mlflow_parent_run_id": parent.info.run_id,
               "mlflow_ui": tracking.ui_url(parent.info.experiment_id,  # this flow run's cells only
                                            f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"),
               "mlflow_compare": tracking.compare_url(parent.info.experiment_id, [s["mlflow_run_id"] for s in statuses]),
               "report": None}
        if report:  # DVC re-runs the report stage: summary.json is one of its deps
            proc = subprocess.run([sys.executable, "-m", "dvc", "repro", "--single-item", "report"], cwd=ROOT,
                                  env={**env, tracking.PARENT_ENV: parent.info.run_id}, capture_output=True, text=True)
            if proc.returncode != 0:
                log.warning("report not updated (dvc repro --single-item report, exit %d): %s", proc.returncode,
                            proc.stderr.strip()[-500:])
            else:
                out["report"] = str(ROOT / "reports" / "report.md")
    for s in statuses:
        log.info("%-18s seed %d  %-12s %s", s["variant"], s["seed"], s["status"],
                 "–" if s["success_rate"] is None else f"{s['success_rate']:.3f}")
    log.info("MLflow (make ui): %s — Group by: variant overlays the variants (seeds' mean and range); the cells "
             "side by side: %s", out["mlflow_ui"], out["mlflow_compare"])
    if failed:
        raise RuntimeError(f"{len(failed)} cell(s) failed: {', '.join(failed)}; the others' results are in "
                           f"{CELLS}; rerun to retry them (finished cells are skipped)")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Run the ablation flow here (Prefect starts a temporary local API).")
    ap.add_argument("--variants", nargs="+", help="variant names (default: configs/ablation.yaml's default)")
    ap.add_argument("--seeds", nargs="+", type=int, help="seeds (default: 0 1 2)")
    ap.add_argument("--rounds", type=int, help="RL rounds a cell (default: the table's cell.rounds)")
    ap.add_argument("--eval-per-template", type=int, help="greedy test tasks per template (default: the table's)")
    ap.add_argument("--no-report", action="store_true", help="do not re-run the report stage afterwards")
    ap.add_argument("--dry-run", action="store_true", help="list the cells and which are done; run nothing")
    ap.add_argument("--list", action="store_true", help="print the variants and their overrides, then exit")
    args = ap.parse_args(argv)
    if args.list:
        table = load_table(TABLE)
        for v, o in table.variants.items():
            print(f"{v:<18}{'*' if v in table.default else ' '} {json.dumps(o)}")
        print("(* default)")
        return
    out = ablation(variants=args.variants, seeds=args.seeds, rounds=args.rounds,
                   eval_per_template=args.eval_per_template, report=not args.no_report, dry_run=args.dry_run)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
