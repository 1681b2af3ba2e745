"""AndroidWorld's env server for the tests, with the emulator stubbed (no adb, no device): a small fake device and
a suite of three task types behind either

- **the real server** (``real_app``): google-research/android_world's own ``server/android_server.py`` and its real
  ``android_world.env.json_action``, loaded from a checkout or a git mirror (``$MOBILERL_ANDROID_WORLD``), with the
  modules that reach a device (``env_launcher``, ``interface``) and the task registry and suite builder
  (``registry``, ``suite_utils``) replaced by the fakes here; or
- **a stand-in** (``standin_app``): the same routes, parameters and answers, written from that server as verified
  against it (test_androidworld_backend.py runs one set of tests on both), for CI, which has no mirror.

The fake device checks what AndroidWorld's executor checks (a JSONAction's fields and action type, an app name for
``open_app``); its screen is a small image whose colour follows the foreground app, so screenshots change.
"""

from __future__ import annotations

import importlib.util
import random
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WIDTH, HEIGHT = 56, 112  # a few image tokens for the tiny models
APPS = ("Contacts", "Clock", "Files", "Markor")
WORDS = ("apple", "river", "cobalt", "meadow")
# JSONAction's fields and action types (android_world/env/json_action.py), for the stand-in's own checks
ACTION_FIELDS = {"action_type", "index", "x", "y", "text", "direction", "goal_status", "app_name", "keycode",
                 "clear_text"}
ACTION_TYPES = {"click", "double_tap", "scroll", "swipe", "input_text", "navigate_home", "navigate_back",
                "keyboard_enter", "open_app", "status", "wait", "long_press", "answer", "unknown"}


class AsyncEnvBase:
    """Stands for ``android_world.env.interface.AsyncEnv``: the real server's /health checks isinstance of it."""


@dataclass(frozen=True)
class State:
    pixels: np.ndarray
    ui_elements: list


class FakeDevice(AsyncEnvBase):
    """The stubbed emulator: the foreground app, typed text, the last answer and status, every action."""

    def __init__(self) -> None:
        self.app = "Home"
        self.typed: list[str] = []
        self.answer: str | None = None
        self.status: str | None = None
        self.actions: list[dict[str, Any]] = []
        self.resets = 0
        self.closed = False

    def reset(self, go_home: bool = False) -> State:
        self.resets += 1
        if go_home:
            self.app = "Home"
        self.typed, self.answer, self.status = [], None, None
        return self.get_state()

    def get_state(self, wait_to_stabilize: bool = False) -> State:
        shade = (APPS.index(self.app) + 1) * 50 if self.app in APPS else 0
        pixels = np.full((HEIGHT, WIDTH, 3), (shade, 255 - shade, 40 * len(self.typed) % 256), dtype=np.uint8)
        return State(pixels, [])

    def execute_action(self, action: Any) -> None:
        a = {k: v for k, v in vars(action).items() if v is not None}
        self.actions.append(a)
        kind = a["action_type"]
        if kind == "open_app":
            if not a.get("app_name"):
                raise ValueError("No app name provided")  # as android_world/env/actuation.py does
            self.app = a["app_name"]
        elif kind == "navigate_home":
            self.app = "Home"
        elif kind == "input_text":
            self.typed.append(a.get("text", ""))
        elif kind == "answer":
            self.answer = a.get("text")
        elif kind == "status":
            self.status = a.get("goal_status")

    def close(self) -> None:
        self.closed = True


class StubTask:
    """A task with the surface the server calls: ``goal``, ``template``, initialize/tear_down/is_successful."""

    template = ""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.initialized = False

    @property
    def goal(self) -> str:
        return self.template.format(**self.params)

    def initialize_task(self, env: FakeDevice) -> None:
        self.initialized = True

    def tear_down(self, env: FakeDevice) -> None:
        self.initialized = False

    def is_successful(self, env: FakeDevice) -> float:
        if not self.initialized:
            raise RuntimeError("is_successful before initialize_task")
        return 1.0 if env.status == "complete" and self.check(env) else 0.0

    def check(self, env: FakeDevice) -> bool:
        raise NotImplementedError


