"""`make run`: run the flow in this process (Prefect starts a temporary local API) and say where things are."""

from __future__ import annotations

import argparse
import json

from pipelines.flow import mobilerl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", help="a run preset, configs/presets/<name>.yaml (smoke); none: params.yaml as is")
    ap.add_argument("--cluster", help="where the rl stage runs its servers: configs/clusters/<name>.yaml (local, ray)")
    ap.add_argument("--stages", nargs="+", help="only these stages (and what they depend on); default: all")
    ap.add_argument("--isolated", action="store_true", help="run in a temporary copy of the repository")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                    help="override a params.yaml value, e.g. --set evaluate.n_trials=8")
    args = ap.parse_args()
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    summary = mobilerl(preset=args.preset, overrides=overrides or None, isolated=args.isolated, cluster=args.cluster,
                       stages=args.stages)
    print()
    for r in summary["stages"]:
        print(f"  {r['stage']:<22} {r['status']:<11} {r['seconds']:7.1f}s")
    print(f"report:  {summary['report']}")
    print(f"MLflow:  parent run {summary['mlflow_parent_run_id']} — `make ui`, then http://127.0.0.1:5000")


if __name__ == "__main__":
    main()
