"""Files (modelled on Android's DocumentsUI file manager): the shared-storage folders with seeded files,
navigation with a breadcrumb, long-press multi-selection, delete (confirmed), move to a picked folder,
rename, new folder and a "Get info" details dialog (size, modified date, type, location)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState, SelectionMixin
from mobilerl.env.sim.ui import Button, Buttons, Dialog, Field, IconButton, Page, Row, Text

STORAGE = "Internal storage"
ROOT_PATH = "/storage/emulated/0"
TOP_FOLDERS = ("Alarms", "Audiobooks", "DCIM", "Documents", "Download", "Movies", "Music", "Notifications",
               "Pictures", "Podcasts", "Recordings", "Ringtones")
SUB_FOLDERS = ("DCIM/Camera", "Pictures/Screenshots", "Documents/Work")
MIME = {"jpg": "JPEG image", "png": "PNG image", "pdf": "PDF document", "docx": "Word document",
        "xlsx": "Excel spreadsheet", "pptx": "PowerPoint presentation", "txt": "Plain text", "mp3": "MP3 audio",
        "m4a": "MPEG-4 audio", "mp4": "MPEG-4 video", "zip": "ZIP archive", "apk": "Android package",
        "epub": "EPUB e-book", "csv": "CSV document", "ogg": "OGG audio"}
SIZE_RANGE = {"jpg": (900_000, 6_500_000), "png": (120_000, 2_400_000), "pdf": (60_000, 3_800_000),
              "docx": (18_000, 240_000), "xlsx": (12_000, 180_000), "pptx": (400_000, 9_000_000),
              "txt": (300, 24_000), "mp3": (2_500_000, 11_000_000), "m4a": (150_000, 6_000_000),
              "mp4": (15_000_000, 480_000_000), "zip": (3_000_000, 220_000_000), "apk": (9_000_000, 95_000_000),
              "epub": (300_000, 4_000_000), "csv": (2_000, 90_000), "ogg": (20_000, 400_000)}


def human_size(n: int) -> str:
    """Android's short file-size format (SI units, three significant digits)."""
    if n < 1000:
        return f"{n} B"
    for unit, div in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        v = n / div
        if v < 999.5 or unit == "GB":
            return f"{v:.2f} {unit}" if v < 9.995 else (f"{v:.1f} {unit}" if v < 99.95 else f"{v:.0f} {unit}")
    return f"{n} B"


@dataclass(eq=False)
class FileItem:
    name: str
    folder: str  # "Download", "DCIM/Camera"
    size: int
    modified: datetime

    @property
    def ext(self) -> str:
        return self.name.rsplit(".", 1)[-1].lower() if "." in self.name else ""

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.name}"


def _stamp(rng: random.Random, when: datetime) -> str:
    return f"{when:%Y%m%d}_{rng.randrange(7, 23):02d}{rng.randrange(60):02d}{rng.randrange(60):02d}"


