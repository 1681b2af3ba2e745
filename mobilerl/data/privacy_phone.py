"""Phone numbers in UI text: the candidate pattern, ``phonenumbers`` validation over many regions, and the
number shapes that are not personal data (dates, IPv4 addresses, thousands).

Bare digit runs are ambiguous on a phone screen (ids, timestamps, amounts), so a national number counts
only when formatted like one, as a CN mobile, trunk-prefixed, or after a phone context word.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from functools import lru_cache

import phonenumbers

from mobilerl.data.checksums import only_digits

# A phone-number candidate: digit groups with single separators, optional +CC and (area).
_PHONE_RE = re.compile(
    r"(?<![\w+$€£¥₹.,/\\\-])(?:\+\d{1,3}[ .\-]?)?(?:\(\d{1,5}\)[ .\-]?)?\d{1,12}(?:[ .\-]\d{1,8}){0,6}"
    r"(?![\w%])(?!\.\d)(?!,\d)"
)
DATE_LIKE = re.compile(r"^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4})(?: \d{1,2})?$")
IPV4 = re.compile(r"^(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")
_THOUSANDS = re.compile(r"^\d{1,3}(?:([ .])\d{3})+$")
# National (no +) numbers are tried in these regions; with a phone context word in the wider list too.
PHONE_REGIONS = ("US", "GB", "FR", "DE", "CN", "JP", "IN", "BR", "ES", "IT", "KR", "AU", "MX", "NL", "RU", "CA")
PHONE_REGIONS_CTX = (*PHONE_REGIONS, "SG", "HK", "TW", "CH", "SE", "PL", "TR", "ZA", "NG", "AE", "PH", "ID")
_TRUNK0_REGIONS = ("GB", "FR", "DE", "IT", "ES", "NL", "AU", "JP", "KR", "IN", "CN", "BR", "TR", "ZA", "NG",
                   "CH", "SE", "PL", "RU", "PH", "ID")


def _phone_parse(s: str, region: str | None) -> bool:
    try:
        num = phonenumbers.parse(s, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(num)


def _phone_possible(s: str, region: str | None) -> bool:
    try:
        num = phonenumbers.parse(s, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_possible_number(num)


@lru_cache(maxsize=65536)
def phone_value_ok(s: str, context: bool = False) -> bool:
    """Whether the candidate ``s`` is a valid phone number (``context``: a phone word precedes it)."""
    d = only_digits(s)
    if not 7 <= len(d) <= 15 or DATE_LIKE.match(s) or IPV4.match(s):
        return False
    if _THOUSANDS.match(s) and not context:
        return False
    if s.startswith("+"):
        # +CC numbers: valid per the metadata, or of a possible length for the country when grouped like a
        # phone number (ranges not (yet) in the metadata are still phone numbers to a reader)
        if _phone_parse(s, None):
            return True
        return len(re.findall(r"\d+", s)) >= 2 and len(d) >= 8 and _phone_possible(s, None)
    groups = re.findall(r"\d+", s)
    if "." in s and not re.search(r"[ \-()]", s) and len(groups) <= 2 and not s.startswith("0"):
        return False  # a decimal number (amount, coordinate)
    formatted = len(groups) > 1 or "(" in s
    if formatted and not context and len(d) < 9 and len(groups) < 3:
        return False  # a short local number without area code: needs a context word
    if not formatted and not context:
        # Bare digit runs are ambiguous (ids, timestamps, amounts): only CN mobiles and trunk-prefixed
        # national numbers of 10-11 digits count without a context word.
        if len(d) == 11 and re.fullmatch(r"1[3-9]\d{9}", d):
            return _phone_parse(d, "CN")
        if d[0] == "0" and 10 <= len(d) <= 11:
            return any(_phone_parse(d, r) for r in _TRUNK0_REGIONS)
        return False
    if d.startswith("00") and len(d) > 9:  # 00 + country code
        return _phone_parse("+" + d[2:], None)
    regions = PHONE_REGIONS_CTX if context else PHONE_REGIONS
    if any(_phone_parse(s, r) for r in regions):
        return True
    return context and formatted and len(d) >= 8 and any(_phone_possible(s, r) for r in PHONE_REGIONS)


def phone_matches(text: str, claimed: Sequence[tuple[int, int]] = ()) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each phone number of ``text`` outside the ``claimed`` ``(start, end)`` ranges."""
    for m in _PHONE_RE.finditer(text):
        s = m.group(0)
        if sum(c.isdigit() for c in s) < 7:
            continue
        # a number already claimed by a validated rule (card, IBAN, ID...) is not a phone candidate
        if any(m.start() < b and a < m.end() for a, b in claimed):
            continue
        # A trailing group may not belong to the number ("0134 2 items"): retry without it.
        cand = s
        if DATE_LIKE.match(s) or IPV4.match(s) or _THOUSANDS.match(s):
            continue
        for _ in range(3):
            if phone_value_ok(cand):
                start = m.start()
                yield start, start + len(cand)
                break
            cut = re.search(r"[ .\-]\d{1,6}$", cand)
            if cut is None:
                break
            cand = cand[: cut.start()]
            if sum(c.isdigit() for c in cand) < 7:
                break


def e164(raw: str) -> str | None:
    """``raw`` as an E.164 number if it is a valid one (read as international, then national in
    :data:`PHONE_REGIONS`); None otherwise."""
    for region in (None, *PHONE_REGIONS):
        try:
            num = phonenumbers.parse(raw, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(num):
            return phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.E164)
    return None
