"""Client for AndroidWorld's own env server (the FastAPI app its Docker image runs on port 5000).

The API is google-research/android_world's ``server/android_server.py``: scalar arguments are query
parameters even on POST; only ``/execute_action`` has a JSON body (a ``JSONAction`` dict).
:func:`to_json_action` maps our actions; the non-obvious parts: Swipe → ``scroll`` in the *opposite*
direction over the whole screen (element, dist and a precise swipe's points are not forwarded: JSONAction
has no point-to-point swipe); Type → ``input_text``, which AndroidWorld's executor follows with Enter, at
the centre of the element tapped just before (re-tapped to focus it), else into the focused field; Enter →
``keyboard_enter``; Finish → ``answer`` (with a message), then ``status`` complete. ``Launch app=""``
is an invalid step (the executor raises on it).

The server exposes no UI tree and no foreground app: observations carry an empty ``<hierarchy/>`` (unless
``ui_dump`` is given) and ``app=""``. It serves one emulator and one suite: use one client per server.

As an env backend of the pipeline (``mobilerl.env.factory``, backend ``androidworld``): :class:`AndroidWorldConfig`
is the config section (``evaluate.androidworld``, ``rl.androidworld``), :func:`androidworld_tasks` the suite as
task specs (``androidworld/<split>/<task type>/<index>``, the goal as instruction), :class:`AndroidWorldServers`
the env factory that leases each server to one env at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mobilerl.env.actions import (
    BACK,
    ENTER,
    FINISH,
    HOME,
    LAUNCH,
    LONG_PRESS,
    SWIPE,
    TAP,
    TYPE,
    WAIT,
    Action,
)
from mobilerl.env.base import EnvCrashed, EnvError, EnvTimeout, Observation, StepResult, TaskSpec
from mobilerl.env.cluster import check_server_urls

DEFAULT_URL = "http://localhost:5000"
EMPTY_HIERARCHY = "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\" />"
# AndroidWorld scroll direction = where the content moves = opposite of the finger (our Swipe) direction.
SCROLL_FOR_SWIPE = {"up": "down", "down": "up", "left": "right", "right": "left"}
SUITE = "androidworld"  # TaskSpec.suite of AndroidWorld's tasks


class AndroidWorldConfig(BaseModel):
    """AndroidWorld's env servers an evaluation or an RL run uses (``evaluate.androidworld``, ``rl.androidworld``)."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] = Field([], description=(
        "AndroidWorld servers (its server/android_server.py, one emulator each) as http(s)://host:port (empty: "
        "the ones rl.ray.androidworld launches)."))
    n_task_combinations: int = Field(2, ge=1, description="Instances of every task type in the suite the servers hold.")
    seed: int = Field(42, description="Seed of the suite's task parameters (the same on every server).")
    task_family: str = Field("android_world", description="AndroidWorld task family of the suite.")
    task_types: list[str] | None = Field(None, min_length=1, description="Task types run (None: every type).")
    max_steps: int = Field(20, ge=1, le=50, description=(
        "Step budget of a task (AndroidWorld's is 10 x the task's complexity, which its server does not expose)."))
    max_steps_by_type: dict[str, int] = Field({}, description="Step budgets of single task types over max_steps.")
    timeout_s: float = Field(300.0, gt=0, description="Seconds one HTTP call may take (task setup can be slow).")
    wait_to_stabilize: bool = Field(False, description="Ask the server for a stable screen before each screenshot.")

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return check_server_urls(v, "androidworld.urls") if v else v

    @field_validator("max_steps_by_type")
    @classmethod
    def _budgets(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if not 1 <= n <= 50}
        if bad:
            raise ValueError(f"androidworld.max_steps_by_type: budgets must be in 1..50, got {bad}")
        return v

    def shard(self, k: int, n: int) -> AndroidWorldConfig:
        """The servers of the ``k``-th of ``n`` processes sharing these (every ``n``-th URL)."""
        if n > len(self.urls):
            raise ValueError(f"{n} processes share {len(self.urls)} AndroidWorld server(s): each needs one of its own")
        return self.model_copy(update={"urls": self.urls[k::n]})


