"""Episodes spread over many env servers (simulator servers, AVD workers) on many hosts.

    servers = EnvServers(["http://10.1.0.5:8765", "http://10.1.0.6:8765"])   # token: $MOBILERL_ENV_TOKEN
    trajs = await evaluate(policy_factory, tasks, env_servers=servers)       # the episode runner, as ever
    servers.take_stats()                                                      # per-server figures, then reset

The pieces are the existing ones: :class:`~mobilerl.env.server.RemoteEnv` talks to one server,
:class:`~mobilerl.env.pool.EnvPool` leases slots to episodes and replaces a slot that crashed. Here a slot is a
:class:`RoutedEnv`, which opens a session on the server with the most free capacity at every ``reset`` and closes
it after ``evaluate`` (so a server's workers are held by running episodes only), and :class:`ServerPool` is the
EnvPool that starts and stops the servers' health checks with the round.

What a failure does (an env failure is never a reward of 0: the episode ends ``error="env: ..."``, and RL drops it):

- **reset** fails (transport error, 5xx, a lost session): the reset is retried on another server, up to
  ``reset_attempts`` servers. A server that answers "no free worker" (503) is busy, not broken: tried elsewhere
  without counting against its health.
- **step / evaluate** fail: the device state lives on the failed server, so the call can only be retried on a
  fresh env by *replaying* the episode — reset to the task on another server, the episode's actions again, and
  the call — and only when the replayed screen equals the one the agent saw (``replay``). The simulator is
  deterministic in the task, so its episodes survive a dead server; a real device's screen differs (clock,
  animations) and the episode fails as an env error.
- **health**: every ``health_interval_s`` each server's ``GET /health`` is probed (down ones too), and a failed call
  probes its server at once. A server whose probe fails, or whose calls failed ``max_failures`` times in a row, is
  marked down and gets no new episodes; a probe that answers brings it back (a restarted or replaced server
  rejoins by itself). At the start of a round every server is probed and the token is checked on the live ones.
- **capacity**: a server's capacity is its ``/health`` ``size`` (env workers) times ``share`` (the slice of it this
  process may use, e.g. ``1/processes`` when several rollout processes share the servers). The pool has at most
  as many slots as the live servers' capacity, so episodes queue here, not on a server.

Who starts, places and restarts the servers is not this module's business: Ray does with ``rl.cluster: ray``
(:mod:`mobilerl.rl.ray_cluster`: an actor a server, restarted on its port), compose's restart policy on one host,
an operator otherwise; here a server is a URL. What stays here is what no process manager can do, because it is
about calls in flight: which server takes the next episode (the one with the most free capacity), whether a
server answers (Ray may hold an actor alive whose server hangs, and learns of a crash after its calls failed), and
an episode cut short when its server dies, replayed on another env; Ray restarts the process, not the device's
state.

Per-server figures (:meth:`EnvServers.take_stats`, :func:`server_metrics`): episodes, resets, steps, failures,
busy answers, replays, times marked down and back, up at the end, and the step latency (mean, p95).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field

from mobilerl.env.actions import Action
from mobilerl.env.base import EnvCrashed, EnvError, Observation, StepResult, TaskSpec
from mobilerl.env.pool import EnvPool
from mobilerl.env.server import TOKEN_ENV, EnvServerBusy, RemoteEnv

log = logging.getLogger(__name__)


class EnvServersConfig(BaseModel):
    """How the rollouts use a list of env servers (``rl.env_pool``)."""

    model_config = ConfigDict(extra="forbid")

    token_env: str = Field(TOKEN_ENV, description="Environment variable holding the servers' bearer token.")
    request_timeout_s: float = Field(60.0, gt=0, description="Seconds one HTTP call to a server may take.")
    health_interval_s: float = Field(10.0, gt=0, description="Seconds between health probes of every server.")
    health_timeout_s: float = Field(5.0, gt=0, description="Seconds a health probe may take before it fails.")
    max_failures: int = Field(3, ge=1, description="Failed calls in a row that mark a server down.")
    reset_attempts: int = Field(3, ge=1, description="Servers tried for one reset before the episode fails.")
    replay: bool = Field(True, description=(
        "Retry a failed step/evaluate on a fresh env by replaying the episode; kept only if the screen matches."))
    replay_attempts: int = Field(1, ge=0, description="Fresh envs tried by replay for one failed call.")
    wait_for_server_s: float = Field(60.0, ge=0, description=(
        "Seconds a round's start (or a reset) waits for some server to be up before failing."))


def check_server_urls(urls: Sequence[str], key: str = "rl.env_servers") -> list[str]:
    """``http(s)://host:port`` URLs, each once; a clear error naming ``key`` otherwise."""
    if not urls:
        raise ValueError(f"{key}: empty list; leave it null to run the in-process simulator")
    out: list[str] = []
    for u in urls:
        parts = urlsplit(str(u))
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(f"{key}: {u!r} is not an http(s)://host:port URL")
        url = str(u).rstrip("/")
        if url in out:
            raise ValueError(f"{key}: {u!r} is listed twice")
        out.append(url)
    return out


