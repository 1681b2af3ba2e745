"""Shortest-path reward adjustment (SPA, MobileRL §2.2.1, Eq. 2).

The authors' released training code uses a penalty (T_i − T_min)/(2·T_i), i.e. α = 0.5; the paper's
hyper-parameter table says α = 1.0, the `paper` recipe's (``rl.algo.spa_alpha``; `authors`: 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence


def shortest_path_rewards(rewards: Sequence[float], lengths: Sequence[int], alpha: float = 1.0) -> list[float]:
    """SPA rewards of one task's group of n trajectories (Eq. 2)::

        R_i = r_i · (1 − α · (T_i − T_min) / T_i),   T_min = min { T_j : r_j = 1 }

    ``rewards`` (n,) terminal rewards in [0, 1] (a success is r > 0; binary verifiers give 1), ``lengths``
    (n,) steps T_i ≥ 1. Failures stay 0; a group without a success is returned unchanged. The result is
    broadcast to every step of its trajectory by the caller (the advantage is per trajectory).
    """
    if len(rewards) != len(lengths):
        raise ValueError(f"{len(rewards)} rewards but {len(lengths)} lengths")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    succ = [t for r, t in zip(rewards, lengths, strict=True) if r > 0]
    if not succ:
        return [float(r) for r in rewards]
    if min(succ) < 1:
        raise ValueError(f"a successful trajectory has length {min(succ)} < 1")
    t_min = min(succ)
    return [float(r) * (1.0 - alpha * (t - t_min) / t) if r > 0 else float(r)
            for r, t in zip(rewards, lengths, strict=True)]
