"""Stage `tasks`: materialise the simulator's task suites and check the oracle on every test task.

Outs: ``data/tasks/suites/{suite}_{split}.jsonl`` (one TaskSpec per line); metrics:
``data/tasks/metrics.json`` (counts, difficulty mix, oracle success per suite).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, load_params, write_json

OUT = ROOT / "data" / "tasks"


class TasksConfig(StageConfig):
    suites: list[Literal["world", "lab"]] = Field(["world", "lab"], description="Suites to materialise.")
    n_train: int | None = Field(None, ge=1, description="Train instances per template (None: suite default).")
    n_test: int | None = Field(None, ge=1, description="Test instances per template (None: the fixed set).")
    oracle_perturb: str = Field("default", description="Perturbation profile for the oracle check.")
    check_oracle: bool = Field(True, description="Run the oracle over every test task (must reach 100%).")


def build(cfg: TasksConfig, workers: int = 2) -> dict:
    """Every (suite, split) in its own process (``workers`` at a time): drawing parameters builds a device
    per instance and the oracle check runs every test task, so the splits are independent CPU work."""
    from concurrent.futures import ProcessPoolExecutor

    (OUT / "suites").mkdir(parents=True, exist_ok=True)
    jobs = [(suite, split, n, cfg.check_oracle, cfg.oracle_perturb)
            for suite in cfg.suites for split, n in (("test", cfg.n_test), ("train", cfg.n_train))]
    if workers <= 1:
        results = [_materialise(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            results = list(pool.map(_materialise, *zip(*jobs, strict=True)))
    return {f"{suite}_{split}": m for (suite, split, *_), m in zip(jobs, results, strict=True)}


def _materialise(suite: str, split: str, n: int | None, check_oracle: bool, perturb: str) -> dict:
    """Write ``{suite}_{split}.jsonl``; return its metrics (with the oracle's success on test splits)."""
    from mobilerl.env.sim import run_oracle
    from mobilerl.env.sim.tasks import list_tasks

    tasks = list_tasks(suite, split, n=n, with_optimal=split == "test")
    path = OUT / "suites" / f"{suite}_{split}.jsonl"
    with path.open("w") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    m: dict = {"tasks": len(tasks), "templates": len({t.template for t in tasks}),
               "apps": len({a for t in tasks for a in t.apps})}
    if split == "test":
        m["difficulty"] = dict(Counter(t.difficulty for t in tasks))
        if check_oracle:
            ok = sum(run_oracle(t, perturb=perturb).success for t in tasks)
            m["oracle_success_rate"] = ok / max(1, len(tasks))
    return m


def main() -> None:
    cfg = load_params("tasks", TasksConfig)
    with tracking.stage_run("tasks", cfg.model_dump()) as run:
        metrics = build(cfg)
        tracking.log_metrics({"tasks": metrics})
        metrics["mlflow_run_id"] = run.info.run_id
    write_json(OUT / "metrics.json", metrics)
    for key, m in metrics.items():
        if isinstance(m, dict):
            print(f"tasks: {key}: {m}")
    bad = {k: m["oracle_success_rate"] for k, m in metrics.items() if isinstance(m, dict)
           and m.get("oracle_success_rate", 1.0) < 1.0}
    if bad:
        raise SystemExit(f"tasks: the oracle does not solve every test task: {bad}")


if __name__ == "__main__":
    main()
