"""Score a checkpoint step by step on expert rollouts of train-split and test-split world tasks.

    .venv/bin/python scripts/offline_steps.py models/tiny-base --splits train test

The ``evaluate`` stage's offline (AndroidControl-style, high mode) evaluation, run on the first task of
every template of each split: the policy answers every step of the expert's episode with the expert's
history, and is judged by the Table 8 rules. Pretraining and SFT draw from train-split tasks only, so the
train split shows how well a checkpoint fits what it was trained on, and the test split how well that
carries over (a diagnostic: docs/sft.md, "Does the policy fit its own training tasks?").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="model folder (HF format), e.g. models/tiny-base")
    ap.add_argument("--splits", nargs="+", default=["train", "test"], choices=["train", "test"])
    ap.add_argument("--per-template", type=int, default=1, help="expert-rolled tasks per template")
    ap.add_argument("--reasoning", action="store_true", help="prompt for <think> (a reasoning checkpoint)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="response cap (default: the profile's)")
    args = ap.parse_args(argv)

    from mobilerl.config import load_params
    from mobilerl.env.actions import parse_action
    from mobilerl.eval.androidcontrol import run_androidcontrol
    from mobilerl.eval.checkpoints import checkpoint_policy
    from mobilerl.eval.config import CheckpointSpec, EvaluateConfig
    from mobilerl.eval.offline import offline_episodes

    cfg = load_params("evaluate", EvaluateConfig)
    policy = checkpoint_policy(Path(args.checkpoint).name, CheckpointSpec(path=args.checkpoint, reasoning=args.reasoning,
                                                                             max_new_tokens=args.max_new_tokens), cfg)
    for split in args.splits:
        c = cfg.model_copy(update={"split": split, "offline_per_template": args.per_template})
        episodes = offline_episodes(c)
        res = asyncio.run(run_androidcontrol(policy, episodes, "high", cfg.model_concurrency, frame=policy.coords))
        right: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        whole: dict[str, bool] = collections.defaultdict(lambda: True)
        for s in res.steps:
            kind = parse_action(s.gt).name
            total[kind] += 1
            right[kind] += s.judgement.success
            whole[s.episode_id] &= s.judgement.success
        m = res.metrics
        print(f"{split}: {len(episodes)} expert episodes, {m['androidcontrol/high/n_steps']} steps: step success "
              f"{m['androidcontrol/high/step_success_rate']:.3f}, action type "
              f"{m['androidcontrol/high/type_accuracy']:.3f}; episodes with every step right "
              f"{sum(whole.values())} / {len(whole)}")
        print("    " + ", ".join(f"{k} {right[k]}/{total[k]}" for k in sorted(total, key=lambda k: -total[k])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