def seed_files(rng: random.Random, now: datetime) -> list[FileItem]:
    people = content.people(rng, 4)
    out: list[FileItem] = []
    taken: set[str] = set()

    def add(folder: str, name: str) -> None:
        if f"{folder}/{name}" in taken:
            return
        taken.add(f"{folder}/{name}")
        ext = name.rsplit(".", 1)[-1].lower()
        lo, hi = SIZE_RANGE[ext]
        when = now - timedelta(minutes=rng.randrange(30, 60 * 24 * 120))
        out.append(FileItem(name, folder, rng.randrange(lo, hi), when))

    def day() -> datetime:
        return now - timedelta(days=rng.randrange(1, 120))

    dl = [f"invoice_{rng.randrange(10000, 99999)}.pdf", f"boarding_pass_LH{rng.randrange(100, 999)}.pdf",
          "lease_agreement_2023.pdf", "bank_statement_sep_2023.pdf", f"resume_{people[0].last.lower()}.docx",
          "concert_tickets.pdf", "photos_backup.zip", "VLC-Android-3.5.4.apk", "vaccination_record.pdf",
          "wedding_invitation.png", "podcast_episode_42.mp3", "recipes_collection.epub", "expenses_q3.csv",
          "meeting_agenda.docx", "w2_2022.pdf", "floor_plan.png", "product_manual.pdf", "road_trip_playlist.mp3"]
    for name in rng.sample(dl, rng.randrange(11, 15)):
        add("Download", name)
    for _ in range(rng.randrange(2, 5)):
        add("Download", f"IMG_{_stamp(rng, day())}.jpg")
    for _ in range(rng.randrange(1, 3)):
        add("Download", f"Screenshot_{_stamp(rng, day())}.png")
    for name in ("resume.docx", "cover_letter.docx", "tax_return_2022.pdf", "notes.txt", "passport_scan.pdf",
                 "budget_2023.xlsx", "insurance_policy.pdf", f"letter_to_{people[1].first.lower()}.docx"):
        if rng.random() < 0.8:
            add("Documents", name)
    for name in ("q3_report.pptx", "project_plan.docx", "team_contacts.xlsx", "onboarding.pdf"):
        add("Documents/Work", name)
    for name in ("beach_sunset.jpg", "family_dinner.jpg", "hiking_trip.jpg", "birthday_cake.jpg",
                 "new_apartment.jpg", "profile_photo.png", "garden_flowers.jpg"):
        if rng.random() < 0.75:
            add("Pictures", name)
    for _ in range(rng.randrange(2, 5)):
        add("Pictures/Screenshots", f"Screenshot_{_stamp(rng, day())}.png")
    for _ in range(rng.randrange(4, 8)):
        add("DCIM/Camera", f"IMG_{_stamp(rng, day())}.jpg")
    for _ in range(rng.randrange(1, 3)):
        add("DCIM/Camera", f"VID_{_stamp(rng, day())}.mp4")
    for name in ("Nina Simone - Feeling Good.mp3", "Miles Davis - So What.mp3", "Daft Punk - Get Lucky.mp3",
                 "Fleetwood Mac - Dreams.mp3", "Bonobo - Kerala.mp3", "Adele - Hello.mp3"):
        if rng.random() < 0.7:
            add("Music", name)
    for name in ("Voice memo 1.m4a", "Lecture - chapter 3.m4a", "Interview notes.m4a"):
        add("Recordings", name)
    for name in ("home_movie_2019.mp4", "graduation.mp4"):
        add("Movies", name)
    add("Podcasts", "The Daily - Oct 10.mp3")
    add("Ringtones", "Marimba Remix.ogg")
    add("Notifications", "Chime.ogg")
    return out


