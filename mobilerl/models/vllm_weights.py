"""vLLM as an RL rollout engine: the engine side of the weight-sync protocol (:mod:`mobilerl.models.weight_sync`)
over vLLM's workers. GPU only (the ``gpu`` extra, ``vllm==0.28.0``); vLLM is never imported here at module level.

vLLM holds the model in worker processes (one per tensor-parallel rank). The server reaches them through
``LLM.collective_rpc(name, args=...)``, which calls ``name`` on every worker; the methods live in
:class:`WorkerExtension`, which vLLM mixes into its worker class when the engine is built with
``worker_extension_cls=WORKER_EXTENSION`` (``serve_openai --engine vllm --weight-sync`` does it). Inside a
worker, weights go in through the model's own ``load_weights`` (vLLM's loader: it maps Hugging Face names to
its fused and sharded parameters and converts the dtype), one tensor at a time as TRL's vLLM server does, so a
push needs no second copy of the model on the GPU. Each worker joins the trainer's group as its own rank
(``rank + worker rank``), receives every tensor whole and keeps its shard. Afterwards the prefix cache is reset:
cached keys and values were computed by the old weights.

Two departures from the HF engine (:class:`mobilerl.models.weight_server.TorchEngineWeights`): the transfer runs
with generation paused (the tensors are loaded as they arrive), and a transfer that breaks off half-way leaves
the engine with part of the new weights; it then reports the error and version -1 (completions too, which the
RL rollouts refuse), and the next push rewrites every tensor. The push is checked against the schema before the transfer starts, so a bad push
(unknown name, wrong shape) is refused with the weights untouched, as on the HF engine.

The schema is the Hugging Face model's ``state_dict`` built from the served checkpoint's config on the
``meta`` device (no memory): the names a transformers trainer of the same model holds, which vLLM's loader
accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mobilerl.models.weight_sync import (
    GroupInfo,
    ParamMeta,
    Schema,
    WeightSyncError,
    check_params,
    file_params,
    model_schema,
)

WORKER_EXTENSION = "mobilerl.models.vllm_weights.WorkerExtension"


def hf_schema(model_dir: str | Path, dtype: torch.dtype | None = None) -> Schema:
    """The schema of the transformers model of ``model_dir``'s config, built on ``meta`` (in ``dtype``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    with torch.device("meta"):
        try:
            model = AutoModelForImageTextToText.from_config(cfg, **kwargs)
        except ValueError:  # a text-only model
            model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    return model_schema(model)


class VLLMEngineWeights:
    """:class:`~mobilerl.models.weight_server.EngineWeights` of a :class:`~mobilerl.models.vllm_backend.VLLMBackend`
    whose engine was built with ``worker_extension_cls=WORKER_EXTENSION``."""

    def __init__(self, backend: Any, model_dir: str | Path) -> None:
        self.llm = backend.llm
        self._schema = hf_schema(model_dir, _engine_dtype(self.llm))
        self._ranks = len(self.llm.collective_rpc("mobilerl_rank"))  # now, before the server takes requests
        self.joined = False

    def schema(self) -> Schema:
        return self._schema

    def ranks(self) -> int:
        return self._ranks

    def join(self, info: GroupInfo) -> None:
        self.llm.collective_rpc("mobilerl_join", args=(info.to_json(),))
        self.joined = True

    def leave(self) -> None:
        self.joined = False
        self.llm.collective_rpc("mobilerl_leave")

    def receive(self, params: Sequence[ParamMeta]) -> Callable[[], None]:
        if not self.joined:
            raise WeightSyncError("no weight-sync group: POST /v1/weights/group first")
        payload = [p.to_json() for p in params]

        def apply() -> None:
            self.llm.collective_rpc("mobilerl_receive", args=(payload,))
            self.llm.reset_prefix_cache()

        return apply

    def load(self, path: str) -> Callable[[], None]:
        check_params(self._schema, file_params(path))

        def apply() -> None:
            self.llm.collective_rpc("mobilerl_load", args=(str(path),))
            self.llm.reset_prefix_cache()

        return apply


def _engine_dtype(llm: Any) -> torch.dtype | None:
    """The dtype vLLM runs the model in (``auto`` may have turned a float32 config into bfloat16)."""
    engine = getattr(llm, "llm_engine", None)
    for holder in (getattr(engine, "model_config", None), getattr(getattr(engine, "vllm_config", None),
                                                                   "model_config", None)):
        dtype = getattr(holder, "dtype", None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return None


class WorkerExtension:
    """Mixed into every vLLM worker (``self`` is the worker: ``self.rank``, ``self.device``,
    ``self.model_runner``); called through ``LLM.collective_rpc``. Arguments are plain JSON-like values, which
    vLLM's inter-process messages carry without pickling."""

    def mobilerl_rank(self) -> int:
        return int(self.rank)  # type: ignore[attr-defined]

    def mobilerl_join(self, info: dict[str, Any]) -> int:
        from mobilerl.models.weight_sync import Group

        g = GroupInfo.from_json(info)
        device = self.device if g.backend == "nccl" else torch.device("cpu")  # type: ignore[attr-defined]
        self._mobilerl_group = Group.join(g, g.rank + int(self.rank), device)  # type: ignore[attr-defined]
        return self._mobilerl_group.rank

    def mobilerl_leave(self) -> None:
        group = getattr(self, "_mobilerl_group", None)
        if group is not None:
            group.close()
        self._mobilerl_group = None

    def mobilerl_receive(self, params: list[dict[str, Any]]) -> int:
        group = getattr(self, "_mobilerl_group", None)
        if group is None:
            raise RuntimeError("mobilerl_receive: this worker has not joined a weight-sync group")
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        for d in params:
            buf = torch.empty(tuple(d["shape"]), dtype=getattr(torch, d["dtype"]), device=group.device)
            group.broadcast(buf)
            model.load_weights(weights=[(d["name"], buf)])
        return len(params)

    def mobilerl_load(self, path: str) -> int:
        from safetensors import safe_open

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            model.load_weights(weights=((k, f.get_tensor(k)) for k in names))
        return len(names)

