"""AndroidWorld-like tasks in SMS Messenger, and multi-app tasks that end in a text message
(Markor → SMS, Contacts → SMS).

The expert helpers at the top (``seek``, ``row_text``, ``send_new``, ...) are shared with the other
comms task modules (notes, files, audio recorder)."""

from __future__ import annotations

from mobilerl.env.sim import content
from mobilerl.env.sim.apps.sms import Message, same_number, tracking_number
from mobilerl.env.sim.screen import Screen
from mobilerl.env.sim.tasks.base import ExpertError, Template, answer_matches

MESSAGES = [
    "Running 10 minutes late, start without me",
    "Can you call me when you get a chance?",
    "Don't forget the dentist appointment tomorrow at 9",
    "I'll bring the cake for Saturday",
    "The meeting moved to 3pm in room 204",
    "Thanks for dinner last night!",
    "Are you free for lunch on Friday?",
    "I left the spare key under the blue flower pot",
    "Please send me the invoice by Monday",
    "Just landed, see you at baggage claim",
    "Can you feed the cat on Thursday evening?",
    "The plumber is coming between 10 and 12",
    "Happy birthday! Hope you have a wonderful day",
    "Let's meet at the north entrance of the park",
    "I booked the table for 7:30 under my name",
    "Reminder: bring your passport for the trip",
]
QUESTIONS = [
    "Are you coming to the game tonight?",
    "Did you get the package I sent?",
    "Can we move our call to tomorrow morning?",
    "Do you still have my umbrella?",
    "What time should I pick you up?",
    "Is the apartment still available?",
    "Want to split an Uber to the airport?",
]
REPLIES = ["Yes, see you there!", "Sounds good to me", "Sorry, I can't make it today", "I'll be there at 6",
           "Tomorrow at 9 works for me", "Let me check and get back to you", "Sure, no problem"]


# ----------------------------------------------------------------------------------- expert helpers
def inside(a, b) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] <= b[3]


def row_text(s: Screen, row, rid: str = "title") -> str:
    """The text of the ``rid`` TextView inside the row element ``row`` ('' if clipped away)."""
    return next((e.text for e in s.els if e.rid == rid and inside(e.bounds, row.bounds)), "")


def rows(s: Screen, rid: str) -> list[tuple[str, str]]:
    """(title, subtitle) of the visible rows with resource id ``rid``, top to bottom."""
    return [(row_text(s, r), row_text(s, r, "subtitle")) for r in s.find_all(rid=rid)]


def first(items, what: str):
    """The first of ``items``; an :class:`ExpertError` (not StopIteration) when there is none."""
    for it in items:
        return it
    raise ExpertError(f"expected {what} on screen")


def last(items, what: str):
    return first(reversed(list(items)), what)


def _sig(s: Screen) -> tuple:
    return tuple((e.text, e.desc, e.bounds) for e in s.els if e.rid not in ("clock", "battery"))


def seek(x, **query):
    """Scroll (down the list first, then back up) until an element matching ``query`` is on screen."""
    for direction in ("up", "down"):
        for _ in range(x.MAX_SCROLLS):
            if x.s.find(**query) is not None:
                return
            if x.s.scrollable() is None:
                break
            before = _sig(x.s)
            yield x.swipe(direction, "medium")
            if _sig(x.s) == before:
                break
    if x.s.find(**query) is None:
        raise ExpertError(f"scrolled both ways without finding {query}")


def tap_seek(x, **query):
    yield from seek(x, **query)
    yield x.tap(**query)


def long_seek(x, **query):
    yield from seek(x, **query)
    yield x.long_press(**query)


def send_new(x, recipient: str, text: str):
    """From the conversation list: start a conversation with ``recipient`` and send ``text``."""
    yield x.tap(desc="Start a conversation")
    yield from x.fill("new_conversation_address", recipient)
    yield from x.fill("new_conversation_message", text)
    yield x.tap(rid="new_conversation_send")


def reply(x, text: str):
    """In an open thread: type ``text`` into the compose box and send it."""
    yield from x.fill("thread_type_message", text)
    yield x.tap(rid="thread_send_message")


def norm(s: str) -> str:
    return " ".join(s.split()).lower()


# -------------------------------------------------------------------------------------- state helpers
def sms(dev):
    return dev.app("SMS Messenger")


