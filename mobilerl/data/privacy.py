"""Privacy masking before storage (MobileRL Appendix D.2): one :class:`TextMasker` per episode.

Detection lives in :mod:`mobilerl.data.privacy_rules` (re-exported here: :func:`detect`, :class:`Span`,
:func:`token`, the categories); this module replaces what it finds and is the one callers import. Images:
:mod:`mobilerl.data.privacy_image`; :func:`sensitive_boxes` gives the screen boxes of flagged XML nodes.

``mode="token"`` writes ``[PHONE]``; ``mode="surrogate"`` a realistic fake of the same shape, the same
fake for the same value everywhere in the episode (from ranges reserved for fiction where they exist,
never a known raw value), drawn from a seeded RNG in order of first appearance. :meth:`TextMasker.unmask`
inverts surrogates in memory only; the mapping is never stored.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mobilerl.data.checksums import card_ok, cn_id_check, cn_id_ok, only_digits
from mobilerl.data.privacy_phone import e164
from mobilerl.data.privacy_rules import (
    ADDRESS,
    BANK_ACCOUNT,
    CATEGORIES,
    EMAIL,
    KNOWN_CATEGORIES,
    NATIONAL_ID,
    ORDER_NUMBER,
    PASSPORT,
    PERSON_NAME,
    PHONE,
    SOCIAL_ACCOUNT,
    TRACKING_NUMBER,
    VEHICLE_PLATE,
    Span,
    detect,
    detect_known,
    merge_spans,
    token,
)

__all__ = [
    "ADDRESS", "BANK_ACCOUNT", "CATEGORIES", "EMAIL", "KNOWN_CATEGORIES", "MODES", "NATIONAL_ID", "ORDER_NUMBER",
    "PASSPORT", "PERSON_NAME", "PHONE", "SOCIAL_ACCOUNT", "TRACKING_NUMBER", "VEHICLE_PLATE", "MaskResult",
    "Span", "Surrogates", "TextMasker", "detect", "detect_known", "mask_text", "sensitive_boxes", "token",
]

MODES = ("token", "surrogate")


@dataclass
class MaskResult:
    """``text``: the masked text; ``spans``: what was replaced, in the input text's coordinates."""

    text: str
    spans: list[Span] = field(default_factory=list)

    @property
    def categories(self) -> Counter:
        return Counter(s.category for s in self.spans)


# ================================================================================== surrogates

_FAKE_FIRST = ("Ada", "Bram", "Cora", "Dario", "Edda", "Flynn", "Gita", "Hugo", "Ilse", "Joel", "Kira", "Lars",
               "Mabel", "Nico", "Opal", "Pavel", "Quinn", "Rhea", "Soren", "Tamsin", "Ugo", "Vera", "Wren",
               "Xavi", "Yara", "Zeno", "Bette", "Cyrus", "Dalia", "Elio", "Freya", "Gustav", "Hedda", "Ivo",
               "Juno", "Kofi", "Lorna", "Milo", "Nell", "Orla")
_FAKE_LAST = ("Abernathy", "Birchwood", "Calloway", "Dunmore", "Everly", "Fairbanks", "Greaves", "Hollis",
              "Iverson", "Jarrow", "Kettering", "Lindqvist", "Marlowe", "Northcott", "Oakhurst", "Pemberton",
              "Quimby", "Rutherford", "Stanhope", "Thornbury", "Underhill", "Vantongeren", "Whitlock",
              "Yardley", "Zabriskie", "Ashdown", "Blackwood", "Crane", "Dunleavy", "Ellery")
_FAKE_STREETS = ("Juniper Court", "Willow Crescent", "Harbor View Road", "Quarry Lane", "Foxglove Way",
                 "Chestnut Row", "Lantern Street", "Meadowbrook Drive", "Saffron Place", "Kingfisher Walk")
_FAKE_CITIES = (("Springfield", "IL 62704"), ("Riverton", "WY 82501"), ("Fairview", "OR 97024"),
                ("Lakewood", "CO 80226"), ("Brookhaven", "GA 30319"), ("Millbrook", "AL 36054"))
