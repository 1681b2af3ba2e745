"""DAPO's dynamic sampling (Yu et al. 2025, §3.2), an off-by-default option of the `rl` stage.

A group whose rewards are all equal has zero advantage everywhere (Eq. 1) and gives the update no gradient
but its KL term. Dynamic sampling over-samples instead: after a round's first draw of ``train_batch_size``
tasks, groups with zero reward variance are set aside and further draws of ``train_batch_size`` new tasks
(none drawn before in the round) are rolled out until ``train_batch_size`` groups with signal are held or
``max_draws`` draws were made; the update trains on the first ``train_batch_size`` of them in draw order
(fewer when the cap is hit, as DAPO's). Draw d of round r is seeded by (seed, r, d) alone, so a resumed run
draws the same. Every drawn group, discarded or not, is on-policy data of the round: it updates the failure
curriculum and the ``rollout/*`` metrics.

"Signal" is judged on the rewards the advantages come from: after SPA when SPA is on, so an all-success
group whose lengths differ keeps its signal (SPA ranks the shorter successes higher).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mobilerl.rl.hooks import Hook, Metrics, RoundContext
from mobilerl.rl.spa import shortest_path_rewards


def has_signal(group: Any, spa_alpha: float | None) -> bool:
    """Whether a group's rewards (binary success, SPA-adjusted with ``spa_alpha``) have non-zero variance."""
    binary = [1.0 if t.success else 0.0 for t in group.trajectories]
    lengths = [max(1, t.n_steps) for t in group.trajectories]
    rewards = shortest_path_rewards(binary, lengths, spa_alpha) if spa_alpha is not None else binary
    return len(rewards) > 1 and float(np.var(rewards)) > 0.0


def fill_batch(first: Sequence[Any], draw: Callable[[int, set[str]], Sequence[Any]], want: int, max_draws: int,
               signal: Callable[[Any], bool]) -> tuple[list[Any], list[Any], dict[str, float]]:
    """Draw until ``want`` groups have signal or ``max_draws`` draws were made (the first, ``first``,
    included). ``draw(d, seen)`` rolls out draw d on tasks outside ``seen`` (the task ids drawn so far this
    round) and returns its groups (none: the pool is spent). Returns (the groups to train on — at most
    ``want``, in draw order —, every group drawn, ``sampling/*`` metrics)."""
    if max_draws < 1:
        raise ValueError(f"rl.dynamic_sampling.max_draws must be >= 1, got {max_draws}")
    drawn = list(first)
    kept = [g for g in drawn if signal(g)]
    draws = 1
    while len(kept) < want and draws < max_draws:
        more = list(draw(draws, {g.task_id for g in drawn}))
        draws += 1
        if not more:
            break
        drawn += more
        kept += [g for g in more if signal(g)]
    return kept[:want], drawn, {
        "sampling/draws": float(draws), "sampling/groups": float(len(drawn)),
        "sampling/groups_with_signal": float(len(kept)), "sampling/discarded": float(len(drawn) - len(kept)),
        "sampling/surplus": float(max(0, len(kept) - want)), "sampling/trained_groups": float(min(want, len(kept)))}


class DynamicSampling(Hook):
    """The hook at "groups scored": the round's first draw in, the groups to train on out; the further draws come
    from ``ctx.draw`` (the hooks before this one, BEPA, applied to them)."""

    name = "dynamic_sampling"

    def __init__(self, max_draws: int, want: int, spa_alpha: float | None) -> None:
        self.max_draws, self.want, self.spa_alpha = max_draws, want, spa_alpha

    def groups_collected(self, ctx: RoundContext, groups: list[Any]) -> tuple[list[Any], Metrics]:
        if ctx.draw is None:
            raise ValueError("rl.dynamic_sampling needs the synchronous loop's further draws")
        kept, _, m = fill_batch(groups, lambda d, seen: ctx.draw(d, seen, self), self.want, self.max_draws,
                                lambda g: has_signal(g, self.spa_alpha))
        return kept, m
