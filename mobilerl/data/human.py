"""Import human-annotated episodes (``docs/data_schema.md``: ``episodes.jsonl`` + images) into a trajectory
store, masking texts and screenshots on the way (detectors only: a human export has no canaries)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl.data import privacy as P
from mobilerl.data.masking import (
    SURROGATE_REGISTRY,
    CollectResult,
    MaskingOptions,
    mask_trajectory,
    surrogate_fingerprints,
)
from mobilerl.data.store import IMAGES, StoreWriter, image_path
from mobilerl.env.actions import Action, format_action, parse_action
from mobilerl.env.xml import compress_xml
from mobilerl.trajectory import StepRecord, Trajectory


def _parse_human_action(a: Any) -> Action:
    if isinstance(a, str):
        return parse_action(a)
    if isinstance(a, dict):
        return Action.from_dict(a)
    raise ValueError(f"action must be a call string or an object, got {type(a).__name__}")


def import_human(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    masking: MaskingOptions | None = None,
    progress: bool = True,
    source: str = "human",
) -> CollectResult:
    """Import human-annotated episodes (``<src>/episodes.jsonl`` + images; ``docs/data_schema.md``) into
    the store ``out_dir``, masking texts and screenshots on the way (no canaries: detectors only)."""
    from tqdm.auto import tqdm

    opts = masking or MaskingOptions()
    src = Path(src_dir)
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / IMAGES).mkdir(parents=True)
    result = CollectResult()
    registry: set[str] = set()
    lines = (src / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    t0 = time.perf_counter()
    with StoreWriter(out, manifest={"source": source, "masking": {"mode": opts.mode, "faces": opts.faces,
                                                                  "qr": opts.qr, "ocr": opts.ocr}}) as writer:
        for lineno, line in enumerate(tqdm(lines, disable=not progress, desc=f"import {source}", unit="ep"), 1):
            if not line.strip():
                continue
            try:
                ep = json.loads(line)
                traj, masker, shots_s, regions = _import_episode(ep, src, out, opts, source)
            except (ValueError, KeyError, TypeError, OSError) as e:
                raise ValueError(f"{src / 'episodes.jsonl'}:{lineno}: {e}") from None
            writer.write(traj)
            registry.update(surrogate_fingerprints(masker))
            result.n_episodes += 1
            result.n_steps += traj.n_steps
            result.n_success += bool(traj.success)
            result.mask_counts.update(masker.counts)
            result.image_regions.update(regions)
            result.image_mask_s += shots_s
        result.wall_s = time.perf_counter() - t0
        writer.manifest["summary"] = result.summary(timings=not writer.reproducible)
    (out / SURROGATE_REGISTRY).write_text("".join(f"{h}\n" for h in sorted(registry)))
    return result


def _import_episode(ep: dict[str, Any], src: Path, out: Path, opts: MaskingOptions, source: str
                    ) -> tuple[Trajectory, P.TextMasker, float, Counter]:
    eid = str(ep["episode_id"])
    task_id = f"{source}/{ep.get('split', 'train')}/{eid}"
    masker = P.TextMasker(opts.mode, seed=f"{opts.seed}|{task_id}")
    steps_in = ep["steps"]
    if not isinstance(steps_in, list) or not steps_in:
        raise ValueError(f"episode {eid!r}: 'steps' must be a non-empty list")
    traj = Trajectory(task_id=task_id, suite=source, split=str(ep.get("split", "train")), template=str(ep.get("app", "")),
                      instruction=str(ep["instruction"]), apps=[str(ep["app"])] if ep.get("app") else [],
                      policy=str(ep.get("annotator", "human")), source=source,
                      meta={"origin_episode_id": eid})
    regions: Counter = Counter()
    shots_s = 0.0
    for i, st in enumerate(steps_in):
        action = _parse_human_action(st["action"])
        w, h = int(st.get("width", 1080)), int(st.get("height", 2400))
        xml_c = st.get("xml_compressed")
        if not xml_c and st.get("xml"):
            xml_c = compress_xml(st["xml"], width=w, height=h)
        xml_c = xml_c or ""
        think = st.get("think")
        resp = format_action(action) if not think else f"<think>{think}</think><answer>{format_action(action)}</answer>"
        rec = StepRecord(index=i, response=resp, action=action.to_dict(), xml_compressed=xml_c,
                         app=str(st.get("app", ep.get("app", ""))), step_instruction=st.get("step_instruction"))
        if st.get("screenshot"):
            t0 = time.perf_counter()
            with Image.open(src / st["screenshot"]) as im:
                im.load()
                res = opts.mask(im.convert("RGB"), P.sensitive_boxes(xml_c, masker), (w, h), masker)
            rel = image_path(f"{task_id}#0", i)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            res.image.save(out / rel, format="PNG", compress_level=opts.png_compress)
            rec.screenshot_path = rel
            regions.update(res.counts)
            shots_s += time.perf_counter() - t0
        traj.steps.append(rec)
    last = traj.steps[-1].action or {}
    traj.finished = last.get("name") == "Finish"
    traj.answer = last.get("message")
    ok = ep.get("success")
    traj.reward = None if ok is None else float(bool(ok))
    traj.success = bool(ok) and traj.finished
    traj.has_verifier = ok is not None
    return mask_trajectory(traj, masker), masker, shots_s, regions
