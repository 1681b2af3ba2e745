"""AndroidLab-like tasks in Contacts (operation and query types, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim import content
from mobilerl.env.sim.apps.contacts import digits
from mobilerl.env.sim.tasks.base import Template, answer_matches


def _contacts(dev):
    return dev.app("Contacts")


class LabContactsNewWithEmail(Template):
    suite = "lab"
    name = "contacts_new_with_email"
    template = "Add a contact named {name} with phone number {phone} and email {email}."
    difficulty = "medium"
    apps = ("Contacts",)
    complexity = 1.5

    def sample(self, rng, dev):
        p = content.person(rng, {c.name for c in _contacts(dev).contacts})
        return {"first": p.first, "last": p.last, "name": p.name, "phone": p.phone, "email": p.email}

    def check(self, dev, p):
        c = _contacts(dev).find(p["name"])
        return c is not None and digits(c.phone) == digits(p["phone"]) and c.email == p["email"]

    def subgoals(self, p):
        def found(dev):
            return _contacts(dev).find(p["name"])

        return [
            ("contact created", lambda dev: found(dev) is not None),
            ("phone saved", lambda dev: found(dev) is not None and digits(found(dev).phone) == digits(p["phone"])),
            ("email saved", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield x.tap(desc="Create contact")
        yield from x.fill("first_name", p["first"])
        yield from x.fill("last_name", p["last"])
        yield from x.fill("phone", p["phone"])
        yield from x.fill("email", p["email"])
        yield x.tap(desc="Save")
        yield x.finish()


class LabContactsPhoneQuery(Template):
    suite = "lab"
    name = "contacts_phone_query"
    template = "What is {name}'s phone number?"
    difficulty = "easy"
    apps = ("Contacts",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        c = rng.choice(_contacts(dev).contacts)
        return {"name": c.name, "phone": c.phone}

    def check(self, dev, p):
        return dev.answer is not None and digits(dev.answer) == digits(p["phone"])

    def subgoals(self, p):
        def on_details(dev):
            app = dev.apps["Contacts"]
            return dev.foreground == "Contacts" and app.page.name == "details" or self.check(dev, p)

        return [("contact opened", on_details), ("number reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name"])
        row = x.el(rid="phone_number")
        number = next(e.text for e in x.s.find_all(rid="title") if _within(e.bounds, row.bounds))
        yield x.finish(number)


class LabContactsCompanyQuery(Template):
    suite = "lab"
    name = "contacts_company_query"
    template = "Which company does {name} work for, according to my contacts?"
    difficulty = "easy"
    apps = ("Contacts",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        c = rng.choice(_contacts(dev).contacts)
        return {"name": c.name, "company": c.company}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["company"])

    def subgoals(self, p):
        return [("company reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name"])
        row = x.el(rid="company")
        yield x.finish(next(e.text for e in x.s.find_all(rid="title") if _within(e.bounds, row.bounds)))


def _within(a, b):
    return a[0] >= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] <= b[3]
