"""The asynchronous mode's rollout side over remote engines (``rl.async`` with ``rl.engines``; the loop is
:mod:`mobilerl.rl.async_loop`, the slots :func:`mobilerl.rl.async_workers.serve`)::

    trainer thread   publish v: the weights to every live engine (rl.weight_sync, under gathered()), then the
                     slots take version v; while it waits for groups, an engine that is back gets the current
                     weights and rejoins
    rollout thread   one event loop, rl.rollout_concurrency × engines slots over the env pool (env servers or the
                     simulator); an episode's model calls all go to one engine (its prompts share prefixes there),
                     the live one with the fewest requests in flight when the episode makes its first call

Faults. An engine that cannot be reached (after one retry of the client) or that answers with older weights than
the episode's (restarted since its last push) is marked down at once: its episodes end with error kind
``engine`` and run again elsewhere (``rl.async.reruns``); episodes wait up to ``rl.async.engine_wait_s`` for a
live engine. A down engine is probed (``GET /health``) whenever the trainer publishes or waits; one that answers
gets the current weights before it takes an episode again, so a restarted engine serves the run's current
version. Each engine has a weight sync of its own (broadcast: a group each, so a killed engine breaks its own
group only and the next push to it forms a new one, ``rl.sync_address``'s port + i when fixed; reload: one file
for all, written once a push), so a push to the live engines never waits on a dead one.

Versions. An episode records the version published when it started; every completion it gets must report that
version or a newer one (a version is published after every live engine holds it), and :meth:`FleetEngine.annotate`
then records the oldest version that sampled it (exact, never under-counting staleness) and its engine
(``meta["engine"]``). Figures a round (:meth:`EngineFleet.take_stats`): ``engines/<engine>/busy_s`` (seconds with
a request of ours in flight), ``requests``, ``failures``, ``downs``, ``rejoins``, ``up``, ``version`` (the weights it
holds, -1 when down), ``push_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mobilerl.env.cluster import EnvServers, server_metrics, server_name
from mobilerl.models.generation import ChatRequest, EngineUnavailable, Generation, SamplingConfig
from mobilerl.models.weight_sync import ReloadSync, WeightSync, WeightSyncError, engine_url, make_weight_sync
from mobilerl.rl.async_workers import Workers, serve

log = logging.getLogger(__name__)


@dataclass
class EngineState:
    """One engine as the trainer sees it: live (holds the current weights and takes episodes) or down."""

    url: str
    name: str
    up: bool = False
    epoch: int = 0  # times it came up: an episode bound to an earlier epoch cannot go on there
    version: int | None = None  # the weights this run last pushed to it (None: none since it went down)
    in_flight: int = 0
    error: str = ""
    since: float = 0.0  # when its requests in flight went from 0 to 1
    # this round's figures (take_stats resets them)
    busy_s: float = 0.0
    requests: int = 0
    failures: int = 0
    downs: int = 0
    rejoins: int = 0
    push_s: float = 0.0


_FIGURES = ("busy_s", "requests", "failures", "downs", "rejoins", "push_s")


class EngineFleet:
    """The engines' health, placement and weights, shared by the rollout thread (placement, failures) and the
    trainer thread (pushes, rejoins) under one lock; ``syncs`` has one :class:`WeightSync` an engine URL."""

    def __init__(self, urls: Sequence[str], syncs: dict[str, WeightSync], *, api_key: str | None = None,
                 timeout_s: float = 300.0, probe_timeout_s: float = 5.0, wait_s: float = 300.0,
                 concurrency: int = 64) -> None:
        self.engines = [EngineState(engine_url(u), server_name(engine_url(u))) for u in urls]
        self.syncs = {engine_url(u): s for u, s in syncs.items()}
        self.api_key, self.timeout_s, self.wait_s, self.concurrency = api_key, timeout_s, wait_s, concurrency
        self.lock = threading.Lock()
        self.version: int | None = None  # what the live engines hold: the trainer's current weights
        self._probe = httpx.Client(timeout=probe_timeout_s)
        self._loads = ThreadPoolExecutor(max(1, len(self.engines)), thread_name_prefix="mobilerl-engine-load")
        self._clients: dict[str, Any] = {}
        self._stale: list[Any] = []  # clients of engines that went down, closed with the others

    # -- the trainer's thread ------------------------------------------------------------------------------

    def push(self, model: Any, version: int, gathered: Callable[[], Any]) -> None:
        """Every live engine, and every down one that answers its probe, holds ``version`` when this returns
        (those whose push fails are marked down); then ``version`` is the fleet's current one."""
        self._push(model, version, gathered, [e for e in self.engines if e.up or self._answers(e)])
        self.version = version

    def rejoin(self, model: Any, gathered: Callable[[], Any]) -> None:
        """Down engines that answer get the current weights and take episodes again (``model`` must be the
        current version: called while the trainer's weights do not change)."""
        back = [e for e in self.engines if not e.up and self._answers(e)]
        if back and self.version is not None:
            self._push(model, self.version, gathered, back)

    def _answers(self, e: EngineState) -> bool:
        try:
            return self._probe.get(e.url.removesuffix("/v1") + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _push(self, model: Any, version: int, gathered: Callable[[], Any], targets: list[EngineState]) -> None:
        if not targets:
            return
        with gathered():
            path = None
            for e in list(targets):  # reload: one file for every engine, written by a sync whose engine answers
                sync = self.syncs[e.url]
                if not isinstance(sync, ReloadSync) or path is not None:
                    continue
                try:
                    path = sync.write(model, version)
                except WeightSyncError as err:
                    self.failed(e, err)
                    targets.remove(e)

            def one(e: EngineState) -> tuple[EngineState, float, BaseException | None]:
                t0 = time.perf_counter()
                try:
                    sync = self.syncs[e.url]
                    sync.load(path, version) if isinstance(sync, ReloadSync) else sync.push(model, version)
                except WeightSyncError as err:
                    return e, time.perf_counter() - t0, err
                return e, time.perf_counter() - t0, None

            # file loads run at once on every engine; broadcasts one after another (one NCCL group at a time)
            reload = path is not None
            results = list(self._loads.map(one, targets)) if reload else [one(e) for e in targets]
        for e, seconds, err in results:
            if err is not None:
                self.failed(e, err)
                continue
            with self.lock:
                e.push_s += seconds
                e.version = version
                if not e.up:
                    e.rejoins += int(e.epoch > 0)
                    e.up, e.epoch, e.error = True, e.epoch + 1, ""
                    if e.epoch > 1:
                        log.warning("engine %s is back with weights v%d", e.url, version)

    # -- the rollout thread --------------------------------------------------------------------------------

    def failed(self, e: EngineState, err: BaseException | str) -> None:
        """Mark ``e`` down after a failed call or push: it takes no episode until it answers and is pushed again."""
        with self.lock:
            e.failures += 1
            e.error = str(err)
            if e.up:
                e.up, e.version = False, None
                e.downs += 1
                log.warning("engine %s marked down: %s", e.url, err)
            if e.url in self._clients:  # what comes back may be another process: nothing of this one is kept
                self._stale.append(self._clients.pop(e.url))

    async def choose(self) -> EngineState:
        """The live engine with the fewest requests in flight; waits ``wait_s`` for one."""
        deadline = time.monotonic() + self.wait_s
        while True:
            with self.lock:
                live = [e for e in self.engines if e.up]
                if live:
                    return min(live, key=lambda e: (e.in_flight, e.requests))
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"no live engine with the current weights for {self.wait_s:.0f} s: " + "; ".join(
                    f"{e.url}: {e.error or 'down'}" for e in self.engines))
            await asyncio.sleep(0.05)

    @contextlib.contextmanager
    def busy(self, e: EngineState) -> Iterator[None]:
        with self.lock:
            if e.in_flight == 0:
                e.since = time.perf_counter()
            e.in_flight += 1
            e.requests += 1
        try:
            yield
        finally:
            with self.lock:
                e.in_flight -= 1
                if e.in_flight == 0:
                    e.busy_s += time.perf_counter() - e.since

    def client(self, e: EngineState) -> Any:
        """The rollout thread's HTTP client of ``e`` (one retry: another engine takes the episode instead)."""
        from mobilerl.models.openai_backend import OpenAIBackend

        with self.lock:
            if e.url not in self._clients:
                self._clients[e.url] = OpenAIBackend(e.url, api_key=self.api_key, timeout=self.timeout_s,
                                                     max_retries=1, backoff_s=0.2, max_concurrency=self.concurrency,
                                                     name="adagrpo")
            return self._clients[e.url]

    async def aclose_clients(self) -> None:
        with self.lock:
            clients, self._clients, self._stale = [*self._clients.values(), *self._stale], {}, []
        for c in clients:
            await c.aclose()

    # -- figures -------------------------------------------------------------------------------------------

    def take_stats(self) -> dict[str, float]:
        """This round's ``engines/<engine>/<figure>`` and ``engines/up`` (and reset the figures)."""
        m: dict[str, float] = {}
        now = time.perf_counter()
        with self.lock:
            for e in self.engines:
                if e.in_flight:  # the time busy so far counts in this round
                    e.busy_s, e.since = e.busy_s + now - e.since, now
                m |= {f"engines/{e.name}/{k}": float(getattr(e, k)) for k in _FIGURES}
                m[f"engines/{e.name}/up"] = float(e.up)
                m[f"engines/{e.name}/version"] = float(-1 if e.version is None else e.version)  # -1: down
                for k in _FIGURES:
                    setattr(e, k, type(getattr(e, k))(0))
            m["engines/up"] = float(sum(e.up for e in self.engines))
        return m

    def close(self) -> None:
        self._loads.shutdown(wait=False, cancel_futures=True)
        self._probe.close()
        for s in self.syncs.values():
            s.close()


