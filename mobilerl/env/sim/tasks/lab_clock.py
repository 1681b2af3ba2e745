"""AndroidLab-style tasks in Clock (alarm set / alarm query / timer), with sub-goals for Sub-SR."""

from __future__ import annotations

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.clock import fmt_time
from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_clock import (
    NEW_LABELS,
    alarm_ok,
    create_alarm,
    free_slot,
    orig_alarms,
    set_stepper,
)


def _clock(dev):
    return dev.app("Clock")


def _lab_time(h: int, m: int) -> str:
    """AndroidLab writes times as ``3PM`` / ``6:45AM``."""
    suffix = "AM" if h < 12 else "PM"
    return f"{h % 12 or 12}{suffix}" if m == 0 else f"{h % 12 or 12}:{m:02d}{suffix}"


class LabClockAlarmWithLabel(Template):
    suite = "lab"
    name = "LabClockAlarmWithLabel"
    template = 'Set an alarm for {when} with the label "{label}" using Clock.'
    difficulty = "medium"
    tags = ("data_entry",)
    apps = ("Clock",)
    complexity = 3.0

    def sample(self, rng, dev):
        h, m = free_slot(rng, dev)
        if rng.random() < 0.5:
            m = 0
            while any(a.hour == h and a.minute == 0 for a in _clock(dev).alarms):
                h = (h + 1) % 24
        return {"when": _lab_time(h, m), "hour": h, "minute": m, "label": rng.choice(NEW_LABELS), **orig_alarms(dev)}

    def check(self, dev, p):
        return alarm_ok(dev, p, p["hour"], p["minute"], label=p["label"])

    def subgoals(self, p):
        return [("open Clock", lambda dev: dev.foreground == "Clock" or self.check(dev, p)),
                (f"an alarm at {fmt_time(p['hour'], p['minute'])} exists",
                 lambda dev: bool(_clock(dev).find_alarms(p["hour"], p["minute"]))),
                ("the alarm carries the label", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield from create_alarm(x, p["hour"], p["minute"], label=p["label"])
        yield x.finish()


class LabClockTurnOffAlarm(Template):
    suite = "lab"
    name = "LabClockTurnOffAlarm"
    template = "Turn off the alarm at {when}"
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Clock",)
    complexity = 1.0

    def sample(self, rng, dev):
        a = rng.choice(_clock(dev).alarms)
        others = [[b.hour, b.minute, b.enabled] for b in _clock(dev).alarms if b is not a]
        return {"when": _lab_time(a.hour, a.minute), "time": a.time, "hour": a.hour, "minute": a.minute,
                "others": others}

    def setup(self, dev, p):
        for a in _clock(dev).find_alarms(p["hour"], p["minute"]):
            a.enabled = True

    def _untouched(self, dev, p) -> bool:
        clock = _clock(dev)
        return len(clock.alarms) == len(p["others"]) + 1 and all(
            any(a.enabled == on for a in clock.find_alarms(h, m)) for h, m, on in p["others"])

    def check(self, dev, p):
        hits = _clock(dev).find_alarms(p["hour"], p["minute"])
        return len(hits) == 1 and not hits[0].enabled and self._untouched(dev, p)

    def subgoals(self, p):
        return [("the alarm still exists", lambda dev: bool(_clock(dev).find_alarms(p["hour"], p["minute"]))),
                ("the alarm is switched off", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Clock")
        row = x.el(desc=f"{p['time']} alarm")
        sw = next(e for e in x.s.find_all(rid="onoff", cls="Switch")
                  if row.bounds[1] <= e.bounds[1] and e.bounds[3] <= row.bounds[3])
        if sw.checked:
            yield Action("Tap", element=sw.bounds)
        yield x.finish()


class LabClockCountEnabled(Template):
    suite = "lab"
    name = "LabClockCountEnabled"
    template = "How many alarms have been turned on?"
    difficulty = "easy"
    tags = ("information_retrieval", "math_counting")
    apps = ("Clock",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        return {"count": sum(a.enabled for a in _clock(dev).alarms)}

    def check(self, dev, p):
        words = ("zero", "one", "two", "three", "four", "five", "six", "seven")
        return answer_matches(dev.answer, [str(p["count"]), words[p["count"]]], numeric=True)

    def subgoals(self, p):
        return [("open the alarm list in Clock", lambda dev: dev.foreground == "Clock" or self.check(dev, p)),
                ("answer with the number of alarms that are on", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Clock")
        n = sum(e.checked for e in x.s.find_all(rid="onoff", cls="Switch"))
        yield x.finish(str(n))


class LabClockWeekendAlarm(Template):
    suite = "lab"
    name = "LabClockWeekendAlarm"
    template = 'I need to set a {when} clock every weekend, and label it as "{label}" to remind me'
    difficulty = "hard"
    tags = ("data_entry",)
    apps = ("Clock",)
    complexity = 3.5

    def sample(self, rng, dev):
        h, m = free_slot(rng, dev)
        return {"when": _lab_time(h, m), "hour": h, "minute": m,
                "label": rng.choice(("Watch football games", "Farmers market", "Long run", "Call grandma",
                                     "Brunch", "Clean the house")), **orig_alarms(dev)}

    def check(self, dev, p):
        return alarm_ok(dev, p, p["hour"], p["minute"], label=p["label"], days={5, 6})

    def subgoals(self, p):
        def at(dev):
            return bool(_clock(dev).find_alarms(p["hour"], p["minute"]))

        def weekend(dev):
            return any(a.days == {5, 6} for a in _clock(dev).find_alarms(p["hour"], p["minute"]))

        return [("an alarm at the time exists", at), ("it repeats on Saturday and Sunday only", weekend),
                ("it is labelled as asked", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield from create_alarm(x, p["hour"], p["minute"], label=p["label"], days=[5, 6])
        yield x.finish()


class LabClockCountdownNoStart(Template):
    suite = "lab"
    name = "LabClockCountdownNoStart"
    template = "Set a countdown timer for {h} hour {m} minutes but do not start it"
    difficulty = "medium"
    tags = ("data_entry",)
    apps = ("Clock",)
    complexity = 3.0

    def sample(self, rng, dev):
        return {"h": rng.randrange(1, 3), "m": rng.choice([5, 10, 15, 20, 40, 45, 50])}

    def instruction(self, p):
        return self.template.format(**p).replace("2 hour ", "2 hours ")

    def check(self, dev, p):
        t = _clock(dev).timer
        return t.status == "idle" and (t.hours, t.minutes, t.seconds) == (p["h"], p["m"], 0)

    def subgoals(self, p):
        t = lambda dev: _clock(dev).timer  # noqa: E731
        return [("hours set", lambda dev: t(dev).hours == p["h"]),
                ("minutes set", lambda dev: t(dev).minutes == p["m"] and t(dev).hours == p["h"]),
                ("timer set and not started", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Clock")
        yield x.tap(rid="tab_timer")
        yield from set_stepper(x, "timer_hours", "Hours", p["h"], int, 24)
        yield from set_stepper(x, "timer_minutes", "Minutes", p["m"], int, 60)
        yield from set_stepper(x, "timer_seconds", "Seconds", 0, int, 60)
        yield x.finish()
