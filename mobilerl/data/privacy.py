"""Privacy masking before storage (MobileRL Appendix D.2): personal data in text and images.

Text — :func:`detect` finds spans of nine categories with rules, validators and context words:

=================  ==========================================================================================
category           how it is found
=================  ==========================================================================================
``EMAIL``          address syntax (file names such as ``icon@2x.png`` excluded)
``PHONE``          ``phonenumbers`` validation in many regions: ``+`` international numbers anywhere;
                   formatted national numbers; bare digit runs only as CN mobiles or after a context word
``BANK_ACCOUNT``   cards (Luhn + issuer prefix), IBAN (country length + mod-97), account numbers after a
                   context word (account / acct / 账号 / Kontonummer / sort code / CLABE …)
``PASSPORT``       a number after a passport context word (any language), ICAO MRZ lines (check digit)
``NATIONAL_ID``    checksummed IDs without context (CN resident ID, FR NIR, ES DNI/NIE, IT codice fiscale,
                   BR CPF, KR RRN, UK NINO, US SSN, IN Aadhaar 4-4-4); other numbers after ID context words
``VEHICLE_PLATE``  CN plates (province + letter + 5/6), FR ``AB-123-CD``, UK ``AB12 CDE``, DE ``B-MW 1234``;
                   anything plate-shaped after a plate context word (US plates are only found that way)
``TRACKING_NUMBER`` UPS ``1Z…``, UPU S10 (check digit), USPS IMpb, SF/YT/JT/TBA prefixes; any long
                   number after a tracking / carrier context word (FedEx, DHL, 运单号 …)
``ORDER_NUMBER``   Amazon ``123-1234567-1234567``; numbers after an order context word (order #, 订单号 …)
``SOCIAL_ACCOUNT`` ``@handles``, profile URLs of social sites, IDs after WeChat / QQ / Telegram … words
=================  ==========================================================================================

Context words may sit on the previous line of a compressed XML dump (``Passport No.;[..][..]`` then
``TextView;;E12345678;[..]``), as in a label/value pair of a real screen. UI text is left alone: bounds,
times, dates, prices, counts, percentages, versions, IPs, action strings. Overlaps are resolved by rule
priority (validated formats first), then length.

Known values — the names and postal addresses a regex cannot find can be masked as exact *known values*
(``PERSON_NAME``, ``ADDRESS``), e.g. the values a simulator reports it planted.

Masking — :class:`TextMasker` (one per episode) replaces each span either by the category token
(``mode="token"``: ``[PHONE]``, as in the paper) or by a *surrogate* (``mode="surrogate"``): a realistic
fake of the same category and shape, the same fake for the same value everywhere in the episode (phones
compared as E.164, e-mails case-insensitively), so the instruction, the XML and a ``Type`` action that
mention one number stay consistent. Fakes come from ranges reserved for fiction where such ranges exist
(NANP 555-01xx, Ofcom 07700 900xxx, ARCEP 06 39 98 xx xx, ``example.com``, published test card numbers
and the IBAN registry's example IBANs), otherwise they are random values of the same shape; fakes never
equal a value the masker was told to avoid (the known raw values). Surrogates are drawn from a seeded RNG
in order of first appearance, so they carry no information about the raw value beyond its format.
:meth:`TextMasker.unmask` inverts them in memory (for replay checks); nothing of the mapping is stored.

Images live in :mod:`mobilerl.data.privacy_image` (faces, QR codes, OCR'd text, and regions named by the
UI dump); :func:`sensitive_boxes` gives the on-screen boxes of the XML nodes whose text is flagged.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import phonenumbers

EMAIL = "EMAIL"
PHONE = "PHONE"
BANK_ACCOUNT = "BANK_ACCOUNT"
PASSPORT = "PASSPORT"
NATIONAL_ID = "NATIONAL_ID"
VEHICLE_PLATE = "VEHICLE_PLATE"
TRACKING_NUMBER = "TRACKING_NUMBER"
ORDER_NUMBER = "ORDER_NUMBER"
SOCIAL_ACCOUNT = "SOCIAL_ACCOUNT"
PERSON_NAME = "PERSON_NAME"
ADDRESS = "ADDRESS"

CATEGORIES: tuple[str, ...] = (
    EMAIL, PHONE, BANK_ACCOUNT, PASSPORT, NATIONAL_ID, VEHICLE_PLATE, TRACKING_NUMBER, ORDER_NUMBER,
    SOCIAL_ACCOUNT,
)
KNOWN_CATEGORIES: tuple[str, ...] = (PERSON_NAME, ADDRESS)
MODES = ("token", "surrogate")


def token(category: str) -> str:
    """The masking token of a category: ``[PHONE]``."""
    return f"[{category}]"


@dataclass(frozen=True, slots=True)
class Span:
    """A detected span ``text[start:end]`` of ``category`` (positions in the *input* text)."""

    start: int
    end: int
    category: str
    rule: str = ""


@dataclass
class MaskResult:
    """``text``: the masked text; ``spans``: what was replaced, in the input text's coordinates."""

    text: str
    spans: list[Span] = field(default_factory=list)

    @property
    def categories(self) -> Counter:
        return Counter(s.category for s in self.spans)


