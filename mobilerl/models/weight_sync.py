"""Trainer → rollout-engine weight sync: one protocol over HTTP, two transports.

The trainer calls ``sync.push(model, version)``; afterwards every engine serves exactly the trainer's weights
and reports ``version`` (``GET /v1/weights``), and every completion it returns carries the version it was
sampled with (``policy_version``), so each trajectory records the policy that produced it.

- **reload** (:class:`ReloadSync`): the trainer writes one safetensors file (atomically: a temporary file, then
  ``os.replace``) and POSTs ``{path, version}`` to each engine's ``/v1/weights``; the engine checks the file's
  names and shapes, loads it, swaps it in and answers with its new version. Needs a filesystem the engines
  share with the trainer (many hosts: a shared volume).
- **broadcast** (:class:`BroadcastSync`, the scheme of TRL's vLLM client): engines join a ``torch.distributed``
  group with the trainer (rank 0; ``POST /v1/weights/group``); a push POSTs the names, dtypes and shapes to
  ``/v1/weights/update`` and then broadcasts one tensor per parameter; NCCL between GPUs, gloo on CPU (the
  same code: the tests run it here). No disk, no shared filesystem.

Both transports send every tensor of the model (tied weights once) in the dtype the engine holds. A push is
checked twice before a byte moves: against the engines' schema (``GET /v1/weights/schema``) by the trainer,
and by each engine; an unknown name, a missing one or a wrong shape is a clear error naming it, and the engine
keeps serving its old weights. Generation pauses only while new weights are swapped in (requests in flight
finish first), so each completion is sampled by one version, the one it reports; an HF engine receives into
fresh buffers, so a transfer that breaks off leaves its weights as they were (vLLM: version -1 until the next
push, :mod:`mobilerl.models.vllm_weights`).

This module holds the wire format, the process group and the trainer's side; the engine's endpoints are
:mod:`mobilerl.models.weight_server` (the HF backend's model in process, or vLLM's workers through
:mod:`mobilerl.models.vllm_weights`).

    python -m mobilerl.models.serve_openai models/tiny-base --port 8001 --weight-sync      # an engine
    with make_weight_sync("broadcast", ["http://127.0.0.1:8001/v1"]) as sync:               # the trainer
        sync.push(model, version=1)
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

Transport = Literal["reload", "broadcast"]
DTYPES = ("float32", "bfloat16", "float16")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class WeightSyncError(ValueError):
    """A push the engines refuse (unknown / missing parameter, wrong shape, no group) or that failed."""


@dataclass(frozen=True)
class ParamMeta:
    """One tensor of a push: its name in the trainer's ``state_dict``, dtype name (``float32``...) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> ParamMeta:
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise WeightSyncError(f"{where} must be an object with a string 'name'")
        shape = d.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise WeightSyncError(f"{where} ({d['name']}): 'shape' must be a list of non-negative integers")
        return cls(d["name"], str(d.get("dtype")), tuple(shape))


