"""Seeded, realistic app content: people, phone numbers, e-mails, addresses, and everyday data.

Values look like real personal data on purpose (valid phone-number ranges in several regions, real
e-mail shapes, street addresses), so the privacy masking downstream has real work to do. All of it is
generated from the seed; none of it belongs to anyone.

Canaries: every value generated here (and by the apps' own generators that call :func:`plant`) is also
recorded, with its category, into the recorders opened by :func:`recording` on the current thread. The
simulator uses that to tell a data collector, in memory, exactly which raw personal values a device holds
(``Device.canaries()``), so that a privacy audit can look for them in stored data.
"""

from __future__ import annotations

import contextvars
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# Categories of planted values (the privacy masker's category names; names and postal addresses are not
# found by its detectors, only as known values).
NAME, PHONE, EMAIL, ADDRESS = "PERSON_NAME", "PHONE", "EMAIL", "ADDRESS"
ORDER, TRACKING = "ORDER_NUMBER", "TRACKING_NUMBER"

_RECORDERS: contextvars.ContextVar[tuple[dict[str, str], ...]] = contextvars.ContextVar(
    "mobilerl_sim_planted", default=()
)


@contextmanager
def recording(into: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Record every value :func:`plant` ed inside the block as ``value -> category`` into ``into`` (a new
    dict if None), which is yielded. Recorders nest: a value goes to every open recorder."""
    rec: dict[str, str] = {} if into is None else into
    token = _RECORDERS.set((*_RECORDERS.get(), rec))
    try:
        yield rec
    finally:
        _RECORDERS.reset(token)


def plant(value: str, category: str) -> str:
    """Note ``value`` as planted personal data of ``category`` in the open recorders; returns ``value``."""
    for rec in _RECORDERS.get():
        rec.setdefault(value, category)
    return value

FIRST = [
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Elijah", "Sophia", "Mateo", "Isabella", "Lucas", "Mia", "Amir",
    "Chloe", "Hiroshi", "Priya", "Diego", "Fatima", "Wei", "Hannah", "Kwame", "Grace", "Tomás", "Leila",
    "Oscar", "Ingrid", "Rafael", "Aisha", "Jonas", "Nora", "Samuel", "Yuki", "Arjun", "Clara", "Malik",
    "Elena", "Felix", "Zara", "Mohammed", "Lucia", "Daniel", "Mei", "Gabriel", "Sara", "Ethan", "Alice",
    "Omar", "Julia", "Victor", "Rosa", "Henry", "Layla", "Adam", "Ines", "Theo", "Nadia", "Ivan", "Maya",
]
LAST = [
    "Smith", "Johnson", "Garcia", "Martinez", "Nguyen", "Kim", "Patel", "Müller", "Rossi", "Tanaka",
    "Okafor", "Silva", "Cohen", "Kowalski", "Andersson", "Dubois", "Ivanova", "Chen", "Wang", "Singh",
    "Haddad", "Fernandez", "O'Brien", "Novak", "Jensen", "Moreau", "Schmidt", "Yamamoto", "Mensah",
    "Lopez", "Brown", "Wilson", "Taylor", "Clarke", "Walker", "Hughes", "Bauer", "Costa", "Ali", "Sato",
]
# (region, format) — formats produce numbers inside real, valid numbering ranges.
PHONE_FORMATS = [
    ("US", "+1 {a} {e}-{n4}", ["415", "212", "617", "312", "206", "512", "303", "650"]),
    ("US", "({a}) {e}-{n4}", ["415", "646", "718", "213", "408", "919"]),
    ("GB", "+44 7{d3} {n6}", None),
    ("DE", "+49 151 {n4}{n4}", None),
    ("FR", "+33 6 {n2} {n2} {n2} {n2}", None),
    ("CN", "+86 138 {n4} {n4}", None),
    ("IN", "+91 98{d3} {n5}", None),
    ("JP", "+81 90-{n4}-{n4}", None),
]
EMAIL_DOMAINS = ["gmail.com", "outlook.com", "yahoo.com", "proton.me", "icloud.com", "fastmail.com",
                 "web.de", "qq.com", "hotmail.co.uk"]
STREETS = ["Maple Avenue", "Oak Street", "Baker Street", "Rue de Rivoli", "Hauptstraße", "Elm Road",
           "Sunset Boulevard", "King's Road", "Market Street", "Lake Shore Drive", "Via Roma", "Cedar Lane"]
CITIES = [("San Francisco", "CA 94110"), ("Boston", "MA 02118"), ("Chicago", "IL 60614"),
          ("London", "SW3 5UZ"), ("Paris", "75001"), ("Berlin", "10115"), ("Seattle", "WA 98101"),
          ("Austin", "TX 78701"), ("Toronto", "ON M5V 2T6"), ("Madrid", "28013")]
COMPANIES = ["Acme Corp", "Globex", "Initech", "Umbrella Health", "Stark Industries", "Wayne Foods",
             "Hooli", "Vandelay Imports", "Soylent", "Tyrell Labs"]
WORDS = ["meeting", "groceries", "project", "birthday", "travel", "budget", "workout", "garden", "recipe",
         "reading", "invoice", "doctor", "school", "holiday", "car", "rent", "music", "movie", "call", "plan"]


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    phone: str
    email: str
    address: str
    company: str

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


def phone(rng: random.Random) -> str:
    import re

    _, fmt, areas = PHONE_FORMATS[rng.randrange(len(PHONE_FORMATS))]
    digits = {"n2": (10, 100), "n4": (0, 10000), "n5": (10000, 100000), "n6": (100000, 1000000),
              "d3": (100, 1000), "e": (201, 999)}

    def fill(m: re.Match) -> str:
        key = m.group(1)
        if key == "a":
            return rng.choice(areas)
        lo, hi = digits[key]
        return str(rng.randrange(lo, hi)).zfill(len(str(hi - 1)))

    return plant(re.sub(r"\{(\w+)\}", fill, fmt), PHONE)


def email(rng: random.Random, first: str, last: str) -> str:
    f = _ascii(first).lower()
    l = _ascii(last).lower().replace("'", "")  # noqa: E741
    user = rng.choice([f"{f}.{l}", f"{f}{l[:1]}", f"{f[:1]}{l}{rng.randrange(10, 99)}", f"{f}_{l}"])
    return plant(f"{user}@{rng.choice(EMAIL_DOMAINS)}", EMAIL)


def address(rng: random.Random) -> str:
    city, code = rng.choice(CITIES)
    return plant(f"{rng.randrange(1, 2400)} {rng.choice(STREETS)}, {city} {code}", ADDRESS)


def _ascii(s: str) -> str:
    table = str.maketrans("üéáóíñøåöä", "ueaoinoaoa")
    return s.translate(table)


def people(rng: random.Random, n: int) -> list[Person]:
    seen: set[str] = set()
    out: list[Person] = []
    while len(out) < n:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        if f"{first} {last}" in seen:
            continue
        seen.add(plant(f"{first} {last}", NAME))
        out.append(Person(first, last, phone(rng), email(rng, first, last), address(rng), rng.choice(COMPANIES)))
    return out


def person(rng: random.Random, avoid: set[str] = frozenset()) -> Person:  # type: ignore[assignment]
    while True:
        p = people(rng, 1)[0]
        if p.name not in avoid:
            return p


def phrase(rng: random.Random, k: int = 3) -> str:
    return " ".join(rng.sample(WORDS, k))