# ================================================================================== validators


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


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_ok(s: str) -> bool:
    s = s.replace("-", "").upper()
    if len(s) != 9:
        return False
    num = s[:8]
    if num[0] in "XYZ":
        num = str("XYZ".index(num[0])) + num[1:]
    return num.isdigit() and _DNI_LETTERS[int(num) % 23] == s[8]


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


# ================================================================================== detection rules

_NB = r"(?<![A-Za-z0-9])"  # no ASCII letter/digit just before
_NA = r"(?![A-Za-z0-9])"  # … nor just after
# Between a context word and its value: separators, filler words, or the end of a compressed-XML line
# and the class/flags of the next one (label and value in two TextViews).
_XMLBREAK = r";\[\d+,\d+\]\[\d+,\d+\]\s*\n(?:\[\d+\]\s*)?[A-Za-z.$]*;[a-z\- ]*;"
_FILL = (
    r"(?:[\s:：#№=\-–—()（）\"'“”「」]|(?i:\b(?:no|nr|num|number|numbers|id|is|was|ref|reference|code|"
    r"of|the|your|my|his|her|our|a|an|and|on|via|with|number\s+is)\b\.?)|号码|号|编号|码|为|是|：|"
    r"(?i:numéro|número|nummer|n\.?°|n\.?º)|番号|番號|번호|" + _XMLBREAK + r"){0,12}?"
)


def _ctx(keywords: str, value: str) -> re.Pattern[str]:
    return re.compile(r"(?:" + keywords + r")" + _FILL + r"(?P<v>" + value + r")")


_KW_PHONE = (r"(?i:\b(?:phone|tel|telephone|mobile|cell|call|contact|fax|whatsapp|handy|telefon|"
             r"téléphone|portable|teléfono|móvil|celular|telefone|telefono|cellulare)\b\.?)|电话|手机|联系方式|"
             r"联系电话|手机号|電話|携帯|전화")
_KW_BANK = (r"(?i:\b(?:account|acct|a/c|iban|bank|routing|aba|sort\s+code|bsb|swift|kontonummer|konto|"
            r"numéro\s+de\s+compte|compte|rib|cuenta|clabe|conto|card|debit|credit)\b\.?)|账号|账户|帳號|"
            r"银行卡|卡号|开户|口座番号|口座|계좌")
_KW_PASSPORT = (r"(?i:\b(?:passport|passeport|reisepass|pass-nr|pasaporte|passaporto|paspoort|"
                r"passaporte|паспорт)\b\.?)|护照|護照|旅券|여권")
_KW_NATID = (r"(?i:\b(?:ssn|social\s+security|national\s+id|national\s+insurance|nino|id\s+card|"
             r"identity\s+card|id\s+number|identification\s+number|personalausweis|ausweis|steuer-id|"
             r"steuerliche\s+identifikationsnummer|identifikationsnummer|steuernummer|idnr|dni|nie|nif|cpf|aadhaar|aadhar|pan|my\s+number|rrn|carte\s+d'identité|insee|nir|"
             r"codice\s+fiscale|tax\s+id|tin)\b\.?)|身份证|身份證|居民身份证|マイナンバー|個人番号|주민등록번호")
_KW_PLATE = (r"(?i:\b(?:plate|license\s+plate|licence\s+plate|number\s+plate|registration|reg|"
             r"kennzeichen|immatriculation|plaque|matrícula|matricula|targa|kenteken)\b\.?)|车牌|車牌|"
             r"ナンバー|번호판")
