"""The engine side of the weight-sync protocol (:mod:`mobilerl.models.weight_sync`): the HTTP endpoints a rollout
engine adds to its OpenAI-compatible server, the version it reports, and the gate that keeps a completion on
one version of the weights.

:class:`WeightServer` holds the state and mounts the routes on :func:`mobilerl.models.serve_openai.create_app`
(``weights=``); it drives an :class:`EngineWeights`: :class:`TorchEngineWeights` for a torch model served in
this process (the HF backend), :class:`mobilerl.models.vllm_weights.VLLMEngineWeights` for vLLM's workers.

Order of a swap: the transfer runs in a thread while the engine keeps generating (an HF engine receives into
fresh buffers); then generation pauses (calls in flight finish first), the new weights are copied in, the version
advances, generation resumes. A refused push, or a transfer that fails before the swap, leaves the old weights
and version; the error is in ``GET /v1/weights``. A swap that breaks off half-way (possible on vLLM, which loads
tensors as they arrive) leaves the version ``-1`` until the next push succeeds, so no completion claims a version
it was not sampled with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import torch
from fastapi import Request
from fastapi.responses import JSONResponse

from mobilerl.models.weight_sync import (
    Group,
    GroupInfo,
    ParamMeta,
    Schema,
    WeightSyncError,
    check_params,
    file_params,
    model_schema,
    named_tensors,
)


class EngineWeights(Protocol):
    """What an engine does for the protocol. ``receive`` / ``load`` may block on the transfer while the engine
    keeps generating; the callable they return swaps the weights in and runs with generation paused. ``join``,
    ``leave`` and that callable never overlap a generation call."""

    def schema(self) -> Schema: ...

    def ranks(self) -> int: ...

    def join(self, info: GroupInfo) -> None: ...

    def leave(self) -> None: ...

    def receive(self, params: Sequence[ParamMeta]) -> Callable[[], None]: ...

    def load(self, path: str) -> Callable[[], None]: ...


class TorchEngineWeights:
    """:class:`EngineWeights` of an HF backend served in this process: broadcast tensors arrive in fresh buffers
    and are copied in place only once all arrived (in-place copies bump the tensors' versions, which is what
    drops the backend's prefix cache); a file is loaded by :meth:`~mobilerl.models.hf_backend.HFBackend.load_weights`."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        model = backend.model
        self.model = model
        self._tensors = dict(named_tensors(model))
        self._schema = model_schema(model)
        self.group: Group | None = None

    def schema(self) -> Schema:
        return self._schema

    def ranks(self) -> int:
        return 1

    def join(self, info: GroupInfo) -> None:
        self.leave()
        device = next(self.model.parameters()).device if info.backend == "nccl" else torch.device("cpu")
        self.group = Group.join(info, info.rank, device)  # gloo receives on the CPU; the swap copies over

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group = None

    def receive(self, params: Sequence[ParamMeta]) -> Callable[[], None]:
        group = self.group
        if group is None:
            raise WeightSyncError("no weight-sync group: POST /v1/weights/group first")
        staged: dict[str, torch.Tensor] = {}
        for p in params:
            buf = torch.empty(p.shape, dtype=getattr(torch, p.dtype), device=group.device)
            group.broadcast(buf)
            staged[p.name] = buf
        return lambda: self._commit(staged)

    def load(self, path: str) -> Callable[[], None]:
        check_params(self._schema, file_params(path))  # the header only: a refused file leaves the version as is
        return lambda: self.backend.load_weights(path)

    @torch.no_grad()
    def _commit(self, staged: dict[str, torch.Tensor]) -> None:
        for name, t in staged.items():
            self._tensors[name].copy_(t)


UNKNOWN_VERSION = -1  # reported after a swap broke off half-way, until the next push succeeds


class VersionGate:
    """Generation calls share the gate; a weight swap takes it alone (waiting for calls in flight, holding new
    ones back). So a completion is sampled with one version of the weights from start to end, the one it
    reports."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = 0
        self._swapping = False
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping and not self._waiting)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            await self._cond.wait_for(lambda: not self._swapping and self._active == 0)
            self._waiting -= 1
            self._swapping = True
        try:
            yield
        finally:
            async with self._cond:
                self._swapping = False
                self._cond.notify_all()


class WeightServer:
    """The engine side of the protocol over an :class:`EngineWeights`: its state, the version gate, the routes.

    Routes (mounted by :meth:`mount`; behind the server's API key when it has one):

    - ``GET /v1/weights[?wait=true]`` → ``{version, status, error, updates, ranks, group}``; ``wait`` first
      lets an update in progress finish.
    - ``GET /v1/weights/schema`` → ``{params: [{name, dtype, shape}], ranks}``.
    - ``POST /v1/weights`` ``{path, version}`` → reload from a safetensors file; answers when swapped in.
    - ``POST /v1/weights/group`` ``{host, port, prefix, world_size, rank, backend, timeout_s}`` → 202, joins
      the trainer's group in the background; ``DELETE /v1/weights/group`` leaves it.
    - ``POST /v1/weights/update`` ``{version, params: [{name, dtype, shape}]}`` → 202 once checked; the tensors
      are then broadcast by the trainer, in that order.

    400: a refused push (the message names the parameter); 409: no group, or another update in progress.
    """

    def __init__(self, engine: EngineWeights, version: int = 0) -> None:
        self.engine = engine
        self.version = version
        self.status = "ready"
        self.error: str | None = None
        self.updates = 0
        self.last_update_s = 0.0
        self.group: GroupInfo | None = None
        self.gate = VersionGate()
        self._busy = False
        self._task: asyncio.Task | None = None

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        """Hold while generating; yields the version the generation runs with."""
        async with self.gate.shared():
            yield self.version

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "status": self.status, "error": self.error, "updates": self.updates,
                "last_update_s": self.last_update_s, "ranks": self.engine.ranks(),
                "group": self.group.to_json() if self.group is not None else None}

    # ------------------------------------------------------------------------------ operations

    def _claim(self, status: str) -> None:
        if self._busy:
            raise _Busy(f"another weight operation is in progress ({self.status})")
        self._busy, self.status, self.error = True, status, None

    async def _swap(self, prepare: Callable[[], Callable[[], None]], version: int, collective: bool = False) -> None:
        """``prepare`` (the transfer) in a thread, then its swap with generation paused; on failure the old
        weights stay, and after a failed collective the group is dropped (both ends must form a new one)."""
        t0 = time.perf_counter()
        applying = False
        try:
            apply = await asyncio.to_thread(prepare)
            async with self.gate.exclusive():
                applying = True
                try:
                    await asyncio.to_thread(apply)
                except BaseException:
                    # part of the new weights may be in (vLLM loads tensors as they arrive): no version is true
                    self.version = UNKNOWN_VERSION
                    raise
                self.version = version
            self.updates += 1
            self.status, self.error = "ready", None
        except Exception as e:  # noqa: BLE001 - reported in the state; the old weights stay
            self.status = "error"
            self.error = f"{type(e).__name__}: {e}" + (" (weights now unknown: push again)" if applying else "")
            if collective:
                self.group = None
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.engine.leave)
        finally:
            self.last_update_s = time.perf_counter() - t0
            self._busy = False

    async def reload(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise WeightSyncError("POST /v1/weights needs {'path': str, 'version': int}")
        version = _version(body)
        self._claim("loading")
        await self._swap(lambda: self.engine.load(body["path"]), version)
        if self.status == "error":
            raise WeightSyncError(self.error or "load failed")
        return self.state()

    async def join(self, body: Any) -> dict[str, Any]:
        info = GroupInfo.from_json(body)
        self._claim("joining")

        async def run() -> None:
            try:
                async with self.gate.exclusive():
                    await asyncio.to_thread(self.engine.join, info)
                self.group, self.status = info, "ready"
            except Exception as e:  # noqa: BLE001 - reported in the state
                self.group, self.status, self.error = None, "error", f"join failed: {type(e).__name__}: {e}"
            finally:
                self._busy = False

        self._task = asyncio.create_task(run())
        return self.state()

    async def leave(self) -> dict[str, Any]:
        self._claim("leaving")
        try:
            async with self.gate.exclusive():
                await asyncio.to_thread(self.engine.leave)
            self.group, self.status = None, "ready"
        finally:
            self._busy = False
        return self.state()

    async def update(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("params"), list):
            raise WeightSyncError("POST /v1/weights/update needs {'version': int, 'params': [{name, dtype, shape}]}")
        version = _version(body)
        params = [ParamMeta.from_json(d, f"params[{i}]") for i, d in enumerate(body["params"])]
        check_params(self.engine.schema(), params)
        if self.group is None:
            raise _Busy("no weight-sync group: POST /v1/weights/group first")
        self._claim("receiving")
        self._task = asyncio.create_task(self._swap(lambda: self.engine.receive(params), version, collective=True))
        return self.state()

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # ---------------------------------------------------------------------------------- routes

    def mount(self, app: Any) -> None:
        def error(status: int, message: str) -> JSONResponse:
            kind = "invalid_request_error" if status < 500 else "server_error"
            return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

        async def call(op: Callable[[], Any], status: int = 200) -> Any:
            try:
                out = await op()
            except _Busy as e:
                return error(409, str(e))
            except WeightSyncError as e:
                return error(400, str(e))
            return JSONResponse(out, status_code=status)

        async def body_of(request: Request) -> Any:
            try:
                return await request.json()
            except ValueError:
                return None

        @app.get("/v1/weights")
        async def weights_state(wait: bool = False) -> Any:
            if wait:
                await self.wait()
            return self.state()

        @app.get("/v1/weights/schema")
        async def weights_schema() -> Any:
            return {"params": [p.to_json() for p in self.engine.schema().values()], "ranks": self.engine.ranks()}

        @app.post("/v1/weights")
        async def weights_reload(request: Request) -> Any:
            body = await body_of(request)
            return await call(lambda: self.reload(body))

        @app.post("/v1/weights/group")
        async def weights_join(request: Request) -> Any:
            body = await body_of(request)
            return await call(lambda: self.join(body), 202)

        @app.delete("/v1/weights/group")
        async def weights_leave() -> Any:
            return await call(self.leave)

        @app.post("/v1/weights/update")
        async def weights_update(request: Request) -> Any:
            body = await body_of(request)
            return await call(lambda: self.update(body), 202)


class _Busy(RuntimeError):
    """HTTP 409: the engine is not in a state to take this operation."""


def _version(body: dict[str, Any]) -> int:
    v = body.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WeightSyncError(f"'version' must be a non-negative integer, got {v!r}")
    return v
