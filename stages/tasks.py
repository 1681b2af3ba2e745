"""Stage `tasks`: materialise the simulator's task suites and check the oracle on every test task.

Outs: ``data/tasks/suites/{suite}_{split}.jsonl`` (one TaskSpec per line); metrics:
``data/tasks/metrics.json`` (counts, difficulty mix, oracle success per suite).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, load_params, write_json
from mobilerl.tasks import write_task_lists

OUT = ROOT / "data" / "tasks"


class TasksConfig(StageConfig):
    suites: list[Literal["world", "lab"]] = Field(["world", "lab"], description="Suites to materialise.")
    n_train: int | None = Field(
        None, ge=1, description="Train instances per template (null: the suite default, world 40 / lab 30).")
    n_test: int | None = Field(
        None, ge=1, description="Test instances per template (null: the fixed test variations, world 20 / lab 5).")
    oracle_perturb: str = Field("default", description="Perturbation profile of the oracle check.")
    check_oracle: bool = Field(True, description="Run the oracle over every test task (must reach 100%).")


def main() -> None:
    cfg = load_params("tasks", TasksConfig)
    with tracking.stage_run("tasks", cfg.model_dump()) as run:
        metrics = write_task_lists(OUT / "suites", cfg.suites, n_train=cfg.n_train, n_test=cfg.n_test,
                                   check_oracle=cfg.check_oracle, perturb=cfg.oracle_perturb)
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