_KW_TRACK = (r"(?i:\b(?:tracking|track|trace|shipment|parcel|package|waybill|awb|consignment|"
             r"sendungsnummer|sendung|suivi|colis|seguimiento|envío|ups|usps|fedex|dhl|royal\s+mail|"
             r"ems|dpd|gls|hermes|colissimo|la\s+poste|canada\s+post|aramex)\b\.?)|运单号|快递单号|物流单号|"
             r"快递|顺丰|中通|圆通|申通|韵达|追跡番号|운송장")
_KW_ORDER = (r"(?i:\b(?:order|orders|order\s+id|purchase|invoice|receipt|booking|reservation|"
             r"confirmation|bestellnummer|bestellung|commande|pedido|ordine|factura|rechnung)\b\.?)|"
             r"订单|訂單|订单号|注文番号|注文|주문번호")
_KW_SOCIAL = (r"(?i:\b(?:wechat|weixin|wechat\s+id|qq|telegram|line\s+id|discord|skype|snapchat|"
              r"instagram|insta|twitter|tiktok|facebook|weibo|douyin|xiaohongshu|mastodon|username|"
              r"user\s+name)\b\.?)|微信号?|微信|QQ号|抖音号?|微博|小红书号?")

# values after context words
_V_DIGITS = r"\+?\d(?:[\d\s\-./]{4,28}\d)"  # 6+ digits possibly grouped
_V_ALNUM = r"#?(?=[A-Z0-9\-]*\d)[A-Z0-9](?:[A-Z0-9\-]{3,30}[A-Z0-9])"
_V_PASSPORT = r"(?=[A-Z0-9]{6,10}" + _NA + r")(?=(?:[A-Z]*\d){5})[A-Z0-9]{6,10}"
_V_PLATE = r"(?=[A-Z0-9·•\- ]{4,10}" + _NA + r")(?=[A-Z0-9·•\- ]*\d)[A-Z0-9](?:[A-Z0-9]|[·•\- ](?=[A-Z0-9])){3,9}"
_V_SOCIAL = r"@?[A-Za-z0-9][A-Za-z0-9_.\-]{3,29}(?<![.\-])"

_CN_PROV = "京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼"

SOCIAL_SITES = (
    r"(?:twitter\.com|x\.com|instagram\.com|facebook\.com|fb\.com|tiktok\.com|linkedin\.com/in|"
    r"github\.com|youtube\.com|weibo\.com|t\.me|threads\.net|reddit\.com/u(?:ser)?|snapchat\.com/add|"
    r"pinterest\.com|vk\.com|douyin\.com/user|xiaohongshu\.com/user/profile|bilibili\.com|"
    r"mastodon\.social)"
)
_NOT_EMAIL_TLD = {"png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "js", "css", "html", "htm",
                  "xml", "json", "txt", "pdf", "mp3", "mp4", "zip", "apk", "webm", "heic"}
_HANDLE_STOP = {"everyone", "here", "channel", "all", "media", "import", "override", "param", "return",
                "gmail", "outlook"}

# A phone-number candidate: digit groups with single separators, optional +CC and (area).
_PHONE_RE = re.compile(
    r"(?<![\w+$€£¥₹.,/\\\-])(?:\+\d{1,3}[ .\-]?)?(?:\(\d{1,5}\)[ .\-]?)?\d{1,12}(?:[ .\-]\d{1,8}){0,6}"
    r"(?![\w%])(?!\.\d)(?!,\d)"
)
_DATE_LIKE = re.compile(r"^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4})(?: \d{1,2})?$")
_IPV4 = re.compile(r"^(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")
_THOUSANDS = re.compile(r"^\d{1,3}(?:([ .])\d{3})+$")
# National (no +) numbers are tried in these regions; with a phone context word in the wider list too.
PHONE_REGIONS = ("US", "GB", "FR", "DE", "CN", "JP", "IN", "BR", "ES", "IT", "KR", "AU", "MX", "NL", "RU", "CA")
PHONE_REGIONS_CTX = (*PHONE_REGIONS, "SG", "HK", "TW", "CH", "SE", "PL", "TR", "ZA", "NG", "AE", "PH", "ID")
_TRUNK0_REGIONS = ("GB", "FR", "DE", "IT", "ES", "NL", "AU", "JP", "KR", "IN", "CN", "BR", "TR", "ZA", "NG",
                   "CH", "SE", "PL", "RU", "PH", "ID")


