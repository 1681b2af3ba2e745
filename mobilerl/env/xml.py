"""UI-XML compression for the agent's observation (MobileRL Appendix C).

A uiautomator dump (from a device or the simulator) becomes one line per kept node, in document order:
``Class;flags;label;[x1,y1][x2,y2]``, e.g. ``Switch;checkable checked;ON;[888,460][1032,580]``. A node is
kept iff it is on screen and one of checkable, checked, clickable, focusable, scrollable, long-clickable,
password, selected is true (``flags``, in this order) or it has a label: its text, content-desc, or
``text | desc`` when they differ, newlines as ``\\n``. On screen means non-zero area, inside the screen and
inside the nearest kept ancestor; ``keep_offscreen`` keeps the rest too. A dropped node takes only itself
away: its children are judged on their own against the nearest kept ancestor, as AndroidLab's and
MobileRL's compressors do (a chat bubble overhanging its row stays visible). Missing attributes count as
false; malformed XML raises ``ValueError``. ``numbered=True`` prefixes ``[i]`` for Set-of-Mark grounding;
:func:`compress_nodes` returns the kept nodes, so an index maps back to its bounds.
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

# Characters XML 1.0 cannot carry (C0 controls other than tab/newline/CR, lone surrogates, U+FFFE/U+FFFF).
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_attr(value: str) -> str:
    """``value`` as a quoted XML attribute, each character XML 1.0 cannot carry written as ``.``, as
    uiautomator's dumper does (``stripInvalidXMLChars``): a typed control character must not make the
    whole dump unreadable."""
    return quoteattr(_XML_INVALID.sub(".", value))


FLAGS = ("checkable", "checked", "clickable", "focusable", "scrollable", "long-clickable", "password", "selected")
_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")

Box = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class UINode:
    cls: str
    flags: tuple[str, ...]
    label: str
    bounds: Box

    def line(self) -> str:
        x1, y1, x2, y2 = self.bounds
        return f"{self.cls};{' '.join(self.flags)};{self.label};[{x1},{y1}][{x2},{y2}]"


def _bounds(s: str | None) -> Box | None:
    if not s:
        return None
    m = _BOUNDS.fullmatch(s.strip())
    if m is None:
        return None
    x1, y1, x2, y2 = (int(v) for v in m.groups())
    return (x1, y1, x2, y2)


def _inside(b: Box, outer: Box) -> bool:
    return b[0] >= outer[0] and b[1] >= outer[1] and b[2] <= outer[2] and b[3] <= outer[3]


def _label(text: str, desc: str) -> str:
    text, desc = text.strip(), desc.strip()
    if text and desc and desc != text:
        out = f"{text} | {desc}"
    else:
        out = text or desc
    return out.replace("\r", "").replace("\n", "\\n")


def parse_dump(xml: str) -> ET.Element:
    """Parse a uiautomator dump; raise ValueError with the parser's reason when it is malformed."""
    if not isinstance(xml, str) or not xml.strip():
        raise ValueError("empty UI dump")
    try:
        root = ET.fromstring(xml.strip().encode("utf-8"))
    except ET.ParseError as e:
        raise ValueError(f"malformed UI dump: {e}") from None
    if root.tag not in ("hierarchy", "node"):
        raise ValueError(f"UI dump root must be <hierarchy> or <node>, got <{root.tag}>")
    return root


def compress_nodes(
    xml: str, keep_offscreen: bool = False, width: int | None = None, height: int | None = None
) -> list[UINode]:
    """The kept nodes of a dump, in document order (see the module docstring)."""
    root = parse_dump(xml)
    tops = [root] if root.tag == "node" else [c for c in root if c.tag == "node"]
    if width is None or height is None:
        boxes = [b for b in (_bounds(t.get("bounds")) for t in tops) if b is not None]
        width = width or max((b[2] for b in boxes), default=0) or 1080
        height = height or max((b[3] for b in boxes), default=0) or 2400
    screen: Box = (0, 0, width, height)
    out: list[UINode] = []

    def visit(node: ET.Element, ref: Box) -> None:
        """``ref``: the box of the nearest kept on-screen ancestor (the screen at the top)."""
        b = _bounds(node.get("bounds"))
        kept_here = False
        if b is not None:
            onscreen = b[2] > b[0] and b[3] > b[1] and _inside(b, screen) and _inside(b, ref)
            flags = tuple(f for f in FLAGS if node.get(f) == "true")
            label = _label(node.get("text") or "", node.get("content-desc") or "")
            if (onscreen or keep_offscreen) and (flags or label):
                out.append(UINode((node.get("class") or "View").rsplit(".", 1)[-1], flags, label, b))
                kept_here = onscreen
        for c in node:
            if c.tag == "node":
                visit(c, b if kept_here and b is not None else ref)

    for t in tops:
        visit(t, screen)
    return out


@functools.lru_cache(maxsize=512)
def compress_xml(
    xml: str,
    keep_offscreen: bool = False,
    numbered: bool = False,
    width: int | None = None,
    height: int | None = None,
) -> str:
    """One line per functional on-screen node: ``Class;flags;label;[x1,y1][x2,y2]``.

    A pure function of its arguments, memoised for the last 512 distinct calls: an agent that does not change
    the screen, and every episode's first screen, ask for the same dump again (in an evaluation of the tiny
    policy ~40 % of the steps repeat a screen seen shortly before)."""
    nodes = compress_nodes(xml, keep_offscreen=keep_offscreen, width=width, height=height)
    if numbered:
        return "\n".join(f"[{i}] {n.line()}" for i, n in enumerate(nodes))
    return "\n".join(n.line() for n in nodes)
