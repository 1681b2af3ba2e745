"""The HTTP env server (auth, sessions, crash isolation, expiry) and its RemoteEnv client."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import EnvCrashed, EnvError, TaskSpec
from mobilerl.env.factory import env_factory, make_env
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.pool import EnvPool
from mobilerl.env.server import RemoteEnv, create_app, resolve_token, serve

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TAP = format_action(Action("Tap", element=BUTTON))
FACTORY = functools.partial(CounterEnv, known_tasks=("c/1", "c/2"))


def make_client(**kw) -> TestClient:
    kw.setdefault("size", 2)
    kw.setdefault("isolate", False)  # threads: fast; the crash tests isolate explicitly
    return TestClient(create_app(kw.pop("factory", FACTORY), token=TOKEN, **kw))


def test_auth_required_everywhere_but_health():
    with make_client() as c:
        assert c.get("/health").json()["status"] == "ok"
        for method, path, body in (
            ("post", "/reset", {"task": "c/1"}),
            ("post", "/step", {"session": "x", "action": TAP}),
            ("post", "/evaluate", {"session": "x"}),
            ("post", "/close", {"session": "x"}),
            ("get", "/stats", None),
        ):
            r = c.request(method.upper(), path, json=body)
            assert r.status_code == 401 and r.json()["detail"] == "missing bearer token", path
            r = c.request(method.upper(), path, json=body, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["detail"] == "invalid bearer token", path
            assert r.headers["www-authenticate"] == "Bearer"
        r = c.post("/reset", json={"task": "c/1"}, headers={"Authorization": TOKEN})  # no scheme
        assert r.status_code == 401
        r = c.post("/reset", json={"task": "c/1"}, headers=AUTH)
        assert r.status_code == 200
    with pytest.raises(ValueError, match="token"):
        create_app(FACTORY, token="")


def test_episode_over_http_and_error_codes():
    with make_client() as c:
        r = c.post("/reset", json={"task": "c/2"}, headers=AUTH)
        assert r.status_code == 200
        sid = r.json()["session"]
        assert r.json()["observation"]["app"] == "Counter" and "Count: 0" in r.json()["observation"]["xml"]
        for _ in range(2):
            r = c.post("/step", json={"session": sid, "action": TAP}, headers=AUTH)
            assert r.status_code == 200 and r.json()["done"] is False
        assert "Count: 2" in r.json()["observation"]["xml"]
        assert c.post("/evaluate", json={"session": sid}, headers=AUTH).json() == {"reward": 1.0}

        r = c.post("/step", json={"session": sid, "action": 'do(action="Fly")'}, headers=AUTH)
        assert r.status_code == 422 and "unknown action 'Fly'" in r.json()["detail"]
        r = c.post("/step", json={"session": sid, "action": "finish(message='ok')"}, headers=AUTH)
        assert r.json()["done"] is True and r.json()["info"] == {"message": "ok"}

        # Reset the same session (same worker) to another task, given as a TaskSpec dict.
        spec = TaskSpec("c/1", "fake", "test", "Counter", "tap once")
        r = c.post("/reset", json={"task": spec.to_dict(), "session": sid}, headers=AUTH)
        assert r.status_code == 200 and r.json()["session"] == sid

        r = c.post("/step", json={"session": "nope", "action": TAP}, headers=AUTH)
        assert r.status_code == 404 and "unknown session" in r.json()["detail"]
        assert c.post("/close", json={"session": sid}, headers=AUTH).json() == {"closed": True}
        r = c.post("/step", json={"session": sid, "action": TAP}, headers=AUTH)
        assert r.status_code == 409 and "closed by the client" in r.json()["detail"]

        # An env error (unknown task) is a 400 and does not leak the worker.
        r = c.post("/reset", json={"task": "bogus/9"}, headers=AUTH)
        assert r.status_code == 400 and "unknown task id 'bogus/9'" in r.json()["detail"]
        stats = c.get("/stats", headers=AUTH).json()
        assert stats["sessions"] == 0 and stats["idle"] == 2 and stats["env/pool_crashes"] == 0


def test_no_free_worker_is_503():
    with make_client(size=1, acquire_timeout=0.1) as c:
        assert c.post("/reset", json={"task": "c/1"}, headers=AUTH).status_code == 200
        r = c.post("/reset", json={"task": "c/1"}, headers=AUTH)
        assert r.status_code == 503 and "no env worker available" in r.json()["detail"]


def test_idle_sessions_expire_and_free_their_worker():
    with make_client(size=1, session_ttl=0.2, acquire_timeout=5) as c:
        sid = c.post("/reset", json={"task": "c/1"}, headers=AUTH).json()["session"]
        time.sleep(0.6)
        r = c.post("/step", json={"session": sid, "action": TAP}, headers=AUTH)
        assert r.status_code == 409 and "expired" in r.json()["detail"]
        assert c.post("/reset", json={"task": "c/1"}, headers=AUTH).status_code == 200


def test_isolated_worker_killed_mid_episode_is_replaced():
    with make_client(size=1, isolate=True, acquire_timeout=30) as c:
        state = c.app.state.env_server
        sid = c.post("/reset", json={"task": "c/1"}, headers=AUTH).json()["session"]
        assert c.post("/step", json={"session": sid, "action": TAP}, headers=AUTH).status_code == 200
        victim = state.session_pid(sid)
        assert victim is not None and victim != os.getpid()
        os.kill(victim, signal.SIGKILL)

        r = c.post("/step", json={"session": sid, "action": TAP}, headers=AUTH)
        assert r.status_code == 503
        assert f"env worker crashed: env worker process {victim} was killed by SIGKILL" in r.json()["detail"]
        r = c.post("/evaluate", json={"session": sid}, headers=AUTH)
        assert r.status_code == 409 and "crashed" in r.json()["detail"]

        # The only worker was replaced: a new session runs on a new process.
        r = c.post("/reset", json={"task": "c/1"}, headers=AUTH)
        assert r.status_code == 200, r.text
        sid2 = r.json()["session"]
        assert state.session_pid(sid2) not in (None, victim)
        assert c.post("/step", json={"session": sid2, "action": TAP}, headers=AUTH).status_code == 200
        assert c.post("/evaluate", json={"session": sid2}, headers=AUTH).json() == {"reward": 1.0}
        stats = c.get("/stats", headers=AUTH).json()
        assert (
            stats["env/pool_crashes"] == 1 and stats["env/pool_replacements"] == 1 and stats["workers"] == 1
        )


# -- RemoteEnv ------------------------------------------------------------------------------------------


def test_remote_env_over_asgi_with_crash_recovery():
    async def main():
        app = create_app(FACTORY, token=TOKEN, size=1, isolate=True, acquire_timeout=30)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            env = RemoteEnv("http://env", TOKEN, transport=transport)
            obs = await env.reset("c/1")
            assert obs.app == "Counter" and env.session is not None
            result = await env.step(Action("Tap", element=BUTTON))
            assert "Count: 1" in result.observation.xml and result.done is False
            assert await env.evaluate() == 1.0

            with pytest.raises(EnvError, match="HTTP 400.*unknown task id") as info:
                await env.reset("bogus/1")
            assert not isinstance(info.value, EnvCrashed)

            os.kill(app.state.env_server.session_pid(env.session), signal.SIGKILL)
            with pytest.raises(EnvCrashed, match="HTTP 503.*killed by SIGKILL"):
                await env.step(Action("Back"))
            with pytest.raises(EnvError, match="no active session"):
                await env.step(Action("Back"))
            await env.reset("c/1")  # a new session on the replacement worker
            assert (await env.step(Action("Tap", element=BUTTON))).observation.xml.count("Count: 1") == 1
            await env.close()
            assert app.state.env_server.sessions == {}

            bad = RemoteEnv("http://env", "wrong", transport=transport)
            with pytest.raises(EnvError, match="401.*check the token"):
                await bad.reset("c/1")
            await bad.close()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_env_pool_against_uvicorn_and_unreachable_server():
    port = _free_port()
    app = create_app(FACTORY, token=TOKEN, size=3, isolate=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

        async def main():
            url = f"http://127.0.0.1:{port}"
            pool = EnvPool(lambda: RemoteEnv(url, TOKEN, timeout=10), 3)
            async with pool:

                async def episode(i: int) -> float | None:
                    async with pool.acquire() as env:
                        await env.reset("c/1")
                        await env.step(Action("Tap", element=BUTTON))
                        return await env.evaluate()

                assert await asyncio.gather(*(episode(i) for i in range(6))) == [1.0] * 6

            dead = RemoteEnv(f"http://127.0.0.1:{_free_port()}", TOKEN, timeout=2)
            with pytest.raises(EnvCrashed, match="unreachable"):
                await dead.reset("c/1")
            await dead.close()

        asyncio.run(main())
    finally:
        server.should_exit = True
        thread.join(10)


def test_serve_defaults_and_token_resolution(monkeypatch):
    params = inspect.signature(serve).parameters
    assert params["host"].default == "127.0.0.1"
    assert resolve_token("given") == ("given", False)
    monkeypatch.setenv("MOBILERL_ENV_TOKEN", "from-env")
    assert resolve_token(None) == ("from-env", False)
    monkeypatch.delenv("MOBILERL_ENV_TOKEN")
    token, generated = resolve_token(None)
    assert generated and len(token) >= 32
    monkeypatch.delenv("MOBILERL_ENV_TOKEN", raising=False)
    with pytest.raises(ValueError, match="needs a token"):
        RemoteEnv("http://x")
    with pytest.raises(ValueError, match="unknown env backend 'emulator'"):
        env_factory("emulator")
    assert isinstance(make_env("fake"), CounterEnv)


def test_serve_smoke_prints_a_token_and_serves(tmp_path):
    """`serve()` as users start it: loopback, a generated token on stderr, authenticated endpoints."""
    import subprocess
    import sys

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MOBILERL_ENV_TOKEN"}
    code = f"from mobilerl.env.server import serve; serve(port={port}, backend='fake', size=1, log_level='warning')"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=err, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_up(url, proc, 20, lambda: err_path.read_text())
        token = err_path.read_text().split("MOBILERL_ENV_TOKEN on clients): ", 1)[1].split()[0]
        assert httpx.post(f"{url}/reset", json={"task": "c/1"}).status_code == 401

        async def main():
            remote = RemoteEnv(url, token, timeout=10)
            obs = await remote.reset("c/1")
            assert obs.app == "Counter"
            await remote.close()

        asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_up(url: str, proc, timeout: float, died) -> None:
    """Until ``url/health`` answers 200; fails with ``died()`` if the server process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, died()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.1)


@pytest.mark.parametrize("render", [True, False])
def test_cli_env_serve_render_serves_screenshots(render):
    """`mobilerl env serve --render` as operators start it: the simulator's observations carry PNG screenshots."""
    import base64
    import subprocess
    import sys

    port = _free_port()
    env = {**os.environ, "MOBILERL_ENV_TOKEN": TOKEN}
    args = ["--port", str(port), "--backend", "sim", "--size", "1", "--no-isolate", *(["--render"] if render else [])]
    proc = subprocess.Popen([sys.executable, "-m", "mobilerl.cli", "env", "serve", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_up(url, proc, 60, lambda: f"env serve exited with {proc.returncode}")
        r = httpx.post(f"{url}/reset", json={"task": "world/test/CameraTakePhoto/0"}, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        shot = r.json()["observation"]["screenshot_png_b64"]
        if render:
            assert base64.b64decode(shot).startswith(b"\x89PNG\r\n\x1a\n")
        else:
            assert shot is None
    finally:
        proc.terminate()
        proc.wait(10)
