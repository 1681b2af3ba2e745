"""The repo's layout rules, checked from source text alone: DVC deps cover what each stage runs,
library layers import one way, stages stay thin and independent, files and docs stay within budget."""

from __future__ import annotations

import pytest
from layout_tools import (
    ROOT,
    closure,
    covered,
    dep_paths,
    describe,
    dvc_stages,
    find_cycle,
    imports_of,
    module_graph,
    out_paths,
    package_graph,
    path_between,
    rel,
    stage_module,
)

MAX_STAGE_LINES = 160
MAX_LIBRARY_LINES = 800
MAX_RL_LINES = 400  # an rl/ file reads top to bottom
MAX_PARAMS_COMMENT_PCT = 30
MAX_DOCS_FILES = 25


def _check(problems: list[str], header: str) -> None:
    """Fail with the header and one problem a line (no assertion rewrite: the list is the message)."""
    if problems:
        pytest.fail(header + "\n" + "\n".join(problems), pytrace=False)


def _lines(path) -> int:
    return len(path.read_text().splitlines())


def test_dvc_deps_cover_each_stage_import_closure():
    stages = dvc_stages()
    problems = []
    for name, stage in stages.items():
        module = stage_module(stage)
        if module is None:
            problems.append(f"{name}: cmd is not `python -m stages.<name>`: {stage.get('cmd')!r}")
            continue
        start = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        if not start.is_file():
            problems.append(f"{name}: {rel(start)} does not exist")
            continue
        files, unresolved = closure(start)
        deps = dep_paths(stage)
        missing = sorted(f for f in files if not covered(f, deps))
        if missing:
            problems.append(f"{name}: dvc.yaml deps miss {', '.join(missing)}")
        if unresolved:
            problems.append(f"{name}: imports modules that do not exist: {', '.join(sorted(unresolved))}")
    _check(problems, "dvc.yaml deps do not cover what the stages run:")


def test_dvc_deps_exist():
    stages = dvc_stages()
    produced = out_paths(stages)  # another stage's outs need not exist before `dvc repro`
    stale = [f"{name}: dep {d} does not exist" for name, stage in stages.items() for d in dep_paths(stage)
             if d not in produced and not (ROOT / d).exists()]
    _check(stale, "dvc.yaml deps name paths that do not exist:")
    empty = [f"{name}: dep {d} is empty" for name, stage in stages.items() for d in dep_paths(stage)
             if (ROOT / d).is_file() and not (ROOT / d).stat().st_size]
    _check(empty, "dvc.yaml deps name empty files (DVC warns 'is empty' at every stage):")


def test_package_graph_has_no_cycles():
    graph = package_graph()
    graph.pop("cli", None)  # the CLI sits on top of everything
    cycle = find_cycle(graph)
    _check([describe(graph, cycle)] if cycle else [], "mobilerl package import cycle (cli.py left out):")


def test_rl_files_import_one_way():
    graph = module_graph("rl")
    cycle = find_cycle(graph)
    _check([describe(graph, cycle)] if cycle else [], "mobilerl/rl/ file import cycle (lazy imports included):")


def test_rl_files_within_budget():
    long = [f"{rel(p)}: {n} lines" for p in sorted((ROOT / "mobilerl" / "rl").glob("*.py"))
            if (n := _lines(p)) > MAX_RL_LINES]
    _check(long, f"mobilerl/rl/ files over {MAX_RL_LINES} lines:")


def test_trajectory_schema_is_the_bottom_layer():
    allowed = {"mobilerl", "mobilerl.config", "mobilerl.seeding"}
    bad = sorted(imports_of(ROOT / "mobilerl/trajectory.py") - allowed)
    _check(bad, "mobilerl/trajectory.py may import only mobilerl.config/seeding from the project; it imports:")
    graph = package_graph()
    reach = [describe(graph, p) for dst in sorted(graph) if dst not in ("trajectory", "config", "seeding")
             if (p := path_between(graph, "trajectory", dst))]
    _check(reach, "mobilerl/trajectory.py reaches other packages through config/seeding:")


def test_layers_import_one_way():
    graph = package_graph()
    forbidden = {"agent": ("data", "eval", "sft"), "models": ("agent", "tinybase")}
    found = [describe(graph, p) for src, dsts in forbidden.items() for dst in dsts
             if (p := path_between(graph, src, dst))]
    _check(found, "forbidden layer imports (mobilerl/<src> must not import mobilerl/<dst>, even through others):")


def test_stages_are_thin():
    long = [f"{rel(p)}: {n} lines" for p in sorted((ROOT / "stages").glob("*.py"))
            if (n := _lines(p)) > MAX_STAGE_LINES]
    _check(long, f"stage modules over {MAX_STAGE_LINES} lines:")


def _stage_imports(path) -> list[str]:
    return sorted(m for m in imports_of(path) if m.startswith("stages."))


def test_no_stage_imports_another_stage():
    bad = [f"{rel(p)} imports {', '.join(m)}" for p in sorted((ROOT / "stages").glob("*.py"))
           if (m := _stage_imports(p))]
    _check(bad, "stages import other stages (move shared code into mobilerl/):")


def test_scripts_import_no_stage():
    bad = [f"{rel(p)} imports {', '.join(m)}" for p in sorted((ROOT / "scripts").glob("*.py"))
           if (m := _stage_imports(p))]
    _check(bad, "scripts import stage modules (use the library, mobilerl.*):")


def test_library_modules_within_budget():
    long = [f"{rel(p)}: {n} lines" for p in sorted((ROOT / "mobilerl").rglob("*.py"))
            if (n := _lines(p)) > MAX_LIBRARY_LINES]
    _check(long, f"library modules over {MAX_LIBRARY_LINES} lines:")


def test_params_comments_within_budget():
    text = (ROOT / "params.yaml").read_text()
    comment = sum(len(line.split("#", 1)[1]) for line in text.splitlines() if "#" in line)
    pct = 100 * comment / len(text)
    _check([f"params.yaml is {pct:.1f}% comment characters"] if pct > MAX_PARAMS_COMMENT_PCT else [],
           f"params.yaml over its comment budget ({MAX_PARAMS_COMMENT_PCT}%; field help belongs in the "
           "stage's typed config):")


def test_docs_within_budget():
    files = sorted(rel(p) for p in (ROOT / "docs").rglob("*") if p.is_file())
    by_folder = [f"{d}: {n} files" for d, n in _count_by_folder(files).items()]
    _check(by_folder if len(files) > MAX_DOCS_FILES else [],
           f"docs/ holds {len(files)} files (budget {MAX_DOCS_FILES}):")


def _count_by_folder(files: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in files:
        folder = f.rsplit("/", 1)[0]
        counts[folder] = counts.get(folder, 0) + 1
    return counts