def server_name(url: str) -> str:
    """A metric-safe label of a server: ``http://10.1.0.5:8765`` → ``10_1_0_5_8765``."""
    parts = urlsplit(url)
    return re.sub(r"[^A-Za-z0-9-]", "_", f"{parts.hostname}_{parts.port}")


@dataclass
class ServerState:
    """One server as this process sees it: health, capacity, in-flight episodes and this round's figures."""

    url: str
    name: str
    up: bool = False
    capacity: float = 0.0  # the server's workers x share; known after the first good probe
    in_flight: int = 0  # sessions this process holds there
    consecutive: int = 0  # failed calls in a row
    last_error: str = ""
    probing: bool = False
    # this round's figures (take_stats resets them)
    episodes: int = 0
    resets: int = 0
    steps: int = 0
    failures: int = 0
    busy: int = 0
    replays: int = 0
    downs: int = 0
    recoveries: int = 0
    step_latency_s: list[float] = field(default_factory=list)

    @property
    def free(self) -> float:
        return self.capacity - self.in_flight


_FIGURES = ("episodes", "resets", "steps", "failures", "busy", "replays", "downs", "recoveries")


class EnvServers:
    """The servers a process's rollouts run on: health, placement and figures; persists across rounds.

    Args:
        urls: ``http(s)://host:port`` of each server.
        config: timeouts, health checks, retries (:class:`EnvServersConfig`).
        share: the part of each server's capacity this process may fill (``1/processes`` for several
            rollout processes over the same servers).
        token: the bearer token (default: the ``config.token_env`` environment variable).
        transport: an httpx transport for every connection (tests).
    """

    def __init__(self, urls: Sequence[str], config: EnvServersConfig | None = None, *, share: float = 1.0,
                 token: str | None = None, transport: httpx.AsyncBaseTransport | None = None):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.config = config or EnvServersConfig()
        self.servers = [ServerState(u, server_name(u)) for u in check_server_urls(urls)]
        self.share = share
        self.token = token or os.environ.get(self.config.token_env) or ""
        if not self.token:
            raise ValueError(f"env servers need a token: set ${self.config.token_env}")
        self.transport = transport
        self._client: httpx.AsyncClient | None = None
        self._monitor: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self._changed: asyncio.Event | None = None  # set whenever a server comes up
        self._rr = 0

    # -- lifecycle (once per event loop: a round) ------------------------------------------------------------

    async def start(self) -> None:
        """Probe every server, wait (``wait_for_server_s``) until one is up, check the token, start the monitor."""
        self._client = httpx.AsyncClient(timeout=self.config.health_timeout_s, transport=self.transport)
        self._changed = asyncio.Event()
        for s in self.servers:
            s.in_flight = 0  # the previous round's pool closed every session it had
        try:
            deadline = time.monotonic() + self.config.wait_for_server_s
            await self.probe_all()
            while not self.up and time.monotonic() < deadline:
                await asyncio.sleep(min(1.0, self.config.health_interval_s))
                await self.probe_all()
            if not self.up:
                raise EnvError("no env server is up: " + "; ".join(
                    f"{s.url}: {s.last_error or 'no answer'}" for s in self.servers))
            await self._check_token()
        except BaseException:
            await self.stop()
            raise
        self._monitor = asyncio.create_task(self._monitor_loop(), name="env-servers-health")

    async def stop(self) -> None:
        tasks = [t for t in (self._monitor, *self._background) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._monitor = None
        self._background.clear()
        for s in self.servers:
            s.probing = False
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def pool(self, size: int, **kwargs: Any) -> ServerPool:
        """An :class:`EnvPool` of up to ``size`` routed slots over these servers (sized at start)."""
        return ServerPool(self, size, **kwargs)

    @property
    def up(self) -> list[ServerState]:
        return [s for s in self.servers if s.up]

    @property
    def capacity(self) -> float:
        """Episodes the live servers can run at once for this process."""
        return sum(s.capacity for s in self.up)

    # -- health --------------------------------------------------------------------------------------------

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(s) for s in self.servers))

    async def probe(self, server: ServerState, revive: bool = True) -> bool:
        """``GET /health``: a server that does not answer is marked down; one that answers has its capacity
        refreshed and, with ``revive``, is brought back if it was down. Never raises."""
        assert self._client is not None, "EnvServers.start() first"
        try:
            resp = await self._client.get(server.url + "/health")
            resp.raise_for_status()
            size = int(resp.json()["size"])
        except Exception as e:  # noqa: BLE001 - any failure to answer is "down"
            self._mark_down(server, f"health probe failed: {type(e).__name__}: {e}")
            return False
        server.capacity = max(size, 1) * self.share
        if not server.up and revive:
            if server.last_error:  # it was down: a restarted or replaced server rejoins
                server.recoveries += 1
                log.warning("env server %s is back (%d workers)", server.url, size)
            server.up = True
            server.last_error = ""
            server.consecutive = 0
            if self._changed is not None:
                self._changed.set()
        return True

    async def _check_token(self) -> None:
        assert self._client is not None
        for s in self.up:
            try:
                resp = await self._client.get(s.url + "/stats", headers={"Authorization": f"Bearer {self.token}"})
            except httpx.TransportError:
                continue  # it went down meanwhile: the monitor sees to it
            if resp.status_code == 401:
                raise EnvError(f"env server {s.url} rejects the token in ${self.config.token_env}")

    async def _monitor_loop(self) -> None:
        while True:
            # all down: probe every second, so that a round stalls no longer than it must
            await asyncio.sleep(self.config.health_interval_s if self.up else min(1.0, self.config.health_interval_s))
            await self.probe_all()

    def _mark_down(self, server: ServerState, why: str) -> None:
        server.last_error = why
        if server.up:
            server.up = False
            server.downs += 1
            log.warning("env server %s marked down: %s", server.url, why)

    def failed(self, server: ServerState, err: BaseException) -> None:
        """A call to ``server`` failed: count it, probe the server now, mark it down after ``max_failures``."""
        server.failures += 1
        server.consecutive += 1
        if server.consecutive >= self.config.max_failures:
            self._mark_down(server, f"{server.consecutive} failed calls in a row, last: {err}")
        elif server.up and not server.probing and self._client is not None:
            server.probing = True

            async def probe() -> None:
                try:  # only to see whether it is gone: a server down by its calls waits for the periodic probe
                    await self.probe(server, revive=False)
                finally:
                    server.probing = False

            task = asyncio.create_task(probe(), name=f"env-probe-{server.name}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def succeeded(self, server: ServerState) -> None:
        server.consecutive = 0

    # -- placement -----------------------------------------------------------------------------------------

    async def choose(self, exclude: set[str] | frozenset[str] = frozenset()) -> ServerState | None:
        """The live server with the most free capacity (ties in turn), not in ``exclude``; waits up to
        ``wait_for_server_s`` while none is up. None when every live server is excluded."""
        deadline = time.monotonic() + self.config.wait_for_server_s
        while not self.up and self._changed is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        candidates = [s for s in self.up if s.url not in exclude]
        if not candidates:
            return None
        self._rr += 1
        n = len(self.servers)
        order = {s.url: (i - self._rr) % n for i, s in enumerate(self.servers)}
        return max(candidates, key=lambda s: (s.free, -order[s.url]))

    # -- figures -------------------------------------------------------------------------------------------

    def take_stats(self) -> dict[str, dict[str, Any]]:
        """This round's figures per server name (and reset them): counts, ``up``, ``url``, the step latencies."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.servers:
            out[s.name] = {**{k: getattr(s, k) for k in _FIGURES}, "up": int(s.up), "url": s.url,
                           "step_latency_s": list(s.step_latency_s)}
            for k in _FIGURES:
                setattr(s, k, 0)
            s.step_latency_s.clear()
        return out


def merge_stats(parts: Sequence[dict[str, dict[str, Any]] | None]) -> dict[str, dict[str, Any]]:
    """Several processes' :meth:`EnvServers.take_stats` as one: counts add up, latencies join, a server is up
    only if every process saw it up."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, st in (part or {}).items():
            acc = out.setdefault(name, {**{k: 0 for k in _FIGURES}, "up": 1, "url": st["url"], "step_latency_s": []})
            for k in _FIGURES:
                acc[k] += st[k]
            acc["up"] = min(acc["up"], st["up"])
            acc["step_latency_s"] += st["step_latency_s"]
    return out


def server_metrics(stats: dict[str, dict[str, Any]], prefix: str = "envs") -> dict[str, float]:
    """MLflow metrics of a round: ``envs/<server>/<figure>`` for every server, ``envs/up`` and ``envs/failures``."""
    m: dict[str, float] = {}
    for name, st in stats.items():
        for k in _FIGURES:
            m[f"{prefix}/{name}/{k}"] = float(st[k])
        m[f"{prefix}/{name}/up"] = float(st["up"])
        lat = sorted(st["step_latency_s"])
        if lat:
            m[f"{prefix}/{name}/step_latency_mean_s"] = sum(lat) / len(lat)
            m[f"{prefix}/{name}/step_latency_p95_s"] = lat[min(len(lat) - 1, math.ceil(0.95 * len(lat)) - 1)]
    if stats:
        m[f"{prefix}/up"] = float(sum(st["up"] for st in stats.values()))
        m[f"{prefix}/failures"] = float(sum(st["failures"] for st in stats.values()))
    return m


# -- a pool slot -----------------------------------------------------------------------------------------------


class RoutedEnv:
    """One pool slot: an :class:`~mobilerl.env.base.AsyncEnv` whose episode runs on a server chosen at reset.

    It keeps the episode's task, actions and last screen, so a failed step or evaluate can be retried on a fresh
    env by replay (see the module docstring). Raises :class:`EnvCrashed` when a call cannot be completed
    anywhere, :class:`EnvError` for the caller's errors (an unknown task, a bad token).
    """

    def __init__(self, servers: EnvServers):
        self.servers = servers
        self.server: ServerState | None = None
        self.remote: RemoteEnv | None = None
        self.session: str | None = None  # the server's session id, kept even when the client dropped it
        self.task: TaskSpec | str | None = None
        self.actions: list[Action] = []
        self.last_xml: str | None = None

    # the AsyncEnv protocol ----------------------------------------------------------------------------------

    async def reset(self, task: TaskSpec | str) -> Observation:
        await self._leave()
        self.task, self.actions, self.last_xml = task, [], None
        obs = await self._open(task, exclude=set(), attempts=self.servers.config.reset_attempts, what="reset")
        self.last_xml = obs.xml
        return obs

    async def step(self, action: Action) -> StepResult:
        result: StepResult = await self._call(lambda env: env.step(action), "step")
        self.actions.append(action)
        self.last_xml = result.observation.xml
        return result

    async def evaluate(self) -> float | None:
        reward = await self._call(lambda env: env.evaluate(), "evaluate")
        await self._leave()  # the episode is over: free the server's worker for the next one
        return reward

    async def close(self) -> None:
        await self._leave()

    # internals ---------------------------------------------------------------------------------------------

    def _task_id(self) -> str:
        return self.task.task_id if isinstance(self.task, TaskSpec) else str(self.task)

    async def _open(self, task: TaskSpec | str, exclude: set[str], attempts: int, what: str) -> Observation:
        """A fresh session on the best server not in ``exclude``, reset to ``task``; tries ``attempts`` servers."""
        errors: list[str] = []
        for _ in range(attempts):
            server = await self.servers.choose(exclude)
            if server is None:
                break
            exclude.add(server.url)
            remote = RemoteEnv(server.url, self.servers.token, timeout=self.servers.config.request_timeout_s,
                               transport=self.servers.transport)
            server.in_flight += 1
            try:
                obs = await remote.reset(task)
            except EnvServerBusy as e:
                server.busy += 1
                errors.append(f"{server.url}: {e}")
            except EnvCrashed as e:
                self.servers.failed(server, e)
                errors.append(f"{server.url}: {e}")
            except BaseException:
                server.in_flight -= 1
                await remote.close()
                raise
            else:
                server.resets += 1
                if what == "reset":
                    server.episodes += 1
                self.servers.succeeded(server)
                self.server, self.remote, self.session = server, remote, remote.session
                return obs
            server.in_flight -= 1
            await remote.close()
        tried = "; ".join(errors) or "no live env server left to try"
        raise EnvCrashed(f"{what} of {self._task_id()} failed on every env server tried: {tried}")

    async def _call(self, fn: Any, what: str, replays_left: int | None = None) -> Any:
        if self.remote is None or self.server is None:
            raise EnvError("no active episode: call reset() first")
        cfg = self.servers.config
        if replays_left is None:
            replays_left = cfg.replay_attempts if cfg.replay else 0
        server = self.server
        t0 = time.perf_counter()
        try:
            out = await fn(self.remote)
        except EnvCrashed as e:
            self.servers.failed(server, e)
            await self._leave()
            if replays_left <= 0 or self.task is None:
                raise EnvCrashed(f"{what} failed on {server.url}: {e}") from e
            await self._replay(what, server, e)
            return await self._call(fn, what, replays_left - 1)
        self.servers.succeeded(server)
        if what == "step":
            server.steps += 1
            server.step_latency_s.append(time.perf_counter() - t0)
        return out

    async def _replay(self, what: str, failed: ServerState, err: EnvCrashed) -> None:
        """A fresh env on another server, reset to the episode's task, its actions stepped again; raises
        ``EnvCrashed`` when no server can, or when the screen it ends on is not the one the agent saw."""
        assert self.task is not None
        obs = await self._open(self.task, {failed.url}, self.servers.config.reset_attempts, "replay")
        server = self.server
        assert server is not None and self.remote is not None
        server.replays += 1
        try:
            for a in self.actions:
                obs = (await self.remote.step(a)).observation
                server.steps += 1
        except EnvCrashed as e:
            self.servers.failed(server, e)
            await self._leave()
            raise EnvCrashed(f"{what} failed on {failed.url} ({err}); its replay failed on {server.url}: {e}") from e
        if obs.xml != self.last_xml:
            await self._leave()
            raise EnvCrashed(f"{what} failed on {failed.url} ({err}); replaying the episode on {server.url} gave "
                             "a different screen, so it cannot go on") from err
        log.info("episode of %s replayed on %s after its %s failed on %s", self._task_id(), server.url, what,
                 failed.url)

    async def _leave(self) -> None:
        """Close this slot's session (if any), best effort."""
        remote, server, session = self.remote, self.server, self.session
        self.remote = self.server = self.session = None
        if server is not None:
            server.in_flight -= 1
        if remote is not None:
            # after a 5xx the client forgets its session, but the server may still hold a worker for it
            remote.session = remote.session or session
            with contextlib.suppress(Exception):
                await asyncio.wait_for(remote.close(), self.servers.config.health_timeout_s)


class ServerPool(EnvPool):
    """The :class:`EnvPool` over :class:`EnvServers`: starts and stops their health checks with itself and has
    at most as many slots as the live servers' capacity (at least one).

    Slots call servers through their own timed HTTP calls, so the pool adds no call timeout of its own
    (``call_timeout=None``): a replay may take longer than any one call.
    """

    def __init__(self, servers: EnvServers, size: int, **kwargs: Any):
        kwargs.setdefault("call_timeout", None)
        super().__init__(lambda: RoutedEnv(servers), size, **kwargs)
        self.servers = servers

    async def start(self) -> None:
        await self.servers.start()
        self.size = max(1, min(self.size, math.floor(self.servers.capacity + 1e-9)))
        try:
            await super().start()
        except BaseException:
            await self.servers.stop()
            raise

    async def close(self, timeout: float = 10.0) -> None:
        try:
            await super().close(timeout)
        finally:
            await self.servers.stop()


__all__ = [
    "EnvServers",
    "EnvServersConfig",
    "RoutedEnv",
    "ServerPool",
    "ServerState",
    "check_server_urls",
    "merge_stats",
    "server_metrics",
    "server_name",
]
