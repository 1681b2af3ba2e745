"""The async env pool rollouts talk to, and the adapters that make any env safe to await.

    pool = EnvPool(factory, size=256, call_timeout=60)
    async with pool:
        async with pool.acquire() as env:      # waits for an idle worker
            obs = await env.reset(task)        # every call: asyncio.wait_for(call, timeout)
            result = await env.step(action)

Design (the lesson of slime's AndroidWorld example: one blocking call serialises every rollout):

- Nothing here blocks the event loop. A synchronous :class:`~mobilerl.env.base.Env` runs either in a
  bounded thread pool (:class:`ThreadEnv`) or in a child process
  (:class:`~mobilerl.env.process_env.ProcessEnv`, which also survives a crashing simulator/device driver).
- A worker whose call crashes (``EnvCrashed``, connection errors, ``BrokenPipeError``, ``EOFError``) or times
  out is discarded — closed in the background, never awaited by the caller — and a fresh one is built
  from the factory, so the pool keeps its size. The caller gets :class:`EnvCrashed` (or its subclass
  :class:`EnvTimeout`) and can fail or retry the episode. A plain :class:`EnvError` (bad task id, …) keeps
  the worker.
- A lease is always returned, on every exit path. Cancelling a call does *not* discard the worker: the
  adapters here are cancel-safe (a cancelled call's reply is dropped, the next call queues behind it).
  Pass ``discard_on_cancel=True`` for factories whose envs are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import Any

from mobilerl.env.actions import Action
from mobilerl.env.base import (
    AsyncEnv,
    Env,
    EnvCrashed,
    EnvError,
    EnvTimeout,
    Observation,
    StepResult,
    TaskSpec,
)

log = logging.getLogger(__name__)

EnvFactory = Callable[[], "AsyncEnv | Awaitable[AsyncEnv]"]

# Errors that mean "this worker is gone", whatever backend raised them.
CRASH_ERRORS: tuple[type[BaseException], ...] = (EnvCrashed, ConnectionError, BrokenPipeError, EOFError)


class PoolExhausted(EnvError):
    """No worker could be leased: none became idle in time, or the pool has no live workers left."""


class PoolClosed(EnvError):
    """The pool was closed."""


@dataclass
class PoolStats:
    """Counters of one pool (read them as ``pool.stats``; ``to_dict`` gives namespaced metric keys)."""

    leases: int = 0
    calls: int = 0
    errors: int = 0  # every failed call, crashes and timeouts included
    timeouts: int = 0
    crashes: int = 0  # workers discarded (crash or timeout)
    replacements: int = 0  # fresh workers built to replace discarded ones
    replacement_failures: int = 0

    def to_dict(self, prefix: str = "env/pool_") -> dict[str, int]:
        return {prefix + k: v for k, v in asdict(self).items()}


def _is_async_env(env: object) -> bool:
    return all(
        inspect.iscoroutinefunction(getattr(env, m, None)) for m in ("reset", "step", "evaluate", "close")
    )


class PooledEnv:
    """The env handed out by :meth:`EnvPool.acquire`: an :class:`AsyncEnv` whose calls are timed and guarded.

    ``close()`` on it releases the lease (the pool owns the worker). Using it after release raises.
    """

    def __init__(self, pool: EnvPool, env: AsyncEnv):
        self._pool = pool
        self._env: AsyncEnv | None = env
        self._broken: BaseException | None = None

    @property
    def worker(self) -> AsyncEnv:
        """The underlying worker (e.g. a :class:`~mobilerl.env.process_env.ProcessEnv`, to read its ``pid``)."""
        if self._env is None:
            raise EnvError("this env lease was already released")
        return self._env

    @property
    def released(self) -> bool:
        return self._env is None

    async def reset(self, task: TaskSpec | str) -> Observation:
        timeout = (
            self._pool.reset_timeout if self._pool.reset_timeout is not None else self._pool.call_timeout
        )
        return await self._call("reset", (task,), timeout)

    async def step(self, action: Action) -> StepResult:
        return await self._call("step", (action,), self._pool.call_timeout)

    async def evaluate(self) -> float | None:
        return await self._call("evaluate", (), self._pool.call_timeout)

    async def close(self) -> None:
        self.release()

    def release(self) -> None:
        """Give the worker back to the pool (a crashed one was already discarded). Idempotent."""
        env, self._env = self._env, None
        if env is not None and self._broken is None:
            self._pool._give(env)

    async def _call(self, name: str, args: tuple, timeout: float | None) -> Any:
        if self._broken is not None:
            raise EnvCrashed(f"this env worker was discarded after: {self._broken}; acquire another one")
        env = self.worker
        pool = self._pool
        pool.stats.calls += 1
        try:
            return await asyncio.wait_for(getattr(env, name)(*args), timeout)
        except TimeoutError as e:
            pool.stats.errors += 1
            pool.stats.timeouts += 1
            err = EnvTimeout(f"env {name}() did not finish within {timeout}s; the worker was replaced")
            self._discard(err)
            raise err from e
        except CRASH_ERRORS as e:
            pool.stats.errors += 1
            if isinstance(e, EnvTimeout):
                pool.stats.timeouts += 1
            err = e if isinstance(e, EnvCrashed) else EnvCrashed(f"env worker failed in {name}(): {e!r}")
            self._discard(err)
            if err is e:
                raise
            raise err from e
        except asyncio.CancelledError:
            if pool.discard_on_cancel:
                self._discard(EnvCrashed(f"{name}() was cancelled"))
            raise
        except Exception:
            pool.stats.errors += 1
            raise

    def _discard(self, reason: BaseException) -> None:
        if self._broken is None and self._env is not None:
            self._broken = reason
            self._pool._discard(self._env, reason)


class EnvPool:
    """A fixed-size pool of async env workers with per-call timeouts and crash replacement.

    Args:
        factory: builds one worker: returns an :class:`AsyncEnv` or an awaitable of one (e.g.
            ``lambda: ProcessEnv.create(SimEnv)``). Synchronous envs must be wrapped (ThreadEnv/ProcessEnv).
        size: number of workers kept alive.
        call_timeout: seconds allowed for each step/evaluate call (``None``: no limit).
        reset_timeout: seconds allowed for reset (defaults to ``call_timeout``); real devices reset slowly.
        max_replacements: total crashed workers the pool may replace (``None``: unlimited); past it the
            pool shrinks, and leasing fails with :class:`PoolExhausted` once no worker is left.
        create_timeout: seconds allowed for building one worker.
        start_concurrency: workers built at once by :meth:`start` (8: building more at once, simulators or
            processes, only contends for a few cores).
        discard_on_cancel: treat a cancelled call as a crash (for envs that are not cancel-safe).
    """

    def __init__(
        self,
        factory: EnvFactory,
        size: int,
        call_timeout: float | None = 60.0,
        reset_timeout: float | None = None,
        max_replacements: int | None = None,
        *,
        create_timeout: float | None = 120.0,
        start_concurrency: int = 8,
        discard_on_cancel: bool = False,
        replace_attempts: int = 3,
        replace_backoff_s: float = 0.5,
    ):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if call_timeout is not None and call_timeout <= 0:
            raise ValueError(f"call_timeout must be > 0 or None, got {call_timeout}")
        if max_replacements is not None and max_replacements < 0:
            raise ValueError(f"max_replacements must be >= 0 or None, got {max_replacements}")
        self.factory = factory
        self.size = size
        self.call_timeout = call_timeout
        self.reset_timeout = reset_timeout
        self.max_replacements = max_replacements
        self.create_timeout = create_timeout
        self.start_concurrency = max(1, start_concurrency)
        self.discard_on_cancel = discard_on_cancel
        self.replace_attempts = max(1, replace_attempts)
        self.replace_backoff_s = replace_backoff_s
        self.stats = PoolStats()
        self._idle: deque[AsyncEnv] = deque()
        self._waiters: deque[asyncio.Future[AsyncEnv]] = deque()
        self._live: set[AsyncEnv] = set()  # idle + leased workers
        self._creating = 0  # replacements under construction
        self._background: set[asyncio.Task] = set()
        self._started = False
        self._closed = False
        self._last_failure: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    async def __aenter__(self) -> EnvPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Build all workers (at most ``start_concurrency`` at once). Fails whole if any worker fails."""
        if self._closed:
            raise PoolClosed("cannot start a closed pool")
        if self._started:
            return
        self._started = True
        sem = asyncio.Semaphore(self.start_concurrency)

        async def one() -> AsyncEnv:
            async with sem:
                return await self._create()

        results = await asyncio.gather(*(one() for _ in range(self.size)), return_exceptions=True)
        envs = [r for r in results if not isinstance(r, BaseException)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._closed = True
            await asyncio.gather(*(_close_quietly(e) for e in envs))
            first = failures[0]
            raise EnvError(
                f"could not start env pool: {len(failures)} of {self.size} workers failed; first error: {first!r}"
            ) from first
        self._live.update(envs)
        self._idle.extend(envs)

    async def close(self, timeout: float = 10.0) -> None:
        """Close every worker (idle and leased) and stop pending replacements. Idempotent."""
        if self._closed and not self._live and not self._background:
            return
        self._closed = True
        self._fail_waiters(PoolClosed("the env pool was closed"))
        for task in list(self._background):
            if task.get_name().startswith("envpool-replace"):
                task.cancel()
        envs = list(self._live)
        self._live.clear()
        self._idle.clear()
        await asyncio.gather(*(_close_quietly(e, timeout) for e in envs))
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout)

    @property
    def live(self) -> int:
        """Workers alive now (idle + leased), not counting replacements under construction."""
        return len(self._live)

    @property
    def idle(self) -> int:
        return len(self._idle)

    # -- leasing ---------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[PooledEnv]:
        """Lease a worker for the block; waits (up to ``timeout``) for one to become idle."""
        handle = await self.lease(timeout)
        try:
            yield handle
        finally:
            handle.release()

    async def lease(self, timeout: float | None = None) -> PooledEnv:
        """Lease a worker without a ``with`` block; the caller must ``release()`` it (the env server does)."""
        if self._closed:
            raise PoolClosed("the env pool is closed")
        if not self._started:
            raise EnvError("the env pool is not started: use `async with pool:` or `await pool.start()`")
        env = await self._take(timeout)
        self.stats.leases += 1
        return PooledEnv(self, env)

    async def _take(self, timeout: float | None) -> AsyncEnv:
        if self._idle:
            return self._idle.popleft()
        self._check_alive()
        fut: asyncio.Future[AsyncEnv] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await (fut if timeout is None else asyncio.wait_for(fut, timeout))
        except BaseException as e:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._give(fut.result())  # handed a worker while being cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            if isinstance(e, TimeoutError):
                raise PoolExhausted(
                    f"no env worker became free within {timeout}s ({self.size} workers)"
                ) from None
            raise

    def _give(self, env: AsyncEnv) -> None:
        if self._closed or env not in self._live:
            return  # close() already closed it (or it was discarded)
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(env)
                return
        self._idle.append(env)

    # -- crash handling --------------------------------------------------------------------------------

    def _discard(self, env: AsyncEnv, reason: BaseException) -> None:
        self._live.discard(env)
        self.stats.crashes += 1
        self._last_failure = reason
        log.warning("env worker discarded: %s", reason)
        self._spawn(_close_quietly(env), "envpool-close")
        if self._closed:
            return
        budget_left = self.max_replacements is None or (
            self.stats.replacements + self._creating < self.max_replacements
        )
        if budget_left:
            self._creating += 1
            self._spawn(self._replace(), "envpool-replace")
        else:
            log.error(
                "env pool: replacement budget (%s) spent; pool shrinks to %d",
                self.max_replacements,
                self.live,
            )
            self._check_alive(raise_=False)

    async def _replace(self) -> None:
        env: AsyncEnv | None = None
        last: BaseException | None = None
        try:
            for attempt in range(self.replace_attempts):
                try:
                    env = await self._create()
                    break
                except Exception as e:  # noqa: BLE001 - any factory failure is retried, then reported
                    last = e
                    log.warning("env pool: replacement attempt %d failed: %r", attempt + 1, e)
                    await asyncio.sleep(self.replace_backoff_s * 2**attempt)
        finally:
            self._creating -= 1
        if env is None:
            self.stats.replacement_failures += 1
            self._last_failure = last
            self._check_alive(raise_=False)
            return
        if self._closed:
            await _close_quietly(env)
            return
        self.stats.replacements += 1
        self._live.add(env)
        self._give(env)

    def _check_alive(self, raise_: bool = True) -> None:
        if self._live or self._creating:
            return
        err = PoolExhausted(f"the env pool has no live workers left; last failure: {self._last_failure!r}")
        self._fail_waiters(err)
        if raise_:
            raise err

    def _fail_waiters(self, err: BaseException) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(err)

    async def _create(self) -> AsyncEnv:
        async def build() -> AsyncEnv:
            env = self.factory()
            if inspect.isawaitable(env):
                env = await env
            return env  # type: ignore[return-value]

        env = await asyncio.wait_for(build(), self.create_timeout)
        if not _is_async_env(env):
            await _close_quietly(env)  # type: ignore[arg-type]
            raise TypeError(
                f"env factory returned {type(env).__name__}, which is not an AsyncEnv (async reset/step/"
                "evaluate/close); wrap synchronous envs in ThreadEnv or ProcessEnv"
            )
        return env

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{name}-{id(task):x}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _close_quietly(env: Any, timeout: float = 10.0) -> None:
    """Best-effort close that never raises and never waits longer than ``timeout``."""
    try:
        result = env.close()
        if inspect.isawaitable(result):
            await asyncio.wait_for(result, timeout)
    except Exception as e:  # noqa: BLE001 - closing a dead worker may fail in any way
        log.debug("closing env worker failed: %r", e)