class EpisodeBackend:
    """One episode's generation backend: the engine chosen at its first call, every completion checked to be
    sampled by weights no older than ``start`` (the version published when the episode began)."""

    name = "adagrpo"

    def __init__(self, fleet: EngineFleet, start: int) -> None:
        self.fleet, self.start = fleet, start
        self.engine: EngineState | None = None
        self.epoch = 0
        self.versions: list[int] = []

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        f = self.fleet
        if self.engine is None:
            self.engine = await f.choose()
            self.epoch = self.engine.epoch
        e = self.engine
        if not e.up or e.epoch != self.epoch:
            raise EngineUnavailable(f"engine {e.url} went down during the episode: {e.error}")
        with f.busy(e):
            try:
                gens = await f.client(e).generate(requests, sampling)
            except EngineUnavailable as err:
                f.failed(e, err)
                raise
        for g in gens:
            v = int(g.policy_version) if g.policy_version is not None and g.policy_version.lstrip("-").isdigit() else -1
            if v < self.start:  # restarted since its push (or a load broke off: -1): not the weights asked for
                err = EngineUnavailable(f"engine {e.url} sampled with weights version {g.policy_version}, older than "
                                        f"the episode's {self.start}")
                f.failed(e, err)
                raise err
            self.versions.append(v)
        return gens


