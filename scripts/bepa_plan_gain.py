"""How much the oracle's step-by-step plan in the prompt (BEPA's LEVEL-1 seeding, mobilerl/rl/bepa.py) lifts a
policy's success on the `rl` stage's pool: the same tasks, plain instruction vs plan-conditioned, sampled as RL
samples (T = 1, the profile's prompt format).

    .venv/bin/python scripts/bepa_plan_gain.py data/checkpoints/sft_reasoning_free --tasks 35 --trials 4
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.config import ROOT, load_params
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend
from mobilerl.models.profiles import load_profile
from mobilerl.rl.bepa import oracle_plan, plan_instruction
from mobilerl.rl.config import RLConfig
from mobilerl.rl.run import training_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--tasks", type=int, default=35, help="pool tasks, evenly spaced over the pool")
    ap.add_argument("--trials", type=int, default=4, help="episodes per task and condition")
    args = ap.parse_args()
    cfg = load_params("rl", RLConfig)
    g = load_profile(cfg.profile).generation
    pool = training_pool(cfg, ROOT)
    tasks = pool[:: max(1, len(pool) // args.tasks)][: args.tasks]
    guided = [dataclasses.replace(t, instruction=plan_instruction(t.instruction, oracle_plan(t))) for t in tasks]
    backend = HFBackend.from_pretrained(args.checkpoint, device="cpu")
    policy = ModelPolicy(backend, obs_mode=g.obs_mode, prompt_style=g.prompt_style, max_history=g.max_history,
                         coords=g.coords, reasoning=cfg.reasoning, reuse_greedy=False,
                         sampling=SamplingConfig(temperature=cfg.settings().temperature,
                                                 max_new_tokens=cfg.settings().max_new_tokens, seed=0))
    for name, ts in (("plain", tasks), ("plan", guided)):
        t0 = time.perf_counter()
        trajs = evaluate_sync(policy.with_seed, ts, n_trials=args.trials, progress=False, concurrency=64)
        solved = len({t.task_id for t in trajs if t.success})
        print(f"{name}: {sum(t.success for t in trajs)}/{len(trajs)} episodes, {solved}/{len(ts)} tasks solved "
              f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