class StubOpenApp(StubTask):
    template = "Open the {app} app."

    @staticmethod
    def params(rng: random.Random) -> dict[str, Any]:
        return {"app": rng.choice(APPS)}

    def check(self, env: FakeDevice) -> bool:
        return env.app == self.params["app"]


class StubTypeWord(StubTask):
    template = "Type the word {word}."

    @staticmethod
    def params(rng: random.Random) -> dict[str, Any]:
        return {"word": rng.choice(WORDS)}

    def check(self, env: FakeDevice) -> bool:
        return self.params["word"] in env.typed


class StubAnswerSum(StubTask):
    template = "What is {a} plus {b}? Answer with the number."

    @staticmethod
    def params(rng: random.Random) -> dict[str, Any]:
        return {"a": rng.randrange(10), "b": rng.randrange(10)}

    def check(self, env: FakeDevice) -> bool:
        return env.answer == str(self.params["a"] + self.params["b"])


REGISTRY = {"StubOpenApp": StubOpenApp, "StubTypeWord": StubTypeWord, "StubAnswerSum": StubAnswerSum}


def create_suite(task_registry: dict[str, type], n_task_combinations: int = 2, seed: int = 42) -> dict[str, list]:
    """``suite_utils.create_suite``'s shape: task type -> its instances, parameters drawn from ``seed``."""
    rng = random.Random(seed)
    return {name: [cls(cls.params(rng)) for _ in range(n_task_combinations)] for name, cls in task_registry.items()}


class TaskRegistry:
    ANDROID_WORLD_FAMILY = "android_world"

    def get_registry(self, family: str) -> dict[str, type]:
        if family != self.ANDROID_WORLD_FAMILY:
            raise ValueError(f"Unsupported family: {family}")
        return dict(REGISTRY)


def solve(goal: str) -> list[str]:
    """The responses (our action syntax) that solve a stub task's goal: a scripted expert for the tests."""
    if goal.startswith("Open the "):
        return [f'do(action="Launch", app="{goal[len("Open the "):-len(" app.")]}")', 'finish(message="done")']
    if goal.startswith("Type the word "):
        return ['do(action="Tap", element=[0,0,20,20])', f'do(action="Type", text="{goal[14:-1]}")',
                'finish(message="done")']
    a, b = (int(w) for w in goal.split("?")[0].split()[2::2])
    return [f'finish(message="{a + b}")']


# -- the stand-in -----------------------------------------------------------------------------------------------


