"""AndroidWorld-like tasks in Audio Recorder: record and name clips, rename and delete recordings."""

from __future__ import annotations

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.recorder import strip_ext
from mobilerl.env.sim.tasks.base import Template
from mobilerl.env.sim.tasks.world_sms import first, inside, seek

CLIP_NAMES = ["Morning thoughts", "Meeting recap", "Song idea", "Shopping reminder", "Lecture 5 summary",
              "Interview practice", "Podcast outro", "Birthday message", "Piano scales", "Voice note for Sam",
              "Project kickoff", "Dream journal"]


def recorder(dev):
    return dev.app("Audio Recorder")


def seconds(text: str) -> int:
    total = 0
    for part in text.split(":"):
        total = total * 60 + int(part)
    return total


def record_and_save(x, name: str, min_seconds: int = 0):
    """On the recorder's main screen: record (waiting until ``min_seconds`` is reached), stop, name, save."""
    yield x.tap(desc="Start recording")
    # the clock moves with every action; tapping Stop takes one more step (5 s)
    while seconds(x.el(rid="txt_progress").text) + 5 < min_seconds:
        yield x.wait()
    yield x.tap(text="Stop", cls="Button")
    yield from x.fill("input_name", name)
    yield x.tap(text="Save", cls="Button")


def open_options(x, name: str):
    """In the recordings list: tap the "More options" button of the row titled ``name``."""
    yield from seek(x, text=name, rid="title")
    row = first((r for r in x.s.find_all(rid="list_item") if any(
        e.text == name and e.rid == "title" and inside(e.bounds, r.bounds) for e in x.s.els)), name)
    btn = first((e for e in x.s.find_all(desc="More options") if inside(e.bounds, row.bounds)), "More options")
    yield Action(A.TAP, element=btn.bounds)


class AudioRecorderRecordWithName(Template):
    name = "AudioRecorderRecordWithName"
    template = "Record an audio clip and save it with the name \"{name}\" using Audio Recorder."
    difficulty = "easy"
    tags = ("data_entry", "complex_ui_understanding", "parameterized")
    apps = ("Audio Recorder",)
    complexity = 1.2

    def sample(self, rng, dev):
        app = recorder(dev)
        return {"name": rng.choice([n for n in CLIP_NAMES if app.find(n) is None]),
                "count": len(app.recordings)}

    def check(self, dev, p):
        app = recorder(dev)
        r = app.find(p["name"])
        return r is not None and len(app.recordings) == p["count"] + 1 and r.duration >= 1

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield from record_and_save(x, p["name"])
        yield x.finish()


class AudioRecorderRecordLong(Template):
    name = "AudioRecorderRecordLong"
    template = ("Use Audio Recorder to record a clip that is at least {secs} seconds long, and save it as "
                "\"{name}\".")
    difficulty = "medium"
    tags = ("data_entry", "complex_ui_understanding", "parameterized")
    apps = ("Audio Recorder",)
    complexity = 2.3

    def sample(self, rng, dev):
        app = recorder(dev)
        return {"name": rng.choice([n for n in CLIP_NAMES if app.find(n) is None]),
                "secs": rng.choice([20, 25, 30, 35, 40]), "count": len(app.recordings)}

    def check(self, dev, p):
        app = recorder(dev)
        r = app.find(p["name"])
        return r is not None and len(app.recordings) == p["count"] + 1 and r.duration >= p["secs"]

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield from record_and_save(x, p["name"], p["secs"])
        yield x.finish()


class AudioRecorderDeleteRecording(Template):
    name = "AudioRecorderDeleteRecording"
    template = "Delete the recording \"{name}\" in Audio Recorder."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Audio Recorder",)
    complexity = 1.3

    def sample(self, rng, dev):
        app = recorder(dev)
        return {"name": rng.choice(app.recordings).name, "count": len(app.recordings)}

    def check(self, dev, p):
        app = recorder(dev)
        return app.find(p["name"]) is None and len(app.recordings) == p["count"] - 1

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield x.tap(desc="Recordings")
        yield from open_options(x, p["name"])
        yield x.tap(text="Delete", rid="title")
        yield x.tap(rid="confirm_delete")
        yield x.finish()


class AudioRecorderRenameRecording(Template):
    name = "AudioRecorderRenameRecording"
    template = "In Audio Recorder, rename the recording \"{old}\" to \"{new}\"."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Audio Recorder",)
    complexity = 1.3

    def sample(self, rng, dev):
        app = recorder(dev)
        r = rng.choice(app.recordings)
        return {"old": r.name, "new": rng.choice([n for n in CLIP_NAMES if app.find(n) is None]),
                "duration": r.duration, "count": len(app.recordings)}

    def check(self, dev, p):
        app = recorder(dev)
        r = app.find(strip_ext(p["new"]))
        return (r is not None and r.duration == p["duration"] and app.find(p["old"]) is None
                and len(app.recordings) == p["count"])

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield x.tap(desc="Recordings")
        yield from open_options(x, p["old"])
        yield x.tap(text="Rename", rid="title")
        yield from x.fill("input_rename", p["new"])
        yield x.tap(text="OK", cls="Button")
        yield x.finish()
