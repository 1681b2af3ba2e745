"""Print the tiny base model's screen-reading figures on held-out simulator screens.

    .venv/bin/python scripts/probe_tiny_base.py [--model models/tiny-base] [--items 200] [--states DIR] [--split train] [--rows F]

Held-out screens: test-split tasks of the world and lab suites (never used by pretraining), oracle and
off-policy states, less any screen identical to a train-split one: the ``pretrain`` stage's release probe,
item for item. ``--states`` reuses a pretraining run's screen cache (``train.jsonl.gz``/``test.jsonl.gz``,
written by ``python -m mobilerl.tinybase.train … --states DIR``) instead of collecting them (~3 minutes).
One question per item, greedy generation, exact answer (see mobilerl/tinybase/probe.py). ``--rows`` keeps every
item's question, target and output, to read what the model gets wrong.
``--split train`` asks the same questions about pretraining's own train-split screens instead: where the model
does better there, it recalls what it was trained on rather than reading the screen or the instruction.
Exit status 1 if an acceptance target (grounding ≥ 90%, reading ≥ 90%, span copy ≥ 95%) is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--items", type=int, default=200, help="held-out items per question kind")
    ap.add_argument("--states", type=Path, default=None,
                    help="a pretraining run's screen cache (train.jsonl.gz, test.jsonl.gz); default: collect")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--device", default="cpu", help="torch device to score on (e.g. cuda)")
    ap.add_argument("--split", choices=("test", "train"), default="test",
                    help="ask about held-out screens (test: the release probe) or about pretraining's own train-split "
                         "screens (train: the gap between the two is what the model recalls instead of reading)")
    ap.add_argument("--rows", type=Path, default=None,
                    help="write every item's kind, question, task, target, output and verdict here (JSONL)")
    args = ap.parse_args()

    import torch

    from mobilerl.models import tiny
    from mobilerl.tinybase.probe import ACCEPTANCE, release_items, score_generate
    from mobilerl.tinybase.recipe import Recipe
    from mobilerl.tinybase.screens import load_state_cache
    from mobilerl.tinybase.train import prepare_states

    torch.set_num_threads(args.threads)
    t0 = time.time()
    model, processor = tiny.load(args.model)
    model.to(args.device)
    recipe = Recipe.from_record(json.loads((Path(args.model) / "tiny.json").read_text())["profile"])
    # as the stage has them: the train screens, and the held-out screens not among them
    train, test = (load_state_cache(args.states) if args.states is not None
                   else prepare_states(recipe, log=lambda msg: None))
    states = test if args.split == "test" else train
    items = release_items(states, recipe.data, n_per_kind=args.items, seed=args.seed)
    acc, rows = score_generate(model, processor, items)
    if args.rows is not None:
        with args.rows.open("w") as f:
            for it, row in zip(items, rows, strict=True):
                user = it.example.messages[-2]["content"].splitlines()
                task = next((line.removeprefix("Task: ") for line in user if line.startswith("Task: ")), "")
                f.write(json.dumps({**row, "question": user[-1], "task": task, "screen": it.state_index}) + "\n")
    names = {"ground": "grounding (exact element)", "read": "reading (label -> value)",
             "copy": "instruction-span copy (Type)", "type": "type what the task says, at the field",
             "checked": "state: switch on/off",
             "app": "state: which app", "find": "state: tap or scroll to target",
             "act": "next action (the expert's, exact)"}
    if args.json:
        print(json.dumps(acc, indent=1))
    else:
        where = (f"held-out screens: {len(states)} (test split, {recipe.probe_per_template} tasks/template)"
                 if args.split == "test" else f"pretraining's own screens: {len(states)} (train split)")
        print(f"{where}; greedy generation, exact answer; {time.time() - t0:.0f}s")
        for k, name in names.items():
            if k in acc:
                target = ACCEPTANCE.get(k)
                mark = "" if target is None else f"   target >= {target:.0%}: {'OK' if acc[k] >= target else 'MISSED'}"
                print(f"  {name:34s} {acc[k]:7.1%}  (n={acc['n_' + k]}){mark}")
        if "ground_center_hit" in acc:
            print(f"  {'grounding (tap lands on target)':34s} {acc['ground_center_hit']:7.1%}")
    return 0 if all(acc.get(k, 0) >= v for k, v in ACCEPTANCE.items()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
