"""A small OpenAI-compatible server in front of any :class:`~mobilerl.models.generation.GenerationBackend`:
the embedded default's rollout server (the HF backend on the tiny model), speaking the dialect that
:class:`~mobilerl.models.openai_backend.OpenAIBackend` speaks to vLLM.

    python -m mobilerl.models.serve_openai models/tiny-base --port 8000     # 127.0.0.1 only by default
    MOBILERL_API_KEY=... python -m mobilerl.models.serve_openai ...          # then a Bearer token is required

Endpoints: ``GET /health`` (with the HF backend: ``busy_s``, the seconds its model has run batches, and its
``batches`` and ``requests`` so far), ``GET /v1/models``, ``POST /v1/chat/completions`` (no streaming, no tools);
with ``--weight-sync``, the RL rollout engine's weight endpoints (:mod:`mobilerl.models.weight_server`), and every
completion carries ``policy_version``, the version of the weights that sampled it.
Request fields: ``messages`` (string content, or parts ``text`` / ``image_url`` with a ``data:`` URL; remote
URLs are refused: nothing is fetched), ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``seed``, ``stop``, ``n``, ``logprobs``, ``top_logprobs`` (0 only), and vLLM's
extensions ``prompt_logprobs`` (only the prompt token's own logprob is returned, whatever k),
``add_generation_prompt``, ``continue_final_message``, ``return_tokens_as_token_ids``. Logprobs follow
:mod:`mobilerl.models.logprobs` (``log_softmax(logits / T)``); prompt logprobs are at T = 1, like vLLM's.
Choice ``i`` of a request with ``n > 1`` uses seed ``seed + i``. Concurrent requests reach the backend
concurrently, so the HF backend's micro-batcher batches them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import io
import logging
import math
import os
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image

from mobilerl.models.generation import (
    IMAGE_PLACEHOLDER,
    ChatRequest,
    GenerationBackend,
    SamplingConfig,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
API_KEY_ENV = "MOBILERL_API_KEY"


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400 with an OpenAI-style error body)."""


def decode_image_url(url: str) -> Image.Image:
    """A ``data:image/...;base64,...`` URL -> RGB image. Other URLs are refused (the server fetches nothing)."""
    if not url.startswith("data:"):
        raise BadRequest("only data: image URLs are accepted (base64 PNG/JPEG); the server fetches nothing")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise BadRequest("image data URLs must be base64-encoded")
    try:
        return Image.open(io.BytesIO(base64.b64decode(payload, validate=True))).convert("RGB")
    except (binascii.Error, OSError, ValueError) as e:
        raise BadRequest(f"undecodable image data URL: {e}") from None


def parse_messages(messages: Any) -> tuple[list[dict[str, Any]], list[Image.Image]]:
    """OpenAI chat messages -> (messages with ``<image>`` placeholders, images in order)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    out, images = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            text = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    text.append(part["text"])
                elif kind == "image_url":
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    if not isinstance(url, str):
                        raise BadRequest(f"messages[{i}].content[{j}].image_url must hold a 'url' string")
                    images.append(decode_image_url(url))
                    text.append(IMAGE_PLACEHOLDER)
                else:
                    raise BadRequest(f"messages[{i}].content[{j}]: only 'text' and 'image_url' parts are supported")
            content = "".join(text)
        elif not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        out.append({"role": m["role"], "content": content})
    return out, images


def _finite(v: float) -> float:
    """JSON has no -inf: vLLM's convention is -9999.0."""
    return v if math.isfinite(v) else -9999.0


def _number(body: dict[str, Any], key: str, default: Any, kind: type = float) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not isinstance(v, int)):
        raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return kind(v)


