"""Run a checkpoint on chosen world/test templates and show what it does, episode by episode.

    .venv/bin/python scripts/inspect_policy.py data/checkpoints/sft_reasoning_free --max-optimal 3 --per-template 5
    .venv/bin/python scripts/inspect_policy.py CKPT --task-type query --trials 8 --temperature 1.0 --quiet

A diagnostic, not a benchmark: the policy is built as the ``evaluate`` stage builds a checkpoint policy (the
profile's backend and prompt format, ``evaluate``'s perturbation and seed), the tasks are the first
``--per-template`` world/test tasks of each template whose mean optimal step count is at most
``--max-optimal`` (and of ``--task-type``, if given). Prints each episode's responses and their effect on the
screen (unless ``--quiet``), then success per template and pass@k over ``--trials`` (k = 1, 2, 4, 8 up to the
trials), which shows whether sampling ever finds a success that RL could reinforce.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path


def select_tasks(max_optimal: float, per_template: int, task_type: str | None) -> tuple[list, dict[str, float]]:
    """The first ``per_template`` world/test tasks of each template within the step and type filters, and
    the mean optimal step count of each selected template (over all its world/test tasks)."""
    from mobilerl.env.sim.tasks import list_tasks

    by: dict[str, list] = collections.defaultdict(list)
    for t in list_tasks("world", "test"):
        by[t.template].append(t)
    out, optimal = [], {}
    for name, tasks in by.items():
        mean = statistics.mean(t.optimal_steps for t in tasks)
        if mean > max_optimal or (task_type is not None and tasks[0].task_type != task_type):
            continue
        out += tasks[:per_template]
        optimal[name] = mean
    return out, optimal


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="model folder (HF format), e.g. data/checkpoints/sft_reasoning_free")
    ap.add_argument("--reasoning", action="store_true", help="prompt for <think> (a reasoning checkpoint)")
    ap.add_argument("--max-optimal", type=float, default=3.0, help="templates of at most this many optimal steps")
    ap.add_argument("--task-type", choices=["query", "operation"], default=None)
    ap.add_argument("--per-template", type=int, default=5)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=None, help="default: the evaluate stage's (greedy)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--steps-shown", type=int, default=6, help="responses shown per episode")
    ap.add_argument("--quiet", action="store_true", help="only the per-template table")
    args = ap.parse_args(argv)

    from mobilerl.config import load_params
    from mobilerl.eval.checkpoints import checkpoint_policy
    from mobilerl.eval.config import CheckpointSpec, EvaluateConfig
    from mobilerl.eval.metrics import grouped
    from mobilerl.eval.runner import evaluate_sync

    cfg = load_params("evaluate", EvaluateConfig)
    if args.temperature is not None:
        cfg = cfg.model_copy(update={"temperature": args.temperature})
    spec = CheckpointSpec(path=args.checkpoint, reasoning=args.reasoning, max_new_tokens=args.max_new_tokens)
    policy = checkpoint_policy(Path(args.checkpoint).name, spec, cfg)
    tasks, optimal = select_tasks(args.max_optimal, args.per_template, args.task_type)
    if not tasks:
        raise SystemExit("no world/test template matches the filters")
    trajs = evaluate_sync(policy.with_seed, tasks, n_trials=args.trials, concurrency=cfg.model_concurrency,
                          perturb=cfg.perturb, obs_mode=policy.obs_mode, base_seed=cfg.seed, progress=not args.quiet)
    if not args.quiet:
        for tr in trajs:
            print(f"{'SOLVED' if tr.success else 'failed'}  {tr.instruction}")
            for s in tr.steps[: args.steps_shown]:
                print(f"    {' '.join(s.response.split())[-110:]}  -> {s.invalid or s.effect or ''}")
    ks = [k for k in (1, 2, 4, 8) if k <= args.trials]
    print(f"\n{'template':36s} {'opt':>4s} {'success':>9s}" + "".join(f" {'pass@' + str(k):>7s}" for k in ks))
    for name, st in grouped(trajs, None, "template", ks).items():
        n = st["n_trajectories"]
        print(f"{name:36s} {optimal[name]:4.1f} {round(st['success_rate'] * n):4d}/{n:<4d}"
              + "".join(f" {st[f'pass@{k}']:7.2f}" for k in ks))
    solved = sum(tr.success for tr in trajs)
    print(f"\n{solved} / {len(trajs)} episodes solved ({len(tasks)} tasks x {args.trials} trials, "
          f"temperature {cfg.temperature}); {sum(tr.finished for tr in trajs)} ended with finish, "
          f"{sum(len(tr.steps) for tr in trajs)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
