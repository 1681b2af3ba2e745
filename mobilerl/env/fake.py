"""A cheap, deterministic synchronous :class:`~mobilerl.env.base.Env` for tests, benchmarks and smoke runs.

:class:`CounterEnv` shows one screen with a counter and a button; tapping the button increments the
counter, ``finish()`` ends the episode, and :meth:`CounterEnv.evaluate` returns 1.0 once the counter has
reached the task's target. It costs microseconds per step, so it measures the machinery around an env
(pool, env server, process isolation) rather than the env itself. It is importable at module level, so
``functools.partial(CounterEnv, ...)`` pickles into a ``spawn`` worker process.
"""

from __future__ import annotations

import time

from mobilerl.env.actions import FINISH, TAP, Action
from mobilerl.env.base import EnvError, Observation, StepResult, TaskSpec

BUTTON: tuple[int, int, int, int] = (390, 1100, 690, 1300)  # bounds of the "Add" button


class CounterEnv:
    """Synchronous fake env.

    Args:
        step_delay_s: blocking ``time.sleep`` inside every ``step``/``reset`` (emulates a slow device and
            lets tests exercise timeouts and loop-blocking).
        known_tasks: if given, ``reset`` raises :class:`EnvError` for any other task id (like a bad id).
        target: taps needed for success (a task id ending in ``/<n>`` overrides it with ``n``).
    """

    def __init__(
        self, step_delay_s: float = 0.0, known_tasks: tuple[str, ...] | None = None, target: int = 1
    ):
        self.step_delay_s = step_delay_s
        self.known_tasks = known_tasks
        self.default_target = target
        self.task_id: str | None = None
        self.target = target
        self.count = 0
        self.steps = 0
        self.finished = False
        self.closed = False

    def _xml(self) -> str:
        x1, y1, x2, y2 = BUTTON
        return (
            "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
            '<hierarchy rotation="0">'
            '<node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="fake.counter" '
            'content-desc="" clickable="false" enabled="true" bounds="[0,0][1080,2400]">'
            f'<node index="0" text="Count: {self.count}" resource-id="fake.counter:id/count" '
            'class="android.widget.TextView" package="fake.counter" content-desc="" clickable="false" '
            'enabled="true" bounds="[340,800][740,900]" />'
            '<node index="1" text="Add" resource-id="fake.counter:id/add" class="android.widget.Button" '
            f'package="fake.counter" content-desc="" clickable="true" enabled="true" '
            f'bounds="[{x1},{y1}][{x2},{y2}]" />'
            "</node></hierarchy>"
        )

    def _observe(self) -> Observation:
        return Observation(xml=self._xml(), app="Counter", step=self.steps)

    def _delay(self) -> None:
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)

    def reset(self, task: TaskSpec | str) -> Observation:
        if self.closed:
            raise EnvError("CounterEnv is closed")
        task_id = task.task_id if isinstance(task, TaskSpec) else str(task)
        if self.known_tasks is not None and task_id not in self.known_tasks:
            raise EnvError(f"unknown task id {task_id!r}")
        self._delay()
        tail = task_id.rsplit("/", 1)[-1]
        self.target = int(tail) if tail.isdigit() else self.default_target
        self.task_id = task_id
        self.count = self.steps = 0
        self.finished = False
        return self._observe()

    def step(self, action: Action) -> StepResult:
        if self.task_id is None:
            raise EnvError("step() before reset()")
        self._delay()
        self.steps += 1
        info: dict = {}
        if action.name == FINISH:
            self.finished = True
            info["message"] = action.message
        elif action.name == TAP and action.center is not None:
            x, y = action.center
            x1, y1, x2, y2 = BUTTON
            if x1 <= x <= x2 and y1 <= y <= y2:
                self.count += 1
        return StepResult(self._observe(), done=self.finished, info=info)

    def evaluate(self) -> float | None:
        if self.task_id is None:
            raise EnvError("evaluate() before reset()")
        return 1.0 if self.count >= self.target else 0.0

    def close(self) -> None:
        self.closed = True
