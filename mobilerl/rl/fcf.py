"""Failure curriculum filtering (FCF, MobileRL §2.2.3).

A task whose sampled rounds returned all-zero rewards ``patience`` times in a row enters a cooldown of
``cooldown`` rounds with sampling weight exp(−f) (f = consecutive all-zero rounds), then is removed for good.
The authors' released rule (``rl.algo.fcf_rule: authors``) counts failed step rows instead of rounds and weighs
a task exp(−f) from its first failure, 0 once f > 3. The state persists across runs (``rl.curriculum_init``); it
shapes training sampling only, never evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class FailureCurriculum:
    """Per-task consecutive-failure counts ``f`` and the sampling weights they imply (``rule`` paper)::

        w(task) = 1            if f < patience
                  exp(−f)      if patience ≤ f < patience + cooldown
                  0 (removed)  once f reaches patience + cooldown — for good

    ``rule`` authors: f grows by the failed group's step rows, w = exp(−f) for f ≥ 1, removed once f > 3.
    """

    AUTHORS_LIMIT = 3

    def __init__(self, patience: int = 2, cooldown: int = 3, rule: str = "paper") -> None:
        if patience < 1 or cooldown < 0 or rule not in ("paper", "authors"):
            raise ValueError(f"need patience >= 1, cooldown >= 0 and rule paper|authors, got {patience}, {cooldown}, "
                             f"{rule!r}")
        self.patience = patience
        self.cooldown = cooldown
        self.rule = rule
        self.failures: dict[str, int] = {}
        self._removed: set[str] = set()

    def update(self, task_id: str, rewards: Sequence[float], rows: int | None = None) -> None:
        """Record one sampled round of ``task_id`` (its group's rewards, and its step rows, which the authors'
        rule counts; default: one a trajectory). Call once per round it was sampled."""
        if task_id in self._removed:
            return
        if any(r != 0 for r in rewards):
            self.failures[task_id] = 0
            return
        authors = self.rule == "authors"
        f = self.failures.get(task_id, 0) + ((len(rewards) if rows is None else rows) if authors else 1)
        self.failures[task_id] = f
        if (f > self.AUTHORS_LIMIT) if authors else (f >= self.patience + self.cooldown):
            self._removed.add(task_id)

    def removed(self, task_id: str) -> bool:
        return task_id in self._removed

    def weight(self, task_id: str) -> float:
        if task_id in self._removed:
            return 0.0
        f = self.failures.get(task_id, 0)
        return 1.0 if f < (1 if self.rule == "authors" else self.patience) else math.exp(-f)

    def sample(self, task_ids: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
        """``k`` distinct tasks drawn without replacement with probability ∝ weight (all active ones if fewer)."""
        ids = [t for t in task_ids if self.weight(t) > 0]
        if len(ids) <= k:
            return ids
        w = np.array([self.weight(t) for t in ids], dtype=np.float64)
        pick = rng.choice(len(ids), size=k, replace=False, p=w / w.sum())
        return [ids[i] for i in sorted(pick)]

    def counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """``active`` (weight 1), ``cooldown`` (0 < weight < 1) and ``removed`` tasks among ``task_ids``."""
        w = [self.weight(t) for t in task_ids]
        return {"active": sum(x == 1.0 for x in w), "cooldown": sum(0 < x < 1 for x in w),
                "removed": sum(x == 0 for x in w)}

    def state_dict(self) -> dict[str, Any]:
        return {"patience": self.patience, "cooldown": self.cooldown, "failures": dict(self.failures),
                "removed": sorted(self._removed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore failure histories (e.g. a previous run's, ``rl.curriculum_init``); this instance's
        patience and cooldown are kept."""
        self.failures = {str(k): int(v) for k, v in state.get("failures", {}).items()}
        self._removed = {str(t) for t in state.get("removed", [])}
