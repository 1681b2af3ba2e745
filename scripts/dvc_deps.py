"""Print, for each dvc.yaml stage, the deps it should list: its non-code deps as they stand, then the
fewest paths covering every project file its ``python -m stages.<name>`` runs (import closure, read with
``ast``; a package folder when all its .py files are needed). Checked by tests/test_layout.py.

    .venv/bin/python scripts/dvc_deps.py [stage ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the closure code lives beside the test that checks dvc.yaml with it (dev tooling, not library)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from layout_tools import (  # noqa: E402
    INTERNAL,
    ROOT,
    closure,
    covered,
    dep_paths,
    dvc_stages,
    minimal_cover,
    stage_module,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", nargs="*", help="stage names (default: all)")
    args = ap.parse_args(argv)
    stages = dvc_stages()
    for name in args.stages or stages:
        module = stage_module(stages[name])
        if module is None:
            print(f"# {name}: cmd is not `python -m stages.<name>`, skipped")
            continue
        files, unresolved = closure(ROOT.joinpath(*module.split(".")).with_suffix(".py"))
        old = dep_paths(stages[name])
        code = minimal_cover(files)
        print(f"  {name}:\n    deps:")
        for d in [d for d in old if d.split("/")[0] not in INTERNAL] + code:
            print(f"      - {d}")
        extra = [d for d in old if d.split("/")[0] in INTERNAL and not any(covered(f, [d]) for f in files)]
        if extra:
            print(f"    # no longer needed: {', '.join(extra)}")
        if unresolved:
            print(f"    # imports missing modules: {', '.join(sorted(unresolved))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
