"""The AdaGRPO objective (MobileRL §2.2, Eq. 1): group-relative advantages, the per-token clipped surrogate
against behaviour logprobs, a k3 KL to the reference policy, and the loss aggregation.

Departures and choices: the importance ratio is taken against the *behaviour* logprobs stored with each
trajectory (the rollout engine's, or a replayed sample's), never a recompute (verl's rollout-correction docs
name "π_old = π_rollout assumed" as the usual cause of collapse); the log-ratio is clamped to ±20 as verl does.
Negative pruning follows the authors' released code: an all-zero group gives no loss at all (its KL too),
and negatives beyond ``ratio``× the group's positives are dropped at random. With ``rl.algo.tis_cap`` (the asynchronous
mode's correction) the ratio is taken against π_old, the trainer's own logprobs at the update's start, and each
token's loss is weighted by the truncated π_old/π_behaviour (:func:`tis_weights`): three policies, not two.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def group_advantages(rewards: torch.Tensor, n: int, eps: float = 1e-6, scale: bool = True,
                     weights: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO advantages (Eq. 1): A_i = (R_i − mean_g R) / (std_g R + ε) within each task's group.

    ``rewards`` (G·n,) ordered task-major (the n samples of a task adjacent); returns (G·n,). The std is the
    unbiased one (as verl and OpenRLHF); a group of one, or of equal rewards, gets advantage 0.
    ``scale=False`` drops the std division (Dr.GRPO). ``weights`` (G·n,): how many step rows each trajectory
    is (the authors' statistics over rows): mean_g = Σ w_i R_i / Σ w_i, std_g² = Σ w_i (R_i − mean_g)² / (Σ w_i − 1).
    """
    g = rewards.reshape(-1, n).to(torch.float32)  # (G, n)
    w = torch.ones_like(g) if weights is None else weights.reshape(-1, n).to(torch.float32)
    total = w.sum(dim=1, keepdim=True)
    mean = (w * g).sum(dim=1, keepdim=True) / total
    centred = g - mean
    if scale and n > 1:
        std = ((w * centred**2).sum(dim=1, keepdim=True) / (total - 1).clamp(min=1e-12)).sqrt()
        centred = centred / (std + eps)
    return centred.reshape(-1)


def whiten(values: torch.Tensor, weights: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A − mean) / (std + ε) with every value counted ``weights`` times (its step rows); (N,) → (N,). The
    authors' re-normalisation of the advantages within one data source (``task_adv_normalize``, our reading)."""
    w = weights.to(torch.float32)
    if w.sum() <= 1:
        return values.to(torch.float32)
    mean = (w * values).sum() / w.sum()
    std = ((w * (values - mean) ** 2).sum() / (w.sum() - 1)).sqrt()
    return (values - mean) / (std + eps)


def prune_negatives(rewards: torch.Tensor, n: int, ratio: float | None = 2.0,
                    generator: torch.Generator | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Which trajectories give loss (1) or are muted (0), (G·n,) like ``rewards``.

    All-zero groups are muted whole; with ``ratio``, a group keeps at most ⌊ratio · positives⌋ of its
    negatives (r = 0), chosen at random (``generator``). ``rows`` (G·n,): count step rows instead (the authors'
    rule): negatives, in a random order, are kept while their rows stay within ratio × the positives' rows.
    ``ratio=None`` keeps every negative.
    """
    g = rewards.reshape(-1, n)
    size = torch.ones_like(g) if rows is None else rows.reshape(-1, n).to(g.dtype)
    pos = g > 0
    keep = pos.any(dim=1, keepdim=True).expand_as(g).clone()  # (G, n)
    if ratio is not None:
        for i in range(g.shape[0]):
            neg = (~pos[i]).nonzero().flatten()
            cap = math.floor(ratio * float(size[i][pos[i]].sum()))
            if float(size[i][neg].sum()) <= cap:
                continue
            order = neg[torch.randperm(len(neg), generator=generator)]
            used = 0.0
            for j in order.tolist():
                used += float(size[i, j])
                if used > cap:
                    keep[i, j] = False
    return keep.reshape(-1).to(torch.float32)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref) (Schulman; GRPO's Eq.): exp(ref − logp) − (ref − logp) − 1 ≥ 0,
    clamped to ≤ 10 (verl's low_var_kl: one token's estimate can reach 10^8 at the log-ratio clamp of ±20).
    (B, T) → (B, T)."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(max=10.0)


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
                clip_high: float | None = None, dual_clip: float | None = None,
                entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO surrogate with a KL penalty (MobileRL Eq. 1, DeepSeekMath's GRPO)::

        ρ_t = exp(logπ_θ(y_t) − logπ_behaviour(y_t))
        l_t = −min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high) A)
        l_t = min(l_t, −c·A)  where A < 0                       (dual clip, ``dual_clip`` = c)
        L   = agg[ l_t + β · KL_k3(π_θ ‖ π_ref)_t − η · H_t ]   (entropy bonus η, ``entropy_coef``)

    ``logp``, ``behaviour_logp``, ``mask`` (B, T) (mask 0 on padding and on muted trajectories), ``advantages``
    (B,) broadcast over each trajectory's tokens (one row = one step's response); ``clip_eps`` is ε_low and
    ε_high unless ``clip_high`` is given; ``entropy`` (B, T) with its graph when ``entropy_coef`` > 0. Metrics:
    ``clip_frac`` (the share of tokens whose ratio left [1 − ε_low, 1 + ε_high] on the side that clips: the
    paper's Figure 11), ``dual_clip_frac``, ``approx_kl`` (k3 of behaviour vs current), ``kl_ref``,
    ``ratio_mean``. ``tis_weight`` (B, T): a per-token weight on the surrogate (:func:`tis_weights`; then
    ``behaviour_logp`` is π_old's), metric ``tis_mean``.
    """
    mask = mask.to(logp.dtype)
    log_ratio = (logp - behaviour_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + (clip_eps if clip_high is None else clip_high)) * adv
    per_token = -torch.minimum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        bound = -dual_clip * adv  # > 0 where A < 0
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual, bound.expand_as(per_token), per_token)
    if tis_weight is not None:
        per_token = per_token * tis_weight
    kl_ref = kl_k3(logp, ref_logp) if ref_logp is not None and kl_coef else torch.zeros_like(logp)
    total = per_token + kl_coef * kl_ref
    if entropy_coef and entropy is not None:
        total = total - entropy_coef * entropy
    loss = aggregate(total, mask, agg)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clip_frac = (((clipped < unclipped).to(logp.dtype) * mask).sum() / n).item()
        approx_kl = ((kl_k3(behaviour_logp, logp) * mask).sum() / n).item()
        metrics = {"clip_frac": clip_frac, "approx_kl": approx_kl,
                   "kl_ref": ((kl_ref * mask).sum() / n).item(),
                   "ratio_mean": ((ratio * mask).sum() / n).item()}
        if dual_clip is not None:
            metrics["dual_clip_frac"] = ((dual.to(logp.dtype) * mask).sum() / n).item()
        if tis_weight is not None:
            metrics["tis_mean"] = ((tis_weight * mask).sum() / n).item()
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the sampling distribution, (B, T, V) → (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
