"""The async env pool and its adapters: leasing, error paths, timeouts, crash replacement, no loop blocking."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mobilerl.env.actions import Action
from mobilerl.env.base import EnvCrashed, EnvError, EnvTimeout, Observation, StepResult
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.pool import EnvPool, LatencyEnv, PoolClosed, PoolExhausted, ThreadEnv
from mobilerl.env.process_env import ProcessEnv

TAP = Action("Tap", element=BUTTON)
BACK = Action("Back")


class FakeAsyncEnv:
    """Async env whose behaviour per call is scripted: ``fail`` maps method -> exception to raise."""

    instances: list[FakeAsyncEnv] = []

    def __init__(self, step_sleep: float = 0.0):
        self.step_sleep = step_sleep
        self.fail: dict[str, BaseException] = {}
        self.closed = False
        self.calls: list[str] = []
        FakeAsyncEnv.instances.append(self)

    async def reset(self, task):
        self.calls.append("reset")
        if "reset" in self.fail:
            raise self.fail["reset"]
        return Observation(xml="<hierarchy/>", app="Fake")

    async def step(self, action):
        self.calls.append("step")
        if self.step_sleep:
            await asyncio.sleep(self.step_sleep)
        if "step" in self.fail:
            raise self.fail["step"]
        return StepResult(Observation(xml="<hierarchy/>", app="Fake"), done=False)

    async def evaluate(self):
        return 1.0

    async def close(self):
        self.closed = True


def make_pool(size: int = 2, **kw) -> tuple[EnvPool, list[FakeAsyncEnv]]:
    created: list[FakeAsyncEnv] = []

    def factory() -> FakeAsyncEnv:
        env = FakeAsyncEnv()
        created.append(env)
        return env

    return EnvPool(factory, size, **kw), created


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# -- leasing ----------------------------------------------------------------------------------------------


def test_acquire_releases_on_exception_and_waits_for_idle():
    async def main():
        pool, created = make_pool(2)
        async with pool:
            assert pool.idle == 2 and pool.live == 2
            with pytest.raises(ValueError, match="boom"):
                async with pool.acquire() as env:
                    await env.reset("t")
                    assert pool.idle == 1
                    raise ValueError("boom")
            assert pool.idle == 2

            # With both leased, a third acquirer waits until one is released.
            order: list[str] = []
            async with pool.acquire(), pool.acquire() as b:

                async def third():
                    async with pool.acquire() as c:
                        order.append("third")
                        assert c.worker is b_worker

                b_worker = b.worker
                t = asyncio.create_task(third())
                await asyncio.sleep(0.05)
                assert not t.done()
                order.append("released")
                b.release()
                await asyncio.wait_for(t, 1)
            assert order == ["released", "third"]
            assert pool.idle == 2
            assert pool.stats.crashes == 0
        assert all(e.closed for e in created)

    asyncio.run(main())


def test_release_on_cancellation_mid_call_and_while_waiting():
    async def main():
        pool = EnvPool(lambda: FakeAsyncEnv(step_sleep=10.0), 1)
        async with pool:

            async def episode():
                async with pool.acquire() as env:
                    await env.step(TAP)  # sleeps 10 s

            t = asyncio.create_task(episode())
            await wait_for(lambda: pool.idle == 0)
            waiter = asyncio.create_task(pool.lease())  # queued behind the running episode
            await asyncio.sleep(0.05)
            waiter.cancel()
            t.cancel()
            for task in (t, waiter):
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert pool.idle == 1 and pool.live == 1  # released; cancellation is not a crash
            assert pool.stats.crashes == 0
            async with pool.acquire(timeout=1) as env:  # and it is usable
                await env.reset("t")

    asyncio.run(main())


def test_discard_on_cancel_option_replaces_worker():
    async def main():
        pool = EnvPool(lambda: LatencyEnv(FakeAsyncEnv(), 10.0), 1, discard_on_cancel=True)
        async with pool:

            async def episode():
                async with pool.acquire() as env:
                    await env.step(TAP)

            t = asyncio.create_task(episode())
            await wait_for(lambda: pool.idle == 0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            await wait_for(lambda: pool.stats.replacements == 1)
            assert pool.live == 1

    asyncio.run(main())


def test_lease_timeout_and_closed_pool():
    async def main():
        pool, _ = make_pool(1)
        async with pool:
            async with pool.acquire():
                with pytest.raises(PoolExhausted, match="within 0.05s"):
                    async with pool.acquire(timeout=0.05):
                        pass
        with pytest.raises(PoolClosed):
            await pool.lease()
        with pytest.raises(EnvError, match="not started"):
            await EnvPool(FakeAsyncEnv, 1).lease()

    asyncio.run(main())


def test_handle_after_release_raises():
    async def main():
        pool, _ = make_pool(1)
        async with pool:
            async with pool.acquire() as env:
                pass
            with pytest.raises(EnvError, match="released"):
                await env.step(TAP)

    asyncio.run(main())


# -- failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc", [EnvCrashed("device gone"), ConnectionResetError("reset by peer"), BrokenPipeError(), EOFError()]
)
def test_crash_errors_replace_worker_and_raise_envcrashed(exc):
    async def main():
        pool, created = make_pool(2)
        async with pool:
            async with pool.acquire() as env:
                bad = env.worker
                bad.fail["step"] = exc
                with pytest.raises(EnvCrashed):
                    await env.step(TAP)
                with pytest.raises(EnvCrashed, match="discarded"):  # the handle is dead now
                    await env.step(TAP)
            await wait_for(lambda: pool.stats.replacements == 1)
            assert pool.live == 2 and pool.idle == 2
            assert bad.closed and bad not in pool._live
            assert len(created) == 3
            assert pool.stats.crashes == 1 and pool.stats.errors == 1 and pool.stats.timeouts == 0
            async with pool.acquire() as a, pool.acquire() as b:  # later episodes succeed
                assert bad not in (a.worker, b.worker)
                await a.step(TAP)
                await b.step(TAP)

    asyncio.run(main())


def test_plain_env_error_keeps_worker():
    async def main():
        pool, created = make_pool(1)
        async with pool:
            async with pool.acquire() as env:
                worker = env.worker
                worker.fail["reset"] = EnvError("unknown task id 'nope'")
                with pytest.raises(EnvError, match="unknown task id") as info:
                    await env.reset("nope")
                assert not isinstance(info.value, EnvCrashed)
                del worker.fail["reset"]
                await env.reset("ok")  # same lease still works
            async with pool.acquire() as env:
                assert env.worker is worker
            assert pool.stats.crashes == 0 and pool.stats.errors == 1 and len(created) == 1

    asyncio.run(main())


def test_call_timeout_replaces_worker():
    async def main():
        created: list[FakeAsyncEnv] = []

        def factory():
            env = FakeAsyncEnv(step_sleep=30.0 if not created else 0.0)
            created.append(env)
            return env

        pool = EnvPool(factory, 1, call_timeout=0.2)
        async with pool:
            t0 = time.monotonic()
            async with pool.acquire() as env:
                with pytest.raises(EnvTimeout, match="within 0.2s") as info:
                    await env.step(TAP)
                assert isinstance(info.value, EnvCrashed)
            assert time.monotonic() - t0 < 2
            async with pool.acquire(timeout=5) as env:  # the replacement
                assert env.worker is created[1]
                await env.step(TAP)
            assert pool.stats.timeouts == 1 and pool.stats.replacements == 1 and created[0].closed

    asyncio.run(main())


def test_reset_timeout_is_separate():
    async def main():
        class SlowReset(FakeAsyncEnv):
            async def reset(self, task):
                await asyncio.sleep(0.3)
                return await super().reset(task)

        pool = EnvPool(SlowReset, 1, call_timeout=0.1, reset_timeout=2.0)
        async with pool, pool.acquire() as env:
            await env.reset("t")  # 0.3 s > call_timeout, < reset_timeout

    asyncio.run(main())


def test_max_replacements_budget_then_exhausted():
    async def main():
        pool = EnvPool(FakeAsyncEnv, 1, max_replacements=0)
        async with pool:
            async with pool.acquire() as env:
                env.worker.fail["step"] = EnvCrashed("gone")
                with pytest.raises(EnvCrashed):
                    await env.step(TAP)
            assert pool.live == 0
            with pytest.raises(PoolExhausted, match="no live workers"):
                await pool.lease()

    asyncio.run(main())


def test_factory_must_return_async_env_and_start_failure_is_clear():
    async def main():
        with pytest.raises(EnvError, match="wrap synchronous envs in ThreadEnv or ProcessEnv"):
            async with EnvPool(CounterEnv, 1):
                pass

        def broken():
            raise RuntimeError("no emulator")

        with pytest.raises(EnvError, match="2 of 2 workers failed.*no emulator"):
            await EnvPool(broken, 2).start()

    asyncio.run(main())


def test_replacement_factory_failure_is_retried():
    async def main():
        attempts = {"n": 0}

        def flaky():
            attempts["n"] += 1
            if attempts["n"] == 2:  # the first replacement attempt fails, the retry works
                raise RuntimeError("emulator boot failed")
            return FakeAsyncEnv()

        pool = EnvPool(flaky, 1, replace_backoff_s=0.01)
        async with pool:
            async with pool.acquire() as env:
                env.worker.fail["step"] = EOFError()
                with pytest.raises(EnvCrashed):
                    await env.step(TAP)
            async with pool.acquire(timeout=5) as env:
                await env.step(TAP)
            assert attempts["n"] == 3 and pool.stats.replacements == 1

    asyncio.run(main())


# -- adapters & the event loop ----------------------------------------------------------------------------


def test_pool_of_64_latency_envs_runs_concurrently():
    async def main():
        executor = ThreadPoolExecutor(max_workers=4)
        pool = EnvPool(lambda: LatencyEnv(ThreadEnv(CounterEnv(), executor), 0.2), 64)
        async with pool:

            async def episode():
                async with pool.acquire() as env:
                    await env.reset("t/1")
                    result = await env.step(TAP)
                    assert "Count: 1" in result.observation.xml
                    assert await env.evaluate() == 1.0

            t0 = time.monotonic()
            await asyncio.gather(*(episode() for _ in range(64)))
            elapsed = time.monotonic() - t0
        executor.shutdown()
        assert elapsed < 3.0, f"64 envs × 2 calls × 0.2 s took {elapsed:.2f}s: the pool serialised them"

    asyncio.run(main())


async def _max_loop_lag(coro) -> tuple[object, float]:
    lag = 0.0
    stop = False

    async def probe():
        nonlocal lag
        loop = asyncio.get_running_loop()
        while not stop:
            t = loop.time()
            await asyncio.sleep(0.005)
            lag = max(lag, loop.time() - t - 0.005)

    p = asyncio.create_task(probe())
    try:
        result = await coro
    finally:
        stop = True
        await p
    return result, lag


def test_thread_env_blocking_calls_do_not_block_the_loop():
    async def main():
        executor = ThreadPoolExecutor(max_workers=8)
        envs = [ThreadEnv(CounterEnv(step_delay_s=0.3), executor) for _ in range(8)]
        for e in envs:
            e.env.task_id = "t"  # as if reset (skips the slow reset)
        t0 = time.monotonic()
        _, lag = await _max_loop_lag(asyncio.gather(*(e.step(TAP) for e in envs)))
        assert time.monotonic() - t0 < 1.0
        assert lag < 0.1
        await asyncio.gather(*(e.close() for e in envs))
        executor.shutdown()

    asyncio.run(main())


def test_thread_env_is_cancel_safe():
    async def main():
        env = ThreadEnv(CounterEnv(step_delay_s=0.2))
        env.env.reset("t/1")
        t = asyncio.create_task(env.step(TAP))
        await asyncio.sleep(0.05)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert await env.evaluate() == 1.0  # waited for the cancelled tap to finish in its thread
        await env.close()

    asyncio.run(main())


# -- process isolation ------------------------------------------------------------------------------------


def test_process_env_sigkill_mid_episode_is_replaced():
    async def main():
        pool = EnvPool(lambda: ProcessEnv.create(CounterEnv), 2, call_timeout=10)
        async with pool:
            async with pool.acquire() as env:
                await env.reset("t/1")
                await env.step(TAP)
                victim = env.worker.pid
                os.kill(victim, signal.SIGKILL)
                with pytest.raises(EnvCrashed, match=f"process {victim} was killed by SIGKILL"):
                    await env.step(TAP)
            # Lease both workers at once: one of them must be the replacement.
            async with pool.acquire(timeout=30) as a, pool.acquire(timeout=30) as b:
                pids = {a.worker.pid, b.worker.pid}
                assert victim not in pids and len(pids) == 2
                for env in (a, b):
                    await env.reset("t/2")
                    await env.step(TAP)
                    await env.step(TAP)
                    assert await env.evaluate() == 1.0
            assert pool.stats.crashes == 1 and pool.stats.replacements == 1

    asyncio.run(main())


def test_process_env_timeout_kills_the_child():
    async def main():
        pool = EnvPool(
            lambda: ProcessEnv.create(functools.partial(CounterEnv, step_delay_s=30)),
            1,
            call_timeout=0.5,
            reset_timeout=None,
        )
        async with pool:
            async with pool.acquire() as env:
                worker = env.worker
                with pytest.raises(EnvTimeout):
                    await env.reset("t")  # reset sleeps 30 s in the child
            await wait_for(lambda: not worker.alive, timeout=10)
            with pytest.raises(ProcessLookupError):
                os.kill(worker.pid, 0)

    asyncio.run(main())


def test_process_env_errors_cross_the_process_boundary():
    async def main():
        env = await ProcessEnv.create(functools.partial(CounterEnv, known_tasks=("good/1",)))
        try:
            pid = env.pid
            with pytest.raises(EnvError, match="unknown task id 'bad'") as info:
                await env.reset("bad")
            assert f"in env worker process {pid}" in "".join(getattr(info.value, "__notes__", []))
            obs = await env.reset("good/1")
            assert obs.app == "Counter" and env.pid == pid and env.alive
        finally:
            await env.close()
        assert not env.alive

        with pytest.raises(EnvCrashed, match="env factory failed.*ValueError"):
            await ProcessEnv.create(functools.partial(int, "not a number"))

    asyncio.run(main())


def test_process_env_is_cancel_safe_and_does_not_block_the_loop():
    async def main():
        envs = await asyncio.gather(
            *(ProcessEnv.create(functools.partial(CounterEnv, step_delay_s=0.4)) for _ in range(2))
        )
        try:
            await asyncio.gather(*(e.reset("t/1") for e in envs))
            t0 = time.monotonic()
            _, lag = await _max_loop_lag(asyncio.gather(*(e.step(TAP) for e in envs)))
            assert time.monotonic() - t0 < 0.75  # the two 0.4 s steps overlapped
            assert lag < 0.1

            # Cancel a step mid-flight: its late reply must not be taken as the next call's answer.
            t = asyncio.create_task(envs[0].step(BACK))
            await asyncio.sleep(0.05)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert await envs[0].evaluate() == 1.0
            result = await envs[0].step(TAP)
            assert isinstance(result, StepResult) and "Count: 2" in result.observation.xml
        finally:
            await asyncio.gather(*(e.close() for e in envs))

    asyncio.run(main())


def test_bench_script_smoke():
    """scripts/bench_env.py as users run it (a tiny budget; figures are not asserted, only their shape)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_env.py"
    args = [
        "--skip-sim",
        "--envs",
        "8",
        "--latency",
        "0.05",
        "--duration",
        "0.3",
        "--seq-steps",
        "2",
        "--json",
    ]
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(out.stdout)
    assert result["pool"]["envs"] == 8 and result["pool"]["steps"] > 0
    assert 0 < result["pool"]["fraction_of_ideal"] <= 1.05
    assert result["sequential"]["steps"] == 2 and result["speedup_vs_sequential"] > 1
