"""SFT datasets from trajectory stores, in LLaMA-Factory's sharegpt multimodal format.

One sample per valid step, prompted by :mod:`mobilerl.agent.prompt` (``<answer>…</answer>``; with
``reasoning`` a stored ``<think>`` is kept). :func:`build_sft` reads the :class:`SftSource` stores
(``collected``, ``human``, ``androidcontrol``; ``variant``: high-level, low-level or both), keeps successful
episodes unless ``only_success`` is off, dedupes identical samples, splits by task id (:func:`split_of`)
and resamples train samples by the source's ``weight`` times ``action_weights`` (validation is not
resampled). Images are copied content-addressed into the dataset directory, since LLaMA-Factory resolves
paths against it. Output layout: docs/data_schema.md, "SFT dataset".
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl.agent import prompt as PR
from mobilerl.data.step_instructions import step_instruction
from mobilerl.data.store import iter_store
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, ActionParseError, format_action
from mobilerl.trajectory import StepRecord, Trajectory

VARIANTS = ("high", "low", "both")


@dataclass
class SftSource:
    name: str
    path: str | Path
    weight: float = 1.0
    variant: str = "high"
    only_success: bool = True

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"source {self.name!r}: variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.weight < 0:
            raise ValueError(f"source {self.name!r}: weight must be >= 0, got {self.weight}")


@dataclass
class Sample:
    source: str
    task_id: str
    variant: str
    messages: list[dict[str, str]]
    response: str
    image: Path | None  # absolute path of the source screenshot
    action_name: str
    key: str = ""


def split_of(task_id: str, val_fraction: float, seed: int) -> str:
    """``train`` or ``val`` for a task (every step of a task on the same side; stable across runs)."""
    h = hashlib.blake2b(f"{seed}|{task_id}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(h, "big") / 2**64 < val_fraction else "train"


_split_of = split_of


def _think(response: str) -> str | None:
    if "<think>" in response and "</think>" in response:
        return response.split("<think>", 1)[1].split("</think>", 1)[0].strip() or None
    return None


def samples_from_trajectory(
    traj: Trajectory, root: Path, source: SftSource, *, mode: str, reasoning: bool, max_history: int | None,
    style: str = "full",
    coords: str = "abs",
) -> Iterable[Sample]:
    """The SFT samples of one stored episode (invalid steps are skipped, as targets and in history).
    ``coords="rel"``: screen bounds and actions on the 0-999 grid (needs the episode's screen size);
    ``coords="marks"``: numbered lines, taps name a line (:mod:`mobilerl.agent.prompt`)."""
    history: list[str] = []
    for s, xml_c, action in framed_steps(traj, coords):
        think = _think(s.response) if reasoning else None
        response = PR.render_response(action, think)
        image = root / s.screenshot_path if s.screenshot_path and mode != "xml" else None
        if image is not None and not image.exists():
            image = None  # a screenshot missing on disk: this sample falls back to the XML
        step_mode = mode if image is not None or mode == "xml" else "xml"
        if source.variant in ("high", "both"):
            msgs = PR.build_messages(traj.instruction, history, xml_c, app=s.app, mode=step_mode,
                                     reasoning=reasoning, max_history=max_history, style=style, coords=coords)
            yield Sample(source.name, traj.task_id, "high", msgs, response, image, action.name)
        # the element's name is read off the screen by its bounds: the recorded (pixel) step in the marks frame
        named = (Action.from_dict(s.action), s.xml_compressed) if coords == "marks" else (action, xml_c)
        low = (s.step_instruction or step_instruction(*named, traj.instruction)
               if source.variant in ("low", "both") else None)
        if low:
            msgs = PR.build_messages(low, (), xml_c, app=s.app, mode=step_mode, reasoning=reasoning, style=style,
                                     coords=coords)
            yield Sample(source.name, traj.task_id, "low", msgs, response, image, action.name)
        history.append(response if reasoning else PR.render_response(format_action(action)))


def framed_steps(traj: Trajectory, coords: str = "abs") -> Iterator[tuple[StepRecord, str, Action]]:
    """``(step, screen, action)`` of each valid step of an episode, screen and action in the ``coords``
    frame (:func:`mobilerl.agent.prompt.in_frame`). Invalid steps are skipped: the SFT data and the
    reasoning stages leave them out as targets and in the history alike. ``ValueError`` when
    ``coords="rel"`` and the record has no screen size."""
    size = screen_size(traj) if coords == "rel" else None
    for s in traj.steps:
        if s.action is None:
            continue
        try:
            xml_c, action = PR.in_frame(s.xml_compressed, Action.from_dict(s.action), size, coords)
        except (ActionParseError, KeyError, TypeError):
            continue
        yield s, xml_c, action


def screen_size(traj: Trajectory) -> tuple[int, int]:
    """The (width, height) the episode was recorded at (``meta["screen_size"]``, written by the rollout)."""
    size = traj.meta.get("screen_size")
    if not size or len(size) != 2:
        raise ValueError(f"{traj.task_id}: no meta.screen_size in the record, needed for coords='rel' "
                         "(re-collect with this version, or use coords='abs')")
    return int(size[0]), int(size[1])


def _fresh_dir(path: str | Path) -> Path:
    """``path`` emptied (a dataset folder is always written whole)."""
    out = Path(path)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def _file_hash(path: Path, cache: dict[Path, str]) -> str:
    h = cache.get(path)
    if h is None:
        h = hashlib.sha1(path.read_bytes()).hexdigest()
        cache[path] = h
    return h


def _copy_image(src: Path, digest: str, out: Path, image_max_side: int | None, done: set[str]) -> str:
    rel = f"images/{digest[:2]}/{digest}.png"
    if digest not in done:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if image_max_side:
            with Image.open(src) as im:
                if max(im.size) > image_max_side:
                    f = image_max_side / max(im.size)
                    im = im.convert("RGB").resize((max(1, round(im.width * f)), max(1, round(im.height * f))),
                                                  Image.BILINEAR)
                    im.save(dst, format="PNG", compress_level=3)
                else:
                    shutil.copyfile(src, dst)
        else:
            shutil.copyfile(src, dst)
        done.add(digest)
    return rel


def dataset_info(name: str) -> dict[str, Any]:
    """The ``dataset_info.json`` entries of a dataset built by :func:`build_sft`."""
    entry = {"formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                      "assistant_tag": "assistant", "system_tag": "system"}}
    return {f"{name}_train": {"file_name": "train.json", **entry}, f"{name}_val": {"file_name": "val.json", **entry}}


def write_sharegpt(out_dir: str | Path, name: str, splits: dict[str, list[dict[str, Any]]],
                   stats: dict[str, Any], image_max_side: int | None = None) -> dict[str, Any]:
    """Write records built elsewhere (e.g. the reasoning stages') as a dataset laid out like
    :func:`build_sft`'s: ``train.json`` / ``val.json``, ``dataset_info.json``, ``stats.json`` (``stats``
    plus the counts). Record ``images`` are paths of existing files; they are copied content-addressed
    under ``images/`` and replaced by their relative paths."""
    out = _fresh_dir(out_dir)
    hashes: dict[Path, str] = {}
    copied: set[str] = set()
    counts = {}
    for split in ("train", "val"):
        recs = []
        for rec in splits.get(split, []):
            imgs = [_copy_image(Path(i), _file_hash(Path(i), hashes), out, image_max_side, copied)
                    for i in rec.get("images", [])]
            recs.append({**rec, "images": imgs})
        (out / f"{split}.json").write_text(json.dumps(recs, ensure_ascii=False, indent=0) + "\n")
        counts[split] = len(recs)
    (out / "dataset_info.json").write_text(json.dumps(dataset_info(name), indent=1) + "\n")
    stats = {**stats, **counts, "images": len(copied), "name": name}
    (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
    return stats


def check_action_weights(action_weights: dict[str, float] | None) -> dict[str, float]:
    """``action_weights`` validated: known action names (:data:`mobilerl.env.actions.ACTION_NAMES`), >= 0."""
    action_weights = dict(action_weights or {})
    bad = sorted(set(action_weights) - set(A.ACTION_NAMES))
    if bad:
        raise ValueError(f"action_weights: unknown action name(s) {bad}; known: {list(A.ACTION_NAMES)}")
    if any(w < 0 for w in action_weights.values()):
        raise ValueError(f"action_weights must be >= 0, got {action_weights}")
    return action_weights


def copies(weight: float, rng: random.Random) -> int:
    """How many times a sample of resampling weight ``weight`` is kept: the integer part, plus one with
    probability equal to the fractional part (one draw of ``rng`` whatever the weight)."""
    return int(weight) + (1 if rng.random() < weight - int(weight) else 0)


def build_sft(
    sources: Sequence[SftSource],
    out_dir: str | Path,
    *,
    mode: str = "screenshot+xml",
    style: str = "full",
    coords: str = "abs",
    reasoning: bool = False,
    val_fraction: float = 0.05,
    seed: int = 0,
    max_history: int | None = None,
    image_max_side: int | None = None,
    name: str = "mobilerl_sft",
    action_weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Build the dataset (see the module docstring); returns the stats also written to ``stats.json``.
    ``mode`` and ``style`` are the prompt's observation mode and system-prompt style
    (:func:`mobilerl.agent.prompt.build_messages`); ``action_weights``: resampling weight by action name
    (:data:`mobilerl.env.actions.ACTION_NAMES`; unnamed ones weigh 1)."""
    action_weights = check_action_weights(action_weights)
    if style not in PR.PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PR.PROMPT_STYLES}, got {style!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    out = _fresh_dir(out_dir)
    hashes: dict[Path, str] = {}
    copied: set[str] = set()
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    stats: dict[str, Any] = {"sources": {}}
    rng = random.Random(seed)
    for src in sources:
        root = Path(src.path)
        st: Counter = Counter()
        train_src: list[tuple[dict[str, Any], str]] = []
        for traj in iter_store(root):
            st["episodes"] += 1
            ok = traj.success or (not traj.has_verifier and traj.error is None)
            if src.only_success and not ok:
                st["episodes_skipped_unsuccessful"] += 1
                continue
            st["episodes_used"] += 1
            split = _split_of(traj.task_id, val_fraction, seed)
            try:
                samples = list(samples_from_trajectory(traj, root, src, mode=mode, reasoning=reasoning,
                                                       max_history=max_history, style=style, coords=coords))
            except ValueError:  # no screen size recorded (coords="rel"): counted, the rest is built
                st["episodes_skipped_no_screen_size"] += 1
                continue
            for smp in samples:
                st["steps"] += 1
                digest = _file_hash(smp.image, hashes) if smp.image is not None and smp.image.exists() else ""
                key = hashlib.sha1("\x00".join([smp.messages[1]["content"], digest, smp.response]).encode()).hexdigest()
                if key in seen:
                    st["duplicates"] += 1
                    continue
                seen.add(key)
                images = [_copy_image(smp.image, digest, out, image_max_side, copied)] if digest else []
                rec = PR.sharegpt_record(smp.messages, smp.response, images)
                st[f"{split}_{smp.variant}"] += 1
                st[f"action/{smp.action_name}"] += 1
                if split == "train":
                    train_src.append((rec, smp.action_name))
                else:
                    splits["val"].append(rec)
        # mixing weight: resample this source's train samples (x the action type's weight)
        mixed: list[dict[str, Any]] = []
        for rec, action_name in train_src:
            mixed.extend([rec] * copies(src.weight * action_weights.get(action_name, 1.0), rng))
        st["train_after_weight"] = len(mixed)
        splits["train"].extend(mixed)
        stats["sources"][src.name] = dict(st)
    rng.shuffle(splits["train"])
    (out / "train.json").write_text(json.dumps(splits["train"], ensure_ascii=False, indent=0) + "\n")
    (out / "val.json").write_text(json.dumps(splits["val"], ensure_ascii=False, indent=0) + "\n")
    (out / "dataset_info.json").write_text(json.dumps(dataset_info(name), indent=1) + "\n")
    stats.update({"train": len(splits["train"]), "val": len(splits["val"]), "images": len(copied),
                  "mode": mode, "prompt_style": style, "coords": coords, "reasoning": reasoning, "max_history": max_history,
                  "val_fraction": val_fraction, "seed": seed, "name": name,
                  "action_weights": action_weights})
    (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
    return stats
