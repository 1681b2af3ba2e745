"""The AdaGRPO update, written once for every trainer backend: ``ppo_epochs`` optimiser steps over the round's
rows, each step accumulating its micro-batches' losses (the clipped surrogate against the behaviour logprobs,
or with ``rl.algo.tis_cap`` against π_old with truncated IS, plus the k3 KL: :func:`mobilerl.rl.loss.policy_loss`).

Where the processes differ, a :class:`Stepper` supplies it: which micro-batches this process runs (its shard),
what runs the forward, how a loss is backpropagated and how the step is taken, and how the processes' metrics
combine. :class:`SingleProcess` is one process; :mod:`mobilerl.rl.distributed` has ddp and DeepSpeed ZeRO.
Each micro-batch's loss is scaled by its share of the WHOLE step (all processes' response tokens, or rows for
the seq-mean aggregations), so the gradients summed over processes are the one-process gradient.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from mobilerl.models.profiles import RLSettings
from mobilerl.rl.batch import Row, Vision, collate, micro_batches, rows_logprobs
from mobilerl.rl.loss import policy_loss, tis_weights
from mobilerl.rl.recipe import Algo


class Stepper(Protocol):
    """How one process takes part in an update."""

    def batches(self, rows: Sequence[Row], max_tokens: int) -> tuple[list[list[Row]], int]:
        """This process's micro-batches, and how many of them are real (the rest pad a collective)."""

    def forward_model(self) -> Any:
        """What computes the logprobs (the policy, or an engine that must run every forward)."""

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor, pad: bool, last: bool) -> None: ...

    def step(self) -> float:
        """Reduce, clip and step; returns the gradient norm before clipping."""

    def combine(self, stats: dict[str, float]) -> dict[str, float]:
        """The whole step's metrics from this process's parts."""


class SingleProcess:
    """One process: every micro-batch, plain backward, clip and step of the trainer's optimiser."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
        self.model, self.optimizer, self.grad_clip = model, optimizer, grad_clip

    def batches(self, rows: Sequence[Row], max_tokens: int) -> tuple[list[list[Row]], int]:
        b = micro_batches(rows, max_tokens)
        return b, len(b)

    def forward_model(self) -> Any:
        return self.model

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, pad: bool, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return float(gn)

    def combine(self, stats: dict[str, float]) -> dict[str, float]:
        return dict(stats)


def micro_loss(model: Any, forward: Any, mb: list[Row], pad_id: int, s: RLSettings, aggregation: str,
               algo: Algo, epoch: int, total_tokens: int, total_rows: int, stats: dict[str, float],
               old: dict[int, torch.Tensor], key: int, vision: Vision | None = None) -> torch.Tensor:
    """The loss of micro-batch ``mb`` scaled by its share of the step (of the step's ``total_tokens`` response
    tokens, or ``total_rows`` rows for the seq-mean aggregations), for the caller to backpropagate; adds its part
    of the metrics to ``stats``. ``forward`` computes the logprobs (``model`` or the engine around it); ``vision``
    encodes the rows' screenshots; ``algo`` (``rl.algo``) the clip, dual clip, entropy bonus and TIS. With
    ``algo.tis_cap``, ``old[key]`` keeps the micro-batch's π_old: epoch 0's logprobs, before any step."""
    b = collate(mb, pad_id, next(model.parameters()).device, vision)
    if epoch == 0:
        stats["train/sequences"] += float(b["input_ids"].shape[0])  # distinct forwards
    tis_cap = algo.tis_cap
    logp, ent = rows_logprobs(forward, b, s.temperature, entropy=True, entropy_grad=algo.entropy_coef > 0)
    denom, tis = b["behaviour_logprobs"], None
    if tis_cap is not None:  # three policies: ratio π_θ/π_old, times min(π_old/π_behaviour, C) (loss.py)
        denom = old.setdefault(key, logp.detach())
        tis = tis_weights(denom, b["behaviour_logprobs"], tis_cap)
        if epoch == 0:
            capped = (denom - b["behaviour_logprobs"]) >= math.log(tis_cap)
            stats["loss/tis_capped_frac"] += float((capped * b["response_mask"]).sum()) / total_tokens
    loss, m = policy_loss(logp, denom, b["advantages"], b["response_mask"], b.get("ref_logprobs"),
                          clip_eps=algo.clip_low, kl_coef=s.kl_coef, agg=aggregation, tis_weight=tis,
                          clip_high=algo.clip_high, dual_clip=algo.dual_clip, entropy=ent,
                          entropy_coef=algo.entropy_coef)
    n_tok = float(b["response_mask"].sum())
    share = n_tok / total_tokens if aggregation == "token-mean" else len(mb) / total_rows
    w = n_tok / total_tokens / s.ppo_epochs
    stats["loss/policy"] += loss.item() * share / s.ppo_epochs
    for k, v in m.items():
        stats[f"loss/{k}"] += v * w
    with torch.no_grad():
        mask = b["response_mask"]
        stats["loss/entropy"] += float((ent.detach() * mask).sum()) / total_tokens / s.ppo_epochs
        if epoch == 0:  # the rollout/trainer mismatch, on-policy rows before any step
            fresh = mask * b["on_policy"].unsqueeze(1)
            gap = ((logp.detach() - b["behaviour_logprobs"]).abs() * fresh).max().item()
            stats["loss/logprob_gap_max"] = max(stats["loss/logprob_gap_max"], gap)
    return loss * share


def update(model: torch.nn.Module, rows: Sequence[Row], stepper: Stepper, s: RLSettings, pad_id: int,
           aggregation: str, algo: Algo, max_tokens: int, vision: Vision | None = None) -> dict[str, float]:
    """``ppo_epochs`` optimiser steps over ``rows`` (every process's rows: each runs its shard); the metrics."""
    total_tokens = sum(len(r.response_ids) for r in rows)
    batches, real = stepper.batches(rows, max_tokens)
    forward = stepper.forward_model()
    stats: dict[str, float] = defaultdict(float)
    old: dict[int, torch.Tensor] = {}  # π_old of each micro-batch: epoch 0's logprobs, before any step
    model.train()
    for epoch in range(s.ppo_epochs):
        stepper.zero_grad()
        for i, mb in enumerate(batches):
            pad = i >= real  # a ZeRO rank with fewer micro-batches: zero-weighted, metrics thrown away
            loss = micro_loss(model, forward, mb, pad_id, s, aggregation, algo, epoch, total_tokens, len(rows),
                              defaultdict(float) if pad else stats, old, i, vision)
            stepper.backward(loss, pad=pad, last=i == len(batches) - 1)
        stats["loss/grad_norm"] += stepper.step() / s.ppo_epochs
    model.eval()
    out = stepper.combine(stats)
    out["train/rows"] = float(len(rows))
    out["train/tokens"] = float(total_tokens)
    return out
