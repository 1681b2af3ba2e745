"""Generation over HTTP from any OpenAI-compatible server (vLLM, SGLang, :mod:`mobilerl.models.serve_openai`).

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", api_key=os.environ.get("MOBILERL_API_KEY"))

``generate`` posts one ``/v1/chat/completions`` per request, concurrently, with ``logprobs: true``. Token ids
and ``score`` (three ``prompt_logprobs`` requests, checked to tokenize as prefixes of each other; T = 1 only)
need vLLM's extensions: set ``vllm_extensions=False`` for other servers. vLLM returns this project's
logprobs only with ``--logprobs-mode processed_logprobs`` and ``top_p = 1``. Connection errors, timeouts,
429 and 5xx are retried with backoff, then raise :class:`~mobilerl.models.generation.EngineUnavailable` (an
outage: unreachable, 408/429/502/503/504) or :class:`~mobilerl.models.generation.GenerationError` (a 500 that
persists); other failures raise ``GenerationError`` at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Sequence
from typing import Any

import httpx

from mobilerl.models.generation import (
    ChatRequest,
    EngineUnavailable,
    Generation,
    GenerationError,
    SamplingConfig,
    content_parts,
)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
UNAVAILABLE_STATUS = RETRY_STATUS - {500}  # a 500 that persists is the engine's bug, not an outage


def image_data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def openai_messages(request: ChatRequest, extra: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Messages in OpenAI form: text-only content stays a string; with images, a list of ``text`` and
    ``image_url`` (base64 PNG data URL) parts, the images taking their placeholders' places."""
    images = iter(request.images or [])
    out = []
    for m in [*request.messages, *extra]:
        parts = content_parts(m["content"])
        if all(p["type"] == "text" for p in parts):
            content: Any = "".join(p["text"] for p in parts)
        else:
            content = [
                {"type": "text", "text": p["text"]}
                if p["type"] == "text"
                else {"type": "image_url", "image_url": {"url": image_data_url(next(images))}}
                for p in parts
            ]
        out.append({**m, "content": content})
    return out


def _snippet(obj: Any, n: int = 300) -> str:
    s = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    return s if len(s) <= n else s[:n] + "..."


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:") :])
        except ValueError:
            return None
    return None


def parse_chat_completion(body: Any) -> Generation:
    """The first choice of a chat-completion response -> :class:`Generation`; clear errors when malformed."""
    if not isinstance(body, dict):
        raise GenerationError(f"malformed chat completion (not a JSON object): {_snippet(body)}")
    if "error" in body and "choices" not in body:
        raise GenerationError(f"server error: {_snippet(body['error'])}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GenerationError(f"malformed chat completion (no choices): {_snippet(body)}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise GenerationError(f"malformed chat completion (choices[0].message missing): {_snippet(body)}")
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise GenerationError(f"malformed chat completion (message.content is not a string): {_snippet(body)}")
    # A server run with a reasoning parser (vLLM --reasoning-parser) returns the thought apart from the answer
    # ("reasoning_content"; "reasoning" in newer vLLM): put it back in the response format's <think> block.
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought.strip() and "<think>" not in text:
        text = f"<think>{thought.strip()}</think>{text.lstrip()}"
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise GenerationError(f"unexpected finish_reason {reason!r} (expected 'stop' or 'length'): {_snippet(body)}")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list):
        raise GenerationError(
            f"the response has no choices[0].logprobs.content (does the server support logprobs?): {_snippet(body)}"
        )
    logprobs, ids = [], []
    for i, entry in enumerate(content):
        v = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise GenerationError(f"malformed logprobs.content[{i}] (no numeric 'logprob'): {_snippet(entry)}")
        logprobs.append(float(v))
        ids.append(_token_id(entry.get("token")))
    token_ids = [int(t) for t in ids] if ids and all(t is not None for t in ids) else []
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    version = body.get("policy_version")  # a weight-syncing rollout engine's (mobilerl.models.weight_server)
    return Generation(text, token_ids, logprobs, reason, int(usage.get("prompt_tokens") or 0),
                      None if version is None else str(version))


def parse_prompt_logprobs(body: Any) -> tuple[list[int | None], list[float | None]]:
    """vLLM's top-level ``prompt_logprobs`` (``[null, {"<id>": {"logprob": x, ...}}, ...]``) -> (ids, logprobs)."""
    pl = body.get("prompt_logprobs") if isinstance(body, dict) else None
    if not isinstance(pl, list) or not pl:
        raise GenerationError(
            "the response has no prompt_logprobs (score needs vLLM's prompt_logprobs extension): " + _snippet(body)
        )
    ids: list[int | None] = []
    lps: list[float | None] = []
    for i, entry in enumerate(pl):
        if entry is None:
            ids.append(None)
            lps.append(None)
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            raise GenerationError(
                f"prompt_logprobs[{i}] must hold exactly the prompt token (request prompt_logprobs=0): {_snippet(entry)}"
            )
        (key, val), = entry.items()
        tid = _token_id(key)
        try:
            tid = int(key) if tid is None else tid
            v = float(val["logprob"])
        except (TypeError, ValueError, KeyError):
            raise GenerationError(f"malformed prompt_logprobs[{i}]: {_snippet(entry)}") from None
        ids.append(tid)
        lps.append(v)
    return ids, lps