class FleetEngine:
    """The :class:`~mobilerl.rl.async_workers.Engine` of the rollout thread: a policy per episode over an
    :class:`EpisodeBackend`; a published version is already on the engines (the trainer pushed it)."""

    def __init__(self, fleet: EngineFleet, policy: Any, version: int = 0) -> None:
        self.fleet, self._policy, self.version = fleet, policy, version

    def policy(self, seed: int) -> Any:
        return dataclasses.replace(self._policy, backend=EpisodeBackend(self.fleet, self.version),
                                   version=str(self.version)).with_seed(seed)

    async def load(self, version: int, path: str) -> None:
        self.version = version

    def annotate(self, policy: Any, traj: Any) -> None:
        b = policy.backend
        if b.versions:
            traj.policy_version = str(min(b.versions))
        if b.engine is not None:
            traj.meta["engine"] = b.engine.url


class RemoteWorkers(Workers):
    """The rollout side over an :class:`EngineFleet`: one thread with the slots, the trainer's ``model`` pushed
    (inside ``gathered()``) at every publish and to rejoining engines while it waits."""

    pushes_weights = True

    def __init__(self, fleet: EngineFleet, policy: Any, envs: Any, slots: int, model: Any,
                 gathered: Callable[[], Any] = contextlib.nullcontext, reruns: int = 0,
                 screens: str | Path | None = None, probe_interval_s: float = 1.0) -> None:
        super().__init__()
        self.fleet, self.model, self.gathered, self.envs = fleet, model, gathered, envs
        self.screens = None if screens is None else Path(screens)
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.probe_interval_s, self._probed = probe_interval_s, 0.0

        async def main() -> None:
            try:
                await serve(FleetEngine(fleet, policy), envs, slots, self.jobs, self.results, self.published,
                            self.stop, call_timeout=None, reruns=reruns, screens=self.screens)
            finally:
                await fleet.aclose_clients()

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as e:  # noqa: BLE001 - reported to the trainer by check()
                self.errors.append(e)

        self.thread = threading.Thread(target=run, name="mobilerl-rollout-engines", daemon=True)
        self.thread.start()

    def publish(self, version: int, path: str | Path) -> None:
        self.fleet.push(self.model, version, self.gathered)
        super().publish(version, path)

    def idle(self) -> None:
        if time.monotonic() - self._probed >= self.probe_interval_s:
            self._probed = time.monotonic()
            self.fleet.rejoin(self.model, self.gathered)

    def metrics(self) -> dict[str, float]:
        envs = server_metrics(self.envs.take_stats()) if isinstance(self.envs, EnvServers) else {}
        return {**self.fleet.take_stats(), **envs}

    def check(self) -> None:
        if self.errors:
            raise RuntimeError(f"the rollout thread failed: {self.errors[0]!r}") from self.errors[0]
        if not self.stop.is_set() and not self.thread.is_alive():
            raise RuntimeError("the rollout thread ended")

    def close(self) -> None:
        self.halt()
        self.thread.join(timeout=30)
        self.fleet.close()