@dataclass(frozen=True)
class _Rule:
    name: str
    category: str
    pattern: re.Pattern[str]
    priority: int
    check: object = None  # callable(str) -> bool on the value group
    gate: str = "digits"  # cheap precondition on the text (see _gates)


def _digits(s: str) -> str:
    return re.sub(r"\D", "", s)


def _card_value(v: str) -> bool:
    return card_ok(_digits(v))


def _ctx_account(v: str) -> bool:
    d = _digits(v)
    return 6 <= len(d) <= 20 and not _DATE_LIKE.match(v.strip()) and not _IPV4.match(v.strip())


def _ctx_phone(v: str) -> bool:
    return _phone_value_ok(v.strip(), context=True)


def _ctx_tracking(v: str) -> bool:
    d = _digits(v)
    return len(d) >= 8 and len(v.replace(" ", "")) >= 8 and not _DATE_LIKE.match(v)


def _ctx_order(v: str) -> bool:
    s = v.lstrip("#")
    d = _digits(s)
    return len(d) >= 4 and len(s) >= 5 and not _DATE_LIKE.match(s)


def _ctx_natid(v: str) -> bool:
    d = _digits(v)
    return len(d) >= 6 and not _DATE_LIKE.match(v.strip())


def _plate_value(v: str) -> bool:
    core = re.sub(r"[·•\- ]", "", v)
    return 4 <= len(core) <= 8 and any(c.isalpha() for c in core) or (5 <= len(core) <= 7 and core.isdigit())


_SOCIAL_WORDS = {"wechat", "weixin", "qq", "telegram", "discord", "skype", "snapchat", "instagram", "insta",
                 "twitter", "tiktok", "facebook", "weibo", "douyin", "xiaohongshu", "mastodon", "username",
                 "line", "signal", "whatsapp", "messenger", "youtube", "linkedin", "reddit"}


def _social_value(v: str) -> bool:
    s = v.lstrip("@")
    if s.lower() in _HANDLE_STOP or s.lower() in ("is", "id", "number", "account", "me", "us"):
        return False
    if s.lower() in _SOCIAL_WORDS or re.fullmatch(r"\d+[.,]\d+", s):  # an app name, a size/amount
        return False
    return len(s) >= 4 and not s.isdigit() or s.isdigit() and 5 <= len(s) <= 11


def _mrz_line2(v: str) -> bool:
    return mrz_check(v[:9]) == v[9] and mrz_check(v[13:19]) == v[19]


def _iban(v: str) -> bool:
    return iban_ok(v)


def _ssn(v: str) -> bool:
    return ssn_ok(_digits(v))


def _aadhaar(v: str) -> bool:
    d = _digits(v)
    return len(d) == 12 and d[0] not in "01" and verhoeff_ok(d)


def _nino(v: str) -> bool:
    return v.replace(" ", "")[:2].upper() not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ")


def _cn_id(v: str) -> bool:
    return cn_id_ok(v)


def _s10(v: str) -> bool:
    return s10_check(v[2:10]) == v[10]


def _imbp(v: str) -> bool:
    return 20 <= len(_digits(v)) <= 22


