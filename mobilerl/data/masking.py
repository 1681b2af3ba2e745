"""Masking before storage (MobileRL Appendix D, D.2): what every store writer shares.

:class:`MaskingOptions` says how texts and screenshots are masked; :func:`mask_trajectory` masks an episode's
texts with its :class:`~mobilerl.data.privacy.TextMasker`; :func:`find_canaries` is the pre-write check for
planted values that survived. Surrogates are registered by fingerprint only (:data:`SURROGATE_REGISTRY`),
so the audit can tell them from real data without anything raw on disk. :class:`CollectResult` is what a
masked store write reports (collection, human import, AndroidControl conversion).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from mobilerl.data import privacy as P
from mobilerl.data.privacy_image import FAST_CASCADES, THOROUGH_CASCADES, mask_image
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import TaskSpec
from mobilerl.trajectory import Trajectory

SURROGATE_REGISTRY = "surrogates.sha256"


# ================================================================================== configuration


@dataclass
class MaskingOptions:
    """How data is masked before storage.

    ``mode``: ``token`` or ``surrogate`` (:class:`~mobilerl.data.privacy.TextMasker`);
    ``known_categories``: canary categories masked as known values (the detectors cover the rest);
    ``faces`` / ``qr`` / ``ocr``: image detectors; ``thorough_faces``: all cascades at 1280 px (slower);
    ``style``: ``fill`` or ``blur``; ``png_compress``: zlib level of the stored PNGs;
    ``image_max_side``: store screenshots downscaled to this longer side (None: as captured). Masking runs
    on the stored size; UI-dump boxes are scaled to it.
    """

    mode: str = "token"
    known_categories: tuple[str, ...] = (P.PERSON_NAME, P.ADDRESS)
    faces: bool = True
    qr: bool = True
    ocr: bool = False
    thorough_faces: bool = False
    style: str = "fill"
    png_compress: int = 3
    image_max_side: int | None = None
    seed: int = 0

    def image_kwargs(self) -> dict[str, Any]:
        return {"faces": self.faces, "qr": self.qr, "ocr": self.ocr, "style": self.style,
                "face_cascades": THOROUGH_CASCADES if self.thorough_faces else FAST_CASCADES,
                "face_max_side": 1280 if self.thorough_faces else 640, "qr_both": self.thorough_faces}

    def mask(self, img: Image.Image, boxes: Any, box_space: tuple[int, int], masker: Any = None) -> Any:
        """Mask a captured screenshot for storage: QR codes are found on the full-size capture, the rest
        on the stored (downscaled) image; returns a :class:`~mobilerl.data.privacy_image.ImageMaskResult`."""
        from mobilerl.data.privacy_image import Region, detect_qr

        small = self.shrink(img)
        kw = self.image_kwargs()
        if small.size == img.size or not self.qr:
            return mask_image(small, boxes=boxes, box_space=box_space, masker=masker, **kw)
        t0 = time.perf_counter()
        sx, sy = small.width / img.width, small.height / img.height
        pre = [Region((int(b[0] * sx), int(b[1] * sy), int(b[2] * sx) + 1, int(b[3] * sy) + 1), "qr")
               for b in detect_qr(img, both=self.thorough_faces)]
        qr_s = time.perf_counter() - t0
        res = mask_image(small, boxes=boxes, box_space=box_space, masker=masker, regions=pre, **{**kw, "qr": False})
        res.timings["qr_s"] = qr_s
        return res

    def teach(self, masker: P.TextMasker, planted: Mapping[str, str], task_params: Mapping[str, Any]) -> None:
        """An episode's text masker learns values a device planted (``value -> category``): those of
        ``known_categories`` are masked as known values (the first and last names of the task's own people too:
        they get typed into separate fields), and none may be a surrogate."""
        known = {k: v for k, v in planted.items() if v in self.known_categories}
        if known:
            masker.add_known(known)
            if P.PERSON_NAME in self.known_categories:
                params = {str(v) for v in task_params.values() if isinstance(v, str)}
                masker.add_name_parts(k for k, v in known.items() if v == P.PERSON_NAME and k in params)
        masker.surrogates.add_avoid(planted)

    def shrink(self, img: Image.Image) -> Image.Image:
        """The screenshot as stored: downscaled so its longer side is at most ``image_max_side``."""
        m = self.image_max_side
        if not m or max(img.size) <= m:
            return img
        k = max(img.size) // m  # integer box reduction first (fast), then a bilinear rest
        if k >= 2:
            img = img.reduce(k)
        if max(img.size) > m:
            f = m / max(img.size)
            img = img.resize((max(1, round(img.width * f)), max(1, round(img.height * f))), Image.BILINEAR)
        return img


def fingerprint(value: str) -> str:
    """Hash of a value's letters and digits (lower-cased): how surrogates are registered without storing
    anything that could be mistaken for data."""
    norm = re.sub(r"[^0-9a-z]", "", value.lower())
    return hashlib.sha256(norm.encode()).hexdigest()


def surrogate_fingerprints(masker: P.TextMasker) -> set[str]:
    """Fingerprints of every surrogate ``masker`` produced (phones also by their last 10 digits)."""
    out = set()
    for fake in masker.inverse:
        out.add(fingerprint(fake))
        d = re.sub(r"\D", "", fake)
        if len(d) >= 7:
            out.add(fingerprint(d[-10:]))
    return out


# ================================================================================== canary search


def canary_patterns(canaries: Iterable[str]) -> list[tuple[str, re.Pattern[str]]]:
    """For numbers (7+ digits) a pattern of their national digits with any separators in between."""
    out = []
    for c in canaries:
        d = re.sub(r"\D", "", c)
        if len(d) < 7 or re.search(r"[A-Za-z]{2}", c):
            continue
        nsn = d
        try:
            import phonenumbers

            num = phonenumbers.parse(c, None if c.strip().startswith("+") else "US")
            if phonenumbers.is_valid_number(num):
                nsn = str(num.national_number)
        except Exception:  # noqa: BLE001 - not a phone number: use all its digits
            pass
        body = r"[\s\-.()/]*".join(nsn)
        out.append((c, re.compile(r"(?<!\d)" + body + r"(?!\d)")))
    return out


def find_canaries(text: str, canaries: Iterable[str], patterns: list[tuple[str, re.Pattern[str]]] | None = None
                  ) -> list[str]:
    """The canaries that occur in ``text``: exactly (case-insensitive) or, for numbers, by their digits."""
    if not text:
        return []
    low = text.lower()
    hits = [c for c in canaries if len(c) >= 4 and c.lower() in low]
    for c, rx in (patterns if patterns is not None else canary_patterns(canaries)):
        if c not in hits and rx.search(text):
            hits.append(c)
    return hits


# =========================================================================== masking a trajectory


def _mask_action(a: dict[str, Any] | None, m: P.TextMasker) -> dict[str, Any] | None:
    if a is None:
        return None
    out = dict(a)
    for key in ("text", "message"):
        if out.get(key):
            out[key] = m(out[key])
    return out


def mask_trajectory(traj: Trajectory, m: P.TextMasker, learn: bool = True) -> Trajectory:
    """A masked copy: instruction, answer, final screen, and per step the XML, response (re-rendered from
    the masked action when it was the canonical form) and action. With ``learn``, every value detected in
    any text of the episode is first made a known value (:meth:`~mobilerl.data.privacy.TextMasker.learn`),
    so it is masked in all of them."""
    if learn:
        for _, text in trajectory_texts(traj):
            m.learn(text)
    d = traj.to_dict()
    d["instruction"] = m(traj.instruction)
    d["answer"] = m(traj.answer) if traj.answer else traj.answer
    d["final_xml_compressed"] = m(traj.final_xml_compressed) if traj.final_xml_compressed else traj.final_xml_compressed
    d["error"] = m(traj.error) if traj.error else traj.error
    steps = []
    for s in traj.steps:
        sd = s.to_dict()
        sd["xml_compressed"] = m(s.xml_compressed)
        sd["action"] = _mask_action(s.action, m)
        if s.action is not None and s.response.strip() == format_action(Action.from_dict(s.action)):
            sd["response"] = format_action(Action.from_dict(sd["action"]))
        else:
            sd["response"] = m(s.response)
        sd["invalid"] = m(s.invalid) if s.invalid else s.invalid
        sd["step_instruction"] = m(s.step_instruction) if s.step_instruction else s.step_instruction
        if sd["response"] != s.response:  # the token ids would decode to the unmasked response
            sd.pop("token_ids", None)
        steps.append(sd)
    d["steps"] = steps
    return Trajectory.from_dict(d)


def trajectory_texts(traj: Trajectory) -> Iterable[tuple[str, str]]:
    """``(field, text)`` of every stored text of an episode (what audits scan)."""
    yield "instruction", traj.instruction
    if traj.answer:
        yield "answer", traj.answer
    if traj.final_xml_compressed:
        yield "final_xml_compressed", traj.final_xml_compressed
    if traj.error:
        yield "error", traj.error
    for s in traj.steps:
        yield f"steps[{s.index}].xml_compressed", s.xml_compressed
        yield f"steps[{s.index}].response", s.response
        if s.step_instruction:
            yield f"steps[{s.index}].step_instruction", s.step_instruction
        if s.invalid:
            yield f"steps[{s.index}].invalid", s.invalid
        if s.action:
            for key in ("text", "message", "app"):
                if s.action.get(key):
                    yield f"steps[{s.index}].action.{key}", str(s.action[key])


# ==================================================== what a masked store write keeps and reports


@dataclass
class EpisodeSecrets:
    """What one episode keeps in memory only: canaries, the masker (surrogate inverse) and raw actions."""

    task: TaskSpec
    canaries: dict[str, str] = field(default_factory=dict)
    masker: P.TextMasker | None = None
    raw_actions: list[dict[str, Any] | None] = field(default_factory=list)
    reward: float | None = None


@dataclass
class CollectResult:
    """What a masked store write reports (collection, human import, AndroidControl conversion)."""

    n_episodes: int = 0
    n_steps: int = 0
    n_success: int = 0
    n_errors: int = 0
    leaks_blocked: int = 0
    leaked_categories: Counter = field(default_factory=Counter)
    mask_counts: Counter = field(default_factory=Counter)
    image_regions: Counter = field(default_factory=Counter)
    image_mask_s: float = 0.0
    wall_s: float = 0.0
    secrets: dict[str, EpisodeSecrets] = field(default_factory=dict)  # episode id -> in memory only

    def summary(self, timings: bool = True) -> dict[str, Any]:
        """Counts and masking statistics; ``timings=False`` leaves out the wall-clock figures (a reproducible
        store's manifest: they stay in the stage's metrics)."""
        out = {
            "episodes": self.n_episodes, "steps": self.n_steps, "success": self.n_success,
            "success_rate": self.n_success / self.n_episodes if self.n_episodes else None,
            "errors": self.n_errors, "leaks_blocked": self.leaks_blocked,
            "leaked_categories": dict(self.leaked_categories), "masked_text_spans": dict(self.mask_counts),
            "masked_image_regions": dict(self.image_regions),
            "image_mask_s_per_step": self.image_mask_s / self.n_steps if self.n_steps else None,
            "wall_s": self.wall_s,
        }
        if not timings:
            del out["image_mask_s_per_step"], out["wall_s"]
        return out
