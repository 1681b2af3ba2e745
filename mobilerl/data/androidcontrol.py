"""AndroidControl → our trajectory format (MobileRL Appendix D.5, Table 8).

Reads and writes AndroidControl's GZIP TFRecords of ``tf.train.Example`` s (and JSONL episodes) without
TensorFlow or generated protobuf code (a small wire-format codec), so tests can build fixtures. The input
features: docs/data_schema.md, "AndroidControl input".

:func:`convert_episode`: each accessibility forest → uiautomator XML (:func:`forest_to_xml`) → compressed
XML; each action → ours (:func:`~mobilerl.data.androidcontrol_actions.from_androidcontrol`, Table 8; the
original point kept in ``meta``); one step per action with its step instruction, the goal as the episode
instruction, and with ``add_finish`` a final ``finish()`` on the last screen. :func:`convert_to_store`
masks screenshots and texts like every stored artifact (:mod:`mobilerl.data.masking`).
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import struct
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl.data import privacy as P
from mobilerl.data.androidcontrol_actions import from_androidcontrol
from mobilerl.data.masking import (
    SURROGATE_REGISTRY,
    CollectResult,
    MaskingOptions,
    mask_trajectory,
    surrogate_fingerprints,
)
from mobilerl.data.store import IMAGES, StoreWriter, image_path
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action
from mobilerl.env.xml import compress_xml, xml_attr
from mobilerl.trajectory import StepRecord, Trajectory

# ============================================================================== protobuf wire format


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a serialized message (value: int or bytes)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            v, i = buf[i:i + ln], i + ln
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt}")
        yield num, wt, v


def _enc_varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _enc_field(num: int, value: Any) -> bytes:
    if isinstance(value, bool | int):
        return _enc_varint(num << 3) + _enc_varint(int(value))
    if isinstance(value, str):
        value = value.encode()
    return _enc_varint(num << 3 | 2) + _enc_varint(len(value)) + bytes(value)


def _signed32(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


# ---- tf.train.Example


def parse_example(buf: bytes) -> dict[str, list[Any]]:
    """A ``tf.train.Example`` as ``{feature name: values}`` (bytes, ints or floats)."""
    out: dict[str, list[Any]] = {}
    for num, _, features in _fields(buf):
        if num != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            name, feat = "", b""
            for enum, _, ev in _fields(entry):
                if enum == 1:
                    name = ev.decode()
                elif enum == 2:
                    feat = ev
            values: list[Any] = []
            for knum, _, lst in _fields(feat):
                for vnum, vwt, v in _fields(lst):
                    if vnum != 1:
                        continue
                    if knum == 1:  # BytesList
                        values.append(bytes(v))
                    elif knum == 2:  # FloatList (packed or not)
                        data = v if vwt == 2 else v
                        values.extend(struct.unpack(f"<{len(data) // 4}f", data))
                    elif knum == 3:  # Int64List (packed or not)
                        if vwt == 2:
                            j = 0
                            while j < len(v):
                                x, j = _varint(v, j)
                                values.append(_signed32(x))
                        else:
                            values.append(_signed32(v))
            out[name] = values
    return out


def make_example(features: dict[str, Sequence[Any]]) -> bytes:
    """Serialize ``{name: values}`` as a ``tf.train.Example`` (bytes/str → BytesList, ints → Int64List)."""
    entries = b""
    for name, values in features.items():
        values = list(values)
        if values and all(isinstance(v, int) for v in values):
            packed = b"".join(_enc_varint(v) for v in values)
            feat = _enc_field(3, _enc_field(1, packed))
        else:
            lst = b"".join(_enc_field(1, v.encode() if isinstance(v, str) else v) for v in values)
            feat = _enc_field(1, lst)
        entries += _enc_field(1, _enc_field(1, name) + _enc_field(2, feat))
    return _enc_field(1, entries)


# ---- TFRecord framing


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecord(path: str | Path, verify: bool = False) -> Iterator[bytes]:
    """The records of a TFRecord file (GZIP-compressed or not, detected)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    i = 0
    while i < len(raw):
        if i + 12 > len(raw):
            raise ValueError(f"{path}: truncated TFRecord at byte {i}")
        (length,) = struct.unpack("<Q", raw[i:i + 8])
        data = raw[i + 12:i + 12 + length]
        if len(data) != length:
            raise ValueError(f"{path}: truncated TFRecord at byte {i}")
        if verify:
            (crc,) = struct.unpack("<I", raw[i + 12 + length:i + 16 + length])
            if crc != _masked_crc(data):
                raise ValueError(f"{path}: bad record CRC at byte {i}")
        yield data
        i += 16 + length


