"""A lean prefill for text-only prompts of Qwen2-VL-family decoders (the tiny profile's model).

For a model this small, most of a CPU ``model(...)`` call is bookkeeping around the matrix products (M-RoPE
ids and tables, masks, cache, output classes). Without images M-RoPE is plain 1-D RoPE, so
:class:`TextPrefill` runs only embed, the layers, and the final norm and LM head on the last position, with
the model's own modules, and returns the post-RoPE keys/values the decoding cache needs.
:meth:`TextPrefill.for_model` gives None for models it was not checked against (only Qwen2-VL, default RoPE,
no sliding window). With :class:`PrefixCache`, ``TextPrefill(ids, past=kv)`` runs only the tokens a prompt
does not share with a recent one. Both match the transformers forward (the tests check logits and cache).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
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

    def __call__(self, input_ids: Any, past: list[tuple[Any, Any]] | None = None,
                 last: int = 1) -> tuple[Any, list[tuple[Any, Any]]]:
        """``past``: the per-layer ``(keys, values)`` of the first ``p`` tokens of ``input_ids`` (from an earlier
        prompt that starts with them; ``p`` < the prompt's length). Only the other tokens are run; the returned
        cache covers the whole prompt. Returns the raw logits of the last position (V,), or of the last ``last``
        positions ((last, V)) when ``last`` > 1 (``last`` ≤ the tokens run)."""
        import torch
        import torch.nn.functional as F

        n = input_ids.shape[1]
        p = past[0][0].shape[2] if past else 0
        if not 0 <= p < n:
            raise ValueError(f"a cached prefix of {p} tokens for a prompt of {n}: it must leave a token to run")
        cos, sin = self._rope(n)
        cos, sin = cos[p:], sin[p:]
        half = self.head_dim // 2
        s = n - p
        if not 1 <= last <= s:
            raise ValueError(f"logits of the last {last} positions asked of a prefill that runs {s} tokens")
        # Queries of the new tokens see every cached key and the new keys up to their own position.
        mask = None if not p else (
            torch.arange(n, device=input_ids.device)[None, :] <= torch.arange(p, n, device=input_ids.device)[:, None])

        def rotate(x: Any) -> Any:
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

        h = self.lm.embed_tokens(input_ids[:, p:])
        kv: list[tuple[Any, Any]] = []
        for li, layer in enumerate(self.lm.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = rotate(attn.q_proj(x).view(1, s, self.heads, self.head_dim).transpose(1, 2))
            k = rotate(attn.k_proj(x).view(1, s, self.kv_heads, self.head_dim).transpose(1, 2))
            v = attn.v_proj(x).view(1, s, self.kv_heads, self.head_dim).transpose(1, 2)
            if p:
                k = torch.cat((past[li][0], k), dim=2)
                v = torch.cat((past[li][1], v), dim=2)
            kv.append((k, v))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=self.kv_heads != self.heads)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(1, s, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.model.lm_head(self.lm.norm(h[:, -last:]))
        return (logits[0, -1] if last == 1 else logits[0]), kv


class PrefixCache:
    """The keys/values of recent prompts, found again by their token prefix (vLLM's automatic prefix caching,
    for the lean text prefill). Prompts are indexed by the chained hashes of their full ``block``-token blocks;
    :meth:`lookup` follows a new prompt's blocks as far as some cached prompt shares them, then extends the
    match token by token against that prompt. At most ``max_tokens`` positions are kept (least recently used
    prompts go first), and everything is dropped when ``version`` (the weights' version) changes.

    ``min_prefix``: shorter matches are not used (the masked attention of a prefix-reusing prefill costs a
    little more than the causal kernel, which a few saved tokens do not repay).
    """

    def __init__(self, max_tokens: int, *, block: int = 16, min_prefix: int = 48) -> None:
        if max_tokens < 0 or block < 1:
            raise ValueError(f"PrefixCache needs max_tokens >= 0 and block >= 1, got {max_tokens}, {block}")
        self.max_tokens, self.block, self.min_prefix = max_tokens, block, min_prefix
        self._entries: OrderedDict[int, tuple[list[int], list[tuple[Any, Any]], list[int]]] = OrderedDict()
        self._index: dict[int, int] = {}  # chained block hash -> entry id (the latest prompt with that prefix)
        self._tokens = 0
        self._next = 0
        self.version: Any = None
        self.hits = self.lookups = self.reused_tokens = self.prompt_tokens = 0

    def _hashes(self, ids: list[int]) -> list[int]:
        out, h = [], 0
        for i in range(0, len(ids) - self.block + 1, self.block):
            h = hash((h, tuple(ids[i:i + self.block])))
            out.append(h)
        return out

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._tokens = 0

    def check_version(self, version: Any) -> None:
        """Drop everything if ``version`` differs from the last one seen (the weights changed)."""
        if version != self.version:
            self.clear()
            self.version = version

    def lookup(self, ids: list[int]) -> list[tuple[Any, Any]] | None:
        """The cached per-layer ``(keys, values)`` of the longest known prefix of ``ids`` (sliced to it, and
        always shorter than ``ids``), or None."""
        self.lookups += 1
        self.prompt_tokens += len(ids)
        entry_id = None
        for h in self._hashes(ids):
            e = self._index.get(h)
            if e is None:
                break
            entry_id = e
        if entry_id is None:
            return None
        cached, kv, _ = self._entries[entry_id]
        n = min(len(cached), len(ids) - 1)
        p = next((i for i in range(n) if cached[i] != ids[i]), n)
        if p < self.min_prefix:
            return None
        self._entries.move_to_end(entry_id)
        self.hits += 1
        self.reused_tokens += p
        return [(k[:, :, :p], v[:, :, :p]) for k, v in kv]

    def insert(self, ids: list[int], kv: list[tuple[Any, Any]]) -> None:
        if len(ids) > self.max_tokens:
            return
        hashes = self._hashes(ids)
        eid, self._next = self._next, self._next + 1
        self._entries[eid] = (list(ids), kv, hashes)
        self._tokens += len(ids)
        for h in hashes:
            self._index[h] = eid
        while self._tokens > self.max_tokens:
            old, (old_ids, _, old_hashes) = self._entries.popitem(last=False)
            self._tokens -= len(old_ids)
            for h in old_hashes:
                if self._index.get(h) == old:
                    del self._index[h]


class LineTokenCache:
    """Token ids of a prompt, one line at a time through a cache of the lines seen before.

    Consecutive prompts of an episode, and the prompts of a batch, repeat most of their lines (the system
    prompt, the task, history lines, screen lines that did not change). The tokenizer's own call (through
    transformers) took ~1.8 ms of a tiny model's ~20 ms step in the evaluation loop, most of it on lines it
    had tokenized before; through this cache a prompt takes ~0.15 ms. A prompt is cut after every newline
    that a non-space character follows, each piece is looked up (or tokenized alone and kept), and the ids
    are concatenated.

    That is the tokenizer's own result only when no pre-token crosses such a cut, so only tokenizers of
    this shape are taken (:meth:`for_tokenizer` returns None for the others): no normalizer, nothing added
    around a sequence, a pre-tokenizer of ``Split`` steps whose patterns do not look around (a lookahead
    decides differently at a piece's end: GPT-2's ``\\s+(?!\\S)``) and a ``ByteLevel`` mapping without a
    prefix space or a pattern of its own, and the cut must not change the ids of a probe text. The project's
    tiny tokenizer (its split pattern puts a whitespace run in a pre-token of its own) qualifies; Qwen2's
    (a normaliser, a lookahead) and a sentencepiece tokenizer that prefixes every piece with a space do not.
    At most ``max_lines`` pieces are kept (the cache is emptied when full).
    """

    _CUT = re.compile(r"(?<=\n)(?=\S)")

    def __init__(self, backend: Any, max_lines: int = 65536) -> None:
        if max_lines < 1:
            raise ValueError(f"LineTokenCache needs max_lines >= 1, got {max_lines}")
        self.backend, self.max_lines = backend, max_lines
        self.cache: dict[str, list[int]] = {}
        self.hits = self.misses = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_lines: int = 65536) -> LineTokenCache | None:
        """A cache over ``tokenizer``'s Rust backend, or None when line-wise tokenization might differ."""
        backend = getattr(tokenizer, "_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            return None
        spec = json.loads(backend.to_str())
        if spec.get("normalizer") is not None:
            return None

        def steps(step: dict[str, Any] | None) -> list[dict[str, Any]]:
            if step is None:
                return []
            return [x for s in step["pretokenizers"] for x in steps(s)] if step.get("type") == "Sequence" else [step]

        def safe(step: dict[str, Any]) -> bool:
            if step.get("type") == "ByteLevel":  # its own GPT-2 pattern looks ahead (``\\s+(?!\\S)``)
                return not step.get("add_prefix_space", False) and not step.get("use_regex", True)
            pattern = step.get("pattern") or {}
            regex = pattern.get("Regex", "") if isinstance(pattern, dict) else ""
            return step.get("type") == "Split" and not any(x in regex for x in ("(?=", "(?!", "(?<"))

        pre = steps(spec.get("pre_tokenizer"))
        if not pre or not any(s.get("type") == "Split" for s in pre) or not all(safe(s) for s in pre):
            return None
        cache = cls(backend, max_lines)
        probe = 'Task: a "b"\nPrevious actions: none\n  indented\nx \ny\n\nz;;1,2;[3]\n\n\n end\n'
        if backend.encode(probe, add_special_tokens=True).ids != backend.encode(probe, add_special_tokens=False).ids:
            return None  # a BOS / EOS is added around a sequence
        if cache(probe) != backend.encode(probe, add_special_tokens=False).ids:
            return None
        cache.cache.clear()
        cache.hits = cache.misses = 0
        return cache

    def __call__(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self.cache
        for piece in self._CUT.split(text):
            ids = cache.get(piece)
            if ids is None:
                self.misses += 1
                if len(cache) >= self.max_lines:
                    cache.clear()
                ids = cache[piece] = self.backend.encode(piece, add_special_tokens=False).ids
            else:
                self.hits += 1
            out.extend(ids)
        return out
