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
"""

from __future__ import annotations

import argparse
import asyncio
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
        "rounds": rounds, "checkpoint_every": rounds, "seed": 0, "tis_cap": 2.0,
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
        curve = loop(cfg, trainer, w, pool, Path(tmp), lambda m, r: ends.append(time.perf_counter()), progress=False)
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
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f.format(r[k]) for _, k, f in cols) + " |")


if __name__ == "__main__":
    main()