RULES: tuple[_Rule, ...] = (
    # ---- strongly validated formats (no context needed)
    _Rule("email", EMAIL, re.compile(
        r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9](?:[A-Za-z0-9._%+\-]{0,63})@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}"
        r"[A-Za-z0-9])?\.)+(?P<tld>[A-Za-z]{2,24})(?![A-Za-z0-9\-])"), 85, gate="at"),
    _Rule("iban", BANK_ACCOUNT, re.compile(
        _NB + r"(?P<v>[A-Z]{2}\d{2}(?: ?[A-Z0-9]){10,30})" + _NA), 95, _iban),
    _Rule("card", BANK_ACCOUNT, re.compile(
        r"(?<![\d\-.,+])(?P<v>\d(?:[ \-]?\d){12,18})(?![\d\-.,]\d)"), 90, _card_value),
    _Rule("cn_id", NATIONAL_ID, re.compile(
        _NB + r"(?P<v>[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx])" + _NA),
        96, _cn_id),
    _Rule("fr_nir", NATIONAL_ID, re.compile(
        _NB + r"(?P<v>[12] ?\d{2} ?(?:0[1-9]|1[0-2]|[2-9]\d) ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2})" + _NA),
        96, fr_nir_ok),
    _Rule("es_dni", NATIONAL_ID, re.compile(_NB + r"(?P<v>(?:\d{8}|[XYZ]-?\d{7})-?[A-Z])" + _NA), 92, es_dni_ok),
    _Rule("it_cf", NATIONAL_ID, re.compile(
        _NB + r"(?P<v>[A-Z]{6}\d{2}[A-EHLMPR-T]\d{2}[A-Z]\d{3}[A-Z])" + _NA), 92, it_cf_ok),
    _Rule("br_cpf", NATIONAL_ID, re.compile(_NB + r"(?P<v>\d{3}\.\d{3}\.\d{3}-\d{2})" + _NA), 92, br_cpf_ok),
    _Rule("kr_rrn", NATIONAL_ID, re.compile(_NB + r"(?P<v>\d{6}-[1-8]\d{6})" + _NA), 92, kr_rrn_ok),
    _Rule("uk_nino", NATIONAL_ID, re.compile(
        _NB + r"(?P<v>[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D])" + _NA), 88, _nino),
    _Rule("us_ssn", NATIONAL_ID, re.compile(r"(?<![\d\-])(?P<v>\d{3}-\d{2}-\d{4})(?![\d\-])"), 88, _ssn),
    _Rule("aadhaar", NATIONAL_ID, re.compile(r"(?<!\d)(?<!\d )(?P<v>[2-9]\d{3} \d{4} \d{4})(?![\d]| \d)"), 86, _aadhaar),
    _Rule("mrz", PASSPORT, re.compile(
        r"(?P<v>[A-Z0-9<]{9}\d[A-Z<]{3}\d{6}\d[MFX<]\d{6}\d[A-Z0-9<]{14}[\d<]\d)"), 97, _mrz_line2),
    _Rule("mrz1", PASSPORT, re.compile(r"(?P<v>P[A-Z<][A-Z<]{3}[A-Z]+<<[A-Z<]{5,39})"), 97, gate="mrz"),
    _Rule("cn_plate", VEHICLE_PLATE, re.compile(
        r"(?P<v>[" + _CN_PROV + r"][A-HJ-NP-Z][·• ]?[A-HJ-NP-Z0-9]{4,5}[A-HJ-NP-Z0-9挂学警港澳])" + _NA), 90, gate="prov"),
    _Rule("fr_plate", VEHICLE_PLATE, re.compile(
        _NB + r"(?P<v>[A-HJ-NP-TV-Z]{2}-\d{3}-[A-HJ-NP-TV-Z]{2})" + _NA), 88),
    _Rule("uk_plate", VEHICLE_PLATE, re.compile(
        _NB + r"(?P<v>[A-HJ-PR-Y][A-HJ-PR-Y](?:0[2-9]|[1-7]\d) [A-HJ-PR-Z]{3})" + _NA), 84),
    _Rule("de_plate", VEHICLE_PLATE, re.compile(
        r"(?<![A-Za-zÄÖÜäöü0-9\-])(?P<v>[A-ZÄÖÜ]{1,3}-[A-Z]{1,2} ?[1-9]\d{0,3}[EH]?)" + _NA), 84),
    _Rule("ups", TRACKING_NUMBER, re.compile(_NB + r"(?P<v>1Z ?[0-9A-Z]{6} ?[0-9A-Z]{2} ?[0-9A-Z]{8})" + _NA), 93,
          gate="ups"),
    _Rule("s10", TRACKING_NUMBER, re.compile(_NB + r"(?P<v>[A-Z]{2}\d{9}[A-Z]{2})" + _NA), 90, _s10),
    _Rule("imbp", TRACKING_NUMBER, re.compile(
        r"(?<!\d)(?<!\d )(?P<v>9[2-5]\d{2}(?: ?\d{4}){3,4} ?\d{2,4})(?![\d])"), 91, _imbp),
    _Rule("prefixed_tracking", TRACKING_NUMBER, re.compile(
        _NB + r"(?P<v>(?:SF\d{12,13}|YT\d{13,16}|JT\d{13}|TBA\d{12}|JD\d{15}|ZTO\d{12,14}))" + _NA), 91),
    _Rule("amazon_order", ORDER_NUMBER, re.compile(r"(?<![\d\-])(?P<v>\d{3}-\d{7}-\d{7})(?![\d\-])"), 92),
    _Rule("social_url", SOCIAL_ACCOUNT, re.compile(
        r"(?i)(?P<v>(?:https?://)?(?:www\.|m\.)?" + SOCIAL_SITES + r"/@?[A-Za-z0-9_.\-]{2,60})"), 89, gate="url"),
    _Rule("handle", SOCIAL_ACCOUNT, re.compile(
        r"(?<![A-Za-z0-9._%+\-@/=])(?P<v>@[A-Za-z0-9_](?:[A-Za-z0-9_.]{1,29})(?<!\.))(?![A-Za-z0-9_@\-])"), 70,
        _social_value, gate="at"),
    _Rule("discord", SOCIAL_ACCOUNT, re.compile(_NB + r"(?P<v>[A-Za-z][A-Za-z0-9_.]{1,31}#\d{4})" + _NA), 75, gate="hash"),
    # ---- context word + value
    _Rule("ctx_passport", PASSPORT, _ctx(_KW_PASSPORT, _V_PASSPORT), 80, gate="kw"),
    _Rule("ctx_natid", NATIONAL_ID, _ctx(_KW_NATID, r"(?:" + _V_ALNUM + r"|" + _V_DIGITS + r")"), 78, _ctx_natid, gate="kw"),
    _Rule("ctx_tracking", TRACKING_NUMBER, _ctx(_KW_TRACK, _V_ALNUM + r"|\d[\d ]{6,34}\d"), 92, _ctx_tracking, gate="kw"),
    _Rule("ctx_order", ORDER_NUMBER, _ctx(_KW_ORDER, _V_ALNUM + r"|#?\d[\d ]{3,30}\d"), 91, _ctx_order, gate="kw"),
    _Rule("ctx_plate", VEHICLE_PLATE, _ctx(_KW_PLATE, _V_PLATE), 77, _plate_value, gate="kw"),
    _Rule("ctx_bank", BANK_ACCOUNT, _ctx(_KW_BANK, r"\d[\d \-]{4,30}\d"), 76, _ctx_account, gate="kw"),
    _Rule("ctx_social", SOCIAL_ACCOUNT, re.compile(
        r"(?:" + _KW_SOCIAL + r")(?P<idw>\s*(?i:id|account|username|handle)\b|号|账号)?"
        r"(?(idw)[ \t:：#]*(?:" + _XMLBREAK + r")?[ \t:：]*|[ \t]*[:：#]?[ \t]*)(?P<v>" + _V_SOCIAL + r")"),
        72, _social_value, gate="kw"),
    _Rule("ctx_phone", PHONE, _ctx(_KW_PHONE, r"\+?\(?\d[\d\s().\-]{5,22}\d"), 74, _ctx_phone, gate="kw"),
)


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
def _phone_value_ok(s: str, context: bool = False) -> bool:
    """Whether the candidate ``s`` is a valid phone number (``context``: a phone word precedes it)."""
    d = _digits(s)
    if not 7 <= len(d) <= 15 or _DATE_LIKE.match(s) or _IPV4.match(s):
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


