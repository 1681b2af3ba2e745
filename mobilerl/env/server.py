"""HTTP env server: any synchronous backend behind a token-protected FastAPI app, and its client.

JSON endpoints, all but ``GET /health`` behind ``Authorization: Bearer <token>``: ``POST /reset`` (task id or
TaskSpec dict; without a session it leases a worker of the :class:`~mobilerl.env.pool.EnvPool`, with one it
resets that worker), ``/step`` (a ``format_action`` text), ``/evaluate``, ``/close`` and ``GET /stats``.
Errors, each documented per operation in the OpenAPI schema with the body ``{"detail": ...}``: bad token 401,
env error, unknown task or a body that is not JSON 400, unknown session 404, ended session 409, malformed body
(a TaskSpec out of range, a task id that is not canonical) or unparsable action 422 (the session is looked up
first; the action is parsed in a thread), no free worker 503; an error repeats at most ``ECHO_CHARS`` of an input. Idle sessions close after ``session_ttl``. With ``isolate=True`` a crashed worker is replaced: its call answers
503, later calls on that session 409. :class:`RemoteEnv` is the client: transport errors, 5xx, 404 and 409
raise :class:`~mobilerl.env.base.EnvCrashed`, other 4xx :class:`~mobilerl.env.base.EnvError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from mobilerl.env import factory as envs
from mobilerl.env.actions import MAX_RESPONSE_CHARS, Action, format_action, parse_action
from mobilerl.env.base import Env, EnvCrashed, EnvError, EnvTimeout, Observation, StepResult, TaskSpec
from mobilerl.env.pool import EnvPool, PooledEnv, PoolExhausted, ThreadEnv
from mobilerl.env.process_env import ProcessEnv

log = logging.getLogger(__name__)

TOKEN_ENV = "MOBILERL_ENV_TOKEN"
_BUSY = "no env worker available"  # the 503 detail of a full server (the client tells it from a broken one)
DEFAULT_PORT = 8765


class EnvServerBusy(EnvCrashed):
    """The server answered 503 "no env worker available": it is full, not broken (try another server)."""


# -- wire models ----------------------------------------------------------------------------------------


ECHO_CHARS = 200  # the most of a client's input an error message repeats

# A task id: up to four "/"-separated names (suite/split/template/index, or AndroidWorld's bare task type);
# a numeric segment is a canonical index (no sign, leading zero, "_", space or non-ASCII digit).
_TASK_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,127}"
_TASK_SEGMENT = rf"(?:{_TASK_NAME}|0|[1-9][0-9]{{0,5}})"  # a name, or a canonical index (no 07, 1_0, ٣)
TASK_ID_PATTERN = rf"^(?:{_TASK_SEGMENT}/){{0,3}}{_TASK_SEGMENT}$"
TaskId = Annotated[str, StringConstraints(pattern=TASK_ID_PATTERN, max_length=512)]
SessionId = Annotated[str, StringConstraints(max_length=128)]
_Name = Annotated[str, StringConstraints(max_length=256)]

_SAFE_INT = 2**53  # integers a JSON number holds exactly (float64 clients and schema validators agree)


class WireTaskSpec(BaseModel):
    """:class:`~mobilerl.env.base.TaskSpec` on the wire (``TaskSpec.to_dict``), checked at the boundary:
    finite numbers in range, integers that are integers, ``params`` a dict, no unknown keys."""

    model_config = ConfigDict(extra="forbid", title="TaskSpec")

    task_id: TaskId
    suite: _Name
    split: _Name
    template: _Name
    instruction: Annotated[str, StringConstraints(max_length=16_384)]
    params: dict[str, Any] = Field(default_factory=dict, description="the template's parameters")
    seed: int = Field(default=0, ge=-_SAFE_INT, le=_SAFE_INT, description="the device seed")
    difficulty: _Name = "easy"
    optimal_steps: int = Field(default=0, ge=0, le=10_000)
    complexity: float = Field(default=1.0, strict=True, ge=0, le=100, allow_inf_nan=False,
                              description="AndroidWorld's complexity; the step budget is min(50, 10 × it)")
    tags: list[_Name] = Field(default_factory=list, max_length=256)
    apps: list[_Name] = Field(default_factory=list, max_length=256)
    task_type: _Name = "operation"
    has_verifier: bool = Field(default=True, strict=True)
    subgoals: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(default_factory=list,
                                                                               max_length=256)
    max_steps: Annotated[int, Field(ge=0, le=10_000)] | None = Field(
        default=None, description="ignored (derived from complexity); to_dict writes it")

    @field_validator("seed", "optimal_steps", "max_steps", mode="before")
    @classmethod
    def _a_json_integer(cls, value: Any) -> Any:
        # 3 or 3.0 (an integer to JSON Schema), not "3" or True, which pydantic's lax int would also read
        if isinstance(value, str | bool):
            raise ValueError("must be a JSON integer, not a string or a boolean")
        return value

    def to_spec(self) -> TaskSpec:
        return TaskSpec.from_dict(self.model_dump(exclude={"max_steps"}))


class ResetRequest(BaseModel):
    task: TaskId | WireTaskSpec = Field(
        description="task id (e.g. 'world/test/ContactsAddContact/3') or a TaskSpec",
        examples=["world/test/ContactsAddContact/3"],
    )
    session: SessionId | None = Field(
        default=None, description="reset this session's worker instead of leasing one"
    )


class StepRequest(BaseModel):
    session: SessionId
    action: str = Field(max_length=MAX_RESPONSE_CHARS,
                        description="canonical action text, as produced by format_action")


class SessionRequest(BaseModel):
    session: SessionId


class WireObservation(BaseModel):
    """:meth:`~mobilerl.env.base.Observation.to_wire`."""

    xml: str = Field(description="raw uiautomator dump")
    app: str = Field(description="foreground app name")
    width: int
    height: int
    step: int
    screenshot_png_b64: str | None = Field(description="the screenshot as base64 PNG, null without one")


class ResetResponse(BaseModel):
    session: str = Field(description="the session id every later call names")
    observation: WireObservation


class StepResponse(BaseModel):
    observation: WireObservation
    done: bool
    info: dict[str, Any] = Field(description="the backend's step info, made JSON-safe")


class EvaluateResponse(BaseModel):
    reward: float | None = Field(description="the verifier's reward; null for a task without one")


class CloseResponse(BaseModel):
    closed: bool
    ended: str | None = Field(default=None, description="why the session had already ended, if it had")


class HealthResponse(BaseModel):
    status: str
    workers: int
    idle: int
    size: int


class ErrorResponse(BaseModel):
    detail: str | list[dict[str, Any]] = Field(
        description="what was wrong: a message, or FastAPI's list of body validation errors (422)"
    )


_ERRORS = {
    400: "the env rejected the call (e.g. an unknown task), or the body is not JSON",
    401: "missing or invalid bearer token",
    404: "unknown session",
    409: "the session has ended (closed, expired, or its worker crashed)",
    422: "malformed request body, TaskSpec or action",
    503: "no env worker available, or the session's worker crashed or timed out",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses an operation answers."""
    return {c: {"model": ErrorResponse, "description": _ERRORS[c]} for c in codes}


