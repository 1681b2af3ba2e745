"""AndroidWorld-like tasks in Simple Calendar Pro (the ``SimpleCalendar*`` family), and one
Calendar → Clock task."""

from __future__ import annotations

import calendar as _cal
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.calendar import Event
from mobilerl.env.sim.apps.clock import fmt_time
from mobilerl.env.sim.tasks.base import Expert, ExpertError, Template, answer_matches
from mobilerl.env.sim.tasks.world_clock import (
    alarm_ok,
    create_alarm,
    orig_alarms,
    row_subtitle,
    set_stepper,
    titles_match,
)

NEW_TITLES = ("Dinner with friends", "Team offsite", "Annual checkup", "Guitar lesson", "Coffee chat",
              "Museum visit", "Bike repair", "Apartment viewing", "Study group", "Swimming lesson", "Wine tasting",
              "Flu shot", "Hackathon kickoff", "Garden club", "Mentoring session", "Passport renewal",
              "Product demo", "Cooking class", "Salsa class", "Open house", "Car wash", "Pitch rehearsal")
NEW_DESCRIPTIONS = ("Bring a water bottle", "Ask about the schedule", "Book a table in advance", "Print the tickets",
                    "Take the blue folder", "Arrive 10 minutes early", "Invite Sam as well", "Pay at the desk",
                    "Bring the charger", "Remember the gift")
NEW_LOCATIONS = ("Room 101", "Central Park", "Main Library", "Studio 5", "Cafe Aroma", "Hall B", "City Museum",
                 "Rooftop terrace")


def _cal_app(dev):
    return dev.app("Calendar")


def date_text(d: date) -> str:
    return f"{_cal.month_name[d.month]} {d.day}, {d.year}"


def _d(iso: str) -> date:
    return date.fromisoformat(iso)


# ------------------------------------------------------------------------------------ expert helpers
def goto_day(x: Expert, d: date) -> Iterator[Action]:
    """From the month view: move to ``d``'s month with the arrows and open that day."""
    name, year = x.s.title.rsplit(" ", 1)
    month = list(_cal.month_name).index(name)
    diff = (d.year * 12 + d.month) - (int(year) * 12 + month)
    for _ in range(abs(diff)):
        yield x.tap(desc="Next month" if diff > 0 else "Previous month")
    yield x.tap(desc=str(d.day), rid="day")


def hhmm(s: str) -> tuple[int, int]:
    h, m = s.split(":")
    return int(h), int(m)


def fill_event(x: Expert, title: str, hour: int | None = None, minute: int | None = None,
               minutes: int | None = None, location: str | None = None, description: str | None = None
               ) -> Iterator[Action]:
    """On the event editor: set the time pickers, then the text fields, then Save."""
    if hour is not None:
        yield from set_stepper(x, "event_hour", "Hour", hour, int, 24)
    if minute is not None:
        yield from set_stepper(x, "event_minute", "Minute", minute, int, 60)
    if minutes is not None:
        yield from set_stepper(x, "event_duration", "Duration", minutes, _parse_minutes)
    yield from x.fill("event_title_input", title)
    if location is not None:
        yield from x.fill("event_location_input", location)
    if description is not None:
        yield from x.fill("event_description_input", description)
    yield x.tap(desc="Save")


def _parse_minutes(s: str) -> int:
    total, parts = 0, s.split()
    for num, unit in zip(parts[::2], parts[1::2], strict=True):
        total += int(num) * (60 if unit == "h" else 1)
    return total


def event_ok(dev, p, title: str, start: datetime, minutes: int | None = None, location: str | None = None,
             description: str | None = None, extra: int = 1) -> bool:
    cal = _cal_app(dev)
    if len(cal.events) != p["n_events"] + extra:
        return False
    hits = cal.find(title)
    if len(hits) != 1:
        return False
    e = hits[0]
    if e.all_day or e.start != start:
        return False
    if minutes is not None and e.minutes != minutes:
        return False
    if location is not None and e.location.strip().lower() != location.lower():
        return False
    return description is None or e.description.strip().lower() == description.lower()