def _phone_spans(text: str, claimed: list[Span] = ()) -> Iterable[Span]:  # type: ignore[assignment]
    for m in _PHONE_RE.finditer(text):
        s = m.group(0)
        if sum(c.isdigit() for c in s) < 7:
            continue
        # a number already claimed by a validated rule (card, IBAN, ID...) is not a phone candidate
        if any(m.start() < o.end and o.start < m.end() for o in claimed):
            continue
        # A trailing group may not belong to the number ("0134 2 items"): retry without it.
        cand = s
        if _DATE_LIKE.match(s) or _IPV4.match(s) or _THOUSANDS.match(s):
            continue
        for _ in range(3):
            if _phone_value_ok(cand):
                start = m.start()
                yield Span(start, start + len(cand), PHONE, "phone")
                break
            cut = re.search(r"[ .\-]\d{1,6}$", cand)
            if cut is None:
                break
            cand = cand[: cut.start()]
            if sum(c.isdigit() for c in cand) < 7:
                break


_KW_BY_CATEGORY = {
    PASSPORT: _KW_PASSPORT, NATIONAL_ID: _KW_NATID, TRACKING_NUMBER: _KW_TRACK, ORDER_NUMBER: _KW_ORDER,
    VEHICLE_PLATE: _KW_PLATE, BANK_ACCOUNT: _KW_BANK, SOCIAL_ACCOUNT: _KW_SOCIAL, PHONE: _KW_PHONE,
}


