"""Privacy audit of stored data: is any personal data left in what the collection wrote?

For every trajectory store it scans

- every stored text — instruction, answer, final screen, per step the compressed XML, response, action
  text, step instruction (:func:`mobilerl.data.masking.trajectory_texts`) — and the store's JSON files;
- the OCR'd text of stored screenshots (all of them, or a deterministic sample of ``ocr_max_images``);

with two checks:

1. **detector** — :func:`mobilerl.data.privacy.detect` (all nine categories). Spans that are surrogates
   the collector produced (their fingerprints are in the store's ``surrogates.sha256``) are not
   findings; everything else is.
2. **canaries** — the exact raw personal values the simulator planted (names, phone numbers, e-mails,
   addresses, order and tracking numbers), found exactly or, for numbers, by their digits. The audit
   re-derives them from the task ids of the stored episodes by rebuilding each task's device
   (``SimEnv.reset`` + ``canary_categories(materialize=True)``): nothing about them is ever written, so
   the audit can run as its own process. (A collector can also pass its in-memory canaries.)

Findings never hold the raw value: the report has the category, the rule, where it was found, a short
fingerprint and the context with the value replaced by its category token.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mobilerl.data import privacy as P
from mobilerl.data.masking import (
    SURROGATE_REGISTRY,
    canary_patterns,
    find_canaries,
    fingerprint,
    trajectory_texts,
)
from mobilerl.data.store import MANIFEST, TABLE, iter_store
from mobilerl.trajectory import Trajectory


@dataclass
class Finding:
    store: str
    episode_id: str
    where: str  # text field, or "image:<path>"
    check: str  # "detector" | "canary"
    category: str
    rule: str
    fingerprint: str  # first 12 hex of the value's fingerprint
    context: str  # the surroundings, the value replaced by its token


@dataclass
class AuditReport:
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings

    def summary(self) -> dict[str, Any]:
        by = Counter((f.check, f.category) for f in self.findings)
        return {
            "passed": self.passed,
            "findings": len(self.findings),
            "findings_by_check": dict(Counter(f.check for f in self.findings)),
            "findings_by_category": {f"{c}/{k}": n for (c, k), n in sorted(by.items())},
            "stores": self.stores,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "details": [asdict(f) for f in self.findings]}


def _context(text: str, start: int, end: int, category: str, width: int = 40) -> str:
    a, b = max(0, start - width), min(len(text), end + width)
    return (text[a:start] + P.token(category) + text[end:b]).replace("\n", " ⏎ ")


def _surrogate(value: str, registry: set[str]) -> bool:
    if not registry:
        return False
    if fingerprint(value) in registry:
        return True
    d = "".join(c for c in value if c.isdigit())
    return len(d) >= 7 and fingerprint(d[-10:]) in registry


@lru_cache(maxsize=4096)
def sim_canaries(task_id: str) -> tuple[tuple[str, str], ...]:
    """``(value, category)`` planted for a simulator task, re-derived from its id (device content drawn
    lazily is materialized; parameters included)."""
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.tasks.registry import get_task

    env = SimEnv(render=False, perturb="none")
    env.reset(get_task(task_id, with_optimal=False))
    try:
        return tuple(sorted(env.canary_categories(materialize=True).items()))
    finally:
        env.close()


def default_canaries(traj: Trajectory) -> Mapping[str, str]:
    """Canaries of a stored episode: re-derived for simulator suites, none otherwise."""
    from mobilerl.env.sim.tasks.registry import SUITES

    if traj.suite not in SUITES:
        return {}
    try:
        return dict(sim_canaries(traj.task_id))
    except KeyError:
        return {}


def _scan_text(text: str, canaries: Mapping[str, str], pats: list, registry: set[str], where: str, store: str,
               episode: str, out: list[Finding], stats: Counter) -> None:
    if not text:
        return
    stats["texts"] += 1
    stats["chars"] += len(text)
    for sp in P.detect(text):
        value = text[sp.start:sp.end]
        if _surrogate(value, registry):
            stats["surrogates_seen"] += 1
            continue
        out.append(Finding(store, episode, where, "detector", sp.category, sp.rule, fingerprint(value)[:12],
                           _context(text, sp.start, sp.end, sp.category)))
    for c in find_canaries(text, canaries, pats):
        i = text.lower().find(c.lower())
        ctx = _context(text, i, i + len(c), canaries[c]) if i >= 0 else "(found by its digits)"
        out.append(Finding(store, episode, where, "canary", canaries[c], "planted", fingerprint(c)[:12], ctx))


def ocr_text(path: str | Path, scale: float = 1.0) -> str:
    """The OCR'd lines of an image, one per line."""
    from PIL import Image

    from mobilerl.data.privacy_image import ocr_lines, ocr_words

    with Image.open(path) as im:
        im.load()
        words = ocr_words(im, scale=scale)
    return "\n".join(t for t, _ in ocr_lines(words))


