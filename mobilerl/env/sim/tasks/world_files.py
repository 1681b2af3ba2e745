"""AndroidWorld-like tasks in Files (DocumentsUI): delete, move, bulk-move by type, rename, size lookup."""

from __future__ import annotations

from datetime import timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.apps.files import SIZE_RANGE, human_size
from mobilerl.env.sim.tasks.base import Template
from mobilerl.env.sim.tasks.world_notes import select_matching
from mobilerl.env.sim.tasks.world_sms import first, long_seek, row_text, seek, tap_seek

BROWSABLE = ("Download", "Documents", "Pictures", "Music", "DCIM/Camera", "Recordings")


def files(dev):
    return dev.app("Files")


def folder_words(folder: str) -> str:
    return " > ".join(folder.split("/"))


def open_folder(x, folder: str):
    """From the storage root: tap down the folder chain (``DCIM/Camera`` → DCIM, Camera)."""
    for part in folder.split("/"):
        yield from tap_seek(x, text=part, rid="title")


def pick_destination(x, folder: str):
    """In the "Move to" picker (which opens at the storage root): open ``folder`` and confirm."""
    yield from open_folder(x, folder)
    yield x.tap(text="Move", cls="Button")


def size_answers(size: int) -> set[str]:
    shown = human_size(size)
    return {shown.replace(" ", "").lower(), f"{size}bytes", str(size), f"{size:,}bytes"}


class FilesDeleteFile(Template):
    name = "FilesDeleteFile"
    template = "Delete the file {file} from the {folder_words} folder using the Files app."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Files",)
    complexity = 1.5

    def sample(self, rng, dev):
        app = files(dev)
        folder = rng.choice([f for f in BROWSABLE if app.in_folder(f)])
        f = rng.choice(app.in_folder(folder))
        return {"file": f.name, "folder": folder, "folder_words": folder_words(folder), "total": len(app.files)}

    def check(self, dev, p):
        app = files(dev)
        return app.find(p["file"], p["folder"]) is None and len(app.files) == p["total"] - 1

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, p["folder"])
        yield from long_seek(x, text=p["file"], rid="title")
        yield x.tap(desc="Delete")
        yield x.tap(rid="confirm_delete")
        yield x.finish()


class FilesMoveFile(Template):
    name = "FilesMoveFile"
    template = "Move the file {file} from the {src_words} folder to the {dst_words} folder using the Files app."
    difficulty = "medium"
    tags = ("search", "screen_reading", "parameterized")
    apps = ("Files",)
    complexity = 1.6

    def sample(self, rng, dev):
        app = files(dev)
        src = rng.choice([f for f in BROWSABLE if app.in_folder(f)])
        f = rng.choice(app.in_folder(src))
        dst = rng.choice([d for d in sorted(app.folders) if d != src and app.find(f.name, d) is None])
        return {"file": f.name, "src": src, "dst": dst, "src_words": folder_words(src),
                "dst_words": folder_words(dst), "total": len(app.files)}

    def check(self, dev, p):
        app = files(dev)
        return (app.find(p["file"], p["dst"]) is not None and app.find(p["file"], p["src"]) is None
                and len(app.files) == p["total"])

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, p["src"])
        yield from long_seek(x, text=p["file"], rid="title")
        yield x.tap(desc="Move to")
        yield from pick_destination(x, p["dst"])
        yield x.finish()


TYPES = {
    "pdf": ("PDF", ("Documents", "Documents/Work"), ["scan_{n}.pdf", "receipt_{n}.pdf", "ticket_{n}.pdf"]),
    "jpg": ("JPG", ("Pictures", "DCIM/Camera"), ["IMG_202310{n}_1204{n}.jpg", "photo_{n}.jpg"]),
    "png": ("PNG", ("Pictures", "Pictures/Screenshots"), ["Screenshot_202309{n}_0915{n}.png", "diagram_{n}.png"]),
}


