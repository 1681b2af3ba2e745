"""Bootstrap sampling of the reasoning set D_0 (MobileRL §2.1): an instruct model M explains expert steps.

For every expert step ``(x, a*)`` of the episodes the reasoning-free SFT dataset was built from, M proposes
``k`` reasoning–action candidates ``<think>c_k</think><answer>a_k``; ``(x, c_k, a*)`` is kept when ``a_k``
equals ``a*`` (one kept candidate per step, drawn uniformly among the matches).

M is any generation backend (a :func:`mobilerl.models.backends.make_backend` spec, e.g. ``{kind: openai,
base_url: …, model: Qwen2.5-VL-7B-Instruct}`` for a vLLM server) or, for the embedded default, ``{kind: sim}``:
the simulator-grounded teacher :class:`mobilerl.sft.reasoning.SimTeacher` behind the same interface.

The prompt format, the train/val split and the stores come from the SFT dataset's ``stats.json``, so the
reasoning data is prompted exactly like the reasoning-free data (with the reasoning system prompt). Every
successful episode's steps are explained once, as high-level samples (goal + history): `sft_data`'s mixing
weights and AndroidControl's low-level variant are not applied here. M may be shown another system-prompt
style (an off-the-shelf instruct model needs the full one, which spells out the action space).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mobilerl.config import StageConfig, read_json
from mobilerl.data.sft import write_sharegpt
from mobilerl.models.generation import SamplingConfig
from mobilerl.sft.reasoning import (
    PromptFormat,
    SimTeacher,
    acceptance_by_action,
    bootstrap_select,
    episodes_by_split,
    load_images,
    propose,
    reasoning_records,
)


class BootstrapConfig(StageConfig):
    """Bootstrap sampling: M explains each expert step; matching explanations are kept."""

    sft_dataset: str = Field("data/sft/dataset", description="The reasoning-free dataset whose episodes, split "
                                                             "and prompt format are used.")
    teacher: dict[str, Any] = Field(default_factory=lambda: {"kind": "sim", "p_wrong": 0.3},
                                    description="M: {kind: sim, p_wrong, restate_task, style} (simulator teacher) "
                                                "or a make_backend spec, e.g. {kind: openai, base_url, model}.")
    teacher_prompt_style: Literal["full", "compact"] | None = Field(
        None, description="System prompt style shown to M (null: the dataset's; full for an off-the-shelf "
                          "instruct model).")
    k: int = Field(4, ge=1, description="Candidates per expert step.")
    temperature: float = Field(1.0, ge=0, description="M's sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="M's nucleus sampling.")
    max_new_tokens: int = Field(512, ge=1, description="Cap on a candidate's tokens.")
    max_steps: int | None = Field(None, ge=1, description="Explain a seeded sample of this many steps per split "
                                                          "(null: all).")
    name: str = Field("mobilerl_reasoning", description="Dataset name prefix in dataset_info.json.")
    seed: int = Field(0, description="Sampling and selection seed.")


def make_teacher(spec: dict[str, Any]) -> Any:
    """M from its params spec: the simulator teacher (``kind: sim``) or a generation backend."""
    spec = dict(spec)
    if spec.get("kind") == "sim":
        unknown = sorted(set(spec) - {"kind", "p_wrong", "restate_task", "style"})
        if unknown:
            raise ValueError(f"reasoning_bootstrap.teacher.{unknown[0]}: unknown key for kind 'sim' "
                             f"(known: p_wrong, restate_task, style)")
        return SimTeacher(p_wrong=float(spec.get("p_wrong", 0.3)), restate_task=float(spec.get("restate_task", 1.0)),
                          style=str(spec.get("style", "prose")))
    from mobilerl.models.backends import make_backend

    return make_backend(spec)


def source_stores(sft_stats: dict[str, Any], stores: Path) -> dict[str, Path]:
    """The trajectory stores the SFT dataset was built from (name → folder)."""
    names = sorted(sft_stats.get("sources", {}))
    missing = [n for n in names if not (stores / n / "trajectories.parquet").exists()]
    if missing or not names:
        raise FileNotFoundError(f"stores {missing or names} of the SFT dataset not found under {stores}")
    return {n: stores / n for n in names}


def format_stats(sft_stats: dict[str, Any]) -> dict[str, Any]:
    """What a reasoning dataset carries over from the SFT dataset: prompt format, split, sources."""
    fmt = PromptFormat.of_dataset(sft_stats)
    return {"mode": fmt.mode, "prompt_style": fmt.style, "max_history": fmt.max_history,
            "coords": sft_stats.get("coords", "abs"),
            "val_fraction": sft_stats.get("val_fraction", 0.05), "seed": sft_stats.get("seed", 0),
            "sources": {n: {} for n in sft_stats.get("sources", {})}, "reasoning": True,
            "action_weights": sft_stats.get("action_weights") or {}}


def bootstrap(cfg: BootstrapConfig, sft_dir: Path, stores: Path, out: Path) -> dict[str, Any]:
    """Build D_0 from the SFT dataset ``sft_dir`` and the ``stores`` it came from into ``out`` (the dataset,
    ``explanations.json``: step id → kept response, ``proposals.jsonl``: every candidate with its verdict);
    returns the metrics (acceptance rates)."""
    sft_stats = read_json(sft_dir / "stats.json")
    fmt = PromptFormat.of_dataset(sft_stats)
    teacher_fmt = replace(fmt, style=cfg.teacher_prompt_style or fmt.style)
    carried = format_stats(sft_stats)
    episodes = episodes_by_split(source_stores(sft_stats, stores), carried["val_fraction"], carried["seed"],
                                 carried["coords"])
    rng = random.Random(cfg.seed)
    steps = []
    for split in ("train", "val"):
        split_steps = [st for ep in episodes[split] for st in ep]  # bare-answer histories: nothing explained yet
        if cfg.max_steps is not None and len(split_steps) > cfg.max_steps:
            split_steps = rng.sample(split_steps, cfg.max_steps)
        steps += split_steps
    if not steps:
        raise SystemExit(f"reasoning_bootstrap: no expert steps in the stores of {sft_dir}")

    teacher = make_teacher(cfg.teacher)
    if isinstance(teacher, SimTeacher):
        for st in steps:
            teacher.register(st, teacher_fmt)
    sampling = SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                              seed=cfg.seed)
    t0 = time.perf_counter()
    cands = asyncio.run(propose(teacher, steps, cfg.k, sampling, teacher_fmt, load_images(steps, teacher_fmt)))
    propose_s = time.perf_counter() - t0
    chosen, stats = bootstrap_select(steps, cands, seed=cfg.seed)

    records = {"train": reasoning_records(episodes["train"], chosen, fmt, carried["action_weights"], cfg.seed),
               "val": reasoning_records(episodes["val"], chosen, fmt)}
    data_stats = write_sharegpt(out, cfg.name, records, {**carried, "stage": "reasoning_bootstrap"})
    (out / "explanations.json").write_text(json.dumps(chosen, indent=0, sort_keys=True, ensure_ascii=False) + "\n")
    with (out / "proposals.jsonl").open("w") as f:
        for cs in cands:
            for c in cs:
                f.write(json.dumps({"step_id": c.step_id, "text": c.text, "accepted": c.accepted},
                                   ensure_ascii=False) + "\n")
    n_cands = max(1, stats.candidates)
    counts = {k: v for k, v in stats.to_dict().items() if k != "round"}
    return {
        "teacher": cfg.teacher.get("kind"), "k": cfg.k, **counts,
        "candidate_acceptance": stats.accepted_candidates / n_cands,
        "parse_failure_rate": stats.parse_failures / n_cands,
        "acceptance_by_action": acceptance_by_action(steps, cands),
        "train": data_stats["train"], "val": data_stats["val"], "propose_s": propose_s,
        "prompt_format": {"mode": fmt.mode, "prompt_style": fmt.style, "max_history": fmt.max_history},
    }
