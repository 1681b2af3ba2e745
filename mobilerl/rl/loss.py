"""The AdaGRPO objective (MobileRL §2.2, Eq. 1): group-relative advantages, the per-token clipped surrogate
against behaviour logprobs, a k3 KL to the reference policy, and the loss aggregation.

Departures and choices: the importance ratio is taken against the *behaviour* logprobs stored with each
trajectory (the rollout engine's, or a replayed sample's), never a recompute (verl's rollout-correction docs
name "π_old = π_rollout assumed" as the usual cause of collapse); the log-ratio is clamped to ±20 as verl does.
Negative pruning follows the authors' released code: an all-zero group gives no loss at all (its KL too),
and negatives beyond ``ratio``× the group's positives are dropped at random. With ``rl.tis_cap`` (the asynchronous
mode's correction) the ratio is taken against π_old, the trainer's own logprobs at the update's start, and each
token's loss is weighted by the truncated π_old/π_behaviour (:func:`tis_weights`): three policies, not two.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def group_advantages(rewards: torch.Tensor, n: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """GRPO advantages (Eq. 1): A_i = (R_i − mean_g R) / (std_g R + ε) within each task's group.

    ``rewards`` (G·n,) ordered task-major (the n samples of a task adjacent); returns (G·n,). The std is the
    unbiased one (as verl and OpenRLHF); a group of one, or of equal rewards, gets advantage 0.
    ``scale=False`` drops the std division (Dr.GRPO).
    """
    g = rewards.reshape(-1, n).to(torch.float32)  # (G, n)
    centred = g - g.mean(dim=1, keepdim=True)
    if scale and n > 1:
        centred = centred / (g.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def prune_negatives(rewards: torch.Tensor, n: int, ratio: float | None = 2.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Which trajectories give loss (1) or are muted (0), (G·n,) like ``rewards``.

    All-zero groups are muted whole; with ``ratio``, a group keeps at most ⌊ratio · positives⌋ of its
    negatives (r = 0), chosen at random (``generator``). ``ratio=None`` keeps every negative.
    """
    g = rewards.reshape(-1, n)
    pos = g > 0
    keep = pos.any(dim=1, keepdim=True).expand_as(g).clone()  # (G, n)
    if ratio is not None:
        for i in range(g.shape[0]):
            neg = (~pos[i]).nonzero().flatten()
            cap = int(ratio * int(pos[i].sum()))
            if len(neg) > cap:
                drop = neg[torch.randperm(len(neg), generator=generator)[cap:]]
                keep[i, drop] = False
    return keep.reshape(-1).to(torch.float32)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref) (Schulman; GRPO's Eq.): exp(ref − logp) − (ref − logp) − 1 ≥ 0.
    (B, T) → (B, T)."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token-mean") -> torch.Tensor:
    """Reduce per-token values (B, T) under ``mask`` (B, T) to a scalar, as verl's ``agg_loss`` names it:
    token-mean (every token of the batch weighs the same), seq-mean-token-sum, seq-mean-token-mean,
    seq-mean-token-sum-norm (Dr.GRPO: the token sum divided by the longest response, T)."""
    mask = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    seq_sum = (x * mask).sum(dim=1)  # (B,)
    if mode == "seq-mean-token-sum":
        return seq_sum.mean()
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(dim=1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum-norm":
        return seq_sum.sum() / (x.shape[0] * x.shape[1])
    raise ValueError(f"unknown aggregation {mode!r}")


def tis_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Truncated importance weights of tokens sampled by a stale policy (TIS; verl's rollout correction, the
    MobileRL authors' asynchronous trainer with C = 2)::

        w_t = min(π_old(y_t) / π_behaviour(y_t), C) = min(exp(logπ_old(y_t) − logπ_behaviour(y_t)), C)

    ``old_logprobs`` (B, T): the trainer's weights at the update's start; ``behaviour_logprobs`` (B, T): the
    rollout engine's, stored with the trajectory. Returns (B, T), detached (a weight on the loss, not part of
    the objective's graph); 1 on-policy; ``cap=None``: all ones (off).
    """
    if cap is None:
        return torch.ones_like(old_logprobs)
    # clamping the log-ratio first keeps exp finite for any gap
    return torch.exp((old_logprobs - behaviour_logprobs).detach().clamp(max=math.log(cap)))


def policy_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                ref_logp: torch.Tensor | None = None, clip_eps: float = 0.2, kl_coef: float = 0.001,
                agg: Aggregation = "token-mean", tis_weight: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO surrogate with a KL penalty (MobileRL Eq. 1, DeepSeekMath's GRPO)::

        ρ_t = exp(logπ_θ(y_t) − logπ_behaviour(y_t))
        L   = agg[ −min(ρ_t A, clip(ρ_t, 1 − ε, 1 + ε) A) + β · KL_k3(π_θ ‖ π_ref)_t ]

    ``logp``, ``behaviour_logp``, ``mask`` (B, T) (mask 0 on padding and on muted trajectories), ``advantages``
    (B,) broadcast over each trajectory's tokens (one row = one step's response). Metrics: ``clip_frac`` (the
    share of tokens whose ratio left [1 − ε, 1 + ε] on the side that clips: the paper's Figure 11),
    ``approx_kl`` (k3 of behaviour vs current), ``kl_ref``, ``ratio_mean``. ``tis_weight`` (B, T): a per-token
    weight on the surrogate (:func:`tis_weights`; then ``behaviour_logp`` is π_old's), metric ``tis_mean``.
    """
    mask = mask.to(logp.dtype)
    log_ratio = (logp - behaviour_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if tis_weight is not None:
        per_token = per_token * tis_weight
    kl_ref = kl_k3(logp, ref_logp) if ref_logp is not None and kl_coef else torch.zeros_like(logp)
    loss = aggregate(per_token + kl_coef * kl_ref, mask, agg)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clip_frac = (((clipped < unclipped).to(logp.dtype) * mask).sum() / n).item()
        approx_kl = ((kl_k3(behaviour_logp, logp) * mask).sum() / n).item()
        metrics = {"clip_frac": clip_frac, "approx_kl": approx_kl,
                   "kl_ref": ((kl_ref * mask).sum() / n).item(),
                   "ratio_mean": ((ratio * mask).sum() / n).item()}
        if tis_weight is not None:
            metrics["tis_mean"] = ((tis_weight * mask).sum() / n).item()
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the sampling distribution, (B, T, V) → (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
