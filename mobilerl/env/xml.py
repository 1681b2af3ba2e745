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


# -- the official MobileRL observation (its harness' "v4" tree) ------------------------------------------

TREE_GRID = 999  # the v4 tree's boxes, and the answers that name them, run from 0 to 999 on either axis
TREE_HEADER = (f"The screenshot's size is {TREE_GRID}x{TREE_GRID}. The value in bounds is relative to the "
               "screenshot's size.\nThe tree structure description of the current screenshot is shown:")
_ACTIONS = (("clickable", "click"), ("scrollable", "scroll"), ("long-clickable", "long-click"),
            ("checkable", "check"))


class _Node:
    """A mutable node of the dump while :func:`compress_tree` rewrites it."""

    __slots__ = ("a", "box", "kids", "func", "action")

    def __init__(self, el: ET.Element) -> None:
        self.a = el.attrib
        self.box = _bounds(el.get("bounds")) or (0, 0, 0, 0)
        self.kids = [_Node(c) for c in el if c.tag == "node"]
        self.func = self.action = ""

    def on(self, flag: str) -> bool:
        return self.a.get(flag) == "true"

    def area(self) -> int:
        return (self.box[2] - self.box[0]) * (self.box[3] - self.box[1])

    def walk(self) -> list[_Node]:
        out = [self]
        for k in self.kids:
            out.extend(k.walk())
        return out


def compress_tree(xml: str, width: int, height: int) -> str:
    """The official MobileRL harness' observation of a dump (its ``v4`` tree; what the released checkpoints
    were trained on), as observed from THUDM/MobileRL's ``android_lab/utils_mobile/xml_tool.py``.

    A header, then one line per kept node, indented four spaces a level: ``Class;actions;label;[x1,y1,x2,y2]``
    with boxes on the 0-999 grid (``int(v * 999 / size)``). Nodes go as in :func:`compress_nodes` (only
    themselves, children re-judged), except that the screen's edge is not checked and a node under 0.5 % of
    the largest node's width or height goes too. A clickable or long-clickable node of at most half the
    screen absorbs the labels of its plain descendants (``own|child|grandchild``) and keeps only its
    clickable, long-clickable or scrollable ones as children; a label-less container is lifted out where a
    deeper node carries content. A node whose grid box repeats an earlier one keeps its pixel box, as the
    harness does (it maps grid boxes back to pixels through that table)."""
    root = parse_dump(xml)
    if width <= 0 or height <= 0:
        raise ValueError(f"compress_tree needs the screen size, got {width}x{height}")
    top = _Node(ET.Element("hierarchy"))
    top.kids = [_Node(c) for c in ([root] if root.tag == "node" else root) if c.tag == "node"]
    nodes = top.walk()[1:]
    biggest = max(nodes, key=_Node.area, default=None)  # the first of the largest, in document order
    max_w, max_h = (biggest.box[2] - biggest.box[0], biggest.box[3] - biggest.box[1]) if biggest else (0, 0)
    _prune(top, None, max_w, max_h)
    for parent in top.walk():
        for n in parent.kids:
            text, desc = n.a.get("text", ""), n.a.get("content-desc", "")
            n.func = text + (" " + desc if desc else "")
            n.action = " ".join(v for k, v in _ACTIONS if n.on(k)) or ("focusable" if n.on("focusable") else "")
            if "material_clock_face" in parent.a.get("resource-id", ""):  # the clock face's numbers take taps
                n.action += " click"
    _merge_clickable(top, width * height)
    _lift_containers(top)
    return "\n".join([TREE_HEADER, *_tree_lines(top, width, height)])


def _prune(n: _Node, box: Box | None, max_w: int, max_h: int) -> None:
    """Drop invalid, tiny and empty nodes, each alone: its children take its place and are judged in turn
    against the nearest kept ancestor's ``box``."""
    out: list[_Node] = []
    queue = list(n.kids)
    n.kids = out
    while queue:
        c = queue.pop(0)
        x1, y1, x2, y2 = c.box
        valid = x1 >= 0 and y1 >= 0 and x1 < x2 and y1 < y2 and (box is None or _inside(c.box, box))
        keep = (valid and x2 - x1 > max_w * 0.005 and y2 - y1 > max_h * 0.005
                and (any(c.on(f) for f in FLAGS) or bool(c.a.get("text") or c.a.get("content-desc"))))
        if keep:
            out.append(c)
            _prune(c, c.box, max_w, max_h)
        else:
            queue[:0] = c.kids