def contacts_with_phone(dev):
    return [c for c in dev.app("Contacts").contacts if c.phone]


def sent_to(dev, number: str) -> list[str]:
    return [t for n, t in sms(dev).sent if same_number(n, number)]


def only_sent(dev, number: str, text: str, contains: bool = False) -> bool:
    """Exactly one message was sent, to ``number``, with ``text`` (or containing it)."""
    sent = sms(dev).sent
    if len(sent) != 1 or not same_number(sent[0][0], number):
        return False
    return norm(text) in norm(sent[0][1]) if contains else norm(sent[0][1]) == norm(text)


def new_number(rng, dev) -> str:
    taken = [t.number for t in sms(dev).threads] + [c.phone for c in dev.app("Contacts").contacts]
    while True:
        n = content.phone(rng)
        if not any(same_number(n, t) for t in taken):
            return n


def contact_thread_pick(rng, dev):
    """A saved contact that has a conversation (the conversation list shows its name)."""
    app = sms(dev)
    pairs = [(c, app.thread_for(c.phone)) for c in contacts_with_phone(dev)]
    pairs = [(c, t) for c, t in pairs if t is not None and t.messages]
    return rng.choice(pairs)[0]


def minutes_ago(dev, m: int):
    from datetime import timedelta

    return dev.now - timedelta(minutes=m)


# ------------------------------------------------------------------------------------------ templates
class SmsSendMessage(Template):
    name = "SmsSendMessage"
    template = "Send a text message to {number} using SMS Messenger with the message: {message}"
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("SMS Messenger",)
    complexity = 1.4

    def sample(self, rng, dev):
        return {"number": new_number(rng, dev), "message": rng.choice(MESSAGES)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018 — seed the inbox before anything else changes

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["message"])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from send_new(x, p["number"], p["message"])
        yield x.finish()


class SmsSendToContact(Template):
    name = "SmsSendToContact"
    template = "Text my contact {name} in SMS Messenger: \"{message}\""
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("SMS Messenger",)
    complexity = 1.4

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        return {"name": c.name, "number": c.phone, "message": rng.choice(MESSAGES)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["message"])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from send_new(x, p["name"], p["message"])
        yield x.finish()


class SmsReplyToLatest(Template):
    name = "SmsReplyToLatest"
    template = "Reply to the most recent text message in SMS Messenger with: {message}"
    difficulty = "medium"
    tags = ("parameterized", "screen_reading")
    apps = ("SMS Messenger",)
    complexity = 1.2

    def sample(self, rng, dev):
        t = rng.choice(sms(dev).conversations())
        return {"number": t.number, "question": rng.choice(QUESTIONS), "ago": rng.randrange(1, 9),
                "message": rng.choice(REPLIES)}

    def setup(self, dev, p):
        sms(dev).receive(p["number"], p["question"], minutes_ago(dev, p["ago"]))

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["message"])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield x.tap(rid="conversation")  # the list is newest first
        yield from reply(x, p["message"])
        yield x.finish()


