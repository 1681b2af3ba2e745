"""AndroidWorld-like tasks in Markor (create, edit, rename, move, delete, merge notes; folders), and a
multi-app task that saves an address received by SMS into a note."""

from __future__ import annotations

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.sim import content
from mobilerl.env.sim.tasks.base import Template
from mobilerl.env.sim.tasks.world_sms import (
    _sig,
    last,
    long_seek,
    minutes_ago,
    norm,
    row_text,
    rows,
    sms,
    tap_seek,
)

NEW_NAMES = ["weekend_plan.md", "call_log.md", "gift_budget.md", "garden_notes.md", "reading_notes.md",
             "shopping_for_party.md", "questions_for_doctor.md", "moving_checklist.md", "podcast_ideas.md",
             "vacation_days.txt", "conference_notes.md", "bike_repair.txt", "kids_schedule.md", "house_chores.md"]
TEXTS = ["Call the plumber about the kitchen sink on Friday",
         "Buy stamps, return the library books, pick up dry cleaning",
         "Ask Dr. Patel about the knee pain and the new prescription",
         "Train leaves at 8:42 from platform 4, seat 56",
         "Budget for the party is $250, max 20 guests",
         "Water the tomatoes every other day, fertilize on Sundays",
         "Renew passport before March, photos from the pharmacy",
         "Pack the winter jackets and label the boxes by room"]
HEADERS = ["Reviewed on Oct 15", "IMPORTANT: read before Friday", "Last updated by me", "# Draft v2",
           "Status: in progress", "TODO: share with the team"]
FOLDER_NAMES = ["Receipts", "Taxes 2023", "Poetry", "Garden", "Kids school", "Archive", "Side projects",
                "Health", "Car", "Wedding"]
RENAMES = ["shopping.md", "reading_list.md", "notes_old.md", "family_gifts.md", "codes.txt", "training.md",
           "monthly_budget.md", "brainstorm.md", "home_landlord.txt", "packing_checklist.md"]


def markor(dev):
    return dev.app("Markor")


def root_notes(dev):
    return markor(dev).in_folder("")


def folder_label(folder: str) -> str:
    return f"the {folder} folder" if folder else "the main Markor folder"


def lines(s: str) -> list[str]:
    return [ln.rstrip() for ln in s.strip().split("\n") if ln.strip()]


def create_note(x, name: str, text: str):
    """From a Markor folder: FAB → name → OK → type the content (the editor opens focused)."""
    yield x.tap(desc="Create a new file or folder")
    yield from x.fill("new_file_dialog__name", name)
    yield x.tap(text="OK", cls="Button")
    yield from x.fill("document__fragment__edit__highlighting_editor", text)


def select_matching(x, rid: str, pred):
    """Long-press the first matching row, tap the others (scrolling down through the list)."""
    started = False
    for _ in range(60):
        todo = [r for r in x.s.find_all(rid=rid) if not r.selected and pred(row_text(x.s, r))]
        if todo:
            yield Action(A.TAP if started else A.LONG_PRESS, element=todo[0].bounds)
            started = True
            continue
        if x.s.scrollable() is None:
            break
        before = _sig(x.s)
        yield x.swipe("up", "medium")
        if _sig(x.s) == before:
            return


class MarkorCreateNote(Template):
    name = "MarkorCreateNote"
    template = "Create a new note in Markor named {file} with the following text: {text}"
    difficulty = "medium"
    tags = ("data_entry", "parameterized")
    apps = ("Markor",)
    complexity = 1.2

    def sample(self, rng, dev):
        taken = {n.name for n in markor(dev).notes}
        return {"file": rng.choice([n for n in NEW_NAMES if n not in taken]), "text": rng.choice(TEXTS)}

    def check(self, dev, p):
        hits = [n for n in markor(dev).notes if n.name == p["file"]]
        return len(hits) == 1 and norm(hits[0].content) == norm(p["text"])

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from create_note(x, p["file"], p["text"])
        yield x.finish()


