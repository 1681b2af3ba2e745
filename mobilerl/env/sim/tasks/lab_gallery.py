"""AndroidLab-like tasks in Simple Gallery and Camera."""

from __future__ import annotations

from mobilerl.env.sim.apps.gallery import media_store
from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import row_texts
from mobilerl.env.sim.tasks.world_gallery import _gallery, open_media


def _viewing(dev, name: str) -> bool:
    g = _gallery(dev)
    return dev.foreground == "Gallery" and g.page.name == "photo" and g.page.args["media"].name == name


def size_variants(text: str) -> list[str]:
    num, unit = text.split()
    return [text, f"{num}{unit}", f"{num} {'megabytes' if unit == 'MB' else 'kilobytes'}"]


class LabGalleryPhotoSize(Template):
    suite = "lab"
    name = "gallery_photo_size"
    template = "What is the file size of the picture {photo}?"
    difficulty = "easy"
    apps = ("Gallery",)
    complexity = 1.4
    task_type = "query"

    def sample(self, rng, dev):
        m = rng.choice([m for m in _gallery(dev).media if not m.video])
        return {"photo": m.name, "size": m.size_text}

    def check(self, dev, p):
        return answer_matches(dev.answer, size_variants(p["size"]))

    def subgoals(self, p):
        return [("picture opened", lambda dev: _viewing(dev, p["photo"]) or self.check(dev, p)),
                ("size reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from open_media(x, p["photo"])
        yield x.tap(desc="Properties")
        yield x.finish(row_texts(x.s, x.el(rid="property_size"))["title"])


class LabGalleryDeletePhoto(Template):
    suite = "lab"
    name = "gallery_delete_photo"
    template = "Delete the picture {photo} from my gallery."
    difficulty = "easy"
    apps = ("Gallery",)
    complexity = 1.4

    def sample(self, rng, dev):
        m = rng.choice(_gallery(dev).media)
        return {"photo": m.name, "n": len(media_store(dev))}

    def check(self, dev, p):
        return _gallery(dev).get(p["photo"]) is None and len(media_store(dev)) == p["n"] - 1

    def subgoals(self, p):
        return [("picture opened", lambda dev: _viewing(dev, p["photo"]) or self.check(dev, p)),
                ("picture deleted", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Gallery")
        yield from open_media(x, p["photo"])
        yield x.tap(text="Delete", cls="Button")
        yield x.tap(text="Delete", rid="confirm_delete")
        yield x.finish()


class LabCameraPhotoFavorite(Template):
    suite = "lab"
    name = "camera_photo_then_favorite"
    template = "Take a photo with the {lens} camera, then add that photo to my favorites in the gallery."
    difficulty = "medium"
    apps = ("Camera", "Gallery")
    complexity = 1.6

    def sample(self, rng, dev):
        g = _gallery(dev)
        return {"lens": rng.choice(["back", "front"]), "favs": sum(m.favorite for m in g.media),
                "n": len(media_store(dev))}

    def _new(self, dev):
        return [m for m in media_store(dev) if m.captured]

    def check(self, dev, p):
        new = self._new(dev)
        want = (3264, 2448) if p["lens"] == "front" else (4032, 3024)
        return (len(new) == 1 and not new[0].video and (new[0].width, new[0].height) == want and new[0].favorite
                and sum(m.favorite for m in media_store(dev)) == p["favs"] + 1 and len(media_store(dev)) == p["n"] + 1)

    def subgoals(self, p):
        return [("photo taken", lambda dev: any(not m.video for m in self._new(dev))),
                ("photo is a favorite", lambda dev: any(m.favorite for m in self._new(dev))),
                ("exactly that photo taken with the right camera and favorited", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Camera")
        switch = x.el(rid="camera_switch")
        if (p["lens"] == "front") == ("front" in switch.desc):
            yield x.tap(rid="camera_switch")
        yield x.tap(text="Take photo")
        yield x.tap(desc="Open last capture")
        yield x.tap(desc="Add to favorites")
        yield x.finish()