class SmsLatestSenderQuery(Template):
    name = "SmsLatestSenderQuery"
    template = "Who sent me the most recent text message in SMS Messenger? Answer with their name."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("SMS Messenger",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        return {"name": c.name, "number": c.phone, "question": rng.choice(QUESTIONS), "ago": rng.randrange(1, 25)}

    def setup(self, dev, p):
        sms(dev).receive(p["number"], p["question"], minutes_ago(dev, p["ago"]))

    def check(self, dev, p):
        return answer_matches(dev.answer, [p["name"], p["number"]])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        top = x.el(rid="conversation")
        yield x.finish(row_text(x.s, top))


def extract_tracking(text: str) -> str:
    for word in text.replace(",", " ").replace("(", " ").replace(")", " ").split():
        w = word.strip(".:;!")
        if len(w) >= 10 and any(ch.isdigit() for ch in w) and w.isalnum():
            return w
    return ""


class SmsTrackingNumberQuery(Template):
    name = "SmsTrackingNumberQuery"
    template = "What is the tracking number in the latest message from {name} in SMS Messenger?"
    difficulty = "medium"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("SMS Messenger",)
    complexity = 1.2
    task_type = "query"

    ITEMS = ("the camping stove", "your charger", "the board game", "mom's birthday card", "the book")

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        carrier, old = tracking_number(rng)
        carrier2, num = tracking_number(rng)
        t = sms(dev).thread_for(c.phone)
        gap = int((dev.now - t.last.time).total_seconds() // 60) if t is not None and t.last else 60 * 72
        return {"name": c.name, "number": c.phone, "old": old, "num": num, "carrier": carrier,
                "carrier2": carrier2, "item": rng.choice(self.ITEMS), "ago": rng.randrange(1, max(2, gap))}

    def setup(self, dev, p):
        app = sms(dev)
        app.receive(p["number"], f"Mailed {p['item']} today, tracking number {p['old']} ({p['carrier']})",
                    minutes_ago(dev, p["ago"] + 60 * 26))
        app.receive(p["number"], f"The first one got lost, sorry! The replacement ships with {p['carrier2']}, "
                                 f"tracking number {p['num']}", minutes_ago(dev, p["ago"]))

    def check(self, dev, p):
        a = "".join((dev.answer or "").split()).upper()
        return p["num"].upper() in a and p["old"].upper() not in a

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name"], rid="title")
        yield x.finish(extract_tracking(last((t for t, _ in rows(x.s, "message_received") if t), "a message")))


class SmsDeleteConversation(Template):
    name = "SmsDeleteConversation"
    template = "Delete my conversation with {who} in SMS Messenger."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("SMS Messenger",)
    complexity = 1.5

    def sample(self, rng, dev):
        app = sms(dev)
        convs = app.conversations()
        t = rng.choice(convs)
        return {"who": app.display(t), "number": t.number, "count": len(convs)}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    def check(self, dev, p):
        convs = sms(dev).conversations()
        return len(convs) == p["count"] - 1 and not any(same_number(t.number, p["number"]) for t in convs)

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["who"], rid="title")
        yield x.tap(desc="Delete")
        yield x.tap(rid="confirm_delete")
        yield x.finish()


class SmsResendLast(Template):
    name = "SmsResendLast"
    template = "Resend the message I just sent to {name} in SMS Messenger."
    difficulty = "medium"
    tags = ("parameterized", "screen_reading", "transcription")
    apps = ("SMS Messenger",)
    complexity = 1.3

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        return {"name": c.name, "number": c.phone, "message": rng.choice(MESSAGES), "ago": rng.randrange(1, 6)}

    def setup(self, dev, p):
        app = sms(dev)
        t = app.thread_for(p["number"], create=True)
        t.messages.append(Message(p["message"], minutes_ago(dev, p["ago"]), incoming=False))

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["message"])

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name"], rid="title")
        yield from reply(x, last((t for t, _ in rows(x.s, "message_sent") if t), "a sent message"))
        yield x.finish()


class SmsSendReceivedAddress(Template):
    name = "SmsSendReceivedAddress"
    template = "Text {name1} the address of the party that {name2} just sent me, using SMS Messenger."
    difficulty = "medium"
    tags = ("information_retrieval", "transcription", "parameterized")
    apps = ("SMS Messenger",)
    complexity = 1.8

    def sample(self, rng, dev):
        a, b = rng.sample(contacts_with_phone(dev), 2)
        return {"name1": a.name, "number1": a.phone, "name2": b.name, "number2": b.phone,
                "address": content.address(rng), "ago": rng.randrange(2, 20)}

    def setup(self, dev, p):
        sms(dev).receive(p["number2"], f"Party at my place on Saturday from 8! The address is {p['address']}",
                         minutes_ago(dev, p["ago"]))

    def check(self, dev, p):
        return only_sent(dev, p["number1"], p["address"], contains=True)

    def expert(self, p, x):
        yield from x.launch("SMS Messenger")
        yield from tap_seek(x, text=p["name2"], rid="title")
        msg = last((t for t, _ in rows(x.s, "message_received") if "address is" in t), "the party message")
        address = msg.split("address is", 1)[1].strip()
        yield x.back()
        yield from send_new(x, p["name1"], address)
        yield x.finish()


# ------------------------------------------------------------------------------------ multi-app tasks
SHORT_NOTES = [
    ("parking.md", "Gate code {code}, parking spot B{n} on level 3"),
    ("wifi_guest.txt", "Wifi: BlueHeron_5G, password tulip-river-{n}"),
    ("dinner_plan.md", "Dinner at Sakura Sushi on Friday at 7:30 pm, table for {n}"),
    ("pickup_info.md", "Pickup window Saturday 10-12 at {addr}"),
    ("meeting_point.md", "Meet at {addr} at 9:15, bring ID"),
    ("alarm_code.txt", "Alarm code {code}, press OFF twice"),
]


