"""Benchmark the `rl` stage's round: where a step's time goes (rollout / train / sync / other), the rollout's
throughput against the evaluation path on the same policy and tasks, and the update's tokens/s.

    .venv/bin/python scripts/bench_rl.py [--init data/checkpoints/sft_reasoning_free] [--rounds 4]
        [--reward-model data/checkpoints/reward_model --lab-share 0.2]   # the judge's share of the step

The evaluation path is :func:`mobilerl.eval.runner.evaluate_in_processes` (what the `evaluate` stage runs for
a checkpoint) at the rollout's temperature, over the same tasks × n episodes; both are measured here, in one run,
as env steps per second of wall time (the policy's generation dominates both).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="data/checkpoints/sft_reasoning_free")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tasks-per-round", type=int, default=16)
    ap.add_argument("--templates-max-steps", type=int, default=6)
    ap.add_argument("--reward-model", default=None, help="judge checkpoint scoring lab/train (with --lab-share)")
    ap.add_argument("--lab-share", type=float, default=0.0, help="share of a round's tasks from lab/train")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    from mobilerl.eval.runner import evaluate_in_processes
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run, training_pool

    with tempfile.TemporaryDirectory() as tmp:
        cfg = RLConfig(init=args.init, rounds=args.rounds, overrides={"train_batch_size": args.tasks_per_round},
                       templates_max_steps=args.templates_max_steps, work=f"{tmp}/work", out=f"{tmp}/out",
                       checkpoint_every=args.rounds, lab_share=args.lab_share, reward_model=args.reward_model)
        _, curve = run(cfg, ROOT, progress=False)
    steps = [c["rollout/episodes"] * c["rollout/steps"] for c in curve]
    keys = ("time/rollout_s", "time/reward_s", "time/train_s", "time/sync_s", "time/other_s", "time/step_s")
    split = {k: float(np.sum([c.get(k, 0.0) for c in curve])) for k in keys}
    rollout_sps = sum(steps) / split["time/rollout_s"]

    # the evaluation path on the same policy, tasks and number of episodes (the first round's tasks)
    s = cfg.settings()
    tasks = [t for t in training_pool(cfg, ROOT) if t.has_verifier][: args.tasks_per_round]

    factory = functools.partial(sampling_policy, str(ROOT / args.init), cfg.profile, s.temperature, s.max_new_tokens)
    t0 = time.perf_counter()
    trajs = evaluate_in_processes(factory, tasks, processes=cfg.rollout_processes,
                                  n_trials=s.samples_per_task, concurrency=cfg.rollout_concurrency)
    eval_s = time.perf_counter() - t0
    eval_sps = sum(t.n_steps for t in trajs) / eval_s
    tokens = sum(c.get("train/tokens", 0.0) for c in curve)
    figures = {
        "rounds": len(curve),
        "split_of_step": {k.split("/")[1]: v / split["time/step_s"] for k, v in split.items() if k != "time/step_s"},
        "step_s_mean": split["time/step_s"] / len(curve),
        "rollout_steps_per_s": rollout_sps,
        "eval_path_steps_per_s": eval_sps,
        "rollout_vs_eval_path": rollout_sps / eval_sps,
        "update_tokens_per_s": tokens / split["time/train_s"] if split["time/train_s"] else 0.0,
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"{len(curve)} rounds, {figures['step_s_mean']:.1f} s a step")
    for k, v in figures["split_of_step"].items():
        print(f"  {k:>10}: {100 * v:5.1f} % of the step")
    print(f"rollout {rollout_sps:.1f} env steps/s; evaluation path {eval_sps:.1f} (ratio "
          f"{figures['rollout_vs_eval_path']:.2f}, target >= 0.80)")
    print(f"update {figures['update_tokens_per_s']:.0f} response tokens/s")
    if args.reward_model:
        judged = sum(c.get("reward/judged", 0.0) for c in curve)
        print(f"reward model: {judged:.0f} episodes judged, {100 * figures['split_of_step']['reward_s']:.1f} % of the step "
              f"(target <= 20 %)")


def sampling_policy(init: str, profile_name: str, temperature: float, max_new_tokens: int):
    """``seed -> policy`` of the checkpoint sampled as the rollout samples (built in each evaluation worker)."""
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.backends import make_backend, profile_spec
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.profiles import load_profile

    profile = load_profile(profile_name)
    g = profile.generation
    backend = make_backend({**profile_spec(profile), "model": init})
    return ModelPolicy(backend, obs_mode=g.obs_mode, prompt_style=g.prompt_style, max_history=g.max_history,
                       coords=g.coords, reuse_greedy=False,
                       sampling=SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens, seed=0)).with_seed


if __name__ == "__main__":
    main()
