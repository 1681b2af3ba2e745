"""A labelled corpus for the privacy masker: realistic personal values across locales in realistic
contexts (positives, with the gold span), and hard negatives taken from UI text (no personal data).

Positives: per category, values drawn from real formats (valid checksums where real values have them:
Luhn cards, mod-97 IBANs, CN/FR/ES/IT/BR/KR/IN IDs, UPU S10 and passport MRZ check digits; phone numbers
valid for their region per ``phonenumbers``) in English and Chinese (and some German/French/Spanish)
sentences, UI labels and compressed-XML label/value lines. Values that are ambiguous on their own (a bare
passport or account number, a FedEx number, a WeChat id) appear the way apps show them: after a label.

Negatives: the UI text of every simulator screen the oracle reaches on one test task per template of both
suites — each line alone and each whole screen (context words act across lines), lines that hold a planted
personal value removed — and templated UI strings with
the numbers a phone screen is full of: bounds, times, dates, prices, counts, percentages, versions, build
ids, IPs, sizes, durations, codes, coordinates, ISBNs, IMEIs, and action strings.

:func:`build_corpus` is deterministic given its seed; tests and ``scripts/bench_privacy.py`` use it.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import phonenumbers

from mobilerl.data import checksums as K
from mobilerl.data import privacy as P
from mobilerl.data.privacy_rules import CN_PROV


@dataclass(frozen=True)
class Sample:
    text: str
    category: str | None  # None: a negative
    start: int = 0  # gold span (positives)
    end: int = 0
    kind: str = ""  # sub-kind (locale / format), for error analysis

    @property
    def value(self) -> str:
        return self.text[self.start:self.end]


def _place(template: str, value: str, category: str, kind: str) -> Sample:
    i = template.index("{v}")
    text = template.replace("{v}", value, 1)
    return Sample(text, category, i, i + len(value), kind)


def _xml_line(label: str, y: int = 1180) -> str:
    return f"TextView;;{label};[84,{y}][996,{y + 80}]"


def _xml_pair(label: str) -> str:
    return _xml_line(label, 1100) + "\n" + "TextView;;{v};[84,1180][996,1260]"


# ============================================================================ value generators


def _digits(rng: random.Random, n: int, first_nonzero: bool = True) -> str:
    s = "".join(rng.choice(string.digits) for _ in range(n))
    if first_nonzero and s[0] == "0":
        s = str(rng.randrange(1, 10)) + s[1:]
    return s


FIRST = ["emma", "liam", "olivia", "noah", "wei", "li", "zhang", "hiroshi", "yuki", "priya", "arjun",
         "fatima", "omar", "lucas", "sofia", "mateo", "lena", "jonas", "chloe", "hugo", "ines", "kwame"]
LAST = ["smith", "garcia", "nguyen", "kim", "patel", "muller", "rossi", "tanaka", "okafor", "silva",
        "chen", "wang", "liu", "dubois", "schmidt", "kowalski", "haddad", "lopez", "brown", "sato"]
DOMAINS = ["gmail.com", "outlook.com", "yahoo.com", "yahoo.co.jp", "163.com", "qq.com", "126.com",
           "web.de", "gmx.de", "orange.fr", "mail.ru", "proton.me", "icloud.com", "naver.com",
           "hotmail.co.uk", "acme-corp.com", "cs.stanford.edu", "uni-heidelberg.de", "sina.cn"]


def gen_email(rng: random.Random) -> tuple[str, str]:
    f, last = rng.choice(FIRST), rng.choice(LAST)
    style = rng.randrange(6)
    user = [f"{f}.{last}", f"{f}{last[0]}{rng.randrange(1, 99)}", f"{f[0]}{last}", f"{f}_{last}{rng.randrange(1990, 2005)}",
            _digits(rng, rng.randrange(6, 11)), f"{f}+{rng.choice(['news', 'shop', 'work'])}"][style]
    dom = rng.choice(DOMAINS) if style != 4 else rng.choice(["qq.com", "163.com"])
    if rng.random() < 0.1:
        user = user.capitalize()
    return f"{user}@{dom}", dom.split(".")[-1]


PHONE_REGIONS = ["US", "GB", "DE", "FR", "CN", "IN", "JP", "BR", "ES", "IT", "KR", "AU", "MX", "NL", "CA"]


def gen_phone(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.1:  # international, of a possible length but outside the metadata's ranges
        while True:
            region = rng.choice(PHONE_REGIONS)
            cc = phonenumbers.country_code_for_region(region)
            ex = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE)
            nsn = str(ex.national_number)[:2] + _digits(rng, len(str(ex.national_number)) - 2, False)
            num = phonenumbers.parse(f"+{cc}{nsn}", None)
            if phonenumbers.is_possible_number(num) and not phonenumbers.is_valid_number(num):
                return phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.INTERNATIONAL), f"{region}/unlisted"
    region = rng.choice(PHONE_REGIONS)
    ptype = rng.choice([phonenumbers.PhoneNumberType.MOBILE, phonenumbers.PhoneNumberType.FIXED_LINE])
    ex = phonenumbers.example_number_for_type(region, ptype) or phonenumbers.example_number(region)
    nsn = str(ex.national_number)
    for _ in range(200):
        keep = max(2, len(nsn) - rng.randrange(4, 7))
        cand = nsn[:keep] + _digits(rng, len(nsn) - keep, first_nonzero=False)
        num = phonenumbers.parse("+" + str(ex.country_code) + cand, None)
        if phonenumbers.is_valid_number(num):
            break
    else:
        num = ex
    fmt = rng.choice(["intl", "intl", "national", "e164", "custom"])
    if fmt == "intl":
        s = phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
    elif fmt == "national":
        s = phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.NATIONAL)
    elif fmt == "e164":
        s = phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.E164)
    else:
        nat = phonenumbers.format_number(num, phonenumbers.PhoneNumberFormat.NATIONAL)
        s = nat.replace(" ", rng.choice(["-", "."])) if region != "US" else f"{str(num.national_number)[:3]}.{str(num.national_number)[3:6]}.{str(num.national_number)[6:]}"
    return s, f"{region}/{fmt}"


def gen_cn_mobile(rng: random.Random) -> tuple[str, str]:
    while True:
        s = "1" + rng.choice("3456789") + _digits(rng, 9, False)
        if phonenumbers.is_valid_number(phonenumbers.parse(s, "CN")):
            return s, "CN/bare"


def gen_card(rng: random.Random) -> tuple[str, str]:
    brand, prefix, n = rng.choice([("visa", "4", 16), ("visa", "4", 16), ("mc", rng.choice(["51", "53", "55", "2221"]), 16),
                                   ("amex", rng.choice(["34", "37"]), 15), ("discover", "6011", 16),
                                   ("jcb", "35" + str(rng.randrange(28, 90)), 16), ("unionpay", "62", rng.choice([16, 19]))])
    body = prefix + _digits(rng, n - len(prefix) - 1, False)
    d = body + K.luhn_digit(body)
    sep = rng.choice(["", " ", " ", "-"])
    if brand == "amex":
        s = sep.join([d[:4], d[4:10], d[10:]]) if sep else d
    else:
        s = sep.join(d[i:i + 4] for i in range(0, len(d), 4)) if sep else d
    return s, f"card/{brand}"


IBAN_BBAN = {"DE": lambda r: _digits(r, 18, False), "GB": lambda r: r.choice(["NWBK", "BARC", "HBUK", "LOYD"]) + _digits(r, 14, False),
             "FR": lambda r: _digits(r, 10, False) + "".join(r.choice(string.ascii_uppercase + string.digits) for _ in range(11)) + _digits(r, 2, False),
             "ES": lambda r: _digits(r, 20, False), "IT": lambda r: r.choice(string.ascii_uppercase) + _digits(r, 10, False) + _digits(r, 12, False),
             "NL": lambda r: r.choice(["ABNA", "INGB", "RABO"]) + _digits(r, 10, False), "CH": lambda r: _digits(r, 17, False),
             "BE": lambda r: _digits(r, 12, False), "PL": lambda r: _digits(r, 24, False), "AT": lambda r: _digits(r, 16, False)}


def gen_iban(rng: random.Random) -> tuple[str, str]:
    cc = rng.choice(list(IBAN_BBAN))
    iban = K.iban_with_check(cc, IBAN_BBAN[cc](rng))
    if rng.random() < 0.5:
        iban = " ".join(iban[i:i + 4] for i in range(0, len(iban), 4))
    return iban, f"iban/{cc}"


def gen_passport(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["US", "GB", "CN", "DE", "FR", "IN", "JP"])
    if kind in ("US", "GB"):
        v = _digits(rng, 9)
    elif kind == "CN":
        v = rng.choice(["E", "G"]) + _digits(rng, 8, False) if rng.random() < 0.7 else "E" + rng.choice("ABCDEFGH") + _digits(rng, 7, False)
    elif kind == "DE":
        cs = "CFGHJKLMNPRTVWXYZ0123456789"
        v = rng.choice("CFGHJK") + "".join(rng.choice(cs) for _ in range(8))
        while sum(c.isdigit() for c in v) < 5:
            i = rng.randrange(1, 9)
            v = v[:i] + rng.choice(string.digits) + v[i + 1:]
    elif kind == "FR":
        v = _digits(rng, 2, False) + "".join(rng.choice(string.ascii_uppercase) for _ in range(2)) + _digits(rng, 5, False)
    elif kind == "IN":
        v = rng.choice(string.ascii_uppercase) + _digits(rng, 7)
    else:
        v = "".join(rng.choice(string.ascii_uppercase) for _ in range(2)) + _digits(rng, 7, False)
    return v, f"passport/{kind}"


def gen_mrz(rng: random.Random) -> tuple[str, str]:
    doc = _digits(rng, 9)
    nat = rng.choice(["USA", "GBR", "CHN", "DEU", "FRA"])
    dob = f"{rng.randrange(50, 99):02d}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}"
    exp = f"{rng.randrange(25, 35):02d}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}"
    line = doc + K.mrz_check(doc) + nat + dob + K.mrz_check(dob) + rng.choice("MF") + exp + K.mrz_check(exp) + "<" * 14
    line += "0" + K.mrz_check(line[:10] + line[13:20] + line[21:43] + "0")
    return line[:44], "passport/mrz"


def gen_national_id(rng: random.Random) -> tuple[str, str, bool]:
    """(value, kind, needs_context)."""
    kind = rng.choice(["CN", "CN", "US", "UK", "FR", "ES", "IT", "BR", "KR", "IN", "DE", "JP"])
    if kind == "CN":
        body = f"{rng.randrange(110000, 660000)}{rng.randrange(1950, 2010)}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}{_digits(rng, 3, False)}"
        return body + K.cn_id_check(body), "id/CN", False
    if kind == "US":
        while True:
            d = _digits(rng, 9)
            if K.ssn_ok(d):
                return f"{d[:3]}-{d[3:5]}-{d[5:]}", "id/US-SSN", False
    if kind == "UK":
        a = rng.choice("ABCEGHJKLMNPRSTWXYZ") + rng.choice("ABCEGHJKLMNPRSTWXYZ")
        if a in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ"):
            a = "AB"
        d = _digits(rng, 6, False)
        sp = rng.random() < 0.5
        return (f"{a} {d[:2]} {d[2:4]} {d[4:]} {rng.choice('ABCD')}" if sp else f"{a}{d}{rng.choice('ABCD')}"), "id/UK-NINO", False
    if kind == "FR":
        body = f"{rng.choice('12')}{rng.randrange(50, 99):02d}{rng.randrange(1, 13):02d}{rng.randrange(1, 96):02d}{_digits(rng, 3, False)}{_digits(rng, 3, False)}"
        key = 97 - int(body) % 97
        v = body + f"{key:02d}"
        if rng.random() < 0.5:
            v = f"{v[0]} {v[1:3]} {v[3:5]} {v[5:7]} {v[7:10]} {v[10:13]} {v[13:]}"
        return v, "id/FR-NIR", False
    if kind == "ES":
        n = rng.randrange(10**7, 10**8)
        return f"{n:08d}{K.DNI_LETTERS[n % 23]}", "id/ES-DNI", False
    if kind == "IT":
        body = "".join(rng.choice(string.ascii_uppercase) for _ in range(6)) + _digits(rng, 2, False) + rng.choice("ABCDEHLMPRST") + f"{rng.randrange(1, 71):02d}" + rng.choice(string.ascii_uppercase) + _digits(rng, 3, False)
        return body + K.it_cf_check(body), "id/IT-CF", False
    if kind == "BR":
        b = _digits(rng, 9)
        d = b + K.br_cpf_digits(b)
        return f"{d[:3]}.{d[3:6]}.{d[6:9]}-{d[9:]}", "id/BR-CPF", False
    if kind == "KR":
        b = f"{rng.randrange(50, 99):02d}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}{rng.choice('1234')}{_digits(rng, 5, False)}"
        d = b + K.kr_rrn_check(b)
        return f"{d[:6]}-{d[6:]}", "id/KR-RRN", False
    if kind == "IN":
        b = str(rng.randrange(2, 10)) + _digits(rng, 10, False)
        d = b + K.verhoeff_digit(b)
        return f"{d[:4]} {d[4:8]} {d[8:]}", "id/IN-Aadhaar", False
    if kind == "DE":
        return _digits(rng, 11), "id/DE-SteuerID", True
    return _digits(rng, 12), "id/JP-MyNumber", True


def gen_plate(rng: random.Random) -> tuple[str, str, bool]:
    kind = rng.choice(["CN", "CN", "FR", "UK", "DE", "US"])
    up = "ABCDEFGHJKLMNPRSTUVWXYZ"
    if kind == "CN":
        prov = rng.choice(CN_PROV)
        tail = "".join(rng.choice(up + string.digits) for _ in range(rng.choice([5, 5, 6])))
        if not any(c.isdigit() for c in tail):
            tail = tail[:-1] + "7"
        sep = rng.choice(["", "·", " "])
        return f"{prov}{rng.choice(up)}{sep}{tail}", "plate/CN", False
    if kind == "FR":
        letters = "ABCDEFGHJKLMNPQRSTVWXYZ"
        return f"{rng.choice(letters)}{rng.choice(letters)}-{_digits(rng, 3)}-{rng.choice(letters)}{rng.choice(letters)}", "plate/FR", False
    if kind == "UK":
        letters = "ABCDEFGHJKLMNOPRSTUVWXY"
        return f"{rng.choice(letters)}{rng.choice(letters)}{rng.choice(['02', '51', '12', '62', '19', '69', '23', '73'])} {''.join(rng.choice('ABCDEFGHJKLMNOPRSTUVWXYZ') for _ in range(3))}", "plate/UK", False
    if kind == "DE":
        city = rng.choice(["B", "M", "HH", "K", "F", "S", "DO", "HD", "MZ"])
        return f"{city}-{''.join(rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ') for _ in range(rng.randrange(1, 3)))} {rng.randrange(1, 9999)}", "plate/DE", False
    style = rng.randrange(3)
    if style == 0:
        v = f"{rng.randrange(1, 9)}{''.join(rng.choice(up) for _ in range(3))}{_digits(rng, 3, False)}"
    elif style == 1:
        v = f"{''.join(rng.choice(up) for _ in range(3))}-{_digits(rng, 4)}"
    else:
        v = f"{''.join(rng.choice(up) for _ in range(3))} {_digits(rng, 4)}"
    return v, "plate/US", True


def gen_tracking(rng: random.Random) -> tuple[str, str, bool]:
    kind = rng.choice(["UPS", "USPS", "FedEx", "DHL", "S10", "SF", "YT", "JT", "sim-UPS"])
    an = "0123456789ABCDEFGHJKLMNPRSTVWXY"
    if kind == "UPS":
        return "1Z" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(6)) + _digits(rng, 10, False), "track/UPS", False
    if kind == "sim-UPS":
        return "1Z" + "".join(rng.choice(an) for _ in range(16)), "track/UPS-sim", False
    if kind == "USPS":
        v = rng.choice(["9400", "9205", "9261", "9405"]) + _digits(rng, 18, False)
        if rng.random() < 0.4:
            v = " ".join(v[i:i + 4] for i in range(0, len(v), 4))
        return v, "track/USPS", False
    if kind == "FedEx":
        return _digits(rng, rng.choice([12, 15])), "track/FedEx", True
    if kind == "DHL":
        return _digits(rng, 10), "track/DHL", True
    if kind == "S10":
        d = _digits(rng, 8, False)
        return rng.choice(["RR", "LX", "EE", "CP", "RB"]) + d + K.s10_check(d) + rng.choice(["CN", "US", "DE", "GB", "FR"]), "track/S10", False
    if kind == "SF":
        return "SF" + _digits(rng, rng.choice([12, 13])), "track/SF", False
    if kind == "YT":
        return "YT" + _digits(rng, 13), "track/YTO", False
    return "JT" + _digits(rng, 13), "track/JT", False


def gen_order(rng: random.Random) -> tuple[str, str, bool]:
    kind = rng.choice(["amazon", "W", "AB", "hash", "taobao", "ORD", "JD"])
    if kind == "amazon":
        return f"{_digits(rng, 3)}-{_digits(rng, 7)}-{_digits(rng, 7)}", "order/amazon", False
    if kind == "W":
        return f"W{_digits(rng, 9)}", "order/W", True
    if kind == "AB":
        return f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}-{_digits(rng, 6)}", "order/AB", True
    if kind == "hash":
        return f"{_digits(rng, rng.randrange(6, 10))}", "order/num", True
    if kind == "taobao":
        return _digits(rng, 19), "order/taobao", True
    if kind == "ORD":
        return f"ORD-{rng.randrange(2019, 2025)}-{_digits(rng, 6, False)}", "order/ORD", True
    return _digits(rng, 12), "order/JD", True


def gen_social(rng: random.Random) -> tuple[str, str, bool]:
    f, last = rng.choice(FIRST), rng.choice(LAST)
    kind = rng.choice(["handle", "url", "wechat", "qq", "discord", "telegram", "weibo"])
    user = rng.choice([f"{f}_{last}", f"{f}.{last}{rng.randrange(1, 99)}", f"{f}{last}", f"the_{f}_{rng.randrange(10, 999)}"])
    if kind == "handle":
        return "@" + user, "social/handle", False
    if kind == "url":
        site = rng.choice(["twitter.com", "x.com", "instagram.com", "github.com", "linkedin.com/in", "tiktok.com/@", "t.me", "facebook.com"])
        u = f"{'https://' if rng.random() < 0.5 else ''}{'www.' if rng.random() < 0.3 and site[0] != 't' else ''}{site}{'' if site.endswith('@') else '/'}{user}"
        return u, "social/url", False
    if kind == "wechat":
        return rng.choice([f"wxid_{''.join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(12))}", f"{f}{last}{rng.randrange(10, 99)}"]), "social/wechat", True
    if kind == "qq":
        return _digits(rng, rng.randrange(6, 11)), "social/qq", True
    if kind == "discord":
        return f"{f}{rng.randrange(1, 99)}#{_digits(rng, 4, False)}", "social/discord", False
    if kind == "telegram":
        return "@" + user, "social/telegram", False
    return user, "social/weibo", True


# ============================================================================ contexts

T_ANY = ["{v}", _xml_line("{v}"), "TextView;;{v};[120,640][960,720]"]
T_EMAIL = ["Email: {v}", "邮箱：{v}", "Send the report to {v} by Friday.", "Contact us at {v}.", "E-Mail-Adresse: {v}",
           "Courriel : {v}", "请发送至{v}，谢谢", "Use my work one: {v}", "Signed in as {v}", _xml_pair("Email"),
           "do(action=\"Type\", text=\"{v}\")", "Hello, Emma from Acme here. Please send the signed contract to {v}"] + T_ANY
T_PHONE = ["Call me at {v}", "电话：{v}", "手机 {v}", "Phone: {v}", "Mobile {v} (work)", "Tel. {v}", "Rufen Sie {v} an",
           "Appelez le {v}", "My new number is {v}, save it!", "联系电话:{v}", _xml_pair("Phone"), _xml_pair("Mobile"),
           "do(action=\"Type\", text=\"{v}\")", "Create a new contact for Emma Smith. Their number is {v}.",
           "Update the phone number of Liam Chen to {v}."] + T_ANY
T_PHONE_CTX = ["Phone: {v}", "手机号：{v}", "电话 {v}", "Tel: {v}", _xml_pair("Phone"), "Call {v}"]
T_CARD = ["Card number: {v}", "卡号：{v}", "Visa •••• {v}", "Pay with {v}", "信用卡 {v}", _xml_pair("Card number"),
          "Kartennummer {v}"] + T_ANY
T_IBAN = ["IBAN: {v}", "Please transfer to {v} (Sparkasse)", "Kontoverbindung: IBAN {v}", "RIB / IBAN : {v}",
          _xml_pair("IBAN")] + T_ANY
T_ACCT = ["Account number: {v}", "账号：{v}", "Account no. {v}", "Kontonummer {v}", "Bank account {v}",
          "Routing number 021000021, account {v}", "银行账户 {v}", _xml_pair("Account number"), "A/C {v}",
          "Numéro de compte : {v}", "Número de cuenta: {v}"]
T_PASSPORT = ["Passport No.: {v}", "护照号码：{v}", "Passport number {v}", "Numéro de passeport : {v}",
              "Reisepass-Nr. {v}", "Passport: {v} (expires 2031)", "Pasaporte n.º {v}", "护照 {v}",
              _xml_pair("Passport No."), _xml_pair("Passport number"), "旅券番号 {v}"]
T_ID = ["ID number: {v}", "身份证号：{v}", "SSN {v}", "National Insurance number: {v}", "DNI {v}",
        "Codice fiscale: {v}", "CPF: {v}", "Aadhaar {v}", "主民 {v}", _xml_pair("ID number")] + T_ANY
T_ID_CTX = ["Steuer-ID: {v}", "Steuerliche Identifikationsnummer {v}", "マイナンバー {v}", "My Number: {v}",
            "ID number: {v}", "個人番号：{v}", _xml_pair("Tax ID")]
T_PLATE = ["车牌号：{v}", "License plate: {v}", "Plate {v}", "Kennzeichen: {v}", "Immatriculation : {v}",
           "Your driver arrives in a Toyota Camry, plate {v}", _xml_pair("License plate")]
T_PLATE_ANY = T_ANY + ["车辆 {v} 已进入停车场", "Parking: {v} at level 2"]
T_TRACK = ["Tracking number: {v}", "Your package {v} is out for delivery", "运单号：{v}", "快递单号 {v}",
           "Sendungsnummer {v}", "Tracking number is {v} (FedEx), should arrive Thursday", "UPS: Package {v} is out for delivery today.",
           "Track it with DHL tracking number {v}.", "Numéro de suivi : {v}", _xml_pair("Tracking number")]
T_TRACK_ANY = T_TRACK + T_ANY
T_ORDER = ["Order #{v}", "订单号：{v}", "Your order {v} has shipped.", "Bestellnummer: {v}", "Numéro de commande : {v}",
           "Order ID {v}", "Amazon: Your order #{v} has shipped. Track it with UPS.", "订单编号 {v}",
           _xml_pair("Order number"), "Número de pedido {v}"]
T_ORDER_ANY = T_ORDER + T_ANY
T_SOCIAL = ["Follow me {v}", "Instagram: {v}", "关注我 {v}", "Find me at {v}", "DM {v} for details", "Twitter {v}"] + T_ANY
T_SOCIAL_CTX = ["WeChat: {v}", "微信号：{v}", "QQ: {v}", "QQ号 {v}", "Weibo: {v}", "Add me on WeChat {v}", _xml_pair("WeChat ID"),
                "Telegram {v}", "Username: {v}"]


def positives(rng: random.Random, n_per_category: int = 300) -> list[Sample]:
    out: list[Sample] = []
    for _ in range(n_per_category):
        v, kind = gen_email(rng)
        out.append(_place(rng.choice(T_EMAIL), v, P.EMAIL, kind))
    for i in range(n_per_category):
        if i % 6 == 0:
            v, kind = gen_cn_mobile(rng)
            out.append(_place(rng.choice(T_PHONE), v, P.PHONE, kind))
            continue
        v, kind = gen_phone(rng)
        t = rng.choice(T_PHONE if "e164" in kind or "intl" in kind or " " in v or "-" in v or "." in v or "(" in v else T_PHONE_CTX)
        out.append(_place(t, v, P.PHONE, kind))
    for i in range(n_per_category):
        r = i % 3
        if r == 0:
            v, kind = gen_card(rng)
            out.append(_place(rng.choice(T_CARD), v, P.BANK_ACCOUNT, kind))
        elif r == 1:
            v, kind = gen_iban(rng)
            out.append(_place(rng.choice(T_IBAN), v, P.BANK_ACCOUNT, kind))
        else:
            v = rng.choice([_digits(rng, rng.randrange(8, 13)), f"{_digits(rng, 4)} {_digits(rng, 4)}",
                            "62" + _digits(rng, 17, False), f"{_digits(rng, 3)}-{_digits(rng, 6)}-{_digits(rng, 1)}"])
            out.append(_place(rng.choice(T_ACCT), v, P.BANK_ACCOUNT, "account/context"))
    for i in range(n_per_category):
        if i % 10 == 0:
            v, kind = gen_mrz(rng)
            out.append(_place(rng.choice(["{v}", "P<USASMITH<<EMMA<<<<<<<<<<<<<<<<<<<<<<<<<<<<\n{v}"]), v, P.PASSPORT, kind))
            continue
        v, kind = gen_passport(rng)
        out.append(_place(rng.choice(T_PASSPORT), v, P.PASSPORT, kind))
    for _ in range(n_per_category):
        v, kind, ctx = gen_national_id(rng)
        out.append(_place(rng.choice(T_ID_CTX if ctx else T_ID), v, P.NATIONAL_ID, kind))
    for _ in range(n_per_category):
        v, kind, ctx = gen_plate(rng)
        out.append(_place(rng.choice(T_PLATE if ctx else T_PLATE + T_PLATE_ANY), v, P.VEHICLE_PLATE, kind))
    for _ in range(n_per_category):
        v, kind, ctx = gen_tracking(rng)
        out.append(_place(rng.choice(T_TRACK if ctx else T_TRACK_ANY), v, P.TRACKING_NUMBER, kind))
    for _ in range(n_per_category):
        v, kind, ctx = gen_order(rng)
        out.append(_place(rng.choice(T_ORDER if ctx else T_ORDER_ANY), v, P.ORDER_NUMBER, kind))
    for _ in range(n_per_category):
        v, kind, ctx = gen_social(rng)
        out.append(_place(rng.choice(T_SOCIAL_CTX if ctx else T_SOCIAL), v, P.SOCIAL_ACCOUNT, kind))
    return out


# ============================================================================ hard negatives


def _neg_templates(rng: random.Random) -> list[str]:
    r = rng
    d = lambda n: _digits(r, n)  # noqa: E731
    b = lambda: f"[{r.randrange(0, 1000)},{r.randrange(0, 2400)}][{r.randrange(100, 1080)},{r.randrange(100, 2400)}]"  # noqa: E731
    hh, mm = r.randrange(0, 24), r.randrange(0, 60)
    y, mo, da = r.randrange(1990, 2030), r.randrange(1, 13), r.randrange(1, 29)
    price = f"{r.randrange(1, 99999)}.{r.randrange(0, 100):02d}"
    big = f"{r.randrange(1, 999)},{r.randrange(0, 1000):03d},{r.randrange(0, 1000):03d}"
    return [
        f"{hh:02d}:{mm:02d}", f"{hh % 12 or 12}:{mm:02d} {'AM' if hh < 12 else 'PM'}", f"{y}-{mo:02d}-{da:02d}",
        f"{da:02d}/{mo:02d}/{y}", f"{mo}/{da}/{y % 100:02d}", f"{y}年{mo}月{da}日 {hh:02d}:{mm:02d}",
        f"Oct {da}, {y} at {hh:02d}:{mm:02d}", f"{y}-{mo:02d}-{da:02d} {hh:02d}:{mm:02d}:{r.randrange(60):02d}",
        f"${price}", f"€ {price.replace('.', ',')}", f"¥{r.randrange(1, 99999)}", f"Total: ${big}.00", f"£{r.randrange(1, 999)}.{r.randrange(100):02d}",
        f"{r.randrange(1, 100)}%", f"Battery {r.randrange(1, 101)} percent.", f"{r.randrange(1, 999)}.{r.randrange(10)} MB",
        f"{r.randrange(1, 512)} GB of {r.choice([64, 128, 256, 512])} GB used", f"v{r.randrange(1, 20)}.{r.randrange(0, 30)}.{r.randrange(0, 300)}",
        f"Version {r.randrange(1, 20)}.{r.randrange(0, 99)}.{r.randrange(0, 9999)} (build {d(6)})",
        f"Build number TQ3A.{y % 100:02d}{mo:02d}{da:02d}.{d(3)}", f"Android {r.randrange(8, 15)}",
        f"Security patch: {y}-{mo:02d}-05", f"Kernel 5.{r.randrange(4, 16)}.{r.randrange(1, 200)}-android{r.randrange(11, 15)}",
        f"{r.randrange(1, 255)}.{r.randrange(0, 255)}.{r.randrange(0, 255)}.{r.randrange(1, 255)}",
        f"fe80::{d(4)}:{d(4)}", f"Port {r.randrange(1024, 65535)}", f"{r.randrange(1, 24)} h {r.randrange(60)} min",
        f"{r.randrange(0, 3):02d}:{r.randrange(60):02d}:{r.randrange(60):02d}", f"{r.randrange(1, 999)} steps",
        f"{big} views", f"{r.randrange(1, 999)}K followers", f"{r.randrange(1, 99)}.{r.randrange(10)}k likes",
        f"Page {r.randrange(1, 50)} of {r.randrange(50, 500)}", f"{r.randrange(1, 99)} unread messages",
        f"Your verification code is {d(6)}. It expires in 10 minutes.", f"Door code is {d(4)}#, I'm on the 3rd floor",
        f"My flight UA {r.randrange(100, 2000)} lands at {r.randrange(1, 12)}:{r.choice(['05', '20', '45'])} pm",
        f"Chase alert: A charge of ${r.randrange(5, 400)}.{r.randrange(10, 99)} at STARBUCKS #{d(4)} was made on your card ending in {d(4)}.",
        f"ISBN 978-{r.randrange(0, 2)}-{d(3)}-{d(5)}-{r.randrange(10)}", f"IMEI {'35' + d(13)}",
        f"Serial number R58{d(3)}{''.join(r.choice('ABCDEFGHJK') for _ in range(4))}", f"Model SM-G{d(3)}B",
        f"#{''.join(r.choice('0123456789ABCDEF') for _ in range(6))}", f"{r.randrange(1080, 4000)}x{r.randrange(720, 3000)}",
        f"{r.randrange(-90, 90)}.{d(6)}, {r.randrange(-180, 180)}.{d(6)}", f"Temperature {r.randrange(-10, 40)}°C",
        f"Downloading… {r.randrange(1, 100)}% ({r.randrange(1, 900)} MB / {r.randrange(900, 2000)} MB)",
        f"Item {r.randrange(1, 99)} of {r.randrange(100, 999)}", f"Qty: {r.randrange(1, 20)}", f"Room {r.randrange(100, 999)}",
        f"Bus {r.randrange(1, 400)} arrives in {r.randrange(1, 30)} min", f"Gate B{r.randrange(1, 60)}, seat {r.randrange(1, 40)}{r.choice('ABCDEF')}",
        f"{r.randrange(1, 12)} items · ${price}", f"Score {r.randrange(0, 200)}-{r.randrange(0, 200)}",
        f"Population 1.{d(3)}.{d(3)}", f"{r.randrange(1, 99)} {d(3)} {d(3)} habitants", f"{y}–{y + r.randrange(1, 10)}",
        f"Timestamp {r.randrange(1500000000, 1800000000)}", f"Uploaded {r.randrange(1500000000000, 1800000000000)}",
        f"do(action=\"Tap\", element=[{r.randrange(1000)},{r.randrange(2400)},{r.randrange(1000)},{r.randrange(2400)}])",
        "do(action=\"Swipe\", direction=\"up\", dist=\"medium\")", "do(action=\"Launch\", app=\"SMS Messenger\")",
        f"do(action=\"Type\", text=\"{r.choice(['groceries', 'Meeting notes', 'hello world', '42', 'tomorrow 3pm'])}\")",
        f"finish(message=\"{r.randrange(1, 99)}\")", f"TextView;;{r.choice(['Settings', 'Network & internet', 'Display', 'Storage'])};{b()}",
        f"Button;clickable focusable;Save;{b()}", f"EditText;clickable focusable;Search;{b()}",
        f"TextView;;{r.randrange(1, 31)} {r.choice(['Jan', 'Feb', 'Mar', 'Oct'])} {y};{b()}",
        f"{r.randrange(1, 5)} stars · {r.randrange(1, 9999)} reviews", f"Ref. {r.choice(['A', 'B'])}{r.randrange(1, 99)}",
        f"Chapter {r.randrange(1, 30)}, verse {r.randrange(1, 50)}", f"{r.randrange(1, 60)} km · {r.randrange(1, 90)} min",
        f"Sort order: {r.choice(['Name', 'Date', 'Size'])}", "Order by date", "In order to continue, tap Next",
        f"{r.randrange(1, 30)} orders this month", f"Track {r.randrange(1, 20)} of {r.randrange(20, 30)}",
        f"Album · {y} · {r.randrange(8, 20)} tracks", "Account settings", "Add account",
        f"Phone storage {r.randrange(1, 128)} GB free", "About phone", f"Call log ({r.randrange(1, 99)})",
        f"Package size {r.randrange(1, 999)} KB", f"WeChat Pay · ¥{r.randrange(1, 999)}.{r.randrange(100):02d}",
        f"ID {r.randrange(1, 999)}", f"Plate {r.randrange(1, 9)}", f"{r.randrange(1, 9)} passports scanned",
        f"Meeting @ {r.randrange(1, 12)}pm", "Reply @everyone", "icon@2x.png", "logo@3x.webp",
        f"git commit {''.join(r.choice('0123456789abcdef') for _ in range(7))}", f"Pixel {r.randrange(4, 9)} Pro",
        f"{r.randrange(2, 9)} GB RAM · {r.randrange(64, 512)} GB", f"Wi-Fi 5 GHz · {r.randrange(100, 999)} Mbps",
        f"Bluetooth {r.randrange(4, 6)}.{r.randrange(0, 3)}", f"Lat {r.randrange(10, 60)}.{d(4)} Lon {r.randrange(10, 150)}.{d(4)}",
        f"第{r.randrange(1, 99)}页", f"共{r.randrange(1, 999)}条评论", f"已售{r.randrange(1, 99999)}件", f"库存 {r.randrange(1, 9999)} 件",
        f"¥{r.randrange(1, 9999)}.{r.randrange(100):02d} 起", f"{r.randrange(1, 12)}月{r.randrange(1, 28)}日 周{r.choice('一二三四五六日')}",
        f"剩余 {r.randrange(1, 99)}%", f"版本 {r.randrange(1, 12)}.{r.randrange(0, 20)}.{r.randrange(0, 99)}",
        f"Invoice total {big}", f"Amount {r.randrange(1000, 99999)}.00 USD", f"{d(4)} {d(4)}",
        f"{r.randrange(100, 999)} {r.randrange(100, 999)} {r.randrange(100, 999)}", f"Code {d(6)}",
        f"Recording_{y}{mo:02d}{da:02d}_{hh:02d}{mm:02d}{r.randrange(60):02d}.m4a", f"IMG_{y}{mo:02d}{da:02d}_{d(6)}.jpg",
        f"Screenshot_{y}{mo:02d}{da:02d}-{hh:02d}{mm:02d}{r.randrange(60):02d}.png", f"PXL_{y}{mo:02d}{da:02d}_{d(9)}.mp4",
        f"bank_statement_sep_{y}.pdf", f"receipt_{y}_{d(4)}.pdf", f"{r.randrange(1, 99)}-{r.randrange(1, 99)}-{r.randrange(1, 99)}",
    ]


def _sim_negatives(rng: random.Random, n_tasks: int = 200) -> tuple[list[str], list[str]]:
    """UI lines, and whole screens (compressed XML), of simulator screens reached by the oracle on the test
    tasks of both suites (one per template), without the lines that hold a planted personal value."""
    try:
        from mobilerl.env.sim.env import SimEnv
        from mobilerl.env.sim.screen import Screen
        from mobilerl.env.sim.tasks.base import OracleAgent
        from mobilerl.env.sim.tasks.registry import SUITES, list_tasks
        from mobilerl.env.xml import compress_xml
    except ImportError:  # pragma: no cover
        return [], []
    tasks = [t for s in SUITES for t in list_tasks(s, "test", n=1, with_optimal=False)]
    rng.shuffle(tasks)
    lines: set[str] = set()
    screens: set[str] = set()
    for task in tasks[:n_tasks]:
        env = SimEnv(perturb="none")
        obs = env.reset(task)
        agent = OracleAgent(env.tmpl, task.params)  # type: ignore[arg-type]
        canaries = env.canaries(materialize=True)
        for _ in range(task.max_steps):
            keep = [line for line in compress_xml(obs.xml, width=obs.width, height=obs.height).splitlines()
                    if not any(c in line for c in canaries)
                    and not any(c.split()[0] in line for c in canaries if " " in c)]
            lines.update(keep)
            screens.add("\n".join(keep))
            try:
                a = agent.act(Screen(obs.xml, obs.app, obs.width, obs.height))
                res = env.step(a)
            except Exception:  # noqa: BLE001
                break
            obs = res.observation
            if res.done:
                break
    return sorted(lines), sorted(screens)


_PII_WORDS = ("@", "Tracking", "tracking", "Package", "order #", "Order #")


def negatives(rng: random.Random, n_templated: int = 2000, sim: bool = True) -> list[Sample]:
    out = [Sample(t, None, kind="ui/templated") for _ in range(max(1, n_templated // 120)) for t in _neg_templates(rng)]
    out = out[:n_templated]
    if sim:
        lines, screens = _sim_negatives(rng)
        out.extend(Sample(line, None, kind="ui/simulator-line") for line in lines)
        out.extend(Sample(screen, None, kind="ui/simulator-screen") for screen in screens)
    return out


def build_corpus(seed: int = 0, n_per_category: int = 300, n_negatives: int = 2000, sim: bool = True) -> list[Sample]:
    """The labelled corpus: positives of every category, then hard negatives."""
    rng = random.Random(seed)
    return positives(rng, n_per_category) + negatives(rng, n_negatives, sim=sim)


def evaluate(samples: list[Sample], detect=None) -> dict:
    """Per-category recall (the gold span fully covered by a detected span; ``exact``: of the right
    category), false-positive rate over negatives, and the misses / false positives for inspection."""
    detect = detect or P.detect
    per: dict[str, dict] = {}
    fps: list[tuple[str, list]] = []
    n_neg = 0
    for s in samples:
        spans = detect(s.text)
        if s.category is None:
            n_neg += 1
            if spans:
                fps.append((s.text, [(s.text[x.start:x.end], x.category, x.rule) for x in spans]))
            continue
        st = per.setdefault(s.category, {"n": 0, "covered": 0, "exact": 0, "misses": []})
        st["n"] += 1
        cover = [x for x in spans if x.start <= s.start and x.end >= s.end]
        if cover:
            st["covered"] += 1
            if any(x.category == s.category for x in cover):
                st["exact"] += 1
            else:
                st["misses"].append(("wrong-category", s.kind, s.text, [(x.category, x.rule) for x in cover]))
        else:
            st["misses"].append(("missed", s.kind, s.text, [(s.text[x.start:x.end], x.category) for x in spans]))
    return {
        "recall": {c: v["covered"] / v["n"] for c, v in per.items()},
        "recall_exact_category": {c: v["exact"] / v["n"] for c, v in per.items()},
        "n_positives": {c: v["n"] for c, v in per.items()},
        "n_negatives": n_neg,
        "false_positive_rate": len(fps) / max(1, n_neg),
        "false_positives": fps,
        "misses": {c: v["misses"] for c, v in per.items()},
    }
