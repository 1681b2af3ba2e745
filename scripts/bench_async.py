"""Benchmark the RL loop's scheduling, synchronous rounds against the asynchronous mode, side by side in one run:
environment utilisation, throughput, and the share of a training step spent beyond env, generation and training.

    .venv/bin/python scripts/bench_async.py                      # 256 envs x 1 s a step; about 2 minutes
    .venv/bin/python scripts/bench_async.py --envs 64 --latency 0.2 --staleness 1 2 --json

What is real: the trainer's loops (:func:`mobilerl.rl.loop.train`, :func:`mobilerl.rl.async_loop.train_async`),
the task sampler (FCF), grouping, staleness, SPA/advantages, AdaPR and the rows of the update
(:meth:`~mobilerl.rl.trainer.Trainer.batch`), the weights written and published each round, the rollout workers'
per-trajectory slots (:func:`~mobilerl.rl.async_workers.serve`, here in threads: ``ThreadWorkers``), the env pool
and the episode loop (:func:`~mobilerl.agent.rollout.rollout`). The synchronous mode runs its rounds through the
same workers (``ThreadWorkers.run``: every episode of the round, then the update), so the comparison is of
scheduling alone.

What is simulated: the env (a counter app whose every reset/step sleeps ``--latency`` s ± ``--jitter``), the engine
(the project's micro-batcher; a batch of b requests costs ``--gen-base + b × --gen-row`` s, one batch at a time per
engine; a weight load costs ``--load`` s on it), the policy (taps the counter, then finishes after a number of steps
drawn per episode from ``--steps``) and the update (``--train`` s of sleep).

Figures: env utilisation = env-seconds inside reset/step ÷ (envs × wall), over the whole run and after the first
round (the asynchronous pipeline's fill); throughput in env steps/s and trained trajectories/s; the step's split
from the curve (``time/*``): waiting for rollouts (env + generation), training, weight sync, and the rest.

``real``: nothing simulated but the reward. The same loops against real processes on 127.0.0.1 — ``--engines``
``serve_openai --weight-sync`` processes (the HF backend on the profile's checkpoint), ``--env-servers``
``mobilerl env serve`` processes (rendering screenshots when the observation mode shows them) — and the real
trainer in this process (its update, the weight sync after each, the rows rebuilt from the stored steps and
screenshots); synchronous rounds through :mod:`mobilerl.rl.engine`, then ``rl.async`` through
:mod:`mobilerl.rl.async_engines`, on the same servers in the same run::

    .venv/bin/python scripts/bench_async.py real                                   # xml, k = 1
    .venv/bin/python scripts/bench_async.py real --obs-mode screenshot+xml --staleness 1
    .venv/bin/python scripts/bench_async.py real --profile vl_smoke                # a profile's own mode
    .venv/bin/python scripts/bench_async.py --cluster ray                          # the same, then on Ray's servers

With ``--cluster ray`` the runs are made on servers this script starts and on the same servers started by Ray
(:mod:`mobilerl.rl.ray_cluster`, a local cluster unless ``--ray-address``), in the order this script, Ray, Ray, this
script, its own at the niceness Ray gives its workers (15: without it Ray's servers yield the 2 cores to the trainer
and the comparison measures priorities); the mean env utilisation of each is printed side by side: Ray's
overhead, measured.

The reward is a stand-in (every other episode succeeds, :class:`HalfJudge`: the tiny base solves nothing). Figures:
env utilisation = env sessions held ÷ env workers (the servers' ``/stats``, sampled every 50 ms), engine
utilisation = seconds the engines' models ran batches (their ``/health`` ``busy_s``) ÷ wall, the staleness of the
trained trajectories (versions behind the trainer; "within bound": all ≤ k), and the largest rollout/trainer
logprob gap on on-policy rows (``loss/logprob_gap_max``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from mobilerl.agent.policy import PolicyContext, PolicyOutput
from mobilerl.env.actions import FINISH, TAP, Action, format_action
from mobilerl.env.base import Observation, StepResult, TaskSpec
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.models.generation import MicroBatcher
from mobilerl.rl.async_loop import train_async
from mobilerl.rl.batch import PromptFormat
from mobilerl.rl.config import RLConfig
from mobilerl.rl.loop import train
from mobilerl.rl.trainer import Trainer

# the thread workers are a test helper (simulated engines in this process), shared with tests/test_rl_async.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from rl_workers import ThreadWorkers  # noqa: E402

TAP_TEXT = format_action(Action(TAP, element=BUTTON))
FINISH_TEXT = format_action(Action(FINISH, message="done"))


class Meter:
    """Env busy intervals (reset/step calls), thread-safe; calls still open count up to the window's end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[float, float]] = []
        self.open: dict[int, float] = {}
        self.steps: list[float] = []

    def busy(self, t0: float, t1: float) -> float:
        with self.lock:
            spans = [*self.calls, *((s, t1) for s in self.open.values())]
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)

    def steps_in(self, t0: float, t1: float) -> int:
        with self.lock:
            return sum(t0 <= t < t1 for t in self.steps)


