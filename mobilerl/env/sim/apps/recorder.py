"""Audio Recorder (modelled on dimowner's Audio Recorder): record / pause / stop with a running timer driven
by the device clock, a name dialog after stopping, a recordings list with rename, delete (confirmed),
info and playback, and a few settings (format, sample rate, ask for a name)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import Button, Buttons, Dialog, Field, IconButton, Page, Row, Switch, Text

BYTES_PER_S = {"m4a": 16_000, "wav": 88_200}  # 128 kbps AAC; 16-bit mono PCM at 44.1 kHz


def clock(seconds: int) -> str:
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def human_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def strip_ext(name: str) -> str:
    name = name.strip()
    for ext in (".m4a", ".wav", ".mp3", ".3gp"):
        if name.lower().endswith(ext):
            return name[: -len(ext)].strip()
    return name


@dataclass(eq=False)
class Recording:
    name: str  # without extension
    duration: int  # seconds
    created: datetime
    fmt: str = "m4a"
    sample_rate: int = 44100

    @property
    def size(self) -> int:
        return self.duration * BYTES_PER_S.get(self.fmt, 16_000) + 4_096

    @property
    def file_name(self) -> str:
        return f"{self.name}.{self.fmt}"


class AudioRecorder(App):
    name = "Audio Recorder"
    package = "com.dimowner.audiorecorder"
    color = (198, 40, 40)
    aliases = ("audio recorder", "recorder", "voice recorder")

    def setup(self) -> None:
        rng = self.rng
        people = content.people(rng, 3)
        pool = [f"Interview with {people[0].name}", "Lecture - thermodynamics", "Band practice",
                "Guitar idea", f"Meeting with {people[1].company}", "Voice memo", "Bedtime story",
                f"Call notes {people[2].first}", "Bird song in the park", "Podcast intro take 2",
                "Spanish vocabulary", "Kids singing"]
        names = rng.sample(pool, rng.randrange(6, 10))
        self.recordings: list[Recording] = []
        t = self.device.now
        for nm in names:
            t -= timedelta(minutes=rng.randrange(90, 60 * 24 * 6))
            dur = rng.choice([rng.randrange(6, 60), rng.randrange(60, 600), rng.randrange(600, 2700)])
            self.recordings.append(Recording(nm, dur, t, rng.choice(["m4a", "m4a", "m4a", "wav"])))
        self.counter = 1
        self.fmt = "m4a"
        self.sample_rate = 44100
        self.ask_name = True
        # recording state
        self.state = "idle"  # idle | recording | paused
        self.started: datetime | None = None
        self.accum = 0.0
        self.playing: Recording | None = None
        self.viewed_list = False  # the recordings list was opened (for sub-goal checks)

    # -- queries used by tasks
    def find(self, name: str) -> Recording | None:
        want = strip_ext(name).lower()
        return next((r for r in self.recordings if r.name.lower() == want), None)

    def ordered(self) -> list[Recording]:
        return sorted(self.recordings, key=lambda r: r.created, reverse=True)

    def elapsed(self) -> int:
        run = (self.device.now - self.started).total_seconds() if self.state == "recording" and self.started else 0
        return int(self.accum + run)

    # -- recording
    def _record(self) -> None:
        self.state = "recording"
        self.started = self.device.now
        self.accum = 0.0
        self.device.toast = "Recording started"

    def _pause(self) -> None:
        if self.state == "recording":
            self.accum = self.elapsed()
            self.state = "paused"
        elif self.state == "paused":
            self.started = self.device.now
            self.state = "recording"

    def _default_name(self) -> str:
        while self.find(f"Record-{self.counter}") is not None:
            self.counter += 1
        return f"Record-{self.counter}"

    def _stop(self) -> None:
        dur = max(1, self.elapsed())
        self.state = "idle"
        self.started = None
        self.accum = 0.0
        rec = Recording(self._default_name(), dur, self.device.now, self.fmt, self.sample_rate)
        self.counter += 1
        self.recordings.append(rec)
        if not self.ask_name:
            self.device.toast = f"Saved {rec.file_name}"
            return
        st = self.page
        st.fields["record_name"] = rec.name

        def save() -> None:
            name = strip_ext(st.fields.get("record_name", ""))
            if not name:
                self.device.toast = "Name can't be empty"
                return
            other = self.find(name)
            if other is not None and other is not rec:
                self.device.toast = "A recording with this name already exists"
                return
            rec.name = name
            st.focus = None
            self.close_dialog()
            self.device.toast = f"Saved {rec.file_name}"

        def discard() -> None:
            if rec in self.recordings:
                self.recordings.remove(rec)
            st.focus = None
            self.close_dialog()
            self.device.toast = "Recording discarded"

        self.dialog(lambda: Dialog("Save recording", f"Duration {clock(rec.duration)}",
                                   body=[Field("record_name", "Recording name", rid="input_name")],
                                   buttons=[Button("Discard", discard, rid="btn_discard", primary=False),
                                            Button("Save", save, rid="btn_save")]))

    # -- pages
    def page_main(self, st: PageState) -> Page:
        if self.state == "idle":
            status, controls = "Ready to record", [Button("Record", self._record, rid="btn_record",
                                                          desc="Start recording")]
            info = f"{self.fmt.upper()} · {self.sample_rate / 1000:g} kHz"
        else:
            status = "Recording…" if self.state == "recording" else "Paused"
            controls = [Buttons([Button("Pause" if self.state == "recording" else "Resume", self._pause,
                                        rid="btn_pause", primary=False),
                                 Button("Stop", self._stop, rid="btn_stop", desc="Stop recording")])]
            info = f"{self.fmt.upper()} · {self.sample_rate / 1000:g} kHz · {human_size(int(self.elapsed() * BYTES_PER_S.get(self.fmt, 16_000)))}"
        body: list = [Text(status, rid="txt_status", size="header"),
                      Text(clock(self.elapsed()), rid="txt_progress", size="title", height=260),
                      Text(info, rid="txt_record_info", size="small"), *controls]
        if self.recordings:
            last = max(self.recordings, key=lambda r: r.created)
            body += [Text("Last recording", size="small"),
                     Row(last.name, f"{clock(last.duration)} · {last.created:%b %-d, %H:%M}", rid="last_record",
                         on_tap=lambda: self.push("player", rec=last))]
        return Page("Audio Recorder", body=body, actions=[
            IconButton("Recordings", lambda: self.push("records"), rid="btn_records_list"),
            IconButton("Settings", lambda: self.push("settings"), rid="btn_settings")])

    def page_records(self, st: PageState) -> Page:
        self.viewed_list = True
        rows: list = [Row(r.name, f"{clock(r.duration)} · {r.created:%b %-d, %Y %H:%M} · {human_size(r.size)}",
                          rid="list_item", on_tap=lambda r=r: self.push("player", rec=r),
                          trailing=IconButton("More options", lambda r=r: self._options(r), rid="btn_more"))
                      for r in self.ordered()]
        return Page("Recordings", body=rows or [Text("No recordings yet", rid="empty", size="small")],
                    nav_back=True, scroll_rid="recycler_view")

    def _options(self, r: Recording) -> None:
        self.dialog(lambda: Dialog(r.file_name, body=[
            Row("Rename", on_tap=lambda: self._rename(r), rid="menu_rename"),
            Row("Info", on_tap=lambda: self._info(r), rid="menu_info"),
            Row("Share", on_tap=lambda: self._share(r), rid="menu_share"),
            Row("Delete", on_tap=lambda: self._delete(r), rid="menu_delete"),
        ], buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False)]))

    def _share(self, r: Recording) -> None:
        self.close_dialog()
        self.device.toast = f"Sharing {r.file_name}"

    def _info(self, r: Recording) -> None:
        self.dialog(lambda: Dialog("Info", body=[
            Text(f"Name: {r.file_name}", rid="info_name", size="small"),
            Text(f"Format: {r.fmt.upper()}", rid="info_format", size="small"),
            Text(f"Duration: {clock(r.duration)}", rid="info_duration", size="small"),
            Text(f"Size: {human_size(r.size)}", rid="info_size", size="small"),
            Text(f"Sample rate: {r.sample_rate / 1000:g} kHz", rid="info_rate", size="small"),
            Text(f"Created: {r.created:%b %-d, %Y %H:%M}", rid="info_created", size="small"),
            Text(f"Location: /storage/emulated/0/Recordings/{r.file_name}", rid="info_location", size="small"),
        ], buttons=[Button("OK", self.close_dialog, rid="ok")]))

    def _rename(self, r: Recording) -> None:
        st = self.page
        st.fields["rename"] = r.name
        st.focus = "rename"

        def ok() -> None:
            name = strip_ext(st.fields.get("rename", ""))
            other = self.find(name) if name else None
            if not name or (other is not None and other is not r):
                self.device.toast = "Name can't be empty" if not name else "A recording with this name already exists"
                return
            r.name = name
            st.focus = None
            self.close_dialog()

        def cancel() -> None:
            st.focus = None
            self.close_dialog()

        self.dialog(lambda: Dialog("Rename", body=[Field("rename", "Name", rid="input_rename")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("OK", ok, rid="ok")]))

    def _delete(self, r: Recording) -> None:
        def delete() -> None:
            if r in self.recordings:
                self.recordings.remove(r)
            if self.playing is r:
                self.playing = None
            self.close_dialog()
            self.device.toast = "Recording deleted"

        self.dialog(lambda: Dialog("Delete recording?", f"{r.file_name} will be deleted permanently.",
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                            Button("Delete", delete, rid="confirm_delete")]))

    def page_player(self, st: PageState) -> Page:
        r: Recording = st.args["rec"]
        if r not in self.recordings:
            return Page("Recording", body=[Text("This recording was deleted", size="small")], nav_back=True)
        playing = self.playing is r

        def toggle() -> None:
            self.playing = None if playing else r

        return Page(r.name, nav_back=True, body=[
            Text("Playing" if playing else "Stopped", rid="txt_play_status", size="header"),
            Text(f"00:00 / {clock(r.duration)}", rid="txt_play_progress", size="title"),
            Text(f"{r.fmt.upper()} · {r.sample_rate / 1000:g} kHz · {human_size(r.size)}", size="small"),
            Button("Pause" if playing else "Play", toggle, rid="btn_play"),
        ], actions=[IconButton("More options", lambda: self._options(r), rid="btn_more")])

    def page_settings(self, st: PageState) -> Page:
        def fmt(v: str):
            return lambda: setattr(self, "fmt", v)

        def rate(v: int):
            return lambda: setattr(self, "sample_rate", v)

        return Page("Settings", nav_back=True, body=[
            Text("Recording format", size="header"),
            Buttons([Button(v.upper(), fmt(v), rid=f"format_{v}", primary=self.fmt != v) for v in ("m4a", "wav")],
                    rid="format"),
            Text("Sample rate", size="header"),
            Buttons([Button(f"{v / 1000:g} kHz", rate(v), rid=f"rate_{v}", primary=self.sample_rate != v)
                     for v in (22050, 44100, 48000)], rid="sample_rate"),
            Switch("Ask for a name after recording", self.ask_name,
                   lambda: setattr(self, "ask_name", not self.ask_name), rid="switch_ask_name"),
        ])
