"""Next-token choice for a batch of decoding rows at once, each row from its own seeded stream.

A request's sample depends only on its seed and its logits, never on which other requests share its batch
(so a seeded rollout is reproducible however the micro-batcher groups it), and no per-row Python runs per
token. Logprobs are not computed here: they come from the raw logits (:mod:`mobilerl.models.logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mobilerl.models.generation import SamplingConfig


class Sampler:
    """Picks every row's next token at once; row ``b`` draws from its own seeded stream.

    Row ``b``: greedy if its temperature is 0; else softmax(logits / T) restricted to the top-p nucleus
    (smallest set of tokens whose probability reaches ``top_p``; the top token always stays), sampled by
    inverse CDF with the ``t``-th of ``max_new_tokens`` uniforms drawn up front from ``Generator(seed)``. So a
    row's sample depends on its seed and logits only, never on the other rows of its batch, and no
    per-row Python runs per token (the per-row loop was a large share of a CPU step). Tokens in
    ``suppress`` (the image/video placeholders, which the model cannot take back as input without their
    pixels) are never drawn; logprobs still come from the raw logits.
    """

    def __init__(self, sampling: Sequence[SamplingConfig], seeds: Sequence[int], n: int, suppress: list[int],
                 device: Any):
        import torch

        self.temps = torch.tensor([s.temperature for s in sampling], dtype=torch.float32, device=device)
        self.top_ps = torch.tensor([s.top_p for s in sampling], dtype=torch.float32, device=device)
        self.greedy = self.temps == 0
        self.any_sampled = not bool(self.greedy.all())
        self.suppress = suppress
        self.u = torch.stack([torch.rand(n, generator=torch.Generator().manual_seed(seed)) for seed in seeds]).to(device)

    def _scores(self, logits: Any) -> Any:
        scores = logits.float()
        if self.suppress:
            scores = scores.clone()  # never modify the raw logits (the logprobs come from them)
            scores[..., self.suppress] = float("-inf")
        return scores

    def greedy_tokens(self, logits: Any) -> Any:
        """The greedy choice at each of ``logits`` (..., V): what a temperature-0 row samples."""
        return self._scores(logits).argmax(dim=-1)

    def __call__(self, logits: Any, rows: Any, t: int) -> Any:
        """Tokens (b,) for raw ``logits`` (b, V) of the items ``rows`` (b,) at new-token index ``t``."""
        import torch

        scores = self._scores(logits)
        tok = scores.argmax(dim=-1)
        if not self.any_sampled:
            return tok
        sampled = ~self.greedy[rows]
        if not bool(sampled.any()):
            return tok
        r = rows[sampled]
        probs = torch.softmax(scores[sampled] / self.temps[r, None], dim=-1)  # (s, V)
        top_p = self.top_ps[r]
        if bool((top_p < 1).any()):
            probs, order = probs.sort(dim=-1, descending=True)
            keep = (probs.cumsum(-1) - probs) < top_p[:, None]  # tokens before the mass reaches top_p
            keep[:, 0] = True
            probs = probs * keep
        else:
            order = None
        cdf = probs.cumsum(-1)
        j = torch.searchsorted(cdf, (self.u[r, t] * cdf[:, -1]).unsqueeze(-1), right=True)
        j = torch.where(j >= cdf.shape[-1], cdf.argmax(-1, keepdim=True), j)  # u * total rounded up to total
        tok[sampled] = (order.gather(-1, j) if order is not None else j).squeeze(-1)
        return tok