def audit_store(
    root: str | Path,
    *,
    canaries_for: Callable[[Trajectory], Mapping[str, str]] = default_canaries,
    ocr: bool = True,
    ocr_max_images: int | None = None,
    ocr_scale: float = 1.0,
    ocr_workers: int = 2,
    seed: int = 0,
    name: str | None = None,
    report: AuditReport | None = None,
    progress: bool = False,
) -> AuditReport:
    """Audit one store (see the module docstring); findings are appended to ``report``."""
    root = Path(root)
    report = report or AuditReport()
    store = name or root.name
    reg_path = root / SURROGATE_REGISTRY
    registry = set(reg_path.read_text().split()) if reg_path.exists() else set()
    stats: Counter = Counter()
    images: list[tuple[str, str, Mapping[str, str]]] = []  # (path, episode, canaries)
    for traj in iter_store(root):
        stats["episodes"] += 1
        canaries = canaries_for(traj)
        stats["canaries"] += len(canaries)
        pats = canary_patterns(canaries)
        for where, text in trajectory_texts(traj):
            _scan_text(text, canaries, pats, registry, where, store, traj.episode_id, report.findings, stats)
        for s in traj.steps:
            if s.screenshot_path:
                images.append((s.screenshot_path, traj.episode_id, canaries))
    for fname in (MANIFEST,):
        p = root / fname
        if p.exists():
            _scan_text(p.read_text(), {}, [], registry, fname, store, "-", report.findings, stats)
    stats["images"] = len(images)
    if ocr and images:
        chosen = images
        if ocr_max_images is not None and len(images) > ocr_max_images:
            rng = random.Random(hashlib.sha256(f"{seed}|{store}".encode()).digest())
            chosen = sorted(rng.sample(images, ocr_max_images))
        from tqdm.auto import tqdm

        with ThreadPoolExecutor(max_workers=max(1, ocr_workers)) as pool:
            texts = list(tqdm(pool.map(lambda it: ocr_text(root / it[0], ocr_scale), chosen), total=len(chosen),
                              desc=f"audit OCR {store}", unit="img", disable=not progress))
        for (path, episode, canaries), text in zip(chosen, texts, strict=True):
            stats["images_ocr"] += 1
            _scan_text(text, canaries, canary_patterns(canaries), registry, f"image:{path}", store, episode,
                       report.findings, stats)
    stats["findings"] = sum(1 for f in report.findings if f.store == store)
    report.stores[store] = dict(stats)
    return report


def audit_files(root: str | Path, canaries: Mapping[str, str], *, name: str | None = None,
                report: AuditReport | None = None) -> AuditReport:
    """Audit every file under ``root`` that is not a trajectory store (an RL run's ``rl.work`` left by a killed
    run: checkpoints, weights, curves): each file's bytes, read as text, for the planted ``canaries`` (exact or by
    their digits); the detectors too on the text of text records: the strings of ``.json`` / ``.jsonl`` files
    (their numbers, metrics, are no personal data), the whole of ``.txt`` files."""
    root = Path(root)
    report = report or AuditReport()
    store = name or root.name
    stats: Counter = Counter()
    pats = canary_patterns(canaries)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        text = path.read_bytes().decode("utf-8", errors="ignore")
        stats["files"] += 1
        where = str(path.relative_to(root))
        if path.suffix in (".json", ".jsonl", ".txt"):
            strings = text if path.suffix == ".txt" else "\n".join(_json_strings(text))
            _scan_text(strings, {}, [], set(), where, store, "-", report.findings, stats)
        for c in find_canaries(text, canaries, pats):
            report.findings.append(Finding(store, "-", where, "canary", canaries[c], "planted",
                                           fingerprint(c)[:12], "(planted value)"))
    stats["findings"] = sum(1 for f in report.findings if f.store == store)
    report.stores[store] = dict(stats)
    return report


def _json_strings(text: str) -> list[str]:
    """Every string (keys included) of a JSON document or of each line of a JSON-lines file; the raw text where
    it does not parse."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                out.append(str(k))
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    try:
        walk(json.loads(text))
    except ValueError:
        for line in text.splitlines():
            try:
                walk(json.loads(line))
            except ValueError:
                out.append(line)
    return out


def find_stores(root: str | Path) -> list[Path]:
    """Every trajectory store (a directory with ``trajectories.parquet``) under ``root``."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob(TABLE))


def audit(stores: Iterable[str | Path], progress: bool = False, **kwargs: Any) -> AuditReport:
    """:func:`audit_store` of each store into one report (``progress``: a bar of the stores, and of each's OCR)."""
    from tqdm.auto import tqdm

    report = AuditReport()
    stores = list(stores)
    for s in tqdm(stores, desc="audit", unit="store", disable=not progress):
        audit_store(s, report=report, progress=progress, **kwargs)
    return report


def write_report(report: AuditReport, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False, sort_keys=True) + "\n")
