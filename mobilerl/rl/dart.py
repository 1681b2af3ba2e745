"""DART's data curation (dart.txt §4) as a switch of the `rl` stage (``rl.dart``), off by default.

Two of its mechanisms live here; the third, distribution alignment (§4.4, a truncated importance weight
min(π_old^train / π_old^rollout, C)), is the trainer's ``rl.algo.tis_cap`` (``loss.tis_weights``), which the
ablation's ``dart`` variant sets with this switch.

- **Dynamic rollout count** (§4.1, Figure 5): a task's rollouts fall from the maximum once its success
  rate passes 0.6 (``rl.dart.success_threshold``); tasks below it, hopeless ones included ("tasks with low
  success rates maintain maximum sampling"), keep the maximum. The paper gives the curve only as a figure;
  we take it linear from the maximum at the threshold down to ``rl.dart.min_rollouts`` at 1.0. The success
  rate is the task's over its last ``rl.dart.window`` episodes (an unseen task counts as 0: full sampling).
  Departure: the paper's asynchronous service spends the rollouts a solved task gives up on other tasks as
  they come; a synchronous round keeps its budget (tasks × ``samples_per_task``) by scaling every task's
  count with one factor, within [min, max] (:func:`allocate_rollouts`), so the freed samples go to the
  unsolved tasks of the same round.
- **High-entropy step selection** (§4.3, Eq. 2): a step's entropy is the mean of its tokens' entropies
  H_t = (1/|y_t|) Σ_i H_{t,i} under the policy at the start of the update; within each task's step group
  (every step of the batch's trajectories of that task: the paper's group D) only the steps with
  H_t ≥ τ_D^0.2 are trained, i.e. the top 80 % (``rl.dart.entropy_keep``). Per *step*, as the paper (not
  per token, as the 80/20 token paper it cites). The indicator multiplies the whole bracket, KL included, so
  a dropped step leaves the batch; under ``token-mean`` aggregation (the default) that equals masking its
  tokens.

Not taken: the dynamic trajectory length cap and the pre-collected experience pool (§4.1, §4.2: AdaPR is
this project's replay), and the step-wise advantage of §3.3 (GRPO's per-trajectory advantage stays).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from mobilerl.rl.config import DartConfig
from mobilerl.rl.hooks import Hook, Metrics, PerTraj, RoundContext


def rollout_weight(success_rate: float, threshold: float = 0.6, floor: float = 0.25) -> float:
    """The shape of DART's Figure 5, in (0, 1]: 1 up to ``threshold``, then linear down to ``floor`` at a
    success rate of 1 (``floor`` = min/max rollouts, so the maximum count maps a solved task to the minimum)."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success rate must be in [0, 1], got {success_rate}")
    if success_rate <= threshold:
        return 1.0
    return 1.0 - (1.0 - floor) * (success_rate - threshold) / (1.0 - threshold)


def allocate_rollouts(success_rates: Sequence[float], budget: int, lo: int, hi: int,
                      threshold: float = 0.6) -> list[int]:
    """Rollouts per task (G,) from their success rates (G,)::

        n_i = clip(c · w(s_i), lo, hi),   w = :func:`rollout_weight` (floor lo/hi),   Σ_i n_i = budget

    ``c`` found by bisection (Σ clip(c·w) is non-decreasing in c), then rounded by largest remainder, so the
    counts are integers, sum to ``budget`` whenever G·lo ≤ budget ≤ G·hi (else every task gets lo, or hi), and
    never rise with the success rate.
    """
    if not 2 <= lo <= hi:
        raise ValueError(f"need 2 <= min rollouts <= max rollouts, got {lo}, {hi}")
    g = len(success_rates)
    if g == 0:
        return []
    if budget <= g * lo:
        return [lo] * g
    if budget >= g * hi:
        return [hi] * g
    w = [rollout_weight(s, threshold, lo / hi) for s in success_rates]

    def filled(c: float) -> list[float]:
        return [min(hi, max(lo, c * x)) for x in w]

    a, b = 0.0, hi / min(w)  # at b every task is at hi
    for _ in range(100):
        mid = (a + b) / 2
        a, b = (mid, b) if sum(filled(mid)) < budget else (a, mid)
    x = filled(b)
    n = [math.floor(v + 1e-9) for v in x]
    # largest remainder; equal remainders (equal weights) go to the lower success rate first, then the earlier task
    order = sorted(range(g), key=lambda i: (-(x[i] - n[i]), success_rates[i], i))
    for i in order[: max(0, budget - sum(n))]:
        if n[i] < hi:
            n[i] += 1
    return n


