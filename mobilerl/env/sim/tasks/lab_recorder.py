"""AndroidLab-style tasks in Audio Recorder (operation and query types, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim.tasks.base import ExpertError, Template, answer_matches
from mobilerl.env.sim.tasks.lab_files import scan_rows
from mobilerl.env.sim.tasks.world_recorder import CLIP_NAMES, record_and_save, recorder, seconds


class LabRecorderWavClip(Template):
    suite = "lab"
    name = "recorder_wav_clip"
    template = "Set the recording format to WAV in Audio Recorder, then record a clip and save it as \"{name}\"."
    difficulty = "medium"
    apps = ("Audio Recorder",)
    complexity = 1.4

    def sample(self, rng, dev):
        app = recorder(dev)
        return {"name": rng.choice([n for n in CLIP_NAMES if app.find(n) is None]), "count": len(app.recordings)}

    def check(self, dev, p):
        app = recorder(dev)
        r = app.find(p["name"])
        return r is not None and r.fmt == "wav" and len(app.recordings) == p["count"] + 1

    def subgoals(self, p):
        return [
            ("set the format to WAV", lambda dev: recorder(dev).fmt == "wav"),
            (f"record a clip named {p['name']}", lambda dev: recorder(dev).find(p["name"]) is not None),
            ("the clip is saved as WAV", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield x.tap(desc="Settings")
        yield x.tap(text="WAV", cls="Button")
        yield x.back()
        yield from record_and_save(x, p["name"])
        yield x.finish()


class LabRecorderLongestQuery(Template):
    suite = "lab"
    name = "recorder_longest_query"
    template = "Which of my recordings in Audio Recorder is the longest? Tell me its name."
    difficulty = "medium"
    apps = ("Audio Recorder",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        recs = recorder(dev).recordings
        top = max(r.duration for r in recs)
        return {"names": [r.name for r in recs if r.duration == top], "seconds": top}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["names"])

    def subgoals(self, p):
        return [
            ("open the recordings list", lambda dev: recorder(dev).viewed_list),
            ("answer with the longest recording", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Audio Recorder")
        yield x.tap(desc="Recordings")
        seen = yield from scan_rows(x, "list_item")
        if not seen:
            raise ExpertError("no recordings on screen")
        best = max(seen, key=lambda r: seconds(r[1].split(" · ")[0]))
        yield x.finish(best[0])