class SmsSendNoteToContact(Template):
    name = "SmsSendNoteToContact"
    template = "Send the text of my Markor note {file} to {name} by SMS, using SMS Messenger."
    difficulty = "hard"
    tags = ("multi_app", "transcription", "memorization", "parameterized")
    apps = ("Markor", "SMS Messenger")
    complexity = 2.0

    def sample(self, rng, dev):
        c = rng.choice(contacts_with_phone(dev))
        fname, fmt = rng.choice(SHORT_NOTES)
        text = fmt.format(code=rng.randrange(1000, 9999), n=rng.randrange(2, 40), addr=content.address(rng))
        return {"name": c.name, "number": c.phone, "file": fname, "text": text}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018
        dev.app("Markor").create_note(p["file"], "", p["text"])

    def check(self, dev, p):
        return only_sent(dev, p["number"], p["text"])

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from tap_seek(x, text=p["file"], rid="title")
        text = x.el(cls="EditText").text
        yield from x.launch("SMS Messenger")
        yield from send_new(x, p["name"], text)
        yield x.finish()


EVENTS = [
    ("party_guests.md", "Housewarming", "You're invited to our housewarming on Saturday at 7pm!"),
    ("bbq_invites.md", "BBQ", "BBQ at our place Sunday from 1pm, bring a side dish"),
    ("book_club.md", "Book club", "Book club moves to Thursday 8pm at the Blue Door Cafe"),
    ("game_night.md", "Game night", "Game night this Friday at 8, snacks on me"),
]


class SmsInviteFromNote(Template):
    name = "SmsInviteFromNote"
    template = ("My Markor note {file} has an invitation message and a guest list. Text the message to each "
                "guest, one by one, using SMS Messenger.")
    difficulty = "hard"
    tags = ("multi_app", "memorization", "repetition", "data_entry", "parameterized")
    apps = ("Markor", "SMS Messenger")
    complexity = 4.6

    def sample(self, rng, dev):
        guests = rng.sample(contacts_with_phone(dev), 4)
        fname, title, msg = rng.choice(EVENTS)
        return {"file": fname, "title": title, "message": msg, "guests": [g.name for g in guests],
                "numbers": [g.phone for g in guests]}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018
        body = f"# {p['title']}\nMessage: {p['message']}\nGuests:\n" + "\n".join(f"- {g}" for g in p["guests"])
        dev.app("Markor").create_note(p["file"], "", body)

    def check(self, dev, p):
        want = [norm(p["message"])]
        return len(sms(dev).sent) == len(p["numbers"]) and all(
            [norm(t) for t in sent_to(dev, n)] == want for n in p["numbers"])

    def expert(self, p, x):
        yield from x.launch("Markor")
        yield from tap_seek(x, text=p["file"], rid="title")
        lines = x.el(cls="EditText").text.split("\n")
        message = first((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Message:")), "Message:")
        guests = [ln[2:].strip() for ln in lines if ln.startswith("- ")]
        yield from x.launch("SMS Messenger")
        for i, g in enumerate(guests):
            yield from send_new(x, g, message)
            if i < len(guests) - 1:
                yield x.back()  # back to the conversation list
        yield x.finish()


class SmsContactEmailToContact(Template):
    name = "SmsContactEmailToContact"
    template = "Look up {name2}'s email address in Contacts and text it to {name1} using SMS Messenger."
    difficulty = "hard"
    tags = ("multi_app", "information_retrieval", "transcription", "parameterized")
    apps = ("Contacts", "SMS Messenger")
    complexity = 2.0

    def sample(self, rng, dev):
        a, b = rng.sample([c for c in contacts_with_phone(dev) if c.email], 2)
        return {"name1": a.name, "number1": a.phone, "name2": b.name, "email": b.email}

    def setup(self, dev, p):
        sms(dev).threads  # noqa: B018

    def check(self, dev, p):
        return only_sent(dev, p["number1"], p["email"], contains=True)

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield from x.tap_scrolled(text=p["name2"])
        email = row_text(x.s, x.el(rid="email", cls="LinearLayout"))
        yield from x.launch("SMS Messenger")
        yield from send_new(x, p["name1"], email)
        yield x.finish()

