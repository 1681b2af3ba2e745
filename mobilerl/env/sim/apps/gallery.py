"""Camera (com.android.camera2) and Simple Gallery Pro (com.simplemobiletools.gallery.pro).

The camera writes its captures into the gallery's media store (the ``Camera`` folder), so a photo taken
in Camera shows up in Gallery. Gallery: folder grid, per-folder media grid (newest first), a photo viewer
with properties, favorites, delete with confirmation and multi-select.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import Button, Buttons, Dialog, Grid, IconButton, Page, Row, Text

FOLDER_PATHS = {"Camera": "DCIM/Camera", "Screenshots": "Pictures/Screenshots", "Download": "Download",
                "WhatsApp Images": "WhatsApp/Media/WhatsApp Images", "Favorites": ""}
SUBJECTS = ["beach at sunset", "city skyline", "dog in the park", "birthday cake", "mountain trail",
            "coffee cup on a table", "street market", "autumn leaves", "family dinner", "bicycle by a wall",
            "lake with a pier", "concert stage", "snowy street", "flower bed", "old bookshop", "train station"]
CAMERA_RES = [(4032, 3024), (3024, 4032), (4000, 3000), (3000, 4000), (4080, 3072)]
STORES = [("Corner Market", [("Bananas", 129, 349), ("Whole milk", 239, 459), ("Sourdough bread", 399, 699),
                             ("Eggs dozen", 299, 599), ("Cheddar cheese", 449, 899), ("Apples", 299, 649)]),
          ("City Hardware", [("Light bulbs", 599, 1499), ("Duct tape", 399, 899), ("Screwdriver set", 1299, 2999),
                             ("Paint brush", 349, 999), ("Extension cord", 999, 2499)]),
          ("Green Leaf Pharmacy", [("Vitamin C", 699, 1499), ("Band-aids", 349, 799), ("Sunscreen", 899, 1899),
                                   ("Cough syrup", 799, 1399)]),
          ("Bella Napoli Pizzeria", [("Margherita pizza", 1199, 1699), ("Caesar salad", 799, 1199),
                                     ("Tiramisu", 599, 899), ("Sparkling water", 249, 449)]),
          ("Page Turner Books", [("Paperback novel", 999, 1899), ("Notebook", 499, 1299), ("Bookmark", 199, 499),
                                 ("Cookbook", 1999, 3499)])]
RECEIPT_CATEGORY = {"Corner Market": "Food", "City Hardware": "Housing", "Green Leaf Pharmacy": "Health Care",
                    "Bella Napoli Pizzeria": "Food", "Page Turner Books": "Education"}


@dataclass(eq=False)
class Media:
    name: str
    folder: str
    taken: datetime
    size: int  # bytes
    width: int
    height: int
    video: bool = False
    duration: int = 0  # seconds, videos only
    favorite: bool = False
    subject: str = ""
    lines: tuple[str, ...] = ()  # text visible in the picture (receipts)
    captured: bool = False  # taken during the episode
    store: str = ""
    total: int = 0  # receipt total in cents

    @property
    def path(self) -> str:
        return f"/storage/emulated/0/{FOLDER_PATHS.get(self.folder, self.folder)}/{self.name}"

    @property
    def resolution(self) -> str:
        return f"{self.width} x {self.height}"

    @property
    def size_text(self) -> str:
        return f"{self.size / 1_000_000:.1f} MB" if self.size >= 1_000_000 else f"{self.size // 1000} KB"


def money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def taken_text(t: datetime) -> str:
    return f"{t:%b} {t.day}, {t.year} {t.hour % 12 or 12}:{t.minute:02d} {'AM' if t.hour < 12 else 'PM'}"


def media_store(device) -> list[Media]:
    """The shared media store (owned by Gallery; Camera writes into it)."""
    g = device.apps.get("Gallery")
    if g is None:
        store = getattr(device, "_sim_media_store", None)
        if store is None:
            store = []
            device._sim_media_store = store
        return store
    return g.media


class Gallery(App):
    name = "Gallery"
    package = "com.simplemobiletools.gallery.pro"
    color = (244, 81, 30)
    aliases = ("gallery", "simple gallery", "simple gallery pro", "photos")

    def setup(self) -> None:
        rng = self.rng
        now = self.device.now
        self.media: list[Media] = []
        taken: set[str] = set()

        def stamp(days_max: int) -> datetime:
            while True:
                t = now - timedelta(days=rng.randrange(0, days_max), hours=rng.randrange(0, 12),
                                    minutes=rng.randrange(0, 60), seconds=rng.randrange(0, 60))
                t = t.replace(microsecond=0)
                if t < now and t.strftime("%Y%m%d%H%M%S") not in taken:
                    taken.add(t.strftime("%Y%m%d%H%M%S"))
                    return t

        for _ in range(rng.randrange(14, 21)):
            t = stamp(40)
            w, h = rng.choice(CAMERA_RES)
            self.media.append(Media(f"IMG_{t:%Y%m%d_%H%M%S}.jpg", "Camera", t, rng.randrange(1_800_000, 5_200_000),
                                    w, h, subject=rng.choice(SUBJECTS)))
        for _ in range(rng.randrange(2, 4)):
            t = stamp(40)
            self.media.append(Media(f"VID_{t:%Y%m%d_%H%M%S}.mp4", "Camera", t, rng.randrange(8_000_000, 60_000_000),
                                    1920, 1080, video=True, duration=rng.randrange(5, 90),
                                    subject=rng.choice(SUBJECTS)))
        for _ in range(rng.randrange(3, 7)):
            t = stamp(30)
            self.media.append(Media(f"Screenshot_{t:%Y%m%d-%H%M%S}.png", "Screenshots", t,
                                    rng.randrange(180_000, 900_000), 1080, 2400, subject="screenshot"))
        for i in range(rng.randrange(3, 6)):
            t = stamp(30)
            w, h = rng.choice([(1600, 1200), (1200, 1600), (1280, 960)])
            self.media.append(Media(f"IMG-{t:%Y%m%d}-WA{i + 11:04d}.jpg", "WhatsApp Images", t,
                                    rng.randrange(90_000, 400_000), w, h, subject=rng.choice(SUBJECTS)))
        for store, items in rng.sample(STORES, 3):
            t = stamp(7)
            while any(m.name == f"receipt_{t:%Y%m%d_%H%M}.jpg" for m in self.media):
                t -= timedelta(minutes=1)
            picks = rng.sample(items, rng.randrange(2, min(4, len(items)) + 1))
            lines = [store, f"{t:%b} {t.day}, {t.year}"]
            total = 0
            for item, lo, hi in picks:
                c = rng.randrange(lo, hi)
                total += c
                lines.append(f"{item}  {money(c)}")
            lines.append(f"TOTAL  {money(total)}")
            self.media.append(Media(f"receipt_{t:%Y%m%d_%H%M}.jpg", "Download", t, rng.randrange(300_000, 1_200_000),
                                    1200, 1600, subject="receipt", lines=tuple(lines), store=store, total=total))
        for m in rng.sample([m for m in self.media if m.folder == "Camera"], 2):
            m.favorite = True

    # -- queries
    def get(self, name: str) -> Media | None:
        return next((m for m in self.media if m.name == name), None)

    def in_folder(self, folder: str) -> list[Media]:
        if folder == "Favorites":
            items = [m for m in self.media if m.favorite]
        else:
            items = [m for m in self.media if m.folder == folder]
        return sorted(items, key=lambda m: m.taken, reverse=True)

    def folders(self) -> list[str]:
        names = [f for f in ("Camera", "Screenshots", "Download", "WhatsApp Images") if self.in_folder(f)]
        names = self.shuffled(names)
        if any(m.favorite for m in self.media):
            names.append("Favorites")
        return names


    def on_swipe(self, direction: str) -> bool:
        st = self.page
        if st.name != "photo":
            return False
        items = self.in_folder(st.args["folder"])
        m = st.args["media"]
        if m not in items:
            return False
        i = items.index(m) + (1 if direction == "left" else -1)
        if 0 <= i < len(items):
            self.replace("photo", media=items[i], folder=st.args["folder"])
            return True
        return False

    # -- pages
    def page_main(self, st: PageState) -> Page:
        tiles = [Row(f"{len(self.in_folder(f))} items", on_tap=lambda f=f: self.push("folder", folder=f),
                     rid="folder_tile", desc=f) for f in self.folders()]
        return Page("Simple Gallery", body=[Grid(tiles, cols=2, tile_h=460, rid="directories_grid")],
                    scroll_rid="directories")

    def page_folder(self, st: PageState) -> Page:
        folder = st.args["folder"]
        items = self.in_folder(folder)
        sel: list[Media] = st.args.setdefault("sel", [])
        tiles = []
        for m in items:
            label = f"{m.duration // 60}:{m.duration % 60:02d}" if m.video else ""
            if sel:
                def toggle(m=m) -> None:
                    if m in sel:
                        sel.remove(m)
                    else:
                        sel.append(m)
                tiles.append(Row(label, on_tap=toggle, on_long=toggle, rid="medium_thumbnail", desc=m.name,
                                 selected=m in sel))
            else:
                tiles.append(Row(label, on_tap=lambda m=m: self.push("photo", media=m, folder=folder),
                                 on_long=lambda m=m: sel.append(m), rid="medium_thumbnail", desc=m.name))
        body: list = [Grid(tiles, cols=3, tile_h=360, rid="media_grid")] if tiles else [Text("No media", rid="empty")]
        if sel:
            n = len(sel)

            def delete_sel() -> None:
                for m in list(sel):
                    if m in self.media:
                        self.media.remove(m)
                sel.clear()
                self.close_dialog()

            return Page(f"{n} selected", nav_back=True, body=body, scroll_rid="media_grid_holder", actions=[
                IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                    "Delete", f"Are you sure you want to delete {n} item{'s' if n != 1 else ''}?",
                    buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                             Button("Delete", delete_sel, rid="confirm_delete")])), rid="cab_delete")])
        return Page(folder, nav_back=True, body=body, scroll_rid="media_grid_holder")

    def page_photo(self, st: PageState) -> Page:
        m: Media = st.args["media"]

        def delete() -> None:
            if m in self.media:
                self.media.remove(m)
            self.close_dialog()
            self.pop()

        def fav() -> None:
            m.favorite = not m.favorite

        kind = "Video" if m.video else "Photo"
        # the action bar sits under the picture (Page.bottom is not usable: see the lifestyle report)
        body: list = [Grid([Row(f"▶ {m.duration // 60}:{m.duration % 60:02d}" if m.video else "",
                                desc=f"{kind}: {m.subject}", rid="media_view")],
                           cols=1, tile_h=900 if m.lines else 1400, rid="view_pager"),
                      Buttons([
                          Button("Unfavorite" if m.favorite else "Favorite", fav, rid="bottom_favorite",
                                 desc="Remove from favorites" if m.favorite else "Add to favorites"),
                          Button("Share", lambda: setattr(self.device, "toast", "Sharing is not available"),
                                 rid="bottom_share"),
                          Button("Delete", lambda: self.dialog(lambda: Dialog(
                              "Delete", "Are you sure you want to delete this item?",
                              buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                       Button("Delete", delete, rid="confirm_delete")])), rid="bottom_delete"),
                      ], rid="bottom_actions")]
        body.extend(Text(line, rid="image_text", size="body") for line in m.lines)
        return Page(m.name, nav_back=True, body=body, scroll_rid="photo_view", actions=[
            IconButton("Properties", lambda: self._properties(m), rid="properties"),
        ])

    def _properties(self, m: Media) -> None:
        rows = [Row(m.name, "Name", rid="property_name"), Row(m.path, "Path", rid="property_path"),
                Row(m.size_text, "Size", rid="property_size"), Row(m.resolution, "Resolution", rid="property_resolution"),
                Row(taken_text(m.taken), "Date taken", rid="property_date")]
        if m.video:
            rows.insert(4, Row(f"{m.duration // 60}:{m.duration % 60:02d}", "Duration", rid="property_duration"))
        self.dialog(lambda: Dialog("Properties", body=rows, buttons=[Button("OK", self.close_dialog, rid="ok")]))


class Camera(App):
    name = "Camera"
    package = "com.android.camera2"
    color = (33, 33, 33)
    aliases = ("camera", "camera2")

    def setup(self) -> None:
        self.mode = "Photo"
        self.front = False
        self.recording_since: datetime | None = None
        self.last: Media | None = None

    def restart(self) -> None:
        super().restart()
        self.recording_since = None  # relaunching discards an unfinished recording

    def on_swipe(self, direction: str) -> bool:
        if self.page.name != "main" or self.recording_since is not None:
            return False
        self._mode("Video" if direction == "left" else "Photo")
        return True

    def _mode(self, mode: str) -> None:
        if self.recording_since is None:
            self.mode = mode

    def _unique(self, prefix: str, ext: str) -> tuple[str, datetime]:
        t = self.device.now.replace(microsecond=0)
        store = media_store(self.device)
        while any(m.name == f"{prefix}_{t:%Y%m%d_%H%M%S}.{ext}" for m in store):
            t += timedelta(seconds=1)
        return f"{prefix}_{t:%Y%m%d_%H%M%S}.{ext}", t

    def shutter(self) -> None:
        store = media_store(self.device)
        if self.mode == "Photo":
            name, t = self._unique("IMG", "jpg")
            w, h = (3264, 2448) if self.front else (4032, 3024)
            m = Media(name, "Camera", t, self.rng.randrange(1_800_000, 5_200_000), w, h, subject="camera capture",
                      captured=True)
            store.append(m)
            self.last = m
            self.device.toast = "Photo saved"
            self.device.log.append(f"photo:{name}")
        elif self.recording_since is None:
            self.recording_since = self.device.now
            self.device.log.append("video_start")
        else:
            name, t = self._unique("VID", "mp4")
            dur = max(1, int((self.device.now - self.recording_since).total_seconds()))
            m = Media(name, "Camera", t, 1_500_000 * dur, 1920, 1080, video=True, duration=dur,
                      subject="camera capture", captured=True)
            store.append(m)
            self.last = m
            self.recording_since = None
            self.device.toast = "Video saved"
            self.device.log.append(f"video:{name}")

    def _open_gallery(self) -> None:
        if self.last is None or self.device.resolve_app("Gallery") is None or self.last not in media_store(self.device):
            self.device.toast = "No captures yet"
            return
        last = self.last
        self.device.launch("Gallery")
        g = self.device.apps["Gallery"]
        g.push("folder", folder="Camera")
        g.push("photo", media=last, folder="Camera")

    def page_main(self, st: PageState) -> Page:
        rec = self.recording_since is not None
        if self.mode == "Photo":
            shutter = Button("Take photo", self.shutter, rid="shutter_button", desc="Shutter")
        else:
            shutter = Button("Stop recording" if rec else "Record video", self.shutter, rid="shutter_button",
                             desc="Shutter")
        tabs = [Button(m, lambda m=m: self._mode(m), rid=f"mode_{m.lower()}", primary=m != self.mode)
                for m in ("Photo", "Video")]
        body: list = [Grid([Row("● REC " + _elapsed(self.device.now, self.recording_since) if rec else "",
                                desc="Camera preview", rid="preview")], cols=1, tile_h=1450, rid="preview_frame"),
                      Buttons([
                          Button("Gallery", self._open_gallery, rid="thumbnail", desc="Open last capture",
                                 primary=False),
                          shutter,
                          Button("Switch", self._switch, rid="camera_switch",
                                 desc="Switch to front camera" if not self.front else "Switch to back camera",
                                 primary=False)], rid="controls")]
        return Page("Camera", body=body, tabs=tabs,
                    actions=[IconButton("Settings", lambda: setattr(self.device, "toast", "Settings"),
                                        rid="settings")])

    def _switch(self) -> None:
        self.front = not self.front


def _elapsed(now: datetime, since: datetime | None) -> str:
    if since is None:
        return ""
    s = int((now - since).total_seconds())
    return f"{s // 60}:{s % 60:02d}"