def _merge_clickable(top: _Node, screen_area: int) -> None:
    def takes_input(c: _Node) -> bool:
        return c.on("clickable") or c.on("long-clickable") or c.on("scrollable")

    def absorb(n: _Node, kept: list[_Node]) -> str:
        text = n.func
        for c in n.kids:
            if takes_input(c):
                kept.append(c)
            elif t := absorb(c, kept):
                text += "|" + t
        return text

    everything = top.walk()[1:]
    # the harness lists clickable nodes, then long-clickable ones (a node that is both is merged twice)
    for n in [m for m in everything if m.on("clickable")] + [m for m in everything if m.on("long-clickable")]:
        if n.area() <= 0.5 * screen_area:
            kept: list[_Node] = []
            text = absorb(n, kept)
            n.func = text[1:] if text.startswith("|") else text
            n.kids = kept


def _lift_containers(top: _Node) -> None:
    """Where a node carries content, splice out each content-less ancestor above its parent (a clickable
    wrapper around one child), that child moving to its grandparent's last-but-one place as the harness'
    ``insert(-1)`` puts it; children are walked by next sibling, as lxml iterates a changing tree."""
    parent: dict[int, _Node] = {}
    for n in top.walk():
        for c in n.kids:
            parent[id(c)] = n
    gone: set[int] = set()

    def has_content(c: _Node) -> bool:
        return (len(c.kids) > 1 or any(c.on(f) for f in FLAGS if f not in ("clickable", "focusable"))
                or bool(c.a.get("text") or c.a.get("content-desc")))

    def after(c: _Node) -> _Node | None:
        sibs = parent[id(c)].kids
        i = sibs.index(c) + 1
        return sibs[i] if i < len(sibs) else None

    def visit(n: _Node, chain: list[tuple[_Node, bool]]) -> None:
        c = n.kids[0] if n.kids else None
        while c is not None:
            nxt = after(c)
            content = has_content(c)
            here = chain
            if content:
                for p, p_content in chain[:-1]:
                    if not p_content and id(p) not in gone:
                        g = parent[id(p)]
                        for j, v in enumerate(list(p.kids)):
                            g.kids.insert(-1 + j, v)
                            parent[id(v)] = g
                        p.kids = []
                        g.kids.remove(p)
                        gone.add(id(p))
                here = chain[-1:]
            visit(c, [*here, (c, content)])
            c = nxt

    visit(top, [(top, True)])


def _tree_lines(top: _Node, width: int, height: int) -> list[str]:
    fx, fy = TREE_GRID / width, TREE_GRID / height
    grid_of: dict[tuple[int, ...], tuple[Box, bool]] = {}  # grid box -> (the pixel box it stands for, matchable)
    shown: dict[int, tuple[int, ...]] = {}
    half = 0.5 * width * height
    for n in top.walk()[1:]:
        x1, y1, x2, y2 = n.box
        g = (int(x1 * fx), int(y1 * fy), int(x2 * fx), int(y2 * fy))
        matchable = ((n.on("clickable") or n.on("long-clickable")) and n.area() <= half) or \
            (not (n.on("clickable") or n.on("long-clickable")) and n.on("scrollable"))
        if g in grid_of:
            seen_box, seen_matchable = grid_of[g]
            if not matchable:
                continue  # the grid box stands for another node: this one keeps its pixels
            seen_area = (seen_box[2] - seen_box[0]) * (seen_box[3] - seen_box[1])
            if seen_matchable and seen_box != n.box and n.area() > seen_area:
                continue
        grid_of[g] = (n.box, matchable)
        shown[id(n)] = g
    lines: list[str] = []

    def emit(n: _Node, depth: int) -> None:
        status = ""
        if n.on("checkable"):
            status += " checked" if n.on("checked") else " unchecked"
        status += " password" * n.on("password") + " selected" * n.on("selected")
        box = shown.get(id(n), n.box)
        cls = (n.a.get("class") or "").rsplit(".", 1)[-1]
        lines.append(f"{' ' * 4 * depth}{cls};{n.action}{status};{n.func};[{box[0]},{box[1]},{box[2]},{box[3]}]")
        for c in n.kids:
            emit(c, depth + 1)

    for n in top.kids:
        emit(n, 1)
    return lines