# -- adapters ------------------------------------------------------------------------------------------


class InlineEnv:
    """Runs a synchronous in-process :class:`Env` on the event loop itself: no thread hop per call.

    For the built-in simulator, whose calls are ~1-2 ms of Python: handing each call to a worker thread cost
    about half as much again (2.6 against 1.7 ms of CPU a step, oracle episodes on world/test) and, under the
    GIL, runs no faster. A call blocks the loop until it returns, so it cannot be timed out: use it only for
    envs that cannot hang (``call_timeout`` bounds nothing here). An exception is still a crashed worker to
    the pool, which replaces it.
    """

    inline = True

    def __init__(self, env: Env):
        self.env = env

    async def reset(self, task: TaskSpec | str) -> Observation:
        return self.env.reset(task)

    async def step(self, action: Action) -> StepResult:
        return self.env.step(action)

    async def evaluate(self) -> float | None:
        return self.env.evaluate()

    async def close(self) -> None:
        self.env.close()


class ThreadEnv:
    """Runs a synchronous :class:`Env` in a thread pool so the event loop never blocks.

    Calls are serialised per env (a lock taken inside the worker thread), so a cancelled call that is
    still running in its thread simply finishes before the next one starts: the adapter is cancel-safe.
    ``executor=None`` uses the loop's default executor; pass a bounded ``ThreadPoolExecutor`` shared by
    all envs of a pool rather than one thread per env.
    """

    def __init__(self, env: Env, executor: Executor | None = None):
        self.env = env
        self.executor = executor
        self._lock = threading.Lock()  # serialises calls on the env, inside the worker threads
        self._count_lock = threading.Lock()
        self._running = 0  # calls submitted and not yet finished in their thread

    def _run(self, fn: Callable[..., Any], args: tuple) -> Any:
        try:
            with self._lock:
                return fn(*args)
        finally:
            with self._count_lock:
                self._running -= 1

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._count_lock:
            self._running += 1
        try:
            fut = asyncio.get_running_loop().run_in_executor(self.executor, self._run, fn, args)
        except BaseException:
            with self._count_lock:
                self._running -= 1
            raise
        return await fut

    async def reset(self, task: TaskSpec | str) -> Observation:
        return await self._call(self.env.reset, task)

    async def step(self, action: Action) -> StepResult:
        return await self._call(self.env.step, action)

    async def evaluate(self) -> float | None:
        return await self._call(self.env.evaluate)

    async def close(self, wait_s: float = 5.0) -> None:
        # A timed-out call may still hold the env in its thread; give it a moment, then close anyway.
        deadline = time.monotonic() + wait_s
        while self._running > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self._call(self.env.close)


class LatencyEnv:
    """Adds ``await asyncio.sleep(latency_s)`` before every reset/step (emulates a real emulator's latency)."""

    def __init__(self, inner: AsyncEnv, latency_s: float):
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.inner = inner
        self.latency_s = latency_s

    async def reset(self, task: TaskSpec | str) -> Observation:
        await asyncio.sleep(self.latency_s)
        return await self.inner.reset(task)

    async def step(self, action: Action) -> StepResult:
        await asyncio.sleep(self.latency_s)
        return await self.inner.step(action)

    async def evaluate(self) -> float | None:
        return await self.inner.evaluate()

    async def close(self) -> None:
        await self.inner.close()
