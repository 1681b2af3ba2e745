"""Calendar (modelled on Simple Calendar Pro, com.simplemobiletools.calendar.pro).

Month view (a 7-column grid of days, previous/next-month arrows or horizontal swipes), an event list
(upcoming events grouped by day), a day view, event details (delete behind a confirmation), and the
event editor: title, location and description fields, an all-day switch, date / hour / minute / duration
steppers, repetition and reminder choices. Events are seeded around ``device.now``.
"""

from __future__ import annotations

import calendar as _cal
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import (
    Button,
    Dialog,
    Field,
    Grid,
    IconButton,
    Page,
    Row,
    Stepper,
    Switch,
    Text,
    virtualize,
)

TITLES = ("Team meeting", "Dentist appointment", "Yoga class", "Project review", "Book club", "Piano lesson",
          "Grocery shopping", "Parent-teacher conference", "Haircut", "Car service", "Budget planning",
          "Code review", "Doctor's appointment", "Sprint planning", "Volunteer shift", "Movie night",
          "Gym session", "Quarterly report", "Client call", "Design workshop", "Language exchange",
          "Pottery class", "Vet appointment", "Farmers market", "Board game night", "Tax consultation",
          "Interview prep", "Photography walk")
PERSONAL = ("Lunch with {}", "Coffee with {}", "Call with {}", "Birthday party for {}", "1:1 with {}")
LOCATIONS = ("Conference Room B", "Room 204", "Main Street Clinic", "Downtown Gym", "Café Lumière",
             "City Library", "Zoom", "Google Meet", "Community Center", "Town Hall", "Riverside Park",
             "Office, 3rd floor")
DESCRIPTIONS = ("Discuss quarterly goals", "Bring the printed agenda", "Remember to bring ID",
                "Review last week's action items", "Prepare questions in advance", "Pick up supplies on the way",
                "Confirm the booking the day before", "Share the slides afterwards", "Wear comfortable clothes",
                "Parking is behind the building", "Bring a notebook", "Check the shared folder first")
REPEATS = ("No repetition", "Daily", "Weekly", "Monthly", "Yearly")
REMINDERS = ("No reminder", "At start", "5 minutes before", "10 minutes before", "30 minutes before",
             "1 hour before", "1 day before")
WEEKDAY_HEADER = "Sun   Mon   Tue   Wed   Thu   Fri   Sat"




def fmt_hm(t: datetime) -> str:
    return t.strftime("%H:%M")


def fmt_minutes(m: int) -> str:
    h, mm = divmod(m, 60)
    if h and mm:
        return f"{h} h {mm} min"
    return f"{h} h" if h else f"{mm} min"


def fmt_day(d: date) -> str:
    """``Tue, Oct 17, 2023`` — the date as the editor's date picker shows it."""
    return d.strftime("%a, %b ") + str(d.day) + d.strftime(", %Y")


def fmt_day_long(d: date) -> str:
    """``Tuesday, October 17, 2023``."""
    return d.strftime("%A, %B ") + str(d.day) + d.strftime(", %Y")


@dataclass(eq=False)
class Event:
    title: str
    start: datetime
    minutes: int = 60
    location: str = ""
    description: str = ""
    all_day: bool = False
    repeat: str = "No repetition"
    reminder: str = "10 minutes before"

    @property
    def day(self) -> date:
        return self.start.date()

    @property
    def end(self) -> datetime:
        return self.start + timedelta(minutes=self.minutes)

    @property
    def time_range(self) -> str:
        return "All day" if self.all_day else f"{fmt_hm(self.start)} - {fmt_hm(self.end)}"


