"""Difficulty-adaptive positive replay (AdaPR, MobileRL §2.2.2 and Appendix B).

Each round the top κ of the fresh trajectories by advantage (positive ones only) enter the buffer; an entry
stays for N = 1/κ pushes (its own included), so it is drawn in N rounds (Appendix B's N = 4 at κ = 0.25: ages 1 … N
when a round draws before its push, 0 … N−1 after), and past ``capacity`` the lowest advantages leave first (with
``recency`` α: the lowest (1 − α)·advantage + α·recency, each min-max normalised over the buffer, the authors'
``balance_alpha``). An update mixes at
most ⌊γ·M⌋ buffered trajectories, highest advantage first, into a batch of M fresh ones. Stored trajectories
keep their behaviour logprobs and policy version: a replayed sample is off-policy, and its importance ratio
is taken against the logprobs it was generated with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class Entry(Generic[T]):
    trajectory: T
    advantage: float
    round: int


class PositiveReplay(Generic[T]):
    def __init__(self, capacity: int = 256, kappa: float = 0.25, gamma: float = 1.0, recency: float = 0.0) -> None:
        if capacity < 1 or not 0 < kappa <= 1 or gamma < 0 or not 0 <= recency <= 1:
            raise ValueError(f"need capacity >= 1, 0 < kappa <= 1, gamma >= 0, 0 <= recency <= 1; got {capacity}, "
                             f"{kappa}, {gamma}, {recency}")
        self.capacity = capacity
        self.recency = recency
        self.kappa = kappa
        self.gamma = gamma
        self.entries: list[Entry[T]] = []

    @property
    def max_age(self) -> float:
        return 1.0 / self.kappa

    def push(self, trajectories: Sequence[T], advantages: Sequence[float], round: int) -> int:
        """Age out, insert the round's top κ fraction (positive advantages), cap; returns how many entered."""
        if len(trajectories) != len(advantages):
            raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
        self.entries = [e for e in self.entries if round - e.round < self.max_age]
        n_top = max(1, int(self.kappa * len(trajectories))) if trajectories else 0
        order = sorted(range(len(trajectories)), key=lambda i: -advantages[i])[:n_top]
        new = [Entry(trajectories[i], float(advantages[i]), round) for i in order if advantages[i] > 0]
        self.entries.extend(new)
        if len(self.entries) > self.capacity:
            score = self._keep_score()
            # stable: among equal scores the newer entries stay
            keep = sorted(range(len(self.entries)), key=lambda i: (-score[i], -i))[: self.capacity]
            self.entries = [self.entries[i] for i in sorted(keep)]
        return len(new)

    def _keep_score(self) -> list[float]:
        """(1 − α)·advantage + α·recency per entry, each min-max normalised (α = ``recency``; 0: the advantage)."""
        adv = [e.advantage for e in self.entries]
        if not self.recency:
            return adv
        rnd = [float(e.round) for e in self.entries]

        def norm(x: list[float]) -> list[float]:
            lo, hi = min(x), max(x)
            return [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in x]

        return [(1 - self.recency) * a + self.recency * t for a, t in zip(norm(adv), norm(rnd), strict=True)]

    def sample(self, m: int) -> list[tuple[T, float]]:
        """At most ⌊γ·m⌋ ``(trajectory, advantage)`` pairs, highest advantage first (the buffer is unchanged)."""
        k = min(len(self.entries), math.floor(self.gamma * m))
        best = sorted(self.entries, key=lambda e: -e.advantage)[:k]
        return [(e.trajectory, e.advantage) for e in best]

    def __len__(self) -> int:
        return len(self.entries)

    def mean_age(self, round: int) -> float:
        return sum(round - e.round for e in self.entries) / len(self.entries) if self.entries else 0.0

    def state_dict(self, encode: Callable[[T], Any] = lambda t: t) -> dict[str, Any]:
        return {"entries": [{"trajectory": encode(e.trajectory), "advantage": e.advantage, "round": e.round}
                            for e in self.entries]}

    def load_state_dict(self, state: dict[str, Any], decode: Callable[[Any], T] = lambda t: t) -> None:
        self.entries = [Entry(decode(e["trajectory"]), float(e["advantage"]), int(e["round"]))
                        for e in state["entries"]]