def write_tfrecord(path: str | Path, records: Iterable[bytes], compress: bool = True) -> None:
    buf = io.BytesIO()
    for data in records:
        header = struct.pack("<Q", len(data))
        buf.write(header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data)))
    raw = buf.getvalue()
    Path(path).write_bytes(gzip.compress(raw) if compress else raw)


# ---- android_env accessibility forest (android_env/proto/a11y/*.proto)

# AndroidAccessibilityNodeInfo field numbers
_NODE_STR = {3: "class_name", 4: "content_description", 5: "hint_text", 6: "package_name", 7: "text",
             10: "view_id_resource_name", 31: "tooltip_text"}
_NODE_INT = {1: "unique_id", 11: "window_id", 27: "depth", 30: "drawing_order"}
_NODE_BOOL = {12: "is_checkable", 13: "is_checked", 14: "is_clickable", 15: "is_editable", 16: "is_enabled",
              17: "is_focusable", 18: "is_focused", 19: "is_long_clickable", 20: "is_password",
              21: "is_scrollable", 22: "is_selected", 23: "is_visible_to_user"}
_RECT = ("left", "top", "right", "bottom")


def _parse_rect(buf: bytes) -> dict[str, int]:
    r = dict.fromkeys(_RECT, 0)
    for num, _, v in _fields(buf):
        if 1 <= num <= 4:
            r[_RECT[num - 1]] = _signed32(v)
    return r


def _parse_node(buf: bytes) -> dict[str, Any]:
    node: dict[str, Any] = {"child_ids": []}
    for num, wt, v in _fields(buf):
        if num == 2:
            node["bounds_in_screen"] = _parse_rect(v)
        elif num in _NODE_STR:
            node[_NODE_STR[num]] = v.decode("utf-8", "replace")
        elif num in _NODE_INT:
            node[_NODE_INT[num]] = _signed32(v)
        elif num in _NODE_BOOL:
            node[_NODE_BOOL[num]] = bool(v)
        elif num == 25:
            if wt == 2:
                j = 0
                while j < len(v):
                    x, j = _varint(v, j)
                    node["child_ids"].append(_signed32(x))
            else:
                node["child_ids"].append(_signed32(v))
    return node


def parse_forest(buf: bytes) -> dict[str, Any]:
    """A serialized ``AndroidAccessibilityForest`` as a dict in the proto's field names
    (``{"windows": [{"id", "layer", "window_type", "bounds_in_screen", "tree": {"nodes": [...]}}]}``)."""
    windows = []
    for num, _, wbuf in _fields(buf):
        if num != 1:
            continue
        w: dict[str, Any] = {"tree": {"nodes": []}}
        for wnum, _, v in _fields(wbuf):
            if wnum == 1:
                w["bounds_in_screen"] = _parse_rect(v)
            elif wnum in (2, 3, 4, 6):
                w[{2: "display_id", 3: "id", 4: "layer", 6: "window_type"}[wnum]] = _signed32(v)
            elif wnum == 5:
                w["title"] = v.decode("utf-8", "replace")
            elif wnum == 11:
                w["tree"]["nodes"] = [_parse_node(nb) for tnum, _, nb in _fields(v) if tnum == 1]
        windows.append(w)
    return {"windows": windows}


