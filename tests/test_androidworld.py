"""The AndroidWorld env-server client against recorded responses shaped like ``server/android_server.py``."""

from __future__ import annotations

import json

import httpx
import pytest

from mobilerl.env.actions import Action
from mobilerl.env.androidworld import (
    EMPTY_HIERARCHY,
    AndroidWorldEnv,
    parse_task,
    pixels_to_image,
    to_json_action,
)
from mobilerl.env.base import EnvCrashed, EnvError, EnvTimeout, TaskSpec

# android_world/env/json_action.py: JSONAction's fields; anything else is a TypeError (HTTP 500).
JSON_ACTION_FIELDS = {"action_type", "index", "x", "y", "text", "direction", "goal_status", "app_name", "keycode",
                      "clear_text"}
GOAL = "Create a new contact for Emilia Gonzalez. Their number is +13920741751."
# A 3×2 screen (H=3, W=2): what /screenshot returns is state.pixels.tolist().
PIXELS = [[[255, 255, 255], [26, 115, 232]], [[0, 0, 0], [10, 20, 30]], [[1, 2, 3], [4, 5, 6]]]


class RecordedServer:
    """Answers like AndroidWorld's FastAPI server and records every request (method, path, params, body)."""

    def __init__(self, score: float = 1.0, fail: dict[str, httpx.Response] | None = None):
        self.requests: list[tuple[str, str, dict[str, str], object]] = []
        self.score = score
        self.fail = fail or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.requests.append((request.method, path, params, body))
        if path in self.fail:
            return self.fail[path]
        if path == "/execute_action" and (
            set(body) - JSON_ACTION_FIELDS or (body["action_type"] == "open_app" and not body.get("app_name"))
        ):
            # android_world/env/actuation.py raises ValueError("No app name provided"): the server answers 500.
            return httpx.Response(500, text="Internal Server Error")
        ok = {"status": "success"}
        routes = {
            ("GET", "/health"): ok,
            ("POST", "/reset"): {
                "status": "success",
                "message": f"Environment reset with go_home={params.get('go_home') == 'true'}.",
            },
            ("GET", "/screenshot"): {"pixels": PIXELS},
            ("POST", "/execute_action"): {
                "status": "success",
                "message": f"Action JSONAction({body}) executed.",
            },
            ("GET", "/suite/task_list"): {
                "task_list": ["ContactsAddContact", "SimpleCalendarAddOneEvent", "ExpenseDeleteSingle"]
            },
            ("GET", "/suite/task_length"): {"length": 2},
            ("GET", "/suite/reinitialize"): {
                "status": "success",
                "message": f"Task suite re-initialized with n_task_combinations={params.get('n_task_combinations')}, "
                f"seed={params.get('seed')}.",
            },
            ("POST", "/task/initialize"): {
                "status": "success",
                "message": f"Task {params.get('task_type')} {params.get('task_idx')} initialized.",
            },
            ("POST", "/task/tear_down"): {
                "status": "success",
                "message": f"Task {params.get('task_type')} {params.get('task_idx')} torn down.",
            },
            ("GET", "/task/score"): {"score": self.score},
            ("GET", "/task/goal"): {"goal": GOAL},
            ("GET", "/task/template"): {
                "template": "Create a new contact for {name}. Their number is {number}."
            },
            ("POST", "/close"): ok,
        }
        if (request.method, path) not in routes:
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json=routes[(request.method, path)])

    def actions(self) -> list[object]:
        return [body for method, path, _, body in self.requests if path == "/execute_action"]

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _, _ in self.requests]


def make_env(**kw) -> tuple[AndroidWorldEnv, RecordedServer]:
    server = RecordedServer(**{k: kw.pop(k) for k in ("score", "fail") if k in kw})
    return AndroidWorldEnv("http://aw:5000", transport=httpx.MockTransport(server), **kw), server