def _needles(kw: str) -> tuple[str, ...]:
    """Lower-case literals whose presence is necessary for a keyword regex to match (first words)."""
    body = kw.replace("(?i:\\b(?:", "").replace(")\\b\\.?)", "")
    out = set()
    for alt in body.split("|"):
        alt = alt.replace("\\s+", " ").replace("\\b", "").replace("\\.?", "")
        alt = re.sub(r".\?", "", alt).strip("()")
        if alt:
            out.add(alt.split(" ")[0].lower())
    return tuple(sorted(out))


_NEEDLES = {c: _needles(kw) for c, kw in _KW_BY_CATEGORY.items()}
_DIGIT2 = re.compile(r"\d\d")
_PROV = re.compile("[" + _CN_PROV + "]")
_URL = re.compile(r"(?i)\.(?:com|me|net|social)/")
_PHONE_GATE = re.compile(r"(?:\d[^\d\n]{0,3}){7}")


def _gates(text: str) -> set[str]:
    g: set[str] = set()
    if _DIGIT2.search(text):
        g.add("digits")
    if "@" in text:
        g.add("at")
    if "#" in text:
        g.add("hash")
    if "P<" in text:
        g.add("mrz")
    if "1Z" in text:
        g.add("ups")
    if _PROV.search(text):
        g.add("prov")
    if "/" in text and _URL.search(text):
        g.add("url")
    low = text.lower()
    for cat, needles in _NEEDLES.items():
        for n in needles:
            if n in low:
                g.add("kw:" + cat)
                break
    return g


_RULES_BY_GATE: dict[str, list[_Rule]] = {}
for _r in RULES:
    _RULES_BY_GATE.setdefault("kw:" + _r.category if _r.gate == "kw" else _r.gate, []).append(_r)


def _rule_spans(text: str, categories: frozenset[str]) -> list[tuple[int, Span]]:
    out: list[tuple[int, Span]] = []
    gates = _gates(text)
    if not gates:
        return out
    for gate in gates:
        for rule in _RULES_BY_GATE.get(gate, ()):
            if rule.category in categories:
                _apply(rule, text, out)
    if PHONE in categories and "digits" in gates and _PHONE_GATE.search(text):
        claimed = [o for _, o in out]
        out.extend((60, sp) for sp in _phone_spans(text, claimed))
    return out


def _apply(rule: _Rule, text: str, out: list[tuple[int, Span]]) -> None:
    has_v = "v" in rule.pattern.groupindex
    for m in rule.pattern.finditer(text):
        if has_v and m.group("v") is not None:
            start, end = m.span("v")
        else:
            start, end = m.span()
        value = text[start:end]
        if rule.name == "email" and m.group("tld").lower() in _NOT_EMAIL_TLD:
            continue
        stripped = value.rstrip(" -./")  # values after context words: no trailing separators
        end -= len(value) - len(stripped)
        if rule.check is not None and not rule.check(stripped):  # type: ignore[operator]
            continue
        out.append((rule.priority, Span(start, end, rule.category, rule.name)))


def _resolve(cands: list[tuple[int, Span]]) -> list[Span]:
    cands.sort(key=lambda ps: (-ps[0], -(ps[1].end - ps[1].start), ps[1].start))
    taken: list[Span] = []
    for _, sp in cands:
        if sp.end <= sp.start:
            continue
        if any(sp.start < t.end and t.start < sp.end for t in taken):
            continue
        taken.append(sp)
    taken.sort(key=lambda s: s.start)
    return taken


_BOUNDS_TAIL = re.compile(r";\[-?\d+,-?\d+\]\[-?\d+,-?\d+\]\s*$")
# A line worth a look: two digits in a row, an @, a CN province character, a URL path, a '#', or 'P<'.
_HOT = re.compile(r"\d\d|@|#|P<|1Z|[" + _CN_PROV + r"]|(?i:\.(?:com|me|net|social)/)")
# Social-account words: their value may have no digit at all, so the line after them is looked at too.
_HOT_NEXT = re.compile(r"(?i:wechat|weixin|telegram|user\s*name|qq|instagram|twitter|tiktok|facebook|weibo|"
                       r"douyin|discord|skype|snapchat|line\s+id)|微信|微博|抖音|小红书")
