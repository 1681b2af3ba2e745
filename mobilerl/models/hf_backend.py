"""Hugging Face transformers generation backend (CPU or GPU), with a micro-batcher.

    backend = HFBackend.from_pretrained("models/tiny-base")          # or HFBackend(model, processor)
    [gen] = await backend.generate([ChatRequest(messages, images)], SamplingConfig(temperature=1, seed=0))

Concurrent callers (the episodes of an evaluation or an RL rollout) are batched: requests arriving while a
batch runs, or within ``batch_wait_ms`` of the first, are generated together (up to ``max_batch``) in a
worker thread. Requests with different ``max_new_tokens`` / ``stop`` never share a batch; temperature,
top-p and seed are per request.

A batch is not one left-padded ``model.generate`` call: on a CPU that spent half its prefill FLOPs on pad
tokens, built (B, L, L) masks, and copied the whole KV cache at every token. Instead each prompt is
prefilled alone (causal kernel, no mask; text-only prompts of a Qwen2-VL model through the lean
:class:`~mobilerl.models.text_prefill.TextPrefill`), the caches are copied once into preallocated left-padded
buffers, and the rows decode together; finished rows are dropped from the cache once at most half are
live. Sampling is vectorised over rows (:class:`_Sampler`), each row with its own seeded stream, so a
request's sample depends on its seed, not on which other requests share its batch (up to the float noise
that batching adds to the decoding logits). Logprobs come from the raw logits, as defined in
:mod:`mobilerl.models.generation`. ``score`` is one forward pass over prompt + completion.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mobilerl.models.generation import (
    ChatRequest,
    Generation,
    MicroBatcher,
    SamplingConfig,
    apply_stop,
    text_content,
)
from mobilerl.models.text_prefill import LineTokenCache, PrefixCache, TextPrefill


def token_logprobs(logits: Any, tokens: Any, temperature: float | Any) -> Any:
    """``log_softmax(logits / T)`` gathered at ``tokens``: logits (N, V), tokens (N,) -> (N,) float32. ``T``: a
    float, or an (N, 1) tensor (one temperature per row)."""
    import torch

    lp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
    return lp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # (N,)


def attention_kernels(device: Any) -> Any:
    """The context the model runs in: on CUDA, SDPA without the cuDNN backend. PyTorch prefers cuDNN
    attention on Hopper GPUs for bf16/fp16, and cuDNN builds an execution plan for every new sequence
    length; prompts here all differ in length and every decoding step adds a position, so the plans are
    never reused. Measured on an H200 with the tiny model (docs/evaluation.md, "On a GPU"): prefilling 64
    prompts took 3.07 s in bf16 against 0.22 s in fp32 (which uses the memory-efficient kernel). Flash
    and memory-efficient attention need no plan. Elsewhere: no change (``nullcontext``)."""
    import contextlib

    if getattr(device, "type", str(device)) != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _is_tiny_checkpoint(path: Path) -> bool:
    return (path / "tiny.json").exists()


class _Sampler:
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


class PromptLookup:
    """Guesses a row's next tokens for speculative decoding by prompt lookup: find the latest earlier place
    where the text's last ``n`` tokens (``n`` = 3, 2, 1) occurred, in the prompt or the tokens generated so
    far, and copy what followed it. The copy may run into the tokens it is producing (as an LZ77 copy does), so
    a loop of one token or phrase is guessed to any length. Answers here copy the prompt (a ``Type`` text is
    a span of the task, an element's index or the format from the history), and a degenerate answer repeats
    one token to the length cap.

    N-grams are indexed incrementally (a dict per ``n``), so a guess costs O(k) after the prompt's one pass.
    """

    def __init__(self, prompt: list[int], max_n: int = 3) -> None:
        self.ctx = list(prompt)
        self.n_prompt = len(prompt)
        self.max_n = max_n
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.indexed = 0  # n-grams ending at positions < indexed are in the index

    def draft(self, generated: list[int], k: int) -> list[int]:
        """Up to ``k`` guessed tokens after prompt + ``generated`` (``generated`` only grows between calls)."""
        ctx = self.ctx
        ctx.extend(generated[len(ctx) - self.n_prompt:])
        end = len(ctx)
        for e in range(max(self.indexed, 1), end):  # every n-gram ending before the last position
            for n in range(1, min(self.max_n, e) + 1):
                self.index[n][tuple(ctx[e - n:e])] = e
        self.indexed = end
        for n in range(min(self.max_n, end - 1), 0, -1):
            src = self.index[n].get(tuple(ctx[end - n:]))
            if src is not None:
                out: list[int] = []
                for i in range(k):
                    j = src + i
                    out.append(ctx[j] if j < end else out[j - end])
                return out
        return []


class ResponseLookup:
    """Guesses how a response goes on from the responses generated before it: counts of which token followed
    each 1-, 2- and 3-token context in the last ``window`` responses (each preceded by a start mark, so an
    empty response is guessed to begin as most of them began); the longest context seen decides, its most
    frequent successor wins. An agent's answers are formulaic (``<answer>do(action="Tap", index=`` begins two
    in three of the tiny policy's), and a guess costs nothing when it is checked inside the prompt's prefill.
    """

    START = -1

    def __init__(self, max_n: int = 3, window: int = 256) -> None:
        self.max_n, self.window = max_n, window
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.recent: deque[list[int]] = deque()

    def _ngrams(self, tokens: list[int]) -> Iterator[tuple[tuple[int, ...], int]]:
        ctx = [self.START, *tokens]
        for e in range(1, len(ctx)):
            for n in range(1, min(self.max_n, e) + 1):
                yield tuple(ctx[e - n:e]), ctx[e]

    def add(self, tokens: Sequence[int]) -> None:
        """Count a finished response (forgetting the oldest beyond ``window``)."""
        tokens = list(tokens)
        self.recent.append(tokens)
        for key, nxt in self._ngrams(tokens):
            succ = self.counts.setdefault(key, {})
            succ[nxt] = succ.get(nxt, 0) + 1
        if len(self.recent) > self.window:
            for key, nxt in self._ngrams(self.recent.popleft()):
                succ = self.counts[key]
                succ[nxt] -= 1
                if not succ[nxt]:
                    del succ[nxt]
                    if not succ:
                        del self.counts[key]

    def draft(self, generated: Sequence[int], k: int, stop: set[int] | frozenset[int] = frozenset(),
              min_share: float = 0.0) -> list[int]:
        """Up to ``k`` guessed tokens after ``generated``; the guess ends after a token of ``stop``, or before
        a token that followed its context less than ``min_share`` of the time."""
        ctx, out = [self.START, *generated], []
        while len(out) < k:
            succ = next((self.counts[key] for n in range(min(self.max_n, len(ctx)), 0, -1)
                         if (key := tuple(ctx[-n:])) in self.counts), None)
            if succ is None:
                break
            tok = max(succ, key=succ.__getitem__)
            if succ[tok] < min_share * sum(succ.values()):
                break
            out.append(tok)
            ctx.append(tok)
            if tok in stop:
                break
        return out


DECODE_ROOM = 32  # positions a batch's decoding cache holds beyond its longest prompt before it grows


class _Arena:
    """One reusable block of memory for the batch KV buffers. A batch's buffers are tens of MB; allocated fresh
    for every batch, their pages were faulted in anew each time (the largest part of building the cache).
    Buffers carved from the arena are valid until the next :meth:`start`, i.e. for one batch (batches run one
    at a time on the backend's model thread)."""

    def __init__(self) -> None:
        self.block: Any = None
        self.used = 0

    def start(self, numel: int, like: Any) -> None:
        if self.block is None or self.block.numel() < numel or self.block.dtype != like.dtype \
                or self.block.device != like.device:
            self.block = like.new_empty(numel)
        self.used = 0

    def take(self, shape: tuple[int, ...]) -> Any:
        n = math.prod(shape)
        out = self.block[self.used:self.used + n].view(shape)
        self.used += n
        return out


def _decode_cache(prefills: Sequence[list[tuple[Any, Any]]], lengths: list[int], capacity: int,
                  arena: _Arena) -> Any:
    """A batch KV cache of ``GrowingLayer`` s (:func:`_growing_layer`): the prompts' per-layer ``(keys,
    values)`` (each (1, H, L_b, D)) left-padded to ``max(lengths)`` in buffers with room for ``capacity``
    positions, carved from ``arena``."""
    from transformers.cache_utils import Cache

    width = max(lengths)
    layers = []
    shapes = [((len(prefills), k0.shape[1], capacity, k0.shape[3]), (len(prefills), v0.shape[1], capacity, v0.shape[3]))
              for k0, v0 in prefills[0]]
    arena.start(sum(math.prod(a) + math.prod(b) for a, b in shapes), prefills[0][0][0])
    for li, (k_shape, v_shape) in enumerate(shapes):
        # Uninitialised beyond ``width`` (written before it is read); the padding is zeroed, as masked
        # positions must hold finite values (0 × NaN is NaN).
        kb, vb = arena.take(k_shape), arena.take(v_shape)
        for b, (kv, n) in enumerate(zip(prefills, lengths, strict=True)):
            kb[b, :, :width - n] = 0
            vb[b, :, :width - n] = 0
            kb[b, :, width - n:width] = kv[li][0][0]
            vb[b, :, width - n:width] = kv[li][1][0]
        layers.append(_growing_layer()(kb, vb, width))
    return Cache(layers=layers)


def _layer_kv(cache: Any) -> list[tuple[Any, Any]]:
    """Per-layer ``(keys, values)`` of a transformers prefill cache (full-attention layers only)."""
    from transformers.cache_utils import DynamicLayer

    out = []
    for li, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"HFBackend decodes full-attention caches only; layer {li} is a {type(layer).__name__}"
            )
        out.append((layer.keys, layer.values))
    return out


@functools.cache
def _growing_layer() -> type:
    """The ``GrowingLayer`` class (defined on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """One layer's K/V for batched decoding: preallocated ``(B, H, capacity, D)`` buffers written in
        place. (``DynamicLayer`` concatenates, copying the whole batch cache at every token: that copy was
        the largest cost of a CPU decoding step.)"""

        def __init__(self, keys: Any, values: Any, length: int) -> None:
            super().__init__()
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.kbuf, self.vbuf, self.length = keys, values, length
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            end = self.length + key_states.shape[-2]
            if end > self.kbuf.shape[2]:  # a long answer (or speculation's rejected positions) used up the room
                import torch

                more = max(end, 2 * self.kbuf.shape[2]) - self.kbuf.shape[2]
                self.kbuf = torch.cat((self.kbuf, self.kbuf.new_zeros(*self.kbuf.shape[:2], more, self.kbuf.shape[3])), 2)
                self.vbuf = torch.cat((self.vbuf, self.vbuf.new_zeros(*self.vbuf.shape[:2], more, self.vbuf.shape[3])), 2)
            self.kbuf[:, :, self.length:end] = key_states
            self.vbuf[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.length + query_length, 0

        def select(self, rows: Any, start: int) -> None:
            """Keep batch rows ``rows`` and drop the first ``start`` positions (padding of every kept row)."""
            self.kbuf, self.vbuf = self.kbuf[rows, :, start:], self.vbuf[rows, :, start:]
            self.length -= start
            self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

    return GrowingLayer


class HFBackend:
    """:class:`~mobilerl.models.generation.GenerationBackend` over a transformers image-text-to-text model.

    Args:
        model: a causal (vision-)language model with ``generate``; put in eval mode.
        processor: its processor (chat template, tokenizer, image processor) or a bare tokenizer.
        max_batch: most requests per ``generate`` call.
        batch_wait_ms: how long a batch waits for more requests after the first (and after those that
            queued while the previous batch ran).
        name: recorded as the policy/backend name.
        fast_prefill: prefill text-only prompts with :class:`~mobilerl.models.text_prefill.TextPrefill`
            where the model is one it supports (the same logits and cache; ~1.2x faster on the tiny model).
        speculate_tokens: greedy rows guess up to this many next tokens by prompt lookup (:class:`PromptLookup`)
            and the model checks the guesses in the same forward as the token just chosen, once at most
            ``speculate_rows`` rows are left in the batch (0: off); a row whose whole guess was right guesses
            twice as far the next time, up to 4x. The output is what plain greedy decoding
            gives (up to float noise); it shortens the tail of a batch, where one long answer (a long ``Type``
            text, a degenerate repetition to the token cap) held every other request back one forward a token.
        prefix_cache_tokens: with the lean text prefill, keep the keys/values of recent prompts up to this many
            positions (:class:`~mobilerl.models.text_prefill.PrefixCache`) and prefill only what a new prompt
            does not share with one of them (0: off). The cache is dropped whenever the weights change.
        line_token_cache: tokenize text-only prompts line by line through a cache of this many lines
            (:class:`~mobilerl.models.text_prefill.LineTokenCache`; 0: off). Taken only for tokenizers where
            that gives the tokenizer's own ids (the tiny profile's); others tokenize every prompt whole.
        prefill_draft: greedy text-only rows append up to this many guessed first tokens of their answer
            (:class:`ResponseLookup` over the backend's recent answers) to the prompt they prefill; the prefill's
            logits at those positions check the guesses, and the agreeing ones are taken without a decoding
            forward (0: off). The output is what plain greedy decoding gives (up to float noise).
        batch_draft: before a batch is down to ``speculate_rows``, greedy rows guess up to this many next tokens
            where the recent answers nearly always went on one way (90 %; :class:`ResponseLookup`), checked in
            the forward of the token just chosen (0: off).
    """

    def __init__(
        self, model: Any, processor: Any, *, max_batch: int = 16, batch_wait_ms: float = 5.0, name: str = "hf",
        fast_prefill: bool = True, prefix_cache_tokens: int = 65536, speculate_tokens: int = 16,
        speculate_rows: int = 8, line_token_cache: int = 65536, prefill_draft: int = 8,
        batch_draft: int = 4,
    ) -> None:
        if min(speculate_tokens, speculate_rows, prefix_cache_tokens, line_token_cache, prefill_draft, batch_draft) < 0:
            raise ValueError("speculate_tokens, speculate_rows, prefix_cache_tokens, line_token_cache, prefill_draft "
                             "and batch_draft must be >= 0")
        self.speculate_tokens, self.speculate_rows = speculate_tokens, speculate_rows
        self.prefill_draft, self.batch_draft = prefill_draft, batch_draft
        self.responses = ResponseLookup()
        self._arena = _Arena()
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.name = name
        gc = model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        self.eos_id = next(iter(self.eos_ids)) if len(self.eos_ids) == 1 else self.tokenizer.eos_token_id
        pad = gc.pad_token_id if gc.pad_token_id is not None else self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id
        cfg = model.config
        self.suppress_ids = sorted(
            {t for t in (getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None)) if t is not None}
        )
        # Prefill computes the logits of the last position only, where the model supports it.
        params = inspect.signature(model.forward).parameters
        self._last_logits: dict[str, Any] = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # Text-only prompts of a Qwen2-VL model skip the transformers forward's bookkeeping (same numbers).
        self._text_prefill = TextPrefill.for_model(model) if fast_prefill else None
        self.prefix_cache = (PrefixCache(prefix_cache_tokens)
                             if self._text_prefill is not None and prefix_cache_tokens > 0 else None)
        # One thread runs every model call (batches, score), so the model is never used concurrently.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mobilerl-hf")
        self._batcher = MicroBatcher(
            self._generate_batch,
            self._executor,
            max_batch=max_batch,
            wait_s=batch_wait_ms / 1000.0,
            key=lambda item: (item[1].max_new_tokens, item[1].stop),
        )
        self._rng = random.Random()
        self.line_tokens = LineTokenCache.for_tokenizer(self.tokenizer, line_token_cache) if line_token_cache else None

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | None = None, dtype: str | None = None, **kwargs: Any
    ) -> HFBackend:
        """Load a model directory offline: a tiny checkpoint (``tiny.json`` beside the weights) through
        :func:`mobilerl.models.tiny.load`, anything else through ``AutoModelForImageTextToText`` /
        ``AutoProcessor`` with ``local_files_only=True``. ``dtype``: ``fp32`` / ``bf16`` / ``fp16`` /
        ``auto`` (default: fp32 on CPU, the checkpoint's dtype on GPU)."""
        import torch

        from mobilerl.models import tiny

        tiny.offline()
        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}/config.json not found: not a model directory")
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "auto": "auto"}
        if dtype is not None and dtype not in dtypes:
            raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if _is_tiny_checkpoint(path):
            model, processor = tiny.load(path)  # fp32
            if dtype in ("bf16", "fp16"):
                model = model.to(dtypes[dtype])
        else:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            model = AutoModelForImageTextToText.from_pretrained(
                path, dtype=dtypes[dtype or ("fp32" if device == "cpu" else "auto")], local_files_only=True
            )
            processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        return cls(model.to(device), processor, name=kwargs.pop("name", path.name), **kwargs)

    # ----------------------------------------------------------------------------- public API

    @property
    def stats(self):
        """Micro-batcher counters (:class:`~mobilerl.models.generation.BatcherStats`)."""
        return self._batcher.stats

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        return await self._batcher.generate(requests, sampling, self._rng)

    async def score(
        self, request: ChatRequest, completion: str | Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        if temperature <= 0:
            raise ValueError(f"score temperature must be > 0, got {temperature}")
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._score_sync, request, completion, temperature
        )

    async def prompt_logprobs(
        self, request: ChatRequest, *, temperature: float = 1.0
    ) -> tuple[list[int], list[float | None]]:
        """Every prompt token id and its logprob given the tokens before it (``None`` for the first):
        vLLM's ``prompt_logprobs``, used by :mod:`mobilerl.models.serve_openai`."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._prompt_logprobs_sync, request, temperature
        )

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    async def aclose(self) -> None:
        await self._batcher.aclose()

    # ---------------------------------------------------------------------------- internals

    def render(self, request: ChatRequest) -> str:
        return render_prompt(self.processor, request)

    def _encode(self, texts: list[str], images: list[Any]) -> dict[str, Any]:
        """Left-padded batch: through the processor when there are images (pixel_values / image_grid_thw),
        else through its tokenizer alone, called as the processor calls it. (The processor validates its
        keyword arguments by building dataclasses on every call: ~20 ms, more than a tiny model's prefill.)"""
        multimodal = hasattr(self.processor, "image_processor")
        if not images and self.line_tokens is not None:
            import torch

            rows = [self.line_tokens(t) for t in texts]
            width = max(map(len, rows))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.pad_id
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):  # left padding, as the tokenizer's call pads
                ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
                mask[i, width - len(r):] = 1
            return {"input_ids": ids.to(self.model.device), "attention_mask": mask.to(self.model.device)}
        if images:
            if not multimodal:
                raise ValueError("this backend's processor has no image processor; the request has images")
            enc = self.processor(text=texts, images=images, padding=True, padding_side="left", return_tensors="pt")
        elif multimodal:
            enc = self.tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
        else:
            enc = self.tokenizer(
                texts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False
            )
        return {k: v.to(self.model.device) for k, v in enc.items()}

    def _prefill(self, request: ChatRequest, draft: list[int]) -> tuple[Any, list[tuple[Any, Any]], int, int,
                                                                    list[int], list[int]]:
        """One prompt through the model alone (no padding, so no mask: the causal kernel, and no FLOPs on pad
        tokens, which were half of a left-padded batch). ``draft``: guessed first answer tokens to run after
        the prompt (taken on the lean text path only). Returns the raw logits (1 + d, V) of the prompt's last
        position and of the ``d`` drafted ones, the per-layer ``(keys, values)`` of the cache (prompt and
        draft), the prompt length, the M-RoPE offset of its next position (0 without images), the prompt's
        token ids and the draft run."""
        import torch

        enc = self._encode([self.render(request)], list(request.images or []))
        n = enc["input_ids"].shape[1]
        ids = enc["input_ids"][0].tolist()
        if any(k.startswith("pixel") for k in enc):  # the model derives M-RoPE positions from the image grid
            out = self.model(**enc, use_cache=True, **self._last_logits)
            deltas = getattr(out, "rope_deltas", None)
            delta = int(deltas.view(-1)[0]) if deltas is not None else 0
        elif self._text_prefill is not None:
            cache = self.prefix_cache
            past = cache.lookup(ids) if cache is not None else None
            inp = enc["input_ids"]
            if draft:
                inp = torch.cat((inp, torch.tensor([draft], dtype=inp.dtype, device=inp.device)), 1)
            logits, kv = self._text_prefill(inp, past, last=1 + len(draft))
            if cache is not None:
                cache.insert(ids, kv)  # (a lookup slices the keys to the shared prompt prefix)
            return logits.view(1 + len(draft), -1), kv, n, 0, ids, draft
        else:  # explicit positions: no dependence on the rope offsets the model keeps from its last call
            pos = torch.arange(n, device=self.model.device).unsqueeze(0)
            out = self.model(**enc, position_ids=pos, use_cache=True, **self._last_logits)
            delta = 0
        return out.logits[0, -1:], _layer_kv(out.past_key_values), n, delta, ids, []

    def _generate_batch(self, items: list[tuple[ChatRequest, SamplingConfig, int]]) -> list[Generation]:
        """Prefill each prompt alone, then decode all rows together over one preallocated KV cache.

        A row ends at the end-of-turn token (kept, with its logprob) or at the token that completes a stop
        string. Finished rows are computed but ignored until at most half of the batch rows are live; then
        the finished rows, and the left padding no live row needs, are dropped from the cache.
        """
        import torch

        sampling = items[0][1]  # max_new_tokens and stop are shared by the batch (the batcher's key)
        n_new, stop = sampling.max_new_tokens, sampling.stop
        device = self.model.device
        tail = 4 * max((len(x) for x in stop), default=0) + 4  # a stop string shows up within this many tokens
        if self.prefix_cache is not None:  # new weights (an RL update, a load_state_dict): forget the old keys
            self.prefix_cache.check_version(tuple((id(p), p._version) for p in self.model.parameters()))
        with torch.inference_mode(), attention_kernels(device):
            draft: list[int] = []
            if self.prefill_draft and self._text_prefill is not None:
                draft = self.responses.draft([], min(self.prefill_draft, n_new), self.eos_ids)
            pre = [self._prefill(r, draft if s.temperature == 0 else []) for r, s, _ in items]
            prompt_lens = [n for _, _, n, _, _, _ in pre]
            prompt_ids = [ids for _, _, _, _, ids, _ in pre]
            sampler = _Sampler([s for _, s, _ in items], [seed for _, _, seed in items], n_new, self.suppress_ids,
                               device)
            lp_temps = torch.tensor([s.logprob_temperature for _, s, _ in items], device=device)
            greedy = sampler.greedy.tolist()
            rows = torch.arange(len(items), device=device)  # batch row -> item
            tokens: list[list[int]] = [[] for _ in items]
            logprobs: list[list[float]] = [[] for _ in items]
            ended = [False] * len(items)
            stopped = [False] * len(items)  # ended at the end-of-turn token or a stop string
            lookups: dict[int, PromptLookup] = {}
            guess_len: dict[int, int] = {}  # tail speculation: how far each row guesses next

            def push(b: int, tk: int, lp: float) -> bool:
                """Append a token to item ``b``; True when the item is complete."""
                tokens[b].append(tk)
                logprobs[b].append(lp)
                if tk in self.eos_ids or (
                    stop and apply_stop(self.tokenizer.decode(tokens[b][-tail:], skip_special_tokens=True), stop)[1]
                ):
                    stopped[b] = True
                ended[b] = stopped[b] or len(tokens[b]) >= n_new
                return ended[b]

            # The drafted answer tokens the prefill's greedy choices agree with are taken; the row goes on
            # from the first disagreement (its cache keeps the prompt and the taken tokens).
            taken = self._accept([lg for lg, *_ in pre], [d for *_, d in pre], rows, lp_temps, sampler, ended, push)
            lengths = [n + a for n, a in zip(prompt_lens, taken, strict=True)]
            width = max(lengths)
            # Room for the typical answer only: the buffers grow when a row runs longer. (Room for n_new
            # tokens made each batch's buffers ~4x the prompts' keys/values; allocating and first touching
            # that memory cost more than copying the prompts in: 55 against 12 ms for 30 prompts.)
            cache = _decode_cache([[(k[:, :, :m], v[:, :, :m]) for k, v in kv] for (_, kv, *_), m in
                                   zip(pre, lengths, strict=True)], lengths, width + min(n_new, DECODE_ROOM),
                                  self._arena)
            # (B, V) raw logits of each row's current position, and the position of its next token
            logits = torch.stack([lg[a] for (lg, *_), a in zip(pre, taken, strict=True)])
            positions = torch.tensor([m + d for (_, _, _, d, _, _), m in zip(pre, lengths, strict=True)],
                                     device=device)
            del pre
            mask = torch.zeros((len(items), width + n_new), dtype=torch.long, device=device)
            for b, n in enumerate(lengths):
                mask[b, width - n:] = 1
            pad = torch.tensor([width - n for n in lengths], device=device)  # first cache column of each row

            t = 0  # decoding steps so far = the new-token index of every sampled row (they take one a step)
            while True:
                tok = sampler(logits, rows, t)
                lps = token_logprobs(logits, tok, lp_temps[rows].unsqueeze(-1))
                live = 0
                for b, tk, lp in zip(rows.tolist(), tok.tolist(), lps.tolist(), strict=True):
                    if not ended[b] and not push(b, tk, lp):
                        live += 1
                if live == 0:
                    break
                if live <= len(rows) // 2:
                    keep = torch.tensor([j for j, b in enumerate(rows.tolist()) if not ended[b]], device=device)
                    start = int(pad[keep].min())
                    for layer in cache.layers:
                        layer.select(keep, start)
                    rows, tok, positions = rows[keep], tok[keep], positions[keep]
                    mask, pad = mask[keep, start:], pad[keep] - start
                # Speculation (greedy rows of a batch down to its last few): each row's guess of its next
                # tokens, checked in the same forward as the token just sampled.
                # Before that, rows whose next tokens nearly always follow as they do now (an index's
                # ``)</answer>``) guess them from the recent answers, a few tokens at most: checking q tokens
                # costs every row of the batch more than one.
                drafts: list[list[int]] = []
                tail_rows = self.speculate_tokens and len(rows) <= self.speculate_rows
                if tail_rows or self.batch_draft:
                    for b in rows.tolist():
                        room = min(guess_len.get(b, self.speculate_tokens) if tail_rows else self.batch_draft,
                                   n_new - 1 - len(tokens[b]))
                        if ended[b] or not greedy[b] or room <= 0:
                            drafts.append([])
                        elif tail_rows:
                            if b not in lookups:
                                lookups[b] = PromptLookup(prompt_ids[b])
                            drafts.append(lookups[b].draft(tokens[b], room))
                        else:
                            drafts.append(self.responses.draft(tokens[b], room, self.eos_ids, min_share=0.9))
                q = 1 + max(map(len, drafts), default=0)
                inp = tok.unsqueeze(-1)
                if q > 1:
                    inp = torch.tensor([[pad_tok] + d + [self.pad_id] * (q - 1 - len(d))
                                        for pad_tok, d in zip(tok.tolist(), drafts, strict=True)], device=device)
                kv = cache.layers[0].length + q
                if kv > mask.shape[1]:  # speculation's rejected columns used up the room
                    mask = torch.cat((mask, mask.new_ones((mask.shape[0], max(kv - mask.shape[1], n_new)))), 1)
                out = self.model(input_ids=inp, attention_mask=mask[:, :kv],
                                 position_ids=positions.unsqueeze(-1) + torch.arange(q, device=device),
                                 past_key_values=cache, use_cache=True)
                if q == 1:
                    logits = out.logits[:, -1]
                    positions = positions + 1
                else:
                    taken = self._accept(out.logits, drafts, rows, lp_temps, sampler, ended, push)
                    if tail_rows:  # a row whose whole guess was right (a loop, a long copy) guesses twice as far
                        for b, d, a in zip(rows.tolist(), drafts, taken, strict=True):
                            cur = guess_len.get(b, self.speculate_tokens)
                            if a < len(d):
                                guess_len[b] = self.speculate_tokens
                            elif len(d) == cur:
                                guess_len[b] = min(2 * cur, 4 * self.speculate_tokens)
                    for j, a in enumerate(taken):
                        mask[j, kv - q + 1 + a:kv] = 0  # rejected guesses (and padding) are never seen again
                    idx = torch.tensor(taken, device=device)
                    logits = out.logits[torch.arange(len(taken), device=device), idx]
                    positions = positions + 1 + idx
                t += 1
        results = []
        for b, (_, s, _) in enumerate(items):
            ids = tokens[b]
            body = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            text, _ = apply_stop(self.tokenizer.decode(body, skip_special_tokens=True), s.stop)
            results.append(Generation(text, ids, logprobs[b], "stop" if stopped[b] else "length", prompt_lens[b]))
            self.responses.add(ids)
        return results

    @staticmethod
    def _accept(logits: Any, drafts: list[list[int]], rows: Any, lp_temps: Any, sampler: _Sampler, ended: list[bool],
                push: Callable[[int, int, float], bool]) -> list[int]:
        """Check each row's guessed tokens against the greedy choice at each position of a speculative forward
        (``logits``: (R, q, V), or R tensors (q_j, V)); push the agreeing prefix to the row's item (up to its
        end). Returns the guesses accepted per row; the next token then comes from position ``accepted`` of
        the row."""
        import torch

        taken = []
        for j, (b, d) in enumerate(zip(rows.tolist(), drafts, strict=True)):
            a = 0
            if d and not ended[b]:
                lg = logits[j]
                pred = sampler.greedy_tokens(lg[:len(d)]).tolist()
                while a < len(d) and pred[a] == d[a]:
                    a += 1
                if a:
                    lps = token_logprobs(lg[:a], torch.tensor(d[:a], device=lg.device), lp_temps[b]).tolist()
                    for i in range(a):
                        if push(b, d[i], lps[i]):
                            a = i + 1
                            break
            taken.append(a)
        return taken

    def _completion_ids(self, completion: str | Sequence[int]) -> list[int]:
        if isinstance(completion, str):
            return self.tokenizer(completion, add_special_tokens=False)["input_ids"] + [self.eos_id]
        return [int(t) for t in completion]

    def _forward_logits(self, request: ChatRequest, tail: list[int]) -> tuple[Any, Any, int]:
        """Logits (T, V) over prompt + ``tail``, the full ids (T,), and the prompt length."""
        import torch

        enc = self._encode([self.render(request)], list(request.images or []))
        prompt_len = enc["input_ids"].shape[1]
        ids = enc["input_ids"]
        for k, v in list(enc.items()):  # per-token tensors (input_ids, attention_mask, mm_token_type_ids)
            if k.startswith("pixel") or v.shape != ids.shape:
                continue
            fill = tail if k == "input_ids" else [int(k == "attention_mask")] * len(tail)
            enc[k] = torch.cat([v, torch.tensor([fill], dtype=v.dtype, device=v.device)], dim=1)
        with torch.inference_mode(), attention_kernels(self.model.device):
            logits = self.model(**enc, use_cache=False).logits[0]  # (T, V)
        return logits, enc["input_ids"][0], prompt_len

    def _score_sync(self, request: ChatRequest, completion: str | Sequence[int], temperature: float) -> list[float]:
        ids = self._completion_ids(completion)
        if not ids:
            return []
        logits, full, p = self._forward_logits(request, ids)
        # logits at position i predict token i + 1: the completion's tokens are predicted from p-1 .. T-2
        return token_logprobs(logits[p - 1 : -1], full[p:], temperature).tolist()

    def _prompt_logprobs_sync(self, request: ChatRequest, temperature: float) -> tuple[list[int], list[float | None]]:
        logits, full, _ = self._forward_logits(request, [])
        lps = token_logprobs(logits[:-1], full[1:], temperature).tolist()
        return full.tolist(), [None, *lps]


def render_prompt(processor: Any, request: ChatRequest) -> str:
    """The prompt text of a request through the chat template of ``processor`` (a multimodal processor:
    image parts become the model's image tokens) or of a bare tokenizer (text only)."""
    if hasattr(processor, "image_processor"):
        messages = request.parts_messages()
    else:
        messages = [{**m, "content": text_content(m["content"])} for m in request.messages]
    return processor.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
    )