def parse_body(body: Any) -> tuple[ChatRequest, SamplingConfig, dict[str, Any]]:
    """The chat-completions body -> (request, sampling, options). Raises :class:`BadRequest`."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("streaming is not supported")
    if body.get("tools"):
        raise BadRequest("tools are not supported")
    messages, images = parse_messages(body.get("messages"))
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    top_logprobs = _number(body, "top_logprobs", 0, int)
    if top_logprobs:
        raise BadRequest("top_logprobs > 0 is not supported (only the sampled token's logprob is returned)")
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None and (isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int)):
        raise BadRequest("'prompt_logprobs' must be an integer")
    n = _number(body, "n", 1, int)
    if not 1 <= n <= 64:
        raise BadRequest(f"'n' must be in [1, 64], got {n}")
    try:
        request = ChatRequest(
            messages,
            images or None,
            add_generation_prompt=bool(body.get("add_generation_prompt", True))
            and not body.get("continue_final_message", False),
            continue_final_message=bool(body.get("continue_final_message", False)),
        )
        sampling = SamplingConfig(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            max_new_tokens=_number(body, max_key, DEFAULT_MAX_TOKENS, int),
            seed=_number(body, "seed", None, int),
            stop=tuple(stop),
        )
    except (ValueError, TypeError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(str(e)) from None
    options = {
        "n": n,
        "logprobs": bool(body.get("logprobs", False)),
        "prompt_logprobs": prompt_logprobs,
        "token_ids": bool(body.get("return_tokens_as_token_ids", False)),
        "model": body.get("model"),
    }
    return request, sampling, options


def create_app(backend: GenerationBackend, *, model_name: str = "mobilerl", api_key: str | None = None,
               weights: Any = None) -> FastAPI:
    """The FastAPI app serving ``backend`` as model ``model_name`` (``api_key``: require this Bearer token;
    ``weights``: a :class:`mobilerl.models.weight_server.WeightServer` over the backend's weights, which adds its
    endpoints and the ``policy_version`` of each completion)."""
    app = FastAPI(title="mobilerl OpenAI-compatible server", docs_url=None, redoc_url=None)
    token_text = getattr(backend, "token_text", None)
    if weights is not None:
        weights.mount(app)

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong API key", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = getattr(backend, "stats", None)  # the HF backend's micro-batcher: how busy its model has been
        if stats is None:
            return {"status": "ok"}
        return {"status": "ok", "busy_s": stats.busy_s, "batches": stats.batches, "requests": stats.items}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "mobilerl"}]}

    def token_str(tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids or token_text is None else token_text(tid)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the request body is not valid JSON")
        try:  # decoding images takes a while: not on the event loop
            chat_request, sampling, opt = await asyncio.to_thread(parse_body, body)
        except BadRequest as e:
            return error(400, str(e))
        if opt["model"] not in (None, model_name):
            return error(404, f"The model `{opt['model']}` does not exist (this server serves `{model_name}`)",
                         "NotFoundError")
        want_prompt = opt["prompt_logprobs"] is not None
        if want_prompt and not hasattr(backend, "prompt_logprobs"):
            return error(400, f"prompt_logprobs is not supported by the {type(backend).__name__} backend")
        try:
            # a weight swap waits for this call and this call for a swap: one version from start to end
            async with weights.serving() if weights is not None else _no_version() as version:
                jobs = [backend.generate([chat_request] * opt["n"], sampling)]
                if want_prompt:
                    jobs.append(backend.prompt_logprobs(chat_request))  # type: ignore[attr-defined]
                results = await asyncio.gather(*jobs)
        except ValueError as e:  # e.g. a prompt the model cannot take
            return error(400, str(e))
        except Exception as e:  # noqa: BLE001 - reported to the client as a server error
            log.exception("generation failed")
            return error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
        gens = results[0]
        choices = []
        for i, g in enumerate(gens):
            lp = None
            if opt["logprobs"]:
                lp = {
                    "content": [
                        {"token": token_str(t, opt["token_ids"]), "logprob": _finite(v), "bytes": None, "top_logprobs": []}
                        for t, v in zip(g.token_ids, g.logprobs, strict=True)
                    ]
                }
            choices.append({
                "index": i,
                "message": {"role": "assistant", "content": g.text},
                "logprobs": lp,
                "finish_reason": g.finish_reason,
                "stop_reason": None,
            })
        prompt_tokens = gens[0].prompt_tokens if gens else 0
        completion_tokens = sum(len(g.token_ids) for g in gens)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "prompt_logprobs": None,
        }
        if version is not None:
            out["policy_version"] = version
        if want_prompt:
            ids, lps = results[1]
            out["prompt_logprobs"] = [
                None if v is None else {str(t): {"logprob": _finite(v), "rank": None, "decoded_token": token_str(t, opt["token_ids"])}}
                for t, v in zip(ids, lps, strict=True)
            ]
        return out

    return app


@contextlib.asynccontextmanager
async def _no_version():
    yield None


class ServerThread:
    """Run the server in a background thread (its own event loop) — tests and in-process rollout servers.

        with ServerThread(backend, port=0) as srv:     # port 0: a free port, see srv.base_url
            client = OpenAIBackend(srv.base_url)
    """

    def __init__(
        self,
        backend: GenerationBackend,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "mobilerl",
        api_key: str | None = None,
        weights: Any = None,
    ) -> None:
        import uvicorn

        app = create_app(backend, model_name=model_name, api_key=api_key, weights=weights)
        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(self.config)
        self._thread = threading.Thread(target=self.server.run, name="mobilerl-serve-openai", daemon=True)

    @property
    def base_url(self) -> str:
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the OpenAI-compatible server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", help="model directory (a tiny checkpoint or a transformers image-text-to-text model)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default=None, help="served model name (default: the directory name)")
    ap.add_argument("--max-batch", type=int, default=None, help="micro-batch size (default: HF 16, vLLM 256)")
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                    help="generation backend: the HF backend (CPU/GPU) or vLLM (GPU, the gpu extra)")
    ap.add_argument("--dtype", default=None, help="fp32 / bf16 / fp16 / auto (default: the backend's)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM: share of GPU memory")
    ap.add_argument("--max-model-len", type=int, default=None, help="vLLM: context length")
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM: no CUDA graphs (starts faster)")
    ap.add_argument("--weight-sync", action="store_true",
                    help="an RL rollout engine: accept weight pushes (/v1/weights...), report policy_version")
    args = ap.parse_args(argv)

    import uvicorn

    weights = None
    if args.engine == "vllm":
        from mobilerl.models.vllm_backend import VLLMBackend

        extra: dict[str, Any] = {"enforce_eager": True} if args.enforce_eager else {}
        if args.weight_sync:
            from mobilerl.models.vllm_weights import WORKER_EXTENSION

            extra["worker_extension_cls"] = WORKER_EXTENSION
        backend: Any = VLLMBackend(args.model, dtype=args.dtype or "auto", max_batch=args.max_batch or 256,
                                   gpu_memory_utilization=args.gpu_memory_utilization,
                                   max_model_len=args.max_model_len, engine_kwargs=extra)
        if args.weight_sync:
            from mobilerl.models.vllm_weights import VLLMEngineWeights
            from mobilerl.models.weight_server import WeightServer

            weights = WeightServer(VLLMEngineWeights(backend, args.model))
    else:
        from mobilerl.models.hf_backend import HFBackend

        backend = HFBackend.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                            max_batch=args.max_batch or 16)
        if args.weight_sync:
            from mobilerl.models.weight_server import TorchEngineWeights, WeightServer

            weights = WeightServer(TorchEngineWeights(backend))
    api_key = os.environ.get(API_KEY_ENV) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("serving on %s without an API key (set %s)", args.host, API_KEY_ENV)
    name = args.name or backend.name
    uvicorn.run(create_app(backend, model_name=name, api_key=api_key, weights=weights), host=args.host,
                port=args.port)


if __name__ == "__main__":
    main()