class SleepEnv:
    """The counter app (:class:`~mobilerl.env.fake.CounterEnv`) behind a device that takes ``latency`` s (± jitter) a
    reset or step, on the event loop (``asyncio.sleep``: 256 envs need no threads)."""

    def __init__(self, meter: Meter, latency: float, jitter: float, seed: int) -> None:
        self.env, self.meter, self.latency, self.jitter = CounterEnv(), meter, latency, jitter
        self.rng = random.Random(seed)

    async def _device(self) -> None:
        t0 = time.perf_counter()
        with self.meter.lock:
            self.meter.open[id(self)] = t0
        try:
            await asyncio.sleep(self.latency * self.rng.uniform(1 - self.jitter, 1 + self.jitter))
        finally:
            with self.meter.lock:
                self.meter.open.pop(id(self), None)
                self.meter.calls.append((t0, time.perf_counter()))

    async def reset(self, task: TaskSpec | str) -> Observation:
        await self._device()
        return self.env.reset(task)

    async def step(self, action: Action) -> StepResult:
        await self._device()
        with self.meter.lock:
            self.meter.steps.append(time.perf_counter())
        return self.env.step(action)

    async def evaluate(self) -> float | None:
        return self.env.evaluate()

    async def close(self) -> None:
        self.env.close()


