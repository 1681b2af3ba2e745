"""DistRL's replay (distrl.txt §5.2, §5.3, Appendix A.4) as a switch of the `rl` stage (``rl.distrl``), off
by default: Distributed Prioritized Experience Replay (DPER) with a Retrace(λ) correction of the replayed
trajectories.

- **Buffer**: circular, capacity N (A.4.2, Eq. 2): a new trajectory overwrites the oldest, i ← (i + 1) mod N.
  It holds the round's trained trajectories that carry a signal (kept by negative pruning, A ≠ 0: a zero
  advantage gives no policy gradient), with the advantage they were trained with (as AdaPR's do).
- **Priority** (§5.3, A.4.3): p(τ) = w₁·|δ̄| + w₂·ρ̄ + w₃·H̄, each term scaled to [0, 1] (|δ̄| and H̄ by their
  maximum over the buffer); replay probability P(τ) = p^α / Σ p^α with α = 0.5. Mapping to GRPO, which has
  no value network: the TD error's place is taken by the trajectory's advantage |A| (the A-RIDE advantage is a
  one-step TD error); ρ̄ is the mean over steps of min(1, ρ_t), ρ_t = π(a_t|s_t)/μ(a_t|s_t) the action's
  (step's) ratio, so near-on-policy trajectories rank higher (§6.6: "smaller policy discrepancies"); H̄ is the
  mean of H_t = −log π(a_t|s_t) (the paper's entropy term, the sampled action's surprisal). A fresh entry is
  on-policy (ρ̄ = 1, H̄ from its behaviour logprobs); a replayed one's ρ̄ and H̄ are refreshed with the
  current policy's logprobs each time it is replayed ("priorities are periodically updated").
- **Replay**: ⌊share · M⌋ trajectories a round (M the round's configured batch, as AdaPR's), drawn by P
  without replacement, before the round's own trajectories enter; none that AdaPR replays in the same round.
  No importance weight for the prioritised draw (the paper uses none).
- **Retrace** (§5.2): δ_t = Σ_{k≥t} γ^{k−t} (Π_{i=t+1..k} c_i) [r_k + γV(s_{k+1}) − V(s_k)],
  c_i = λ·min(1, ρ_i).
  GRPO's baseline is one value per group (V ≡ b) and the reward comes at the last step H (γ = 1), so every
  TD error but the last is 0 and the corrected advantage of step t is (Π_{i=t+1..H} c_i)·A: the
  trajectory's advantage times the truncated trace of the steps after t (:func:`retrace_weights`). It scales
  the advantage of every off-policy row (DPER's and, when both are on, AdaPR's replays); fresh rows are on
  the sampling policy and keep theirs. The step's own ratio stays in the clipped surrogate.

Defaults where the paper gives none: w = (1.0, 0.3, 0.3) (A.4.3 reports its grid, not its pick, and weighs
|δ̄| highest), λ = 1 (Retrace's usual choice: on-policy rows keep their advantage, truncation alone corrects),
share 0.25, capacity 256 (AdaPR's).

DistRL runs *with* AdaGRPO (SPA, AdaPR, FCF, pruning stay; ``rl.adapr=false`` leaves DPER alone): AdaPR
replays the best successes, DPER a priority-drawn mix; both are replay, and the paper implies no conflict.
Not taken: the A-RIDE value networks, the entropy bonus and the invalid-action penalty of Eq. 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from mobilerl.rl.config import DistRLConfig
from mobilerl.rl.hooks import Hook, Metrics, PerTraj, RoundContext
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

T = TypeVar("T")


def step_log_ratios(logprobs: Sequence[Sequence[float]], behaviour: Sequence[Sequence[float]]) -> torch.Tensor:
    """log ρ_t = log π(a_t|s_t) − log μ(a_t|s_t) of each step (its response's tokens summed): (S,) from S
    steps' per-token logprobs under the current (π) and behaviour (μ) policies."""
    if len(logprobs) != len(behaviour):
        raise ValueError(f"{len(logprobs)} steps of current logprobs but {len(behaviour)} of behaviour")
    return torch.tensor([float(sum(p)) - float(sum(q)) for p, q in zip(logprobs, behaviour, strict=True)],
                        dtype=torch.float64)


def retrace_traces(log_ratios: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """Retrace's traces c_t = λ · min(1, ρ_t) (§5.2), (S,) → (S,); each in [0, λ]."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"Retrace λ must be in [0, 1], got {lam}")
    return lam * torch.exp(log_ratios.clamp(max=0.0))


def retrace_weights(log_ratios: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """The Retrace factor of each step's advantage, w_t = Π_{i=t+1}^{S−1} c_i (the last step's is 1),
    (S,) → (S,).

    With one baseline per group and the reward at the last step, Retrace's δ_t reduces to w_t · A (module
    docstring). On-policy (ρ = 1) w_t = λ^(S−1−t); each factor is at most λ, so w_t ≤ λ^(S−1−t) ≤ 1.
    """
    c = retrace_traces(log_ratios, lam)
    if len(c) == 0:
        return c
    after = torch.cat([c[1:], c.new_ones(1)])  # (S,): c_{t+1}, and 1 for the last step
    # a reversed cumulative product (no division: a trace may be 0)
    return torch.flip(torch.cumprod(torch.flip(after, [0]), 0), [0])


def priorities(abs_adv: np.ndarray, rho_mean: np.ndarray, nll_mean: np.ndarray,
               weights: tuple[float, float, float] = (1.0, 0.3, 0.3)) -> np.ndarray:
    """DPER's p(τ) = w₁·|δ̄|/max|δ̄| + w₂·ρ̄ + w₃·H̄/max H̄ (§5.3, A.4.3) for N trajectories, (N,) each →
    (N,). ``rho_mean`` is already in [0, 1] (min(1, ρ_t) averaged); the maxima are over the N given."""
    w1, w2, w3 = weights
    a = np.asarray(abs_adv, dtype=np.float64)
    h = np.asarray(nll_mean, dtype=np.float64)
    return (w1 * a / max(a.max(initial=0.0), 1e-12) + w2 * np.asarray(rho_mean, dtype=np.float64)
            + w3 * h / max(h.max(initial=0.0), 1e-12))


def replay_probabilities(p: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """P(τ_i) = p_i^α / Σ_j p_j^α (A.4.2; α = 0: uniform, 1: proportional), (N,) → (N,)."""
    q = np.power(np.maximum(np.asarray(p, dtype=np.float64), 1e-12), alpha)
    return q / q.sum()


def step_stats(logprobs: Sequence[Sequence[float]], behaviour: Sequence[Sequence[float]]) -> tuple[float, float]:
    """A trajectory's ρ̄ = mean_t min(1, ρ_t) and H̄ = mean_t −log π(a_t|s_t) from its steps' token logprobs
    under the current policy and the behaviour policy."""
    if not logprobs:
        return 1.0, 0.0
    rho = torch.exp(step_log_ratios(logprobs, behaviour).clamp(max=0.0))
    nll = [-float(sum(p)) for p in logprobs]
    return float(rho.mean()), float(np.mean(nll))


@dataclass
class Entry(Generic[T]):
    trajectory: T
    advantage: float
    rho_mean: float
    nll_mean: float
    round: int


class PrioritizedReplay(Generic[T]):
    """DistRL's circular buffer of trajectories with the per-entry statistics its priority needs."""

    def __init__(self, capacity: int = 256, weights: tuple[float, float, float] = (1.0, 0.3, 0.3),
                 alpha: float = 0.5) -> None:
        if capacity < 1 or alpha < 0 or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"need capacity >= 1, alpha >= 0, weights >= 0 not all 0; got {capacity}, {alpha}, "
                             f"{weights}")
        self.capacity, self.weights, self.alpha = capacity, tuple(weights), alpha
        self.entries: list[Entry[T]] = []
        self.next = 0  # the slot the next push writes once the buffer is full

    def push(self, trajectory: T, advantage: float, rho_mean: float, nll_mean: float, round: int) -> None:
        entry = Entry(trajectory, float(advantage), float(rho_mean), float(nll_mean), round)
        if len(self.entries) < self.capacity:
            self.entries.append(entry)
        else:
            self.entries[self.next] = entry  # the oldest
        self.next = (self.next + 1) % self.capacity

    def priorities(self) -> np.ndarray:
        e = self.entries
        return priorities(np.array([abs(x.advantage) for x in e]), np.array([x.rho_mean for x in e]),
                          np.array([x.nll_mean for x in e]), self.weights)

    def sample(self, k: int, rng: np.random.Generator, exclude: Callable[[T], bool] = lambda t: False) -> list[int]:
        """Indices of at most ``k`` distinct entries drawn with probability P(τ) ∝ p(τ)^α (the buffer is
        unchanged); entries for which ``exclude`` holds are not drawn."""
        idx = [i for i, e in enumerate(self.entries) if not exclude(e.trajectory)]
        k = min(k, len(idx))
        if k <= 0:
            return []
        p = replay_probabilities(self.priorities()[idx], self.alpha)
        return [idx[j] for j in rng.choice(len(idx), size=k, replace=False, p=p)]

    def refresh(self, i: int, rho_mean: float, nll_mean: float) -> None:
        """Entry ``i``'s ρ̄ and H̄ under the current policy (after a replay)."""
        self.entries[i].rho_mean, self.entries[i].nll_mean = float(rho_mean), float(nll_mean)

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self, encode: Callable[[T], Any] = lambda t: t) -> dict[str, Any]:
        return {"next": self.next, "entries": [
            {"trajectory": encode(e.trajectory), "advantage": e.advantage, "rho_mean": e.rho_mean,
             "nll_mean": e.nll_mean, "round": e.round} for e in self.entries]}

    def load_state_dict(self, state: dict[str, Any], decode: Callable[[Any], T] = lambda t: t) -> None:
        self.entries = [Entry(decode(e["trajectory"]), float(e["advantage"]), float(e["rho_mean"]),
                              float(e["nll_mean"]), int(e["round"])) for e in state["entries"]]
        self.next = int(state["next"]) % self.capacity


