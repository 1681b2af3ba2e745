"""Env servers for the tests on 127.0.0.1: in a thread of the test process (:class:`ThreadServer`, behind
:class:`Faults` that make it misbehave on purpose), or as ``mobilerl env serve`` processes (:func:`serve_env`) an
operator starts, to kill with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from mobilerl.env.fake import CounterEnv
from mobilerl.env.server import create_app

TOKEN = "cluster-test-token"


class Faults:
    """ASGI middleware that makes a server misbehave on purpose: answer ``status`` to the next ``fail[path]``
    requests of a path (-1: all of them; ``"*"``: every path, /health too), or stall requests for ``hang_s``."""

    def __init__(self, app):
        self.app = app
        self.fail: dict[str, int] = {}
        self.fail_after: dict[str, int] = {}  # let this many requests of a path through before failing
        self.status = 500
        self.hang_s = 0.0
        self.seen: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        self.seen[path] = self.seen.get(path, 0) + 1
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        key = path if path in self.fail else "*" if "*" in self.fail else None
        if key is not None and self.fail[key] != 0 and self.seen[path] > self.fail_after.get(path, 0):
            self.fail[key] -= 1 if self.fail[key] > 0 else 0
            body = json.dumps({"detail": f"injected fault on {path}"}).encode()
            await send({"type": "http.response.start", "status": self.status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return None
        return await self.app(scope, receive, send)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """An env server (uvicorn) in a thread, on 127.0.0.1, behind :class:`Faults`; stop() and start() again on the
    same port (a restarted server)."""

    def __init__(self, size: int = 2, factory=CounterEnv, **app_kwargs):
        self.size, self.factory, self.app_kwargs = size, factory, {"isolate": False, **app_kwargs}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.faults: Faults | None = None
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> ThreadServer:
        self.faults = Faults(create_app(self.factory, token=TOKEN, size=self.size, **self.app_kwargs))
        self.server = uvicorn.Server(uvicorn.Config(self.faults, host="127.0.0.1", port=self.port,
                                                    log_level="warning", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(15)

    def __enter__(self) -> ThreadServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def servers(*sizes: int, factory=CounterEnv):
    started = [ThreadServer(s, factory).start() for s in sizes]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def serve_env(port: int, size: int = 2, render: bool = False) -> subprocess.Popen:
    """``mobilerl env serve`` as an operator starts it: the simulator, ``size`` workers (rendering screenshots
    with ``render``), token from the environment."""
    env = {**os.environ, "MOBILERL_ENV_TOKEN": TOKEN}
    return subprocess.Popen([sys.executable, "-m", "mobilerl.cli", "env", "serve", "--port", str(port),
                             "--backend", "sim", "--size", str(size), "--no-isolate",
                             *(["--render"] if render else [])], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"env server on {port} exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"env server on {port} did not come up"
        time.sleep(0.2)


