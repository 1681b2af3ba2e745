"""Evaluate the non-model baselines (oracle, random) on a simulator suite split and print SR + wall time.

.venv/bin/python scripts/eval_baselines.py --suite world --split test --trials 1 --out runs/baselines
.venv/bin/python scripts/eval_baselines.py --policies oracle --noise 0.1,0.3,0.5   # the expert, slipping

``--noise e1,e2,...`` also runs the oracle with each rate of random per-step errors (``NoisyPolicy``): the
online success an agent that knows every procedure but does not re-plan gets at a given per-step accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mobilerl.agent import NoisyPolicy, OraclePolicy, RandomPolicy
from mobilerl.env.sim.tasks import list_tasks
from mobilerl.eval.metrics import summarize
from mobilerl.eval.runner import evaluate_sync, sim_template_texts

POLICIES = {"oracle": lambda seed: OraclePolicy(), "random": lambda seed: RandomPolicy(seed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="world")
    ap.add_argument("--split", default="test")
    ap.add_argument("--policies", default="oracle,random")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--noise", default="", help="comma-separated error rates: oracle@RATE for each")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--perturb", default="default")
    ap.add_argument("--processes", action="store_true", help="one env worker process per slot")
    ap.add_argument("--no-optimal", action="store_true", help="skip optimal step counts (faster listing)")
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for <policy>.jsonl and <policy>.summary.json"
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    tasks = list_tasks(args.suite, args.split, with_optimal=not args.no_optimal)
    print(f"{len(tasks)} tasks in {args.suite}/{args.split}, listed in {time.perf_counter() - t0:.1f}s")
    texts = sim_template_texts(tasks)
    policies = dict(POLICIES)
    rates = [r for r in args.noise.split(",") if r]
    for rate in rates:
        policies[f"oracle@{rate}"] = lambda seed, e=float(rate): NoisyPolicy(OraclePolicy(), e, seed)
    for name in args.policies.split(",") + [f"oracle@{r}" for r in rates]:
        out = args.out / f"{name}.jsonl" if args.out else None
        t0 = time.perf_counter()
        trajs = evaluate_sync(
            policies[name],
            tasks,
            n_trials=args.trials,
            concurrency=args.concurrency,
            perturb=args.perturb,
            use_processes=args.processes,
            out_path=out,
            progress=not args.no_progress,
        )
        wall = time.perf_counter() - t0
        s = summarize(trajs, template_texts=texts)
        steps = sum(t.n_steps for t in trajs)
        print(
            f"{name}: SR {s['eval/success_rate']:.4f} [{s['eval/success_ci_low']:.4f}, "
            f"{s['eval/success_ci_high']:.4f}] over {len(trajs)} episodes, {steps} steps, "
            f"wall {wall:.1f}s ({len(trajs) / wall:.1f} ep/s, {steps / wall:.0f} steps/s)"
        )
        print("  failures:", {k.split("/", 1)[1]: v for k, v in s.items() if k.startswith("failures/") and v})
        if args.out:
            (args.out / f"{name}.summary.json").write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