# ------------------------------------------------------------------------------------------ templates
class SimpleCalendarEventsOnDate(Template):
    name = "SimpleCalendarEventsOnDate"
    template = ("What events do I have on {date_text} in Simple Calendar Pro? Answer with the titles only; "
                "if there are several, separate them with commas.")
    difficulty = "medium"
    tags = ("information_retrieval", "parameterized")
    apps = ("Calendar",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        cal = _cal_app(dev)
        days = sorted({e.day for e in cal.events})
        d = rng.choice(days)
        return {"date": d.isoformat(), "date_text": date_text(d), "titles": [e.title for e in cal.on_day(d)]}

    def check(self, dev, p):
        return titles_match(dev.answer, p["titles"])

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield from goto_day(x, _d(p["date"]))
        titles = [e.text for e in x.s.find_all(rid="title")]
        if not titles:
            raise ExpertError("no events on the day page")
        yield x.finish(", ".join(titles))


class SimpleCalendarDeleteEventsOnDate(Template):
    name = "SimpleCalendarDeleteEventsOnDate"
    template = "In Simple Calendar Pro, delete all the calendar events on {date_text}."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Calendar",)
    complexity = 1.8

    def sample(self, rng, dev):
        cal = _cal_app(dev)
        while True:
            d = dev.now.date() + timedelta(days=rng.randrange(1, 26))
            have = cal.on_day(d)
            if len(have) <= 2:
                break
        busy = {e.start.hour for e in have}
        k = max(1, 2 - len(have)) + (len(have) < 2 and rng.random() < 0.3)
        used = {e.title for e in cal.events}
        extra = []
        for t in rng.sample([t for t in NEW_TITLES if t not in used], k):
            h = rng.choice([h for h in range(8, 20) if h not in busy])
            busy.add(h)
            extra.append([t, h, rng.choice([0, 30]), rng.choice([30, 60])])
        return {"date": d.isoformat(), "date_text": date_text(d), "extra": extra,
                "n_events": len(cal.events) + len(extra), "n_day": len(have) + len(extra),
                "day_titles": [e.title for e in have] + [t for t, *_ in extra]}

    def setup(self, dev, p):
        d = _d(p["date"])
        for t, h, m, dur in p["extra"]:
            _cal_app(dev).events.append(Event(t, datetime.combine(d, time(h, m)), dur, location="Office",
                                              description=""))

    def check(self, dev, p):
        cal = _cal_app(dev)
        deleted = {entry.split(":", 1)[1] for entry in dev.log if entry.startswith("event_deleted:")}
        return (not cal.on_day(_d(p["date"])) and len(cal.events) == p["n_events"] - p["n_day"]
                and set(p["day_titles"]) <= deleted)

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield from goto_day(x, _d(p["date"]))
        for _ in range(10):
            if x.s.find(rid="event_item") is None:
                break
            yield x.tap(rid="event_item")
            yield x.tap(desc="Delete")
            yield x.tap(rid="confirm_delete")
        yield x.finish()


class SimpleCalendarLocationOfEvent(Template):
    name = "SimpleCalendarLocationOfEvent"
    template = "What is the location of my '{title}' event in Simple Calendar Pro? Answer with the location only."
    difficulty = "easy"
    tags = ("information_retrieval", "search", "parameterized")
    apps = ("Calendar",)
    complexity = 1.5
    task_type = "query"

    def sample(self, rng, dev):
        cal = _cal_app(dev)
        today = dev.now.date()
        e = rng.choice([e for e in cal.events if e.day > today and e.location])
        return {"title": e.title, "location": e.location}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["location"])

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield x.tap(desc="Event list")
        yield from x.tap_scrolled(text=p["title"], rid="title")
        yield x.finish(x.el(rid="event_location").text)


class SimpleCalendarAddEventTomorrow(Template):
    name = "SimpleCalendarAddEventTomorrow"
    template = ("In Simple Calendar Pro, create a calendar event for tomorrow at {hour}h with the title "
                "'{title}' and the description '{description}'.")
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("Calendar",)
    complexity = 2.5

    def sample(self, rng, dev):
        used = {e.title for e in _cal_app(dev).events}
        return {"hour": rng.randrange(8, 21), "title": rng.choice([t for t in NEW_TITLES if t not in used]),
                "description": rng.choice(NEW_DESCRIPTIONS), "date": (dev.now.date() + timedelta(days=1)).isoformat(),
                "n_events": len(_cal_app(dev).events)}

    def check(self, dev, p):
        start = datetime.combine(_d(p["date"]), time(p["hour"], 0))
        return event_ok(dev, p, p["title"], start, description=p["description"])

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield x.tap(desc="New event")
        yield x.tap(desc="Increase date")
        yield from fill_event(x, p["title"], hour=p["hour"], minute=0, description=p["description"])
        yield x.finish()


