"""vLLM generation backend (GPU; the ``gpu`` extra: ``vllm==0.28.0``). vLLM is imported lazily, so this
module imports everywhere; constructing :class:`VLLMBackend` needs vLLM and a CUDA device.

    backend = VLLMBackend("/models/Qwen2.5-VL-7B-Instruct", tensor_parallel_size=1, max_model_len=20480)

Prompts are rendered with the model's own chat template (:func:`mobilerl.models.generation.render_prompt`,
the HF processor when it loads, else vLLM's tokenizer) and sent to ``vllm.LLM.generate`` with the images as
``multi_modal_data``. Concurrent callers are gathered by the same micro-batcher as the HF backend into one
``LLM.generate`` call (vLLM then schedules them with continuous batching), run in a worker thread.

Logprobs: the engine runs with ``logprobs_mode="processed_logprobs"`` and ``SamplingParams(logprobs=0)``,
which is ``log_softmax(logits / T)`` of the sampled token — the project's definition
(:mod:`mobilerl.models.logprobs`) — when ``top_p == 1``; with ``top_p < 1`` vLLM renormalises over the
nucleus (a known difference, logged once). ``score`` uses ``prompt_logprobs=0`` on prompt + completion
token ids (``TokensPrompt`` with ``multi_modal_data``; vLLM expands the image placeholders); vLLM's prompt
logprobs are at T = 1, so only ``temperature=1`` can be scored. Per-request ``seed`` makes sampling
reproducible (request ``i`` of a call: ``seed + i``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mobilerl.models.generation import (
    ChatRequest,
    Generation,
    GenerationError,
    MicroBatcher,
    SamplingConfig,
    render_prompt,
)

log = logging.getLogger(__name__)

INSTALL_HINT = "vLLM is not installed: it is the GPU extra (pip install -c constraints.txt -e '.[gpu]', CUDA only)"


def vllm_available() -> bool:
    """vLLM importable and a CUDA device present (what the GPU tests check)."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def _logprob_of(entry: Any, token_id: int) -> float:
    """The logprob of ``token_id`` in one vLLM logprobs position (``{id: Logprob}``)."""
    if entry is None or token_id not in entry:
        raise GenerationError(f"vLLM returned no logprob for token {token_id}")
    v = entry[token_id]
    return float(getattr(v, "logprob", v))


class VLLMBackend:
    """:class:`~mobilerl.models.generation.GenerationBackend` over ``vllm.LLM``.

    Args:
        model: local model directory (nothing is downloaded).
        tensor_parallel_size, max_model_len, dtype, gpu_memory_utilization, seed: passed to ``vllm.LLM``.
        max_batch: most requests per ``LLM.generate`` call from the micro-batcher.
        batch_wait_ms: how long a batch waits for more requests.
        image_min_pixels / image_max_pixels: the image processor's limits (``mm_processor_kwargs``).
        max_images: images per prompt (``limit_mm_per_prompt``).
        engine_kwargs: anything else for ``vllm.LLM``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        max_batch: int = 256,
        batch_wait_ms: float = 5.0,
        image_min_pixels: int | None = None,
        image_max_pixels: int | None = None,
        max_images: int = 1,
        name: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        try:
            import vllm
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        from mobilerl.models import tiny

        tiny.offline()
        path = str(model)
        mm_kwargs = {k: v for k, v in (("min_pixels", image_min_pixels), ("max_pixels", image_max_pixels)) if v}
        kwargs: dict[str, Any] = dict(
            model=path,
            tensor_parallel_size=tensor_parallel_size,
            dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype),
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            logprobs_mode="processed_logprobs",
            limit_mm_per_prompt={"image": max_images},
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if mm_kwargs:
            kwargs["mm_processor_kwargs"] = mm_kwargs
        kwargs.update(engine_kwargs or {})
        self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        try:
            from transformers import AutoProcessor

            self.processor: Any = AutoProcessor.from_pretrained(path, local_files_only=True)
        except Exception:  # noqa: BLE001 - text-only models: the tokenizer's template
            self.processor = self.llm.get_tokenizer()
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.name = name or Path(path).name
        self._warned_top_p = False
        self._rng = random.Random()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mobilerl-vllm")
        self._batcher = MicroBatcher(self._generate_batch, self._executor, max_batch=max_batch, wait_s=batch_wait_ms / 1000)

    @property
    def stats(self):
        return self._batcher.stats

    def _prompt(self, request: ChatRequest) -> dict[str, Any]:
        p: dict[str, Any] = {"prompt": render_prompt(self.processor, request)}
        if request.images:
            p["multi_modal_data"] = {"image": list(request.images)}
        return p

    def _params(self, sampling: SamplingConfig, seed: int | None) -> Any:
        if sampling.top_p < 1 and not self._warned_top_p:
            log.warning("vLLM logprobs with top_p < 1 are renormalised over the nucleus (not log_softmax(logits/T))")
            self._warned_top_p = True
        return self._vllm.SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=seed,
            stop=list(sampling.stop) or None,
            logprobs=0,
            skip_special_tokens=True,
        )

    def _generate_batch(self, items: list[tuple[ChatRequest, SamplingConfig, int]]) -> list[Generation]:
        prompts = [self._prompt(r) for r, _, _ in items]
        params = [self._params(s, seed) for _, s, seed in items]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for out in outs:
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise GenerationError(f"vLLM returned logprobs for {len(c.logprobs or [])} of {len(ids)} tokens")
            lps = [_logprob_of(entry, t) for entry, t in zip(c.logprobs, ids, strict=True)]
            reason = "length" if c.finish_reason == "length" else "stop"
            # vLLM's text already ends before a stop string and leaves out special tokens
            results.append(Generation(c.text, ids, lps, reason, len(out.prompt_token_ids or [])))
        return results

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        return await self._batcher.generate(requests, sampling, self._rng)

    def _score_sync(self, request: ChatRequest, completion: str | Sequence[int]) -> list[float]:
        if isinstance(completion, str):
            tail = [*self.tokenizer.encode(completion, add_special_tokens=False), self.eos_id]
        else:
            tail = [int(t) for t in completion]
        if not tail:
            return []
        head = self.tokenizer.encode(render_prompt(self.processor, request), add_special_tokens=False)
        prompt: dict[str, Any] = {"prompt_token_ids": head + tail}
        if request.images:
            prompt["multi_modal_data"] = {"image": list(request.images)}
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        [out] = self.llm.generate([prompt], params, use_tqdm=False)
        pl = out.prompt_logprobs or []
        if len(pl) < len(tail):
            raise GenerationError(f"vLLM returned {len(pl)} prompt logprobs for a {len(tail)}-token completion")
        return [_logprob_of(e, t) for e, t in zip(pl[-len(tail) :], tail, strict=True)]

    async def score(
        self, request: ChatRequest, completion: str | Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        if temperature != 1.0:
            raise ValueError("VLLMBackend.score: vLLM's prompt logprobs are at temperature 1 only")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._score_sync, request, completion)

    async def aclose(self) -> None:
        await self._batcher.aclose()
