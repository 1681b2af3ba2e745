"""SMS Messenger (modelled on Simple SMS Messenger): conversation list, threads with a compose box, new
conversation, search, forward, delete with confirmation.

Threads belong to phone numbers; a thread whose number is saved in Contacts shows the contact's name, read
live from the Contacts app (so a contact added or renamed during an episode shows up at once). The seeded
conversations are drawn lazily, on first access, from the app's own seed and the Contacts list: some are
with saved contacts, some with raw numbers, some with service short codes, and their messages carry the
kind of personal data real inboxes hold (order and tracking numbers, addresses, e-mails, codes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState, SelectionMixin
from mobilerl.env.sim.ui import Button, Dialog, Field, IconButton, Page, Row, Text

BOTTOM = 10**7  # a scroll offset past the end: the page clamps it to the last screenful


def digits(s: str) -> str:
    return "".join(filter(str.isdigit, s))


def same_digits(da: str, db: str) -> bool:
    if not da or not db:
        return False
    if da == db:
        return True
    n = min(len(da), len(db))
    return n >= 7 and da[-n:] == db[-n:]


def same_number(a: str, b: str) -> bool:
    """Loose phone-number equality (as Android's PhoneNumberUtils.compare): digits, or the last 7+ digits."""
    return same_digits(digits(a), digits(b))


@dataclass(eq=False)
class Message:
    text: str
    time: datetime
    incoming: bool = True


@dataclass(eq=False)
class Thread:
    number: str
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = digits(self.number)

    @property
    def last(self) -> Message | None:
        return self.messages[-1] if self.messages else None


# ------------------------------------------------------------------------------------ seeded content
CARRIERS = ("UPS", "USPS", "FedEx", "DHL")
SHOPS = ("Amazon", "Target", "Best Buy", "IKEA", "Zalando", "Etsy", "Walmart")
RESTAURANTS = ("Luigi's Trattoria", "The Green Fork", "Sakura Sushi", "Blue Door Cafe", "El Camino Tacos",
               "The Brass Lantern", "Nonna's Kitchen")
MERCHANTS = ("WHOLEFDS MKT", "SHELL OIL 5741", "UBER TRIP", "NETFLIX.COM", "STARBUCKS #2231", "CVS PHARMACY")
ERRANDS = ("oat milk and eggs", "a loaf of sourdough", "batteries for the smoke alarm", "dog food",
           "some ibuprofen", "coffee filters", "two lemons and basil")


def order_number(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        num = f"{rng.randrange(100, 1000)}-{rng.randrange(10**6, 10**7)}-{rng.randrange(10**6, 10**7)}"
    elif kind == 1:
        num = f"W{rng.randrange(10**8, 10**9)}"
    else:
        num = f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}-{rng.randrange(10**5, 10**6)}"
    return content.plant(num, content.ORDER)


def tracking_number(rng: random.Random, carrier: str | None = None) -> tuple[str, str]:
    carrier = carrier or rng.choice(CARRIERS)
    alnum = "0123456789ABCDEFGHJKLMNPRSTVWXY"
    if carrier == "UPS":
        num = "1Z" + "".join(rng.choice(alnum) for _ in range(16))
    elif carrier == "USPS":
        num = "9400" + "".join(str(rng.randrange(10)) for _ in range(18))
    elif carrier == "FedEx":
        num = "".join(str(rng.randrange(10)) for _ in range(12))
    else:
        num = "".join(str(rng.randrange(10)) for _ in range(10))
    return carrier, content.plant(num, content.TRACKING)


def short_code(rng: random.Random) -> str:
    return str(rng.randrange(20000, 99999))


def _personal(rng: random.Random, first: str, kind: int) -> list[tuple[bool, str]]:
    """A short exchange with a friend or relative (True = incoming)."""
    if kind == 0:
        return [(True, "Are we still on for dinner tonight?"), (False, "Yes! Where should we meet?"),
                (True, f"{rng.choice(RESTAURANTS)}, {content.address(rng)}. 7:30?"), (False, "Perfect, see you there")]
    if kind == 1:
        p = content.person(rng)
        return [(True, "Can you send me the slides from Tuesday?"), (False, "Sure, which email should I use?"),
                (True, f"Use my work one: {content.email(rng, first, p.last)}")]
    if kind == 2:
        carrier, num = tracking_number(rng)
        return [(True, "I mailed your birthday present this morning!"), (False, "Aww you didn't have to"),
                (True, f"Tracking number is {num} ({carrier}), should arrive Thursday")]
    if kind == 3:
        amt = rng.randrange(20, 180)
        return [(False, "How much do I owe you for the concert tickets?"), (True, f"${amt} each, no rush"),
                (False, f"Just sent ${amt} on Venmo"), (True, "Got it, thanks!")]
    if kind == 4:
        return [(True, f"Can you pick up {rng.choice(ERRANDS)} on the way home?"), (False, "Sure, anything else?"),
                (True, "That's it, thanks")]
    if kind == 5:
        code = rng.randrange(1000, 9999)
        return [(False, "I'm outside your building"), (True, f"Door code is {code}#, I'm on the 3rd floor")]
    if kind == 6:
        flight = f"{rng.choice(['UA', 'LH', 'BA', 'AF', 'DL', 'AC'])} {rng.randrange(100, 2000)}"
        return [(True, f"My flight {flight} lands at {rng.randrange(1, 12)}:{rng.choice(['05', '20', '45'])} pm"),
                (True, "Could you pick me up at arrivals?"), (False, "Of course, text me when you land")]
    if kind == 7:
        return [(True, "Running about 15 minutes late, sorry!"), (False, "No worries, I'll grab a table")]
    if kind == 8:
        return [(True, f"We finally moved! New address is {content.address(rng)}"),
                (False, "Congrats!! Housewarming soon?")]
    return [(False, "Happy birthday! Hope you have a great day"), (True, "Thank you so much!")]


def _service(rng: random.Random) -> list[tuple[bool, str]]:
    """Automated messages from a short code."""
    kind = rng.randrange(5)
    if kind == 0:
        shop = rng.choice(SHOPS)
        carrier, num = tracking_number(rng)
        return [(True, f"{shop}: Your order #{order_number(rng)} has shipped. Track it with {carrier} "
                       f"tracking number {num}.")]
    if kind == 1:
        return [(True, f"Your verification code is {rng.randrange(100000, 999999)}. It expires in 10 minutes. "
                       "Do not share it with anyone.")]
    if kind == 2:
        return [(True, f"Chase alert: A charge of ${rng.randrange(5, 400)}.{rng.randrange(10, 99)} at "
                       f"{rng.choice(MERCHANTS)} was made on your card ending in {rng.randrange(1000, 9999)}.")]
    if kind == 3:
        return [(True, f"Reminder: your appointment at Bayview Dental, {content.address(rng)}, is on Oct "
                       f"{rng.randrange(16, 30)} at {rng.randrange(8, 12)}:30 AM. Reply C to confirm."),
                (False, "C"), (True, "Thank you, your appointment is confirmed.")]
    carrier, num = tracking_number(rng)
    return [(True, f"{carrier}: Package {num} is out for delivery today between 2 PM and 6 PM.")]


def _stranger(rng: random.Random) -> list[tuple[bool, str]]:
    """Someone not in Contacts: a seller, a landlord, a colleague."""
    p = content.person(rng)
    kind = rng.randrange(4)
    if kind == 0:
        return [(True, f"Hi, this is {p.first} about the bike you listed. Is it still available?"),
                (False, "Yes it is"), (True, f"Great, can I pick it up Saturday? My address is {p.address}")]
    if kind == 1:
        return [(True, f"Hello, {p.first} from {p.company} here. Please send the signed contract to {p.email}"),
                (False, "Will do today")]
    if kind == 2:
        return [(True, f"Hi it's {p.first}, your landlord. The plumber comes Wednesday 10-12, is that ok?"),
                (False, "Yes that works")]
    return [(True, f"Hey, it's {p.first} {p.last} from the running club, saving my number. "
                   f"Email is {p.email} for the schedule")]


class SmsMessenger(SelectionMixin, App):
    name = "SMS Messenger"
    package = "com.simplemobiletools.smsmessenger"
    color = (0, 137, 123)
    aliases = ("sms", "messages", "simple sms messenger")

    def setup(self) -> None:
        self._seed = self.rng.randrange(2**31)
        self._t0 = self.device.now
        self._threads: list[Thread] | None = None
        self.sent: list[tuple[str, str]] = []  # (number, text) of every message sent this episode
        self.opened: set[str] = set()  # digits of the threads the user opened
        self.selected: set[Thread] = set()

    # ------------------------------------------------------------------------------------- content
    @property
    def threads(self) -> list[Thread]:
        if self._threads is None:
            with content.recording(self.planted):  # drawn lazily: record the canaries when they appear
                self._threads = self._seed_threads()
        return self._threads

    def canaries(self, materialize: bool = False) -> dict[str, str]:
        if materialize:
            _ = self.threads
        return super().canaries(materialize)

    def _contact_list(self) -> list:
        c = self.device.apps.get("Contacts")
        return list(getattr(c, "contacts", []))

    def _seed_threads(self) -> list[Thread]:
        rng = random.Random(self._seed)
        threads: list[Thread] = []
        contacts = [c for c in self._contact_list() if c.phone]
        pick = rng.sample(contacts, min(len(contacts), rng.randrange(7, 10)))
        kinds = list(range(10))
        rng.shuffle(kinds)
        convos: list[tuple[str, list[tuple[bool, str]]]] = [
            (c.phone, _personal(rng, c.first, kinds[i % len(kinds)])) for i, c in enumerate(pick)]
        for _ in range(rng.randrange(3, 5)):
            convos.append((content.phone(rng), _stranger(rng)))
        for _ in range(rng.randrange(2, 4)):
            convos.append((short_code(rng), _service(rng)))
        rng.shuffle(convos)
        minutes = 7
        for number, msgs in convos:
            minutes += rng.randrange(20, 60 * 30)
            end = self._t0 - timedelta(minutes=minutes)
            times = [end]
            for _ in msgs[1:]:
                times.append(times[-1] - timedelta(minutes=rng.randrange(1, 90)))
            times.reverse()
            threads.append(Thread(number, [Message(t, when, inc) for (inc, t), when in zip(msgs, times, strict=True)]))
        return threads

    # ----------------------------------------------------------------------------- queries / API
    def _names(self) -> dict[str, str]:
        """Contacts by the digits of their number (first one wins), built once per page."""
        idx: dict[str, str] = {}
        for c in self._contact_list():
            if c.phone:
                idx.setdefault(digits(c.phone), c.name)
        return idx

    @staticmethod
    def _lookup(d: str, idx: dict[str, str]) -> str | None:
        name = idx.get(d)
        if name is not None or len(d) < 7:
            return name
        return next((n for cd, n in idx.items() if same_digits(cd, d)), None)

    def contact_name(self, number: str) -> str | None:
        return self._lookup(digits(number), self._names())

    def display(self, t: Thread, names: dict[str, str] | None = None) -> str:
        return self._lookup(t.key, self._names() if names is None else names) or t.number

    def thread_for(self, number: str, create: bool = False) -> Thread | None:
        d = digits(number)
        for t in self.threads:
            if same_digits(t.key, d):
                return t
        if not create:
            return None
        t = Thread(number)
        self.threads.append(t)
        return t

    def conversations(self) -> list[Thread]:
        """Threads with messages, newest first (the order of the conversation list)."""
        ts = [t for t in self.threads if t.messages]
        ts.sort(key=lambda t: t.messages[-1].time, reverse=True)
        return ts

    def receive(self, number: str, text: str, when: datetime | None = None) -> Thread:
        t = self.thread_for(number, create=True)
        assert t is not None
        t.messages.append(Message(text, when or self.device.now, True))
        t.messages.sort(key=lambda m: m.time)
        return t

    def send(self, number: str, text: str) -> Thread:
        t = self.thread_for(number, create=True)
        assert t is not None
        t.messages.append(Message(text, self.device.now, False))
        self.sent.append((t.number, text))
        self.device.log.append(f"sms_sent:{t.number}:{text}")
        return t

    def open_thread(self, phone: str) -> None:
        """Show the thread with ``phone`` (creating an empty one): Contacts' "Send message" lands here."""
        t = self.thread_for(phone, create=True)
        assert t is not None
        self.selected.clear()
        self.push("thread", thread=t)
        self.page.scroll = BOTTOM

    def resolve(self, recipient: str) -> str | None:
        r = recipient.strip()
        if not r:
            return None
        for c in self._contact_list():
            if c.name.lower() == r.lower() and c.phone:
                return c.phone
        if len(digits(r)) >= 3 and all(ch in "0123456789+-() ." for ch in r):
            return r
        return None

    # -------------------------------------------------------------------------------- navigation
    @staticmethod
    def _when(t: datetime, now: datetime) -> str:
        return t.strftime("%H:%M") if t.date() == now.date() else t.strftime("%b %-d")

    # ------------------------------------------------------------------------------------- pages
    def page_main(self, st: PageState) -> Page:
        names = self._names()
        now = self.device.now
        rows: list = []
        sel = self.selected
        for t in self.conversations():
            last = t.messages[-1]
            who = self.display(t, names)
            rows.append(Row(who, last.text, on_tap=(lambda t=t: self._toggle(t)) if sel else (lambda t=t: self._open(t)),
                            on_long=lambda t=t: self._toggle(t), rid="conversation",
                            trailing=Text(self._when(last.time, now), rid="conversation_date"), icon=who,
                            selected=t in sel))
        if not rows:
            rows = [Text("No conversations yet. Tap the button below to start one.", rid="empty")]
        if sel:
            return Page(f"{len(sel)} selected", body=rows, scroll_rid="conversations_list", actions=[
                IconButton("Delete", self._confirm_delete_selected, rid="cab_delete")])
        return Page("Messages", body=rows, scroll_rid="conversations_list",
                    actions=[IconButton("Search", lambda: self.push("search"), rid="search")],
                    fab=IconButton("Start a conversation", lambda: self.push("new"), rid="conversations_fab"))

    def _open(self, t: Thread) -> None:
        self.push("thread", thread=t)
        self.page.scroll = BOTTOM

    def _toggle(self, t: Thread) -> None:
        if t in self.selected:
            self.selected.discard(t)
        else:
            self.selected.add(t)

    def _confirm_delete_selected(self) -> None:
        n = len(self.selected)

        def delete() -> None:
            for t in list(self.selected):
                if t in self.threads:
                    self.threads.remove(t)
            self.selected.clear()
            self.close_dialog()
            self.device.toast = "Conversations deleted" if n > 1 else "Conversation deleted"

        self.dialog(lambda: Dialog(
            "Delete conversations?" if n > 1 else "Delete conversation?",
            f"Are you sure you want to delete {n} conversation{'s' if n > 1 else ''}?",
            buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                     Button("Delete", delete, rid="confirm_delete")]))

    def page_thread(self, st: PageState) -> Page:
        t: Thread = st.args["thread"]
        self.opened.add(digits(t.number))
        if st.args.get("_focus", "<init>") != st.focus:  # the keyboard came or went: keep the newest in view
            st.args["_focus"] = st.focus
            st.scroll = BOTTOM
        who = self.display(t)
        body: list = []
        if who != t.number:
            body.append(Text(t.number, rid="thread_number", size="small"))
        for m in t.messages:
            stamp = m.time.strftime("%b %-d, %H:%M")
            body.append(Row(m.text, stamp if m.incoming else f"Sent · {stamp}",
                            rid="message_received" if m.incoming else "message_sent",
                            on_long=lambda m=m: self._message_menu(t, m)))
        if not t.messages:
            body.append(Text("No messages yet", rid="empty", size="small"))

        def send() -> None:
            text = st.fields.get("message", "").strip()
            if not text:
                self.device.toast = "Type a message first"
                return
            self.send(t.number, text)
            st.fields["message"] = ""
            st.scroll = BOTTOM

        def delete() -> None:
            if t in self.threads:
                self.threads.remove(t)
            self.close_dialog()
            self.pop()
            self.device.toast = "Conversation deleted"

        def call() -> None:
            self.device.log.append(f"call:{t.number}")
            self.device.toast = f"Calling {who}…"

        body.append(Field("message", "Type a message…", rid="thread_type_message"))
        body.append(Button("Send", send, rid="thread_send_message"))
        return Page(who, body=body, nav_back=True, scroll_rid="thread_messages_list", actions=[
            IconButton("Call", call, rid="call"),
            IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete conversation?", f"All messages with {who} will be deleted.",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete"),
        ])

    def _message_menu(self, t: Thread, m: Message) -> None:
        def forward() -> None:
            self.close_dialog()
            self.push("new", text=m.text)

        def delete() -> None:
            if m in t.messages:
                t.messages.remove(m)
            self.close_dialog()

        self.dialog(lambda: Dialog("Message options", body=[
            Row("Forward", on_tap=forward, rid="forward"),
            Row("Delete", on_tap=delete, rid="delete_message"),
        ], buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False)]))

    def page_new(self, st: PageState) -> Page:
        if "_init" not in st.args:
            st.args["_init"] = True
            if st.args.get("text"):
                st.fields["message"] = st.args["text"]
        q = st.fields.get("recipient", "").strip().lower()
        qd = digits(q)
        people = sorted(self._contact_list(), key=lambda c: c.name.lower())
        hits = [c for c in people if c.phone and (not q or q in c.name.lower() or (qd and qd in digits(c.phone)))]

        def send() -> None:
            number = self.resolve(st.fields.get("recipient", ""))
            text = st.fields.get("message", "").strip()
            if number is None:
                self.device.toast = "Enter a valid contact or number"
                return
            if not text:
                self.device.toast = "Type a message first"
                return
            t = self.send(number, text)
            self.replace("thread", thread=t)
            self.page.scroll = BOTTOM

        body: list = [
            Field("recipient", "Add Contact or Number…", rid="new_conversation_address"),
            Field("message", "Type a message…", rid="new_conversation_message"),
            Button("Send", send, rid="new_conversation_send"),
            Text("Contacts" if hits else "No matching contacts", rid="contacts_header", size="header"),
        ]
        body += [Row(c.name, c.phone, rid="suggested_contact", icon=c.name,
                     on_tap=lambda c=c: st.fields.__setitem__("recipient", c.name)) for c in hits]
        return Page("New conversation", body=body, nav_back=True, scroll_rid="new_conversation_list")

    def page_search(self, st: PageState) -> Page:
        q = st.fields.get("query", "").strip().lower()
        body: list = [Field("query", "Search messages", rid="search_query")]
        if q:
            names = self._names()
            hits = []
            for t in self.conversations():
                who = self.display(t, names)
                for m in reversed(t.messages):
                    if q in m.text.lower() or q in who.lower():
                        hits.append(Row(who, m.text, rid="search_result", on_tap=lambda t=t: self._open(t)))
                        if len(hits) >= 40:
                            break
            body += hits or [Text("No results", rid="empty", size="small")]
        return Page("Search", body=body, nav_back=True, scroll_rid="search_results_list")
