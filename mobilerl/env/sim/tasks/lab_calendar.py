"""AndroidLab-style tasks in Simple Calendar Pro (arrange / edit events, event queries), with sub-goals."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from mobilerl.env.sim.tasks.base import Template
from mobilerl.env.sim.tasks.world_calendar import NEW_TITLES, fill_event, goto_day, hhmm
from mobilerl.env.sim.tasks.world_clock import times_in

NOTES = ("conference room B202", "classroom 101", "bring the laptop", "computer", "Hello", "call ahead",
         "gate 14", "second floor, left")


def _cal(dev):
    return dev.app("Calendar")


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _upcoming(rng, dev):
    today = dev.now.date()
    return rng.choice([e for e in _cal(dev).events if e.day > today])


def open_event(x, title: str):
    yield from x.launch("Calendar")
    yield x.tap(desc="Event list")
    yield from x.tap_scrolled(text=title, rid="title")


class LabCalendarArrangeWithNote(Template):
    suite = "lab"
    name = "LabCalendarArrangeWithNote"
    template = 'Help me arrange an event titled "{title}" at {month_day} with note "{note}".'
    difficulty = "medium"
    tags = ("data_entry",)
    apps = ("Calendar",)
    complexity = 2.5

    def sample(self, rng, dev):
        d = dev.now.date() + timedelta(days=rng.randrange(1, 30))
        used = {e.title for e in _cal(dev).events}
        return {"title": rng.choice([t for t in NEW_TITLES if t not in used]), "date": d.isoformat(),
                "month_day": f"{d.strftime('%B')} {_ordinal(d.day)}", "note": rng.choice(NOTES),
                "n_events": len(_cal(dev).events)}

    def _event(self, dev, p):
        hits = _cal(dev).find(p["title"])
        return hits[0] if len(hits) == 1 else None

    def check(self, dev, p):
        e = self._event(dev, p)
        return (e is not None and e.day == date.fromisoformat(p["date"])
                and e.description.strip().lower() == p["note"].lower() and len(_cal(dev).events) == p["n_events"] + 1)

    def subgoals(self, p):
        return [("an event with the title exists", lambda dev: self._event(dev, p) is not None),
                ("the event is on the right day", lambda dev: (e := self._event(dev, p)) is not None
                 and e.day == date.fromisoformat(p["date"])),
                ("the note is saved", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield from goto_day(x, date.fromisoformat(p["date"]))
        yield x.tap(desc="New event")
        yield from fill_event(x, p["title"], description=p["note"])
        yield x.finish()


class LabCalendarAddNote(Template):
    suite = "lab"
    name = "LabCalendarAddNote"
    template = 'add the note "{note}" to the event "{title}"'
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Calendar",)
    complexity = 1.8

    def sample(self, rng, dev):
        e = _upcoming(rng, dev)
        return {"title": e.title, "note": rng.choice(NOTES), "start": e.start.isoformat(),
                "n_events": len(_cal(dev).events)}

    def check(self, dev, p):
        hits = _cal(dev).find(p["title"])
        return (len(hits) == 1 and p["note"].lower() in hits[0].description.lower()
                and hits[0].start == datetime.fromisoformat(p["start"]) and len(_cal(dev).events) == p["n_events"])

    def subgoals(self, p):
        return [("open the event", lambda dev: dev.foreground == "Calendar" and any(
                    ps.name in ("event", "edit") for ps in _cal(dev).stack) or self.check(dev, p)),
                ("the note is added", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from open_event(x, p["title"])
        yield x.tap(desc="Edit")
        yield from x.fill("event_description_input", p["note"])
        yield x.tap(desc="Save")
        yield x.finish()


class LabCalendarAllDay(Template):
    suite = "lab"
    name = "LabCalendarAllDay"
    template = 'Edit the event titled "{title}" and make it an all-day event.'
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Calendar",)
    complexity = 1.6

    def sample(self, rng, dev):
        e = _upcoming(rng, dev)
        return {"title": e.title, "date": e.day.isoformat(), "n_events": len(_cal(dev).events)}

    def check(self, dev, p):
        hits = _cal(dev).find(p["title"])
        return (len(hits) == 1 and hits[0].all_day and hits[0].day == date.fromisoformat(p["date"])
                and len(_cal(dev).events) == p["n_events"])

    def subgoals(self, p):
        return [("open the event", lambda dev: dev.foreground == "Calendar" and any(
                    ps.name in ("event", "edit") for ps in _cal(dev).stack) or self.check(dev, p)),
                ("the event is all-day", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from open_event(x, p["title"])
        yield x.tap(desc="Edit")
        if not x.el(rid="event_all_day", cls="Switch").checked:
            yield x.tap(rid="event_all_day", cls="Switch")
        yield x.tap(desc="Save")
        yield x.finish()


class LabCalendarEventStartQuery(Template):
    suite = "lab"
    name = "LabCalendarEventStartQuery"
    template = 'At what time does the event "{title}" start?'
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Calendar",)
    complexity = 1.5
    task_type = "query"

    def sample(self, rng, dev):
        e = _upcoming(rng, dev)
        return {"title": e.title, "hour": e.start.hour, "minute": e.start.minute}

    def check(self, dev, p):
        got = times_in(dev.answer)
        return got == {(p["hour"], p["minute"])}

    def subgoals(self, p):
        return [("open the event list or the event", lambda dev: dev.foreground == "Calendar" or self.check(dev, p)),
                ("answer with the start time", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from open_event(x, p["title"])
        start = x.el(rid="event_time").text.split(" - ")[0]
        h, m = hhmm(start)
        yield x.finish(time(h, m).strftime("%H:%M"))