def _clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text``, cut to ``limit`` characters (saying how long it was) so an error never echoes a huge input."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def _clipped_errors(errors: Any) -> Any:
    """FastAPI's validation errors with each echoed ``input`` clipped."""
    out = []
    for error in errors:
        error = dict(error)
        if "input" in error:
            value = error["input"]
            text = value if isinstance(value, str) else json.dumps(jsonable_encoder(value), default=repr)
            if len(text) > ECHO_CHARS:
                error["input"] = _clip(text)
        out.append(error)
    return out


def _json_safe(value: Any) -> Any:
    """``info`` dicts come from backends: make them JSON-safe without failing on odd values."""
    return json.loads(json.dumps(value, default=repr))


# -- server ---------------------------------------------------------------------------------------------


@dataclass
class _Session:
    id: str
    env: PooledEnv
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class _ServerState:
    def __init__(self, pool: EnvPool, session_ttl: float, acquire_timeout: float):
        self.pool = pool
        self.session_ttl = session_ttl
        self.acquire_timeout = acquire_timeout
        self.sessions: dict[str, _Session] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # session id -> why it ended (bounded)

    def end(self, session: _Session, why: str) -> None:
        if self.sessions.pop(session.id, None) is not None:
            session.env.release()
        self.ended[session.id] = why
        while len(self.ended) > 10_000:
            self.ended.popitem(last=False)

    def get(self, session_id: str) -> _Session:
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()
            return session
        if session_id in self.ended:
            raise HTTPException(409, f"session {session_id} has ended: {self.ended[session_id]}")
        raise HTTPException(404, f"unknown session {session_id!r}; start one with POST /reset")

    def session_pid(self, session_id: str) -> int | None:
        """The worker process id behind a session (isolate mode), for operators and tests."""
        return getattr(self.sessions[session_id].env.worker, "pid", None)

    async def expire_loop(self) -> None:
        period = max(0.05, min(self.session_ttl / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.expire()

    def expire(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if not session.lock.locked() and now - session.last_used > self.session_ttl:
                log.info("session %s expired after %.0fs idle", session.id, self.session_ttl)
                self.end(session, f"expired after {self.session_ttl:g}s without a request")

    async def close(self) -> None:
        for session in list(self.sessions.values()):
            self.end(session, "the server shut down")
        await self.pool.close()


def _bearer_auth(token: str) -> Callable[[Request], None]:
    expected = token.encode()

    def check(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(given.strip().encode(), expected):
            raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    return check


def create_app(
    env_factory: Callable[[], Env],
    *,
    token: str,
    size: int = 1,
    isolate: bool = True,
    call_timeout: float | None = 60.0,
    reset_timeout: float | None = None,
    session_ttl: float = 900.0,
    acquire_timeout: float = 30.0,
    mp_context: str = "spawn",
) -> FastAPI:
    """The env server app over ``size`` workers built by ``env_factory`` (a picklable callable if ``isolate``).

    ``isolate=True`` (the default: a crashing or hanging env then cannot take the server down) runs each env in
    its own process; otherwise envs run in a thread pool of ``size`` threads inside the server process.
    """
    if not token:
        raise ValueError("the env server needs a non-empty token")
    if session_ttl <= 0:
        raise ValueError(f"session_ttl must be > 0, got {session_ttl}")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        executor = None if isolate else ThreadPoolExecutor(max_workers=size, thread_name_prefix="env")
        if isolate:
            factory = functools.partial(ProcessEnv.create, env_factory, mp_context=mp_context)
        else:

            async def factory() -> ThreadEnv:
                loop = asyncio.get_running_loop()
                return ThreadEnv(await loop.run_in_executor(executor, env_factory), executor)

        pool = EnvPool(factory, size, call_timeout=call_timeout, reset_timeout=reset_timeout)
        await pool.start()
        state = _ServerState(pool, session_ttl, acquire_timeout)
        app.state.env_server = state
        expiry = asyncio.create_task(state.expire_loop(), name="env-server-expiry")
        try:
            yield
        finally:
            expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await expiry
            await state.close()
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="mobilerl env server", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": jsonable_encoder(_clipped_errors(exc.errors()))}, status_code=422)
    router = APIRouter(dependencies=[Depends(_bearer_auth(token))])

    def state_of(request: Request) -> _ServerState:
        return request.app.state.env_server

    async def run_env_call(state: _ServerState, session: _Session, call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except EnvCrashed as e:
            kind = "timed out" if isinstance(e, EnvTimeout) else "crashed"
            why = f"its env worker {kind}: {e}"
            state.end(session, why)
            raise HTTPException(
                503,
                f"env worker {kind}: {e}; session {session.id} is closed, start a new one with POST /reset",
            ) from e
        except EnvError as e:
            raise HTTPException(400, _clip(str(e), 4 * ECHO_CHARS)) from e
        except Exception as e:
            log.exception("env call failed")
            raise HTTPException(500, _clip(f"{type(e).__name__}: {e}", 4 * ECHO_CHARS)) from e

    @router.post("/reset", response_model=ResetResponse, responses=_errors(400, 401, 404, 409, 422, 503))
    async def reset(req: ResetRequest, request: Request) -> dict[str, Any]:
        state = state_of(request)
        task: TaskSpec | str = req.task.to_spec() if isinstance(req.task, WireTaskSpec) else req.task
        if req.session is not None:
            session = state.get(req.session)
        else:
            try:
                env = await state.pool.lease(timeout=state.acquire_timeout)
            except PoolExhausted as e:
                raise HTTPException(503, f"{_BUSY}: {e}") from e
            session = _Session(uuid.uuid4().hex, env)
            state.sessions[session.id] = session
        async with session.lock:
            try:
                obs = await run_env_call(state, session, lambda: session.env.reset(task))
            except HTTPException:
                if req.session is None and session.id in state.sessions:
                    state.end(session, "its first reset failed")  # don't hold a worker for a failed start
                raise
            session.last_used = time.monotonic()
        return {"session": session.id, "observation": obs.to_wire()}

    @router.post("/step", response_model=StepResponse, responses=_errors(400, 401, 404, 409, 422, 503))
    async def step(req: StepRequest, request: Request) -> dict[str, Any]:
        state = state_of(request)
        session = state.get(req.session)
        try:  # in a thread: a slow parse must not stall other sessions (or /health) on the event loop
            action = await asyncio.to_thread(parse_action, req.action)
        except Exception as e:  # parse_action raises only ActionParseError; anything else is a bad action too
            raise HTTPException(422, _clip(f"invalid action: {e}", 4 * ECHO_CHARS)) from e
        async with session.lock:
            result: StepResult = await run_env_call(state, session, lambda: session.env.step(action))
            session.last_used = time.monotonic()
        return {
            "observation": result.observation.to_wire(),
            "done": result.done,
            "info": _json_safe(result.info),
        }

    @router.post("/evaluate", response_model=EvaluateResponse, responses=_errors(400, 401, 404, 409, 422, 503))
    async def evaluate(req: SessionRequest, request: Request) -> dict[str, Any]:
        state = state_of(request)
        session = state.get(req.session)
        async with session.lock:
            reward = await run_env_call(state, session, session.env.evaluate)
            session.last_used = time.monotonic()
        return {"reward": reward}

    @router.post("/close", response_model=CloseResponse, response_model_exclude_none=True,
                 responses=_errors(400, 401, 404, 422))
    async def close(req: SessionRequest, request: Request) -> dict[str, Any]:
        state = state_of(request)
        if req.session in state.ended:  # closing an ended session is harmless
            return {"closed": True, "ended": state.ended[req.session]}
        session = state.get(req.session)
        async with session.lock:
            state.end(session, "closed by the client")
        return {"closed": True}

    @router.get("/stats", response_model=dict[str, int], responses=_errors(401))
    async def stats(request: Request) -> dict[str, Any]:
        state = state_of(request)
        return {
            "sessions": len(state.sessions),
            "workers": state.pool.live,
            "idle": state.pool.idle,
            **state.pool.stats.to_dict(),
        }

    @app.get("/health", response_model=HealthResponse)
    async def health(request: Request) -> dict[str, Any]:
        state = state_of(request)
        return {"status": "ok", "workers": state.pool.live, "idle": state.pool.idle, "size": state.pool.size}

    app.include_router(router)
    return app


def resolve_token(token: str | None) -> tuple[str, bool]:
    """(token, generated): the given token, else ``$MOBILERL_ENV_TOKEN``, else a fresh random one."""
    if token:
        return token, False
    env_token = os.environ.get(TOKEN_ENV)
    if env_token:
        return env_token, False
    return secrets.token_urlsafe(32), True


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    backend: str = "sim",
    size: int = 4,
    isolate: bool = True,
    *,
    render: bool = False,
    seed: int = 0,
    session_ttl: float = 900.0,
    call_timeout: float | None = 60.0,
    log_level: str = "info",
) -> None:
    """Run the env server with uvicorn (blocking). Binds to 127.0.0.1 unless told otherwise. The envs come from
    :func:`~mobilerl.env.factory.env_factory`; ``render``: observations carry screenshots (for screenshot
    observation modes)."""
    import uvicorn

    token, generated = resolve_token(token)
    if generated:
        print(f"env server token (set {TOKEN_ENV} on clients): {token}", file=sys.stderr, flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: env server listening on {host}, reachable beyond this machine", file=sys.stderr)
    app = create_app(
        envs.env_factory(backend, obs_mode="screenshot+xml" if render else "xml", seed=seed),
        token=token,
        size=size,
        isolate=isolate,
        session_ttl=session_ttl,
        call_timeout=call_timeout,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)


# -- client ---------------------------------------------------------------------------------------------


class RemoteEnv:
    """:class:`~mobilerl.env.base.AsyncEnv` over an env server (one session per instance).

    ``token`` defaults to ``$MOBILERL_ENV_TOKEN``. ``transport`` is for tests (e.g. ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 60.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        token = token or os.environ.get(TOKEN_ENV)
        if not token:
            raise ValueError(f"RemoteEnv needs a token (argument or ${TOKEN_ENV})")
        self.base_url = base_url.rstrip("/")
        self.session: str | None = None
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self._client.post(path, json=payload)
        except httpx.TimeoutException as e:
            raise EnvTimeout(f"env server {self.base_url}{path} timed out: {e!r}") from e
        except httpx.TransportError as e:
            raise EnvCrashed(f"env server {self.base_url} unreachable: {e!r}") from e
        if resp.status_code >= 400:
            detail = _detail(resp)
            msg = f"env server {self.base_url}{path} -> HTTP {resp.status_code}: {detail}"
            if resp.status_code >= 500 or resp.status_code in (404, 409):
                self.session = None  # the server lost or ended the session (crash, expiry, restart)
                if resp.status_code == 503 and detail.startswith(_BUSY):
                    raise EnvServerBusy(msg)
                raise EnvCrashed(msg)
            if resp.status_code == 401:
                raise EnvError(msg + " (check the token)")
            raise EnvError(msg)
        return resp.json()

    def _require_session(self) -> str:
        if self.session is None:
            raise EnvError("no active session: call reset() first")
        return self.session

    async def reset(self, task: TaskSpec | str) -> Observation:
        wire_task = task.to_dict() if isinstance(task, TaskSpec) else task
        if self.session is not None:
            try:
                data = await self._post("/reset", {"task": wire_task, "session": self.session})
            except EnvCrashed:
                if self.session is not None:
                    raise
                # Our old session is gone (its worker crashed, or it expired): a reset starts afresh anyway.
                data = await self._post("/reset", {"task": wire_task, "session": None})
        else:
            data = await self._post("/reset", {"task": wire_task, "session": None})
        self.session = data["session"]
        return Observation.from_wire(data["observation"])

    async def step(self, action: Action) -> StepResult:
        data = await self._post(
            "/step", {"session": self._require_session(), "action": format_action(action)}
        )
        return StepResult(
            Observation.from_wire(data["observation"]), bool(data["done"]), data.get("info") or {}
        )

    async def evaluate(self) -> float | None:
        data = await self._post("/evaluate", {"session": self._require_session()})
        reward = data.get("reward")
        return None if reward is None else float(reward)

    async def close(self) -> None:
        try:
            if self.session is not None:
                with contextlib.suppress(EnvError):
                    await self._post("/close", {"session": self.session})
        finally:
            self.session = None
            await self._client.aclose()

    async def health(self) -> dict[str, Any]:
        try:
            resp = await self._client.get("/health")
        except httpx.TransportError as e:
            raise EnvCrashed(f"env server {self.base_url} unreachable: {e!r}") from e
        resp.raise_for_status()
        return resp.json()


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


__all__ = [
    "DEFAULT_PORT",
    "EnvServerBusy",
    "TOKEN_ENV",
    "RemoteEnv",
    "create_app",
    "resolve_token",
    "serve",
]
