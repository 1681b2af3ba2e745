"""AndroidWorld-like tasks in Camera and Simple Gallery (and a Gallery → Pro Expense multi-app task)."""

from __future__ import annotations

from datetime import datetime

from mobilerl.env.sim.apps.gallery import RECEIPT_CATEGORY, Gallery, media_store
from mobilerl.env.sim.tasks.base import Expert, ExpertError, Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import _app as _expenses
from mobilerl.env.sim.tasks.world_expenses import _dollars, _matches, add_expense, inside, must, row_texts


def _gallery(dev) -> Gallery:
    return dev.app("Gallery")


def _captured(dev, video: bool) -> int:
    return sum(m.captured and m.video == video for m in media_store(dev))


def folder_of(name: str) -> str:
    """Where Simple Gallery files a picture, from its file name (what a user would infer)."""
    if name.startswith(("IMG_", "VID_")):
        return "Camera"
    if name.startswith("Screenshot_"):
        return "Screenshots"
    if name.startswith("IMG-") and "-WA" in name:
        return "WhatsApp Images"
    return "Download"


def open_media(x: Expert, name: str) -> None:
    """From the folder grid: open the folder holding ``name`` and then the picture itself."""
    yield from x.tap_scrolled(desc=folder_of(name), rid="folder_tile")
    yield from x.tap_scrolled(desc=name, rid="medium_thumbnail")


def resolution_variants(w: int, h: int) -> list[str]:
    return [f"{w} x {h}", f"{w}x{h}", f"{w} × {h}", f"{w}×{h}", f"{w} by {h}", f"{w} * {h}"]


class CameraTakePhoto(Template):
    name = "CameraTakePhoto"
    template = "Take one photo."
    difficulty = "easy"
    tags = ("requires_setup",)
    apps = ("Camera",)
    complexity = 1.0

    def sample(self, rng, dev):
        return {"n": len(media_store(dev))}

    def check(self, dev, p):
        return _captured(dev, False) == 1 and _captured(dev, True) == 0 and len(media_store(dev)) == p["n"] + 1

    def expert(self, p, x):
        yield from x.launch("Camera")
        yield x.tap(text="Take photo")
        yield x.finish()


class CameraTakeVideo(Template):
    name = "CameraTakeVideo"
    template = "Take one video."
    difficulty = "medium"
    tags = ("requires_setup",)
    apps = ("Camera",)
    complexity = 1.0

    def sample(self, rng, dev):
        return {"n": len(media_store(dev))}

    def check(self, dev, p):
        return _captured(dev, True) == 1 and _captured(dev, False) == 0 and len(media_store(dev)) == p["n"] + 1

    def expert(self, p, x):
        yield from x.launch("Camera")
        if not x.el(rid="mode_video").selected:
            yield x.tap(rid="mode_video")
        yield x.tap(text="Record video")
        yield x.tap(text="Stop recording")
        yield x.finish()


class GalleryDeleteMostRecentPhoto(Template):
    name = "GalleryDeleteMostRecentPhoto"
    template = "Delete the most recent photo in the Camera folder of Simple Gallery."
    difficulty = "easy"
    tags = ("data_edit", "screen_reading")
    apps = ("Gallery",)
    complexity = 1.2

    def sample(self, rng, dev):
        photos = [m for m in _gallery(dev).in_folder("Camera") if not m.video]
        return {"newest": photos[0].name, "n": len(media_store(dev))}

    def check(self, dev, p):
        return _gallery(dev).get(p["newest"]) is None and len(media_store(dev)) == p["n"] - 1

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from x.tap_scrolled(desc="Camera", rid="folder_tile")
        names = [e.desc for e in x.s.find_all(rid="medium_thumbnail") if e.desc.startswith("IMG_")]
        yield x.tap(desc=max(names), rid="medium_thumbnail")
        yield x.tap(text="Delete", cls="Button")
        yield x.tap(text="Delete", rid="confirm_delete")
        yield x.finish()


class GalleryPhotoResolution(Template):
    name = "GalleryPhotoResolution"
    template = "What is the resolution of the photo {photo} in Simple Gallery? Answer as width x height."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Gallery",)
    complexity = 1.4
    task_type = "query"

    def sample(self, rng, dev):
        m = rng.choice([m for m in _gallery(dev).media if not m.video and m.folder != "Download"])
        return {"photo": m.name, "w": m.width, "h": m.height}

    def check(self, dev, p):
        return answer_matches(dev.answer, resolution_variants(p["w"], p["h"]))

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from open_media(x, p["photo"])
        yield x.tap(desc="Properties")
        yield x.finish(row_texts(x.s, x.el(rid="property_resolution"))["title"])