class SimpleCalendarAddOneEvent(Template):
    name = "SimpleCalendarAddOneEvent"
    template = ("In Simple Calendar Pro, create a calendar event on {date_text} at {time} with the title "
                "'{title}' and the description '{description}'. The event should last for {minutes} minutes.")
    difficulty = "hard"
    tags = ("data_entry", "complex_ui_understanding", "parameterized")
    apps = ("Calendar",)
    complexity = 3.2

    def sample(self, rng, dev):
        d = dev.now.date() + timedelta(days=rng.randrange(2, 31))
        h, m = rng.randrange(8, 21), rng.choice([0, 15, 30, 45])
        used = {e.title for e in _cal_app(dev).events}
        return {"date": d.isoformat(), "date_text": date_text(d), "hour": h, "minute": m, "time": f"{h:02d}:{m:02d}",
                "minutes": rng.choice([30, 45, 90, 120]),
                "title": rng.choice([t for t in NEW_TITLES if t not in used]),
                "description": rng.choice(NEW_DESCRIPTIONS), "n_events": len(_cal_app(dev).events)}

    def check(self, dev, p):
        start = datetime.combine(_d(p["date"]), time(p["hour"], p["minute"]))
        return event_ok(dev, p, p["title"], start, minutes=p["minutes"], description=p["description"])

    def subgoals(self, p):
        return [("an event with the title exists", lambda dev: bool(_cal_app(dev).find(p["title"]))),
                ("the event is complete and correct", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield from goto_day(x, _d(p["date"]))
        yield x.tap(desc="New event")
        yield from fill_event(x, p["title"], hour=p["hour"], minute=p["minute"], minutes=p["minutes"],
                              description=p["description"])
        yield x.finish()


class SimpleCalendarAddSeveralEvents(Template):
    name = "SimpleCalendarAddSeveralEvents"
    template = "In Simple Calendar Pro, add these three events on {date_text}: {items}."
    difficulty = "hard"
    tags = ("data_entry", "parameterized")
    apps = ("Calendar",)
    complexity = 5.0

    def sample(self, rng, dev):
        d = dev.now.date() + timedelta(days=rng.randrange(3, 21))
        default = (dev.now.hour + 1) % 24
        hours = rng.sample([h for h in range(default - 5, default + 6) if 3 <= abs(h - default) <= 5 and 6 <= h <= 22], 3)
        used = {e.title for e in _cal_app(dev).events}
        titles = rng.sample([t for t in NEW_TITLES if t not in used], 3)
        locs = rng.sample(NEW_LOCATIONS, 3)
        events = [[t, h, loc] for t, h, loc in zip(titles, hours, locs, strict=True)]
        items = "; ".join(f"'{t}' at {h}:00 in {loc}" for t, h, loc in events)
        return {"date": d.isoformat(), "date_text": date_text(d), "events": events, "items": items,
                "n_events": len(_cal_app(dev).events)}

    def _one(self, dev, p, ev) -> bool:
        t, h, loc = ev
        hits = _cal_app(dev).find(t)
        return (len(hits) == 1 and not hits[0].all_day and hits[0].location.lower() == loc.lower()
                and hits[0].start == datetime.combine(_d(p["date"]), time(h, 0)))

    def check(self, dev, p):
        return len(_cal_app(dev).events) == p["n_events"] + 3 and all(self._one(dev, p, ev) for ev in p["events"])

    def subgoals(self, p):
        return [(f"event '{ev[0]}' added", lambda dev, ev=ev: self._one(dev, p, ev)) for ev in p["events"][:2]] + [
            ("all three events added", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield from goto_day(x, _d(p["date"]))
        for t, h, loc in p["events"]:
            yield x.tap(desc="New event")
            yield from fill_event(x, t, hour=h, minute=0, location=loc)
        yield x.finish()


class ClockAlarmForEvent(Template):
    name = "ClockAlarmForEvent"
    template = ("Look up when my '{title}' event starts in Simple Calendar Pro, then create an alarm in the "
                "Clock app at that exact time with the label '{title}'.")
    difficulty = "hard"
    tags = ("multi_app", "memorization", "parameterized")
    apps = ("Calendar", "Clock")
    complexity = 4.0

    def sample(self, rng, dev):
        today = dev.now.date()
        taken = {(a.hour, a.minute) for a in dev.app("Clock").alarms}
        evs = [e for e in _cal_app(dev).events if e.day > today and (e.start.hour, e.start.minute) not in taken]
        e = rng.choice(evs)
        return {"title": e.title, "hour": e.start.hour, "minute": e.start.minute,
                "time": fmt_time(e.start.hour, e.start.minute), **orig_alarms(dev)}

    def check(self, dev, p):
        return alarm_ok(dev, p, p["hour"], p["minute"], label=p["title"])

    def subgoals(self, p):
        return [("an alarm exists at the event's start time",
                 lambda dev: bool(dev.app("Clock").find_alarms(p["hour"], p["minute"]))),
                ("the alarm is labelled with the event title", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Calendar")
        yield x.tap(desc="Event list")
        when = yield from row_subtitle(x, p["title"])
        h, m = hhmm(when.split(" - ")[0])
        yield from x.launch("Clock")
        yield from create_alarm(x, h, m, label=p["title"])
        yield x.finish()
