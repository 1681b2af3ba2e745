"""Greedy success of checkpoints on every task of a suite's test split, with 95% Wilson intervals: the RL
learning target's comparison (the `evaluate` stage spreads 100 tasks a suite; this runs all of them).

    .venv/bin/python scripts/compare_policies.py sft_reasoning_free=data/checkpoints/sft_reasoning_free \
        adagrpo=data/checkpoints/adagrpo [--suite world] [--json out.json]

Each checkpoint runs as the `evaluate` stage runs a checkpoint (its params, worker processes, greedy), with
``reasoning`` from the stage's checkpoint of the same name when there is one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def greedy(name: str, path: str, suite: str = "world", reasoning: bool | None = None,
           max_new_tokens: int | None = None) -> dict:
    """Greedy success of checkpoint ``path`` on every task of ``suite``'s test split, its 95 % Wilson interval,
    the solved count on the tasks of more than 10 optimal steps (``long``) and on the templates whose longest test
    task has at most 6 (``short``: the default RL pool's, ``rl.templates_max_steps``). ``reasoning`` /
    ``max_new_tokens``: as the stage's checkpoint of the same name when None."""
    from mobilerl.config import load_params
    from mobilerl.eval.checkpoints import run_checkpoint
    from mobilerl.eval.config import CheckpointSpec, EvaluateConfig
    from mobilerl.eval.metrics import wilson_interval
    from mobilerl.tasks import load_tasks

    cfg = load_params("evaluate", EvaluateConfig)
    tasks = load_tasks(suite, "test")
    known = cfg.checkpoints.get(name)
    spec = CheckpointSpec(path=path, reasoning=reasoning if reasoning is not None else bool(known and known.reasoning),
                          max_new_tokens=max_new_tokens or (known.max_new_tokens if known else None))
    c = cfg.model_copy(update={"checkpoints": {**cfg.checkpoints, name: spec}, "n_trials": 1, "temperature": 0.0})
    t0 = time.perf_counter()
    trajs = run_checkpoint(name, tasks, c, ROOT)
    solved = sum(t.success for t in trajs)
    lo, hi = wilson_interval(solved, len(trajs))
    succ = [t.n_steps for t in trajs if t.success]
    steps = {t.task_id: t.optimal_steps for t in tasks}
    long = [t for t in trajs if steps[t.task_id] > 10]
    longest: dict[str, int] = {}
    for t in tasks:
        longest[t.template] = max(longest.get(t.template, 0), t.optimal_steps)
    template = {t.task_id: t.template for t in tasks}
    short = [t for t in trajs if longest[template[t.task_id]] <= 6]
    out = {"path": path, "tasks": len(trajs), "solved": solved, "success_rate": solved / len(trajs),
           "ci_low": lo, "ci_high": hi, "mean_steps_success": sum(succ) / len(succ) if succ else None,
           "long_tasks": len(long), "long_solved": sum(t.success for t in long),
           "short_tasks": len(short), "short_solved": sum(t.success for t in short), "wall_s": time.perf_counter() - t0}
    print(f"{name}: {solved}/{len(trajs)} = {100 * solved / len(trajs):.2f} % [{100 * lo:.2f}, {100 * hi:.2f}], "
          f"> 10 steps {out['long_solved']}/{len(long)}, short templates {out['short_solved']}/{len(short)} ({out['wall_s']:.0f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--suite", default="world")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out = {}
    for item in args.policies:
        name, path = item.split("=", 1)
        out[name] = greedy(name, path, args.suite)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