def replay_count(share: float, m: int) -> int:
    """Trajectories DPER replays in a round: ⌊share · M⌋."""
    return math.floor(share * m)


def retrace_rows(rows: Sequence[Any], current: Sequence[Sequence[float]], lam: float = 1.0) -> torch.Tensor:
    """Scale the advantages of one off-policy trajectory's rows (its steps, in order: each with
    ``behaviour_logprobs`` and ``advantage``) by their Retrace weights, in place; ``current`` holds each row's
    token logprobs under the policy being trained. Returns the weights (S,)."""
    w = retrace_weights(step_log_ratios(current, [r.behaviour_logprobs for r in rows]), lam)
    for r, x in zip(rows, w.tolist(), strict=True):
        r.advantage = r.advantage * x
    return w


def episode_key(t: Trajectory) -> tuple[str, int, int | None, str | None]:
    """Which episode a trajectory is (the same one AdaPR holds is not drawn twice in a round)."""
    return t.task_id, t.trial, t.seed, t.policy_version


def behaviour_nll(t: Trajectory) -> float:
    """H̄ of a fresh trajectory: mean over its sampled steps of −log μ(a_t|s_t) (its stored logprobs)."""
    nll = [-sum(s.logprobs) for s in t.steps if s.token_ids and s.logprobs is not None]
    return float(np.mean(nll)) if nll else 0.0