_NANP_AREAS = ("202", "206", "212", "213", "303", "305", "312", "404", "415", "503", "512", "617", "646",
               "702", "713", "718", "773", "808", "919", "971")
TEST_CARDS = {  # published test card numbers (payment processors' documentation)
    "visa": ("4111111111111111", "4242424242424242", "4012888888881881", "4000056655665556",
             "4000002500003155", "4000000000003220"),
    "mc": ("5555555555554444", "5105105105105100", "2223003122003222", "5200828282828210"),
    "amex": ("378282246310005", "371449635398431", "378734493671000"),
    "discover": ("6011111111111117", "6011000990139424", "6011981111111113"),
    "jcb": ("3530111333300000", "3566002020360505"),
    "unionpay": ("6200000000000005", "6205500000000000004", "6250946000000016"),
    "diners": ("30569309025904", "38520000023237", "36227206271667"),
}
EXAMPLE_IBANS = (  # the IBAN registry's example IBANs
    "GB82WEST12345698765432", "GB33BUKB20201555555555", "DE89370400440532013000", "FR1420041010050500013M02606",
    "ES9121000418450200051332", "IT60X0542811101000000123456", "NL91ABNA0417164300", "BE68539007547034",
    "CH9300762011623852957", "AT611904300234573201", "PL61109010140000071219812874", "SE4550000000058398257466",
)
_ALNUM_UP = "ABCDEFGHJKLMNPRSTUVWXYZ"


def _card_brand(d: str) -> str:
    if d[:2] in ("34", "37"):
        return "amex"
    if d[0] == "4":
        return "visa"
    if d[:2] in ("51", "52", "53", "54", "55") or d[0] == "2":
        return "mc"
    if d[:4] == "6011" or d[:2] == "65" or d[:3] in ("644", "645", "646", "647", "648", "649"):
        return "discover"
    if d[:2] == "35":
        return "jcb"
    if d[:2] == "62":
        return "unionpay"
    return "diners"


def _fillonly_digits(template: str, digits: str) -> str | None:
    """Put ``digits`` into the digit positions of ``template`` (None if the counts differ)."""
    if sum(c.isdigit() for c in template) != len(digits):
        return None
    it = iter(digits)
    return "".join(next(it) if c.isdigit() else c for c in template)


