"""Markor (a Markdown notes app working on plain files): a file browser with folders, a "new file or
folder" dialog, an editor that saves as you type (Markor autosaves), a preview mode, and multi-selection
with rename, move and delete (with confirmation)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState, SelectionMixin
from mobilerl.env.sim.ui import Button, Dialog, Field, IconButton, Page, Row, Text


@dataclass(eq=False)
class Note:
    name: str  # file name with extension, e.g. "grocery_list.md"
    folder: str  # "" for Markor's root, "Work" or "Work/Meetings" for folders
    content: str
    modified: datetime

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.name}" if self.folder else self.name

    @property
    def size(self) -> int:
        return len(self.content.encode())


class AutosaveFields(dict):
    """The editor page's field values: typing into the editor writes through to the note (Markor saves
    as you type), whatever happens next (Back, Home, launching another app)."""

    def __init__(self, note: Note, clock) -> None:
        super().__init__(content=note.content)
        self.note = note
        self.clock = clock

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        if key == "content" and value != self.note.content:
            self.note.content = value
            self.note.modified = self.clock()


def human_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.2f} MB"


def _lines(items: list[str], bullet: str = "- ") -> str:
    return "\n".join(bullet + i for i in items)


GROCERIES = ["eggs", "oat milk", "spinach", "cherry tomatoes", "basmati rice", "chickpeas", "greek yogurt",
             "bananas", "coffee beans", "olive oil", "cheddar", "tortillas", "avocados", "garlic", "lemons"]
BOOKS = ["The Overstory", "Project Hail Mary", "Klara and the Sun", "Educated", "The Left Hand of Darkness",
         "Pachinko", "Sapiens", "The Remains of the Day", "Circe", "Thinking, Fast and Slow"]
IDEAS = ["weekend trip to the coast", "learn to make fresh pasta", "build a bird feeder with the kids",
         "start a running log", "digitize old family photos", "plant tomatoes on the balcony"]


def seed_notes(rng: random.Random, now: datetime) -> tuple[list[Note], set[str]]:
    """Realistic notes: lists, meeting notes, plans; personal data (names, numbers, addresses) included."""
    people = content.people(rng, 8)
    folders = {"Work", "Recipes", "Journal", "Travel"}

    def when() -> datetime:
        return now - timedelta(minutes=rng.randrange(60, 60 * 24 * 40))

    p = people
    notes = [
        Note("grocery_list.md", "", "# Groceries\n" + _lines(rng.sample(GROCERIES, 7)), when()),
        Note("books_to_read.md", "", "# Reading list\n" + _lines(rng.sample(BOOKS, 5), "- [ ] "), when()),
        Note("ideas.md", "", "# Ideas\n" + _lines(rng.sample(IDEAS, 4)), when()),
        Note("todo.md", "", "# To do\n- [ ] renew car insurance before Nov 1\n- [ ] call "
             f"{p[0].name} about the dog sitting ({p[0].phone})\n- [x] return library books\n"
             "- [ ] book dentist check-up", when()),
        Note("landlord.txt", "", f"Landlord: {p[1].name}\nPhone: {p[1].phone}\nEmail: {p[1].email}\n"
             f"Rent ${rng.randrange(12, 32)}50 due on the 1st\nAddress: {p[1].address}", when()),
        Note("gift_ideas.md", "", f"# Gift ideas\n- {p[2].first}: pottery class voucher\n- {p[3].first}: "
             f"noise-cancelling headphones\n- {p[4].first}: {rng.choice(BOOKS)}", when()),
        Note("wifi_and_codes.txt", "", f"Guest wifi: Maple_{rng.randrange(100, 999)}\nGarage code: "
             f"{rng.randrange(1000, 9999)}\nBike lock: {rng.randrange(100, 999)}", when()),
        Note("packing_list.md", "", "# Packing\n" + _lines(["passport", "phone charger", "adapter plug",
                                                            "sunscreen", "hiking boots", "rain jacket"]), when()),
        Note("car_maintenance.txt", "", f"Oil change at {rng.randrange(40, 90)},000 miles\nTires rotated "
             f"Sep {rng.randrange(1, 28)}\nMechanic: {p[5].name}, {p[5].phone}", when()),
        Note("workout_plan.md", "", "# Weekly plan\nMon: 5k easy run\nWed: intervals 6x400m\nFri: strength\n"
             "Sun: long run 12k", when()),
        Note("budget_october.md", "", f"# October budget\nRent: ${rng.randrange(12, 32)}50\nGroceries: "
             f"${rng.randrange(300, 600)}\nUtilities: ${rng.randrange(90, 200)}\nSavings: "
             f"${rng.randrange(200, 900)}", when()),
        Note("meeting_notes_2023_10_02.md", "Work", f"# Sprint planning\nAttendees: {p[2].name}, {p[6].name}, "
             f"{p[7].name}\n- migrate billing service\n- fix login timeout bug\nNext sync: Thursday 10:00",
             when()),
        Note("project_contacts.md", "Work", f"- {p[6].name} ({p[6].company}): {p[6].email}\n- {p[7].name} "
             f"({p[7].company}): {p[7].phone}", when()),
        Note("one_on_one.md", "Work", "- ask about conference budget\n- Q4 goals review\n- vacation days in "
             "December", when()),
        Note("pancakes.md", "Recipes", "# Pancakes\n- 200 g flour\n- 2 eggs\n- 300 ml milk\n- 1 tbsp sugar\n"
             "- pinch of salt\nRest the batter 10 minutes.", when()),
        Note("lentil_soup.md", "Recipes", "# Lentil soup\n- 250 g red lentils\n- 1 onion\n- 2 carrots\n"
             "- 1 l vegetable stock\n- 1 tsp cumin\nSimmer 25 minutes, blend half.", when()),
        Note("2023_10_08.md", "Journal", "Long walk by the river with " + p[3].first + ". Finally fixed the "
             "leaking tap.", when()),
        Note("2023_10_12.md", "Journal", "Busy day at work. Started reading " + rng.choice(BOOKS) + ".", when()),
        Note("lisbon_itinerary.md", "Travel", f"# Lisbon\nFlight TP {rng.randrange(200, 1999)} on Nov "
             f"{rng.randrange(2, 28)}\nHotel: Rua Augusta {rng.randrange(10, 300)}, 1100-053 Lisboa\n"
             f"Booking ref: {''.join(rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ23456789') for _ in range(6))}",
             when()),
    ]
    return notes, folders


class Markor(SelectionMixin, App):
    name = "Markor"
    package = "net.gsantner.markor"
    color = (55, 71, 79)
    aliases = ("notes", "markor")

    def setup(self) -> None:
        self.notes, self.folders = seed_notes(self.rng, self.device.now)
        self.selected: set[object] = set()  # Note objects and folder paths (str)
        self.opened: set[str] = set()  # paths of the notes opened in the editor

    # -- queries used by tasks
    def find(self, name: str, folder: str | None = None) -> Note | None:
        for n in self.notes:
            if n.name == name and (folder is None or n.folder == folder):
                return n
        return None

    def in_folder(self, folder: str) -> list[Note]:
        return sorted((n for n in self.notes if n.folder == folder), key=lambda n: n.name.lower())

    def subfolders(self, folder: str) -> list[str]:
        prefix = folder + "/" if folder else ""
        out = [f for f in self.folders if f.startswith(prefix) and "/" not in f[len(prefix):]]
        return sorted(out, key=str.lower)

    def create_note(self, name: str, folder: str = "", text: str = "") -> Note:
        n = Note(name, folder, text, self.device.now)
        self.notes.append(n)
        return n

    # -- navigation
    def _enter(self, folder: str) -> None:
        self.selected.clear()
        self.push("main", folder=folder)

    def _open(self, note: Note) -> None:
        self.selected.clear()
        self.push("editor", note=note)
        self.page.fields = AutosaveFields(note, lambda: self.device.now)

    def _toggle(self, item: object) -> None:
        if item in self.selected:
            self.selected.discard(item)
        else:
            self.selected.add(item)

    # -- pages
    def page_main(self, st: PageState) -> Page:
        folder: str = st.args.get("folder", "")
        sel = self.selected
        body: list = [Text("/storage/emulated/0/Documents/markor" + (f"/{folder}" if folder else ""),
                           rid="path", size="small")]
        for f in self.subfolders(folder):
            n_items = sum(1 for n in self.notes if n.folder == f) + len(self.subfolders(f))
            body.append(Row(f.rsplit("/", 1)[-1], f"{n_items} item{'s' if n_items != 1 else ''}", rid="folder", icon="Folder",
                            selected=f in sel, on_long=lambda f=f: self._toggle(f),
                            on_tap=(lambda f=f: self._toggle(f)) if sel else (lambda f=f: self._enter(f))))
        for n in self.in_folder(folder):
            body.append(Row(n.name, f"{n.modified:%b %-d, %Y %H:%M} · {human_size(n.size)}", rid="file",
                            icon="File", selected=n in sel, on_long=lambda n=n: self._toggle(n),
                            on_tap=(lambda n=n: self._toggle(n)) if sel else (lambda n=n: self._open(n))))
        if len(body) == 1:
            body.append(Text("This folder is empty", rid="empty", size="small"))
        if sel:
            actions = [IconButton("Delete", self._confirm_delete, rid="action_delete"),
                       IconButton("Move", lambda: self.push("move", folder=folder), rid="action_move")]
            if len(sel) == 1:
                actions.append(IconButton("Rename", self._rename_dialog, rid="action_rename"))
            return Page(f"{len(sel)} selected", body=body, actions=actions, scroll_rid="file_list")
        title = folder.rsplit("/", 1)[-1] if folder else "Markor"
        return Page(title, body=body, nav_back=bool(folder), scroll_rid="file_list",
                    actions=[IconButton("Search", lambda: self.push("search"), rid="action_search")],
                    fab=IconButton("Create a new file or folder", self._new_dialog, rid="fab_add_new_item"))

    def _new_dialog(self) -> None:
        st = self.page
        folder: str = st.args.get("folder", "")
        st.fields["new_name"] = ""
        st.focus = "new_name"

        def make_file() -> None:
            name = st.fields.get("new_name", "").strip()
            if not name:
                self.device.toast = "Enter a name"
                return
            if "." not in name:
                name += ".md"
            if self.find(name, folder) is not None:
                self.device.toast = f"{name} already exists"
                return
            note = self.create_note(name, folder)
            self.close_dialog()
            st.focus = None
            self._open(note)
            self.page.focus = "content"

        def make_folder() -> None:
            name = st.fields.get("new_name", "").strip().strip("/")
            if not name:
                self.device.toast = "Enter a name"
                return
            path = f"{folder}/{name}" if folder else name
            if path in self.folders:
                self.device.toast = f"{name} already exists"
                return
            self.folders.add(path)
            self.close_dialog()
            st.focus = None

        def cancel() -> None:
            self.close_dialog()
            st.focus = None

        self.dialog(lambda: Dialog("New file", body=[Field("new_name", "Name", rid="new_file_dialog__name")],
                                   buttons=[Button("Folder", make_folder, rid="folder", primary=False),
                                            Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("OK", make_file, rid="ok")]))

    def _confirm_delete(self) -> None:
        names = sorted((i.name if isinstance(i, Note) else i.rsplit("/", 1)[-1]) for i in self.selected)

        def delete() -> None:
            for item in list(self.selected):
                if isinstance(item, Note):
                    if item in self.notes:
                        self.notes.remove(item)
                else:
                    prefix = item + "/"
                    self.folders = {f for f in self.folders if f != item and not f.startswith(prefix)}
                    self.notes = [n for n in self.notes if n.folder != item and not n.folder.startswith(prefix)]
            self.selected.clear()
            self.close_dialog()

        self.dialog(lambda: Dialog("Delete", "Do you really want to delete: " + ", ".join(names) + "?",
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                            Button("OK", delete, rid="confirm_delete")]))

    def _rename_dialog(self) -> None:
        st = self.page
        folder: str = st.args.get("folder", "")
        item = next(iter(self.selected))
        old = item.name if isinstance(item, Note) else item.rsplit("/", 1)[-1]
        st.fields["rename"] = old
        st.focus = "rename"

        def ok() -> None:
            new = st.fields.get("rename", "").strip()
            if not new or "/" in new:
                self.device.toast = "Invalid name"
                return
            if isinstance(item, Note):
                if new != item.name and self.find(new, folder) is not None:
                    self.device.toast = f"{new} already exists"
                    return
                item.name = new
            else:
                path = f"{folder}/{new}" if folder else new
                if path != item and path in self.folders:
                    self.device.toast = f"{new} already exists"
                    return
                self._rename_folder(item, path)
            self.selected.clear()
            self.close_dialog()
            st.focus = None

        def cancel() -> None:
            self.close_dialog()
            st.focus = None

        self.dialog(lambda: Dialog("Rename", body=[Field("rename", "Name", rid="rename_name")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("OK", ok, rid="ok")]))

    def _rename_folder(self, old: str, new: str) -> None:
        prefix = old + "/"
        self.folders = {(new + f[len(old):]) if (f == old or f.startswith(prefix)) else f for f in self.folders}
        for n in self.notes:
            if n.folder == old or n.folder.startswith(prefix):
                n.folder = new + n.folder[len(old):]

    def page_move(self, st: PageState) -> Page:
        src: str = st.args["folder"]
        moving = [i for i in self.selected]
        targets = [""] + sorted(self.folders, key=str.lower)
        blocked = {i for i in moving if isinstance(i, str)}
        targets = [t for t in targets if t != src and not any(t == b or t.startswith(b + "/") for b in blocked)]

        def move(dest: str) -> None:
            for item in moving:
                if isinstance(item, Note):
                    if self.find(item.name, dest) is None:
                        item.folder = dest
                else:
                    new = f"{dest}/{item.rsplit('/', 1)[-1]}" if dest else item.rsplit("/", 1)[-1]
                    if new not in self.folders:
                        self._rename_folder(item, new)
            self.selected.clear()
            self.pop()
            self.device.toast = "Moved"

        rows = [Row("Markor" if not t else f"Markor/{t}", rid="destination", icon="Folder",
                    on_tap=lambda t=t: move(t)) for t in self.shuffled(targets)]
        return Page("Move to", body=[Text("Select the destination folder", size="small"), *rows],
                    nav_back=True, scroll_rid="folder_list")

    def page_editor(self, st: PageState) -> Page:
        note: Note = st.args["note"]
        self.opened.add(note.path)

        def save() -> None:
            self.device.toast = "Saved"

        def toggle_preview() -> None:
            st.args["preview"] = not st.args.get("preview", False)
            st.focus = None
            st.scroll = 0

        if st.args.get("preview"):
            body: list = [Text(line or " ", rid="preview_line", size="body") for line in note.content.split("\n")]
            return Page(note.name, body=body, nav_back=True, scroll_rid="document_view", actions=[
                IconButton("Edit", toggle_preview, rid="action_edit")])
        return Page(note.name, body=[Field("content", "Start writing…", rid="document__fragment__edit__highlighting_editor",
                                           multiline=True)],
                    nav_back=True, scroll_rid="document_edit", actions=[
                        IconButton("Preview", toggle_preview, rid="action_preview"),
                        IconButton("Save", save, rid="action_save")])

    def page_search(self, st: PageState) -> Page:
        q = st.fields.get("query", "").strip().lower()
        body: list = [Field("query", "Search files", rid="search_query")]
        if q:
            hits = [n for n in sorted(self.notes, key=lambda n: n.path.lower())
                    if q in n.name.lower() or q in n.content.lower()]
            body += [Row(n.name, "Markor/" + n.folder if n.folder else "Markor", rid="search_result",
                         on_tap=lambda n=n: self._open(n)) for n in hits] or [Text("No results", size="small")]
        return Page("Search", body=body, nav_back=True, scroll_rid="search_results")

