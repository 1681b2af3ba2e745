"""Clock (modelled on Google's Clock, com.google.android.deskclock): Alarm / Timer / Stopwatch tabs.

Alarms: a list sorted by time with on/off switches; the FAB or a tap on an alarm opens the alarm editor
(hour and minute pickers in 1-hour / 5-minute steps, a label, repeat days, sound, vibrate, delete with a
confirmation). Timer: hour/minute/second pickers and Start; the countdown follows ``device.now``.
Stopwatch: Start / Pause / Lap / Reset, also driven by ``device.now`` (every action advances the clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import (
    Button,
    Buttons,
    Checkbox,
    Dialog,
    Field,
    IconButton,
    Page,
    Row,
    Spacer,
    Stepper,
    Switch,
    Text,
)

TABS = ("Alarm", "Timer", "Stopwatch")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
DAYS_SHORT = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
SOUNDS = ("Argon", "Beep-Beep", "Bright Morning", "Cesium", "Fresh Start", "Helium", "Krypton", "Neon",
          "Osmium", "Oxygen", "Platinum", "Timer")
LABELS = ("Wake up", "Gym", "Medication", "School run", "Team standup", "Pick up kids", "Yoga", "Lunch",
          "Call mom", "Take out trash", "Water plants", "Laundry")
MINUTE_STEP = 5


def fmt_time(hour: int, minute: int) -> str:
    """12-hour clock as the app shows it: ``7:05 AM``."""
    return f"{hour % 12 or 12}:{minute:02d} {'AM' if hour < 12 else 'PM'}"


def fmt_hour(hour: int) -> str:
    return f"{hour % 12 or 12} {'AM' if hour < 12 else 'PM'}"


def parse_hour(s: str) -> int:
    """Inverse of :func:`fmt_hour` (``"7 PM"`` → 19)."""
    num, ampm = s.split()
    h = int(num) % 12
    return h + (12 if ampm.upper() == "PM" else 0)


def days_summary(days: set[int] | frozenset[int]) -> str:
    if not days:
        return "Not repeating"
    if len(days) == 7:
        return "Every day"
    return ", ".join(DAYS_SHORT[d] for d in sorted(days))


def fmt_duration(seconds: int) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def fmt_stopwatch(seconds: float) -> str:
    total = int(seconds)
    cs = int(round((seconds - total) * 100)) % 100
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}.{cs:02d}" if h else f"{m:02d}:{s:02d}.{cs:02d}"


@dataclass
class Alarm:
    hour: int
    minute: int
    enabled: bool = True
    label: str = ""
    days: set[int] = field(default_factory=set)
    vibrate: bool = True
    sound: str = "Cesium"

    @property
    def time(self) -> str:
        return fmt_time(self.hour, self.minute)


@dataclass
class TimerState:
    hours: int = 0
    minutes: int = 0
    seconds: int = 0
    status: str = "idle"  # idle | running | paused
    duration: int = 0  # seconds, set when started (+1:00 adds to it)
    end_at: datetime | None = None
    remaining: int = 0  # while paused

    @property
    def setting(self) -> int:
        return self.hours * 3600 + self.minutes * 60 + self.seconds

    def left(self, now: datetime) -> int:
        if self.status == "running" and self.end_at is not None:
            return max(0, int((self.end_at - now).total_seconds()))
        if self.status == "paused":
            return self.remaining
        return self.setting


@dataclass
class StopwatchState:
    status: str = "idle"  # idle | running | paused
    started_at: datetime | None = None
    accumulated: float = 0.0
    laps: list[float] = field(default_factory=list)  # cumulative time at each lap

    def elapsed(self, now: datetime) -> float:
        extra = (now - self.started_at).total_seconds() if self.status == "running" and self.started_at else 0.0
        return self.accumulated + extra


class Clock(App):
    name = "Clock"
    package = "com.google.android.deskclock"
    color = (66, 133, 244)
    aliases = ("clock", "alarm", "deskclock", "google clock")

    def setup(self) -> None:
        rng = self.rng
        n = rng.randrange(3, 7)
        slots = rng.sample([(h, m) for h in range(5, 23) for m in range(0, 60, 15)], n)
        labels = rng.sample(LABELS, n)
        self.alarms: list[Alarm] = []
        for (h, m), label in zip(slots, labels, strict=True):
            kind = rng.random()
            if kind < 0.3:
                days: set[int] = set()
            elif kind < 0.55:
                days = {0, 1, 2, 3, 4}
            elif kind < 0.65:
                days = {5, 6}
            elif kind < 0.8:
                days = set(range(7))
            else:
                days = set(rng.sample(range(7), rng.randrange(1, 4)))
            self.alarms.append(Alarm(h, m, enabled=rng.random() < 0.6, label=label if rng.random() < 0.7 else "",
                                     days=days, vibrate=rng.random() < 0.7, sound=rng.choice(SOUNDS)))
        if not any(a.enabled for a in self.alarms):
            self.alarms[0].enabled = True
        self.timer = TimerState()
        self.stopwatch = StopwatchState()

    # -- queries used by tasks
    def ordered(self) -> list[Alarm]:
        return sorted(self.alarms, key=lambda a: (a.hour, a.minute))

    def find_alarms(self, hour: int, minute: int) -> list[Alarm]:
        return [a for a in self.alarms if a.hour == hour and a.minute == minute]

    # -- tabs
    def _tab(self, tab: str) -> None:
        st = self.stack[0]
        st.args["tab"] = tab
        st.scroll = 0

    def on_swipe(self, direction: str) -> bool:
        if self.page.name != "main":
            return False
        i = TABS.index(self.page.args.get("tab", "Alarm"))
        j = i + (1 if direction == "left" else -1)
        if 0 <= j < len(TABS):
            self._tab(TABS[j])
            return True
        return False

    def page_main(self, st: PageState) -> Page:
        tab = st.args.get("tab", "Alarm")
        tabs = [Button(t, lambda t=t: self._tab(t), rid=f"tab_{t.lower()}", primary=t != tab) for t in TABS]
        if tab == "Timer":
            body, fab = self._timer_body(), None
        elif tab == "Stopwatch":
            body, fab = self._stopwatch_body(), None
        else:
            body = self._alarm_rows()
            fab = IconButton("Add alarm", self._new_alarm, rid="fab")
        return Page(tab, body=body, tabs=tabs, fab=fab, scroll_rid="alarm_list" if tab == "Alarm" else "content_list",
                    actions=[IconButton("More options", lambda: self.dialog(self._about_dialog), rid="more")])

    def _about_dialog(self) -> Dialog:
        return Dialog("Clock", "Version 7.4 (Google)", buttons=[Button("OK", self.close_dialog, rid="ok")])

    # -- alarms
    def _alarm_rows(self) -> list:
        rows: list = []
        for a in self.ordered():
            sub = days_summary(a.days)
            if a.label:
                sub = f"{a.label} · {sub}"
            rows.append(Row(a.time, sub, on_tap=lambda a=a: self._edit_alarm(a),
                            on_long=lambda a=a: self.dialog(lambda a=a: self._delete_dialog(a)),
                            rid="alarm", desc=f"{a.time} alarm",
                            trailing=Switch("", a.enabled, lambda a=a: self._toggle(a), rid="onoff")))
        if not rows:
            rows.append(Text("No alarms", rid="empty"))
        rows.append(Spacer(260))  # room under the FAB
        return rows

    def _toggle(self, a: Alarm) -> None:
        a.enabled = not a.enabled
        self.device.log.append(f"alarm_toggle:{a.time}:{'on' if a.enabled else 'off'}")

    def _new_alarm(self) -> None:
        now = self.device.now
        draft = {"hour": now.hour, "minute": now.minute - now.minute % MINUTE_STEP, "days": set(),
                 "vibrate": True, "sound": "Cesium"}
        self.push("edit", alarm=None, draft=draft)

    def _edit_alarm(self, a: Alarm) -> None:
        draft = {"hour": a.hour, "minute": a.minute, "days": set(a.days), "vibrate": a.vibrate, "sound": a.sound}
        self.push("edit", alarm=a, draft=draft)
        self.page.fields["label"] = a.label

    def _delete_dialog(self, a: Alarm) -> Dialog:
        def delete() -> None:
            if a in self.alarms:
                self.alarms.remove(a)
                self.device.log.append(f"alarm_deleted:{a.time}")
            self.close_dialog()
            if self.page.name == "edit":
                self.pop()
            self.device.toast = "Alarm deleted"

        return Dialog("Delete alarm?", f"The {a.time} alarm will be deleted.",
                      buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                               Button("Delete", delete, rid="confirm_delete")])

    def page_edit(self, st: PageState) -> Page:
        a: Alarm | None = st.args["alarm"]
        d = st.args["draft"]

        def bump(key: str, delta: int, mod: int) -> None:
            d[key] = (d[key] + delta) % mod

        def toggle_day(i: int) -> None:
            d["days"] ^= {i}

        def toggle_vibrate() -> None:
            d["vibrate"] = not d["vibrate"]

        def save() -> None:
            label = st.fields.get("label", "").strip()
            target = a or Alarm(0, 0)
            target.hour, target.minute = d["hour"], d["minute"]
            target.days, target.vibrate, target.sound = set(d["days"]), d["vibrate"], d["sound"]
            target.label, target.enabled = label, True
            if a is None:
                self.alarms.append(target)
            self.device.log.append(f"alarm_saved:{target.time}")
            self.device.toast = f"Alarm set for {target.time}"
            self.pop()

        body: list = [
            Text(fmt_time(d["hour"], d["minute"]), size="title", rid="time_display"),
            Stepper("Hour", fmt_hour(d["hour"]), lambda: bump("hour", -1, 24), lambda: bump("hour", 1, 24),
                    rid="hour"),
            Stepper("Minute", f"{d['minute']:02d}", lambda: bump("minute", -MINUTE_STEP, 60),
                    lambda: bump("minute", MINUTE_STEP, 60), rid="minute"),
            Field("label", "Add label", rid="label", label="Label"),
            Text("Repeat", size="header"),
        ]
        body += [Checkbox(DAYS[i], i in d["days"], lambda i=i: toggle_day(i), rid=f"day_{DAYS_SHORT[i].lower()}")
                 for i in range(7)]
        body += [
            Row("Alarm sound", d["sound"], on_tap=lambda: self.push("sound", draft=d), rid="sound"),
            Switch("Vibrate", d["vibrate"], toggle_vibrate, rid="vibrate"),
        ]
        if a is not None:
            body.append(Button("Delete", lambda: self.dialog(lambda: self._delete_dialog(a)), rid="delete",
                               primary=False))
        # Save lives in the toolbar: the framework's bottom bar ends 2 px below the screen edge when the
        # keyboard is hidden, so parsers that drop out-of-bounds nodes would never see it.
        return Page("Edit alarm" if a else "Add alarm", body=body, nav_back=True,
                    actions=[IconButton("Save", save, rid="save")], scroll_rid="alarm_editor")

    def page_sound(self, st: PageState) -> Page:
        d = st.args["draft"]

        def choose(s: str) -> None:
            d["sound"] = s
            self.pop()

        rows = [Row(s, on_tap=lambda s=s: choose(s), rid="sound_option", selected=s == d["sound"]) for s in SOUNDS]
        return Page("Alarm sound", body=rows, nav_back=True, scroll_rid="sound_list")

    # -- timer
    def _timer_body(self) -> list:
        t = self.timer
        now = self.device.now
        if t.status == "idle":

            def bump(attr: str, delta: int, mod: int) -> None:
                setattr(t, attr, (getattr(t, attr) + delta) % mod)

            def start() -> None:
                if t.setting == 0:
                    self.device.toast = "Set a time first"
                    return
                t.duration = t.setting
                t.end_at = self.device.now + timedelta(seconds=t.duration)
                t.status = "running"
                self.device.log.append(f"timer_start:{t.duration}")

            return [
                Text(f"{t.hours:02d}h {t.minutes:02d}m {t.seconds:02d}s", size="title", rid="timer_setup"),
                Stepper("Hours", f"{t.hours:02d}", lambda: bump("hours", -1, 24), lambda: bump("hours", 1, 24),
                        rid="timer_hours"),
                Stepper("Minutes", f"{t.minutes:02d}", lambda: bump("minutes", -1, 60),
                        lambda: bump("minutes", 1, 60), rid="timer_minutes"),
                Stepper("Seconds", f"{t.seconds:02d}", lambda: bump("seconds", -5, 60),
                        lambda: bump("seconds", 5, 60), rid="timer_seconds"),
                Spacer(60),
                Button("Start", start, rid="start"),
            ]
        left = t.left(now)

        def pause() -> None:
            t.remaining = t.left(self.device.now)
            t.status = "paused"

        def resume() -> None:
            t.end_at = self.device.now + timedelta(seconds=t.remaining)
            t.status = "running"

        def reset() -> None:
            t.status, t.end_at, t.remaining, t.duration = "idle", None, 0, 0

        def add_minute() -> None:
            t.duration += 60
            if t.status == "running" and t.end_at is not None:
                t.end_at = max(t.end_at, self.device.now) + timedelta(seconds=60)
            else:
                t.remaining += 60

        body: list = [Text(fmt_duration(left), size="title", rid="timer_time"),
                      Text(f"Timer · {fmt_duration(t.duration)}", size="small", rid="timer_label")]
        if t.status == "running" and left == 0:
            body += [Text("Time's up", rid="timer_done"), Button("Stop", reset, rid="stop")]
        elif t.status == "running":
            body.append(Buttons([Button("Pause", pause, rid="pause"), Button("+1:00", add_minute, rid="add_minute",
                                                                             primary=False)]))
            body.append(Button("Delete", reset, rid="delete_timer", primary=False))
        else:
            body.append(Buttons([Button("Resume", resume, rid="resume"), Button("Reset", reset, rid="reset",
                                                                               primary=False)]))
        return body

    # -- stopwatch
    def _stopwatch_body(self) -> list:
        sw = self.stopwatch

        def start() -> None:
            sw.started_at = self.device.now
            sw.status = "running"
            self.device.log.append("stopwatch_start")

        def pause() -> None:
            sw.accumulated = sw.elapsed(self.device.now)
            sw.started_at = None
            sw.status = "paused"

        def lap() -> None:
            sw.laps.append(sw.elapsed(self.device.now))

        def reset() -> None:
            sw.status, sw.started_at, sw.accumulated, sw.laps = "idle", None, 0.0, []

        body: list = [Text(fmt_stopwatch(sw.elapsed(self.device.now)), size="title", rid="stopwatch_time")]
        if sw.status == "idle":
            body.append(Button("Start", start, rid="start"))
        elif sw.status == "running":
            body.append(Buttons([Button("Lap", lap, rid="lap", primary=False), Button("Pause", pause, rid="pause")]))
        else:
            body.append(Buttons([Button("Reset", reset, rid="reset", primary=False),
                                 Button("Resume", start, rid="resume")]))
        prev = 0.0
        laps = []
        for i, total in enumerate(sw.laps, 1):
            laps.append(Row(f"Lap {i}", fmt_stopwatch(total - prev), rid="lap_row",
                            trailing=Text(fmt_stopwatch(total), rid="lap_total")))
            prev = total
        body.extend(reversed(laps))
        return body
