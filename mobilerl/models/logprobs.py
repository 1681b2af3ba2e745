"""The one definition of a token's log-probability, shared by the generation backends and the RL trainer.

For the token ``y_t`` chosen at step ``t`` from the model's raw logits ``logits_t`` (V,)::

    logprob_t = log_softmax(logits_t / T)[y_t]      T = sampling temperature, or 1 when greedy (T = 0)

in float32, with no top-p / top-k renormalisation and no penalties. Rollout logprobs (``Generation.logprobs``)
and a trainer's teacher-forced recompute are then the two sides of the importance ratio pi_theta / pi_old
(MobileRL §2.2, the PPO/GRPO ratio); :mod:`mobilerl.models.generation` states the contract for every backend.
"""

from __future__ import annotations

from typing import Any


def token_logprobs(logits: Any, tokens: Any, temperature: float | Any) -> Any:
    """``log_softmax(logits / T)`` gathered at ``tokens``.

    Shapes: logits (N, V) raw, any dtype; tokens (N,) ids; ``T`` a float or an (N, 1) tensor (one
    temperature per row; pass 1.0 for greedy rows). Returns (N,) float32. Teacher forcing: logits at
    position ``i`` predict token ``i + 1``, so a completion starting at position ``p`` is scored with
    ``token_logprobs(logits[p - 1:-1], ids[p:], T)``.
    """
    import torch

    lp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
    return lp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # (N,)