class Files(SelectionMixin, App):
    name = "Files"
    package = "com.google.android.documentsui"
    color = (26, 115, 232)
    aliases = ("files", "file manager")

    def setup(self) -> None:
        self.folders: set[str] = set(TOP_FOLDERS) | set(SUB_FOLDERS)
        self.files = seed_files(self.rng, self.device.now)
        self.selected: set[object] = set()  # FileItem objects and folder paths (str)
        self.moving: list[object] = []
        self.visited: set[str] = set()  # folders the user opened (for sub-goal checks)

    # -- queries used by tasks
    def find(self, name: str, folder: str | None = None) -> FileItem | None:
        for f in self.files:
            if f.name == name and (folder is None or f.folder == folder):
                return f
        return None

    def in_folder(self, folder: str) -> list[FileItem]:
        return sorted((f for f in self.files if f.folder == folder), key=lambda f: f.name.lower())

    def subfolders(self, folder: str) -> list[str]:
        prefix = folder + "/" if folder else ""
        return sorted((f for f in self.folders if f.startswith(prefix) and "/" not in f[len(prefix):]),
                      key=str.lower)

    def add_file(self, name: str, folder: str, size: int, modified: datetime) -> FileItem:
        f = FileItem(name, folder, size, modified)
        self.files.append(f)
        return f

    # -- navigation
    def _go(self, folder: str) -> None:
        """Jump to ``folder`` (breadcrumb): the back stack becomes the chain of its parents."""
        self.selected.clear()
        parts = folder.split("/") if folder else []
        self.stack = [PageState("main")] + [PageState("main", args={"folder": "/".join(parts[:i + 1])})
                                             for i in range(len(parts))]

    def _enter(self, folder: str) -> None:
        self.selected.clear()
        self.push("main", folder=folder)

    def _toggle(self, item: object) -> None:
        if item in self.selected:
            self.selected.discard(item)
        else:
            self.selected.add(item)

    def _crumbs(self, folder: str, go) -> Buttons:
        parts = folder.split("/") if folder else []
        # the current folder's crumb is the selected (flat) one
        items = [Button(STORAGE, lambda: go(""), rid="breadcrumb", primary=bool(parts))]
        for i, part in enumerate(parts):
            items.append(Button(part, lambda p="/".join(parts[:i + 1]): go(p), rid="breadcrumb",
                                primary=i != len(parts) - 1))
        return Buttons(items, rid="breadcrumbs")

    # -- pages
    def page_main(self, st: PageState) -> Page:
        folder: str = st.args.get("folder", "")
        self.visited.add(folder)
        sel = self.selected
        body: list = [self._crumbs(folder, self._go)]
        for f in self.subfolders(folder):
            n = sum(1 for x in self.files if x.folder == f) + len(self.subfolders(f))
            body.append(Row(f.rsplit("/", 1)[-1], f"{n} item{'s' if n != 1 else ''}", rid="folder", icon="Folder",
                            selected=f in sel, on_long=lambda f=f: self._toggle(f),
                            on_tap=(lambda f=f: self._toggle(f)) if sel else (lambda f=f: self._enter(f))))
        for x in self.in_folder(folder):
            body.append(Row(x.name, f"{human_size(x.size)} · {x.modified:%b %-d, %Y}", rid="file",
                            icon=MIME.get(x.ext, "File"), selected=x in sel, on_long=lambda x=x: self._toggle(x),
                            on_tap=(lambda x=x: self._toggle(x)) if sel else (lambda x=x: self._preview(x))))
        if len(body) == 1:
            body.append(Text("No items", rid="empty", size="small"))
        if sel:
            actions = [IconButton("Select all", lambda: self._select_all(folder), rid="action_select_all"),
                       IconButton("Move to", lambda: self._start_move(), rid="action_move_to"),
                       IconButton("Delete", self._confirm_delete, rid="action_delete")]
            if len(sel) == 1:
                actions.append(IconButton("Rename", self._rename_dialog, rid="action_rename"))
                item = next(iter(sel))
                if isinstance(item, FileItem):
                    actions.append(IconButton("Get info", lambda: self._info(item), rid="action_info"))
            return Page(f"{len(sel)} selected", body=body, actions=actions, scroll_rid="dir_list")
        title = folder.rsplit("/", 1)[-1] if folder else STORAGE
        return Page(title, body=body, nav_back=bool(folder), scroll_rid="dir_list",
                    actions=[IconButton("New folder", self._new_folder_dialog, rid="action_new_folder")])

    def _select_all(self, folder: str) -> None:
        self.selected = set(self.in_folder(folder)) | set(self.subfolders(folder))

    def _preview(self, x: FileItem) -> None:
        self.device.toast = f"No app can open {x.name}" if x.ext in ("apk", "zip") else f"Opening {x.name}…"

    def _info(self, x: FileItem) -> None:
        self.dialog(lambda: Dialog(x.name, body=[
            Text(f"Size: {human_size(x.size)} ({x.size:,} bytes)", rid="info_size", size="small"),
            Text(f"Modified: {x.modified:%b %-d, %Y, %-I:%M %p}", rid="info_modified", size="small"),
            Text(f"Type: {MIME.get(x.ext, 'File')}", rid="info_type", size="small"),
            Text(f"Location: {ROOT_PATH}/{x.folder}", rid="info_location", size="small"),
        ], buttons=[Button("Close", self.close_dialog, rid="close")]))

    def _confirm_delete(self) -> None:
        n = len(self.selected)
        only = next(iter(self.selected)) if n == 1 else None
        label = (only.name if isinstance(only, FileItem) else str(only).rsplit("/", 1)[-1]) if only else ""
        msg = f'Delete "{label}"?' if only is not None else f"Delete {n} items?"

        def delete() -> None:
            for item in list(self.selected):
                if isinstance(item, FileItem):
                    if item in self.files:
                        self.files.remove(item)
                else:
                    prefix = item + "/"
                    self.folders = {f for f in self.folders if f != item and not f.startswith(prefix)}
                    self.files = [f for f in self.files if f.folder != item and not f.folder.startswith(prefix)]
            self.selected.clear()
            self.close_dialog()
            self.device.toast = "Deleted"

        self.dialog(lambda: Dialog(msg, "This action can't be undone.",
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                            Button("Delete", delete, rid="confirm_delete")]))

    def _rename_dialog(self) -> None:
        st = self.page
        folder: str = st.args.get("folder", "")
        item = next(iter(self.selected))
        st.fields["rename"] = item.name if isinstance(item, FileItem) else str(item).rsplit("/", 1)[-1]
        st.focus = "rename"

        def ok() -> None:
            new = st.fields.get("rename", "").strip()
            if not new or "/" in new:
                self.device.toast = "Invalid name"
                return
            if isinstance(item, FileItem):
                if new != item.name and self.find(new, folder) is not None:
                    self.device.toast = "A file with that name already exists"
                    return
                item.name = new
            else:
                path = f"{folder}/{new}" if folder else new
                if path != item and path in self.folders:
                    self.device.toast = "A folder with that name already exists"
                    return
                self._move_folder(item, path)
            self.selected.clear()
            self.close_dialog()
            st.focus = None

        def cancel() -> None:
            self.close_dialog()
            st.focus = None

        self.dialog(lambda: Dialog("Rename", body=[Field("rename", "Name", rid="rename_name")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("OK", ok, rid="ok")]))

    def _new_folder_dialog(self) -> None:
        st = self.page
        folder: str = st.args.get("folder", "")
        st.fields["folder_name"] = ""
        st.focus = "folder_name"

        def ok() -> None:
            name = st.fields.get("folder_name", "").strip().strip("/")
            path = f"{folder}/{name}" if folder else name
            if not name or path in self.folders:
                self.device.toast = "Invalid name" if not name else "That folder already exists"
                return
            self.folders.add(path)
            self.close_dialog()
            st.focus = None

        def cancel() -> None:
            self.close_dialog()
            st.focus = None

        self.dialog(lambda: Dialog("New folder", body=[Field("folder_name", "Folder name", rid="folder_name")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("OK", ok, rid="ok")]))

    def _move_folder(self, old: str, new: str) -> None:
        prefix = old + "/"
        self.folders = {(new + f[len(old):]) if (f == old or f.startswith(prefix)) else f for f in self.folders}
        for x in self.files:
            if x.folder == old or x.folder.startswith(prefix):
                x.folder = new + x.folder[len(old):]

    def _start_move(self) -> None:
        self.moving = list(self.selected)
        self.push("picker", folder="")

    def page_picker(self, st: PageState) -> Page:
        folder: str = st.args.get("folder", "")
        moving = self.moving
        blocked = [i for i in moving if isinstance(i, str)]

        def go(path: str) -> None:
            while len(self.stack) > 1 and self.page.name == "picker":
                self.stack.pop()
            parts = path.split("/") if path else []
            self.push("picker", folder="")
            for i in range(len(parts)):
                self.push("picker", folder="/".join(parts[:i + 1]))

        def move() -> None:
            if any(folder == b or folder.startswith(b + "/") for b in blocked):
                self.device.toast = "Can't move a folder into itself"
                return
            moved = 0
            for item in moving:
                if isinstance(item, FileItem):
                    if item.folder != folder and self.find(item.name, folder) is None and item in self.files:
                        item.folder = folder
                        moved += 1
                else:
                    new = f"{folder}/{item.rsplit('/', 1)[-1]}" if folder else item.rsplit("/", 1)[-1]
                    if new not in self.folders and item in self.folders:
                        self._move_folder(item, new)
                        moved += 1
            while len(self.stack) > 1 and self.page.name == "picker":
                self.stack.pop()
            self.selected.clear()
            self.moving = []
            self.device.toast = f"Moved {moved} item{'s' if moved != 1 else ''}"

        def cancel() -> None:
            while len(self.stack) > 1 and self.page.name == "picker":
                self.stack.pop()

        # DocumentsUI puts CANCEL / MOVE in a bottom bar; Page.bottom lays out 2 px past the screen edge (so
        # the dump drops it), hence the buttons sit under the breadcrumb instead.
        body: list = [self._crumbs(folder, go), Buttons([Button("Cancel", cancel, rid="cancel", primary=False),
                                                          Button("Move", move, rid="move")], rid="picker_buttons")]
        for f in self.subfolders(folder):
            body.append(Row(f.rsplit("/", 1)[-1], rid="folder", icon="Folder",
                            on_tap=lambda f=f: self.push("picker", folder=f)))
        for x in self.in_folder(folder):
            body.append(Row(x.name, human_size(x.size), rid="file_disabled"))
        title = f"Move {len(moving)} item{'s' if len(moving) != 1 else ''} to " + (
            folder.rsplit("/", 1)[-1] if folder else STORAGE)
        return Page(title, body=body, nav_back=True, scroll_rid="dir_list")