def encode_forest(forest: dict[str, Any]) -> bytes:
    """Inverse of :func:`parse_forest` (for building fixtures)."""
    inv_str = {v: k for k, v in _NODE_STR.items()}
    inv_int = {v: k for k, v in _NODE_INT.items()}
    inv_bool = {v: k for k, v in _NODE_BOOL.items()}

    def rect(r: dict[str, int]) -> bytes:
        return b"".join(_enc_field(i + 1, int(r.get(k, 0))) for i, k in enumerate(_RECT) if r.get(k))

    out = b""
    for w in forest.get("windows", []):
        wb = b""
        if w.get("bounds_in_screen"):
            wb += _enc_field(1, rect(w["bounds_in_screen"]))
        for name, num in (("display_id", 2), ("id", 3), ("layer", 4), ("window_type", 6)):
            if w.get(name):
                wb += _enc_field(num, int(w[name]))
        if w.get("title"):
            wb += _enc_field(5, w["title"])
        tree = b""
        for n in w.get("tree", {}).get("nodes", []):
            nb = b""
            for k, v in n.items():
                if k == "bounds_in_screen":
                    nb += _enc_field(2, rect(v))
                elif k in inv_str and v:
                    nb += _enc_field(inv_str[k], v)
                elif k in inv_int and v:
                    nb += _enc_field(inv_int[k], int(v))
                elif k in inv_bool and v:
                    nb += _enc_field(inv_bool[k], True)
                elif k == "child_ids" and v:
                    nb += _enc_field(25, b"".join(_enc_varint(int(c)) for c in v))
            tree += _enc_field(1, nb)
        wb += _enc_field(11, tree)
        out += _enc_field(1, wb)
    return out


# ============================================================================== forest → XML


def _bounds(r: dict[str, int] | None) -> str:
    r = r or {}
    return f"[{r.get('left', 0)},{r.get('top', 0)}][{r.get('right', 0)},{r.get('bottom', 0)}]"


def _b(v: Any) -> str:
    return "true" if v else "false"


def _emit(node: dict[str, Any], index: int, by_id: dict[int, dict[str, Any]], seen: set[int], parts: list[str]) -> None:
    uid = int(node.get("unique_id", -1))
    if uid in seen:  # graphs may repeat a node: emit it once
        return
    seen.add(uid)
    text = (node.get("text") or node.get("hint_text", "")) if node.get("is_editable") else node.get("text", "")
    attrs = [
        ("index", str(index)), ("text", text or ""), ("resource-id", node.get("view_id_resource_name", "")),
        ("class", node.get("class_name", "")), ("package", node.get("package_name", "")),
        ("content-desc", node.get("content_description", "")),
        ("checkable", _b(node.get("is_checkable"))), ("checked", _b(node.get("is_checked"))),
        ("clickable", _b(node.get("is_clickable"))), ("enabled", _b(node.get("is_enabled"))),
        ("focusable", _b(node.get("is_focusable"))), ("focused", _b(node.get("is_focused"))),
        ("scrollable", _b(node.get("is_scrollable"))), ("long-clickable", _b(node.get("is_long_clickable"))),
        ("password", _b(node.get("is_password"))), ("selected", _b(node.get("is_selected"))),
        ("bounds", _bounds(node.get("bounds_in_screen"))),
    ]
    parts.append("<node " + " ".join(f"{k}={xml_attr(v)}" for k, v in attrs) + ">")
    for j, cid in enumerate(node.get("child_ids", [])):
        child = by_id.get(int(cid))
        if child is not None:
            _emit(child, j, by_id, seen, parts)
    parts.append("</node>")


def forest_to_xml(forest: dict[str, Any] | bytes) -> str:
    """uiautomator-style XML of an accessibility forest: windows from the bottom layer up, each window's
    nodes nested through ``child_ids`` from its roots (nodes no other node lists as a child); attributes
    index, text, resource-id, class, package, content-desc, the booleans and bounds (Appendix D.5)."""
    if isinstance(forest, bytes | bytearray):
        forest = parse_forest(bytes(forest))
    parts = ["<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"]
    windows = sorted(forest.get("windows", []), key=lambda w: int(w.get("layer", 0)))
    for w in windows:
        nodes = w.get("tree", {}).get("nodes", [])
        by_id = {int(n.get("unique_id", i)): n for i, n in enumerate(nodes)}
        children = {c for n in nodes for c in n.get("child_ids", [])}
        roots = [n for i, n in sorted(by_id.items()) if i not in children]
        seen: set[int] = set()
        for i, r in enumerate(roots):
            _emit(r, i, by_id, seen, parts)
    parts.append("</hierarchy>")
    return "".join(parts)


