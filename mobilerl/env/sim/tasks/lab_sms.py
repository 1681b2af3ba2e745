"""AndroidLab-style tasks in SMS Messenger (operation and query types, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim.apps.sms import digits, same_number
from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_sms import (
    MESSAGES,
    contact_thread_pick,
    contacts_with_phone,
    norm,
    only_sent,
    rows,
    send_new,
    sent_to,
    sms,
    tap_seek,
)


def _opened(dev, number: str) -> bool:
    return any(same_number(d, number) for d in sms(dev).opened) if digits(number) else False


class LabSmsSendContact(Template):
    suite = "lab"
    name = "sms_send_contact"
    template = "Send a message to {name} whose content is \"{message}\"."
    difficulty = "easy"
    apps = ("SMS Messenger",)
    complexity = 1.4

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        return {"name": c.name, "number": c.phone, "message": rng.choice(MESSAGES)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["message"])

    def subgoals(self, p):
        return [
            (f"open the conversation with {p['name']}", lambda dev: _opened(dev, p["number"])),
            (f"send a message to {p['name']}", lambda dev: bool(sent_to(dev, p["number"]))),
            ("the message content is correct", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from send_new(x, p["name"], p["message"])
        yield x.finish()


class LabSmsDraft(Template):
    suite = "lab"
    name = "sms_draft_message"
    template = "Edit a message to {name} whose content is \"{message}\", but do not send it."
    difficulty = "medium"
    apps = ("SMS Messenger",)
    complexity = 1.2

    def sample(self, rng, dev):
        c = contact_thread_pick(rng, dev)
        return {"name": c.name, "number": c.phone, "message": rng.choice(MESSAGES)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    @staticmethod
    def _draft(dev, p) -> str | None:
        """The text in the compose box of a conversation with the contact, if one is open."""
        app = sms(dev)
        st = app.page
        if st.name == "thread" and same_number(st.args["thread"].number, p["number"]):
            return st.fields.get("message", "")
        if st.name == "new":
            n = app.resolve(st.fields.get("recipient", ""))
            if n and same_number(n, p["number"]):
                return st.fields.get("message", "")
        return None

    def check(self, dev, p):
        d = self._draft(dev, p)
        return not sms(dev).sent and d is not None and norm(d) == norm(p["message"])

    def subgoals(self, p):
        return [
            (f"open the conversation with {p['name']}", lambda dev: _opened(dev, p["number"])
             or self._draft(dev, p) is not None),
            ("type the message", lambda dev: norm(self._draft(dev, p) or "") == norm(p["message"])),
            ("do not send it", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name"], rid="title")
        yield from x.fill("thread_type_message", p["message"])
        yield x.finish()


class LabSmsCountQuery(Template):
    suite = "lab"
    name = "sms_count_received"
    template = "How many text messages has {name} sent me?"
    difficulty = "easy"
    apps = ("SMS Messenger",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        c = contact_thread_pick(rng, dev)
        t = sms(dev).thread_for(c.phone)
        return {"name": c.name, "number": c.phone, "count": sum(m.incoming for m in t.messages)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    def check(self, dev, p):
        words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
        return answer_matches(dev.answer, [str(p["count"]), words.get(p["count"], "")], numeric=True)

    def subgoals(self, p):
        return [
            (f"open the conversation with {p['name']}", lambda dev: _opened(dev, p["number"])),
            ("answer with the number of received messages", lambda dev: self.check(dev, p)),
        ]

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name"], rid="title")
        yield x.finish(str(len(rows(x.s, "message_received"))))