def test_reset_initialises_the_task_and_observes():
    env, server = make_env()
    obs = env.reset("androidworld/test/ContactsAddContact/1")
    assert server.requests == [
        ("POST", "/reset", {"go_home": "true"}, None),
        ("GET", "/task/goal", {"task_type": "ContactsAddContact", "task_idx": "1"}, None),
        ("POST", "/task/initialize", {"task_type": "ContactsAddContact", "task_idx": "1"}, None),
        ("GET", "/screenshot", {"wait_to_stabilize": "false"}, None),
    ]
    assert env.goal == GOAL and env.task == ("ContactsAddContact", 1)
    assert (obs.width, obs.height) == (2, 3) and obs.screenshot is not None
    assert obs.screenshot.getpixel((1, 0)) == (26, 115, 232)
    assert obs.xml == EMPTY_HIERARCHY and obs.app == ""

    # A second reset tears the previous task down first.
    env.reset("SimpleCalendarAddOneEvent/0")
    assert server.requests[4] == (
        "POST",
        "/task/tear_down",
        {"task_type": "ContactsAddContact", "task_idx": "1"},
        None,
    )
    assert server.requests[7][2] == {"task_type": "SimpleCalendarAddOneEvent", "task_idx": "0"}


def test_actions_map_to_json_actions():
    env, server = make_env()
    env.reset("ContactsAddContact/0")
    steps = [
        Action("Launch", app="Contacts"),
        Action("Tap", element=(833, 1901, 1017, 2085)),
        Action("Type", text="Emilia"),
        Action("Long Press", element=(0, 298, 1080, 456)),
        Action("Swipe", direction="up", dist="long"),
        Action("Swipe", direction="down"),
        Action("Swipe", direction="left", element=(0, 0, 100, 100)),
        Action("Swipe", direction="right"),
        Action("Back"),
        Action("Home"),
        Action("Wait"),
        Action("Enter"),
        Action("Type", text="Paris", clear=True),
    ]
    for action in steps:
        result = env.step(action)
        assert result.done is False and result.info == {}
    assert server.actions() == [
        {"action_type": "open_app", "app_name": "Contacts"},
        {"action_type": "click", "x": 925, "y": 1993},
        {"action_type": "input_text", "text": "Emilia", "x": 925, "y": 1993},  # types into the tapped field
        {"action_type": "long_press", "x": 540, "y": 377},
        {"action_type": "scroll", "direction": "down"},  # finger up = content scrolls down
        {"action_type": "scroll", "direction": "up"},
        {"action_type": "scroll", "direction": "right"},
        {"action_type": "scroll", "direction": "left"},
        {"action_type": "navigate_back"},
        {"action_type": "navigate_home"},
        {"action_type": "wait"},
        {"action_type": "keyboard_enter"},
        {"action_type": "input_text", "text": "Paris", "clear_text": True},  # no stale tap: the focused field
    ]
    # Every step re-observes with a screenshot.
    assert server.paths().count("GET /screenshot") == 1 + len(steps)
    assert result.observation.step == len(steps)


def test_finish_answers_then_sets_status_and_evaluate_scores():
    env, server = make_env(score=1.0)
    env.reset("ExpenseDeleteSingle/0")
    result = env.step(Action("Finish", message="3 expenses"))
    assert result.done is True
    assert server.actions() == [
        {"action_type": "answer", "text": "3 expenses"},
        {"action_type": "status", "goal_status": "complete"},
    ]
    assert env.evaluate() == 1.0
    assert server.requests[-1] == (
        "GET",
        "/task/score",
        {"task_type": "ExpenseDeleteSingle", "task_idx": "0"},
        None,
    )

    env, server = make_env(score=0.0)
    env.reset("ExpenseDeleteSingle/0")
    env.step(Action("Finish"))
    assert server.actions() == [{"action_type": "status", "goal_status": "complete"}]
    assert env.evaluate() == 0.0


def test_type_taps_only_a_field_tapped_just_before():
    # android_world/env/actuation.py: input_text with x, y clicks there first; without them it types into
    # the focused field.
    env, server = make_env()
    env.reset("ContactsAddContact/0")
    for action in [
        Action("Type", text="hi"),  # no tap yet
        Action("Tap", element=(0, 0, 100, 100)),
        Action("Wait"),
        Action("Type", text="a"),
        Action("Type", text="b"),
        Action("Tap", element=(0, 0, 100, 100)),
        Action("Swipe", direction="up"),
        Action("Type", text="c"),  # the tapped point scrolled away
    ]:
        assert env.step(action).info == {}
    texts = [(a["text"], a.get("x"), a.get("y")) for a in server.actions() if a["action_type"] == "input_text"]
    assert texts == [("hi", None, None), ("a", 50, 50), ("b", 50, 50), ("c", None, None)]
    for moved_on in (Action("Back"), Action("Home"), Action("Launch", app="Contacts"), Action("Enter")):
        env.step(Action("Tap", element=(0, 0, 100, 100)))
        env.step(moved_on)
        env.step(Action("Type", text="d"))
        assert "x" not in server.actions()[-1], moved_on


