"""One interface for every generation backend: chat requests in, text + per-token logprobs out.

``generate([ChatRequest(messages, images)], SamplingConfig(...))`` gives one :class:`Generation` a request,
``score(request, completion)`` teacher-forced logprobs; :func:`mobilerl.models.backends.make_backend` builds
a backend. String content holds one ``<image>`` per entry of ``images``, in order (or content is a list of
``text`` / ``image`` parts). Logprobs are ``log_softmax(logits / T)`` of the chosen token in every backend
(T = temperature, 1 when greedy; no top-p / top-k renormalisation: :mod:`mobilerl.models.logprobs`).
``token_ids`` are all sampled tokens, end-of-turn and stop-string tokens included, one logprob each (empty
only from servers that return no ids); ``text`` is cut before a stop string. Request ``i`` of a call is
sampled with seed ``sampling.seed + i``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
FinishReason = Literal["stop", "length"]


class GenerationError(RuntimeError):
    """A backend could not serve a request (server down, malformed response, engine failure)."""


class EngineUnavailable(GenerationError):
    """A remote engine could not be reached, or answered that it cannot serve now (408/429/502/503/504), after
    the client's retries: the infrastructure failed, not the policy (an episode it cuts short ends with error
    kind ``engine``, :data:`mobilerl.trajectory.ErrorKind`)."""

    error_kind = "engine"  # what the rollout records (mobilerl.agent.rollout reads it off the error)


# ------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ChatRequest:
    """A chat to continue. See the module docstring for the message and image conventions.

    ``add_generation_prompt`` opens an assistant turn after the last message (the usual case);
    ``continue_final_message`` instead continues the final (assistant) message without closing it.
    """

    messages: list[dict[str, Any]]
    images: list[Image.Image] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.messages, list | tuple) or not self.messages:
            raise ValueError("ChatRequest.messages must be a non-empty list of {'role', 'content'} dicts")
        n = 0
        for i, m in enumerate(self.messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"ChatRequest.messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")
            n += sum(p["type"] == "image" for p in content_parts(m["content"]))
        have = len(self.images or [])
        if n != have:
            raise ValueError(f"ChatRequest has {n} image placeholder(s) in its messages but {have} image(s)")
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message are mutually exclusive")

    def parts_messages(self) -> list[dict[str, Any]]:
        """Messages with list-of-parts content (what HF processors' chat templates take)."""
        return [{**m, "content": content_parts(m["content"])} for m in self.messages]


def content_parts(content: Any) -> list[dict[str, Any]]:
    """``"a <image> b"`` -> ``[{type: text, text: "a "}, {type: image}, {type: text, text: " b"}]``; part lists
    are checked and passed through (``{"type": "image", ...}`` extra keys are dropped)."""
    if isinstance(content, str):
        out: list[dict[str, Any]] = []
        for j, piece in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if j:
                out.append({"type": "image"})
            if piece:
                out.append({"type": "text", "text": piece})
        return out
    if isinstance(content, list | tuple):
        out = []
        for p in content:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text" and isinstance(p.get("text"), str):
                out.extend(content_parts(p["text"]) if IMAGE_PLACEHOLDER in p["text"] else [dict(p)])
            elif kind == "image":
                out.append({"type": "image"})
            else:
                raise ValueError(f"unsupported message content part {p!r:.80} (text and image parts only)")
        return out
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def text_content(content: Any) -> str:
    """Content as one string with ``<image>`` placeholders (the inverse of :func:`content_parts`)."""
    return "".join(p["text"] if p["type"] == "text" else IMAGE_PLACEHOLDER for p in content_parts(content))


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


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample. ``temperature=0`` is greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not self.temperature >= 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"sampling.stop must be non-empty strings, got {self.stop!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingConfig:
        unknown = sorted(set(d) - {"temperature", "top_p", "max_new_tokens", "seed", "stop"})
        if unknown:
            raise ValueError(f"unknown sampling key(s) {unknown}; known: temperature, top_p, max_new_tokens, seed, stop")
        return cls(**d)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The T of ``log_softmax(logits / T)`` (1 for greedy decoding)."""
        return self.temperature if self.temperature > 0 else 1.0

    def request_seed(self, i: int) -> int | None:
        return None if self.seed is None else self.seed + i


@dataclass
class Generation:
    """One sampled response. ``logprobs[i]`` belongs to ``token_ids[i]``; ``token_ids`` is empty only when the
    server did not return them (see the module docstring). ``policy_version``: the weights' version an RL
    rollout engine reports it sampled with (:mod:`mobilerl.models.weight_sync`; None elsewhere)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    policy_version: str | None = None

    def __post_init__(self) -> None:
        if self.token_ids and len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


@runtime_checkable
class GenerationBackend(Protocol):
    """What policies and the rollout server talk to. Implementations never block the event loop and are
    safe to call from many coroutines at once (backends with a micro-batcher turn that into batches)."""

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        """One :class:`Generation` per request, in order."""
        ...

    async def score(
        self, request: ChatRequest, completion: str | Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced logprobs ``log_softmax(logits / temperature)`` of the completion's tokens after the
        prompt of ``request``. ``completion`` as token ids is scored exactly (pass ``Generation.token_ids``);
        as text it is scored as a finished assistant turn: its tokens, then the end-of-turn token
        (so ``len(result) == len(tokens(text)) + 1``)."""
        ...


def apply_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


# ------------------------------------------------------------------------------------ batching


@dataclass
class BatcherStats:
    """What the micro-batcher did: ``batches`` calls of the batch function over ``items`` requests."""

    batches: int = 0
    items: int = 0
    max_batch_seen: int = 0
    busy_s: float = 0.0
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> how many batches had it

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class MicroBatcher:
    """Turns concurrent ``await submit(item)`` calls into batched ``fn(items)`` calls in a worker thread.

    A batch starts with the first waiting item, takes whatever else is already queued (requests that arrived
    while the previous batch ran), then waits up to ``wait_s`` for more, up to ``max_batch`` items. Items
    with different ``key(item)`` never share a batch (e.g. different ``max_new_tokens``). ``fn`` runs on
    ``executor`` (one thread: the model is used by one batch at a time), so the event loop never blocks.
    The batcher binds to the running event loop on first use and rebinds when a new loop uses it (each
    ``asyncio.run`` of :func:`mobilerl.eval.runner.evaluate_sync` gets a fresh one).
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], list[Any]],
        executor: Executor,
        *,
        max_batch: int = 16,
        wait_s: float = 0.005,
        key: Callable[[Any], Hashable] = lambda item: None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.fn, self.executor, self.max_batch, self.wait_s, self.key = fn, executor, max_batch, wait_s, key
        self.stats = BatcherStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def _ensure(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._task = loop.create_task(self._run(self._queue), name="mobilerl-microbatcher")
        assert self._queue is not None
        return self._queue

    async def submit(self, item: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._ensure().put_nowait((item, fut))
        return await fut

    async def generate(
        self, requests: Sequence[ChatRequest], sampling: SamplingConfig, rng: random.Random
    ) -> list[Generation]:
        """Submit ``(request, sampling, seed)`` items for a backend's ``generate`` (seed ``sampling.seed + i``,
        or drawn from ``rng`` when unseeded) and gather the results in order."""
        seeds = [sampling.request_seed(i) for i in range(len(requests))]
        seeds = [s if s is not None else rng.getrandbits(63) for s in seeds]
        return list(await asyncio.gather(*(self.submit((r, sampling, s)) for r, s in zip(requests, seeds, strict=True))))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        pending: list[tuple[Any, asyncio.Future]] = []  # taken from the queue, other key than the batch
        while True:
            if not pending:
                pending.append(await queue.get())
            k = self.key(pending[0][0])
            batch = [p for p in pending if self.key(p[0]) == k][: self.max_batch]
            pending = [p for p in pending if not any(p is b for b in batch)]
            deadline = loop.time() + self.wait_s
            while len(batch) < self.max_batch:
                try:
                    nxt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(queue.get(), timeout)
                    except TimeoutError:
                        break
                (batch if self.key(nxt[0]) == k else pending).append(nxt)
            batch = [b for b in batch if not b[1].cancelled()]
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                results = await loop.run_in_executor(self.executor, self.fn, [b[0] for b in batch])
                if len(results) != len(batch):
                    raise GenerationError(f"batch function returned {len(results)} results for {len(batch)} items")
            except asyncio.CancelledError:
                for _, fut in batch + pending:
                    if not fut.done():
                        fut.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - handed to every caller of the batch
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
            else:
                for (_, fut), r in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(r)
            s = self.stats
            s.batches += 1
            s.items += len(batch)
            s.max_batch_seen = max(s.max_batch_seen, len(batch))
            s.busy_s += time.perf_counter() - t0
            s.sizes[len(batch)] = s.sizes.get(len(batch), 0) + 1