def standin_app(device: FakeDevice | None = None):
    """The stand-in: android_server.py's routes over ``device`` (scalars as query parameters, a JSONAction body on
    /execute_action, an invalid action or a failing device call a 500)."""
    import fastapi

    app = fastapi.FastAPI()
    app.state.env = device or FakeDevice()
    app.state.registry = TaskRegistry()
    app.state.suite = create_suite(app.state.registry.get_registry("android_world"))

    def task(task_type: str, task_idx: int) -> StubTask:
        return app.state.suite[task_type][task_idx]  # a KeyError/IndexError is a 500, as there

    @app.post("/reset")
    def reset(go_home: bool):
        app.state.env.reset(go_home=go_home)
        return {"status": "success", "message": f"Environment reset with go_home={go_home}."}

    @app.get("/screenshot")
    def screenshot(wait_to_stabilize: bool):
        return {"pixels": app.state.env.get_state(wait_to_stabilize=wait_to_stabilize).pixels.tolist()}

    @app.post("/execute_action")
    def execute_action(action_dict: dict[str, Any]):
        if set(action_dict) - ACTION_FIELDS or action_dict.get("action_type") not in ACTION_TYPES:
            raise ValueError(f"invalid JSONAction {action_dict}")  # JSONAction(**d) raises: a 500
        action = types.SimpleNamespace(**{k: action_dict.get(k) for k in ACTION_FIELDS})
        app.state.env.execute_action(action)
        return {"status": "success", "message": f"Action {action_dict} executed."}

    @app.get("/suite/task_list")
    def task_list(max_index: int):
        keys = list(app.state.suite)
        return {"task_list": keys if max_index < 0 or max_index > len(keys) else keys[:max_index]}

    @app.get("/suite/task_length")
    def task_length(task_type: str):
        return {"length": len(app.state.suite[task_type])}

    @app.get("/suite/reinitialize")
    def reinitialize(n_task_combinations: int = 2, seed: int = 42, task_family: str = "android_world"):
        try:
            registry = app.state.registry.get_registry(task_family)
        except ValueError as e:
            raise fastapi.HTTPException(400, f"Invalid task family: {task_family}") from e
        app.state.suite = create_suite(registry, n_task_combinations, seed)
        return {"status": "success", "message": f"Task suite re-initialized with "
                                                f"n_task_combinations={n_task_combinations}, seed={seed}."}

    @app.post("/task/initialize")
    def initialize(task_type: str, task_idx: int):
        task(task_type, task_idx).initialize_task(app.state.env)
        return {"status": "success", "message": f"Task {task_type} {task_idx} initialized."}

    @app.post("/task/tear_down")
    def tear_down(task_type: str, task_idx: int):
        task(task_type, task_idx).tear_down(app.state.env)
        return {"status": "success", "message": f"Task {task_type} {task_idx} torn down."}

    @app.get("/task/score")
    def score(task_type: str, task_idx: int):
        return {"score": task(task_type, task_idx).is_successful(app.state.env)}

    @app.get("/task/goal")
    def goal(task_type: str, task_idx: int):
        return {"goal": task(task_type, task_idx).goal}

    @app.get("/task/template")
    def template(task_type: str, task_idx: int):
        return {"template": task(task_type, task_idx).template}

    @app.post("/close")
    def close():
        app.state.env.close()
        return {"status": "success"}

    @app.get("/health")
    def health():
        if isinstance(app.state.env, AsyncEnvBase):
            return {"status": "success"}
        raise fastapi.HTTPException(500, "Environment not initialized")

    return app


# -- the real server ---------------------------------------------------------------------------------------------

_FILES = ("server/android_server.py", "android_world/__init__.py", "android_world/env/__init__.py",
          "android_world/env/json_action.py")


def real_source(source: str | Path, into: Path) -> Path:
    """The files of android_world the real server needs, from a checkout or (a bare git mirror) its HEAD."""
    source = Path(source)
    if (source / "server" / "android_server.py").is_file():
        return source
    for f in _FILES:
        out = into / f
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(subprocess.run(["git", "--git-dir", str(source), "show", f"HEAD:{f}"], check=True,
                                       capture_output=True).stdout)
    return into


def _install_fakes(src: Path) -> None:
    """android_world's real package and json_action on the path; the device, registry and suite modules faked."""
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    import android_world
    import android_world.env
    import android_world.env.json_action  # noqa: F401 - the real one: every action our client sends meets it

    fakes = {
        "android_world.env.env_launcher": {"load_and_setup_env": lambda **kwargs: FakeDevice()},
        "android_world.env.interface": {"AsyncEnv": AsyncEnvBase},
        "android_world.registry": {"TaskRegistry": TaskRegistry},
        "android_world.suite_utils": {"create_suite": create_suite, "Suite": dict},
    }
    for name, attrs in fakes.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)


def real_app(src: Path, name: str):
    """A fresh copy of the real server's FastAPI ``app`` (one module per server: its state is the module's app)."""
    _install_fakes(src)
    spec = importlib.util.spec_from_file_location(name, src / "server" / "android_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


# -- serving ---------------------------------------------------------------------------------------------------


class Served:
    """An ASGI app on 127.0.0.1 in a uvicorn thread (its lifespan runs: the real server sets up its env there)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.app = app
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    @property
    def device(self) -> FakeDevice:
        state = self.app.state
        return getattr(state, "app_android_env", None) or state.env  # the real server's name, the stand-in's

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


if __name__ == "__main__":  # the stand-in as a process of its own, as a launcher starts AndroidWorld's server
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(standin_app(), host=args.host, port=args.port, log_level="warning")
