"""A synchronous :class:`~mobilerl.env.base.Env` in a child process, awaited without blocking the loop.

:class:`ProcessEnv` isolates an env that may crash or hang (a simulator or device driver): a dead child
turns every pending call into :class:`~mobilerl.env.base.EnvCrashed` and the pool builds a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from mobilerl.env.actions import Action
from mobilerl.env.base import Env, EnvCrashed, EnvError, EnvTimeout, Observation, StepResult, TaskSpec

log = logging.getLogger(__name__)

# Wire format between parent and child: 8-byte big-endian length + a pickle, over a socketpair (a
# bidirectional pipe). The child is a plain blocking request loop; the parent reads replies with asyncio
# streams in one reader task and resolves the callers' futures in FIFO order, so no call blocks the loop
# and a cancelled call's reply is simply dropped.

_HEADER = struct.Struct("!Q")


def _send_frame(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


def _portable_exc(e: BaseException) -> BaseException:
    """The exception itself if it survives a pickle round trip, else an EnvError describing it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return EnvError(f"{type(e).__name__}: {e}")


def _child_main(sock: socket.socket, env_factory: Callable[[], Env]) -> None:
    """Request loop of a :class:`ProcessEnv` worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    try:
        env = env_factory()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit
        _send_frame(sock, ("error", _portable_exc(e), traceback.format_exc()))
        return
    _send_frame(sock, ("ready", os.getpid(), None))
    closed = False
    try:
        while True:
            try:
                method, args = _recv_frame(sock)
            except (EOFError, ConnectionError, OSError):
                break  # the parent went away
            try:
                result = getattr(env, method)(*args)
                reply: tuple = ("ok", result, None)
            except Exception as e:  # noqa: BLE001 - every env error goes back to the caller
                reply = ("err", _portable_exc(e), traceback.format_exc())
            if method == "close":
                closed = True
            try:
                _send_frame(sock, reply)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                _send_frame(
                    sock, ("err", EnvError(f"env {method}() returned an unpicklable result: {e}"), None)
                )
            if closed:
                break
    finally:
        if not closed:
            with contextlib.suppress(Exception):
                env.close()
        sock.close()


def _exitcode(proc: multiprocessing.process.BaseProcess | None, default: int | None = None) -> int | None:
    """A process's exit code, or ``default`` if it is still running, unknown, or its handle was closed."""
    if proc is None:
        return default
    try:
        code = proc.exitcode
    except ValueError:  # Process.close() was called
        return default
    return default if code is None else code


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is unreachable"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ProcessEnv:
    """Runs a synchronous :class:`Env` in a child process (``spawn`` by default), awaited without blocking.

    ``env_factory`` must be picklable (a class, a module-level function, or a ``functools.partial`` of
    one). The child is started by :meth:`start` (or lazily by the first call); ``ProcessEnv.create`` does
    both, which makes ``lambda: ProcessEnv.create(factory)`` a pool factory. A dead child turns every
    pending and later call into :class:`EnvCrashed`.
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        *,
        mp_context: str = "spawn",
        start_timeout: float = 60.0,
        close_timeout: float = 5.0,
    ):
        if mp_context not in ("spawn", "forkserver"):
            raise ValueError(
                f"mp_context must be 'spawn' or 'forkserver' (fork is unsafe with threads), got {mp_context!r}"
            )
        self.env_factory = env_factory
        self.mp_context = mp_context
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._reader_task: asyncio.Task | None = None
        self._dead: EnvCrashed | None = None
        self._closed = False
        self._start_lock: asyncio.Lock | None = None
        self._pid: int | None = None
        self._exitcode: int | None = None

    @classmethod
    async def create(cls, env_factory: Callable[[], Env], **kwargs: Any) -> ProcessEnv:
        env = cls(env_factory, **kwargs)
        await env.start()
        return env

    @property
    def pid(self) -> int | None:
        """The child's process id (kept after it exits, for messages)."""
        return self._pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._dead is None and _exitcode(self._proc) is None

    async def start(self) -> None:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._proc is not None:
                return
            if self._closed:
                raise EnvError("ProcessEnv is closed")
            await self._start()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        parent_sock, child_sock = socket.socketpair()
        ctx = multiprocessing.get_context(self.mp_context)
        proc = ctx.Process(
            target=_child_main, args=(child_sock, self.env_factory), daemon=True, name="mobilerl-env"
        )
        try:
            # Process.start() forks/execs and writes the pickled target: keep it off the loop thread.
            await loop.run_in_executor(None, proc.start)
        except BaseException:
            parent_sock.close()
            child_sock.close()
            raise
        finally:
            child_sock.close()  # the child holds its own copy; ours must go so we see EOF when it dies
        self._proc = proc
        self._pid = pid = proc.pid
        parent_sock.setblocking(False)
        self._reader, self._writer = await asyncio.open_connection(sock=parent_sock)
        try:
            kind, value, tb = await asyncio.wait_for(self._read_frame(), self.start_timeout)
        except TimeoutError:
            await self._kill()
            raise EnvTimeout(f"env worker process {pid} did not start within {self.start_timeout}s") from None
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            await self._kill()
            raise EnvCrashed(f"env worker process {pid} {self._exit_text()} while starting") from e
        if kind != "ready":
            await self._kill()
            if isinstance(value, BaseException) and tb:
                value.add_note(f"in env worker process {pid}:\n{tb}")
            raise EnvCrashed(f"env factory failed in worker process {pid}: {value!r}") from value
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"processenv-reader-{pid}")

    async def _read_frame(self) -> Any:
        assert self._reader is not None
        (n,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
        return pickle.loads(await self._reader.readexactly(n))

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    kind, value, tb = await self._read_frame()
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    break
                if not self._pending:
                    log.warning("ProcessEnv %s: reply without a pending call dropped", self.pid)
                    continue
                fut = self._pending.popleft()
                if fut.done():  # the caller was cancelled or timed out: drop its reply
                    continue
                if kind == "ok":
                    fut.set_result(value)
                else:
                    if isinstance(value, BaseException):
                        if tb:
                            value.add_note(f"in env worker process {self.pid}:\n{tb}")
                        fut.set_exception(value)
                    else:
                        fut.set_exception(EnvError(f"env worker {self.pid} replied {kind!r}: {value!r}"))
        finally:
            await self._mark_dead()

    async def _mark_dead(self) -> None:
        if self._dead is not None:
            return
        # Give the OS a moment to report how the child ended, for a useful message.
        for _ in range(25):
            if _exitcode(self._proc) is not None:
                break
            await asyncio.sleep(0.02)
        self._dead = EnvCrashed(f"env worker process {self.pid} {self._exit_text()}")
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(self._dead)

    def _exit_text(self) -> str:
        self._exitcode = _exitcode(self._proc, self._exitcode)
        return _describe_exit(self._exitcode)

    async def _call(self, method: str, *args: Any) -> Any:
        if self._closed and method != "close":
            raise EnvError("ProcessEnv is closed")
        if self._proc is None:
            await self.start()
        if self._dead is not None:
            raise EnvCrashed(str(self._dead))
        assert self._writer is not None
        data = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        try:
            self._writer.write(_HEADER.pack(len(data)) + data)
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            # The child is gone; the reader task fails our future with how it ended (exit code/signal).
            try:
                return await asyncio.wait_for(fut, 2.0)
            except TimeoutError:
                raise EnvCrashed(f"env worker process {self.pid} is unreachable: {e!r}") from e
        return await fut

    async def reset(self, task: TaskSpec | str) -> Observation:
        return await self._call("reset", task)

    async def step(self, action: Action) -> StepResult:
        return await self._call("step", action)

    async def evaluate(self) -> float | None:
        return await self._call("evaluate")

    async def close(self) -> None:
        """Ask the child to close its env and exit; kill it if it does not within ``close_timeout``.

        A child that still owes replies (a call that timed out or was cancelled is still running there)
        is killed at once: a graceful close would queue behind the call it is stuck in.
        """
        if self._closed:
            return
        self._closed = True
        if self._proc is None:
            return
        if self._pending:
            await self._kill()
            return
        if self._dead is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._call("close"), self.close_timeout)
        deadline = time.monotonic() + self.close_timeout
        while _exitcode(self._proc) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self._kill()

    async def kill(self) -> None:
        """Kill the child at once (SIGKILL). Pending calls fail with :class:`EnvCrashed`."""
        self._closed = True
        await self._kill()

    async def _kill(self) -> None:
        proc = self._proc
        if proc is not None and _exitcode(proc) is None:
            with contextlib.suppress(Exception):
                proc.kill()
            for _ in range(100):  # reap without blocking the loop
                if _exitcode(proc) is not None:
                    break
                await asyncio.sleep(0.01)
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None and not self._reader_task.done():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._reader_task, 1.0)
        await self._mark_dead()
        if proc is not None and _exitcode(proc) is not None:
            self._exit_text()  # remember the exit code before the handle goes
            with contextlib.suppress(Exception):
                proc.close()
