"""Pillow screenshots rendered from the same view tree the XML is written from.

Only Pillow's built-in font is used (no system fonts), so the same seed gives byte-identical images on
any machine with the same Pillow version.
"""

from __future__ import annotations

from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from mobilerl.env.sim import ui

WHITE = (255, 255, 255)
INK = (33, 33, 33)
GREY = (117, 117, 117)
DIVIDER = (224, 224, 224)
SIZES = {
    "toolbar_title": 56, "text_title": 54, "text_header": 48, "text_body": 44, "text_small": 36,
    "text_value": 48, "status_text": 36, "app_icon": 34, "button": 40, "button_flat": 40, "edit": 44,
    "edit_hint": 44, "edit_focused": 44, "checkbox": 42, "switch": 28, "tile": 32,
}


@lru_cache(maxsize=32)
def font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _text(d: ImageDraw.ImageDraw, b: ui.Box, text: str, size: int, fill, center: bool = False) -> None:
    if not text:
        return
    f = font(size)
    x1, y1, x2, y2 = b
    width = x2 - x1
    # Truncate with an ellipsis rather than spill out of the view, as a TextView would.
    if f.getlength(text) > width:
        while text and f.getlength(text + "…") > width:
            text = text[:-1]
        text += "…"
    y = y1 + max(0, (y2 - y1 - size) // 2)
    x = x1 + (max(0, (width - int(f.getlength(text))) // 2) if center else 0)
    d.text((x, y), text, font=f, fill=fill)


def render(device) -> Image.Image:
    app = device.current
    accent = app.color if app else (63, 81, 181)
    img = Image.new("RGB", (ui.SCREEN_W, ui.SCREEN_H), WHITE if app else (40, 53, 147))
    d = ImageDraw.Draw(img)
    _draw(d, device.tree(), accent)
    if device.keyboard:
        _keyboard(d)
    return img


def _draw(d: ImageDraw.ImageDraw, n: ui.Node, accent) -> None:
    if not n.visible:
        return
    b = n.bounds
    s = n.style
    if s == "statusbar":
        d.rectangle(b, fill=tuple(max(0, c - 40) for c in accent))
    elif s == "status_text":
        _text(d, b, n.text, SIZES[s], WHITE)
    elif s == "status_icon":
        d.rectangle((b[0] + 8, b[1] + 14, b[2] - 8, b[3] - 14), outline=WHITE, width=3)
    elif s == "toolbar":
        d.rectangle(b, fill=accent)
    elif s == "toolbar_title":
        _text(d, b, n.text, SIZES[s], WHITE)
    elif s in ("icon_back", "icon_toolbar"):
        _glyph(d, b, n.desc, WHITE)
    elif s == "fab":
        d.ellipse(b, fill=accent)
        _glyph(d, b, n.desc, WHITE)
    elif s in ("icon", "icon_minus", "icon_plus"):
        d.ellipse(b, outline=accent, width=4)
        _glyph(d, b, {"icon_minus": "-", "icon_plus": "+"}.get(s, n.desc), accent)
    elif s == "row":
        d.line((b[0] + 40, b[3] - 1, b[2], b[3] - 1), fill=DIVIDER, width=2)
        if n.selected:
            d.rectangle(b, fill=(227, 242, 253))
    elif s.startswith("avatar"):
        d.ellipse(b, fill=accent)
        _text(d, b, s[6:].upper(), 48, WHITE, center=True)
    elif s.startswith("text_"):
        _text(d, b, n.text, SIZES[s], GREY if s == "text_small" else INK)
    elif s in ("button", "button_flat"):
        if s == "button":
            d.rounded_rectangle(b, radius=24, fill=accent)
            _text(d, b, n.text.upper(), SIZES[s], WHITE, center=True)
        else:
            d.rounded_rectangle(b, radius=24, outline=accent, width=3)
            _text(d, b, n.text.upper(), SIZES[s], accent, center=True)
    elif s in ("edit", "edit_hint", "edit_focused"):
        d.line((b[0], b[3] - 4, b[2], b[3] - 4), fill=accent if s == "edit_focused" else GREY, width=4)
        _text(d, (b[0] + 8, b[1], b[2] - 8, b[3] - 8), n.text, SIZES[s], GREY if s == "edit_hint" else INK)
    elif s == "switch":
        track = (b[0] + 20, b[1] + 30, b[2] - 20, b[3] - 30)
        d.rounded_rectangle(track, radius=30, fill=accent if n.checked else (189, 189, 189))
        r = (track[3] - track[1]) // 2 + 8
        cx = track[2] - r + 8 if n.checked else track[0] + r - 8
        cy = (track[1] + track[3]) // 2
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=WHITE if not n.checked else (240, 240, 255),
                  outline=GREY)
    elif s == "checkbox":
        box = (b[0], b[1] + 30, b[0] + 70, b[1] + 100) if n.text else (b[0] + 50, b[1] + 20, b[0] + 120, b[1] + 90)
        d.rectangle(box, outline=accent, width=5, fill=accent if n.checked else None)
        if n.checked:
            d.line((box[0] + 14, box[1] + 36, box[0] + 30, box[1] + 52, box[0] + 56, box[1] + 18), fill=WHITE,
                   width=6)
        _text(d, (box[2] + 30, b[1], b[2], b[3]), n.text, SIZES[s], INK)
    elif s == "tile":
        d.rectangle(b, fill=tuple(min(255, c + 150) for c in accent), outline=accent)
        _text(d, (b[0] + 10, b[1] + 20, b[2] - 10, b[1] + 80), n.desc, SIZES[s], INK)
    elif s == "app_icon":
        cx = (b[0] + b[2]) // 2
        d.rounded_rectangle((cx - 80, b[1] + 20, cx + 80, b[1] + 180), radius=40, fill=(255, 255, 255))
        _text(d, (cx - 80, b[1] + 20, cx + 80, b[1] + 180), n.text[:1], 80, (63, 81, 181), center=True)
        _text(d, (b[0], b[1] + 195, b[2], b[3]), n.text, SIZES[s], WHITE, center=True)
    elif s == "scrim":
        d.rectangle(b, outline=(0, 0, 0), width=0)
    elif s == "modal":
        d.rectangle((b[0] + 6, b[1] + 6, b[2] + 6, b[3] + 6), fill=(90, 90, 90))
        d.rectangle(b, fill=WHITE, outline=(160, 160, 160), width=2)
    elif s == "progress":
        d.arc(b, start=0, end=270, fill=accent, width=16)
    for c in n.children:
        _draw(d, c, accent)


def _glyph(d: ImageDraw.ImageDraw, b: ui.Box, desc: str, fill) -> None:
    """A stand-in for an icon, drawn from its content description (the built-in font is ASCII only)."""
    x1, y1, x2, y2 = b
    cx, cy, r = (x1 + x2) // 2, (y1 + y2) // 2, max(8, min(x2 - x1, y2 - y1) // 4)
    if desc == "Navigate up":
        d.line((cx + r, cy, cx - r, cy), fill=fill, width=7)
        d.line((cx - r, cy, cx - r // 3, cy - r // 2 - 8), fill=fill, width=7)
        d.line((cx - r, cy, cx - r // 3, cy + r // 2 + 8), fill=fill, width=7)
        return
    if desc == "Save":
        d.line((cx - r, cy, cx - r // 3, cy + r // 1.5, cx + r, cy - r // 1.5), fill=fill, width=8)
        return
    if desc == "Search":
        d.ellipse((cx - r, cy - r, cx + r // 2, cy + r // 2), outline=fill, width=6)
        d.line((cx + r // 3, cy + r // 3, cx + r, cy + r), fill=fill, width=7)
        return
    if desc == "More options":
        for dy in (-r, 0, r):
            d.ellipse((cx - 6, cy + dy - 6, cx + 6, cy + dy + 6), fill=fill)
        return
    ch = {"Delete": "x", "Edit": "/"}.get(desc)
    if ch is None:
        ch = "+" if desc.lower().startswith(("add", "new", "create")) else (desc[:1] or "?")
    _text(d, b, ch if ch.isascii() else "?", 64, fill, center=True)


_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard(d: ImageDraw.ImageDraw) -> None:
    top = ui.SCREEN_H - ui.KEYBOARD_H
    d.rectangle((0, top, ui.SCREEN_W, ui.SCREEN_H), fill=(236, 239, 241))
    kw, kh = 100, 150
    for r, keys in enumerate(_ROWS):
        x0 = (ui.SCREEN_W - len(keys) * (kw + 8)) // 2
        y = top + 40 + r * (kh + 20)
        for i, ch in enumerate(keys):
            kb = (x0 + i * (kw + 8), y, x0 + i * (kw + 8) + kw, y + kh)
            d.rounded_rectangle(kb, radius=12, fill=WHITE)
            _text(d, kb, ch, 48, INK, center=True)
    d.rounded_rectangle((240, top + 560, 840, top + 700), radius=12, fill=WHITE)
