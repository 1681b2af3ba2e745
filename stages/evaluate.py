"""Stage `evaluate`: every policy × every benchmark, all episodes concurrent through the env pool.

Policies are named in params: ``oracle`` and ``random`` are the baselines that are always present;
checkpoint policies join as the training stages land. Outs: one JSONL of trajectories per
(policy, suite) under ``data/eval/trajectories/``; metrics: ``data/eval/summary.json`` — the summary of
each (policy, suite) with the id of the nested MLflow run it was logged to.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.env.base import TaskSpec
from stages.common import ROOT, StageConfig, load_params, write_json

TASKS = ROOT / "data" / "tasks" / "suites"
OUT = ROOT / "data" / "eval"


class EvaluateConfig(StageConfig):
    suites: list[Literal["world", "lab"]] = Field(["world", "lab"], description="Benchmarks to run.")
    split: Literal["test", "train"] = Field("test", description="Which split of each suite.")
    policies: list[str] = Field(["oracle", "random"], description="Policy names (baselines or checkpoints).")
    n_trials: int = Field(1, ge=1, description="Trials per task (pass@k needs n ≥ k).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of model policies.")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(16, ge=1, description="Episodes in flight (env pool size).")
    max_per_template: int | None = Field(None, ge=1, description="Cap on tasks per template (smoke runs).")
    seed: int = Field(0, description="Base seed of the policies' sampling.")


def load_tasks(suite: str, split: str, max_per_template: int | None = None) -> list[TaskSpec]:
    path = TASKS / f"{suite}_{split}.jsonl"
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            try:
                t = TaskSpec.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: corrupt task record: {e}") from None
            seen[t.template] = seen.get(t.template, 0) + 1
            if max_per_template is None or seen[t.template] <= max_per_template:
                tasks.append(t)
    return tasks


def make_policy_factory(name: str, temperature: float):
    from mobilerl.agent import OraclePolicy, RandomPolicy

    if name == "oracle":
        return lambda seed: OraclePolicy()
    if name == "random":
        return lambda seed: RandomPolicy(seed)
    raise ValueError(f"evaluate.policies: unknown policy {name!r} (known: oracle, random)")


def main() -> None:
    from mobilerl.eval import evaluate_sync, sim_template_texts, summarize

    cfg = load_params("evaluate", EvaluateConfig)
    factories = {name: make_policy_factory(name, cfg.temperature) for name in cfg.policies}
    summary: dict = {}
    (OUT / "trajectories").mkdir(parents=True, exist_ok=True)
    with tracking.stage_run("evaluate", cfg.model_dump()):
        for suite in cfg.suites:
            tasks = load_tasks(suite, cfg.split, cfg.max_per_template)
            texts = sim_template_texts(tasks)
            for name, factory in factories.items():
                with tracking.child_run(f"{name}/{suite}", "evaluate", policy=name, suite=suite) as run:
                    t0 = time.perf_counter()
                    trajs = evaluate_sync(factory, tasks, n_trials=cfg.n_trials, concurrency=cfg.concurrency,
                                          perturb=cfg.perturb, base_seed=cfg.seed, progress=False,
                                          out_path=OUT / "trajectories" / f"{name}__{suite}.jsonl")
                    wall = time.perf_counter() - t0
                    s = summarize(trajs, template_texts=texts)
                    s["wall_s"] = wall
                    s["n_tasks"] = len(tasks)
                    s["n_trials"] = cfg.n_trials
                    tracking.log_metrics(s)
                    s["mlflow_run_id"] = run.info.run_id
                summary.setdefault(name, {})[suite] = s
                sr = s["eval/success_rate"]
                print(f"evaluate: {name} on {suite}/{cfg.split}: success {sr:.3f} over {len(trajs)} episodes "
                      f"in {wall:.1f}s")
    write_json(OUT / "summary.json", summary)


if __name__ == "__main__":
    main()
