"""Build a generation backend from a config dict (a profile's ``generation:`` section plus the weights).

    make_backend({"kind": "hf", "model": "models/tiny-base"})
    make_backend({"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "api_key_env": "MOBILERL_API_KEY"})
    make_backend({"kind": "vllm", "model": "/models/Qwen2.5-VL-7B-Instruct", "tensor_parallel_size": 1})
    make_backend(profile_spec(load_profile("tiny")))

Each kind accepts exactly the fields of its typed spec (:class:`HFSpec`, :class:`OpenAISpec`, :class:`VLLMSpec`);
an unknown key, a missing required one or a bad value is an error naming it.
API keys are never put in configs: ``api_key_env`` names the environment variable holding one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mobilerl.models.generation import GenerationBackend
from mobilerl.models.options import HFOptions, HFSpec, OpenAISpec, VLLMSpec, validate_spec

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["HFOptions", "HFSpec", "OpenAISpec", "VLLMSpec", "make_backend", "profile_spec", "validate_spec"]


def _model_path(value: Any) -> Path:
    p = Path(str(value))
    return p if p.is_absolute() or p.exists() else ROOT / p


def make_backend(spec: dict[str, Any]) -> GenerationBackend:
    """A backend from ``spec`` (see the module docstring); ``ValueError`` names a bad or missing key."""
    opts = validate_spec(spec)
    kind = spec["kind"]
    args = opts.model_dump(exclude_unset=True, exclude={"kind"})  # unset keys: the backend's own defaults
    if kind == "hf":
        from mobilerl.models.hf_backend import HFBackend

        if args.get("name") is None:
            args.pop("name", None)
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
    from mobilerl.models.random_init import ensure_weights

    spec: dict[str, Any] = {"kind": g.kind, "model": str(ensure_weights(profile)), "dtype": profile.inference_dtype,
                            "max_batch": g.max_batch}
    if g.kind == "hf":
        spec.update(g.hf.model_dump(exclude_unset=True))
    if g.kind == "vllm":
        spec.update(tensor_parallel_size=g.tensor_parallel_size, image_min_pixels=profile.image_min_pixels,
                    image_max_pixels=profile.image_max_pixels)
        if g.max_model_len is not None:
            spec["max_model_len"] = g.max_model_len
    return spec
