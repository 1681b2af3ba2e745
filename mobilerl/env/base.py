"""The environment contract shared by every backend (simulator, env server, adb device, AndroidWorld).

    reset(task) -> Observation
    step(action) -> StepResult(observation, done, info)
    evaluate() -> float | None      # verifier reward in [0, 1]; None where the task has no exposed verifier
    close()

:class:`Env` is the synchronous form (a simulator, a device); :class:`AsyncEnv` is what rollouts talk to,
through :class:`mobilerl.env.pool.EnvPool`, so that no call ever blocks the event loop.
"""

from __future__ import annotations

import base64
import io
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from mobilerl.env.actions import Action


class EnvError(RuntimeError):
    """An environment call failed; the episode cannot go on in this env."""


class EnvCrashed(EnvError):
    """The env worker died or became unreachable; the pool replaces it."""


class EnvTimeout(EnvCrashed):
    """An env call exceeded its time limit; treated like a crash (the worker is replaced)."""


@dataclass(frozen=True)
class TaskSpec:
    """A concrete task instance: everything an env needs to reset to it and a runner needs to score it."""

    task_id: str  # e.g. "world/test/ContactsAddContact/3"
    suite: str  # "world" | "lab" | "androidworld" | ...
    split: str  # "train" | "test"
    template: str  # template (task-family) name
    instruction: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    difficulty: str = "easy"
    optimal_steps: int = 0
    complexity: float = 1.0
    tags: tuple[str, ...] = ()
    apps: tuple[str, ...] = ()
    task_type: str = "operation"  # "operation" | "query"
    has_verifier: bool = True
    subgoals: tuple[str, ...] = ()
    expert_prefix: int = 0  # steps the simulator's expert plays before the policy (RL's reverse curriculum)

    @property
    def max_steps(self) -> int:
        """AndroidWorld's step budget: ``min(50, 10 × complexity)``."""
        return int(min(50, round(10 * self.complexity)))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tags"] = list(self.tags)
        d["apps"] = list(self.apps)
        d["subgoals"] = list(self.subgoals)
        d["max_steps"] = self.max_steps
        if not d["expert_prefix"]:  # absent when 0: stored task lists keep their bytes
            del d["expert_prefix"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSpec:
        d = {k: v for k, v in d.items() if k != "max_steps"}
        for k in ("tags", "apps", "subgoals"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


@dataclass
class Observation:
    """What the device shows: raw uiautomator XML, an optional screenshot, the foreground app."""

    xml: str
    app: str  # foreground app name ("Home" on the launcher)
    width: int = 1080
    height: int = 2400
    screenshot: Image.Image | None = None
    step: int = 0

    def png(self, compress_level: int = 1) -> bytes | None:
        if self.screenshot is None:
            return None
        buf = io.BytesIO()
        self.screenshot.save(buf, format="PNG", compress_level=compress_level)
        return buf.getvalue()

    def to_wire(self) -> dict[str, Any]:
        """JSON-safe form (screenshot as base64 PNG) for the env server protocol."""
        png = self.png()
        return {
            "xml": self.xml,
            "app": self.app,
            "width": self.width,
            "height": self.height,
            "step": self.step,
            "screenshot_png_b64": base64.b64encode(png).decode("ascii") if png is not None else None,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Observation:
        shot = d.get("screenshot_png_b64")
        image = Image.open(io.BytesIO(base64.b64decode(shot))) if shot else None
        return cls(
            xml=d["xml"],
            app=d.get("app", ""),
            width=int(d.get("width", 1080)),
            height=int(d.get("height", 2400)),
            screenshot=image,
            step=int(d.get("step", 0)),
        )


@dataclass
class StepResult:
    observation: Observation
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """Synchronous environment (one device)."""

    def reset(self, task: TaskSpec | str) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def evaluate(self) -> float | None: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncEnv(Protocol):
    """Asynchronous environment: the form rollouts use. Implementations never block the event loop."""

    async def reset(self, task: TaskSpec | str) -> Observation: ...

    async def step(self, action: Action) -> StepResult: ...

    async def evaluate(self) -> float | None: ...

    async def close(self) -> None: ...
