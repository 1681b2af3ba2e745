"""Personal data in text: the rule detector (:func:`detect`) and exact known values (:func:`detect_known`).

:func:`detect` finds nine categories (``EMAIL``, ``PHONE``, ``BANK_ACCOUNT``, ``PASSPORT``, ``NATIONAL_ID``,
``VEHICLE_PLATE``, ``TRACKING_NUMBER``, ``ORDER_NUMBER``, ``SOCIAL_ACCOUNT``) with rules, checksum
validators and context words; a context word may sit on the previous line of a compressed XML dump (a
label/value pair). Ordinary UI text (bounds, times, prices, versions, …) is left alone; overlaps go to the
validated format, then the longer span. Names and postal addresses, which no rule finds, are known values
(``PERSON_NAME``, ``ADDRESS``). Per category: docs/data_schema.md, "Notes moved from module docstrings".
Validators: :mod:`mobilerl.data.checksums`, :mod:`mobilerl.data.privacy_phone`; masking:
:mod:`mobilerl.data.privacy`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from mobilerl.data.checksums import (
    br_cpf_ok,
    card_ok,
    cn_id_ok,
    es_dni_ok,
    fr_nir_ok,
    iban_ok,
    it_cf_ok,
    kr_rrn_ok,
    mrz_check,
    only_digits,
    s10_check,
    ssn_ok,
    verhoeff_ok,
)
from mobilerl.data.privacy_phone import DATE_LIKE, IPV4, phone_matches, phone_value_ok

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

CN_PROV = "京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼"

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


@dataclass(frozen=True)
class _Rule:
    name: str
    category: str
    pattern: re.Pattern[str]
    priority: int
    check: object = None  # callable(str) -> bool on the value group
    gate: str = "digits"  # cheap precondition on the text (see _gates)


def _card_value(v: str) -> bool:
    return card_ok(only_digits(v))


def _ctx_account(v: str) -> bool:
    d = only_digits(v)
    return 6 <= len(d) <= 20 and not DATE_LIKE.match(v.strip()) and not IPV4.match(v.strip())


def _ctx_phone(v: str) -> bool:
    return phone_value_ok(v.strip(), context=True)


def _ctx_tracking(v: str) -> bool:
    d = only_digits(v)
    return len(d) >= 8 and len(v.replace(" ", "")) >= 8 and not DATE_LIKE.match(v)


def _ctx_order(v: str) -> bool:
    s = v.lstrip("#")
    d = only_digits(s)
    return len(d) >= 4 and len(s) >= 5 and not DATE_LIKE.match(s)


def _ctx_natid(v: str) -> bool:
    d = only_digits(v)
    return len(d) >= 6 and not DATE_LIKE.match(v.strip())


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
    return ssn_ok(only_digits(v))


def _aadhaar(v: str) -> bool:
    d = only_digits(v)
    return len(d) == 12 and d[0] not in "01" and verhoeff_ok(d)


def _nino(v: str) -> bool:
    return v.replace(" ", "")[:2].upper() not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ")


def _cn_id(v: str) -> bool:
    return cn_id_ok(v)


def _s10(v: str) -> bool:
    return s10_check(v[2:10]) == v[10]


def _imbp(v: str) -> bool:
    return 20 <= len(only_digits(v)) <= 22


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
        r"(?P<v>[" + CN_PROV + r"][A-HJ-NP-Z][·• ]?[A-HJ-NP-Z0-9]{4,5}[A-HJ-NP-Z0-9挂学警港澳])" + _NA), 90, gate="prov"),
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
_PROV = re.compile("[" + CN_PROV + "]")
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
        claimed = [(o.start, o.end) for _, o in out]
        out.extend((60, Span(a, b, PHONE, "phone")) for a, b in phone_matches(text, claimed))
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
_HOT = re.compile(r"\d\d|@|#|P<|1Z|[" + CN_PROV + r"]|(?i:\.(?:com|me|net|social)/)")
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


def merge_spans(primary: list[Span], extra: list[Span]) -> list[Span]:
    """``primary`` spans win; ``extra`` spans overlapping one are dropped."""
    if not extra:
        return primary
    out = list(primary)
    for sp in extra:
        if not any(sp.start < t.end and t.start < sp.end for t in out):
            out.append(sp)
    out.sort(key=lambda s: s.start)
    return out

