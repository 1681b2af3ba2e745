"""AndroidLab-style tasks in Files (operation and query types, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_files import files, open_folder, pick_destination
from mobilerl.env.sim.tasks.world_sms import _sig, long_seek, rows

NEW_FOLDERS = ["Taxes", "Trip 2023", "Scans", "Contracts", "Medical", "Receipts 2023", "Kids", "Apartment"]


def scan_rows(x, rid: str):
    """Scroll through the whole list; returns the (title, subtitle) of every ``rid`` row, in order."""
    seen: list[tuple[str, str]] = []
    for _ in range(40):
        for r in rows(x.s, rid):
            if r[0] and r not in seen:
                seen.append(r)
        if x.s.scrollable() is None:
            break
        before = _sig(x.s)
        yield x.swipe("up", "medium")
        if _sig(x.s) == before:
            break
    return seen


class LabFilesFolderAndMove(Template):
    suite = "lab"
    name = "files_new_folder_move"
    template = "Create a new folder named \"{folder}\" inside Documents, then move {file} from Download into it."
    difficulty = "hard"
    apps = ("Files",)
    complexity = 2.0

    def sample(self, rng, dev):
        app = files(dev)
        return {"folder": rng.choice([f for f in NEW_FOLDERS if f"Documents/{f}" not in app.folders]),
                "file": rng.choice(app.in_folder("Download")).name, "total": len(app.files)}

    def check(self, dev, p):
        app = files(dev)
        return (app.find(p["file"], f"Documents/{p['folder']}") is not None
                and app.find(p["file"], "Download") is None and len(app.files) == p["total"])

    def subgoals(self, p):
        return [
            (f"create the folder {p['folder']} in Documents",
             lambda dev: f"Documents/{p['folder']}" in files(dev).folders),
            (f"move {p['file']} out of Download", lambda dev: files(dev).find(p["file"], "Download") is None),
            ("the file is in the new folder", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, "Documents")
        yield x.tap(desc="New folder")
        yield from x.fill("folder_name", p["folder"])
        yield x.tap(text="OK", cls="Button")
        yield x.tap(text="Internal storage", cls="Button")
        yield from open_folder(x, "Download")
        yield from long_seek(x, text=p["file"], rid="title")
        yield x.tap(desc="Move to")
        yield from pick_destination(x, f"Documents/{p['folder']}")
        yield x.finish()


KINDS = {"pdf": "PDF", "jpg": "JPG", "png": "PNG", "docx": "Word (.docx)"}


class LabFilesCountQuery(Template):
    suite = "lab"
    name = "files_count_query"
    template = "How many {label} files are there in my Download folder?"
    difficulty = "medium"
    apps = ("Files",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        ext = rng.choice(["pdf", "jpg", "png", "docx"])
        n = sum(1 for f in files(dev).in_folder("Download") if f.ext == ext)
        return {"ext": ext, "label": KINDS[ext], "count": n}

    def check(self, dev, p):
        words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
        return answer_matches(dev.answer, [str(p["count"]), words[p["count"]] if p["count"] <= 10 else ""],
                              numeric=True)

    def subgoals(self, p):
        return [
            ("open the Download folder", lambda dev: "Download" in files(dev).visited),
            ("answer with the count", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, "Download")
        seen = yield from scan_rows(x, "file")
        yield x.finish(str(sum(1 for t, _ in seen if t.lower().endswith("." + p["ext"]))))
