"""``rl.cluster: ray``: Ray launches, places and restarts the `rl` stage's processes; the stage talks to them as ever.

    ray start --head --num-gpus 8                                          # a head node (also: ray up)
    ray start --address HEAD:6379 --resources '{"avd": 16}'                # an env host with 16 AVD slots
    prefect deployment run mobilerl/full --param cluster=ray               # or: ray job submit -- python -m pipelines.run --cluster ray

What runs where (``rl.ray``, :class:`~mobilerl.rl.config.RayConfig`):

- **rollout engines** (``rl.ray.engines``): ``count`` actors, each with ``resources`` (``{"GPU": 1}``), in a
  placement group of their own, each running ``python -m mobilerl.models.serve_openai --weight-sync`` (vLLM on a
  GPU, the HF engine on a CPU), the command of the rollout image;
- **env servers** (``rl.ray.env_servers``): ``count`` actors, each with ``resources`` (a custom ``avd`` resource the
  env hosts declare), spread over the nodes that have it, each running ``mobilerl env serve`` (the simulator, or
  ``adb`` next to an AVD);
- **AndroidWorld servers** (``rl.ray.androidworld``): ``count`` actors, like the env servers, each running the
  ``command`` given (AndroidWorld's ``server/android_server.py`` next to its emulator), for ``rl.suite androidworld``;
- **trainer ranks** (``rl.ray.trainer``): rank 0 is this process (the driver, which runs the loop and logs to
  MLflow; ``ray job submit --entrypoint-num-gpus 1`` gives it its GPU); ranks 1 … N−1 are actors in a placement
  group apart from the engines', joined to rank 0's torch.distributed group (``rl.trainer_backend`` ddp or
  deepspeed), never restarted: a rank lost ends the run, which resumes from its last checkpoint.

Their addresses go into ``rl.engines``, ``rl.env_servers`` and ``rl.androidworld.urls``, and from there the same code paths as servers
started by hand (:mod:`mobilerl.rl.engine`, :mod:`mobilerl.rl.async_engines`, :mod:`mobilerl.env.cluster`):
the HTTP protocols, the weight sync, the health checks and the replay of an episode whose server died.

Restarts. A server actor owns its server process (which dies with it); when the server exits, so does the actor.
Ray restarts the actor up to ``max_restarts`` times; the new one takes its old port again when it lands on the
same node, so its URL does not change, and the rollouts' health probes bring it back (an engine gets the current
weights first). An actor that lands on another node (its own node died) has a new URL, which this run does not
follow: it goes on with the other servers, and the next run of the stage (resuming from its checkpoint) has them all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KV_NAMESPACE = "mobilerl"


# -- on the nodes -------------------------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """A Ray actor owning one server process: ``argv`` with ``{host}`` and ``{port}`` filled in, healthy when
    ``GET {url}{health}`` answers 200. Its port is kept under ``key`` in Ray's KV store, so a restarted actor on
    the same node binds it again. The process is killed with the actor (PR_SET_PDEATHSIG), and the actor exits
    when the process does (Ray then restarts it)."""

    def __init__(self, key: str, argv: list[str], env: dict[str, str], health: str, bind: str,
                 scheme: str, timeout_s: float, cwd: str | None = None) -> None:
        import httpx
        import ray
        from ray.experimental import internal_kv

        ctx = ray.get_runtime_context()
        self.key, self.node = key, ctx.get_node_id()
        host = "127.0.0.1" if bind == "loopback" else ray.util.get_node_ip_address()
        prev = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        old = json.loads(prev) if prev else {}
        self.restarted = bool(old)  # an earlier incarnation of this actor answered
        port = old["port"] if old.get("node") == self.node and _port_free(host, old["port"]) else _free_port(host)
        self.log_path = Path(tempfile.gettempdir()) / "mobilerl-ray" / f"{key.replace('/', '-')}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen([a.format(host=host, port=port) for a in argv], env={**os.environ, **env},
                                         stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, cwd=cwd)
        self.url = scheme.format(host=host, port=port)
        root = self.url.removesuffix("/v1")
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(root + health, timeout=2).status_code == 200:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{key}: {argv[:4]} did not answer {root + health} (exit {self.proc.poll()}):\n{tail}")
            time.sleep(0.2)
        internal_kv._internal_kv_put(key, json.dumps({"node": self.node, "port": port, "url": self.url}),
                                     namespace=KV_NAMESPACE)
        threading.Thread(target=self._watch, daemon=True, name="mobilerl-server-watch").start()

    def _watch(self) -> None:
        code = self.proc.wait()
        print(f"{self.key}: its server exited ({code}); the actor ends so that Ray restarts it", file=sys.stderr,
              flush=True)
        os._exit(1)

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "node": self.node, "pid": os.getpid(), "server_pid": self.proc.pid,
                "restarted": self.restarted}


class Rank:
    """A Ray actor running the `rl` stage (``entry``: :func:`mobilerl.rl.run.run`, handed over by reference) as one
    trainer rank > 0: it joins rank 0's group and follows it."""

    def run(self, entry: Callable[..., Any], cfg: Any, root: str, env: dict[str, str]) -> None:
        os.environ.update(env)
        entry(cfg, Path(root), progress=False)


