"""One lever of the RL recipe, measured: the `rl` stage's config (params.yaml) with ``--set`` changes, trained into
``.cache/levers/NAME/``, then greedy on every world/test task (scripts/compare_policies.py); one JSON line a run
appended to ``.cache/levers/results.jsonl`` (docs/rl.md's lever table is made from it).

    .venv/bin/python scripts/rl_lever.py authors --set recipe=authors [--set rounds=30] [--seed 1]
    .venv/bin/python scripts/rl_lever.py from_reasoning --set init=data/checkpoints/sft_reasoning --set reasoning=true \
        --set 'overrides={train_batch_size: 16, samples_per_task: 8, max_new_tokens: 128}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="an rl key and its value")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from compare_policies import greedy

    from mobilerl.config import load_params
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run

    changes = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    base = load_params("rl", RLConfig).model_dump(by_alias=True)
    where = ROOT / ".cache" / "levers" / args.name
    cfg = RLConfig.model_validate({**base, "algo": {}, **changes, "seed": args.seed, "out": str(where / "policy"),
                                   "work": str(where / "work")})
    t0 = time.perf_counter()
    summary, curve = run(cfg, ROOT, progress=False)
    rl_s = time.perf_counter() - t0
    (where / "curve.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    result = {"name": args.name, "changes": changes, "seed": args.seed, "rl_min": rl_s / 60, "summary": summary,
              "last10_success": sum(c["rollout/success"] for c in curve[-10:]) / len(curve[-10:]),
              "world_all": greedy(args.name, str(where / "policy"), reasoning=cfg.reasoning,
                                  max_new_tokens=cfg.settings().max_new_tokens if cfg.reasoning else None)}
    with (ROOT / ".cache" / "levers" / "results.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