class DistRL(Hook):
    """DistRL's hook: its buffer of trajectories, the round's draw (at "rows built": ``replays``), the Retrace
    correction of the off-policy rows and the round's push (``rows_built``)."""

    name = "distrl"

    def __init__(self, capacity: int, weights: tuple[float, float, float], alpha: float, share: float,
                 lam: float, seed: int) -> None:
        self.buffer: PrioritizedReplay[Trajectory] = PrioritizedReplay(capacity, weights, alpha)
        self.share, self.lam, self.seed = share, lam, seed
        self.drawn: list[tuple[int, Trajectory]] = []  # the round's replays: buffer index and trajectory

    @classmethod
    def from_config(cls, cfg: DistRLConfig, seed: int) -> DistRL:
        return cls(cfg.buffer_size, (cfg.w_advantage, cfg.w_ratio, cfg.w_entropy), cfg.alpha, cfg.replay_share,
                   cfg.lam, seed)

    def draw(self, m: int, round: int, taken: Sequence[Trajectory]) -> tuple[list[tuple[Trajectory, float]], Metrics]:
        """This round's replays, ``(trajectory, advantage)``: ⌊share · m⌋ drawn by priority (seeded by the run's
        seed and ``round``), none of ``taken`` (AdaPR's replays)."""
        keys = {episode_key(t) for t in taken}
        rng = np.random.default_rng(stable_seed(self.seed, "distrl", round))
        idx = self.buffer.sample(replay_count(self.share, m), rng, lambda t: episode_key(t) in keys)
        self.drawn = [(i, self.buffer.entries[i].trajectory) for i in idx]
        return [(t, self.buffer.entries[i].advantage) for i, t in self.drawn], {
            "distrl/replayed": float(len(idx)),
            "distrl/priority_mean": float(self.buffer.priorities().mean()) if len(self.buffer) else 0.0}

    def push(self, trajectories: Sequence[Trajectory], advantages: Sequence[float], round: int) -> Metrics:
        """The round's trained trajectories with a signal (A ≠ 0) enter, on-policy (ρ̄ = 1)."""
        for t, a in zip(trajectories, advantages, strict=True):
            if a != 0:
                self.buffer.push(t, a, 1.0, behaviour_nll(t), round)
        return {"distrl/buffer_size": float(len(self.buffer))}

    def correct(self, per_traj: PerTraj, current: Sequence[Sequence[Sequence[float]]]) -> Metrics:
        """Retrace-weight the advantages of the off-policy trajectories' rows (``per_traj``: each trajectory's
        rows in step order), given each row's token logprobs under the current policy; the drawn entries' ρ̄
        and H̄ are refreshed from the same logprobs (found by identity, whatever else is off-policy)."""
        weights: list[float] = []
        for (_, rows), cur in zip(per_traj, current, strict=True):
            if rows:
                weights += retrace_rows(rows, cur, self.lam).tolist()
        mine = {id(t): (rows, cur) for (t, rows), cur in zip(per_traj, current, strict=True)}
        for i, t in self.drawn:
            if id(t) in mine:
                rows, cur = mine[id(t)]
                self.buffer.refresh(i, *step_stats(cur, [r.behaviour_logprobs for r in rows]))
        return {"distrl/retrace_weight_mean": float(np.mean(weights)) if weights else 1.0}

    # ------------------------------------------------------------------------------------------- hooks

    def replays(self, ctx: RoundContext, m: int, taken: Sequence[Trajectory]
                ) -> tuple[list[tuple[Trajectory, float]], Metrics]:
        return self.draw(m, ctx.r, taken)

    def rows_built(self, ctx: RoundContext, per_traj: PerTraj) -> tuple[PerTraj, Metrics]:
        off = [(t, rs) for t, rs in per_traj if rs and not rs[0].on_policy]
        stats = ctx.policy_stats([row for _, rs in off for row in rs])
        cur, k = [], 0
        for _, rs in off:
            cur.append([lp for lp, _ in stats[k: k + len(rs)]])
            k += len(rs)
        m = self.correct(off, cur)  # first: the round's push may overwrite the drawn entries
        return per_traj, m | self.push([t for t, _ in ctx.fresh], [a for _, a in ctx.fresh], ctx.r)

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict(lambda t: t.to_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.buffer.load_state_dict(state, Trajectory.from_dict)