class Calendar(App):
    name = "Calendar"
    package = "com.simplemobiletools.calendar.pro"
    color = (244, 81, 30)
    aliases = ("simple calendar", "simple calendar pro", "calendar")

    def setup(self) -> None:
        rng = self.rng
        today = self.device.now.date()
        names = [p.first for p in content.people(rng, 6)]
        pool = list(TITLES) + [f.format(n) for f, n in zip(PERSONAL, names, strict=False)]
        n = rng.randrange(20, 29)
        titles = rng.sample(pool, n)
        days = rng.sample(range(-20, 36), 16)
        self.events: list[Event] = []
        taken: set[tuple[date, int]] = set()
        for i, title in enumerate(titles):
            d = today + timedelta(days=days[i] if i < len(days) else rng.choice(days))
            while True:
                hour, minute = rng.randrange(8, 21), rng.choice((0, 0, 0, 30, 15, 45))
                if (d, hour) not in taken:
                    break
            taken.add((d, hour))
            self.events.append(Event(
                title, datetime.combine(d, time(hour, minute)), rng.choice((30, 45, 60, 60, 60, 90, 120)),
                location=rng.choice(LOCATIONS) if rng.random() < 0.8 else content.address(rng),
                description=rng.choice(DESCRIPTIONS) if rng.random() < 0.75 else "",
                reminder=rng.choice(REMINDERS[2:6])))

    # -- queries used by tasks
    def on_day(self, d: date) -> list[Event]:
        return sorted((e for e in self.events if e.day == d), key=lambda e: (not e.all_day, e.start, e.title))

    def find(self, title: str) -> list[Event]:
        want = title.strip().lower()
        return [e for e in self.events if e.title.strip().lower() == want]

    @property
    def today(self) -> date:
        return self.device.now.date()

    # -- navigation
    def _month(self, st: PageState) -> tuple[int, int]:
        if "month" not in st.args:
            st.args["month"] = (self.today.year, self.today.month)
        return st.args["month"]

    def _shift_month(self, delta: int) -> None:
        st = self.stack[0]
        y, m = self._month(st)
        m += delta
        y, m = y + (m - 1) // 12, (m - 1) % 12 + 1
        st.args["month"] = (y, m)

    def _shift_day(self, delta: int) -> None:
        self.page.args["date"] = self.page.args["date"] + timedelta(days=delta)
        self.page.scroll = 0

    def on_swipe(self, direction: str) -> bool:
        st = self.page
        step = 1 if direction == "left" else -1
        if st.name == "main" and st.args.get("view", "month") == "month":
            self._shift_month(step)
            return True
        if st.name == "day":
            self._shift_day(step)
            return True
        return False

    def _set_view(self, view: str) -> None:
        st = self.stack[0]
        st.args["view"] = view
        st.scroll = 0

    def _new_event(self, d: date) -> None:
        now = self.device.now
        draft = {"date": d, "hour": (now.hour + 1) % 24, "minute": 0, "minutes": 60, "all_day": False,
                 "repeat": "No repetition", "reminder": "10 minutes before"}
        self.push("edit", event=None, draft=draft)

    # -- pages
    def page_main(self, st: PageState) -> Page:
        fab = IconButton("New event", lambda: self._new_event(self.today), rid="calendar_fab")
        if st.args.get("view", "month") == "list":
            return Page("Events", body=virtualize(self._agenda(), st.scroll), fab=fab, scroll_rid="calendar_events_list",
                        actions=[IconButton("Month view", lambda: self._set_view("month"), rid="month_view")])
        y, m = self._month(st)
        counts: dict[int, list[Event]] = {}
        for e in self.events:
            if e.start.year == y and e.start.month == m:
                counts.setdefault(e.start.day, []).append(e)
        lead = (date(y, m, 1).weekday() + 1) % 7  # Sunday-first grid
        tiles = [Row("", rid="day_blank") for _ in range(lead)]
        today = self.today
        for d in range(1, _cal.monthrange(y, m)[1] + 1):
            evs = counts.get(d, [])
            summary = "" if not evs else (evs[0].title if len(evs) == 1 else f"{len(evs)} events")
            tiles.append(Row(summary, desc=str(d), rid="day", selected=date(y, m, d) == today,
                             on_tap=lambda d=date(y, m, d): self.push("day", date=d)))
        body = [Text(WEEKDAY_HEADER, size="small", rid="week_days"), Grid(tiles, cols=7, tile_h=200, rid="month_grid")]
        return Page(f"{_cal.month_name[m]} {y}", body=body, fab=fab, scroll_rid="month_view_wrapper", actions=[
            IconButton("Previous month", lambda: self._shift_month(-1), rid="previous_month"),
            IconButton("Next month", lambda: self._shift_month(1), rid="next_month"),
            IconButton("Event list", lambda: self._set_view("list"), rid="event_list")])

    def _agenda(self) -> list:
        body: list = []
        last: date | None = None
        upcoming = sorted((e for e in self.events if e.day >= self.today), key=lambda e: (e.day, not e.all_day,
                                                                                            e.start, e.title))
        for e in upcoming:
            if e.day != last:
                last = e.day
                body.append(Text(fmt_day_long(e.day), size="small", rid="event_section_title"))
            body.append(Row(e.title, e.time_range, on_tap=lambda e=e: self.push("event", event=e), rid="event_item"))
        if not body:
            body.append(Text("No upcoming events", rid="empty"))
        return body

    def page_day(self, st: PageState) -> Page:
        d: date = st.args["date"]
        rows: list = [Row(e.title, e.time_range, on_tap=lambda e=e: self.push("event", event=e), rid="event_item")
                      for e in self.on_day(d)]
        if not rows:
            rows.append(Text("No events", rid="empty"))
        return Page(fmt_day(d), body=rows, nav_back=True, scroll_rid="day_events",
                    fab=IconButton("New event", lambda: self._new_event(d), rid="calendar_fab"),
                    actions=[IconButton("Previous day", lambda: self._shift_day(-1), rid="previous_day"),
                             IconButton("Next day", lambda: self._shift_day(1), rid="next_day")])

    def page_event(self, st: PageState) -> Page:
        e: Event = st.args["event"]

        def delete() -> None:
            if e in self.events:
                self.events.remove(e)
                self.device.log.append(f"event_deleted:{e.title}")
            self.close_dialog()
            self.pop()

        body: list = [Text(e.title, size="title", rid="event_title"),
                      Text("Date", size="small"), Text(fmt_day_long(e.day), rid="event_date"),
                      Text("Time", size="small"), Text(e.time_range, rid="event_time")]
        if e.location:
            body += [Text("Location", size="small"), Text(e.location, rid="event_location")]
        if e.description:
            body += [Text("Description", size="small"), Text(e.description, rid="event_description")]
        body += [Text("Repeat", size="small"), Text(e.repeat, rid="event_repeat"),
                 Text("Reminder", size="small"), Text(e.reminder, rid="event_reminder")]
        return Page("Event", body=body, nav_back=True, actions=[
            IconButton("Edit", lambda: self._edit(e), rid="edit"),
            IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete event?", f'"{e.title}" will be deleted.',
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete")])

    def _edit(self, e: Event) -> None:
        draft = {"date": e.day, "hour": e.start.hour, "minute": e.start.minute - e.start.minute % 15,
                 "minutes": e.minutes if not e.all_day else 60, "all_day": e.all_day, "repeat": e.repeat,
                 "reminder": e.reminder}
        self.push("edit", event=e, draft=draft)
        self.page.fields.update(title=e.title, location=e.location, description=e.description)

    def page_edit(self, st: PageState) -> Page:
        e: Event | None = st.args["event"]
        d = st.args["draft"]

        def shift(key: str, delta: int, mod: int = 0) -> None:
            d[key] = (d[key] + delta) % mod if mod else d[key] + delta

        def shift_date(delta: int) -> None:
            d["date"] = d["date"] + timedelta(days=delta)

        def dur(delta: int) -> None:
            d["minutes"] = max(15, min(24 * 60, d["minutes"] + delta))

        def toggle_all_day() -> None:
            d["all_day"] = not d["all_day"]

        def choose(key: str, title: str, options: tuple[str, ...]) -> None:
            def pick(o: str) -> None:
                d[key] = o
                self.close_dialog()

            self.dialog(lambda: Dialog(title, body=[
                Row(o, on_tap=lambda o=o: pick(o), rid=f"{key}_option", selected=o == d[key]) for o in options]))

        def save() -> None:
            title = st.fields.get("title", "").strip()
            if not title:
                self.device.toast = "Title cannot be empty"
                return
            if d["all_day"]:
                start, minutes = datetime.combine(d["date"], time(0, 0)), 24 * 60
            else:
                start, minutes = datetime.combine(d["date"], time(d["hour"], d["minute"])), d["minutes"]
            target = e or Event(title, start)
            target.title, target.start, target.minutes, target.all_day = title, start, minutes, d["all_day"]
            target.location = st.fields.get("location", "").strip()
            target.description = st.fields.get("description", "").strip()
            target.repeat, target.reminder = d["repeat"], d["reminder"]
            if e is None:
                self.events.append(target)
            self.device.log.append(f"event_saved:{title}")
            self.pop()

        body: list = [
            Field("title", "Title", rid="event_title_input"),
            Field("location", "Location", rid="event_location_input"),
            Field("description", "Description", rid="event_description_input", multiline=True),
            Switch("All-day", d["all_day"], toggle_all_day, rid="event_all_day"),
            Stepper("Date", d["date"].strftime("%b ") + str(d["date"].day) + d["date"].strftime(", %Y"), lambda: shift_date(-1), lambda: shift_date(1), rid="event_date"),
        ]
        if not d["all_day"]:
            start = datetime.combine(d["date"], time(d["hour"], d["minute"]))
            body += [
                Stepper("Hour", f"{d['hour']:02d}", lambda: shift("hour", -1, 24), lambda: shift("hour", 1, 24),
                        rid="event_hour"),
                Stepper("Minute", f"{d['minute']:02d}", lambda: shift("minute", -15, 60),
                        lambda: shift("minute", 15, 60), rid="event_minute"),
                Stepper("Duration", fmt_minutes(d["minutes"]), lambda: dur(-15), lambda: dur(15), rid="event_duration"),
                Text(f"{fmt_hm(start)} - {fmt_hm(start + timedelta(minutes=d['minutes']))}", size="small",
                     rid="event_time_summary"),
            ]
        body += [
            Row("Repeat", d["repeat"], on_tap=lambda: choose("repeat", "Repeat", REPEATS), rid="event_repetition"),
            Row("Reminder", d["reminder"], on_tap=lambda: choose("reminder", "Reminder", REMINDERS),
                rid="event_reminder"),
        ]
        return Page("Edit event" if e else "New event", body=body, nav_back=True, scroll_rid="event_scroll_view",
                    actions=[IconButton("Save", save, rid="save")])
