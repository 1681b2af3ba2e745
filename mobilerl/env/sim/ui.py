"""View tree, widget kit, layout and uiautomator XML for the simulator.

Apps describe a page as a :class:`Page` of widget specs (toolbar, a vertically scrolling body, an optional
bottom bar, FAB and dialog). :func:`layout_page` turns it into a tree of :class:`Node` with absolute pixel
bounds, the way Android's view hierarchy looks to uiautomator: layout-only containers, scroll views whose
children run past the screen (their bounds then lie outside the viewport, as off-screen nodes do on a real
dump), and event handlers attached to the nodes that take input. :func:`to_xml` writes the full
uiautomator attribute set; the screenshot is rendered from the same tree (:mod:`.render`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mobilerl.env.xml import xml_attr

Box = tuple[int, int, int, int]
Handler = Callable[[], None] | None

SCREEN_W, SCREEN_H = 1080, 2400
STATUS_H = 84
TOOLBAR_H = 168
NAV_H = 0  # gesture navigation: no on-screen nav bar
KEYBOARD_H = 840
BOTTOM_BAR_H = 170


@dataclass(slots=True, eq=False)
class Node:
    cls: str = "android.widget.FrameLayout"
    text: str = ""
    desc: str = ""
    rid: str = ""
    bounds: Box = (0, 0, 0, 0)
    clickable: bool = False
    long_clickable: bool = False
    checkable: bool = False
    checked: bool = False
    focusable: bool = False
    focused: bool = False
    scrollable: bool = False
    selected: bool = False
    password: bool = False
    enabled: bool = True
    package: str = ""
    style: str = ""  # rendering hint
    children: list[Node] = field(default_factory=list)
    on_tap: Handler = None
    on_long: Handler = None
    visible: bool = True  # False for nodes scrolled out of their parent's viewport

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()


# ----------------------------------------------------------------------------------------- widget specs
@dataclass(slots=True)
class Text:
    text: str
    rid: str = ""
    desc: str = ""
    size: str = "body"  # "title" | "body" | "small" | "header"
    height: int = 0


@dataclass(slots=True)
class Row:
    """A list item: title, optional subtitle, optional trailing widget (switch/checkbox/icon)."""

    title: str
    subtitle: str = ""
    on_tap: Handler = None
    on_long: Handler = None
    rid: str = "item"
    desc: str = ""
    trailing: object | None = None
    selected: bool = False
    icon: str = ""  # content-desc of a leading icon, if any
    avatar: bool = False  # a leading letter avatar with no content-desc (as most list apps draw it)


@dataclass(slots=True)
class Switch:
    label: str
    checked: bool
    on_toggle: Handler
    rid: str = "switch"
    subtitle: str = ""


@dataclass(slots=True)
class Checkbox:
    label: str
    checked: bool
    on_toggle: Handler
    rid: str = "checkbox"


@dataclass(slots=True)
class Field:
    """An EditText bound to ``page.fields[key]``; tapping it focuses it and raises the keyboard."""

    key: str
    hint: str
    value: str = ""
    rid: str = ""
    password: bool = False
    label: str = ""
    multiline: bool = False


@dataclass(slots=True)
class Button:
    text: str
    on_tap: Handler
    rid: str = "button"
    desc: str = ""
    primary: bool = True


@dataclass(slots=True)
class IconButton:
    desc: str
    on_tap: Handler
    rid: str = ""
    glyph: str = ""


@dataclass(slots=True)
class Buttons:
    """A horizontal row of buttons / chips sharing the width."""

    items: list[Button]
    rid: str = "button_row"


@dataclass(slots=True)
class Grid:
    """Tiles (images, app icons) in ``cols`` columns."""

    tiles: list[Row]
    cols: int = 3
    tile_h: int = 340
    rid: str = "grid"


@dataclass(slots=True)
class Stepper:
    """A NumberPicker-style value with "Decrease …" / "Increase …" buttons (date and time pickers)."""

    label: str
    value: str
    on_dec: Handler
    on_inc: Handler
    rid: str = "picker"


@dataclass(slots=True)
class Spacer:
    height: int = 40


@dataclass(slots=True)
class Dialog:
    title: str
    message: str = ""
    body: list[object] = field(default_factory=list)
    buttons: list[Button] = field(default_factory=list)
    rid: str = "dialog"
    on_dismiss: Handler = None  # Back / outside tap; None → dialog is just closed


@dataclass(slots=True)
class Page:
    title: str
    body: list[object] = field(default_factory=list)
    nav_back: bool = False
    actions: list[IconButton] = field(default_factory=list)
    fab: IconButton | None = None
    bottom: list[Button] = field(default_factory=list)
    tabs: list[Button] = field(default_factory=list)
    dialog: Dialog | None = None
    rid: str = ""
    scroll_rid: str = "list"
    loading: bool = False


# ----------------------------------------------------------------------------------------------- layout
def _h(w: object) -> int:
    if isinstance(w, Text):
        return w.height or {"title": 150, "header": 120, "body": 110, "small": 90}[w.size]
    if isinstance(w, Row):
        return 200 if w.subtitle else 150
    if isinstance(w, Switch):
        return 200 if w.subtitle else 160
    if isinstance(w, Checkbox):
        return 140
    if isinstance(w, Field):
        return (300 if w.multiline else 170) + (60 if w.label else 0)
    if isinstance(w, Button | Buttons):
        return 170
    if isinstance(w, Grid):
        rows = (len(w.tiles) + w.cols - 1) // w.cols
        return rows * w.tile_h
    if isinstance(w, Stepper):
        return 170
    if isinstance(w, Spacer):
        return w.height
    raise TypeError(f"unknown widget {type(w).__name__}")


def virtualize(widgets: list, scroll: int, margin: int = 600, view: int = SCREEN_H) -> list:
    """Keep the widgets near the viewport, as a RecyclerView attaches only the rows it shows; the rows
    above and below become one spacer each, so the scroll range is unchanged and rows just off screen
    are still in the dump. Long lists use it to keep the simulator fast."""
    out: list = []
    y = before = after = 0
    lo, hi = scroll - margin, scroll + view + margin
    for w in widgets:
        h = _h(w)
        if y + h < lo:
            before += h
        elif y > hi:
            after += h
        else:
            out.append(w)
        y += h
    return ([Spacer(before)] if before else []) + out + ([Spacer(after)] if after else [])


class Layout:
    """Builds nodes for one page; knows the package and the page's focus/fields for EditTexts."""

    def __init__(self, package: str, fields: dict[str, str], focus: str | None, on_focus: Callable[[str], None]):
        self.package = package
        self.fields = fields
        self.focus = focus
        self.on_focus = on_focus

    def node(self, cls: str, bounds: Box, **kw) -> Node:
        return Node(cls=cls, bounds=bounds, package=self.package, **kw)

    def widget(self, w: object, x1: int, y1: int, x2: int) -> Node:
        y2 = y1 + _h(w)
        b = (x1, y1, x2, y2)
        pad = 48
        if isinstance(w, Text):
            return self.node("android.widget.TextView", (x1 + pad, y1, x2 - pad, y2), text=w.text, desc=w.desc,
                             rid=w.rid, style=f"text_{w.size}")
        if isinstance(w, Row):
            row = self.node("android.widget.LinearLayout", b, rid=w.rid, clickable=w.on_tap is not None,
                            long_clickable=w.on_long is not None, focusable=w.on_tap is not None,
                            selected=w.selected, desc=w.desc, on_tap=w.on_tap, on_long=w.on_long, style="row")
            tx = x1 + pad
            if w.icon or w.avatar:
                row.children.append(self.node("android.widget.ImageView", (tx, y1 + 35, tx + 110, y1 + 145),
                                              desc=w.icon, style="avatar" + (w.title[:1] or "?")))
                tx += 150
            text_right = x2 - pad - (190 if w.trailing is not None else 0)
            inner = self.node("android.widget.LinearLayout", (tx, y1 + 20, text_right, y2 - 20))
            if w.subtitle:
                inner.children.append(self.node("android.widget.TextView", (tx, y1 + 25, text_right, y1 + 110),
                                                text=w.title, rid="title", style="text_body"))
                inner.children.append(self.node("android.widget.TextView", (tx, y1 + 110, text_right, y2 - 20),
                                                text=w.subtitle, rid="subtitle", style="text_small"))
            else:
                inner.children.append(self.node("android.widget.TextView", (tx, y1 + 25, text_right, y2 - 25),
                                                text=w.title, rid="title", style="text_body"))
            row.children.append(inner)
            if w.trailing is not None:
                row.children.append(self._trailing(w.trailing, (x2 - pad - 170, y1 + 30, x2 - pad, y2 - 30)))
            return row
        if isinstance(w, Switch):
            row = self.node("android.widget.LinearLayout", b, rid=w.rid + "_row", clickable=True, focusable=True,
                            on_tap=w.on_toggle, style="row")
            ty2 = y1 + (120 if w.subtitle else y2 - y1 - 25)
            row.children.append(self.node("android.widget.TextView", (x1 + pad, y1 + 25, x2 - 250, ty2),
                                          text=w.label, rid="title", style="text_body"))
            if w.subtitle:
                row.children.append(self.node("android.widget.TextView", (x1 + pad, y1 + 120, x2 - 250, y2 - 20),
                                              text=w.subtitle, rid="summary", style="text_small"))
            row.children.append(self.node("android.widget.Switch", (x2 - pad - 150, y1 + 40, x2 - pad, y2 - 40),
                                          rid=w.rid, checkable=True, checked=w.checked, clickable=True,
                                          focusable=True, on_tap=w.on_toggle, text="ON" if w.checked else "OFF",
                                          style="switch"))
            return row
        if isinstance(w, Checkbox):
            return self.node("android.widget.CheckBox", (x1 + pad, y1 + 10, x2 - pad, y2 - 10), text=w.label,
                             rid=w.rid, checkable=True, checked=w.checked, clickable=True, focusable=True,
                             on_tap=w.on_toggle, style="checkbox")
        if isinstance(w, Field):
            top = y1
            wrap = self.node("android.widget.LinearLayout", b)
            if w.label:
                wrap.children.append(self.node("android.widget.TextView", (x1 + pad, y1 + 10, x2 - pad, y1 + 60),
                                               text=w.label, style="text_small"))
                top += 60
            value = self.fields.get(w.key, w.value)
            focused = self.focus == w.key
            shown = ("•" * len(value) if w.password else value) if value else w.hint
            wrap.children.append(self.node("android.widget.EditText", (x1 + pad, top + 15, x2 - pad, y2 - 15),
                                           text=shown, rid=w.rid or w.key, clickable=True, focusable=True,
                                           focused=focused, password=w.password, long_clickable=True,
                                           on_tap=lambda k=w.key: self.on_focus(k),
                                           style="edit_focused" if focused else ("edit" if value else "edit_hint")))
            return wrap
        if isinstance(w, Button):
            return self.node("android.widget.Button", (x1 + pad, y1 + 20, x2 - pad, y2 - 20), text=w.text,
                             desc=w.desc, rid=w.rid, clickable=w.on_tap is not None, focusable=True,
                             on_tap=w.on_tap, style="button" if w.primary else "button_flat")
        if isinstance(w, Buttons):
            row = self.node("android.widget.LinearLayout", b, rid=w.rid)
            n = max(1, len(w.items))
            cw = (x2 - x1 - 2 * pad) // n
            for i, it in enumerate(w.items):
                bx = x1 + pad + i * cw
                row.children.append(self.node("android.widget.Button", (bx + 8, y1 + 20, bx + cw - 8, y2 - 20),
                                              text=it.text, desc=it.desc, rid=it.rid,
                                              clickable=it.on_tap is not None, focusable=True, on_tap=it.on_tap,
                                              style="button" if it.primary else "button_flat",
                                              selected=not it.primary))
            return row
        if isinstance(w, Grid):
            grid = self.node("android.widget.GridView", b, rid=w.rid)
            cw = (x2 - x1) // w.cols
            for i, t in enumerate(w.tiles):
                r, c = divmod(i, w.cols)
                tb = (x1 + c * cw + 10, y1 + r * w.tile_h + 10, x1 + (c + 1) * cw - 10, y1 + (r + 1) * w.tile_h - 10)
                tile = self.node("android.widget.FrameLayout", tb, rid=t.rid, clickable=t.on_tap is not None,
                                 long_clickable=t.on_long is not None, focusable=True, on_tap=t.on_tap,
                                 on_long=t.on_long, selected=t.selected, desc=t.desc, style="tile")
                if t.title:
                    tile.children.append(self.node("android.widget.TextView",
                                                   (tb[0], tb[3] - 80, tb[2], tb[3]), text=t.title,
                                                   style="text_small"))
                grid.children.append(tile)
            return grid
        if isinstance(w, Stepper):
            row = self.node("android.widget.LinearLayout", b, rid=w.rid)
            row.children.append(self.node("android.widget.TextView", (x1 + pad, y1 + 30, x1 + 420, y2 - 30),
                                          text=w.label, style="text_small"))
            row.children.append(self.node("android.widget.ImageButton", (x1 + 440, y1 + 25, x1 + 560, y2 - 25),
                                          desc=f"Decrease {w.label.lower()}", clickable=True, focusable=True,
                                          on_tap=w.on_dec, style="icon_minus"))
            row.children.append(self.node("android.widget.TextView", (x1 + 580, y1 + 30, x2 - 200, y2 - 30),
                                          text=w.value, rid=w.rid + "_value", style="text_value"))
            row.children.append(self.node("android.widget.ImageButton", (x2 - 180, y1 + 25, x2 - pad, y2 - 25),
                                          desc=f"Increase {w.label.lower()}", clickable=True, focusable=True,
                                          on_tap=w.on_inc, style="icon_plus"))
            return row
        if isinstance(w, Spacer):
            return self.node("android.view.View", b)
        raise TypeError(f"unknown widget {type(w).__name__}")

    def _trailing(self, t: object, b: Box) -> Node:
        if isinstance(t, Switch):
            return self.node("android.widget.Switch", b, rid=t.rid, checkable=True, checked=t.checked,
                             clickable=True, focusable=True, on_tap=t.on_toggle, text="ON" if t.checked else "OFF",
                             style="switch")
        if isinstance(t, Checkbox):
            return self.node("android.widget.CheckBox", b, rid=t.rid, checkable=True, checked=t.checked,
                             clickable=True, focusable=True, on_tap=t.on_toggle, style="checkbox")
        if isinstance(t, IconButton):
            return self.node("android.widget.ImageButton", b, rid=t.rid, desc=t.desc, clickable=True,
                             focusable=True, on_tap=t.on_tap, style="icon")
        if isinstance(t, Text):
            return self.node("android.widget.TextView", b, text=t.text, rid=t.rid, style="text_small")
        raise TypeError(f"unknown trailing widget {type(t).__name__}")

    def column(self, parent: Node, widgets: list[object], top: int, bottom: int, scroll: int) -> int:
        """Stack widgets under ``parent`` from ``top``, shifted by ``scroll``; returns content height."""
        y = top - scroll
        for w in widgets:
            n = self.widget(w, 0, y, SCREEN_W)
            h = n.bounds[3] - n.bounds[1]
            if n.bounds[3] <= top or n.bounds[1] >= bottom:
                _mark_invisible(n)
            elif n.bounds[1] < top or n.bounds[3] > bottom:
                _clip(n, top, bottom)
            parent.children.append(n)
            y += h
        return y + scroll - top

    def icon(self, ib: IconButton, b: Box, style: str = "icon") -> Node:
        return self.node("android.widget.ImageButton", b, desc=ib.desc, rid=ib.rid, clickable=True,
                         focusable=True, on_tap=ib.on_tap, style=style, text=ib.glyph and "")


