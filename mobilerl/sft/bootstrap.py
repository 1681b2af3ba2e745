"""Bootstrap sampling of the reasoning set D_0 (MobileRL §2.1): an instruct model M explains expert steps.

For every expert step ``(x, a*)`` of the episodes the reasoning-free SFT dataset was built from, M proposes
``k`` reasoning–action candidates ``<think>c_k</think><answer>a_k``; ``(x, c_k, a*)`` is kept when ``a_k``
equals ``a*`` (one kept candidate per step, drawn uniformly among the matches).

M and the thought's budget come from the model profile's ``reasoning`` section
(:class:`mobilerl.models.profiles.ReasoningSettings`): any generation backend (a
:func:`mobilerl.models.backends.make_backend` spec, e.g. ``{kind: openai, base_url: …, model:
Qwen2.5-VL-7B-Instruct}`` for a vLLM server) or, for the embedded default, ``{kind: sim}``: the simulator-grounded
teacher :class:`mobilerl.sft.reasoning.SimTeacher` behind the same interface. M is told the budget and capped at
it; a candidate cut there is rejected.

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
from typing import Any

from pydantic import Field

from mobilerl.config import StageConfig, checked_settings, read_json
from mobilerl.data.sft import write_sharegpt
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.profiles import ReasoningSettings, reasoning_settings
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

    profile: str = Field("tiny", description="Model profile in configs/models/ whose reasoning section (M, the "
                                             "thought's budget) the stage uses.")
    reasoning_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Keys of the profile's reasoning section changed for this stage (null: "
                                          "the profile's), "
                                          "e.g. {teacher: {kind: sim, p_wrong: 0.5}}.")
    sft_dataset: str = Field("data/sft/dataset", description="The reasoning-free dataset whose episodes, split "
                                                             "and prompt format are used.")
    k: int = Field(4, ge=1, description="Candidates per expert step.")
    temperature: float = Field(1.0, ge=0, description="M's sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="M's nucleus sampling.")
    max_steps: int | None = Field(None, ge=1, description="Explain a seeded sample of this many steps per split "
                                                          "(null: all).")
    name: str = Field("mobilerl_reasoning", description="Dataset name prefix in dataset_info.json.")
    seed: int = Field(0, description="Sampling and selection seed.")

    def settings(self) -> ReasoningSettings:
        return reasoning_settings(self.profile, self.reasoning_overrides)


def make_teacher(spec: dict[str, Any]) -> Any:
    """M from a profile's ``reasoning.teacher`` (validated there): the simulator teacher or a generation backend."""
    if spec.get("kind") == "sim":
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
    settings = checked_settings(cfg, "reasoning_bootstrap", "reasoning_overrides", "reasoning")
    sft_stats = read_json(sft_dir / "stats.json")
    fmt = PromptFormat.of_dataset(sft_stats)
    teacher_fmt = replace(fmt, style=settings.teacher_prompt_style or fmt.style, think_tokens=settings.think_tokens)
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

    teacher = make_teacher(settings.teacher)
    if isinstance(teacher, SimTeacher):
        for st in steps:
            teacher.register(st, teacher_fmt)
    sampling = SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=settings.max_new_tokens,
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
    if hasattr(teacher, "aclose"):
        asyncio.run(teacher.aclose())
    n_cands = max(1, stats.candidates)
    counts = {k: v for k, v in stats.to_dict().items() if k != "round"}
    return {
        "teacher": settings.teacher.get("kind"), "k": cfg.k, **counts,
        "truncated_rate": sum(c.truncated for cs in cands for c in cs) / n_cands,
        "candidate_acceptance": stats.accepted_candidates / n_cands,
        "parse_failure_rate": stats.parse_failures / n_cands,
        "acceptance_by_action": acceptance_by_action(steps, cands),
        "train": data_stats["train"], "val": data_stats["val"], "propose_s": propose_s,
        "prompt_format": {"mode": fmt.mode, "prompt_style": fmt.style, "max_history": fmt.max_history},
    }