def test_launch_without_an_app_is_an_invalid_step_not_an_env_failure():
    env, server = make_env()
    env.reset("ContactsAddContact/0")
    result = env.step(Action("Launch", app=""))
    assert result.done is False and "app name" in result.info["error"]
    assert server.actions() == []  # the real server would answer 500, ending the episode
    with pytest.raises(EnvError, match="HTTP 500"):
        env.execute({"action_type": "open_app", "app_name": ""})


def test_close_tears_down_and_only_closes_the_server_when_asked():
    env, server = make_env()
    env.reset("ContactsAddContact/0")
    env.close()
    assert server.paths()[-1] == "POST /task/tear_down" and "POST /close" not in server.paths()

    env, server = make_env(close_server=True)
    env.reset("ContactsAddContact/0")
    env.close()
    assert server.paths()[-2:] == ["POST /task/tear_down", "POST /close"]


def test_suite_endpoints():
    env, server = make_env()
    assert env.health() is True
    assert env.task_list() == ["ContactsAddContact", "SimpleCalendarAddOneEvent", "ExpenseDeleteSingle"]
    assert env.task_length("ContactsAddContact") == 2
    env.reinitialize_suite(n_task_combinations=3, seed=7)
    assert env.task_template("ContactsAddContact", 0).startswith("Create a new contact")
    assert server.requests[1:4] == [
        ("GET", "/suite/task_list", {"max_index": "-1"}, None),
        ("GET", "/suite/task_length", {"task_type": "ContactsAddContact"}, None),
        (
            "GET",
            "/suite/reinitialize",
            {"n_task_combinations": "3", "seed": "7", "task_family": "android_world"},
            None,
        ),
    ]


def test_errors_map_to_env_errors():
    env, _ = make_env(fail={"/task/initialize": httpx.Response(500, text="Internal Server Error")})
    with pytest.raises(EnvError, match="POST /task/initialize -> HTTP 500: Internal Server Error") as info:
        env.reset("Bogus/0")
    assert not isinstance(info.value, EnvCrashed)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    env = AndroidWorldEnv(transport=httpx.MockTransport(refuse))
    with pytest.raises(EnvCrashed, match="unreachable"):
        env.reset("ContactsAddContact/0")
    assert env.health() is False

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(EnvTimeout, match="timed out"):
        AndroidWorldEnv(transport=httpx.MockTransport(slow)).reset("ContactsAddContact/0")
    with pytest.raises(EnvError, match="before reset"):
        make_env()[0].step(Action("Back"))


def test_parse_task_and_helpers():
    assert parse_task("androidworld/test/ContactsAddContact/3") == ("ContactsAddContact", 3)
    assert parse_task("ContactsAddContact/3") == ("ContactsAddContact", 3)
    assert parse_task("ContactsAddContact") == ("ContactsAddContact", 0)
    spec = TaskSpec("androidworld/test/MarkorCreateNote/2", "androidworld", "test", "MarkorCreateNote", "…")
    assert parse_task(spec) == ("MarkorCreateNote", 2)
    spec = TaskSpec(
        "x", "androidworld", "test", "ignored", "…", params={"task_type": "RecipeAddSingle", "task_idx": 5}
    )
    assert parse_task(spec) == ("RecipeAddSingle", 5)
    with pytest.raises(EnvError):
        parse_task("/")
    with pytest.raises(EnvError, match="no task type"):
        parse_task("7")
    assert to_json_action(Action("Swipe", direction="up")) == [{"action_type": "scroll", "direction": "down"}]
    with pytest.raises(EnvError, match="shape"):
        pixels_to_image([1, 2, 3])
