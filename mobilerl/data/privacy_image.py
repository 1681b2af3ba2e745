"""Image side of the privacy masking (MobileRL Appendix D.2): regions of a screenshot that hold personal
data are filled (or blurred) before it is stored.

:func:`mask_image` combines four sources: ``boxes`` the caller knows (e.g.
:func:`mobilerl.data.privacy.sensitive_boxes` of the UI dump, scaled to the image); faces (OpenCV Haar
cascades on a downscaled grey copy); QR codes (OpenCV, at full size: detect them on the capture before
downscaling it and pass them as ``regions``); and optional OCR (tesseract lines through the text masker),
which catches text painted into pixels that the dump does not list. Regions are padded by ``pad`` and
filled grey (``style="fill"``) or pixelated and blurred (``"blur"``); per-source timings come back too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

Box = tuple[int, int, int, int]
FILL_COLOR = (96, 96, 96)


@dataclass(frozen=True)
class Region:
    box: Box
    kind: str  # "text" (from the UI dump), "face", "qr", "ocr"
    category: str | None = None


@dataclass
class ImageMaskResult:
    image: Image.Image
    regions: list[Region] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.regions:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out


# ------------------------------------------------------------------------------------------ faces


# OpenCV's detectors keep working state in the object: one object used by several threads at once (the
# collector masks screenshots in a thread pool) gave spurious or different detections from run to run. Each
# thread gets its own instances.
_per_thread = threading.local()


def _cascade(name: str):
    cache = _per_thread.__dict__.setdefault("cascades", {})
    if name not in cache:
        import cv2

        c = cv2.CascadeClassifier(cv2.data.haarcascades + f"haarcascade_{name}.xml")
        if c.empty():  # pragma: no cover - opencv-python-headless 4.x ships them
            raise RuntimeError(f"OpenCV Haar cascade {name!r} not found (opencv-python-headless 4.x is needed)")
        cache[name] = c
    return cache[name]


def _gray(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("L"))


FAST_CASCADES = ("frontalface_default",)
THOROUGH_CASCADES = ("frontalface_default", "frontalface_alt2", "profileface")


def detect_faces(
    img: Image.Image,
    *,
    max_side: int = 640,
    min_neighbors: int = 4,
    cascades: Sequence[str] = FAST_CASCADES,
) -> list[Box]:
    """Face boxes (image coordinates): the union of the Haar ``cascades`` (the profile one also on the
    mirrored image) run on a grey copy at most ``max_side`` pixels long (no histogram equalisation: a
    mostly white screenshot would wash faces out). At 640 px, faces of ~60 px and more on a 1200 px image
    are found; :data:`THOROUGH_CASCADES` at 1280 px finds smaller ones, ~5x slower."""
    import cv2

    gray = _gray(img)
    h, w = gray.shape
    scale = min(1.0, max_side / max(h, w))
    small = cv2.resize(gray, (max(1, int(w * scale)), max(1, int(h * scale))), interpolation=cv2.INTER_AREA) \
        if scale < 1.0 else gray
    found: list[Box] = []
    for name in cascades:
        variants = [(small, False)]
        if name == "profileface":
            variants.append((cv2.flip(small, 1), True))
        for im, flipped in variants:
            for x, y, fw, fh in _cascade(name).detectMultiScale(im, 1.1, min_neighbors, minSize=(20, 20)):
                if flipped:
                    x = im.shape[1] - x - fw
                found.append((int(x / scale), int(y / scale), int((x + fw) / scale), int((y + fh) / scale)))
    return _merge_boxes(found)


# ---------------------------------------------------------------------------------------- QR codes


def _qr_detectors() -> tuple:
    dets = getattr(_per_thread, "qr", None)
    if dets is None:
        import cv2

        dets = [cv2.QRCodeDetector()]
        if hasattr(cv2, "QRCodeDetectorAruco"):
            dets.append(cv2.QRCodeDetectorAruco())
        dets = _per_thread.qr = tuple(dets)
    return dets


def detect_qr(img: Image.Image, *, max_side: int | None = None, both: bool = False) -> list[Box]:
    """Bounding boxes of the QR codes in ``img`` (content not decoded), from OpenCV's ArUco-based QR
    detector on a grey copy (at most ``max_side`` pixels long; None: full size — small codes need it);
    ``both`` also runs the classic ``QRCodeDetector`` and merges what either finds."""
    import cv2

    gray = _gray(img)
    scale = min(1.0, max_side / max(gray.shape)) if max_side else 1.0
    arr = gray if scale == 1.0 else cv2.resize(gray, (max(1, int(gray.shape[1] * scale)),
                                                      max(1, int(gray.shape[0] * scale))), interpolation=cv2.INTER_AREA)
    found: list[Box] = []
    dets = _qr_detectors()
    for det in (dets[::-1] if both else dets[-1:]):
        try:
            ok, pts = det.detectMulti(arr)
        except Exception:  # noqa: BLE001 - OpenCV raises on degenerate inputs
            ok, pts = False, None
        if not ok or pts is None:
            continue
        for quad in np.asarray(pts).reshape(-1, 4, 2):
            xs, ys = quad[:, 0] / scale, quad[:, 1] / scale
            found.append((int(xs.min()), int(ys.min()), int(np.ceil(xs.max())), int(np.ceil(ys.max()))))
    return _merge_boxes(found)


# --------------------------------------------------------------------------------------------- OCR


@dataclass(frozen=True)
class OcrWord:
    text: str
    box: Box
    line: tuple[int, int, int]  # (block, paragraph, line)


def ocr_words(img: Image.Image, *, scale: float = 1.0, psm: int = 11) -> list[OcrWord]:
    """Tesseract words with boxes (image coordinates). ``psm=11`` (sparse text) suits screenshots."""
    import pytesseract

    im = img.convert("RGB")
    if scale != 1.0:
        im = im.resize((max(1, int(im.width * scale)), max(1, int(im.height * scale))))
    d = pytesseract.image_to_data(im, config=f"--psm {psm}", output_type=pytesseract.Output.DICT)
    out = []
    for i, text in enumerate(d["text"]):
        if not text or not text.strip():
            continue
        x, y, w, h = (int(d[k][i] / scale) for k in ("left", "top", "width", "height"))
        out.append(OcrWord(text.strip(), (x, y, x + w, y + h), (d["block_num"][i], d["par_num"][i], d["line_num"][i])))
    return out


def ocr_lines(words: Sequence[OcrWord]) -> list[tuple[str, list[tuple[int, int, OcrWord]]]]:
    """Group words into lines: ``(line text, [(start, end, word), ...])`` with character offsets."""
    lines: dict[tuple[int, int, int], list[OcrWord]] = {}
    for w in words:
        lines.setdefault(w.line, []).append(w)
    out = []
    for key in sorted(lines):
        ws = sorted(lines[key], key=lambda w: w.box[0])
        parts, offs, pos = [], [], 0
        for w in ws:
            offs.append((pos, pos + len(w.text), w))
            parts.append(w.text)
            pos += len(w.text) + 1
        out.append((" ".join(parts), offs))
    return out


def ocr_sensitive(img: Image.Image, masker=None, *, scale: float = 1.0) -> list[Region]:
    """OCR ``img`` and return the boxes of words inside spans flagged by ``masker`` (a
    :class:`~mobilerl.data.privacy.TextMasker`; default: the plain detector)."""
    from mobilerl.data.privacy import detect

    words = ocr_words(img, scale=scale)
    regions = []
    lines = ocr_lines(words)
    # Whole-screen text too, so a context word on the line above still counts.
    for text, offs in lines:
        spans = masker.spans(text) if masker is not None else detect(text)
        for sp in spans:
            hit = [w for s, e, w in offs if s < sp.end and sp.start < e]
            if hit:
                regions.append(Region(_union([w.box for w in hit]), "ocr", sp.category))
    if len(lines) > 1:
        joined = "\n".join(t for t, _ in lines)
        spans = masker.spans(joined) if masker is not None else detect(joined)
        base = 0
        index = []
        for text, offs in lines:
            index.extend((base + s, base + e, w) for s, e, w in offs)
            base += len(text) + 1
        seen = {r.box for r in regions}
        for sp in spans:
            hit = [w for s, e, w in index if s < sp.end and sp.start < e]
            if hit:
                box = _union([w.box for w in hit])
                if box not in seen:
                    regions.append(Region(box, "ocr", sp.category))
    return regions


# ---------------------------------------------------------------------------------------- masking


def _union(boxes: Sequence[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _merge_boxes(boxes: Sequence[Box]) -> list[Box]:
    """Merge boxes that overlap (duplicate detections of one face/code)."""
    out: list[Box] = []
    for b in sorted(boxes):
        for i, o in enumerate(out):
            if b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3]:
                out[i] = _union([o, b])
                break
        else:
            out.append(b)
    return out


def _scale_box(box: Box, sx: float, sy: float) -> Box:
    x1, y1, x2, y2 = box
    return (int(x1 * sx), int(y1 * sy), int(np.ceil(x2 * sx)), int(np.ceil(y2 * sy)))


def apply_regions(img: Image.Image, regions: Iterable[Region], *, style: str = "fill", pad: int = 4) -> Image.Image:
    """A copy of ``img`` with every region filled (``fill``) or pixelated and blurred (``blur``)."""
    if style not in ("fill", "blur"):
        raise ValueError(f"style must be 'fill' or 'blur', got {style!r}")
    out = img.convert("RGB").copy()
    draw = ImageDraw.Draw(out)
    W, H = out.size
    for r in regions:
        x1, y1, x2, y2 = r.box
        b = (max(0, x1 - pad), max(0, y1 - pad), min(W, x2 + pad), min(H, y2 + pad))
        if b[2] <= b[0] or b[3] <= b[1]:
            continue
        if style == "fill":
            draw.rectangle((b[0], b[1], b[2] - 1, b[3] - 1), fill=FILL_COLOR)
        else:
            crop = out.crop(b)
            cw, ch = crop.size
            tiny = crop.resize((max(1, cw // 16), max(1, ch // 16)), Image.BILINEAR)
            out.paste(tiny.resize((cw, ch), Image.NEAREST).filter(ImageFilter.BoxBlur(6)), b[:2])
    return out


def mask_image(
    img: Image.Image,
    *,
    boxes: Iterable[tuple[Box, str | None]] = (),
    box_space: tuple[int, int] | None = None,
    faces: bool = True,
    qr: bool = True,
    ocr: bool = False,
    masker=None,
    style: str = "fill",
    pad: int = 4,
    face_max_side: int = 640,
    face_cascades: Sequence[str] = FAST_CASCADES,
    qr_both: bool = False,
    regions: Iterable[Region] = (),
    ocr_scale: float = 1.0,
) -> ImageMaskResult:
    """Mask personal data in ``img`` (see the module docstring).

    Args:
        boxes: known sensitive regions ``(box, category)``, in ``box_space`` coordinates (the screen size
            of the UI dump; default: the image's own size).
        faces, qr, ocr: which detectors to run. ``masker``: the episode's text masker, for OCR'd lines.
        regions: regions found beforehand (image coordinates), e.g. QR codes found on the full-size capture
            before it was downscaled for storage.
    """
    t: dict[str, float] = {}
    found: list[Region] = list(regions)
    W, H = img.size
    sx, sy = (W / box_space[0], H / box_space[1]) if box_space else (1.0, 1.0)
    t0 = time.perf_counter()
    found.extend(Region(_scale_box(b, sx, sy), "text", c) for b, c in boxes)
    t["text_s"] = time.perf_counter() - t0
    if faces:
        t0 = time.perf_counter()
        found.extend(Region(b, "face") for b in detect_faces(img, max_side=face_max_side, cascades=face_cascades))
        t["faces_s"] = time.perf_counter() - t0
    if qr:
        t0 = time.perf_counter()
        found.extend(Region(b, "qr") for b in detect_qr(img, both=qr_both))
        t["qr_s"] = time.perf_counter() - t0
    if ocr:
        t0 = time.perf_counter()
        found.extend(ocr_sensitive(img, masker, scale=ocr_scale))
        t["ocr_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = apply_regions(img, found, style=style, pad=pad) if found else img
    t["apply_s"] = time.perf_counter() - t0
    return ImageMaskResult(out, found, t)