class MarkorEditNote(Template):
    name = "MarkorEditNote"
    template = "Edit {file} in Markor. Add this line to the top of the note: {header}"
    difficulty = "easy"
    tags = ("data_edit", "transcription", "parameterized")
    apps = ("Markor",)
    complexity = 1.2

    def sample(self, rng, dev):
        n = rng.choice(root_notes(dev))
        return {"file": n.name, "original": n.content, "header": rng.choice(HEADERS)}

    def check(self, dev, p):
        n = markor(dev).find(p["file"], "")
        if n is None:
            return False
        got = lines(n.content)
        return bool(got) and got[0].strip() == p["header"] and got[1:] == lines(p["original"])

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from tap_seek(x, text=p["file"], rid="title")
        old = x.el(cls="EditText").text
        yield from x.fill("document__fragment__edit__highlighting_editor", f"{p['header']}\n{old}")
        yield x.finish()


class MarkorDeleteNotesMatching(Template):
    name = "MarkorDeleteNotesMatching"
    template = "{what}"
    difficulty = "medium"
    tags = ("data_edit", "repetition", "screen_reading", "parameterized")
    apps = ("Markor",)
    complexity = 1.6

    DRAFTS = ["draft_cover_letter.md", "draft_speech.md", "draft_blog_post.md", "draft_email_landlord.txt",
              "draft_wedding_toast.md", "draft_complaint_letter.md"]
    EXTRA_TXT = ["scratch.txt", "old_passwords_hint.txt", "tv_shows.txt", "phone_numbers.txt", "quotes.txt"]

    def sample(self, rng, dev):
        if rng.random() < 0.5:
            p = {"kind": "prefix", "pattern": "draft_", "extra": rng.sample(self.DRAFTS, rng.randrange(3, 5)),
                 "what": "Delete all notes in the main Markor folder whose names start with \"draft_\"."}
        else:
            p = {"kind": "ext", "pattern": ".txt", "extra": rng.sample(self.EXTRA_TXT, rng.randrange(1, 3)),
                 "what": "Delete every .txt file in the main Markor folder; keep the other notes."}
        p["keep"] = len(markor(dev).notes) - len(self._matching(dev, p))  # notes that must survive
        return p

    def setup(self, dev, p):
        app = markor(dev)
        for i, name in enumerate(p["extra"]):
            app.create_note(name, "", content.phrase(app.rng, 4)).modified = minutes_ago(dev, 300 + 97 * i)

    @staticmethod
    def _match(p, name: str) -> bool:
        return name.startswith(p["pattern"]) if p["kind"] == "prefix" else name.endswith(p["pattern"])

    def _matching(self, dev, p):
        return [n for n in root_notes(dev) if self._match(p, n.name)]

    def check(self, dev, p):
        return not self._matching(dev, p) and len(markor(dev).notes) == p["keep"]

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from select_matching(x, "file", lambda t: bool(t) and self._match(p, t))
        yield x.tap(desc="Delete")
        yield x.tap(rid="confirm_delete")
        yield x.finish()


class MarkorCreateFolder(Template):
    name = "MarkorCreateFolder"
    template = "Create a new folder in Markor named {folder}."
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("Markor",)
    complexity = 1.0

    def sample(self, rng, dev):
        return {"folder": rng.choice([f for f in FOLDER_NAMES if f not in markor(dev).folders])}

    def check(self, dev, p):
        app = markor(dev)
        return p["folder"] in app.folders and not any(n.name == p["folder"] for n in app.notes)

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield x.tap(desc="Create a new file or folder")
        yield from x.fill("new_file_dialog__name", p["folder"])
        yield x.tap(text="Folder", cls="Button")
        yield x.finish()


class MarkorRenameNote(Template):
    name = "MarkorRenameNote"
    template = "Rename the Markor note {old} to {new}."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Markor",)
    complexity = 1.2

    def sample(self, rng, dev):
        n = rng.choice(root_notes(dev))
        taken = {k.name for k in markor(dev).notes}
        return {"old": n.name, "new": rng.choice([r for r in RENAMES if r not in taken]), "content": n.content}

    def check(self, dev, p):
        app = markor(dev)
        n = app.find(p["new"], "")
        return n is not None and app.find(p["old"], "") is None and n.content == p["content"]

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from long_seek(x, text=p["old"], rid="title")
        yield x.tap(desc="Rename")
        yield from x.fill("rename_name", p["new"])
        yield x.tap(text="OK", cls="Button")
        yield x.finish()