class FilesMoveAllOfType(Template):
    name = "FilesMoveAllOfType"
    template = "Move all {label} files from the Download folder to the {dst_words} folder using the Files app."
    difficulty = "hard"
    tags = ("data_edit", "repetition", "screen_reading", "complex_ui_understanding", "parameterized")
    apps = ("Files",)
    complexity = 2.5

    def sample(self, rng, dev):
        app = files(dev)
        while True:
            ext = rng.choice(sorted(TYPES))
            label, dsts, patterns = TYPES[ext]
            dst = rng.choice(dsts)
            have = [f.name for f in app.in_folder("Download") if f.ext == ext]
            if not any(app.find(n, dst) for n in have):  # a name clash would block the move
                break
        want = rng.randrange(7, 10)
        extra: list[str] = []
        while len(have) + len(extra) < want:
            name = rng.choice(patterns).format(n=rng.randrange(10, 29))
            if name not in have and name not in extra and app.find(name, dst) is None:
                extra.append(name)
        return {"ext": ext, "label": label, "dst": dst, "dst_words": folder_words(dst), "extra": extra,
                "names": sorted(have + extra), "total": len(app.files) + len(extra)}

    def setup(self, dev, p):
        app = files(dev)
        lo, hi = SIZE_RANGE[p["ext"]]
        for i, name in enumerate(p["extra"]):
            app.add_file(name, "Download", lo + (hi - lo) * (i + 1) // (len(p["extra"]) + 2),
                         dev.now - timedelta(days=2 + 3 * i, minutes=17 * i))

    def check(self, dev, p):
        app = files(dev)
        if any(f.ext == p["ext"] for f in app.in_folder("Download")):
            return False
        return all(app.find(n, p["dst"]) is not None for n in p["names"]) and len(app.files) == p["total"]

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, "Download")
        yield from select_matching(x, "file", lambda t: t.lower().endswith("." + p["ext"]))
        yield x.tap(desc="Move to")
        yield from pick_destination(x, p["dst"])
        yield x.finish()


class FilesSizeQuery(Template):
    name = "FilesSizeQuery"
    template = "How big is the file {file} in my {folder_words} folder? Answer with the size shown in Files."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Files",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        app = files(dev)
        folder = rng.choice([f for f in BROWSABLE if app.in_folder(f)])
        f = rng.choice(app.in_folder(folder))
        return {"file": f.name, "folder": folder, "folder_words": folder_words(folder), "size": f.size}

    def check(self, dev, p):
        a = "".join((dev.answer or "").split()).lower().rstrip(".")
        return a in size_answers(p["size"])

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, p["folder"])
        yield from seek(x, text=p["file"], rid="title")
        row = first((r for r in x.s.find_all(rid="file") if row_text(x.s, r) == p["file"]), p["file"])
        yield x.finish(row_text(x.s, row, "subtitle").split(" · ")[0])


class FilesRenameFile(Template):
    name = "FilesRenameFile"
    template = "In the Files app, rename {file} in the {folder_words} folder to {new}."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Files",)
    complexity = 1.5

    def sample(self, rng, dev):
        app = files(dev)
        folder = rng.choice([f for f in BROWSABLE if app.in_folder(f)])
        f = rng.choice(app.in_folder(folder))
        while True:
            new = f"{'_'.join(rng.sample(content.WORDS, 2))}.{f.ext}"
            if app.find(new, folder) is None:
                break
        return {"file": f.name, "folder": folder, "folder_words": folder_words(folder), "new": new,
                "size": f.size, "total": len(app.files)}

    def check(self, dev, p):
        app = files(dev)
        f = app.find(p["new"], p["folder"])
        return (f is not None and f.size == p["size"] and app.find(p["file"], p["folder"]) is None
                and len(app.files) == p["total"])

    def expert(self, p, x):
        yield from x.launch("Files")
        yield from open_folder(x, p["folder"])
        yield from long_seek(x, text=p["file"], rid="title")
        yield x.tap(desc="Rename")
        yield from x.fill("rename_name", p["new"])
        yield x.tap(text="OK", cls="Button")
        yield x.finish()
