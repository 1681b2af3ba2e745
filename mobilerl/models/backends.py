"""Build a generation backend from a config dict (a profile's ``generation:`` section plus the weights).

    make_backend({"kind": "hf", "model": "models/tiny-base"})
    make_backend({"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "api_key_env": "MOBILERL_API_KEY"})
    make_backend({"kind": "vllm", "model": "/models/Qwen2.5-VL-7B-Instruct", "tensor_parallel_size": 1})
    make_backend(profile_spec(load_profile("tiny")))

Each kind accepts exactly the keys below; an unknown key or a missing required one is an error naming it.
API keys are never put in configs: ``api_key_env`` names the environment variable holding one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mobilerl.models.generation import GenerationBackend

ROOT = Path(__file__).resolve().parents[2]

# kind -> (required keys, optional keys with what they mean)
KEYS: dict[str, tuple[frozenset[str], dict[str, str]]] = {
    "hf": (
        frozenset({"model"}),
        {
            "max_batch": "most requests per generate call (micro-batcher)",
            "batch_wait_ms": "how long a batch waits for more requests",
            "device": "cpu / cuda (default: cuda when available)",
            "dtype": "fp32 / bf16 / fp16 / auto",
            "prefix_cache_tokens": "keys/values of recent prompts kept for prefix reuse (0: off)",
            "speculate_tokens": "tokens guessed by prompt lookup per greedy row in a batch's tail (0: off)",
            "speculate_rows": "speculate once at most this many rows are left in a batch",
            "line_token_cache": "prompt lines whose token ids are kept (0: tokenize every prompt whole)",
            "prefill_draft": "answer tokens guessed from recent answers and checked in a greedy row's prefill (0: off)",
            "batch_draft": "near-certain next tokens (from recent answers) checked in every decoding forward (0: off)",
            "name": "backend name recorded in trajectories",
        },
    ),
    "openai": (
        frozenset({"base_url"}),
        {
            "model": "served model name (default: the server's first)",
            "api_key_env": "environment variable holding the API key",
            "timeout": "seconds per HTTP request",
            "max_retries": "retries after connection errors / 429 / 5xx",
            "max_concurrency": "requests in flight from this client",
            "vllm_extensions": "use vLLM's extensions (token ids, prompt_logprobs for score)",
            "name": "backend name recorded in trajectories",
        },
    ),
    "vllm": (
        frozenset({"model"}),
        {
            "tensor_parallel_size": "GPUs per engine",
            "max_model_len": "context length",
            "dtype": "fp32 / bf16 / fp16 / auto",
            "gpu_memory_utilization": "share of GPU memory for weights + KV cache",
            "seed": "engine seed",
            "max_batch": "most requests per LLM.generate call (micro-batcher)",
            "batch_wait_ms": "how long a batch waits for more requests",
            "image_min_pixels": "image processor min pixels",
            "image_max_pixels": "image processor max pixels",
            "max_images": "images per prompt",
            "name": "backend name recorded in trajectories",
            "engine_kwargs": "other vllm.LLM arguments",
        },
    ),
}


def _model_path(value: Any) -> Path:
    p = Path(str(value))
    return p if p.is_absolute() or p.exists() else ROOT / p


def make_backend(spec: dict[str, Any]) -> GenerationBackend:
    """A backend from ``spec`` (see the module docstring); ``ValueError`` names a bad or missing key."""
    if not isinstance(spec, dict):
        raise ValueError(f"generation spec must be a dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in KEYS:
        raise ValueError(f"generation.kind must be one of {sorted(KEYS)}, got {kind!r}")
    required, optional = KEYS[kind]
    args = {k: v for k, v in spec.items() if k != "kind"}
    unknown = sorted(set(args) - required - set(optional))
    if unknown:
        raise ValueError(
            f"generation.{unknown[0]}: unknown key for kind {kind!r} (known: {', '.join(sorted(required | set(optional)))})"
        )
    missing = sorted(required - set(args))
    if missing:
        raise ValueError(f"generation.{missing[0]}: required for kind {kind!r}")
    if kind == "hf":
        from mobilerl.models.hf_backend import HFBackend

        return HFBackend.from_pretrained(_model_path(args.pop("model")), **args)
    if kind == "vllm":
        from mobilerl.models.vllm_backend import VLLMBackend

        return VLLMBackend(_model_path(args.pop("model")), **args)
    from mobilerl.models.openai_backend import OpenAIBackend

    env = args.pop("api_key_env", None)
    api_key = None
    if env is not None:
        api_key = os.environ.get(env)
        if not api_key:
            raise ValueError(f"generation.api_key_env: environment variable {env!r} is not set")
    return OpenAIBackend(args.pop("base_url"), api_key=api_key, **args)


def profile_spec(profile: Any) -> dict[str, Any]:
    """The :func:`make_backend` spec of a :class:`mobilerl.models.profiles.ModelProfile`."""
    g = profile.generation
    if g.kind == "openai":
        if not g.base_url:
            raise ValueError(f"profile {profile.name}: generation.base_url is required for kind 'openai'")
        return {"kind": "openai", "base_url": g.base_url}
    spec: dict[str, Any] = {"kind": g.kind, "model": str(profile.weights_path), "dtype": profile.inference_dtype,
                            "max_batch": g.max_batch}
    if g.kind == "vllm":
        spec.update(tensor_parallel_size=g.tensor_parallel_size, image_min_pixels=profile.image_min_pixels,
                    image_max_pixels=profile.image_max_pixels)
        if g.max_model_len is not None:
            spec["max_model_len"] = g.max_model_len
    return spec
