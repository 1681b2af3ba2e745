"""A lean prefill for text-only prompts of Qwen2-VL-family decoders (the tiny profile's model).

:class:`~mobilerl.models.hf_backend.HFBackend` prefills every prompt alone. For a model of the tiny
profile's size (hidden 128, 3 layers) most of a ``model(...)`` call on CPU is not the matrix products but
what surrounds them: M-RoPE position ids and their rotary tables, the 3-section rotary split and
concatenation, mask and cache bookkeeping, output dataclasses. For a prompt without images the three
M-RoPE position streams are equal, and M-RoPE with equal streams *is* ordinary 1-D RoPE over the same
frequencies, so the forward reduces to: embed, then per layer RMSNorm → q/k/v → RoPE → causal SDPA →
o_proj, RMSNorm → MLP, and the final norm and LM head on the last position only. :class:`TextPrefill`
runs exactly that with the model's own modules and weights and returns the keys/values the decoding
cache needs, post-RoPE as the model's cache holds them (the test checks logits and cache against the
transformers forward).

Only models it was checked against are taken (:meth:`TextPrefill.for_model` returns None otherwise, and
the backend keeps the transformers forward): Qwen2-VL with default RoPE, no sliding window.
"""

from __future__ import annotations

from typing import Any

SUPPORTED = ("Qwen2VLForConditionalGeneration",)


class TextPrefill:
    """``prefill(input_ids (1, L))`` → (last-position logits (V,), per-layer ``(keys, values)`` each
    ``(1, kv_heads, L, head_dim)``). Call under ``torch.inference_mode()``."""

    def __init__(self, model: Any) -> None:
        lm = model.model.language_model
        cfg = lm.config
        self.model, self.lm = model, lm
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.inv_freq = lm.rotary_emb.inv_freq
        self._tables: tuple[int, Any, Any] | None = None  # (length, cos, sin) of the longest prompt so far

    @classmethod
    def for_model(cls, model: Any) -> TextPrefill | None:
        """The lean prefill for ``model``, or None when it is not a model this was checked against."""
        if type(model).__name__ not in SUPPORTED:
            return None
        lm = getattr(getattr(model, "model", None), "language_model", None)
        cfg = getattr(lm, "config", None)
        if cfg is None or getattr(cfg, "use_sliding_window", False):
            return None
        rope = getattr(cfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default" or getattr(lm.rotary_emb, "attention_scaling", 1.0) != 1.0:
            return None
        return cls(model)

    def _rope(self, n: int) -> tuple[Any, Any]:
        import torch

        if self._tables is None or self._tables[0] < n:
            length = max(n, 2 * (self._tables[0] if self._tables else 512))
            freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=self.inv_freq.device),
                                self.inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            dtype = self.lm.embed_tokens.weight.dtype
            self._tables = (length, emb.cos().to(dtype), emb.sin().to(dtype))
        _, cos, sin = self._tables
        return cos[:n], sin[:n]

    def __call__(self, input_ids: Any) -> tuple[Any, list[tuple[Any, Any]]]:
        import torch
        import torch.nn.functional as F

        n = input_ids.shape[1]
        cos, sin = self._rope(n)
        half = self.head_dim // 2

        def rotate(x: Any) -> Any:
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

        h = self.lm.embed_tokens(input_ids)
        kv: list[tuple[Any, Any]] = []
        for layer in self.lm.layers:
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = rotate(attn.q_proj(x).view(1, n, self.heads, self.head_dim).transpose(1, 2))
            k = rotate(attn.k_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2))
            v = attn.v_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            kv.append((k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(1, n, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.model.lm_head(self.lm.norm(h[:, -1:]))
        return logits[0, -1], kv
