"""AndroidWorld-like tasks in Contacts."""

from __future__ import annotations

from mobilerl.env.sim import content
from mobilerl.env.sim.apps.contacts import Contact, digits
from mobilerl.env.sim.tasks.base import Template, answer_matches


def _contacts(dev):
    return dev.app("Contacts")


def _pick(rng, dev) -> Contact:
    return rng.choice(_contacts(dev).contacts)


class ContactsAddContact(Template):
    name = "ContactsAddContact"
    template = "Create a new contact for {name}. Their number is {phone}."
    difficulty = "easy"
    tags = ("data_entry",)
    apps = ("Contacts",)
    complexity = 1.2

    def sample(self, rng, dev):
        p = content.person(rng, {c.name for c in _contacts(dev).contacts})
        return {"first": p.first, "last": p.last, "name": p.name, "phone": p.phone}

    def check(self, dev, p):
        c = _contacts(dev).find(p["name"])
        return c is not None and digits(c.phone) == digits(p["phone"])

    def subgoals(self, p):
        return [("contact exists", lambda dev: _contacts(dev).find(p["name"]) is not None),
                ("number saved", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield x.tap(desc="Create contact")
        yield from x.fill("first_name", p["first"])
        yield from x.fill("last_name", p["last"])
        yield from x.fill("phone", p["phone"])
        yield x.tap(desc="Save")
        yield x.finish()


class ContactsDeleteContact(Template):
    name = "ContactsDeleteContact"
    template = "Delete the contact {name} from my contacts."
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Contacts",)
    complexity = 1.5

    def sample(self, rng, dev):
        return {"name": _pick(rng, dev).name}

    def check(self, dev, p):
        return _contacts(dev).find(p["name"]) is None and len(_contacts(dev).contacts) >= 13

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name"])
        yield x.tap(desc="Delete")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()


class ContactsEditNumber(Template):
    name = "ContactsEditNumber"
    template = "Update the phone number of {name} to {phone}."
    difficulty = "medium"
    tags = ("data_edit",)
    apps = ("Contacts",)
    complexity = 1.5

    def sample(self, rng, dev):
        return {"name": _pick(rng, dev).name, "phone": content.phone(rng)}

    def check(self, dev, p):
        c = _contacts(dev).find(p["name"])
        return c is not None and digits(c.phone) == digits(p["phone"])

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name"])
        yield x.tap(desc="Edit")
        yield from x.fill("phone", p["phone"])
        yield x.tap(desc="Save")
        yield x.finish()


class ContactsEmailLookup(Template):
    name = "ContactsEmailLookup"
    template = "What is the email address of {name} in my contacts? Reply with the address only."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Contacts",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        c = _pick(rng, dev)
        return {"name": c.name, "email": c.email}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["email"])

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield x.tap(desc="Search")
        yield from x.fill("search_field", p["name"].split()[0])
        yield from x.hide_keyboard()
        yield x.tap(text=p["name"])
        row = x.el(rid="email", cls="LinearLayout")
        yield x.finish(next(e.text for e in x.s.find_all(rid="title") if row.bounds[1] <= e.bounds[1] < row.bounds[3]))


class ContactsFavorite(Template):
    name = "ContactsFavorite"
    template = "Mark {name} as a favorite contact."
    difficulty = "easy"
    tags = ("data_edit",)
    apps = ("Contacts",)
    complexity = 1.0

    def sample(self, rng, dev):
        return {"name": _pick(rng, dev).name}

    def check(self, dev, p):
        c = _contacts(dev).find(p["name"])
        return c is not None and c.favorite and sum(k.favorite for k in _contacts(dev).contacts) == 1

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name"])
        yield x.tap(desc="Favorite")
        yield x.finish()
