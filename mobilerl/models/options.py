"""Typed generation-backend specs: the one validation of a backend's options (profiles and
:func:`mobilerl.models.backends.make_backend` both use these models; pydantic only, so loading a profile
imports no backend)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HFOptions(_Strict):
    """The HF backend's tunables (:class:`~mobilerl.models.hf_backend.HFBackend`), as a profile's ``generation.hf``
    section sets them. Defaults are the backend's own; only the keys given reach it."""

    device: str | None = Field(None, description="Torch device, cpu or cuda (default: cuda when available).")
    batch_wait_ms: float = Field(5.0, ge=0, description="How long a batch waits for more requests after the first.")
    fast_prefill: bool = Field(True, description="Prefill text-only prompts of a Qwen2-VL model through the lean "
                                                 "TextPrefill (same logits, ~1.2x faster on the tiny model).")
    prefix_cache_tokens: int = Field(65536, ge=0, description="Positions of recent prompts' keys/values kept to "
                                                              "prefill only a new prompt's unshared tail (0: off).")
    speculate_tokens: int = Field(16, ge=0, description="Tokens a greedy row guesses by prompt lookup in a batch's "
                                                        "tail, checked in the same forward (0: off).")
    speculate_rows: int = Field(8, ge=0, description="Prompt-lookup speculation starts once at most this many rows "
                                                     "are left in the batch.")
    line_token_cache: int = Field(65536, ge=0, description="Prompt lines whose token ids are cached for line-by-line "
                                                           "tokenizing where that is exact (0: tokenize whole).")
    prefill_draft: int = Field(8, ge=0, description="First answer tokens guessed from recent answers and checked in a "
                                                    "greedy row's prefill (0: off).")
    batch_draft: int = Field(4, ge=0, description="Near-certain next tokens (from recent answers) checked in every "
                                                  "decoding forward of a greedy row (0: off).")


class HFSpec(HFOptions):
    kind: Literal["hf"] = Field(description="Generation backend.")
    model: str = Field(description="Model directory (absolute, or relative to the repo).")
    name: str | None = Field(None, description="Backend name recorded in trajectories (default: the directory's).")
    dtype: Literal["fp32", "bf16", "fp16", "auto"] | None = Field(
        None, description="Inference dtype (default: fp32 on CPU, the checkpoint's on GPU).")
    max_batch: int = Field(16, ge=1, description="Most requests per generate call (micro-batcher).")


class OpenAISpec(_Strict):
    kind: Literal["openai"] = Field(description="Generation backend.")
    base_url: str = Field(description="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
    model: str | None = Field(None, description="Served model name (default: the server's first).")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key.")
    timeout: float | None = Field(None, gt=0, description="Seconds per HTTP request.")
    max_retries: int | None = Field(None, ge=0, description="Retries after connection errors / 429 / 5xx.")
    max_concurrency: int | None = Field(None, ge=1, description="Requests in flight from this client.")
    vllm_extensions: bool | None = Field(None, description="Use vLLM's extensions (token ids, prompt_logprobs).")
    name: str | None = Field(None, description="Backend name recorded in trajectories.")


class VLLMSpec(_Strict):
    kind: Literal["vllm"] = Field(description="Generation backend.")
    model: str = Field(description="Model directory (absolute, or relative to the repo).")
    tensor_parallel_size: int | None = Field(None, ge=1, description="GPUs per engine.")
    max_model_len: int | None = Field(None, ge=1, description="Context length.")
    dtype: Literal["fp32", "bf16", "fp16", "auto"] | None = Field(None, description="Inference dtype.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Share of GPU memory for weights "
                                                                               "and KV cache.")
    seed: int | None = Field(None, description="Engine seed.")
    max_batch: int | None = Field(None, ge=1, description="Most requests per LLM.generate call (micro-batcher).")
    batch_wait_ms: float | None = Field(None, ge=0, description="How long a batch waits for more requests.")
    image_min_pixels: int | None = Field(None, ge=1, description="Image processor min pixels.")
    image_max_pixels: int | None = Field(None, ge=1, description="Image processor max pixels.")
    max_images: int | None = Field(None, ge=1, description="Images per prompt.")
    name: str | None = Field(None, description="Backend name recorded in trajectories.")
    engine_kwargs: dict[str, Any] | None = Field(None, description="Other vllm.LLM arguments.")


SPECS: dict[str, type[_Strict]] = {"hf": HFSpec, "openai": OpenAISpec, "vllm": VLLMSpec}


def validate_spec(spec: Any) -> _Strict:
    """``spec`` as its kind's typed model; ``ValueError`` names the bad or missing key (``generation.<key>``)."""
    if not isinstance(spec, dict):
        raise ValueError(f"generation spec must be a dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in SPECS:
        raise ValueError(f"generation.kind must be one of {sorted(SPECS)}, got {kind!r}")
    model = SPECS[kind]
    try:
        return model.model_validate(spec)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                msg = f"unknown key for kind {kind!r} (known: {', '.join(sorted(model.model_fields))})"
            elif err["type"] == "missing":
                msg = f"required for kind {kind!r}"
            else:
                msg = err["msg"]
            problems.append(f"generation.{key}: {msg}")
        raise ValueError("; ".join(problems)) from None