def _mark_invisible(n: Node) -> None:
    for m in n.walk():
        m.visible = False


def _clip(n: Node, top: int, bottom: int) -> None:
    """Partially visible views report their visible bounds, as uiautomator does."""
    for m in n.walk():
        x1, y1, x2, y2 = m.bounds
        c1, c2 = max(y1, top), min(y2, bottom)
        if c1 >= c2:
            m.visible = False
        else:
            m.bounds = (x1, c1, x2, c2)


# ------------------------------------------------------------------------------------------- XML output
_BOOL = ("false", "true")


def to_xml(root: Node) -> str:
    out: list[str] = ["<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"]
    _write(root, 0, out)
    out.append("</hierarchy>")
    return "".join(out)


def _write(n: Node, index: int, out: list[str]) -> None:
    x1, y1, x2, y2 = n.bounds
    rid = f"{n.package}:id/{n.rid}" if n.rid else ""
    out.append(
        f"<node index=\"{index}\" text={xml_attr(n.text)} resource-id=\"{rid}\" class=\"{n.cls}\" "
        f"package=\"{n.package}\" content-desc={xml_attr(n.desc)} checkable=\"{_BOOL[n.checkable]}\" "
        f"checked=\"{_BOOL[n.checked]}\" clickable=\"{_BOOL[n.clickable]}\" enabled=\"{_BOOL[n.enabled]}\" "
        f"focusable=\"{_BOOL[n.focusable]}\" focused=\"{_BOOL[n.focused]}\" scrollable=\"{_BOOL[n.scrollable]}\" "
        f"long-clickable=\"{_BOOL[n.long_clickable]}\" password=\"{_BOOL[n.password]}\" "
        f"selected=\"{_BOOL[n.selected]}\" bounds=\"[{x1},{y1}][{x2},{y2}]\""
    )
    if n.children:
        out.append(">")
        for i, c in enumerate(n.children):
            _write(c, i, out)
        out.append("</node>")
    else:
        out.append(" />")


# ------------------------------------------------------------------------------------------ hit testing
def hit(root: Node, x: int, y: int, long: bool = False) -> Node | None:
    """The topmost, deepest visible node at (x, y) with a handler for the gesture."""
    found: Node | None = None

    def visit(n: Node) -> bool:
        nonlocal found
        if not n.visible:
            return False
        x1, y1, x2, y2 = n.bounds
        if not (x1 <= x < x2 and y1 <= y < y2):
            return False
        for c in reversed(n.children):
            if visit(c):
                return True
        handler = n.on_long if long else n.on_tap
        if handler is not None:
            found = n
            return True
        if n.style in ("modal", "scrim"):  # dialogs (and the scrim behind them) swallow taps
            return True
        return False

    visit(root)
    return found