def forest_from_xml(xml: str, window_id: int = 1, layer: int = 0) -> dict[str, Any]:
    """A one-window forest from a uiautomator dump (the inverse direction of :func:`forest_to_xml`; for
    fixtures: turns simulator or device dumps into AndroidControl-format trees)."""
    from mobilerl.env.xml import parse_dump

    root = parse_dump(xml)
    nodes: list[dict[str, Any]] = []

    def bounds(el: Any) -> dict[str, int]:
        import re

        m = re.fullmatch(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]", el.get("bounds", "") or "")
        return dict(zip(_RECT, (int(v) for v in m.groups()), strict=True)) if m else dict.fromkeys(_RECT, 0)

    def visit(el: Any, depth: int) -> int:
        uid = len(nodes)
        node: dict[str, Any] = {"unique_id": uid, "depth": depth, "window_id": window_id, "child_ids": [],
                                "bounds_in_screen": bounds(el), "class_name": el.get("class", ""),
                                "package_name": el.get("package", ""), "text": el.get("text", ""),
                                "content_description": el.get("content-desc", ""),
                                "view_id_resource_name": el.get("resource-id", ""), "is_enabled": True,
                                "is_visible_to_user": True}
        for attr, key in (("checkable", "is_checkable"), ("checked", "is_checked"), ("clickable", "is_clickable"),
                          ("focusable", "is_focusable"), ("focused", "is_focused"), ("scrollable", "is_scrollable"),
                          ("long-clickable", "is_long_clickable"), ("password", "is_password"),
                          ("selected", "is_selected")):
            node[key] = el.get(attr) == "true"
        nodes.append(node)
        for child in el.findall("node"):
            node["child_ids"].append(visit(child, depth + 1))
        return uid

    for top in root.findall("node"):
        visit(top, 0)
    return {"windows": [{"id": window_id, "layer": layer, "window_type": 1, "tree": {"nodes": nodes}}]}


# ============================================================================== episodes


def episode_from_example(buf: bytes) -> dict[str, Any]:
    """An AndroidControl episode dict from one TFRecord record (trees left serialized)."""
    f = parse_example(buf)
    return {
        "episode_id": int(f["episode_id"][0]) if f.get("episode_id") else 0,
        "goal": f["goal"][0].decode() if f.get("goal") else "",
        "screenshots": list(f.get("screenshots", [])),
        "accessibility_trees": list(f.get("accessibility_trees", [])),
        "screenshot_widths": [int(v) for v in f.get("screenshot_widths", [])],
        "screenshot_heights": [int(v) for v in f.get("screenshot_heights", [])],
        "actions": [a.decode() for a in f.get("actions", [])],
        "step_instructions": [s.decode() for s in f.get("step_instructions", [])],
    }


def episode_to_example(ep: dict[str, Any]) -> bytes:
    """Inverse of :func:`episode_from_example` (trees: serialized bytes or forest dicts)."""
    trees = [t if isinstance(t, bytes | bytearray) else encode_forest(t) for t in ep["accessibility_trees"]]
    return make_example({
        "episode_id": [int(ep["episode_id"])], "goal": [ep["goal"]], "screenshots": ep["screenshots"],
        "accessibility_trees": trees, "screenshot_widths": ep["screenshot_widths"],
        "screenshot_heights": ep["screenshot_heights"],
        "actions": [a if isinstance(a, str) else json.dumps(a) for a in ep["actions"]],
        "step_instructions": ep["step_instructions"],
    })


def iter_episodes(paths: Iterable[str | Path]) -> Iterator[dict[str, Any]]:
    """Episodes of AndroidControl TFRecord files (``*.tfrecord*``, ``android_control-*``) or JSON lines
    files (``.jsonl``: one episode dict per line, screenshots as paths relative to the file)."""
    for p in paths:
        p = Path(p)
        if p.suffix == ".jsonl":
            for line in p.read_text().splitlines():
                if line.strip():
                    ep = json.loads(line)
                    ep["screenshots"] = [(p.parent / s).read_bytes() if isinstance(s, str) else s
                                         for s in ep.get("screenshots", [])]
                    yield ep
        else:
            for rec in read_tfrecord(p):
                yield episode_from_example(rec)


