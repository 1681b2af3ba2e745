"""Short simulator tasks, and a repo root whose task lists hold them, for the RL tests (trainer, peer options,
env servers, ablation cells)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mobilerl.env.base import TaskSpec
from mobilerl.env.sim.tasks import list_tasks


def short_tasks(n: int = 2, max_steps: int = 3) -> list[TaskSpec]:
    """The first world/train task of ``n`` templates, their step budget cut to ``max_steps`` (10 × complexity)."""
    return [dataclasses.replace(t, complexity=max_steps / 10) for t in list_tasks("world", "train", n=1)[:n]]


def stage_root(tmp: Path, train: list[TaskSpec], test_steps: list[int] | None = None) -> Path:
    """``tmp`` as a repo root: ``train`` as world/train and, as world/test, each of them again with the optimal
    steps ``test_steps`` (None: as they are)."""
    lists = tmp / "data" / "tasks" / "suites"
    lists.mkdir(parents=True)
    steps = test_steps or [t.optimal_steps for t in train]
    test = [dataclasses.replace(t, split="test", optimal_steps=s) for t, s in zip(train, steps, strict=True)]
    for split, tasks in (("train", train), ("test", test)):
        (lists / f"world_{split}.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    return tmp
