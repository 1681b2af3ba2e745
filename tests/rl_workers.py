"""Asynchronous rollout workers in threads of the test process (:class:`ThreadWorkers`), for the RL tests and
``scripts/bench_async.py``: engines and envs the caller makes (simulated ones, or clients of servers elsewhere),
the library's slots and job queues (:func:`mobilerl.rl.async_workers.serve`)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

from mobilerl.env.pool import EnvFactory
from mobilerl.rl.async_workers import Engine, Workers, serve


class ThreadWorkers(Workers):
    """``workers`` rollout workers in threads of this process, each with its own event loop, env pool of ``slots``
    envs from ``make_env`` and engine ``make_engine(i)`` (built in its thread): for engines that live elsewhere
    (an inference server) and for tests and benchmarks with simulated ones."""

    def __init__(self, make_engine: Callable[[int], Engine], make_env: EnvFactory, workers: int = 1,
                 slots: int = 64, call_timeout: float | None = 120.0, reruns: int = 0) -> None:
        super().__init__()
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        build = threading.Lock()  # one engine built at a time: model loading (transformers') is not thread-safe

        def main(i: int) -> None:
            try:
                with build:
                    engine = make_engine(i)
                asyncio.run(serve(engine, make_env, slots, self.jobs, self.results, self.published, self.stop, i,
                                  call_timeout, reruns))
            except BaseException as e:  # noqa: BLE001 - reported to the trainer by check()
                self.errors.append(e)

        self.threads = [threading.Thread(target=main, args=(i,), name=f"mobilerl-rollout{i}", daemon=True)
                        for i in range(workers)]
        for t in self.threads:
            t.start()

    def check(self) -> None:
        if self.errors:
            raise RuntimeError(f"a rollout worker thread failed: {self.errors[0]!r}") from self.errors[0]
        if not self.stop.is_set() and not all(t.is_alive() for t in self.threads):
            raise RuntimeError("a rollout worker thread ended")

    def close(self) -> None:
        self.halt()
        for t in self.threads:
            t.join(timeout=30)