def convert_episode(ep: dict[str, Any], *, split: str = "train", add_finish: bool = True) -> tuple[Trajectory, list[bytes]]:
    """One episode → an (unmasked) :class:`Trajectory` and the screenshots (PNG bytes) of its steps.

    Step ``i`` sees screenshot/tree ``i`` and does action ``i`` (with ``step_instructions[i]``); the extra
    finish step (``add_finish``) sees the last screenshot."""
    actions = [json.loads(a) if isinstance(a, str | bytes) else a for a in ep["actions"]]
    shots = list(ep["screenshots"])
    trees = list(ep["accessibility_trees"])
    n = len(actions)
    if len(shots) < n or len(trees) < n:
        raise ValueError(f"episode {ep.get('episode_id')}: {n} actions but {len(shots)} screenshots and "
                         f"{len(trees)} trees")
    widths = ep.get("screenshot_widths") or [1080] * len(shots)
    heights = ep.get("screenshot_heights") or [2400] * len(shots)
    instr = list(ep.get("step_instructions") or [])
    eid = str(ep.get("episode_id"))
    traj = Trajectory(task_id=f"androidcontrol/{split}/{eid}", suite="androidcontrol", split=split,
                      template="androidcontrol", instruction=str(ep.get("goal", "")), policy="human",
                      source="androidcontrol", has_verifier=False, meta={"origin_episode_id": eid, "points": {}})
    used: list[bytes] = []
    last = n + 1 if add_finish and len(shots) > n else n
    for i in range(last):
        w, h = int(widths[i]), int(heights[i])
        xml = forest_to_xml(trees[i])
        xml_c = compress_xml(xml, width=w, height=h)
        if i < n:
            gt = from_androidcontrol(actions[i], xml_c, w, h)
            action = gt.action
            if gt.point is not None:
                traj.meta["points"][str(i)] = list(gt.point)
        else:
            action = Action(A.FINISH)
        traj.steps.append(StepRecord(index=i, response=format_action(action), action=action.to_dict(),
                                     xml_compressed=xml_c, app="",
                                     step_instruction=instr[i] if i < len(instr) and i < n else None))
        used.append(shots[i])
    traj.finished = bool(traj.steps) and traj.steps[-1].action_name == A.FINISH
    return traj, used


def convert_to_store(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    split: str = "train",
    masking: MaskingOptions | None = None,
    max_episodes: int | None = None,
    add_finish: bool = True,
    progress: bool = True,
) -> CollectResult:
    """Convert AndroidControl files into a masked trajectory store (screenshots masked, texts masked)."""
    from tqdm.auto import tqdm

    opts = masking or MaskingOptions()
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / IMAGES).mkdir(parents=True)
    result = CollectResult()
    registry: set[str] = set()
    t0 = time.perf_counter()
    with StoreWriter(out, manifest={"source": "androidcontrol", "split": split,
                                    "masking": {"mode": opts.mode, "faces": opts.faces, "qr": opts.qr,
                                                "ocr": opts.ocr}}) as writer:
        for k, ep in enumerate(tqdm(iter_episodes(paths), disable=not progress, desc="androidcontrol", unit="ep")):
            if max_episodes is not None and k >= max_episodes:
                break
            traj, shots = convert_episode(ep, split=split, add_finish=add_finish)
            masker = P.TextMasker(opts.mode, seed=f"{opts.seed}|{traj.task_id}")
            regions: Counter = Counter()
            for i, (s, png) in enumerate(zip(traj.steps, shots, strict=True)):
                with Image.open(io.BytesIO(png)) as im:
                    im.load()
                    size = im.size
                    res = opts.mask(im.convert("RGB"), P.sensitive_boxes(s.xml_compressed, masker), size, masker)
                rel = image_path(traj.episode_id, i)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                res.image.save(out / rel, format="PNG", compress_level=opts.png_compress)
                s.screenshot_path = rel
                regions.update(res.counts)
            masked = mask_trajectory(traj, masker)
            writer.write(masked)
            registry.update(surrogate_fingerprints(masker))
            result.n_episodes += 1
            result.n_steps += masked.n_steps
            result.mask_counts.update(masker.counts)
            result.image_regions.update(regions)
        result.wall_s = time.perf_counter() - t0
        writer.manifest["summary"] = result.summary(timings=not writer.reproducible)
    (out / SURROGATE_REGISTRY).write_text("".join(f"{h}\n" for h in sorted(registry)))
    return result