class Surrogates:
    """Realistic fakes, one per distinct (category, normalised value), drawn in order of first use."""

    def __init__(self, seed: int | str = 0, avoid: Iterable[str] = ()):
        self.rng = random.Random(hashlib.sha256(f"surrogate|{seed}".encode()).digest())
        self.forward: dict[tuple[str, str], str] = {}
        self.used: set[str] = set()
        self.avoid: set[str] = set()
        self.avoid_digits: set[str] = set()
        self.add_avoid(avoid)
        self._name_parts: dict[tuple[str, str], str] = {}  # ("first"/"last", raw) -> fake

    def add_avoid(self, values: Iterable[str]) -> None:
        for v in values:
            self.avoid.add(v.lower())
            d = only_digits(v)
            if len(d) >= 7:
                self.avoid_digits.add(d[-9:])

    def _ok(self, fake: str, raw: str) -> bool:
        if fake.lower() in self.avoid or fake in self.used or fake.lower() == raw.lower():
            return False
        d = only_digits(fake)
        return len(d) < 7 or d[-9:] not in self.avoid_digits

    # -- normalisation: which raw values are "the same"
    @staticmethod
    def key(category: str, raw: str) -> str:
        if category == PHONE:
            return e164(raw) or only_digits(raw)
        if category in (EMAIL, PERSON_NAME, ADDRESS, SOCIAL_ACCOUNT):
            return " ".join(raw.lower().split())
        return re.sub(r"[^0-9A-Za-z]", "", raw).upper()

    def get(self, category: str, raw: str) -> str:
        k = (category, self.key(category, raw))
        fake = self.forward.get(k)
        if fake is None:
            for _ in range(50):
                fake = self._make(category, raw)
                if self._ok(fake, raw):
                    break
            else:
                fake = token(category)
            self.forward[k] = fake
            self.used.add(fake)
        return self._reformat(category, raw, fake)

    def _reformat(self, category: str, raw: str, fake: str) -> str:
        """The fake in the raw value's layout where possible (digit grouping, case)."""
        if category in (PHONE, BANK_ACCOUNT) and not fake.startswith("["):
            if category == PHONE:
                fd = only_digits(fake)
                rd = only_digits(raw)
                if raw.startswith("+") or raw.startswith("00"):
                    pass
                elif fake.startswith("+1") and len(rd) == 10:  # NANP national layout
                    fd = fd[1:]
                elif fake.startswith(("+44", "+33")) and rd.startswith("0"):
                    fd = "0" + fd[2:]
                else:
                    return fake
                if raw.startswith("00"):
                    fd = "00" + fd
                out = _fillonly_digits(raw, fd)
                return out if out is not None else fake
            if fake[:2].isalpha():  # IBAN: grouped like the raw one
                if " " in raw.strip():
                    return " ".join(fake[i:i + 4] for i in range(0, len(fake), 4))
                return fake
            out = _fillonly_digits(raw, only_digits(fake))
            return out if out is not None else fake
        if category in (PERSON_NAME,) and raw.isupper():
            return fake.upper()
        return fake

    # -- generators
    def _name(self) -> tuple[str, str]:
        return self.rng.choice(_FAKE_FIRST), self.rng.choice(_FAKE_LAST)

    def name_part(self, part: str, raw: str) -> str:
        k = (part, raw.lower())
        if k not in self._name_parts:
            pool = _FAKE_FIRST if part == "first" else _FAKE_LAST
            taken = set(self._name_parts.values())
            choices = [p for p in pool if p not in taken and p.lower() not in self.avoid] or list(pool)
            self._name_parts[k] = self.rng.choice(choices)
        return self._name_parts[k]

    def _make(self, category: str, raw: str) -> str:
        r = self.rng
        if category == EMAIL:
            f, last = self._name()
            style = r.randrange(3)
            user = f"{f}.{last}" if style == 0 else f"{f[0]}{last}{r.randrange(10, 99)}" if style == 1 else f"{f}_{last}"
            return f"{user.lower()}@{r.choice(('example.com', 'example.org', 'example.net'))}"
        if category == PHONE:
            key = self.key(PHONE, raw)
            if key.startswith("+44"):
                return f"+44 7700 900{r.randrange(1000):03d}"
            if key.startswith("+33"):
                return f"+33 6 39 98 {r.randrange(100):02d} {r.randrange(100):02d}"
            return f"+1 {r.choice(_NANP_AREAS)} 555 01{r.randrange(100):02d}"
        if category == BANK_ACCOUNT:
            compact = re.sub(r"[ \-]", "", raw).upper()
            if compact[:2].isalpha():
                same = [i for i in EXAMPLE_IBANS if i[:2] == compact[:2]]
                return r.choice([i for i in same if i not in self.used] or [i for i in EXAMPLE_IBANS if i not in self.used]
                                or list(EXAMPLE_IBANS))
            d = only_digits(raw)
            if card_ok(d):
                brand = TEST_CARDS[_card_brand(d)]
                pool = [c for c in brand if len(c) == len(d)] or list(brand)
                return r.choice(pool)
            return self._shape(raw)
        if category == NATIONAL_ID:
            compact = raw.replace(" ", "")
            if cn_id_ok(compact):
                body = (f"{r.randrange(110000, 660000)}{r.randrange(1960, 2005)}{r.randrange(1, 13):02d}"
                        f"{r.randrange(1, 29):02d}{r.randrange(1000):03d}")
                return body + cn_id_check(body)
            return self._shape(raw)
        if category == PERSON_NAME:
            parts = raw.split()
            if len(parts) >= 2:
                return f"{self.name_part('first', parts[0])} {self.name_part('last', parts[-1])}"
            f, last = self._name()
            return f
        if category == ADDRESS:
            city, code = r.choice(_FAKE_CITIES)
            return f"{r.randrange(1, 2400)} {r.choice(_FAKE_STREETS)}, {city} {code}"
        if category == SOCIAL_ACCOUNT:
            f, last = self._name()
            user = f"{f}{last[:3]}{r.randrange(10, 999)}".lower()
            m = re.match(r"(?i)((?:https?://)?(?:www\.|m\.)?[a-z.]+\.[a-z]+/(?:in/|u/|user/)?@?)", raw)
            if m and "/" in raw:
                return m.group(1) + user
            if raw.startswith("@"):
                return "@" + user
            if raw.isdigit():
                return self._shape(raw)
            return user
        return self._shape(raw)

    def _shape(self, raw: str) -> str:
        """Same shape: each digit → a random digit (no leading zero change), letters → random letters."""
        r = self.rng
        out = []
        for i, c in enumerate(raw):
            if c.isdigit():
                out.append(str(r.randrange(1 if i == 0 and c != "0" else 0, 10)))
            elif "A" <= c <= "Z":
                out.append(r.choice(_ALNUM_UP))
            elif "a" <= c <= "z":
                out.append(r.choice(string.ascii_lowercase))
            else:
                out.append(c)
        return "".join(out)


