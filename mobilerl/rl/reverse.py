"""A start-state curriculum from expert prefixes (``rl.curriculum``; the reverse curriculum of Florensa et al.,
2017, with the simulator's expert as the demonstrator, as in Salimans & Chen, 2018).

A task of L optimal steps first starts after the expert has played its first L − k steps (k = ``start``): the
policy plays the last k, and its trajectory's rows are its own turns only (the expert's have no logprobs), while
its prompt shows the expert's turns as its own history (:func:`mobilerl.agent.rollout.rollout`). Each time a
group from there succeeds at a rate ≥ ``grow_at``, k grows by ``step``, until the policy plays the whole task
(k ≥ L). Where every group of a long template fails from the start, the last steps still give signal.
k is kept per template by default (``per``): with 16 tasks a round from hundreds, one task is drawn every few
dozen rounds, while its template's tasks (the same screens and steps, other values) come up every few rounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mobilerl.env.base import TaskSpec


class ReverseCurriculum:
    """k (steps the policy plays) per task or template, and the expert prefix L − k it implies."""

    def __init__(self, start: int = 1, step: int = 1, grow_at: float = 0.5, per: str = "template") -> None:
        if start < 1 or step < 1 or not 0 < grow_at <= 1 or per not in ("task", "template"):
            raise ValueError(f"need start >= 1, step >= 1, 0 < grow_at <= 1, per task|template; got {start}, {step}, "
                             f"{grow_at}, {per!r}")
        self.start, self.step, self.grow_at, self.per = start, step, grow_at, per
        self.k: dict[str, int] = {}  # by task id or template
        self.length: dict[str, int] = {}  # L of the tasks assigned so far (a template's: its longest)

    def key(self, task_id: str) -> str:
        """What k is kept for: the task, or its template (``suite/split/Template/i``)."""
        parts = task_id.split("/")
        return "/".join(parts[:-1]) if self.per == "template" and len(parts) > 1 else task_id

    def prefix(self, task: TaskSpec) -> int:
        """Steps the expert plays first: max(0, L − k)."""
        return max(0, task.optimal_steps - self.k.get(self.key(task.task_id), self.start))

    def assign(self, tasks: Sequence[TaskSpec]) -> list[TaskSpec]:
        """``tasks`` with their ``expert_prefix`` set; each must know its length L (``optimal_steps``)."""
        for t in tasks:
            if t.optimal_steps <= 0:
                raise ValueError(f"rl.curriculum: {t.task_id} has no optimal_steps (0): the reverse curriculum needs "
                                 "each task's length (rl.training_pool measures it for the simulator's tasks)")
            key = self.key(t.task_id)
            self.length[key] = max(self.length.get(key, 0), t.optimal_steps)
        return [dataclasses.replace(t, expert_prefix=self.prefix(t)) for t in tasks]

    def update(self, task_id: str, successes: Sequence[float]) -> None:
        """Record a group of ``task_id`` from its current start: k grows when its success rate reaches grow_at."""
        key = self.key(task_id)
        k = self.k.get(key, self.start)
        if successes and k < self.length.get(key, 0) and sum(successes) / len(successes) >= self.grow_at:
            self.k[key] = k + self.step

    def metrics(self, pool: Sequence[TaskSpec]) -> dict[str, float]:
        """``reverse/prefix_mean`` (expert steps a pool task starts after) and ``reverse/whole`` (the share the
        policy plays whole)."""
        prefixes = [self.prefix(t) for t in pool]
        n = max(1, len(prefixes))
        return {"reverse/prefix_mean": sum(prefixes) / n, "reverse/whole": sum(p == 0 for p in prefixes) / n}

    def state_dict(self) -> dict[str, Any]:
        return {"k": dict(self.k), "length": dict(self.length)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.k = {str(t): int(v) for t, v in state.get("k", {}).items()}
        self.length = {str(t): int(v) for t, v in state.get("length", {}).items()}
