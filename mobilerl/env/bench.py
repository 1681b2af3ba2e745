"""Environment benchmarks (figures, not tests): simulator speed and env-pool throughput.

    python scripts/bench_env.py                       # everything, a small table
    python scripts/bench_env.py --envs 256 --latency 1.0 --duration 10 --json

(a) Simulator steps/s with XML-only observations and with full-resolution screenshots: a random policy
    (taps on clickable nodes, swipes, Back) over the ``world`` test tasks, resets included.
(b) Env-pool throughput: N envs, each step paying an injected latency L (``asyncio.sleep``, the way a
    real emulator makes a rollout wait), for a fixed wall duration. Reported as steps/s, as a fraction of
    the ideal N/L, and against a plain sequential loop over one env (1/L). The default env is the cheap
    :class:`~mobilerl.env.fake.CounterEnv` in a :class:`ThreadEnv` (bounded thread pool) under a
    :class:`LatencyEnv`, so the figure measures the pool's own overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mobilerl.env.actions import BACK, SWIPE, TAP, Action
from mobilerl.env.base import AsyncEnv, Env
from mobilerl.env.factory import make_env
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.pool import EnvPool, LatencyEnv, ThreadEnv
from mobilerl.env.process_env import ProcessEnv

_CLICKABLE = re.compile(r'clickable="true"[^>]*?bounds="\[(\d+),(\d+)\]\[(\d+),(\d+)\]"')


def _sim_env(render: bool) -> Env:
    return make_env("sim", obs_mode="screenshot+xml" if render else "xml")


def _sim_tasks(suite: str, split: str) -> list[str]:
    from mobilerl.env.sim.tasks import list_tasks

    return [t.task_id for t in list_tasks(suite, split, n=2, with_optimal=False)]


def random_action(xml: str, rng: random.Random) -> Action:
    """A cheap random policy: mostly taps on clickable nodes, some swipes and Backs."""
    r = rng.random()
    boxes = [tuple(int(v) for v in m.groups()) for m in _CLICKABLE.finditer(xml)]
    boxes = [b for b in boxes if b[2] > b[0] and b[3] > b[1]]
    if boxes and r < 0.8:
        return Action(TAP, element=rng.choice(boxes))  # type: ignore[arg-type]
    if r < 0.9:
        return Action(SWIPE, direction=rng.choice(["up", "down"]), dist="medium")
    return Action(BACK)


def bench_sim(
    render: bool, steps: int = 300, suite: str = "world", split: str = "test", seed: int = 0
) -> dict[str, Any]:
    """Steps/s of the in-process simulator under a random policy (resets included in the time)."""
    env = _sim_env(render)
    tasks = _sim_tasks(suite, split)
    rng = random.Random(seed)
    done_steps = resets = 0
    t0 = time.perf_counter()
    obs = env.reset(tasks[0])
    resets += 1
    while done_steps < steps:
        result = env.step(random_action(obs.xml, rng))
        done_steps += 1
        obs = result.observation
        if result.done:
            obs = env.reset(tasks[resets % len(tasks)])
            resets += 1
    elapsed = time.perf_counter() - t0
    env.close()
    return {"steps": done_steps, "resets": resets, "seconds": elapsed, "steps_per_s": done_steps / elapsed}


def _worker_factory(kind: str, latency: float, executor: ThreadPoolExecutor | None) -> Callable[[], Any]:
    if kind == "counter":

        def make() -> AsyncEnv:
            return LatencyEnv(ThreadEnv(CounterEnv(), executor), latency)

        return make
    if kind == "sim":

        def make_sim() -> AsyncEnv:
            return LatencyEnv(ThreadEnv(_sim_env(False), executor), latency)

        return make_sim
    if kind == "process":

        async def make_proc() -> AsyncEnv:
            return LatencyEnv(await ProcessEnv.create(CounterEnv), latency)

        return make_proc
    raise ValueError(f"unknown pool env {kind!r}; expected counter, sim or process")


async def _pool_run(n: int, latency: float, duration: float, env_kind: str, threads: int) -> dict[str, Any]:
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-env")
    task_id = _sim_tasks("world", "test")[0] if env_kind == "sim" else "bench/1000000"
    pool = EnvPool(_worker_factory(env_kind, latency, executor), size=n, call_timeout=latency * 10 + 60)
    loop = asyncio.get_running_loop()
    ready = 0
    all_ready = asyncio.Event()
    go = asyncio.Event()
    steps = 0
    max_lag = 0.0
    t0 = 0.0
    try:
        t_start = time.perf_counter()
        await pool.start()
        start_s = time.perf_counter() - t_start

        async def episode() -> None:
            nonlocal ready, steps
            rng = random.Random()
            async with pool.acquire() as env:
                obs = await env.reset(task_id)
                ready += 1
                if ready == n:
                    all_ready.set()
                await go.wait()
                deadline = t0 + duration
                while loop.time() < deadline:
                    action = random_action(obs.xml, rng) if env_kind == "sim" else Action(TAP, element=BUTTON)
                    result = await env.step(action)
                    steps += 1
                    obs = result.observation
                    if result.done:
                        obs = await env.reset(task_id)

        async def lag_probe() -> None:
            nonlocal max_lag
            while True:
                before = loop.time()
                await asyncio.sleep(0.01)
                max_lag = max(max_lag, loop.time() - before - 0.01)

        tasks = [asyncio.create_task(episode()) for _ in range(n)]
        await all_ready.wait()
        probe = asyncio.create_task(lag_probe())
        t0 = loop.time()
        go.set()
        await asyncio.gather(*tasks)
        elapsed = loop.time() - t0
        probe.cancel()
    finally:
        await pool.close()
        executor.shutdown(wait=False, cancel_futures=True)
    ideal = n / latency if latency > 0 else float("inf")
    rate = steps / elapsed
    return {
        "envs": n,
        "latency_s": latency,
        "duration_s": duration,
        "env": env_kind,
        "threads": threads,
        "start_s": start_s,
        "steps": steps,
        "seconds": elapsed,
        "steps_per_s": rate,
        "ideal_steps_per_s": ideal,
        "fraction_of_ideal": rate / ideal,
        "max_loop_lag_s": max_lag,
        "pool_stats": pool.stats.to_dict(),
    }


async def _sequential_run(latency: float, steps: int) -> dict[str, Any]:
    """The baseline: one env, one step at a time (what a blocking rollout loop gets)."""
    env = LatencyEnv(ThreadEnv(CounterEnv()), latency)
    await env.reset("bench/1000000")
    t0 = time.perf_counter()
    for _ in range(steps):
        await env.step(Action(TAP, element=BUTTON))
    elapsed = time.perf_counter() - t0
    await env.close()
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed}


def bench_pool(
    envs: int = 256, latency: float = 1.0, duration: float = 10.0, env: str = "counter", threads: int = 8
) -> dict[str, Any]:
    return asyncio.run(_pool_run(envs, latency, duration, env, threads))


def bench_sequential(latency: float = 1.0, steps: int = 3) -> dict[str, Any]:
    return asyncio.run(_sequential_run(latency, steps))


def _table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    for key, label in (("sim_xml", "sim, XML only"), ("sim_screenshot", "sim, XML + 1080x2400 screenshot")):
        r = results.get(key)
        if r is None:
            continue
        if "error" in r:
            rows.append((label, f"skipped: {r['error']}"))
        else:
            rows.append(
                (label, f"{r['steps_per_s']:.1f} steps/s  ({r['steps']} steps, {r['resets']} resets)")
            )
    p = results.get("pool")
    if p is not None:
        rows.append(
            (
                f"pool, N={p['envs']} envs, L={p['latency_s']:g}s ({p['env']})",
                f"{p['steps_per_s']:.1f} steps/s = {100 * p['fraction_of_ideal']:.1f}% of ideal N/L="
                f"{p['ideal_steps_per_s']:.1f}  (max loop lag {1000 * p['max_loop_lag_s']:.1f} ms)",
            )
        )
    s = results.get("sequential")
    if s is not None:
        rows.append(
            (
                f"sequential loop, L={results['pool']['latency_s'] if p else '?'}s",
                f"{s['steps_per_s']:.2f} steps/s",
            )
        )
    if p is not None and s is not None:
        rows.append(("pool speedup vs sequential", f"{p['steps_per_s'] / s['steps_per_s']:.1f}x"))
    width = max(len(r[0]) for r in rows) if rows else 0
    line = "-" * (width + 60)
    out = [f"{'benchmark':<{width}}  result", line]
    out += [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=256, help="pool size N (default 256)")
    parser.add_argument(
        "--latency", type=float, default=1.0, help="injected per-step latency L in seconds (default 1.0)"
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="wall time of the pool run in seconds (default 10)"
    )
    parser.add_argument(
        "--threads", type=int, default=8, help="threads shared by the pool's ThreadEnvs (default 8)"
    )
    parser.add_argument(
        "--pool-env",
        choices=("counter", "sim", "process"),
        default="counter",
        help="env under the latency: cheap CounterEnv in threads (default), the simulator, or CounterEnv in processes",
    )
    parser.add_argument(
        "--seq-steps", type=int, default=3, help="steps of the sequential baseline (default 3)"
    )
    parser.add_argument(
        "--sim-steps", type=int, default=300, help="steps per simulator benchmark (default 300)"
    )
    parser.add_argument("--skip-sim", action="store_true", help="skip the simulator benchmarks")
    parser.add_argument("--skip-pool", action="store_true", help="skip the pool benchmarks")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {}
    if not args.skip_sim:
        for key, render in (("sim_xml", False), ("sim_screenshot", True)):
            steps = args.sim_steps if not render else max(10, args.sim_steps // 5)
            try:
                results[key] = bench_sim(render, steps)
            except RuntimeError as e:
                results[key] = {"error": str(e)}
    if not args.skip_pool:
        results["pool"] = bench_pool(args.envs, args.latency, args.duration, args.pool_env, args.threads)
        results["sequential"] = bench_sequential(args.latency, args.seq_steps)
        results["speedup_vs_sequential"] = (
            results["pool"]["steps_per_s"] / results["sequential"]["steps_per_s"]
        )
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(_table(results))
    return 0


__all__ = ["bench_pool", "bench_sequential", "bench_sim", "main", "random_action"]

if __name__ == "__main__":
    raise SystemExit(main())