Schema = dict[str, ParamMeta]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's ``state_dict`` with each tensor once: a tied weight (the tiny model's ``lm_head`` is its
    embedding) keeps its first name, the one a Hugging Face checkpoint stores. Tensors share storage with the
    model; works on ``meta`` models too (ties are found by object, not address)."""
    seen: set[int] = set()
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, t.detach()))
    return out


def model_schema(model: torch.nn.Module) -> Schema:
    return {n: ParamMeta(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in named_tensors(model)}


def check_params(schema: Schema, params: Sequence[ParamMeta]) -> None:
    """Raise :class:`WeightSyncError` unless ``params`` name every tensor of ``schema`` once, with its shape and
    a floating dtype (the engine converts to its own)."""
    errors: list[str] = []
    names = [p.name for p in params]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        errors.append(f"parameter(s) sent twice: {dup[:5]}")
    unknown = sorted(set(names) - set(schema))
    if unknown:
        errors.append(f"unknown parameter(s) {unknown[:5]}{' ...' if len(unknown) > 5 else ''} "
                      f"(not in the engine's model)")
    missing = sorted(set(schema) - set(names))
    if missing:
        errors.append(f"missing parameter(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                      f"(a push carries every tensor)")
    for p in params:
        want = schema.get(p.name)
        if want is not None and p.shape != want.shape:
            errors.append(f"{p.name}: shape {list(p.shape)}, the engine's is {list(want.shape)}")
        if p.dtype not in DTYPES:
            errors.append(f"{p.name}: dtype {p.dtype!r} is not one of {DTYPES}")
    if errors:
        raise WeightSyncError("; ".join(errors[:8]) + (f"; ... ({len(errors)} problems)" if len(errors) > 8 else ""))


def file_params(path: str | Path) -> list[ParamMeta]:
    """The names, dtypes and shapes in a safetensors file's header (no tensor is read)."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise WeightSyncError(f"weights file {p} not found on the engine (the reload transport needs a "
                              f"filesystem the trainer and the engines share)")
    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            out = []
            for k in f.keys():
                s = f.get_slice(k)
                out.append(ParamMeta(k, _SAFETENSORS_DTYPES.get(s.get_dtype(), s.get_dtype()), tuple(s.get_shape())))
            return out
    except WeightSyncError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt header is the client's error
        raise WeightSyncError(f"{p}: not a readable safetensors file ({type(e).__name__}: {e})") from None


# ------------------------------------------------------------------------------------ process group


@dataclass(frozen=True)
class GroupInfo:
    """Where and how an engine joins the trainer's group (the trainer is rank 0 and hosts the store)."""

    host: str
    port: int
    prefix: str  # a fresh key space per group: a reconnect never reads an earlier group's keys
    world_size: int
    rank: int  # this engine's first rank (an engine with several workers takes rank .. rank + ranks - 1)
    backend: Literal["gloo", "nccl"]
    timeout_s: float

    @classmethod
    def from_json(cls, d: Any) -> GroupInfo:
        if not isinstance(d, dict):
            raise WeightSyncError("the group request must be a JSON object")
        try:
            info = cls(str(d["host"]), int(d["port"]), str(d["prefix"]), int(d["world_size"]), int(d["rank"]),
                       d.get("backend", "gloo"), float(d.get("timeout_s", 600)))
        except (KeyError, TypeError, ValueError) as e:
            raise WeightSyncError(f"group request: bad or missing field ({type(e).__name__}: {e}); expected "
                                  f"host, port, prefix, world_size, rank, backend, timeout_s") from None
        if info.backend not in ("gloo", "nccl"):
            raise WeightSyncError(f"group request: backend must be 'gloo' or 'nccl', got {info.backend!r}")
        if not 1 <= info.rank < info.world_size:
            raise WeightSyncError(f"group request: rank {info.rank} outside 1..{info.world_size - 1}")
        return info

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "prefix": self.prefix, "world_size": self.world_size,
                "rank": self.rank, "backend": self.backend, "timeout_s": self.timeout_s}