def remote_workers(cfg: Any, spec: Any, trainer: Any, work: Path) -> RemoteWorkers:
    """:class:`RemoteWorkers` for an :class:`~mobilerl.rl.config.RLConfig` with ``async`` and ``engines`` set: a
    weight sync an engine (the reload file in ``work/weights``, on a filesystem the engines share), episodes on
    ``rl.env_servers`` or the in-process simulator, screenshots kept in ``work/screens`` when the mode shows them."""
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.env.factory import make_env, renders
    from mobilerl.env.pool import InlineEnv
    from mobilerl.rl.engine import engines_api_key
    from mobilerl.rl.rollout import kept_screens

    api_key = engines_api_key(cfg)
    host, _, port = cfg.sync_address.rpartition(":")
    syncs = {u: make_weight_sync(cfg.weight_sync, [u], directory=work / "weights", api_key=api_key,
                                 address=f"{host}:{int(port) + i if int(port) else 0}")
             for i, u in enumerate(cfg.engines)}
    fleet = EngineFleet(cfg.engines, syncs, api_key=api_key, wait_s=cfg.async_.engine_wait_s,
                        concurrency=spec.concurrency)
    sampling = SamplingConfig(temperature=spec.temperature, max_new_tokens=spec.max_new_tokens, seed=0)
    policy = ModelPolicy(EpisodeBackend(fleet, 0), obs_mode=spec.obs_mode, name="adagrpo", reasoning=spec.reasoning,
                         max_history=spec.max_history, prompt_style=spec.prompt_style, coords=spec.coords,
                         reuse_greedy=False, sampling=sampling)
    envs = (EnvServers(cfg.env_servers, cfg.env_pool) if cfg.env_servers
            else (lambda: InlineEnv(make_env("sim", obs_mode=spec.obs_mode))))
    return RemoteWorkers(fleet, policy, envs, spec.concurrency * len(cfg.engines), trainer.model, trainer.gathered,
                         cfg.async_.reruns, kept_screens(cfg, work)[0] if renders(spec.obs_mode) else None)