def step_entropy(token_entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DART's step entropy H_t = (1/|y_t|) Σ_i H_{t,i}: the mean token entropy of each row (step) under its
    response mask. (B, T), (B, T) → (B,)."""
    mask = mask.to(token_entropy.dtype)
    return (token_entropy * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def high_entropy_steps(entropy: torch.Tensor, groups: torch.Tensor, keep: float = 0.8) -> torch.Tensor:
    """Which steps DART trains (Eq. 2's 𝕀[H_t ≥ τ_D^0.2]): in each group (task) the ⌈keep · n⌉ steps of
    highest entropy. ``entropy`` (B,) step entropies, ``groups`` (B,) integer group ids; returns a bool mask (B,).
    Exactly that many per group: among equal entropies the earlier step is kept."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep share must be in (0, 1], got {keep}")
    out = torch.zeros_like(entropy, dtype=torch.bool)
    for gid in groups.unique():
        idx = (groups == gid).nonzero().flatten()
        k = math.ceil(round(keep * len(idx), 9))
        # stable sort on −H: ties keep their batch order
        order = torch.sort(-entropy[idx], stable=True).indices
        out[idx[order[:k]]] = True
    return out


def entropy_mask(token_entropy: torch.Tensor, response_mask: torch.Tensor, groups: torch.Tensor,
                 keep: float = 0.8) -> torch.Tensor:
    """The response mask (B, T) with the low-entropy steps zeroed: ``response_mask`` × 𝕀[step kept] per row."""
    kept = high_entropy_steps(step_entropy(token_entropy, response_mask), groups, keep)
    return response_mask * kept.unsqueeze(1).to(response_mask.dtype)


def select_steps(task_ids: Sequence[str], token_entropy: Sequence[Sequence[float]], keep: float = 0.8) -> list[bool]:
    """Which of a batch's rows (steps) DART trains: :func:`entropy_mask` over the rows grouped by task, from
    each row's task id and its tokens' entropies under the policy at the start of the update."""
    gid = {t: i for i, t in enumerate(dict.fromkeys(task_ids))}
    width = max((len(e) for e in token_entropy), default=0)
    ent = torch.zeros((len(task_ids), width))
    mask = torch.zeros((len(task_ids), width))
    for i, e in enumerate(token_entropy):
        ent[i, : len(e)] = torch.tensor(e, dtype=torch.float32)
        mask[i, : len(e)] = 1.0
    groups = torch.tensor([gid[t] for t in task_ids], dtype=torch.long)
    return (entropy_mask(ent, mask, groups, keep).sum(dim=1) > 0).tolist()


class DartCurator(Hook):
    """DART's hook: per-task recent outcomes (for the rollout counts, at "tasks drawn"), the entropy selection of
    the rows (at "rows built"), the round's outcomes recorded (at "update done")."""

    name = "dart"

    def __init__(self, lo: int, hi: int, samples_per_task: int, threshold: float = 0.6, window: int = 16,
                 entropy_keep: float = 0.8) -> None:
        if not 2 <= lo <= samples_per_task <= hi:
            raise ValueError(f"rl.dart.min_rollouts ({lo}) <= samples_per_task ({samples_per_task}) <= "
                             f"rl.dart.max_rollouts ({hi}) must hold (and min >= 2: a group needs two)")
        self.lo, self.hi, self.n = lo, hi, samples_per_task
        self.threshold, self.window, self.entropy_keep = threshold, window, entropy_keep
        self.outcomes: dict[str, deque[float]] = {}

    @classmethod
    def from_config(cls, cfg: DartConfig, samples_per_task: int) -> DartCurator:
        return cls(cfg.min_rollouts, cfg.max_rollouts, samples_per_task, cfg.success_threshold, cfg.window,
                   cfg.entropy_keep)

    def success_rate(self, task_id: str) -> float:
        seen = self.outcomes.get(task_id)
        return sum(seen) / len(seen) if seen else 0.0

    def rollout_counts(self, task_ids: Sequence[str]) -> tuple[list[int], Metrics]:
        """The round's rollouts per task; the budget is the fixed-n round's (tasks × samples_per_task)."""
        rates = [self.success_rate(t) for t in task_ids]
        n = allocate_rollouts(rates, len(task_ids) * self.n, self.lo, self.hi, self.threshold)
        return n, {"dart/rollouts_per_task_mean": float(sum(n) / len(n)) if n else 0.0,
                   "dart/rollouts_per_task_min": float(min(n, default=0)),
                   "dart/rollouts_per_task_max": float(max(n, default=0))}

    def select(self, task_ids: Sequence[str], token_entropy: Sequence[Sequence[float]]) -> tuple[list[bool], Metrics]:
        """Which of the batch's rows to train (:func:`select_steps` at ``entropy_keep``)."""
        keep = select_steps(task_ids, token_entropy, self.entropy_keep)
        tokens = [len(e) for e in token_entropy]
        return keep, {"dart/steps_kept_share": sum(keep) / len(keep) if keep else 1.0,
                      "dart/tokens_kept_share": (sum(n for n, k in zip(tokens, keep, strict=True) if k)
                                                 / max(1, sum(tokens)))}

    def update(self, task_id: str, successes: Sequence[float]) -> None:
        """Record a round's binary outcomes of ``task_id`` (its group, env failures already dropped)."""
        self.outcomes.setdefault(task_id, deque(maxlen=self.window)).extend(float(s) for s in successes)

    # ------------------------------------------------------------------------------------------- hooks

    def tasks_drawn(self, ctx: RoundContext, tasks: Sequence[Any]) -> tuple[list[int] | None, Metrics]:
        return self.rollout_counts([t.task_id for t in tasks])

    def rows_built(self, ctx: RoundContext, per_traj: PerTraj) -> tuple[PerTraj, Metrics]:
        flat = [(t, row) for t, rs in per_traj for row in rs]
        ent = [e for _, e in ctx.policy_stats([row for _, row in flat])]
        keep, m = self.select([t.task_id for t, _ in flat], ent)
        kept = {id(row) for (_, row), k in zip(flat, keep, strict=True) if k}
        return [(t, [row for row in rs if id(row) in kept]) for t, rs in per_traj], m

    def update_done(self, ctx: RoundContext) -> Metrics:
        for g in ctx.groups:
            self.update(g.task_id, g.successes)
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"outcomes": {k: list(v) for k, v in self.outcomes.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.outcomes = {str(k): deque((float(x) for x in v), maxlen=self.window)
                         for k, v in state.get("outcomes", {}).items()}