# ================================================================================== the masker


class TextMasker:
    """Masks texts of one episode consistently.

    Args:
        mode: ``"token"`` (``[PHONE]``) or ``"surrogate"`` (a consistent realistic fake).
        known: exact values to mask as well, ``value -> category`` (e.g. names and addresses a device
            reports it planted); matched case-insensitively as whole words.
        name_parts: names whose first and last names alone are masked too (e.g. a task's person, whose
            first and last names are typed into separate fields); mapped component-wise in surrogate mode.
        categories: detector categories to use (default: all nine).
        seed: surrogate RNG seed (the episode's id, say); avoid: values a surrogate must never equal.

    ``counts`` tallies the masked spans by category over every call.
    """

    def __init__(
        self,
        mode: str = "token",
        *,
        known: Mapping[str, str] | None = None,
        name_parts: Iterable[str] = (),
        categories: Iterable[str] | None = None,
        seed: int | str = 0,
        avoid: Iterable[str] = (),
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.categories = tuple(CATEGORIES if categories is None else categories)
        unknown = set(self.categories) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown categories {sorted(unknown)}; expected some of {CATEGORIES}")
        self.known: dict[str, str] = {k: v for k, v in (known or {}).items() if k and k.strip()}
        self.parts: dict[str, tuple[str, str]] = {}  # lower(part) -> ("first"/"last", part)
        self._known_all = dict(self.known)
        self.add_name_parts(name_parts)
        self.surrogates = Surrogates(seed, avoid=[*avoid, *self.known])
        self.counts: Counter = Counter()
        self.inverse: dict[str, str] = {}  # surrogate as written -> raw spelling (memory only)
        self.learned: dict[str, str] = {}  # values detected earlier in the episode (see learn)

    def add_name_parts(self, names: Iterable[str]) -> None:
        """Mask the first and last names of these full names on their own too (mapped part by part in
        surrogate mode, so "Ines" and "Tanaka" typed into two fields match the fake "Ines Tanaka")."""
        for full in names:
            bits = full.split()
            if len(bits) < 2:
                continue
            for part, word in (("first", bits[0]), ("last", bits[-1])):
                if len(word) >= 2 and word.lower() not in self.parts:
                    self.parts[word.lower()] = (part, word)
                    self._known_all.setdefault(word, PERSON_NAME)

    def add_known(self, known: Mapping[str, str]) -> None:
        """More known values (e.g. content a device generated lazily); surrogates will avoid them too."""
        new = {k: v for k, v in known.items() if k and k.strip() and k not in self.known}
        if not new:
            return
        self.known.update(new)
        for k, v in new.items():
            self._known_all.setdefault(k, v)
        self.surrogates.add_avoid(new)

    def learn(self, text: str | None) -> None:
        """Remember every value detected in ``text`` as a known value of the episode, so that it is masked
        wherever else it appears — also where nothing around it gives it away (a tracking number read in
        a message with its context and typed or answered bare)."""
        if not text:
            return
        found = {}
        for sp in detect(text, self.categories):
            value = text[sp.start:sp.end]
            if len(value) >= 6 and value not in self._known_all:
                found[value] = sp.category
        if found:
            self.learned.update(found)
            for k, v in found.items():
                self._known_all.setdefault(k, v)

    def spans(self, text: str) -> list[Span]:
        found = detect(text, self.categories)
        if self._known_all:
            found = merge_spans(found, detect_known(text, self._known_all))
        return found

    def replacement(self, category: str, raw: str) -> str:
        if self.mode == "token":
            return token(category)
        if category == PERSON_NAME and raw.lower() in self.parts and len(raw.split()) == 1:
            part, _ = self.parts[raw.lower()]
            fake = self.surrogates.name_part(part, raw)
            return fake.upper() if raw.isupper() else fake
        return self.surrogates.get(category, raw)

    def mask(self, text: str | None) -> MaskResult:
        if not text:
            return MaskResult(text or "", [])
        spans = self.spans(text)
        if not spans:
            return MaskResult(text, [])
        out: list[str] = []
        pos = 0
        for sp in spans:
            raw = text[sp.start:sp.end]
            rep = self.replacement(sp.category, raw)
            if self.mode == "surrogate":
                self.inverse.setdefault(rep, raw)
            out.append(text[pos:sp.start])
            out.append(rep)
            pos = sp.end
            self.counts[sp.category] += 1
        out.append(text[pos:])
        return MaskResult("".join(out), spans)

    def __call__(self, text: str | None) -> str:
        return self.mask(text).text

    def unmask(self, text: str) -> str:
        """Surrogate mode: put the raw values back (in memory only, e.g. to replay a stored episode)."""
        if self.mode != "surrogate" or not text or not self.inverse:
            return text
        fakes = sorted(self.inverse, key=len, reverse=True)
        rx = re.compile("|".join(re.escape(f) for f in fakes))
        return rx.sub(lambda m: self.inverse[m.group(0)], text)


def mask_text(
    text: str,
    mode: str = "token",
    *,
    known: Mapping[str, str] | None = None,
    categories: Iterable[str] | None = None,
    seed: int | str = 0,
) -> MaskResult:
    """Mask one text (a fresh :class:`TextMasker`; use one masker per episode for consistency)."""
    return TextMasker(mode, known=known, categories=categories, seed=seed).mask(text)


# ================================================================================== UI dumps → boxes

_LINE = re.compile(r"^(?:\[\d+\]\s*)?[^;\n]*;[^;\n]*;(.*);\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]\s*$")


def sensitive_boxes(
    xml_compressed: str, masker: TextMasker | None = None
) -> list[tuple[tuple[int, int, int, int], str]]:
    """``(box, category)`` of every compressed-XML node whose label holds a flagged span (context across
    lines is used, as in :func:`detect`); ``masker`` adds its known values and categories."""
    if not xml_compressed:
        return []
    spans = masker.spans(xml_compressed) if masker is not None else detect(xml_compressed)
    if not spans:
        return []
    out = []
    starts = []
    pos = 0
    lines = xml_compressed.split("\n")
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    seen: set[int] = set()
    for sp in spans:
        i = bisect.bisect_right(starts, sp.start) - 1
        for j in range(i, bisect.bisect_right(starts, max(sp.start, sp.end - 1))):
            if j in seen:
                continue
            m = _LINE.match(lines[j])
            if m is None:
                continue
            seen.add(j)
            x1, y1, x2, y2 = (int(v) for v in m.group(2, 3, 4, 5))
            if x2 > x1 and y2 > y1:
                out.append(((x1, y1, x2, y2), sp.category))
    return out