class SimEngine:
    """A rollout engine whose generation is simulated: requests are batched by the project's micro-batcher and a
    batch holds the engine (one thread) for ``base + rows × row`` seconds; a weight load holds it ``load`` s."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.version = args, 0
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="sim-engine")
        self.batcher = MicroBatcher(self._batch, self.executor, max_batch=args.max_batch, wait_s=0.005)

    def _batch(self, items: list[Any]) -> list[Any]:
        time.sleep(self.args.gen_base + self.args.gen_row * len(items))
        return items

    def policy(self, seed: int) -> SimPolicy:
        return SimPolicy(self, seed, str(self.version))

    async def load(self, version: int, path: str) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, time.sleep, self.args.load)
        self.version = version


class SimPolicy:
    """Taps the counter, then finishes after L steps, L drawn per episode from ``--steps`` (lo..hi)."""

    name = "sim"

    def __init__(self, engine: SimEngine, seed: int, version: str) -> None:
        lo, hi = engine.args.steps
        self.engine, self.version, self.length = engine, version, random.Random(seed).randint(lo, hi)

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        await self.engine.batcher.submit(ctx.step)
        text = FINISH_TEXT if ctx.step + 1 >= self.length else TAP_TEXT
        return PolicyOutput(text, logprobs=[-0.5] * 8, token_ids=list(range(8)))


class SimTrainer(Trainer):
    """The real trainer (sampler, groups, replay, rows) whose optimiser step is ``--train`` s of sleep."""

    train_s = 1.0

    def update(self, rows: list[Any]) -> dict[str, float]:
        time.sleep(self.train_s)
        return {"train/rows": float(len(rows))}


def run_mode(args: argparse.Namespace, staleness: int | None, pool: list[TaskSpec]) -> dict[str, Any]:
    rounds = args.rounds_sync if staleness is None else args.rounds
    cfg = RLConfig.model_validate({
        "rounds": rounds, "checkpoint_every": rounds, "seed": 0, "algo": {"tis_cap": 2.0},
        "async": None if staleness is None else {"max_staleness": staleness},
        "overrides": {"train_batch_size": args.tasks, "samples_per_task": args.n, "kl_coef": 0.0}})
    trainer = SimTrainer(cfg, torch.nn.Linear(64, 64), lambda req: [1] * 300, 0, PromptFormat())
    trainer.train_s = args.train
    meter = Meter()
    engines: list[SimEngine] = []

    def make_engine(i: int) -> SimEngine:
        engines.append(SimEngine(args))
        return engines[-1]

    per = args.envs // args.engines
    counter = iter(range(10**9))
    ends: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, ThreadWorkers(
            make_engine, lambda: SleepEnv(meter, args.latency, args.jitter, next(counter)), args.engines, per) as w:
        time.sleep(0.5)  # the pools' envs built
        t0 = time.perf_counter()
        loop = train if staleness is None else train_async
        curve = loop(trainer, w, pool, Path(tmp), lambda m, r: ends.append(time.perf_counter()), progress=False)
        t1 = time.perf_counter()
    n_env = per * args.engines
    wall, steady = t1 - t0, t1 - ends[0]
    keys = ("step", "rollout", "train", "sync", "reward", "other")
    split = {k: sum(c.get(f"time/{k}_s", 0.0) for c in curve) for k in keys}
    return {
        "mode": "sync" if staleness is None else f"async k={staleness}",
        "rounds": rounds, "wall_s": wall,
        "env_util": meter.busy(t0, t1) / (n_env * wall),
        "env_util_steady": meter.busy(ends[0], t1) / (n_env * steady),
        "env_steps_per_s": meter.steps_in(t0, t1) / wall,
        "trained_traj_per_s": sum(c["rollout/episodes"] for c in curve) / wall,
        "dropped_stale": sum(c.get("async/dropped_stale", 0.0) for c in curve),
        "staleness_mean": sum(c.get("async/staleness_mean", 0.0) for c in curve) / len(curve),
        "gen_busy": sum(e.batcher.stats.busy_s for e in engines) / (len(engines) * wall),
        "step_s": split["step"] / rounds,
        "share_rollout_wait": split["rollout"] / split["step"],
        "share_train": split["train"] / split["step"],
        "share_sync": split["sync"] / split["step"],
        "share_other": (split["other"] + split["reward"]) / split["step"],
        "share_beyond": (split["step"] - split["rollout"] - split["train"]) / split["step"],
    }


def _print_table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> None:
    """A markdown table: a column a (header, key, format) triple, a row a mode."""
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f.format(r[k]) for _, k, f in cols) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, default=256, help="envs in all (split over --engines workers)")
    ap.add_argument("--engines", type=int, default=4, help="rollout workers, each with its engine and envs")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds an env reset or step takes")
    ap.add_argument("--jitter", type=float, default=0.2, help="relative spread of the env latency")
    ap.add_argument("--steps", type=int, nargs=2, default=(2, 8), help="episode length range (steps)")
    ap.add_argument("--tasks", type=int, default=32, help="tasks a round (groups)")
    ap.add_argument("--n", type=int, default=8, help="episodes a task")
    ap.add_argument("--gen-base", type=float, default=0.03, help="seconds of a generation batch")
    ap.add_argument("--gen-row", type=float, default=0.001, help="seconds a generation batch adds per request")
    ap.add_argument("--max-batch", type=int, default=64, help="requests a generation batch takes at most")
    ap.add_argument("--load", type=float, default=0.1, help="seconds a worker takes to load new weights")
    ap.add_argument("--train", type=float, default=2.0, help="seconds of an update")
    ap.add_argument("--rounds", type=int, default=5, help="asynchronous rounds")
    ap.add_argument("--rounds-sync", type=int, default=3, help="synchronous rounds")
    ap.add_argument("--staleness", type=int, nargs="+", default=[2], help="max_staleness values to run")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if args.envs % args.engines:
        ap.error("--envs must be a multiple of --engines")

    pool = [TaskSpec(task_id=f"bench/train/T{i}/{2 + i % 5}", suite="bench", split="train", template=f"T{i}",
                     instruction=f"Tap Add {2 + i % 5} times, then finish", complexity=2.0) for i in range(200)]
    rows = [run_mode(args, None, pool)] + [run_mode(args, k, pool) for k in args.staleness]
    if args.json:
        print(json.dumps({"args": vars(args), "modes": rows}, indent=1))
        return
    print(f"{args.envs} envs x {args.latency} s a step (±{args.jitter:.0%}), episodes of {args.steps[0]}-{args.steps[1]} "
          f"steps, {args.tasks} tasks x {args.n} a round, update {args.train} s, {args.engines} engines "
          f"(batch {args.gen_base}+{args.gen_row}/row s), load {args.load} s")
    cols = [("mode", "mode", "{}"), ("rounds", "rounds", "{}"), ("wall s", "wall_s", "{:.1f}"),
            ("env util", "env_util", "{:.1%}"), ("env util after round 0", "env_util_steady", "{:.1%}"),
            ("env steps/s", "env_steps_per_s", "{:.1f}"), ("trained traj/s", "trained_traj_per_s", "{:.1f}"),
            ("dropped stale", "dropped_stale", "{:.0f}"), ("staleness", "staleness_mean", "{:.2f}"),
            ("engine busy", "gen_busy", "{:.0%}"), ("step s", "step_s", "{:.2f}"),
            ("wait rollouts", "share_rollout_wait", "{:.1%}"), ("train", "share_train", "{:.1%}"),
            ("sync", "share_sync", "{:.2%}"), ("other", "share_other", "{:.2%}"),
            ("beyond env+gen+train", "share_beyond", "{:.2%}")]
    _print_table(rows, cols)


# ------------------------------------------------------------------------- real processes on loopback (`real`)

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-async-token"
API_KEY_ENV = "MOBILERL_API_KEY"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RAY_NICE = 15  # the niceness Ray's raylet gives its workers (its worker_niceness), so their servers' too


def start_servers(args: argparse.Namespace, render: bool, nice: int = 0) -> tuple[list[Any], list[str], list[str]]:
    """``--engines`` ``serve_openai --weight-sync`` processes and ``--env-servers`` ``mobilerl env serve`` processes
    (rendering screenshots with ``render``), every one on 127.0.0.1, as an operator starts them, at niceness
    ``nice``; waits until all answer ``/health``."""
    import os
    import subprocess

    import httpx

    def lower() -> None:
        os.nice(nice)

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # the token and key: real_main's
    procs, engines, envs = [], [], []
    for _ in range(args.engines):
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "mobilerl.models.serve_openai", args.init, "--port",
                                       str(port), "--weight-sync", "--device", "cpu", "--max-batch",
                                       str(args.max_batch)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=lower,
                                      stderr=subprocess.DEVNULL))
        engines.append(f"http://127.0.0.1:{port}/v1")
    for _ in range(args.env_servers):
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "mobilerl.cli", "env", "serve", "--port", str(port),
                                       "--backend", "sim", "--size", str(args.env_workers), "--no-isolate",
                                       *(["--render"] if render else [])], env=env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lower))
        envs.append(f"http://127.0.0.1:{port}")
    deadline = time.time() + 300
    for proc, url in zip(procs, [u.removesuffix("/v1") for u in engines] + envs, strict=True):
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{url} did not start")
            time.sleep(0.3)
    return procs, engines, envs


def stop_servers(procs: list[Any]) -> None:
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def ray_servers(args: argparse.Namespace, render: bool, stack: contextlib.ExitStack) -> tuple[list[str], list[str]]:
    """The same engines and env servers as :func:`start_servers`, started by Ray (``rl.cluster: ray``'s
    :class:`~mobilerl.rl.ray_cluster.RayCluster`, stopped with ``stack``) on ``--ray-address`` (local: a one-node
    cluster in this process declaring the GPUs and ``avd`` slots the pools ask for; the engines serve on the CPU)."""
    from mobilerl.rl.config import RayConfig
    from mobilerl.rl.ray_cluster import RayCluster

    cfg = RayConfig.model_validate({
        "address": args.ray_address, "bind": "loopback" if args.ray_address == "local" else "node",
        "engines": {"count": args.engines, "engine": "hf", "device": "cpu", "max_batch": args.max_batch},
        "env_servers": {"count": args.env_servers, "size": args.env_workers, "isolate": False}})
    cluster = stack.enter_context(RayCluster(cfg, model=args.init, render=render, api_key_env=API_KEY_ENV))
    import psutil

    nices = {psutil.Process(cluster.info(n)["server_pid"]).nice()
             for n in [f"engine-{i}" for i in range(args.engines)] + [f"env-{i}" for i in range(args.env_servers)]}
    if nices != {RAY_NICE}:
        print(f"warning: Ray's servers run at niceness {sorted(nices)}, this script's at {RAY_NICE}: the comparison "
              "is not like for like", file=sys.stderr)
    return cluster.engines, cluster.env_servers


class Occupancy(threading.Thread):
    """Samples every env server's ``GET /stats`` (sessions held, workers) every ``every`` s: env utilisation is
    the held sessions over the workers, averaged over a window."""

    def __init__(self, urls: list[str], every: float = 0.05) -> None:
        super().__init__(daemon=True)
        import httpx

        self.urls, self.every, self.halt = urls, every, threading.Event()
        self.http = httpx.Client(timeout=2, headers={"Authorization": f"Bearer {TOKEN}"})
        self.samples: list[tuple[float, int, int]] = []  # (time, sessions, workers)

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                stats = [self.http.get(u + "/stats").json() for u in self.urls]
                self.samples.append((time.perf_counter(), sum(s["sessions"] for s in stats),
                                     sum(s["workers"] for s in stats)))
            except Exception:  # noqa: BLE001 - a sample missed is a sample missed
                pass
            time.sleep(self.every)

    def util(self, t0: float, t1: float) -> float:
        got = [(s, w) for t, s, w in self.samples if t0 <= t <= t1 and w]
        return sum(s / w for s, w in got) / len(got) if got else 0.0


def engine_busy(urls: list[str]) -> list[float]:
    """Each engine's ``busy_s`` (seconds its model has run batches, from ``GET /health``)."""
    import httpx

    return [float(httpx.get(u.removesuffix("/v1") + "/health", timeout=5).json()["busy_s"]) for u in urls]


