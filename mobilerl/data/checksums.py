"""Check digits and checksums of personal-data formats: cards, IBANs, national IDs, parcels, passports.

Pure string functions with no other dependency: the privacy detector validates candidates with the
``*_ok`` functions, and the labelled privacy corpus builds valid values with the ``*_check`` / ``*_digit``
ones.
"""

from __future__ import annotations

import re


def only_digits(s: str) -> str:
    """The digits of ``s``, in order."""
    return re.sub(r"\D", "", s)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def luhn_digit(payload: str) -> str:
    for d in "0123456789":
        if luhn_ok(payload + d):
            return d
    raise AssertionError


IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24,
    "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21,
    "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LI": 21,
    "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30,
    "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}


def iban_ok(iban: str) -> bool:
    s = iban.replace(" ", "").upper()
    if IBAN_LENGTHS.get(s[:2]) != len(s) or not s[2:4].isdigit():
        return False
    moved = s[4:] + s[:4]
    try:
        num = int("".join(str(int(c, 36)) for c in moved))
    except ValueError:
        return False
    return num % 97 == 1


def iban_with_check(country: str, bban: str) -> str:
    moved = bban + country + "00"
    num = int("".join(str(int(c, 36)) for c in moved))
    return f"{country}{98 - num % 97:02d}{bban}"


_CN_W = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def cn_id_check(body17: str) -> str:
    return "10X98765432"[sum(int(c) * w for c, w in zip(body17, _CN_W, strict=True)) % 11]


def cn_id_ok(s: str) -> bool:
    s = s.upper()
    return len(s) == 18 and s[:17].isdigit() and cn_id_check(s[:17]) == s[17]


def fr_nir_ok(s: str) -> bool:
    s = s.replace(" ", "").upper()
    if len(s) != 15:
        return False
    body = s[:13].replace("2A", "19").replace("2B", "18")
    if not body.isdigit() or not s[13:].isdigit():
        return False
    return 97 - int(body) % 97 == int(s[13:])


DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_ok(s: str) -> bool:
    s = s.replace("-", "").upper()
    if len(s) != 9:
        return False
    num = s[:8]
    if num[0] in "XYZ":
        num = str("XYZ".index(num[0])) + num[1:]
    return num.isdigit() and DNI_LETTERS[int(num) % 23] == s[8]


_CF_ODD = [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23]


def it_cf_check(body15: str) -> str:
    total = 0
    for i, c in enumerate(body15):
        v = int(c) if c.isdigit() else ord(c) - 65
        total += _CF_ODD[v] if i % 2 == 0 else v
    return chr(65 + total % 26)


def it_cf_ok(s: str) -> bool:
    s = s.upper()
    return len(s) == 16 and it_cf_check(s[:15]) == s[15]


def br_cpf_digits(body9: str) -> str:
    d = [int(c) for c in body9]
    for n in (10, 11):
        s = sum(v * w for v, w in zip(d, range(n, 1, -1), strict=False))
        d.append((s * 10) % 11 % 10)
    return f"{d[9]}{d[10]}"


def br_cpf_ok(s: str) -> bool:
    d = re.sub(r"\D", "", s)
    return len(d) == 11 and len(set(d)) > 1 and br_cpf_digits(d[:9]) == d[9:]


def kr_rrn_check(body12: str) -> str:
    w = (2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5)
    return str((11 - sum(int(c) * x for c, x in zip(body12, w, strict=True)) % 11) % 10)


def kr_rrn_ok(s: str) -> bool:
    d = s.replace("-", "")
    return len(d) == 13 and d.isdigit() and kr_rrn_check(d[:12]) == d[12]


_VD = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 0, 6, 7, 8, 9, 5], [2, 3, 4, 0, 1, 7, 8, 9, 5, 6],
       [3, 4, 0, 1, 2, 8, 9, 5, 6, 7], [4, 0, 1, 2, 3, 9, 5, 6, 7, 8], [5, 9, 8, 7, 6, 0, 4, 3, 2, 1],
       [6, 5, 9, 8, 7, 1, 0, 4, 3, 2], [7, 6, 5, 9, 8, 2, 1, 0, 4, 3], [8, 7, 6, 5, 9, 3, 2, 1, 0, 4],
       [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
_VP = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 5, 7, 6, 2, 8, 3, 0, 9, 4], [5, 8, 0, 3, 7, 9, 6, 1, 4, 2],
       [8, 9, 1, 6, 0, 4, 3, 5, 2, 7], [9, 4, 5, 3, 1, 2, 6, 8, 7, 0], [4, 2, 8, 6, 5, 7, 3, 9, 0, 1],
       [2, 7, 9, 3, 8, 0, 6, 4, 1, 5], [7, 0, 4, 6, 9, 1, 3, 2, 5, 8]]
_VINV = [0, 4, 3, 2, 1, 5, 6, 7, 8, 9]


def verhoeff_ok(digits: str) -> bool:
    c = 0
    for i, ch in enumerate(reversed(digits)):
        c = _VD[c][_VP[i % 8][int(ch)]]
    return c == 0


def verhoeff_digit(payload: str) -> str:
    c = 0
    for i, ch in enumerate(reversed(payload)):
        c = _VD[c][_VP[(i + 1) % 8][int(ch)]]
    return str(_VINV[c])


def s10_check(digits8: str) -> str:
    s = sum(int(c) * w for c, w in zip(digits8, (8, 6, 4, 2, 3, 5, 9, 7), strict=True))
    r = 11 - s % 11
    return "0" if r == 10 else "5" if r == 11 else str(r)


def mrz_check(s: str) -> str:
    total = 0
    for i, c in enumerate(s):
        v = int(c) if c.isdigit() else 0 if c == "<" else ord(c) - 55
        total += v * (7, 3, 1)[i % 3]
    return str(total % 10)


def ssn_ok(d: str) -> bool:
    return len(d) == 9 and d[:3] not in ("000", "666") and d[0] != "9" and d[3:5] != "00" and d[5:] != "0000"


# issuer prefix -> allowed lengths
_CARD_RANGES = (
    (re.compile(r"^4"), (13, 16, 19)),  # Visa
    (re.compile(r"^(?:5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720))"), (16,)),  # Mastercard
    (re.compile(r"^3[47]"), (15,)),  # Amex
    (re.compile(r"^3(?:0[0-5]|[689])"), (14, 16)),  # Diners
    (re.compile(r"^35(?:2[89]|[3-8]\d)"), (16, 17, 18, 19)),  # JCB
    (re.compile(r"^6(?:011|4[4-9]|5)"), (16, 17, 18, 19)),  # Discover
    (re.compile(r"^62"), (16, 17, 18, 19)),  # UnionPay
    (re.compile(r"^(?:50|5[6-9]|6[0-9])"), (16, 19)),  # Maestro
)


def card_ok(d: str) -> bool:
    """A payment card number: issuer prefix, a length that issuer uses, Luhn."""
    if not 13 <= len(d) <= 19:
        return False
    if not any(rx.match(d) and len(d) in lengths for rx, lengths in _CARD_RANGES):
        return False
    return luhn_ok(d)