# -- the driver ---------------------------------------------------------------------------------------------


def _secret(var: str) -> str:
    """``$var``, set to a new random value for this run (and its actors) when unset."""
    if not os.environ.get(var):
        os.environ[var] = secrets.token_urlsafe(24)
    return os.environ[var]


class RayCluster:
    """The driver's side: joins the cluster, starts the actors ``config`` asks for, and stops them on exit.

    Args:
        config: ``rl.ray`` (:class:`~mobilerl.rl.config.RayConfig`).
        model: the checkpoint the engines serve (on storage every node reads).
        render: env servers send screenshots (the policy's observation mode shows them).
        token_env / api_key_env: variables of the env servers' token and the engines' API key in this process
            (default: the ones the servers read; made for the run when unset; the actors get them as those).
    """

    def __init__(self, config: Any, *, model: str | Path, render: bool, token_env: str | None = None,
                 api_key_env: str | None = None) -> None:
        # here, not at import: the actors import this module, and their start should not pay for the servers'
        from mobilerl.env.server import TOKEN_ENV
        from mobilerl.models.serve_openai import API_KEY_ENV

        self.config, self.model, self.render = config, str(model), render
        self.token_env, self.api_key_env = token_env or TOKEN_ENV, api_key_env or API_KEY_ENV
        self._served_as = {"token": TOKEN_ENV, "api_key": API_KEY_ENV}  # the variables the servers read
        self.run_id = secrets.token_hex(4)
        self.engines: list[str] = []
        self.env_servers: list[str] = []
        self.androidworld: list[str] = []
        self.dashboard: str | None = None
        self._actors: dict[str, Any] = {}  # name -> handle (servers)
        self._ranks: list[Any] = []
        self._rank_refs: list[Any] = []
        self._pgs: list[Any] = []
        self._started_ray = False
        self._closing = threading.Event()  # the ranks' watcher ignores the ends __exit__ causes

    # -- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> RayCluster:
        import ray

        cfg = self.config
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            if not ray.is_initialized():
                local: dict[str, Any] = {}
                if cfg.address == "local":  # this node declares what the pools ask for, and no more: Ray keeps
                    need = self._needs()  # a worker process idling for every CPU it declares
                    local = {"address": None, "include_dashboard": False, "num_cpus": need.pop("CPU", 0),
                             "num_gpus": need.pop("GPU", 0), "resources": need}
                ctx = ray.init(**{"address": cfg.address, **local}, namespace=KV_NAMESPACE, log_to_driver=True,
                               configure_logging=False)
                self._started_ray = True
                self.dashboard = getattr(ctx, "dashboard_url", None) or None
            print(f"ray: {len(ray.nodes())} node(s), dashboard "
                  f"{'http://' + self.dashboard if self.dashboard else 'off'}", flush=True)
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _needs(self) -> dict[str, float]:
        """The resources the pools ask for in all."""
        c = self.config
        pools = [(p.resources, p.count) for p in (c.engines, c.env_servers, c.androidworld) if p is not None]
        pools.append((c.trainer.resources, c.trainer.ranks - 1))
        need: dict[str, float] = {}
        for resources, n in pools:
            for k, v in resources.items():
                need[k] = need.get(k, 0) + v * n
        return need

    def __exit__(self, *exc: Any) -> None:
        import ray

        if not ray.is_initialized():
            return
        from ray.experimental import internal_kv
        from ray.util.placement_group import remove_placement_group

        self._closing.set()
        for a in [*self._ranks, *self._actors.values()]:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        for name in self._actors:
            with contextlib.suppress(Exception):
                internal_kv._internal_kv_del(self._key(name), namespace=KV_NAMESPACE)
        for pg in self._pgs:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self._actors, self._ranks, self._pgs = {}, [], []
        if self._started_ray:
            ray.shutdown()

    def _key(self, name: str) -> str:
        return f"run-{self.run_id}/{name}"

    def _placement_group(self, bundles: list[dict[str, float]], strategy: str, what: str) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        pg = placement_group(bundles, strategy=strategy, name=f"mobilerl-{self.run_id}-{what}")
        self._pgs.append(pg)
        ready, _ = ray.wait([pg.ready()], timeout=self.config.start_timeout_s)
        if not ready:
            raise RuntimeError(f"rl.ray: the cluster cannot place the {what} pool, {len(bundles)} x {bundles[0]} "
                               f"(free: {ray.available_resources()}); add nodes with these resources or lower "
                               f"rl.ray.{what}")
        return pg

    def _options(self, name: str, resources: dict[str, float], strategy: Any) -> dict[str, Any]:
        """Ray actor options: this run's name for the actor, its resources, where it goes."""
        return {"name": f"mobilerl-{self.run_id}-{name}", "num_cpus": resources.get("CPU", 0),
                "num_gpus": resources.get("GPU", 0), "resources": _custom(resources), "scheduling_strategy": strategy}

    def _start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg = self.config
        server = ray.remote(Server)
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        launches: dict[str, tuple[Any, str]] = {}  # name -> (actor, kind)
        if cfg.engines is not None:
            e = cfg.engines
            pg = self._placement_group([dict(e.resources)] * e.count, "PACK", "engines")
            argv = [sys.executable, "-m", "mobilerl.models.serve_openai", self.model, "--host", "{host}", "--port",
                    "{port}", "--weight-sync", "--engine", e.engine, "--device", e.device,
                    *(["--max-batch", str(e.max_batch)] if e.max_batch else []), *e.args]
            engine_env = {**env, self._served_as["api_key"]: _secret(self.api_key_env)}
            for i in range(e.count):
                name = f"engine-{i}"
                launches[name] = (server.options(**self._options(
                    name, e.resources, PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)),
                    max_restarts=cfg.max_restarts, max_task_retries=-1,
                ).remote(self._key(name), argv, engine_env, "/health", cfg.bind, "http://{host}:{port}/v1",
                         cfg.start_timeout_s), "engine")
        if cfg.env_servers is not None:
            s = cfg.env_servers
            argv = [sys.executable, "-m", "mobilerl.cli", "env", "serve", "--host", "{host}", "--port", "{port}",
                    "--backend", s.backend, "--size", str(s.size), "--isolate" if s.isolate else "--no-isolate",
                    *(["--render"] if self.render else [])]
            env_env = {**env, self._served_as["token"]: _secret(self.token_env)}
            for i in range(s.count):
                name = f"env-{i}"
                launches[name] = (server.options(
                    **self._options(name, s.resources, "SPREAD"), max_restarts=cfg.max_restarts, max_task_retries=-1,
                ).remote(self._key(name), argv, env_env, "/health", cfg.bind, "http://{host}:{port}",
                         cfg.start_timeout_s), "env")
        a = cfg.androidworld
        for name in [f"androidworld-{i}" for i in range(a.count)] if a is not None else []:
            launches[name] = (server.options(
                **self._options(name, a.resources, "SPREAD"), max_restarts=cfg.max_restarts, max_task_retries=-1,
            ).remote(self._key(name), a.command, {**env, **a.env}, "/health", cfg.bind, "http://{host}:{port}",
                     cfg.start_timeout_s, a.cwd), "androidworld")
        self._actors = {name: a for name, (a, _) in launches.items()}
        infos = self._infos(list(self._actors), cfg.start_timeout_s)
        self.engines = [infos[n]["url"] for n, (_, k) in launches.items() if k == "engine"]
        self.env_servers = [infos[n]["url"] for n, (_, k) in launches.items() if k == "env"]
        self.androidworld = [infos[n]["url"] for n, (_, k) in launches.items() if k == "androidworld"]
        for n, info in infos.items():
            print(f"ray: {n} at {info['url']} (node {info['node'][:8]})", flush=True)

    def _infos(self, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        import ray

        refs = {n: self._actors[n].info.remote() for n in names}
        try:
            got = ray.get(list(refs.values()), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"rl.ray: {', '.join(names)} not all up after {timeout:.0f} s "
                               "(rl.ray.start_timeout_s); `ray status` shows what the cluster lacks") from None
        return dict(zip(refs, got, strict=True))

    # -- what the rollout side asks -------------------------------------------------------------------------

    def info(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """``url``, ``node``, ``pid`` (the actor's), ``server_pid`` and ``restarted`` of actor ``name`` (engine-i,
        env-i, androidworld-i); waits while Ray restarts it."""
        return self._infos([name], timeout)[name]

    def configure(self, rl: Any) -> Any:
        """``rl`` (an :class:`~mobilerl.rl.config.RLConfig`) with the actors' addresses in ``engines``,
        ``env_servers`` and ``androidworld.urls``, the secrets' variables named, and the broadcast weight sync on this node's address."""
        import ray

        update: dict[str, Any] = {"cluster": None}
        if self.engines:
            update |= {"engines": self.engines, "engines_api_key_env": self.api_key_env}
            host, _, port = rl.sync_address.rpartition(":")
            if rl.weight_sync == "broadcast" and host in ("127.0.0.1", "localhost") and self.config.bind == "node":
                update["sync_address"] = f"{ray.util.get_node_ip_address()}:{port}"
        if self.env_servers:
            update["env_servers"] = self.env_servers
            update["env_pool"] = rl.env_pool.model_copy(update={"token_env": self.token_env})
        if self.androidworld:
            update["androidworld"] = rl.androidworld.model_copy(update={"urls": self.androidworld})
        return rl.model_copy(update=update)

    # -- trainer ranks ---------------------------------------------------------------------------------------

    def start_ranks(self, entry: Callable[..., Any], rl: Any, root: Path,
                    on_failure: Callable[[BaseException], None]) -> None:
        """Ranks 1 … N−1 of ``rl.ray.trainer`` as actors running ``entry(rl, root)`` (the stage, ``rl``
        configured) and this process as rank 0:
        sets this process's RANK/WORLD_SIZE/MASTER_* and starts the others, which join when rank 0 builds its
        trainer. ``on_failure`` is called (from a watcher thread) with the error of a rank that ends first."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        t = self.config.trainer
        if t.ranks == 1:
            return
        pg = self._placement_group([dict(t.resources)] * (t.ranks - 1), "PACK", "trainer")
        rank = ray.remote(Rank)
        master = ray.util.get_node_ip_address() if self.config.bind == "node" else "127.0.0.1"
        env = {"WORLD_SIZE": str(t.ranks), "MASTER_ADDR": master, "MASTER_PORT": str(_free_port(master)),
               "LOCAL_RANK": "0"}
        os.environ.update(env, RANK="0")
        for i in range(1, t.ranks):
            self._ranks.append(rank.options(
                **self._options(f"rank-{i}", t.resources,
                                PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i - 1)),
                max_restarts=0, runtime_env={"env_vars": {k: os.environ[k] for k in (self.token_env, self.api_key_env)
                                                          if os.environ.get(k)}},
            ).remote())
        self._rank_refs = [a.run.remote(entry, rl, str(root), {**env, "RANK": str(i)})
                           for i, a in enumerate(self._ranks, start=1)]

        def watch() -> None:
            pending = list(self._rank_refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=None)
                try:
                    ray.get(done[0])
                except BaseException as e:  # noqa: BLE001 - handed to the driver
                    if not self._closing.is_set():
                        on_failure(e)
                    return

        threading.Thread(target=watch, daemon=True, name="mobilerl-ray-ranks").start()

    def join_ranks(self, timeout: float = 300.0) -> None:
        """Wait for the rank actors' runs to end (rank 0 has stopped them)."""
        import ray

        if self._rank_refs:
            ray.get(self._rank_refs, timeout=timeout)


def _custom(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}

