"""Release the tiny base: train (or take a finished run), probe on held-out screens, write the checkpoint.

The released folder (``models/tiny-base/``) is HF format plus ``tiny.json`` (the recipe it was trained with),
``curve.jsonl`` (the learning curve) and ``metrics.json`` (the release probe: greedy generation, exact answers,
200 held-out items per kind; the acceptance targets; the training summary; how to rebuild it).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from mobilerl.config import write_json
from mobilerl.tinybase.recipe import Recipe, load_recipe

REBUILD = "dvc unfreeze pretrain && dvc repro pretrain && dvc freeze pretrain  # runs python -m stages.pretrain"


def rebuild(recipe_path: Path, overrides: list[str], out: Path, work: Path, resume: bool = True,
            probe_items: int = 200, max_size_mb: float = 25.0, recipe_name: str | None = None) -> dict[str, Any]:
    """Train the recipe from scratch (or resume in ``work``), then :func:`release` to ``out``; returns the
    metrics written to ``<out>/metrics.json``."""
    from mobilerl.models import tiny
    from mobilerl.tinybase.train import prepare_states, pretrain

    tiny.offline()
    t0 = time.time()
    recipe = load_recipe(recipe_path, overrides)
    if not resume and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    train, test = prepare_states(recipe)
    model, processor, summary = pretrain(recipe, work, train, test)
    how = {"command": REBUILD, "wall_minutes": round((time.time() - t0) / 60, 1),
           "recipe": recipe_name or str(recipe_path), "overrides": overrides}
    return release(model, processor, recipe, summary, test, work, out, probe_items, max_size_mb, how)


def release_run(work: Path, states: Path, out: Path, probe_items: int = 200, max_size_mb: float = 25.0,
                recipe_name: str = "", overrides: list[str] | None = None) -> dict[str, Any]:
    """Release the model of a finished experiment run (``python -m mobilerl.tinybase.train RECIPE WORK
    --states STATES``) exactly as :func:`rebuild` would: load ``WORK/last.pt``, probe, save to ``out``."""
    import torch
    from tokenizers import Tokenizer

    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import wrap
    from mobilerl.tinybase.screens import load_state_cache

    tiny.offline()
    state = torch.load(work / "last.pt", weights_only=False)
    recipe = Recipe.from_record(state["profile"])
    processor = tiny.build_processor(wrap(Tokenizer.from_str(state["tokenizer"])))
    model = tiny.build_model(recipe.model.tiny_shape(), processor.tokenizer, seed=recipe.train.seed)
    model.load_state_dict(state["model"])
    model.eval()
    test = load_state_cache(states)[1]
    summary = json.loads((work / "summary.json").read_text()) if (work / "summary.json").exists() else {
        "steps": state["step"], "tokens": state["tokens"], "minutes": round(state["minutes"], 2)}
    summary.setdefault("params", tiny.n_params(model))
    summary.setdefault("text_params", tiny.n_params(model, True))
    how = {"command": REBUILD, "recipe": recipe_name, "overrides": overrides or [],
           "released_from": f"experiment run {work.name}: {state['step']} steps, {state['tokens']} tokens, "
                            f"{state['minutes']:.1f} training minutes ({recipe.train.threads} torch thread(s))"}
    return release(model, processor, recipe, summary, test, work, out, probe_items, max_size_mb, how)


def release(model: Any, processor: Any, recipe: Recipe, summary: dict[str, Any], test_states: Any, work: Path,
            out: Path, probe_items: int, max_size_mb: float, how: dict[str, Any]) -> dict[str, Any]:
    """Probe on held-out screens (greedy generation, exact answers), save the HF checkpoint with its
    learning curve and ``metrics.json``; fail if the folder is over ``max_size_mb``."""
    from mobilerl.models import tiny
    from mobilerl.tinybase.probe import ACCEPTANCE, release_items, score_generate

    items = release_items(test_states, recipe.data, n_per_kind=probe_items)
    acc, _ = score_generate(model, processor, items)
    if out.exists():
        shutil.rmtree(out)
    tiny.save(model, processor, out, extra={"profile": recipe.to_dict()})
    shutil.copy(work / "curve.jsonl", out / "curve.jsonl")
    metrics = {
        "probe": {  # held-out test-split screens, greedy generation, exact answer
            "grounding_exact_element": acc.get("ground"),
            "reading": acc.get("read"),
            "instruction_span_copy": acc.get("copy"),
            "type_from_instruction": acc.get("type"),
            "state_checked": acc.get("checked"),
            "state_app": acc.get("app"),
            "state_find_or_scroll": acc.get("find"),
            "grounding_center_hit": acc.get("ground_center_hit"),
            "next_action": acc.get("act"),  # the expert's next action, exact (when the recipe trains it)
            "n_items": {k[2:]: v for k, v in acc.items() if k.startswith("n_")},
        },
        "acceptance": {k: {"target": v, "measured": acc.get(k), "met": (acc.get(k) or 0) >= v}
                       for k, v in ACCEPTANCE.items()},
        "train": summary,
        "rebuild": how,
        "model": {"params": summary["params"], "text_params": summary["text_params"],
                  "size_mb": round(sum(f.stat().st_size for f in out.iterdir()) / 2**20, 2)},
        "held_out_protocol": "test-split tasks of world+lab (disjoint seeds/instructions), "
                             f"{recipe.probe_per_template} per template, oracle + off-policy screens, "
                             "screens identical to a training screen dropped",
    }
    write_json(out / "metrics.json", metrics)
    size = metrics["model"]["size_mb"]
    if size > max_size_mb:
        raise SystemExit(f"pretrain: {out} is {size} MB, over max_size_mb={max_size_mb}")
    return metrics