class Group:
    """A process group outside ``torch.distributed``'s global state (the way vLLM's stateless groups are
    built), so an engine or trainer can hold one beside its own distributed setup, and tests can run both ends
    in one process. Only ``broadcast`` from rank 0 is used."""

    def __init__(self, store: Any, rank: int, world_size: int, backend: str, timeout_s: float,
                 device: torch.device) -> None:
        self.rank, self.world_size, self.backend, self.device = rank, world_size, backend, device
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "gloo":
            from torch.distributed import ProcessGroupGloo

            self.pg = ProcessGroupGloo(store, rank, world_size, timeout)
        elif backend == "nccl":
            from torch.distributed import ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = ProcessGroupNCCL(store, rank, world_size, opts)
        else:
            raise WeightSyncError(f"unknown group backend {backend!r}")
        self._store: Any = None  # an engine's client connection to the store, kept alive with the group

    @classmethod
    def join(cls, info: GroupInfo, rank: int, device: torch.device | None = None) -> Group:
        """Join as ``rank`` (an engine); blocks until every member has joined (or ``info.timeout_s``)."""
        from torch.distributed import PrefixStore, TCPStore

        store = TCPStore(info.host, info.port, info.world_size, is_master=False,
                         timeout=datetime.timedelta(seconds=info.timeout_s))
        dev = device if device is not None else torch.device("cpu")
        g = cls(PrefixStore(info.prefix, store), rank, info.world_size, info.backend, info.timeout_s, dev)
        g._store = store
        return g

    def broadcast(self, t: torch.Tensor) -> None:
        """``t`` from rank 0 to every rank, in place."""
        from torch.distributed import BroadcastOptions

        if self.pg is None:
            raise WeightSyncError("the weight-sync group is closed")
        opts = BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def close(self) -> None:
        """Drop the connections: a peer blocked in a collective with this rank fails instead of waiting out its
        timeout."""
        self.pg = None
        self._store = None


# -------------------------------------------------------------------------------------- trainer side