class HalfJudge:
    """A stand-in reward: every other episode (by a hash of its id) succeeds. The tiny base solves no task, so
    without it every group is all-failed, pruned, and nothing trains (no staleness to correct)."""

    def score(self, trajs: list[Any]) -> list[float]:
        from mobilerl.seeding import stable_seed

        return [0.9 if stable_seed(t.episode_id) % 2 else 0.1 for t in trajs]


class RecordingTrainer(Trainer):
    """The real trainer; records the policy versions each round trains."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.trained: list[tuple[int, list[str | None]]] = []

    def batch(self, groups: Any, r: int, ctx: Any = None) -> Any:
        self.trained.append((r, [t.policy_version for g in groups for t in g.trajectories]))
        return super().batch(groups, r, ctx)


def real_mode(args: argparse.Namespace, staleness: int | None, engines: list[str], envs: list[str],
              obs_mode: str, pool: list[TaskSpec], occupancy: Occupancy) -> dict[str, Any]:
    """One run of the `rl` loop against the servers: synchronous rounds (``staleness`` None) or ``rl.async``."""
    from mobilerl.env.factory import renders
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.profiles import load_profile
    from mobilerl.rl.async_engines import remote_workers
    from mobilerl.rl.engine import remote_engines
    from mobilerl.rl.run import policy_spec

    rounds = args.rounds_sync if staleness is None else args.rounds
    with tempfile.TemporaryDirectory(prefix="mobilerl-bench-async-") as tmp:
        cfg = RLConfig.model_validate({
            "profile": args.profile, "init": args.init, "rounds": rounds, "checkpoint_every": rounds, "seed": 0,
            "fcf": False, "algo": {"tis_cap": 2.0}, "lab_share": 1.0, "reward_model": "HalfJudge (a stand-in)",
            "engines": engines, "env_servers": envs, "weight_sync": args.weight_sync, "engines_api_key_env": API_KEY_ENV,
            "rollout_concurrency": args.concurrency, "env_pool": {"health_interval_s": 1.0},
            "async": None if staleness is None else {"max_staleness": staleness}, "work": tmp,
            "overrides": {"train_batch_size": args.tasks, "samples_per_task": args.n, "kl_coef": 0.0,
                          "max_new_tokens": args.max_new_tokens, "learning_rate": 1e-3}})
        g = load_profile(args.profile).generation
        fmt = PromptFormat(obs_mode, g.prompt_style, g.max_history, g.coords)
        backend = HFBackend.from_pretrained(args.init, device="cpu", fast_prefill=False, prefix_cache_tokens=0)
        trainer = RecordingTrainer(cfg, backend.model, backend.prompt_ids, backend.pad_id, fmt,
                                   backend.image_inputs if renders(obs_mode) else None)
        work = Path(tmp)
        spec = dataclasses.replace(policy_spec(cfg, Path(args.init), work), obs_mode=obs_mode)
        workers: Any = (remote_engines(cfg, spec, trainer, work) if staleness is None
                        else remote_workers(cfg, spec, trainer, work))
        busy0, t0 = engine_busy(engines), time.perf_counter()
        with workers as w:
            loop = train if staleness is None else train_async
            curve = loop(trainer, w, pool, work, progress=False, judge=HalfJudge())
        t1, busy1 = time.perf_counter(), engine_busy(engines)
    wall = t1 - t0
    ages = [r - int(v) for r, vs in trainer.trained for v in vs if v is not None]
    k = staleness or 0
    return {
        "mode": "sync" if staleness is None else f"async k={staleness}", "rounds": rounds, "wall_s": wall,
        "env_util": occupancy.util(t0, t1),
        "engine_util": sum(b - a for a, b in zip(busy0, busy1, strict=True)) / (len(engines) * wall),
        "env_steps_per_s": sum(v for c in curve for key, v in c.items()
                               if key.startswith("envs/") and key.endswith("/steps")) / wall,
        "trained_traj_per_s": sum(c["rollout/episodes"] for c in curve) / wall,
        "staleness": {a: ages.count(a) for a in range(k + 1)},
        "dropped_stale": sum(c.get("async/dropped_stale", 0.0) for c in curve),
        "within_bound": all(0 <= a <= k for a in ages),
        "on_policy_trajectories": ages.count(0),
        "gap_max": max(c.get("loss/logprob_gap_max", 0.0) for c in curve),
        "reruns": sum(c.get("async/reruns", 0.0) for c in curve),
        "failures": sum(c["rollout/env_failures"] + c["rollout/engine_failures"] for c in curve),
        "step_s": sum(c["time/step_s"] for c in curve) / rounds,
        "train_s": sum(c["time/train_s"] for c in curve) / rounds,
    }


def real_main(argv: list[str]) -> None:
    """``bench_async.py real``: the loop against real processes on loopback, synchronous rounds and ``rl.async``
    in the same run, on the same servers."""
    import os

    from mobilerl.env.factory import renders
    from mobilerl.env.sim.tasks import list_tasks
    from mobilerl.models.profiles import load_profile

    ap = argparse.ArgumentParser(prog="bench_async.py real", description=real_main.__doc__)
    ap.add_argument("--profile", default="tiny", help="model profile (its rl: and generation: sections)")
    ap.add_argument("--init", default=None, help="checkpoint of engines and trainer (default: the profile's weights)")
    ap.add_argument("--obs-mode", default=None, help="observation mode (default: the profile's); screenshot modes "
                                                     "make the env servers render")
    ap.add_argument("--engines", type=int, default=2, help="serve_openai engine processes")
    ap.add_argument("--env-servers", type=int, default=2, help="mobilerl env serve processes")
    ap.add_argument("--env-workers", type=int, default=8, help="envs each env server runs")
    ap.add_argument("--concurrency", type=int, default=8, help="rl.rollout_concurrency (episodes an engine)")
    ap.add_argument("--max-batch", type=int, default=16, help="each engine's micro-batch")
    ap.add_argument("--weight-sync", choices=("reload", "broadcast"), default="reload", help="rl.weight_sync")
    ap.add_argument("--tasks", type=int, default=4, help="tasks a round (groups)")
    ap.add_argument("--n", type=int, default=4, help="episodes a task")
    ap.add_argument("--max-steps", type=int, default=4, help="step budget of an episode")
    ap.add_argument("--max-new-tokens", type=int, default=24, help="tokens a response")
    ap.add_argument("--rounds", type=int, default=6, help="asynchronous rounds")
    ap.add_argument("--rounds-sync", type=int, default=4, help="synchronous rounds")
    ap.add_argument("--staleness", type=int, nargs="+", default=[1], help="max_staleness values to run")
    ap.add_argument("--cluster", choices=("processes", "ray"), default="processes", help=(
        "who starts the servers: this script (processes), or Ray too (ray: the same runs again on servers that "
        "rl.cluster ray starts, and the env utilisation of both)"))
    ap.add_argument("--ray-address", default="local", help="with --cluster ray: the Ray cluster (local: one in this "
                                                          "process)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    args.init = args.init or str(ROOT / profile.weights)
    obs_mode = args.obs_mode or profile.generation.obs_mode
    os.environ["MOBILERL_ENV_TOKEN"] = TOKEN
    os.environ[API_KEY_ENV] = "bench-async-key"
    pool = [dataclasses.replace(t, has_verifier=False, complexity=args.max_steps / 10)
            for t in list_tasks("world", "train", n=1)]
    rows = []
    # ABBA: the first launch also warms this process (its first updates are slower), so each side gets a first
    # and a last place and the drift cancels in the means
    for launcher in ["processes", "ray", "ray", "processes"] if args.cluster == "ray" else ["processes"]:
        with contextlib.ExitStack() as stack:
            if launcher == "ray":
                engines, envs = ray_servers(args, renders(obs_mode), stack)
            else:
                procs, engines, envs = start_servers(args, renders(obs_mode), RAY_NICE if args.cluster == "ray" else 0)
                stack.callback(stop_servers, procs)
            occupancy = Occupancy(envs)
            occupancy.start()
            stack.callback(occupancy.halt.set)
            runs = [real_mode(args, None, engines, envs, obs_mode, pool, occupancy)]
            runs += [real_mode(args, k, engines, envs, obs_mode, pool, occupancy) for k in args.staleness]
        rows += [{"servers": launcher, **r} for r in runs]
    if args.json:
        print(json.dumps({"args": vars(args), "obs_mode": obs_mode, "modes": rows}, indent=1))
        return
    print(f"{args.engines} engines (serve_openai, {args.profile} at {args.init}), {args.env_servers} env servers x "
          f"{args.env_workers} envs ({'rendering' if renders(obs_mode) else 'xml'}), {args.tasks} tasks x {args.n} a "
          f"round, {args.max_steps} steps at most, obs_mode {obs_mode}, weight sync {args.weight_sync}")
    cols = [("servers", "servers", "{}"), ("mode", "mode", "{}"), ("rounds", "rounds", "{}"), ("wall s", "wall_s", "{:.1f}"),
            ("env util", "env_util", "{:.1%}"), ("engine util", "engine_util", "{:.1%}"),
            ("env steps/s", "env_steps_per_s", "{:.2f}"), ("trained traj/s", "trained_traj_per_s", "{:.2f}"),
            ("staleness (trained)", "staleness", "{}"), ("dropped stale", "dropped_stale", "{:.0f}"),
            ("within bound", "within_bound", "{}"), ("gap on-policy", "gap_max", "{:.1e}"),
            ("on-policy traj", "on_policy_trajectories", "{}"), ("step s", "step_s", "{:.2f}"),
            ("update s", "train_s", "{:.2f}")]
    _print_table(rows, cols)
    if args.cluster == "ray":
        for mode in dict.fromkeys(r["mode"] for r in rows):
            ray, plain = ([r["env_util"] for r in rows if r["servers"] == who and r["mode"] == mode]
                          for who in ("ray", "processes"))
            a, b = sum(ray) / len(ray), sum(plain) / len(plain)
            print(f"{mode}: env util {a:.1%} with Ray against {b:.1%} without, the mean of 2 launches each "
                  f"({100 * (a - b):+.1f} points)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["real"]:
        real_main(sys.argv[2:])
    elif any(a.split("=")[0] == "--cluster" for a in sys.argv[1:]):  # who starts real servers: the real mode's
        real_main(sys.argv[1:])
    else:
        main()