class OpenAIBackend:
    """:class:`~mobilerl.models.generation.GenerationBackend` over an OpenAI-compatible HTTP server.

    Args:
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1`` (``/v1`` is added if missing).
        model: served model name (default: the first of ``GET /v1/models``, looked up once).
        api_key: sent as ``Authorization: Bearer``; None sends none.
        timeout: seconds per HTTP request (connect and read).
        max_retries: extra attempts after a connection error, timeout, 429 or 5xx.
        backoff_s: first retry delay (doubles each retry).
        max_concurrency: requests in flight at once from this client.
        vllm_extensions: send vLLM's ``return_tokens_as_token_ids`` (token ids) and allow :meth:`score`.
        transport: an httpx transport (tests: ``httpx.MockTransport`` / ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
        vllm_extensions: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        name: str | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model, self.api_key, self.timeout = model, api_key, timeout
        self.max_retries, self.backoff_s, self.max_concurrency = max_retries, backoff_s, max_concurrency
        self.vllm_extensions, self.transport = vllm_extensions, transport
        self.name = name or model or "openai"
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._model_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------------------------ HTTP

    def _http(self) -> httpx.AsyncClient:
        """One client per event loop (a pooled connection belongs to the loop that opened it)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=httpx.Timeout(self.timeout), transport=self.transport
            )
            self._loop, self._sem, self._model_lock = loop, asyncio.Semaphore(self.max_concurrency), asyncio.Lock()
        return self._client

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        client = self._http()
        assert self._sem is not None
        url = f"{self.base_url}{path}"
        last, unavailable = "", True
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with self._sem:
                    r = await client.request(method, path, json=payload)
            except httpx.TransportError as e:  # connection refused/reset, timeouts
                last, unavailable = f"{type(e).__name__}: {e}", True
                continue
            if r.status_code in RETRY_STATUS:
                last, unavailable = f"HTTP {r.status_code}: {_snippet(r.text)}", r.status_code in UNAVAILABLE_STATUS
                continue
            if r.status_code >= 400:
                raise GenerationError(f"{method} {url} -> HTTP {r.status_code}: {_snippet(r.text)}")
            try:
                return r.json()
            except ValueError:
                raise GenerationError(f"{method} {url} returned non-JSON: {_snippet(r.text)}") from None
        error = EngineUnavailable if unavailable else GenerationError
        raise error(f"{method} {url} failed after {self.max_retries + 1} attempts; last error: {last}")

    async def model_name(self) -> str:
        if self.model is None:
            self._http()
            assert self._model_lock is not None
            async with self._model_lock:
                if self.model is None:
                    body = await self._request("GET", "/models")
                    try:
                        self.model = str(body["data"][0]["id"])
                    except (KeyError, IndexError, TypeError):
                        raise GenerationError(f"GET {self.base_url}/models: no model listed: {_snippet(body)}") from None
        return self.model

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    # ------------------------------------------------------------------------------- protocol

    def _payload(self, model: str, request: ChatRequest, sampling: SamplingConfig, seed: int | None) -> dict[str, Any]:
        p: dict[str, Any] = {
            "model": model,
            "messages": openai_messages(request),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": True,
            "top_logprobs": 0,
        }
        if seed is not None:
            p["seed"] = seed
        if sampling.stop:
            p["stop"] = list(sampling.stop)
        if self.vllm_extensions:
            p["return_tokens_as_token_ids"] = True
        if not request.add_generation_prompt or request.continue_final_message:
            p["add_generation_prompt"] = request.add_generation_prompt
            p["continue_final_message"] = request.continue_final_message
        return p

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        model = await self.model_name()

        async def one(i: int, r: ChatRequest) -> Generation:
            args = (model, r, sampling, sampling.request_seed(i))
            # PNG-encoding a screenshot takes tens of ms: not on the event loop.
            payload = await asyncio.to_thread(self._payload, *args) if r.images else self._payload(*args)
            return parse_chat_completion(await self._request("POST", "/chat/completions", payload))

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))

    async def score(
        self, request: ChatRequest, completion: str | Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        if not isinstance(completion, str):
            raise TypeError(
                "OpenAIBackend.score takes the completion text (the server tokenizes it); token ids cannot be "
                "sent through the chat API"
            )
        if temperature != 1.0:
            raise ValueError("OpenAIBackend.score: servers return prompt logprobs at temperature 1 only")
        if not self.vllm_extensions:
            raise GenerationError("score needs vLLM's prompt_logprobs extensions (vllm_extensions=False)")
        model = await self.model_name()
        turn = [{"role": "assistant", "content": completion}]
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)

        def payload(extra: list, add_generation_prompt: bool, continue_final: bool) -> dict[str, Any]:
            r = ChatRequest(
                [*request.messages, *extra],
                request.images,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final,
            )
            p = self._payload(model, r, greedy, None)
            p.update(prompt_logprobs=0, logprobs=False, add_generation_prompt=add_generation_prompt,
                     continue_final_message=continue_final)
            p.pop("top_logprobs")  # vLLM refuses top_logprobs without logprobs
            return p

        payloads = await asyncio.to_thread(
            lambda: [payload([], True, False), payload(turn, False, True), payload(turn, False, False)]
        )
        bodies = await asyncio.gather(*(self._request("POST", "/chat/completions", p) for p in payloads))
        (ids_a, _), (ids_b, lps_b), (ids_c, lps_c) = (parse_prompt_logprobs(b) for b in bodies)
        p, q = len(ids_a), len(ids_b)
        if ids_b[:p] != ids_a or ids_c[:q] != ids_b or len(ids_c) <= q:
            raise GenerationError(
                "score: the prompt tokens do not line up (the tokenizer merges tokens across the assistant "
                f"header / completion / end-of-turn boundary); lengths {p}, {q}, {len(ids_c)}"
            )
        out = [*lps_b[p:], lps_c[q]]
        if any(v is None for v in out):
            raise GenerationError("score: the server left prompt logprobs of completion tokens empty")
        return [float(v) for v in out]  # type: ignore[arg-type]