def on_wire(meta: ParamMeta, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` as sent: ``meta``'s dtype, on ``device``, contiguous (no copy when it already is)."""
    return t.to(device=device, dtype=getattr(torch, meta.dtype)).contiguous()


def engine_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> ``.../v1`` (as :class:`~mobilerl.models.openai_backend.OpenAIBackend`)."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class WeightSync:
    """Pushes a model's weights to rollout engines: ``push(model, version)``; see the module docstring.

    Args:
        urls: the engines' API roots (``http://host:port/v1``).
        api_key: the engines' Bearer token (``MOBILERL_API_KEY`` of ``serve_openai``), if they need one.
        timeout_s: seconds for an engine to answer (a load, a transfer).
    """

    transport: Transport

    def __init__(self, urls: Sequence[str], *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        if not urls:
            raise WeightSyncError("weight sync needs at least one engine URL")
        self.urls = [engine_url(u) for u in urls]
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s))
        self._pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="mobilerl-weight-sync")
        self.schema: Schema | None = None
        self.ranks: list[int] = []

    # ---------------------------------------------------------------------------------- HTTP

    def _call(self, method: str, url: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        import httpx

        try:
            r = self._http.request(method, url + path, json=body)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"{method} {url}{path}: {type(e).__name__}: {e}") from None
        if r.status_code not in ok:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:300]
            raise WeightSyncError(f"{url}: {method} {path} -> HTTP {r.status_code}: {msg}")
        return r.json()

    def _each(self, fn: Callable[[str], Any]) -> list[Any]:
        """``fn(url)`` for every engine at once; the first error raises after all have answered."""
        futures = [self._pool.submit(fn, u) for u in self.urls]
        results, errors = [], []
        for f in futures:
            try:
                results.append(f.result())
            except WeightSyncError as e:
                errors.append(str(e))
        if errors:
            raise WeightSyncError("; ".join(errors))
        return results

    def states(self, wait: bool = True) -> list[dict[str, Any]]:
        """Every engine's ``GET /v1/weights`` (after any update in progress when ``wait``)."""
        return self._each(lambda u: self._call("GET", u, "/weights" + ("?wait=true" if wait else "")))

    def versions(self) -> list[int]:
        return [s["version"] for s in self.states()]

    def connect(self) -> None:
        """Read the engines' schemas (they must serve the same model)."""
        answers = self._each(lambda u: self._call("GET", u, "/weights/schema"))
        schemas = [{d["name"]: ParamMeta.from_json(d, "schema") for d in a["params"]} for a in answers]
        for u, s in zip(self.urls[1:], schemas[1:], strict=True):
            if s != schemas[0]:
                raise WeightSyncError(f"engines serve different models: {u} and {self.urls[0]} differ in "
                                      f"{sorted(set(s.items()) ^ set(schemas[0].items()))[:3]}")
        self.schema = schemas[0]
        self.ranks = [int(a["ranks"]) for a in answers]

    def wire(self, model: torch.nn.Module) -> list[tuple[ParamMeta, torch.Tensor]]:
        """The model's tensors with what is sent for each (the engines' dtype), checked against the engines'
        schema. The tensors are the model's own: :func:`on_wire` converts one at a time, so a push never holds
        a second copy of the model."""
        if self.schema is None:
            self.connect()
        assert self.schema is not None
        out = []
        for name, t in named_tensors(model):
            want = self.schema.get(name)
            dtype = getattr(torch, want.dtype) if want is not None and want.dtype in DTYPES else t.dtype
            out.append((ParamMeta(name, dtype_name(dtype), tuple(t.shape)), t))
        check_params(self.schema, [m for m, _ in out])
        return out

    def _confirm(self, version: int) -> None:
        for u, s in zip(self.urls, self.states(), strict=True):
            if s["version"] != version:
                raise WeightSyncError(f"{u} reports version {s['version']} after the push of {version}: "
                                      f"{s.get('error') or s.get('status')}")

    def push(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        """Every engine serves ``model``'s weights as ``version`` when this returns; returns timings
        (``sync/*`` seconds and bytes)."""
        raise NotImplementedError

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReloadSync(WeightSync):
    """Checkpoint reload: one safetensors file in ``directory`` (which the engines must see at the same path),
    written atomically, then ``POST /v1/weights {path, version}`` to every engine."""

    transport: Transport = "reload"

    def __init__(self, urls: Sequence[str], directory: str | Path, **kwargs: Any) -> None:
        super().__init__(urls, **kwargs)
        self.directory = Path(directory).resolve()

    def push(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        path = self.write(model, version)
        t1 = time.perf_counter()
        self.load(path, version)
        return {"sync/write_s": t1 - t0, "sync/load_s": time.perf_counter() - t1, "sync/s": time.perf_counter() - t0,
                "sync/bytes": float(path.stat().st_size)}

    def write(self, model: torch.nn.Module, version: int) -> Path:
        """The push's file: ``model``'s tensors as the engines hold them, written atomically; returns its path
        (several engines' syncs over one directory can all :meth:`load` one file)."""
        from safetensors.torch import save_file

        cpu = torch.device("cpu")
        tensors = {m.name: on_wire(m, t, cpu) for m, t in self.wire(model)}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "policy.safetensors"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file(tensors, str(tmp), metadata={"version": str(version)})
        os.replace(tmp, path)  # an engine never opens a half-written file
        return path

    def load(self, path: str | Path, version: int) -> None:
        """Every engine loads ``path`` (written by :meth:`write`) as ``version``, confirmed."""
        self._each(lambda u: self._call("POST", u, "/weights", {"path": str(path), "version": version}))
        self._confirm(version)


class BroadcastSync(WeightSync):
    """Per-parameter broadcast over a group the engines join (``connect``): the trainer is rank 0 and hosts the
    group's store at ``address`` (``host:port``, reachable from the engines; port 0 picks a free one).
    ``backend``: ``nccl`` (the model on CUDA) or ``gloo`` (CPU tensors; default for a CPU model). A multi-host
    gloo group picks its network interface from ``GLOO_SOCKET_IFNAME``."""

    transport: Transport = "broadcast"

    def __init__(self, urls: Sequence[str], address: str = "127.0.0.1:0", backend: str | None = None,
                 group_timeout_s: float = 600.0, **kwargs: Any) -> None:
        super().__init__(urls, **kwargs)
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise WeightSyncError(f"weight sync address must be host:port, got {address!r}")
        self.host, self.port = host, int(port)
        self.backend = backend
        self.group_timeout_s = group_timeout_s
        self.group: Group | None = None
        self._store: Any = None
        self._formed_for = ""  # the device type of the model the group was formed for

    def connect(self, device: torch.device | None = None) -> None:
        """Schemas, then every engine joins a fresh group with this trainer (blocks until all have joined);
        ``device``: where the trainer's tensors are (CUDA: an NCCL group unless ``backend`` says otherwise)."""
        from torch.distributed import PrefixStore, TCPStore

        super().connect()
        self.disconnect()
        model_device = device or torch.device("cpu")
        backend = self.backend or ("nccl" if model_device.type == "cuda" else "gloo")
        world = 1 + sum(self.ranks)
        timeout = datetime.timedelta(seconds=self.group_timeout_s)
        store = TCPStore(self.host, self.port, world, is_master=True, timeout=timeout, wait_for_workers=False)
        prefix = f"mobilerl-weights-{uuid.uuid4().hex}"
        offsets = [1 + sum(self.ranks[:i]) for i in range(len(self.urls))]
        for u, rank in zip(self.urls, offsets, strict=True):
            info = GroupInfo(self.host, store.port, prefix, world, rank, backend, self.group_timeout_s)  # type: ignore[arg-type]
            self._call("POST", u, "/weights/group", info.to_json(), ok=(202,))
        device = model_device if backend == "nccl" else torch.device("cpu")  # gloo sends CPU tensors
        try:
            self.group = Group(PrefixStore(prefix, store), 0, world, backend, self.group_timeout_s, device)
        except Exception as e:  # noqa: BLE001 - name the engines' side of it
            raise WeightSyncError(f"the weight-sync group did not form ({type(e).__name__}: {e}); engines: "
                                  f"{[s.get('error') for s in self.states(wait=False)]}") from None
        self._store, self._formed_for = store, model_device.type
        for u, s in zip(self.urls, self.states(), strict=True):
            if s["group"] is None:
                raise WeightSyncError(f"{u} did not join the weight-sync group: {s.get('error')}")

    def disconnect(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
            with contextlib.suppress(WeightSyncError):
                self._each(lambda u: self._call("DELETE", u, "/weights/group"))
        self._store = None

    def push(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        device = next(model.parameters()).device
        if self.group is None or self._formed_for != device.type:
            self.connect(device)
        group = self.group
        assert group is not None
        tensors = self.wire(model)  # checked against the engines' schema before anything is sent
        body = {"version": version, "params": [m.to_json() for m, _ in tensors]}
        try:
            self._each(lambda u: self._call("POST", u, "/weights/update", body, ok=(202,)))
            t1 = time.perf_counter()
            for m, t in tensors:
                group.broadcast(on_wire(m, t, group.device))
            if group.backend == "nccl":
                torch.cuda.synchronize(group.device)
            t2 = time.perf_counter()
            self._confirm(version)
        except Exception as e:
            # an engine that accepted may wait for tensors that will not come: closing the group fails its
            # transfer at once (it keeps its old weights), and the next push forms a new group
            group.close()
            self.group = None
            if isinstance(e, WeightSyncError):
                raise
            raise WeightSyncError(f"broadcast failed after the engines accepted the push: {e}") from e
        return {"sync/send_s": t2 - t1, "sync/load_s": time.perf_counter() - t2, "sync/s": time.perf_counter() - t0,
                "sync/bytes": float(sum(t.numel() * getattr(torch, m.dtype).itemsize for m, t in tensors))}

    def close(self) -> None:
        self.disconnect()
        super().close()


def make_weight_sync(transport: Transport, urls: Sequence[str], *, directory: str | Path | None = None,
                     address: str = "127.0.0.1:0", **kwargs: Any) -> WeightSync:
    """The trainer's side for ``transport`` (``reload`` needs ``directory``)."""
    if transport == "reload":
        if directory is None:
            raise WeightSyncError("the reload transport needs a directory the engines can read")
        return ReloadSync(urls, directory, **kwargs)
    if transport == "broadcast":
        return BroadcastSync(urls, address, **kwargs)
    raise WeightSyncError(f"weight sync transport must be 'reload' or 'broadcast', got {transport!r}")
