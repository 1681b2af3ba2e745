"""Hugging Face transformers generation backend (CPU or GPU), with a micro-batcher.

    backend = HFBackend.from_pretrained("models/tiny-base")          # or HFBackend(model, processor)
    [gen] = await backend.generate([ChatRequest(messages, images)], SamplingConfig(temperature=1, seed=0))

Concurrent callers (the episodes of an evaluation or an RL rollout) are batched: requests arriving while a
batch runs, or within ``batch_wait_ms`` of the first, are generated together (up to ``max_batch``) in a
worker thread. Requests with different ``max_new_tokens`` / ``stop`` never share a batch; temperature,
top-p and seed are per request.

A batch is not one left-padded ``model.generate`` call, which spends prefill FLOPs on pad tokens and copies
the whole KV cache at every token. Each prompt is prefilled alone (causal kernel, no mask; text-only
prompts of a Qwen2-VL model through the lean :class:`~mobilerl.models.text_prefill.TextPrefill`), the caches
are copied once into one batch cache (:mod:`mobilerl.models.decode_cache`), and the rows decode together,
each drawn from its own seeded stream (:mod:`mobilerl.models.sampler`), so a request's sample does not
depend on its batch mates (up to the float noise batching adds to the logits). Greedy rows also check
guessed tokens (:mod:`mobilerl.models.speculation`) in forwards that run anyway. Logprobs are
:func:`mobilerl.models.logprobs.token_logprobs` of the raw logits; ``score`` is one teacher-forced forward.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mobilerl.models.decode_cache import Arena, decode_cache, layer_kv
from mobilerl.models.generation import (
    ChatRequest,
    Generation,
    MicroBatcher,
    SamplingConfig,
    apply_stop,
    render_prompt,
)
from mobilerl.models.logprobs import token_logprobs
from mobilerl.models.sampler import Sampler
from mobilerl.models.speculation import PromptLookup, ResponseLookup
from mobilerl.models.text_prefill import LineTokenCache, PrefixCache, TextPrefill

DECODE_ROOM = 32  # positions a batch's decoding cache holds beyond its longest prompt before it grows


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
        self._arena = Arena()
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mobilerl-hf",
                                            initializer=self._on_model_thread)
        self._model_thread: threading.Thread | None = None
        self._batcher = MicroBatcher(
            self._generate_batch,
            self._executor,
            max_batch=max_batch,
            wait_s=batch_wait_ms / 1000.0,
            key=lambda item: (item[1].max_new_tokens, item[1].stop),
        )
        self._rng = random.Random()
        self.line_tokens = LineTokenCache.for_tokenizer(self.tokenizer, line_token_cache) if line_token_cache else None

    def _on_model_thread(self) -> None:
        self._model_thread = threading.current_thread()

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

    def load_weights(self, path: str | os.PathLike) -> None:
        """Replace the model's weights, in place, by those of the safetensors file ``path`` (the trainer's
        ``save_model`` / ``save_file`` of the same architecture; a tied tensor under any one of its names).

        Strict: every tensor of the model, with its shape, and nothing else, checked before anything is copied
        (``ValueError`` names the parameters; the old weights stay). Runs on the backend's model thread, so it
        waits for the batch in progress and no batch sees half the weights; then the prefix cache and the
        recent-answer drafts (old weights' keys and answers) are dropped. Blocks until loaded; from async code
        ``await asyncio.to_thread(backend.load_weights, path)``.
        """
        if threading.current_thread() is self._model_thread:
            self._load_weights_sync(Path(path))
        else:
            self._executor.submit(self._load_weights_sync, Path(path)).result()

    def _load_weights_sync(self, path: Path) -> None:
        import torch
        from safetensors import safe_open

        if not path.is_file():
            raise FileNotFoundError(f"weights file {path} not found")
        tensors = self.model.state_dict(keep_vars=True)
        groups: dict[int, list[str]] = {}  # tied tensors: one entry, all their names
        for name, t in tensors.items():
            groups.setdefault(id(t), []).append(name)
        with safe_open(str(path), framework="pt", device="cpu") as f:
            keys = set(f.keys())
            problems = [f"unknown parameter {k}" for k in sorted(keys - set(tensors))]
            problems += [f"missing parameter {names[0]}" for names in groups.values() if not keys & set(names)]
            for k in sorted(keys & set(tensors)):
                shape = tuple(f.get_slice(k).get_shape())
                if shape != tuple(tensors[k].shape):
                    problems.append(f"{k}: shape {list(shape)}, the model's is {list(tensors[k].shape)}")
            if problems:
                raise ValueError(f"{path}: not this model's weights: " + "; ".join(problems[:8])
                                 + (f"; ... ({len(problems)} problems)" if len(problems) > 8 else ""))
            with torch.no_grad():
                for names in groups.values():
                    k = next(n for n in names if n in keys)
                    tensors[k].copy_(f.get_tensor(k))
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self.responses = ResponseLookup()

    async def aclose(self) -> None:
        await self._batcher.aclose()

    # ---------------------------------------------------------------------------- internals

    def render(self, request: ChatRequest) -> str:
        return render_prompt(self.processor, request)

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The prompt's token ids exactly as generation encodes them (what a trainer prepends to a response)."""
        return self._encode([self.render(request)], list(request.images or []))["input_ids"][0].tolist()

    def image_inputs(self, files: Sequence[str]) -> dict[str, Any]:
        """``pixel_values`` / ``image_grid_thw`` (on CPU) of the screenshot files, as generation's processor call
        computes them: what a trainer's forward over rebuilt prompts needs beside :meth:`prompt_ids`."""
        from mobilerl.sealed import open_image

        if not hasattr(self.processor, "image_processor"):
            raise ValueError("this backend's processor has no image processor; the prompts have images")
        images = [open_image(f) for f in files]  # RL's kept screens are sealed at rest (mobilerl.sealed)
        return dict(self.processor.image_processor(images=images, return_tensors="pt"))

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
        return out.logits[0, -1:], layer_kv(out.past_key_values), n, delta, ids, []

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
            sampler = Sampler([s for _, s, _ in items], [seed for _, _, seed in items], n_new, self.suppress_ids,
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
            cache = decode_cache([[(k[:, :, :m], v[:, :, :m]) for k, v in kv] for (_, kv, *_), m in
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
    def _accept(logits: Any, drafts: list[list[int]], rows: Any, lp_temps: Any, sampler: Sampler, ended: list[bool],
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
