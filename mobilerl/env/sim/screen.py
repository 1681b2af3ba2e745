"""A parsed screen, as the oracle expert reads it: the visible nodes of a raw uiautomator dump."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from mobilerl.env.actions import Box

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


def parse_bounds(s: str) -> Box | None:
    m = _BOUNDS.fullmatch(s.strip())
    if not m:
        return None
    x1, y1, x2, y2 = (int(v) for v in m.groups())
    return (x1, y1, x2, y2)


@dataclass(frozen=True, slots=True)
class El:
    cls: str
    text: str
    desc: str
    rid: str  # the part after ":id/"
    bounds: Box
    package: str
    clickable: bool
    checkable: bool
    checked: bool
    focused: bool
    scrollable: bool
    selected: bool

    @property
    def label(self) -> str:
        return self.text or self.desc


class Screen:
    """The on-screen nodes of a dump (off-screen and zero-size nodes left out), in document order."""

    def __init__(self, xml: str, app: str = "", width: int = 1080, height: int = 2400):
        self.xml = xml
        self.app = app
        self.width, self.height = width, height
        self.els: list[El] = []
        root = ET.fromstring(xml)
        for top in root:
            self._walk(top, (0, 0, width, height))

    def _walk(self, node: ET.Element, parent: Box) -> None:
        b = parse_bounds(node.get("bounds", ""))
        if b is None:
            return
        x1, y1, x2, y2 = b
        px1, py1, px2, py2 = parent
        if x2 <= x1 or y2 <= y1 or x1 < px1 or y1 < py1 or x2 > px2 or y2 > py2:
            return
        rid = node.get("resource-id", "")
        self.els.append(
            El(
                cls=node.get("class", "").rsplit(".", 1)[-1],
                text=node.get("text", ""),
                desc=node.get("content-desc", ""),
                rid=rid.split(":id/", 1)[-1] if rid else "",
                bounds=b,
                package=node.get("package", ""),
                clickable=node.get("clickable") == "true",
                checkable=node.get("checkable") == "true",
                checked=node.get("checked") == "true",
                focused=node.get("focused") == "true",
                scrollable=node.get("scrollable") == "true",
                selected=node.get("selected") == "true",
            )
        )
        for c in node:
            self._walk(c, b)

    def find_all(
        self,
        text: str | None = None,
        desc: str | None = None,
        rid: str | None = None,
        cls: str | None = None,
        contains: str | None = None,
        clickable: bool | None = None,
    ) -> list[El]:
        out = []
        for e in self.els:
            if text is not None and e.text != text:
                continue
            if desc is not None and e.desc != desc:
                continue
            if rid is not None and e.rid != rid:
                continue
            if cls is not None and e.cls != cls:
                continue
            if contains is not None and contains.lower() not in (e.text + " " + e.desc).lower():
                continue
            if clickable is not None and e.clickable != clickable:
                continue
            out.append(e)
        return out

    def find(self, **query) -> El | None:
        found = self.find_all(**query)
        return found[0] if found else None

    def has(self, **query) -> bool:
        return self.find(**query) is not None

    def texts(self) -> list[str]:
        return [e.text for e in self.els if e.text]

    @property
    def title(self) -> str:
        """The toolbar title of the current page ('' on the launcher)."""
        bar = self.find(rid="toolbar")
        if bar is None:
            return ""
        for e in self.els:
            if e.cls == "TextView" and e.text and _inside(e.bounds, bar.bounds):
                return e.text
        return ""

    @property
    def focused_field(self) -> El | None:
        return next((e for e in self.els if e.cls == "EditText" and e.focused), None)

    def scrollable(self) -> El | None:
        return next((e for e in self.els if e.scrollable), None)


def _inside(a: Box, b: Box) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] <= b[3]
