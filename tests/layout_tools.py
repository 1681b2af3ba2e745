"""Layout facts read from source text alone (``ast``, never importing the project): the project-internal
import closure of a module, the code deps each DVC stage needs, and the package-level import graph of
``mobilerl/``. Shared by tests/test_layout.py and scripts/dvc_deps.py; dev tooling, so not in the library."""

from __future__ import annotations

import ast
import functools
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = ("mobilerl", "stages")  # top-level packages whose modules count as project code


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.cache
def module_file(name: str) -> Path | None:
    """The file that ``import name`` executes last (package ``__init__.py`` or module), or None."""
    parts = name.split(".")
    pkg = ROOT.joinpath(*parts) / "__init__.py"
    if pkg.is_file():
        return pkg
    mod = ROOT.joinpath(*parts[:-1], parts[-1] + ".py")
    return mod if mod.is_file() else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_internal(name: str) -> bool:
    return name.split(".")[0] in INTERNAL


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones included, skipping ``if TYPE_CHECKING:`` bodies (never executed).
    Imports are statements, so expressions need no walk (much faster than ``ast.walk``)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            yield from _statements(stmt.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(stmt, field, []))


def _dynamic_imports(path: Path, tree: ast.Module) -> set[str]:
    """Modules named by literal ``importlib.import_module``/``__import__`` calls; a module calling
    ``pkgutil.iter_modules`` is taken to import every module of its own folder (the sim's app and task
    discovery)."""
    text = path.read_text()
    if not any(k in text for k in ("import_module", "__import__", "iter_modules")):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        arg = node.args[0] if node.args else None
        if fname in ("import_module", "__import__") and isinstance(arg, ast.Constant):
            if isinstance(arg.value, str):
                found.add(arg.value)
        elif fname == "iter_modules":
            for sub in sorted(path.parent.iterdir()):
                if sub.suffix == ".py" and sub.name != "__init__.py":
                    found.add(module_name(sub))
                elif (sub / "__init__.py").is_file():
                    found.add(module_name(sub / "__init__.py"))
    return found


@functools.cache
def imports_of(path: Path) -> frozenset[str]:
    """Internal module names ``path`` imports anywhere in its body (function-level imports included).
    ``from pkg import x`` yields ``pkg`` and, when ``pkg/x`` is a module, ``pkg.x``."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    tree = _tree(path)
    found = _dynamic_imports(path, tree)
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb level-1 packages above this module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names if module_file(f"{mod}.{a.name}"))
    return frozenset(m for m in found if m and _is_internal(m))


def closure(start: Path) -> tuple[set[str], set[str]]:
    """(files, unresolved): every project file executed when ``start`` runs as ``python -m``, as paths
    relative to the repo root, with the ``__init__.py`` of every package on the way (Python runs them) unless
    empty (it changes nothing, and DVC warns of an empty dep at every stage); and the internal modules imported
    but not found, as ``"name (in file)"`` (a broken or stale import)."""
    files: set[str] = set()
    unresolved: set[str] = set()
    todo = [start]
    name = module_name(start)
    todo += [f for i in range(1, name.count(".") + 1) if (f := module_file(".".join(name.split(".")[:i])))]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if rel(path) in seen:
            continue
        seen.add(rel(path))
        if path.stat().st_size:
            files.add(rel(path))
        for mod in imports_of(path):
            parts = mod.split(".")
            for i in range(1, len(parts) + 1):
                f = module_file(".".join(parts[:i]))
                if f is not None:
                    todo.append(f)
                elif i == len(parts):
                    unresolved.add(f"{mod} (in {rel(path)})")
    return files, unresolved


def covered(file: str, deps: list[str]) -> bool:
    """A dep covers a file when it names the file or a directory above it."""
    return any(file == d or file.startswith(d + "/") for d in deps)


def minimal_cover(files: set[str]) -> list[str]:
    """The fewest paths covering ``files``: a directory stands for its files when every .py under it is
    in ``files``; otherwise the files are listed one by one."""
    full: dict[str, bool] = {}

    def is_full(d: str) -> bool:
        if d not in full:
            pys = {rel(p) for p in (ROOT / d).rglob("*.py") if p.stat().st_size}
            full[d] = bool(pys) and pys <= files
        return full[d]

    out = set()
    for f in files:
        parents = list(Path(f).parents)[:-1]  # drop "."
        top = next((p.as_posix() for p in reversed(parents) if is_full(p.as_posix())), f)
        out.add(top)
    return sorted(out)


def dvc_stages(dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, dict]:
    return yaml.safe_load(dvc_yaml.read_text())["stages"]


def stage_module(stage: dict) -> str | None:
    """``stages.<name>`` from a cmd ``python -m stages.<name> [args]``, else None."""
    cmd = stage.get("cmd", "")
    args = shlex.split(cmd if isinstance(cmd, str) else " ".join(cmd))
    for a, b in zip(args, args[1:], strict=False):
        if a == "-m" and b.startswith("stages."):
            return b
    return None


def dep_paths(stage: dict) -> list[str]:
    deps = [d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])]
    return [d.rstrip("/") for d in deps]


def out_paths(stages: dict[str, dict]) -> set[str]:
    """Every path a stage of dvc.yaml produces (outs and metrics)."""
    outs = set()
    for st in stages.values():
        for key in ("outs", "metrics", "plots"):
            outs.update((o if isinstance(o, str) else next(iter(o))).rstrip("/") for o in st.get(key, []))
    return outs


def package_of(module: str) -> str | None:
    """The first component under ``mobilerl`` (``mobilerl.env.sim.device`` -> ``env``), None for the
    top package itself or outside it."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mobilerl" and len(parts) > 1 else None