def parse_task(task: TaskSpec | str) -> tuple[str, int]:
    """(task_type, task_idx) from a TaskSpec or an id like ``androidworld/test/ContactsAddContact/3``.

    A TaskSpec may carry ``params["task_type"]``/``params["task_idx"]``; otherwise its template is the task
    type and the id's last segment the index. A bare ``"ContactsAddContact"`` means index 0.
    """
    if isinstance(task, TaskSpec):
        task_type = str(task.params.get("task_type") or task.template or "")
        idx = task.params.get("task_idx")
        if idx is None:
            tail = task.task_id.rsplit("/", 1)[-1]
            idx = int(tail) if tail.isdigit() else 0
        if not task_type:
            task_type = parse_task(task.task_id)[0]
        return task_type, int(idx)
    parts = [p for p in str(task).split("/") if p]
    if not parts:
        raise EnvError(f"empty AndroidWorld task id {task!r}")
    if parts[-1].isdigit():
        if len(parts) < 2:
            raise EnvError(f"AndroidWorld task id {task!r} has an index but no task type")
        return parts[-2], int(parts[-1])
    return parts[-1], 0


def to_json_action(action: Action, last_tap: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Our action as the AndroidWorld JSONAction dicts to send, in order (Finish may need two)."""
    name = action.name
    if name in (TAP, LONG_PRESS):
        if action.center is None:
            raise EnvError(f"{name} needs an element")
        x, y = action.center
        return [{"action_type": "click" if name == TAP else "long_press", "x": x, "y": y}]
    if name == TYPE:
        typed: dict[str, Any] = {"action_type": "input_text", "text": action.text or ""}
        if last_tap is not None:
            typed |= {"x": last_tap[0], "y": last_tap[1]}
        return [typed | {"clear_text": True}] if action.clear else [typed]
    if name == SWIPE:
        if action.direction is None:
            raise EnvError("Swipe needs a direction")
        return [{"action_type": "scroll", "direction": SCROLL_FOR_SWIPE[action.direction]}]
    if name == LAUNCH:
        if not action.app:
            raise EnvError("Launch needs an app name")
        return [{"action_type": "open_app", "app_name": action.app}]
    if name == BACK:
        return [{"action_type": "navigate_back"}]
    if name == HOME:
        return [{"action_type": "navigate_home"}]
    if name == WAIT:
        return [{"action_type": "wait"}]
    if name == ENTER:
        return [{"action_type": "keyboard_enter"}]
    if name == FINISH:
        out: list[dict[str, Any]] = []
        if action.message:
            out.append({"action_type": "answer", "text": action.message})
        out.append({"action_type": "status", "goal_status": "complete"})
        return out
    raise EnvError(f"no AndroidWorld equivalent for action {name!r}")


def pixels_to_image(pixels: Any) -> Image.Image:
    arr = np.asarray(pixels, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise EnvError(f"AndroidWorld /screenshot returned pixels of shape {arr.shape}, expected H×W×3")
    return Image.fromarray(np.ascontiguousarray(arr[:, :, :3]))  # uint8 H×W×3: RGB


class AndroidWorldEnv:
    """Synchronous :class:`~mobilerl.env.base.Env` over AndroidWorld's env server.

    Args:
        base_url: the server (``docker run --privileged -p 5000:5000 android_world:latest``).
        timeout: HTTP timeout in seconds (task initialisation can take a while).
        transport: an ``httpx.BaseTransport`` (tests pass ``httpx.MockTransport``).
        wait_to_stabilize: ask the server to wait for a stable screen before screenshots.
        ui_dump: optional callable returning the current uiautomator XML (the server has none).
        close_server: also ``POST /close`` (shuts the server's emulator env) in :meth:`close`.
        screenshot: observations carry the screenshot (False: only the screen size, learnt from one screenshot,
            for a policy that reads no pixels; the server's pixels are a JSON list, 30 MB a 1080x2400 screen).
        suite: ``(n_task_combinations, seed, task_family)`` of the suite a :class:`TaskSpec` was listed from: a
            server whose goal for the task differs (restarted with its image's default suite) is reinitialised to
            it before the task is set up.
        on_close: called once :meth:`close` is done (the factory's lease of the server ends).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
        wait_to_stabilize: bool = False,
        ui_dump: Callable[[], str] | None = None,
        close_server: bool = False,
        screenshot: bool = True,
        suite: tuple[int, int, str] | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.wait_to_stabilize = wait_to_stabilize
        self.ui_dump = ui_dump
        self.close_server = close_server
        self.screenshot_obs = screenshot
        self.suite = suite
        self.on_close = on_close
        self._size: tuple[int, int] | None = None  # (width, height), from the first screenshot
        self._http = {"base_url": self.base_url, "timeout": timeout, "transport": transport}
        self._client = httpx.Client(**self._http)
        self.task: tuple[str, int] | None = None
        self.goal: str | None = None
        self.steps = 0
        self._last_tap: tuple[int, int] | None = None

    # -- HTTP --

    def _request(
        self, method: str, path: str, *, params: dict | None = None, json: Any = None
    ) -> dict[str, Any]:
        try:
            resp = self._client.request(method, path, params=params, json=json)
        except httpx.TimeoutException as e:
            raise EnvTimeout(f"AndroidWorld server {self.base_url}{path} timed out: {e!r}") from e
        except httpx.TransportError as e:
            raise EnvCrashed(f"AndroidWorld server {self.base_url} unreachable: {e!r}") from e
        if resp.status_code >= 400:
            body = resp.text[:500]
            if resp.status_code >= 500 and self._http["transport"] is None:
                # uvicorn drops the connection after an unhandled exception: the next call must not reuse it
                self._client.close()
                self._client = httpx.Client(**self._http)
            raise EnvError(f"AndroidWorld server {method} {path} -> HTTP {resp.status_code}: {body}")
        try:
            return resp.json()
        except ValueError as e:
            raise EnvError(f"AndroidWorld server {path} returned non-JSON: {resp.text[:200]!r}") from e

    @staticmethod
    def _flag(value: bool) -> str:
        return "true" if value else "false"

    def health(self) -> bool:
        try:
            return self._request("GET", "/health").get("status") == "success"
        except EnvError:
            return False

    def task_list(self, max_index: int = -1) -> list[str]:
        return list(self._request("GET", "/suite/task_list", params={"max_index": max_index})["task_list"])

    def task_length(self, task_type: str) -> int:
        return int(self._request("GET", "/suite/task_length", params={"task_type": task_type})["length"])

    def reinitialize_suite(
        self, n_task_combinations: int = 2, seed: int = 42, task_family: str = "android_world"
    ) -> None:
        self._request(
            "GET",
            "/suite/reinitialize",
            params={"n_task_combinations": n_task_combinations, "seed": seed, "task_family": task_family},
        )

    def task_goal(self, task_type: str, task_idx: int) -> str:
        return str(
            self._request("GET", "/task/goal", params={"task_type": task_type, "task_idx": task_idx})["goal"]
        )

    def task_template(self, task_type: str, task_idx: int) -> str:
        params = {"task_type": task_type, "task_idx": task_idx}
        return str(self._request("GET", "/task/template", params=params)["template"])

    def execute(self, json_action: dict[str, Any]) -> None:
        self._request("POST", "/execute_action", json=json_action)

    def screenshot(self) -> Image.Image:
        data = self._request(
            "GET", "/screenshot", params={"wait_to_stabilize": self._flag(self.wait_to_stabilize)}
        )
        return pixels_to_image(data["pixels"])

    def observe(self) -> Observation:
        image = self.screenshot() if self.screenshot_obs or self._size is None else None
        if image is not None:
            self._size = image.size
        assert self._size is not None
        xml = self.ui_dump() if self.ui_dump is not None else EMPTY_HIERARCHY
        return Observation(xml=xml, app="", width=self._size[0], height=self._size[1],
                           screenshot=image if self.screenshot_obs else None, step=self.steps)

    # -- Env --

    def reset(self, task: TaskSpec | str) -> Observation:
        task_type, task_idx = parse_task(task)
        self._tear_down()
        self._request("POST", "/reset", params={"go_home": "true"})
        expected = task.instruction if isinstance(task, TaskSpec) and self.suite is not None else None
        try:
            self.goal = self.task_goal(task_type, task_idx)
        except EnvCrashed:
            raise
        except EnvError:
            if expected is None:
                raise
            self.goal = None  # e.g. an index past the default suite's: reinitialised below
        if expected is not None and self.goal != expected:
            self.reinitialize_suite(*self.suite)
            self.goal = self.task_goal(task_type, task_idx)
            if self.goal != expected:
                raise EnvError(f"AndroidWorld server {self.base_url}: {task_type}/{task_idx} has the goal "
                               f"{self.goal!r} in suite {self.suite}, the task list says {expected!r}")
        self._request("POST", "/task/initialize", params={"task_type": task_type, "task_idx": task_idx})
        self.task = (task_type, task_idx)
        self.steps = 0
        self._last_tap = None
        return self.observe()

    def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise EnvError("step() before reset()")
        self.steps += 1
        info: dict[str, Any] = {}
        try:
            payloads = to_json_action(action, self._last_tap)
        except EnvError as e:
            payloads, info["error"] = [], str(e)
        for payload in payloads:
            self.execute(payload)
        if action.name == TAP:
            self._last_tap = action.center
        elif action.name not in (TYPE, WAIT):
            self._last_tap = None  # the screen moved on: re-tapping that point could hit anything
        return StepResult(self.observe(), done=action.name == FINISH, info=info)

    def evaluate(self) -> float | None:
        if self.task is None:
            raise EnvError("evaluate() before reset()")
        task_type, task_idx = self.task
        score = self._request("GET", "/task/score", params={"task_type": task_type, "task_idx": task_idx})[
            "score"
        ]
        return None if score is None else float(score)

    def _tear_down(self) -> None:
        if self.task is not None:
            task_type, task_idx = self.task
            self.task = None
            self._request("POST", "/task/tear_down", params={"task_type": task_type, "task_idx": task_idx})

    def close(self) -> None:
        try:
            try:
                self._tear_down()
            except EnvError:
                pass  # closing must not fail because the server already went away
            if self.close_server:
                self._request("POST", "/close")
        finally:
            self._client.close()
            on_close, self.on_close = self.on_close, None
            if on_close is not None:
                on_close()


class AndroidWorldServers:
    """The ``androidworld`` env factory: each call an :class:`AndroidWorldEnv` on a server no other env of this
    factory holds (a server drives one emulator), the server free again once that env is closed.

    ``capacity`` (the number of servers) caps the env pool over it. A copy pickled into another process starts
    with all its servers free: give each process its own :meth:`shard`.
    """

    def __init__(self, config: AndroidWorldConfig, screenshot: bool = True):
        self.config, self.screenshot = config, screenshot
        self._free = list(config.urls)
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return len(self.config.urls)

    def shard(self, k: int, n: int) -> AndroidWorldServers:
        return AndroidWorldServers(self.config.shard(k, n), self.screenshot)

    def __call__(self) -> AndroidWorldEnv:
        with self._lock:
            if not self._free:
                raise EnvError(f"all {self.capacity} AndroidWorld server(s) hold an env already: "
                               "run at most as many episodes at once as there are servers")
            url = self._free.pop(0)
        c = self.config
        return AndroidWorldEnv(url, timeout=c.timeout_s, wait_to_stabilize=c.wait_to_stabilize,
                               screenshot=self.screenshot, suite=(c.n_task_combinations, c.seed, c.task_family),
                               on_close=lambda: self._release(url))

    def _release(self, url: str) -> None:
        with self._lock:
            self._free.append(url)

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "screenshot": self.screenshot}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state["screenshot"])


def androidworld_tasks(config: AndroidWorldConfig, split: str = "test", per_type: int | None = None,
                       transport: httpx.BaseTransport | None = None) -> list[TaskSpec]:
    """The suite as task specs: every server reinitialised to ``config``'s suite (so a task id means the same task
    on each), its task types (``config.task_types``; each at most ``per_type`` instances) with their goals.

    AndroidWorld has no train/test split: ``split`` only names the ids; a run that trains on AndroidWorld and
    evaluates on it should use another ``seed`` for each. Difficulty and optimal steps are unknown here (the
    server does not say); the step budget is ``max_steps`` (``max_steps_by_type``).
    """
    c = config
    clients = [AndroidWorldEnv(u, timeout=c.timeout_s, transport=transport) for u in c.urls]
    try:
        for client in clients:
            client.reinitialize_suite(c.n_task_combinations, c.seed, c.task_family)
        lists = [client.task_list() for client in clients]
        differ = [u for u, types in zip(c.urls, lists, strict=True) if types != lists[0]]
        if differ:
            raise EnvError(f"AndroidWorld servers {differ} list other task types than {c.urls[0]} after the same "
                           f"reinitialisation: run one android_world version on every server")
        types = c.task_types if c.task_types is not None else lists[0]
        unknown = sorted(set(types) - set(lists[0]))
        if unknown:
            raise ValueError(f"androidworld.task_types: {unknown} not in the suite of {c.urls[0]} "
                             f"({len(lists[0])} task types)")
        extra = sorted(set(c.max_steps_by_type) - set(lists[0]))
        if extra:
            raise ValueError(f"androidworld.max_steps_by_type: {extra} not in the suite of {c.urls[0]}")
        first = clients[0]
        tasks = []
        for task_type in types:
            n = first.task_length(task_type)
            for idx in range(n if per_type is None else min(n, per_type)):
                steps = c.max_steps_by_type.get(task_type, c.max_steps)
                tasks.append(TaskSpec(
                    f"{SUITE}/{split}/{task_type}/{idx}", SUITE, split, task_type, first.task_goal(task_type, idx),
                    params={"task_type": task_type, "task_idx": idx}, seed=c.seed, difficulty="unknown",
                    complexity=steps / 10))
        return tasks
    finally:
        for client in clients:
            client.close()  # no task was set up: only the HTTP client closes