class GalleryCameraFolderCount(Template):
    name = "GalleryCameraFolderCount"
    template = "How many photos and videos are in the Camera folder in Simple Gallery? Answer with a number."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Gallery",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        return {"count": str(len(_gallery(dev).in_folder("Camera")))}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["count"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Gallery")
        tile = x.el(desc="Camera", rid="folder_tile")
        yield x.finish(row_texts_tile(x, tile).split()[0])


def row_texts_tile(x: Expert, tile) -> str:
    for e in x.s.els:
        if e is not tile and e.text and inside(e.bounds, tile.bounds):
            return e.text
    raise ExpertError("folder tile has no label")


class GalleryFavoritePhoto(Template):
    name = "GalleryFavoritePhoto"
    template = "Add the photo {photo} to my favorites in Simple Gallery."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Gallery",)
    complexity = 1.4

    def sample(self, rng, dev):
        g = _gallery(dev)
        m = rng.choice([m for m in g.media if not m.favorite and not m.video])
        return {"photo": m.name, "favs": sum(k.favorite for k in g.media)}

    def check(self, dev, p):
        g = _gallery(dev)
        m = g.get(p["photo"])
        return m is not None and m.favorite and sum(k.favorite for k in g.media) == p["favs"] + 1

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from open_media(x, p["photo"])
        yield x.tap(desc="Add to favorites")
        yield x.finish()


def _items(note: str) -> list[str]:
    return [" ".join(x.lower().split()) for x in note.replace("\n", ",").split(",") if x.strip()]


class ExpenseAddFromReceipt(Template):
    name = "ExpenseAddFromReceipt"
    template = ("Log the purchase on the receipt {receipt} (in the Download folder of Simple Gallery) as an expense "
                "in Pro Expense: use the store's name as the expense name, the receipt total as the amount, "
                "category {category}, the date printed on the receipt, and the items bought as the note, "
                "separated by commas.")
    difficulty = "hard"
    tags = ("multi_app", "screen_reading", "transcription", "data_entry", "parameterized")
    apps = ("Gallery", "Pro Expense")
    complexity = 3.0

    def sample(self, rng, dev):
        m = rng.choice([m for m in _gallery(dev).media if m.store])
        items = [ln.rsplit("  ", 1)[0] for ln in m.lines[2:-1]]
        return {"receipt": m.name, "category": RECEIPT_CATEGORY[m.store],
                "expense": {"name": m.store, "cents": m.total, "amount": _dollars(m.total),
                            "category": RECEIPT_CATEGORY[m.store], "note": "", "date": m.taken.date().isoformat()},
                "items": items, "n": len(_expenses(dev).expenses)}

    def _ok(self, e, p) -> bool:
        return _matches(e, {**p["expense"], "note": e.note}) and _items(e.note) == _items(", ".join(p["items"]))

    def check(self, dev, p):
        es = _expenses(dev).expenses
        return len(es) == p["n"] + 1 and sum(self._ok(e, p) for e in es) == 1

    def subgoals(self, p):
        def opened(dev) -> bool:
            g = _gallery(dev)
            return (dev.foreground == "Gallery" and g.page.name == "photo"
                    and g.page.args["media"].name == p["receipt"]) or self.check(dev, p)

        def logged(dev) -> bool:
            return any(_matches(e, {**p["expense"], "note": e.note}) for e in _expenses(dev).expenses)

        return [("receipt opened", opened), ("expense logged with name, amount, category and date", logged),
                ("items noted", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from open_media(x, p["receipt"])
        yield from x.scroll_to(contains="TOTAL", rid="image_text")
        lines = [e.text for e in x.s.find_all(rid="image_text")]
        total = must((ln for ln in lines if ln.startswith("TOTAL")), "receipt total").split()[-1]
        total = total.lstrip("$").replace(",", "")
        day = datetime.strptime(lines[1], "%b %d, %Y").date()
        items = [ln.rsplit("  ", 1)[0] for ln in lines[2:-1]]
        spec = {"name": lines[0], "amount": total, "category": p["category"], "note": ", ".join(items),
                "date": day.isoformat()}
        yield from x.launch("Pro Expense")
        yield from add_expense(x, spec, with_date=True)
        yield x.finish()
