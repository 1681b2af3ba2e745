"""AndroidLab-style tasks in Markor (operation and query types, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_notes import NEW_NAMES, TEXTS, create_note, markor
from mobilerl.env.sim.tasks.world_sms import first, norm, tap_seek


class LabNotesCreateInFolder(Template):
    suite = "lab"
    name = "notes_create_in_folder"
    template = "Create a note named {file} in the {folder} folder of Markor, and write \"{text}\" in it."
    difficulty = "medium"
    apps = ("Markor",)
    complexity = 1.3

    def sample(self, rng, dev):
        app = markor(dev)
        taken = {n.name for n in app.notes}
        return {"folder": rng.choice(sorted(app.folders)), "file": rng.choice([n for n in NEW_NAMES if n not in taken]),
                "text": rng.choice(TEXTS)}

    def check(self, dev, p):
        hits = [n for n in markor(dev).notes if n.name == p["file"]]
        return len(hits) == 1 and hits[0].folder == p["folder"] and norm(hits[0].content) == norm(p["text"])

    def subgoals(self, p):
        def made(dev):
            return markor(dev).find(p["file"], p["folder"]) is not None

        return [
            (f"create {p['file']} in {p['folder']}", made),
            ("write the text", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from tap_seek(x, text=p["folder"], rid="title")
        yield from create_note(x, p["file"], p["text"])
        yield x.finish()


FACTS = [
    ("landlord.txt", "", "Phone", "my landlord's phone number"),
    ("landlord.txt", "", "Email", "my landlord's email address"),
    ("wifi_and_codes.txt", "", "Garage code", "the garage code"),
    ("lisbon_itinerary.md", "Travel", "Booking ref", "the booking reference of my Lisbon trip"),
    ("car_maintenance.txt", "", "Mechanic", "the name and number of my mechanic"),
]


class LabNotesFactQuery(Template):
    suite = "lab"
    name = "notes_fact_query"
    template = "According to {file} in Markor, what is {what}?"
    difficulty = "easy"
    apps = ("Markor",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        file, folder, label, what = rng.choice(FACTS)
        note = markor(dev).find(file, folder)
        value = next(ln.split(":", 1)[1].strip() for ln in note.content.split("\n") if ln.startswith(label + ":"))
        return {"file": file, "folder": folder, "what": what, "label": label, "value": value}

    def check(self, dev, p):
        if p["label"] == "Mechanic":  # "Name, phone": both parts must be there
            name, phone = (s.strip() for s in p["value"].split(",", 1))
            a = (dev.answer or "").lower()
            return name.lower() in a and "".join(phone.split()) in "".join(a.split())
        return answer_matches(dev.answer, p["value"])

    def subgoals(self, p):
        path = f"{p['folder']}/{p['file']}" if p["folder"] else p["file"]
        return [
            (f"open {p['file']}", lambda dev: path in markor(dev).opened),
            ("answer with the value", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Markor")
        if p["folder"]:
            yield from tap_seek(x, text=p["folder"], rid="title")
        yield from tap_seek(x, text=p["file"], rid="title")
        text = x.el(cls="EditText").text
        yield x.finish(first((ln.split(":", 1)[1].strip() for ln in text.split("\n")
                              if ln.startswith(p["label"] + ":")), p["label"]))
