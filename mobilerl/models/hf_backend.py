"""Hugging Face transformers generation backend (CPU or GPU), with a micro-batcher.

    backend = HFBackend.from_pretrained("models/tiny-base")          # or HFBackend(model, processor)
    [gen] = await backend.generate([ChatRequest(messages, images)], SamplingConfig(temperature=1, seed=0))

Concurrent callers (the episodes of an evaluation or an RL rollout) are batched: requests arriving while a
batch runs, or within ``batch_wait_ms`` of the first, go to one left-padded ``model.generate`` call (up to
``max_batch``) in a worker thread. Requests with different ``max_new_tokens`` / ``stop`` never share a
batch; temperature, top-p and seed are per request.

Sampling is done per row by :class:`_RowSampler` (a logits processor with one ``torch.Generator`` per
request), so a request's sample depends on its seed, not on which other requests share its batch (up to
the float noise that padding adds to the logits). ``generate`` runs greedy over the processor's one-hot
output and ``output_logits=True`` keeps the raw logits, from which the logprobs are computed as defined in
:mod:`mobilerl.models.generation`. ``score`` is one forward pass over prompt + completion.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
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


def token_logprobs(logits: Any, tokens: Any, temperature: float) -> Any:
    """``log_softmax(logits / T)`` gathered at ``tokens``: logits (N, V), tokens (N,) -> (N,) float32."""
    import torch

    lp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
    return lp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # (N,)


def _is_tiny_checkpoint(path: Path) -> bool:
    return (path / "tiny.json").exists()


class _RowSampler:
    """A logits processor that samples each row with its own generator and returns a one-hot mask.

    Row ``b``: greedy if ``temps[b] == 0``; else softmax(logits / T) restricted to the top-p nucleus
    (smallest set of tokens whose probability reaches ``top_p``; the top token always stays). Tokens in
    ``suppress`` (the image/video placeholders, which the model cannot take back as input without their
    pixels) are never drawn; logprobs still come from the raw logits.
    """

    def __init__(self, temps: list[float], top_ps: list[float], generators: list[Any], suppress: list[int]):
        self.temps, self.top_ps, self.generators, self.suppress = temps, top_ps, generators, suppress

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        out = torch.full_like(scores, float("-inf"))
        for b in range(scores.shape[0]):
            row = scores[b].float().clone()  # never modify the raw logits generate keeps
            if self.suppress:
                row[self.suppress] = float("-inf")
            t = self.temps[b]
            if t == 0:
                tok = int(row.argmax())
            else:
                probs = torch.softmax(row / t, dim=-1)
                if self.top_ps[b] < 1.0:
                    sp, si = probs.sort(descending=True)
                    keep = (sp.cumsum(0) - sp) < self.top_ps[b]  # tokens before the mass reaches top_p
                    keep[0] = True
                    probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
                tok = int(torch.multinomial(probs, 1, generator=self.generators[b]))
            out[b, tok] = 0.0
        return out


class _Finish:
    """Stopping criterion recording, per row, where the response ends and why (eos or a stop string)."""

    def __init__(self, prompt_len: int, eos_ids: set[int], stop: Sequence[str], tokenizer: Any):
        self.prompt_len, self.eos_ids, self.stop, self.tok = prompt_len, eos_ids, tuple(stop), tokenizer
        self.end: dict[int, int] = {}  # row -> number of generated tokens kept
        # A stop string first shows up at the end of the text, within its length in (byte-level) tokens.
        self.tail = 4 * max((len(s) for s in self.stop), default=0) + 4

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        n = input_ids.shape[1] - self.prompt_len
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for b in range(input_ids.shape[0]):
            if b in self.end:
                done[b] = True
                continue
            if int(input_ids[b, -1]) in self.eos_ids:
                self.end[b] = n
            elif self.stop:
                start = max(self.prompt_len, input_ids.shape[1] - self.tail)
                text = self.tok.decode(input_ids[b, start:], skip_special_tokens=True)
                if apply_stop(text, self.stop)[1]:
                    self.end[b] = n
            done[b] = b in self.end
        return done


class HFBackend:
    """:class:`~mobilerl.models.generation.GenerationBackend` over a transformers image-text-to-text model.

    Args:
        model: a causal (vision-)language model with ``generate``; put in eval mode.
        processor: its processor (chat template, tokenizer, image processor) or a bare tokenizer.
        max_batch: most requests per ``generate`` call.
        batch_wait_ms: how long a batch waits for more requests after the first (and after those that
            queued while the previous batch ran).
        name: recorded as the policy/backend name.
    """

    def __init__(
        self, model: Any, processor: Any, *, max_batch: int = 16, batch_wait_ms: float = 5.0, name: str = "hf"
    ) -> None:
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
        """Left-padded batch through the processor (pixel_values / image_grid_thw when there are images)."""
        if hasattr(self.processor, "image_processor"):
            enc = self.processor(
                text=texts, images=images or None, padding=True, padding_side="left", return_tensors="pt"
            )
        else:
            if images:
                raise ValueError("this backend's processor has no image processor; the request has images")
            enc = self.tokenizer(
                texts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False
            )
        return {k: v.to(self.model.device) for k, v in enc.items()}

    def _generate_batch(self, items: list[tuple[ChatRequest, SamplingConfig, int]]) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        sampling = items[0][1]  # max_new_tokens and stop are shared by the batch (the batcher's key)
        texts = [self.render(r) for r, _, _ in items]
        images = [im for r, _, _ in items for im in (r.images or [])]
        enc = self._encode(texts, images)
        prompt_len = enc["input_ids"].shape[1]
        gens = [torch.Generator(device=self.model.device).manual_seed(seed) for _, _, seed in items]
        sampler = _RowSampler(
            [s.temperature for _, s, _ in items], [s.top_p for _, s, _ in items], gens, self.suppress_ids
        )
        finish = _Finish(prompt_len, self.eos_ids, sampling.stop, self.tokenizer)
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                generation_config=config,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=StoppingCriteriaList([finish]),
            )
        new = out.sequences[:, prompt_len:]  # (B, n)
        logits = torch.stack(out.logits, dim=1)  # (B, n, V) raw logits of each step
        n_prompt = enc["attention_mask"].sum(dim=1).tolist()
        results = []
        for b, (_, s, _) in enumerate(items):
            n = finish.end.get(b, new.shape[1])
            ids = new[b, :n]
            lps = token_logprobs(logits[b, :n], ids, s.logprob_temperature).tolist()
            ids_list = ids.tolist()
            body = ids_list[:-1] if n and ids_list[-1] in self.eos_ids else ids_list
            text, _ = apply_stop(self.tokenizer.decode(body, skip_special_tokens=True), s.stop)
            reason = "stop" if b in finish.end else "length"
            results.append(Generation(text, ids_list, lps, reason, int(n_prompt[b])))
        return results

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
        with torch.inference_mode():
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
