"""AndroidWorld-like tasks in Clock (alarms, timer, stopwatch), plus expert helpers shared by the
system-app task modules (steppers, reading a row's summary, lenient time / list answers)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.clock import DAYS, fmt_time, parse_hour
from mobilerl.env.sim.tasks.base import Expert, ExpertError, Template

NEW_LABELS = ("Dentist", "Pick up groceries", "Call the bank", "Take medicine", "Walk the dog", "Submit report",
              "Flight check-in", "Meditation", "Start cooking", "Leave for work", "Team sync", "Piano practice",
              "Pay rent", "Bedtime", "Evening run", "Feed the cat")


# ------------------------------------------------------------------------------------ expert helpers
def set_stepper(x: Expert, rid: str, label: str, target: int, parse: Callable[[str], int], period: int = 0
                ) -> Iterator[Action]:
    """Tap a Stepper's Increase/Decrease buttons (the shorter way round when it wraps at ``period``)
    until its on-screen value parses to ``target``."""
    inc, dec = f"Increase {label.lower()}", f"Decrease {label.lower()}"
    yield from x.scroll_to(desc=inc)
    for _ in range(120):
        cur = parse(x.el(rid=f"{rid}_value").text)
        if cur == target:
            return
        if period:
            diff = (target - cur) % period
            up = diff <= period - diff
        else:
            up = target > cur
        yield x.tap(desc=inc if up else dec)
    raise ExpertError(f"stepper {rid} never reached {target}")


def row_subtitle(x: Expert, title: str) -> Iterator[Action]:
    """Read the summary line under the list row titled ``title`` (scrolling it fully into view).
    Use as ``value = yield from row_subtitle(x, "Android version")``."""
    yield from x.scroll_to(text=title, rid="title")
    for _ in range(3):
        els = x.s.els
        for i, e in enumerate(els):
            if e.text == title and e.rid == "title" and i + 1 < len(els) and els[i + 1].rid == "subtitle":
                return els[i + 1].text
        yield x.swipe("up", "short")
    raise ExpertError(f"no summary under {title!r}")


def minute_value(s: str) -> int:
    return int(s)


# -------------------------------------------------------------------------------------- answer helpers
_TIME = re.compile(r"(\d{1,2})(?:[:.h](\d{2}))?\s*(a\.?m\.?|p\.?m\.?)?", re.I)


def times_in(answer: str | None) -> set[tuple[int, int]]:
    """Clock times mentioned in a free-text answer (``7:30 PM``, ``19:30``, ``7 pm``, ``19h30``)."""
    out: set[tuple[int, int]] = set()
    for m in _TIME.finditer(answer or ""):
        h, mm, ampm = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").lower()
        if not m.group(2) and not ampm:
            continue  # a bare number is not a time
        if ampm:
            if not 1 <= h <= 12:
                continue
            h = h % 12 + (12 if ampm.startswith("p") else 0)
        if 0 <= h < 24 and 0 <= mm < 60:
            out.add((h, mm))
    return out


def _norm_item(s: str) -> str:
    s = s.strip().strip(".'\"\u201c\u201d").lower()
    return " ".join(s.split())


def titles_match(answer: str | None, expected: list[str]) -> bool:
    """Comma / 'and' separated list answer equals the expected set of titles (order-free)."""
    if answer is None:
        return False
    parts = re.split(r",|;|\n|\band\b", answer)
    got = {_norm_item(p) for p in parts if _norm_item(p)}
    return got == {_norm_item(t) for t in expected}


def days_phrase(days: list[int]) -> str:
    names = [DAYS[d] for d in sorted(days)]
    if sorted(days) == [0, 1, 2, 3, 4]:
        return "weekday (Monday to Friday)"
    if sorted(days) == [5, 6]:
        return "Saturday and Sunday"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ---------------------------------------------------------------------------------------- clock bits
def _clock(dev):
    return dev.app("Clock")


def free_slot(rng, dev, taken: set[tuple[int, int]] | None = None) -> tuple[int, int]:
    used = {(a.hour, a.minute) for a in _clock(dev).alarms} | (taken or set())
    while True:
        h, m = rng.randrange(5, 23), rng.randrange(0, 12) * 5
        if (h, m) not in used:
            return h, m


def create_alarm(x: Expert, hour: int, minute: int, label: str | None = None, days: list[int] | None = None,
                 vibrate: bool | None = None) -> Iterator[Action]:
    """From the Alarm tab: add an alarm with the given time (and optional label/days/vibrate) and save."""
    yield x.tap(desc="Add alarm")
    yield from set_stepper(x, "hour", "Hour", hour, parse_hour, 24)
    yield from set_stepper(x, "minute", "Minute", minute, minute_value, 60)
    for d in days or []:
        box = x.s.find(text=DAYS[d], cls="CheckBox")
        if box is None:
            yield from x.scroll_to(text=DAYS[d], cls="CheckBox")
            box = x.el(text=DAYS[d], cls="CheckBox")
        if not box.checked:
            yield x.tap(text=DAYS[d], cls="CheckBox")
    if vibrate is not None:
        yield from x.scroll_to(rid="vibrate", cls="Switch")
        if x.el(rid="vibrate", cls="Switch").checked != vibrate:
            yield x.tap(rid="vibrate", cls="Switch")
    if label:
        yield from x.fill("label", label)
    yield x.tap(desc="Save", rid="save")


def alarm_ok(dev, p, hour: int, minute: int, label: str | None = None, days: set[int] | None = None,
             vibrate: bool | None = None) -> bool:
    """Exactly one new alarm, at ``hour:minute``, enabled, with the wanted attributes; none removed."""
    clock = _clock(dev)
    if len(clock.alarms) != p["n_alarms"] + 1:
        return False
    have = {(a.hour, a.minute) for a in clock.alarms}
    if not all(tuple(t) in have for t in p["orig_times"]):
        return False
    hits = clock.find_alarms(hour, minute)
    if len(hits) != 1:
        return False
    a = hits[0]
    if not a.enabled:
        return False
    if label is not None and a.label.strip().lower() != label.strip().lower():
        return False
    if days is not None and a.days != days:
        return False
    return vibrate is None or a.vibrate == vibrate


def orig_alarms(dev) -> dict:
    alarms = _clock(dev).alarms
    return {"n_alarms": len(alarms), "orig_times": [[a.hour, a.minute] for a in alarms]}


# ------------------------------------------------------------------------------------------ templates
class ClockStopWatchRunning(Template):
    name = "ClockStopWatchRunning"
    template = "Run the stopwatch in the Clock app."
    difficulty = "easy"
    tags = ()
    apps = ("Clock",)
    complexity = 1.0

    def check(self, dev, p):
        return _clock(dev).stopwatch.status == "running"

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield x.tap(rid="tab_stopwatch")
        yield x.tap(text="Start", rid="start")
        yield x.finish()


class ClockTimerStart(Template):
    name = "ClockTimerStart"
    template = "Start a timer for {minutes} minutes in the Clock app."
    difficulty = "easy"
    tags = ("parameterized",)
    apps = ("Clock",)
    complexity = 2.0

    def sample(self, rng, dev):
        return {"minutes": rng.randrange(2, 13)}

    def check(self, dev, p):
        t = _clock(dev).timer
        return t.status == "running" and t.duration == p["minutes"] * 60 and t.left(dev.now) > 0

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield x.tap(rid="tab_timer")
        yield from set_stepper(x, "timer_hours", "Hours", 0, int, 24)
        yield from set_stepper(x, "timer_minutes", "Minutes", p["minutes"], int, 60)
        yield from set_stepper(x, "timer_seconds", "Seconds", 0, int, 60)
        yield x.tap(text="Start", rid="start")
        yield x.finish()


class ClockTimerEntry(Template):
    name = "ClockTimerEntry"
    template = "Create a timer of {duration} in the Clock app. Do not start the timer."
    difficulty = "medium"
    tags = ("data_entry", "parameterized")
    apps = ("Clock",)
    complexity = 4.0

    def sample(self, rng, dev):
        h, m, s = rng.randrange(0, 3), rng.randrange(1, 26), rng.randrange(1, 12) * 5
        parts = ([f"{h} hour" + ("s" if h > 1 else "")] if h else []) + [f"{m} minutes", f"{s} seconds"]
        return {"hours": h, "minutes": m, "seconds": s, "duration": ", ".join(parts[:-1]) + " and " + parts[-1]}

    def check(self, dev, p):
        t = _clock(dev).timer
        return t.status == "idle" and (t.hours, t.minutes, t.seconds) == (p["hours"], p["minutes"], p["seconds"])

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield x.tap(rid="tab_timer")
        yield from set_stepper(x, "timer_hours", "Hours", p["hours"], int, 24)
        yield from set_stepper(x, "timer_minutes", "Minutes", p["minutes"], int, 60)
        yield from set_stepper(x, "timer_seconds", "Seconds", p["seconds"], int, 60)
        yield x.finish()


class ClockDeleteAlarm(Template):
    name = "ClockDeleteAlarm"
    template = "Delete the {time} alarm in the Clock app."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Clock",)
    complexity = 1.2

    def sample(self, rng, dev):
        a = rng.choice(_clock(dev).alarms)
        return {"time": a.time, "hour": a.hour, "minute": a.minute, **orig_alarms(dev)}

    def check(self, dev, p):
        clock = _clock(dev)
        return not clock.find_alarms(p["hour"], p["minute"]) and len(clock.alarms) == p["n_alarms"] - 1

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield x.tap(desc=f"{p['time']} alarm")
        yield from x.tap_scrolled(text="Delete", rid="delete")
        yield x.tap(rid="confirm_delete")
        yield x.finish()


class ClockDisableAllAlarms(Template):
    name = "ClockDisableAllAlarms"
    template = "Turn off all of my alarms in the Clock app, but do not delete them."
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Clock",)
    complexity = 1.2

    def sample(self, rng, dev):
        alarms = _clock(dev).ordered()
        extra = rng.sample(range(len(alarms)), 2)
        return {"enable": [[alarms[i].hour, alarms[i].minute] for i in extra], **orig_alarms(dev)}

    def setup(self, dev, p):
        for h, m in p["enable"]:
            for a in _clock(dev).find_alarms(h, m):
                a.enabled = True

    def check(self, dev, p):
        clock = _clock(dev)
        return len(clock.alarms) == p["n_alarms"] and not any(a.enabled for a in clock.alarms)

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield from disable_all_alarms(x)
        yield x.finish()


def disable_all_alarms(x: Expert) -> Iterator[Action]:
    for _ in range(12):
        on = next((e for e in x.s.find_all(rid="onoff", cls="Switch") if e.checked), None)
        if on is None:
            return
        yield Action("Tap", element=on.bounds)
    raise ExpertError("alarms kept turning on")


class ClockSetAlarm(Template):
    name = "ClockSetAlarm"
    template = "Create an alarm at {time} with the label '{label}' in the Clock app."
    difficulty = "medium"
    tags = ("data_entry", "parameterized")
    apps = ("Clock",)
    complexity = 3.0

    def sample(self, rng, dev):
        h, m = free_slot(rng, dev)
        return {"time": fmt_time(h, m), "hour": h, "minute": m, "label": rng.choice(NEW_LABELS), **orig_alarms(dev)}

    def check(self, dev, p):
        return alarm_ok(dev, p, p["hour"], p["minute"], label=p["label"])

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield from create_alarm(x, p["hour"], p["minute"], label=p["label"])
        yield x.finish()


class ClockAlarmRepeatDays(Template):
    name = "ClockAlarmRepeatDays"
    template = ("Set an alarm for {time} that repeats every {days_text}, with vibration turned off, "
                "in the Clock app.")
    difficulty = "hard"
    tags = ("data_entry", "complex_ui_understanding", "parameterized")
    apps = ("Clock",)
    complexity = 3.5

    def sample(self, rng, dev):
        h, m = free_slot(rng, dev)
        kind = rng.random()
        if kind < 0.3:
            days = [0, 1, 2, 3, 4]
        elif kind < 0.45:
            days = [5, 6]
        else:
            days = sorted(rng.sample(range(7), rng.randrange(2, 4)))
        return {"time": fmt_time(h, m), "hour": h, "minute": m, "days": days, "days_text": days_phrase(days),
                **orig_alarms(dev)}

    def check(self, dev, p):
        return alarm_ok(dev, p, p["hour"], p["minute"], days=set(p["days"]), vibrate=False)

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield from create_alarm(x, p["hour"], p["minute"], days=p["days"], vibrate=False)
        yield x.finish()


class ClockEarliestAlarmQuery(Template):
    name = "ClockEarliestAlarmQuery"
    template = ("What time is my earliest alarm that is switched on in the Clock app? "
                "Answer with the time only, e.g. 6:30 AM.")
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Clock",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        a = next(a for a in _clock(dev).ordered() if a.enabled)
        return {"hour": a.hour, "minute": a.minute}

    def check(self, dev, p):
        return times_in(dev.answer) == {(p["hour"], p["minute"])}

    def expert(self, p, x):
        yield from x.launch("Clock")
        for row in x.s.find_all(rid="alarm"):
            on = next(e for e in x.s.find_all(rid="onoff", cls="Switch")
                      if row.bounds[1] <= e.bounds[1] and e.bounds[3] <= row.bounds[3])
            if on.checked:
                yield x.finish(row.desc.removesuffix(" alarm"))
                return
        raise ExpertError("no alarm is on")
