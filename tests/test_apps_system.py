"""System apps of the simulator: Clock, Settings, Calendar — their templates and a few app behaviours."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.sim import SimEnv
from mobilerl.env.sim.device import Device, Perturb
from mobilerl.env.sim.tasks import OracleAgent, get_task, templates
from mobilerl.env.sim.tasks.lab_settings import yes_no
from mobilerl.env.sim.tasks.world_clock import times_in, titles_match

PREFIXES = ("Clock", "System", "SimpleCalendar", "LabClock", "LabSettings", "LabCalendar")
MINE = [(t.suite, t.name) for s in ("world", "lab") for t in templates(s) if t.name.startswith(PREFIXES)]


def _solve(task_id: str, perturb: str = "default") -> SimEnv:
    """Run the expert like run_oracle does, but hand back the environment for inspection."""
    env = SimEnv(perturb=perturb)
    obs = env.reset(task_id)
    agent = OracleAgent(env.tmpl, env.task.params)
    done = False
    while not done:
        res = env.step(agent.act(env.screen()))
        obs, done = res.observation, res.done
    assert obs is not None
    return env


def _fresh(task_id: str) -> tuple[Device, object, dict]:
    spec = get_task(task_id, with_optimal=False)
    from mobilerl.env.sim.tasks import template

    tmpl = template(spec.suite, spec.template)
    dev = Device(seed=spec.seed, perturb=Perturb())
    tmpl.setup(dev, spec.params)
    return dev, tmpl, spec.params


def test_template_mix():
    world = [t for t in templates("world") if t.name.startswith(PREFIXES)]
    lab = [t for t in templates("lab") if t.name.startswith(PREFIXES)]
    assert len(world) >= 19 and len(lab) >= 7
    assert sum("multi_app" in t.tags for t in world) >= 2
    assert {t.task_type for t in lab} == {"operation", "query"}
    for t in lab:
        assert 2 <= len(t.subgoals(get_task(f"lab/test/{t.name}/0", with_optimal=False).params)) <= 4


@pytest.mark.parametrize("suite,name", MINE)
def test_expert_solves(suite, name):
    for i, pert in ((0, "default"), (1, "heavy")):
        env = _solve(f"{suite}/test/{name}/{i}", pert)
        assert env.device.finished and env.evaluate() == 1.0, (name, i, pert)
        if suite == "lab":
            assert all(env.subgoals())


@pytest.mark.parametrize("suite,name", MINE)
def test_initial_state_rejected(suite, name):
    for i in range(2):
        dev, tmpl, p = _fresh(f"{suite}/test/{name}/{i}")
        dev.finished = True
        for answer in (None, "I don't know"):
            dev.answer = answer
            assert not tmpl.check(dev, p), (name, i, answer)


def test_wrong_end_states_rejected():
    # Wrong label on the new alarm.
    env = _solve("world/test/ClockSetAlarm/0")
    p = env.task.params
    alarm = env.device.app("Clock").find_alarms(p["hour"], p["minute"])[0]
    alarm.label = "something else"
    assert not env.tmpl.check(env.device, p)
    # Deleting one alarm too many.
    env = _solve("world/test/ClockDeleteAlarm/0")
    assert env.evaluate() == 1.0
    env.device.app("Clock").alarms.pop()
    assert not env.tmpl.check(env.device, env.task.params)
    # A timer that was started although the task said not to.
    env = _solve("world/test/ClockTimerEntry/0")
    env.device.app("Clock").timer.status = "running"
    assert not env.tmpl.check(env.device, env.task.params)
    # Uninstalling a second app.
    env = _solve("world/test/SystemUninstallApp/0")
    settings = env.device.app("Settings")
    other = next(e.name for e in settings.third_party())
    settings.uninstalled.append(other)
    assert not env.tmpl.check(env.device, env.task.params)
    # Event at the wrong hour.
    env = _solve("world/test/SimpleCalendarAddOneEvent/0")
    ev = env.device.app("Calendar").find(env.task.params["title"])[0]
    ev.start += timedelta(hours=1)
    assert not env.tmpl.check(env.device, env.task.params)
    # Deleting an event on another day as well.
    env = _solve("world/test/SimpleCalendarDeleteEventsOnDate/0")
    env.device.app("Calendar").events.pop()
    assert not env.tmpl.check(env.device, env.task.params)
    # Multi-app: the alarm must carry the event's title.
    env = _solve("world/test/ClockAlarmForEvent/0")
    p = env.task.params
    env.device.app("Clock").find_alarms(p["hour"], p["minute"])[0].label = ""
    assert not env.tmpl.check(env.device, p)


def test_query_answers():
    assert titles_match("Yoga class, Haircut", ["Haircut", "Yoga class"])
    assert titles_match("Haircut and yoga class.", ["Haircut", "Yoga class"])
    assert not titles_match("Haircut", ["Haircut", "Yoga class"])
    assert not titles_match("Haircut, Yoga class, Book club", ["Haircut", "Yoga class"])
    assert times_in("It starts at 2:30 PM") == {(14, 30)}
    assert times_in("14:30") == {(14, 30)}
    assert times_in("7 am") == {(7, 0)}
    assert times_in("3 events") == set()
    assert yes_no("Yes, it is on") is True and yes_no("It's not on") is False and yes_no("No") is False
    assert yes_no("I do not know") is None
    dev, tmpl, p = _fresh("world/test/SimpleCalendarEventsOnDate/0")
    dev.finished = True
    dev.answer = ", ".join(p["titles"])
    assert tmpl.check(dev, p)
    dev.answer = ", ".join(p["titles"][:-1]) or "Nothing"
    assert not tmpl.check(dev, p)
    dev, tmpl, p = _fresh("world/test/SystemAndroidVersion/0")
    dev.finished, dev.answer = True, p["version"]
    assert tmpl.check(dev, p)
    dev.answer = str(int(p["version"]) - 1)
    assert not tmpl.check(dev, p)


# ------------------------------------------------------------------------------------- app behaviour
def _env(app: str) -> SimEnv:
    env = SimEnv(perturb="none")
    env.reset("world/test/SimpleCalendarAddSeveralEvents/0")  # no set-up, a 50-step budget
    env.step(Action(A.LAUNCH, app=app))
    return env


def _tap(env: SimEnv, **query) -> None:
    e = env.screen().find(**query)
    assert e is not None, query
    env.step(Action(A.TAP, element=e.bounds))


def test_clock_switch_delete_and_stopwatch():
    env = _env("Clock")
    clock = env.device.app("Clock")
    first = clock.ordered()[0]
    before = first.enabled
    sw = env.screen().find_all(rid="onoff", cls="Switch")[0]
    assert sw.checked == before
    env.step(Action(A.TAP, element=sw.bounds))
    assert first.enabled != before
    assert env.screen().find_all(rid="onoff", cls="Switch")[0].checked == first.enabled
    # delete through the editor
    n = len(clock.alarms)
    _tap(env, desc=f"{first.time} alarm")
    for _ in range(3):
        if env.screen().find(rid="delete") is None:
            env.step(Action(A.SWIPE, direction="up", dist="medium"))
    _tap(env, rid="delete")
    _tap(env, rid="confirm_delete")
    assert len(clock.alarms) == n - 1 and first not in clock.alarms
    assert env.screen().find(desc=f"{first.time} alarm") is None
    # the stopwatch follows the device clock
    _tap(env, rid="tab_stopwatch")
    _tap(env, rid="start")
    for _ in range(4):
        env.step(Action(A.WAIT))
    assert env.screen().find(rid="stopwatch_time").text == "00:12.00"  # a Wait is 3 s of device time
    _tap(env, rid="pause")  # a tap is 5 s
    env.step(Action(A.WAIT))
    assert env.screen().find(rid="stopwatch_time").text == "00:17.00"  # paused: no longer moving


def test_settings_wifi_scroll_and_uninstall():
    env = _env("Settings")
    settings = env.device.app("Settings")
    assert env.screen().find(text="About phone") is None  # below the fold
    env.step(Action(A.SWIPE, direction="up", dist="long"))
    assert env.screen().find(text="About phone") is not None
    env.step(Action(A.SWIPE, direction="down", dist="long"))
    _tap(env, text="Network & internet")
    _tap(env, text="Internet", rid="title")
    wifi = settings.wifi
    _tap(env, rid="wifi_switch", cls="Switch")
    assert settings.wifi != wifi and env.screen().find(rid="wifi_switch").checked == settings.wifi
    # the app list is long: its last entry only appears after scrolling
    env.step(Action(A.LAUNCH, app="Settings"))
    _tap(env, text="Apps", rid="title")
    _tap(env, contains="See all", rid="title")
    last = settings.installed()[-1].name
    assert env.screen().find(text=last) is None
    for _ in range(10):
        env.step(Action(A.SWIPE, direction="up", dist="long"))
    assert env.screen().find(text=last) is not None
    target = settings.third_party()[-1].name
    _tap(env, text=target, rid="title")
    _tap(env, rid="uninstall")
    _tap(env, rid="confirm_uninstall")
    assert target not in {e.name for e in settings.installed()}
    assert env.screen().title == "All apps"


def test_calendar_months_events_and_delete():
    env = _env("Calendar")
    cal = env.device.app("Calendar")
    title = env.screen().title
    env.step(Action(A.SWIPE, direction="left"))
    assert env.screen().title != title
    _tap(env, desc="Previous month")
    assert env.screen().title == title
    # create an event today through the editor
    _tap(env, desc="New event")
    _tap(env, rid="event_title_input")
    env.step(Action(A.TYPE, text="Unit test event"))
    _tap(env, desc="Save")
    made = cal.find("Unit test event")
    assert len(made) == 1 and made[0].day == env.device.now.date()
    _tap(env, desc=str(made[0].day.day), rid="day")
    assert env.screen().find(text="Unit test event") is not None
    n = len(cal.events)
    _tap(env, text="Unit test event")
    _tap(env, desc="Delete")
    _tap(env, rid="confirm_delete")
    assert len(cal.events) == n - 1 and not cal.find("Unit test event")
    assert env.screen().find(text="Unit test event") is None