def package_graph() -> dict[str, dict[str, str]]:
    """Package-level import graph of mobilerl/: ``{src: {dst: "file imports module"}}`` (one example
    import per edge, for messages). Self-edges are left out."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted((ROOT / "mobilerl").rglob("*.py")):
        src = package_of(module_name(path))
        if src is None:
            continue
        edges = graph.setdefault(src, {})
        for mod in sorted(imports_of(path)):
            dst = package_of(mod)
            if dst is not None and dst != src and module_file(f"mobilerl.{dst}") is not None:
                edges.setdefault(dst, f"{rel(path)} imports {mod}")
    return graph


def module_graph(folder: str) -> dict[str, dict[str, str]]:
    """File-level import graph among the modules of ``mobilerl/<folder>/`` (``{module: {module: "file imports
    module"}}``, names relative to the folder; function-level imports included)."""
    base = ROOT / "mobilerl" / folder
    prefix = f"mobilerl.{folder.replace('/', '.')}."
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(base.glob("*.py")):
        if path.name == "__init__.py":
            continue
        src = path.stem
        edges = graph.setdefault(src, {})
        for mod in sorted(imports_of(path)):
            if mod.startswith(prefix) and "." not in mod[len(prefix):] and mod[len(prefix):] != src:
                edges.setdefault(mod[len(prefix):], f"{rel(path)} imports {mod}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of ``graph`` as a node list (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the DFS stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, {})):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def path_between(graph: dict[str, dict[str, str]], src: str, dst: str) -> list[str] | None:
    """A shortest import path src -> ... -> dst in ``graph`` (breadth-first), or None."""
    prev: dict[str, str] = {src: ""}
    queue = [src]
    for n in queue:
        if n == dst:
            path = [n]
            while prev[path[-1]]:
                path.append(prev[path[-1]])
            return path[::-1]
        for m in sorted(graph.get(n, {})):
            if m not in prev:
                prev[m] = n
                queue.append(m)
    return None


def describe(graph: dict[str, dict[str, str]], path: list[str]) -> str:
    """``a -> b -> c`` with the import that makes each edge."""
    edges = [graph[a][b] for a, b in zip(path, path[1:], strict=False)]
    return " -> ".join(path) + " (" + "; ".join(edges) + ")"
