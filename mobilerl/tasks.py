"""Task lists on disk: the `tasks` stage writes them, collection, evaluation and RL read them.

A task list is ``<dir>/{suite}_{split}.jsonl``, one :class:`~mobilerl.env.base.TaskSpec` a line, in the
suite's order (template by template). :func:`write_task_lists` materialises the simulator's suites (and
checks the oracle solves every test task); :func:`load_tasks` reads one back, optionally the first few
tasks of each template; :func:`spread` caps a list while keeping every template in it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from mobilerl.config import ROOT
from mobilerl.env.base import TaskSpec

TASK_LISTS = ROOT / "data" / "tasks" / "suites"  # the `tasks` stage's outs

T = TypeVar("T")


def task_list_path(suite: str, split: str, root: Path = TASK_LISTS) -> Path:
    return root / f"{suite}_{split}.jsonl"


def load_tasks(suite: str, split: str, per_template: int | None = None, root: Path = TASK_LISTS) -> list[TaskSpec]:
    """The tasks of ``{suite}_{split}.jsonl`` in file order; with ``per_template``, only the first that many of
    each template."""
    path = task_list_path(suite, split, root)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the `tasks` stage first (dvc repro tasks)")
    tasks: list[TaskSpec] = []
    seen: Counter[str] = Counter()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = TaskSpec.from_dict(json.loads(line))
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(f"{path}:{lineno}: corrupt task record: {e}") from None
        seen[t.template] += 1
        if per_template is None or seen[t.template] <= per_template:
            tasks.append(t)
    return tasks


def spread(tasks: Sequence[T], cap: int | None, *, float_step: bool = False) -> list[T]:
    """At most ``cap`` of ``tasks``, spread evenly over the list (so over its templates); None: all.

    ``float_step``: pick ``tasks[int(i * (n / cap))]`` instead of ``tasks[i * n // cap]``, the `collect`
    stage's stepping, which float rounding makes pick a neighbour for some sizes (e.g. 22 of 30); kept so
    its stores stay as they were."""
    if not cap or len(tasks) <= cap:
        return list(tasks)
    if float_step:
        step = len(tasks) / cap
        return [tasks[int(i * step)] for i in range(cap)]
    return [tasks[i * len(tasks) // cap] for i in range(cap)]


def halves(tasks: Sequence[T], key=lambda t: t.task_id) -> tuple[list[T], list[T]]:
    """``tasks`` split in two halves by a stable hash of each one's id (MobileRL Appendix E.5's random split of
    AndroidLab's test set), each half in the list's order; the first gets the odd one out."""
    from mobilerl.seeding import stable_seed

    ranked = sorted(range(len(tasks)), key=lambda i: stable_seed("half", key(tasks[i])))
    first = set(ranked[: (len(tasks) + 1) // 2])
    return [t for i, t in enumerate(tasks) if i in first], [t for i, t in enumerate(tasks) if i not in first]


def write_task_lists(out_dir: Path, suites: Sequence[str], *, n_train: int | None = None, n_test: int | None = None,
                     check_oracle: bool = True, perturb: str = "default", workers: int = 2) -> dict[str, Any]:
    """Write ``{suite}_{split}.jsonl`` for every suite and split into ``out_dir``; return their metrics by
    ``{suite}_{split}`` (counts, the test splits' difficulty mix and, with ``check_oracle``, the oracle's
    success on them under ``perturb``).

    ``n_train`` / ``n_test``: instances per template (None: the suite's default / its fixed test set). Every
    (suite, split) runs in its own process, ``workers`` at a time: drawing parameters builds a device per
    instance and the oracle check runs every test task, so the splits are independent CPU work."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(out_dir, suite, split, n, check_oracle, perturb)
            for suite in suites for split, n in (("test", n_test), ("train", n_train))]
    if workers <= 1:
        results = [_materialise(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            results = list(pool.map(_materialise, *zip(*jobs, strict=True)))
    return {f"{suite}_{split}": m for (_, suite, split, *_), m in zip(jobs, results, strict=True)}


def _materialise(out_dir: Path, suite: str, split: str, n: int | None, check_oracle: bool, perturb: str) -> dict:
    """Write one task list; return its metrics (with the oracle's success on test splits)."""
    from mobilerl.env.sim import run_oracle
    from mobilerl.env.sim.tasks import list_tasks

    tasks = list_tasks(suite, split, n=n, with_optimal=split == "test")
    with task_list_path(suite, split, out_dir).open("w") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    m: dict = {"tasks": len(tasks), "templates": len({t.template for t in tasks}),
               "apps": len({a for t in tasks for a in t.apps})}
    if split == "test":
        m["difficulty"] = dict(Counter(t.difficulty for t in tasks))
        if check_oracle:
            ok = sum(run_oracle(t, perturb=perturb).success for t in tasks)
            m["oracle_success_rate"] = ok / max(1, len(tasks))
    return m