_BLOCK_MIN = 256


def detect(text: str, categories: Iterable[str] | None = None) -> list[Span]:
    """Non-overlapping personal-data spans of ``text``, sorted by position.

    Long multi-line texts (UI dumps) are scanned in blocks: only lines whose label holds two digits in a
    row, an ``@``, a ``#``, a URL path or a CN province character, each with the line before it (where a
    label such as ``Passport No.`` sits), and the line after a social-network word (ids may have no
    digit), go through the rules. Every rule needs one of those, so this finds the same spans as scanning
    the whole text, many times faster.
    """
    if not text:
        return []
    cats = frozenset(CATEGORIES if categories is None else categories)
    if len(text) < _BLOCK_MIN or "\n" not in text:
        return _resolve(_rule_spans(text, cats))
    lines = text.split("\n")
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    hot = [False] * len(lines)
    for i, line in enumerate(lines):
        m = _BOUNDS_TAIL.search(line)
        label = line[: m.start()] if m else line
        if _HOT.search(label):
            hot[i] = True
            if i:
                hot[i - 1] = True
        if _HOT_NEXT.search(label):
            hot[i] = True
            if i + 1 < len(lines):
                hot[i + 1] = True
    cands: list[tuple[int, Span]] = []
    i = 0
    while i < len(lines):
        if not hot[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(lines) and hot[j + 1]:
            j += 1
        a = starts[i]
        b = starts[j] + len(lines[j])
        for pr, sp in _rule_spans(text[a:b], cats):
            cands.append((pr, Span(sp.start + a, sp.end + a, sp.category, sp.rule)))
        i = j + 1
    return _resolve(cands)


# ================================================================================== known values


@lru_cache(maxsize=256)
def _known_regex(values: tuple[str, ...]) -> re.Pattern[str] | None:
    vals = sorted({v for v in values if v and len(v.strip()) >= 2}, key=len, reverse=True)
    if not vals:
        return None
    alt = "|".join(re.escape(v) for v in vals)
    return re.compile(r"(?<!\w)(?:" + alt + r")(?!\w)", re.IGNORECASE)


def detect_known(text: str, known: Mapping[str, str]) -> list[Span]:
    """Spans of exact (case-insensitive, whole-word) occurrences of ``known`` values (value → category)."""
    if not known or not text:
        return []
    rx = _known_regex(tuple(sorted(known)))
    if rx is None:
        return []
    lower = {k.lower(): c for k, c in known.items()}
    return [Span(m.start(), m.end(), lower.get(m.group(0).lower(), PERSON_NAME), "known") for m in rx.finditer(text)]


def _merge(primary: list[Span], extra: list[Span]) -> list[Span]:
    """``primary`` spans win; ``extra`` spans overlapping one are dropped."""
    if not extra:
        return primary
    out = list(primary)
    for sp in extra:
        if not any(sp.start < t.end and t.start < sp.end for t in out):
            out.append(sp)
    out.sort(key=lambda s: s.start)
    return out


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


def _fill_digits(template: str, digits: str) -> str | None:
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
            d = _digits(v)
            if len(d) >= 7:
                self.avoid_digits.add(d[-9:])

    def _ok(self, fake: str, raw: str) -> bool:
        if fake.lower() in self.avoid or fake in self.used or fake.lower() == raw.lower():
            return False
        d = _digits(fake)
        return len(d) < 7 or d[-9:] not in self.avoid_digits

    # -- normalisation: which raw values are "the same"
    @staticmethod
    def key(category: str, raw: str) -> str:
        if category == PHONE:
            for region in (None, *PHONE_REGIONS):
                try:
                    num = phonenumbers.parse(raw, region)
                except phonenumbers.NumberParseException:
                    continue
                if phonenumbers.is_valid_number(num):
                    return phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.E164)
            return _digits(raw)
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
                fd = _digits(fake)
                rd = _digits(raw)
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
                out = _fill_digits(raw, fd)
                return out if out is not None else fake
            if fake[:2].isalpha():  # IBAN: grouped like the raw one
                if " " in raw.strip():
                    return " ".join(fake[i:i + 4] for i in range(0, len(fake), 4))
                return fake
            out = _fill_digits(raw, _digits(fake))
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
            d = _digits(raw)
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
            found = _merge(found, detect_known(text, self._known_all))
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
    import bisect

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
