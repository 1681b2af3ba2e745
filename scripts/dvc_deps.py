"""Print, for each dvc.yaml stage, the deps it should list: its non-code deps as they stand, then the
fewest paths covering every project file its ``python -m stages.<name>`` runs (import closure, read with
``ast``; a package folder when all its .py files are needed). Checked by tests/test_layout.py.

    .venv/bin/python scripts/dvc_deps.py [stage ...]      # print
    .venv/bin/python scripts/dvc_deps.py --write           # rewrite dvc.yaml's deps lists in place
"""

from __future__ import annotations

import argparse
import re
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
    ap.add_argument("--write", action="store_true", help="rewrite the deps lists of dvc.yaml in place")
    args = ap.parse_args(argv)
    stages = dvc_stages()
    if args.write:
        write(stages)
        return 0
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


def wanted_deps(stage: dict) -> list[str]:
    module = stage_module(stage)
    old = dep_paths(stage)
    if module is None:
        return old
    files, _ = closure(ROOT.joinpath(*module.split(".")).with_suffix(".py"))
    return [d for d in old if d.split("/")[0] not in INTERNAL] + minimal_cover(files)


def write(stages: dict[str, dict], path: Path = ROOT / "dvc.yaml") -> None:
    """Replace each stage's ``deps:`` items, keeping every other line (comments included)."""
    lines, out, stage, i = path.read_text().splitlines(), [], None, 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"^  (\w+):\s*$", line):
            stage = m.group(1)
        out.append(line)
        i += 1
        if line.strip() == "deps:" and stage in stages:
            indent = re.match(r"^(\s*)", line).group(1) + "  "
            while i < len(lines) and re.match(rf"^{indent}- ", lines[i]):
                i += 1
            out += [f"{indent}- {d}" for d in wanted_deps(stages[stage])]
    path.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