class MarkorMoveNote(Template):
    name = "MarkorMoveNote"
    template = "In Markor, move the note {file} from {src_label} to {dst_label}."
    difficulty = "medium"
    tags = ("complex_ui_understanding", "parameterized")
    apps = ("Markor",)
    complexity = 1.3

    def sample(self, rng, dev):
        app = markor(dev)
        n = rng.choice(app.notes)
        dst = rng.choice([f for f in [""] + sorted(app.folders) if f != n.folder])
        return {"file": n.name, "src": n.folder, "dst": dst, "src_label": folder_label(n.folder),
                "dst_label": folder_label(dst), "content": n.content}

    def check(self, dev, p):
        app = markor(dev)
        n = app.find(p["file"], p["dst"])
        return n is not None and n.content == p["content"] and app.find(p["file"], p["src"]) is None

    def expert(self, p, x):
        yield from x.launch("Markor")
        if p["src"]:
            yield from tap_seek(x, text=p["src"], rid="title")
        yield from long_seek(x, text=p["file"], rid="title")
        yield x.tap(desc="Move")
        yield from tap_seek(x, text=f"Markor/{p['dst']}" if p["dst"] else "Markor", rid="title")
        yield x.finish()


class MarkorMergeNotes(Template):
    name = "MarkorMergeNotes"
    template = ("Merge the contents of the Markor notes {path1}, {path2} and {path3} (in that order) into a new "
                "note named {new} in the main Markor folder. Put a new line between the contents of each note.")
    difficulty = "hard"
    tags = ("data_edit", "data_entry", "memorization", "parameterized")
    apps = ("Markor",)
    complexity = 2.4

    MERGED = ["merged_notes.md", "combined.md", "all_in_one.md", "summary.md", "digest.md"]

    def sample(self, rng, dev):
        app = markor(dev)
        folders = rng.sample(sorted({n.folder for n in app.notes if n.folder}), 2)
        picks = [rng.choice(app.in_folder(f)) for f in folders]
        picks.append(rng.choice(root_notes(dev)))
        rng.shuffle(picks)
        taken = {n.name for n in app.notes}
        return {"path1": picks[0].path, "path2": picks[1].path, "path3": picks[2].path,
                "new": rng.choice([m for m in self.MERGED if m not in taken]),
                "merged": "\n\n".join(n.content for n in picks)}

    def check(self, dev, p):
        hits = [n for n in markor(dev).notes if n.name == p["new"]]
        return len(hits) == 1 and hits[0].folder == "" and lines(hits[0].content) == lines(p["merged"])

    def expert(self, p, x):
        yield from x.launch("Markor")
        parts = []
        for key in ("path1", "path2", "path3"):
            folder, _, name = p[key].rpartition("/")
            if folder:
                yield from tap_seek(x, text=folder, rid="title")
            yield from tap_seek(x, text=name, rid="title")
            parts.append(x.el(cls="EditText").text)
            yield x.back()
            if folder:
                yield x.back()
        yield from create_note(x, p["new"], "\n\n".join(parts))
        yield x.finish()


class MarkorSaveAddressFromSms(Template):
    name = "MarkorSaveAddressFromSms"
    template = ("{name} just texted me the address for Saturday. Save that address in a new Markor note named "
                "{file}; the address should be the only text in the note.")
    difficulty = "hard"
    tags = ("multi_app", "information_retrieval", "transcription", "parameterized")
    apps = ("SMS Messenger", "Markor")
    complexity = 1.6

    FILES = ["saturday_address.md", "party_location.md", "address.txt", "where_to_go.md", "event_address.md"]

    def sample(self, rng, dev):
        from mobilerl.env.sim.tasks.world_sms import contacts_with_phone

        c = rng.choice(contacts_with_phone(dev))
        taken = {n.name for n in markor(dev).notes}
        return {"name": c.name, "number": c.phone, "address": content.address(rng), "ago": rng.randrange(2, 25),
                "file": rng.choice([f for f in self.FILES if f not in taken])}

    def setup(self, dev, p):
        sms(dev).receive(p["number"], f"Here's the address for Saturday: {p['address']}", minutes_ago(dev, p["ago"]))

    def check(self, dev, p):
        hits = [n for n in markor(dev).notes if n.name == p["file"]]
        return len(hits) == 1 and norm(hits[0].content).rstrip(".") == norm(p["address"])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name"], rid="title")
        msg = last((t for t, _ in rows(x.s, "message_received") if "address for Saturday" in t), "the address")
        address = msg.split(":", 1)[1].strip()
        yield from x.launch("Markor")
        yield from create_note(x, p["file"], address)
        yield x.finish()
