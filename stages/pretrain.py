"""Stage `pretrain`: rebuild the tiny base model (screen-reading pretraining of the tiny profile).

A released artefact, rebuilt on purpose (the stage is ``frozen`` in dvc.yaml; see docs/tiny_base.md):

    dvc unfreeze pretrain && dvc repro pretrain && dvc freeze pretrain     # or: python -m stages.pretrain

Reads ``pretrain:`` of params.yaml and the profile (``configs/tiny.yaml``); collects train-split screens,
trains the tokenizer and the model (resumable from ``work``), probes on held-out test-split screens
with greedy generation, and writes ``models/tiny-base/`` (HF format: config.json, model.safetensors,
tokenizer and processor files, ``metrics.json`` with the probe figures and the rebuild command,
``curve.jsonl`` with the learning curve). Fails if the checkpoint folder exceeds ``max_size_mb``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from pydantic import Field

from mobilerl.config import ROOT, StageConfig, load_params, write_json

REBUILD = "dvc unfreeze pretrain && dvc repro pretrain && dvc freeze pretrain  # runs python -m stages.pretrain"


class PretrainConfig(StageConfig):
    profile: str = Field("configs/tiny.yaml", description="The tiny profile (model shape, data, optimisation).")
    overrides: list[str] = Field(
        default_factory=list, description="Profile overrides, 'section.key=value' (YAML values)."
    )
    out: str = Field("models/tiny-base", description="Where the released checkpoint is written (committed).")
    work: str = Field(".cache/pretrain", description="Checkpoint/resume folder of the run (not committed).")
    resume: bool = Field(True, description="Continue the run in `work` if a checkpoint is there.")
    probe_items: int = Field(200, ge=10, description="Held-out items per question kind in the final probe.")
    max_size_mb: float = Field(25.0, gt=0, description="Largest allowed checkpoint folder (MB).")
    mlflow: bool = Field(True, description="Log params/metrics to the project's MLflow store.")


def run(cfg: PretrainConfig) -> dict:
    """Train (or resume in ``work``), then :func:`release`; returns the metrics of ``<out>/metrics.json``."""
    from mobilerl.models import tiny
    from mobilerl.models.pretrain import load_profile, prepare_states, pretrain

    tiny.offline()
    t0 = time.time()
    profile = load_profile(ROOT / cfg.profile, cfg.overrides)
    work = ROOT / cfg.work
    if not cfg.resume and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    train, test = prepare_states(profile)
    model, processor, summary = pretrain(profile, work, train, test)
    rebuild = {"command": REBUILD, "wall_minutes": round((time.time() - t0) / 60, 1), "profile": cfg.profile,
               "overrides": cfg.overrides}
    return release(model, processor, profile, summary, test, work, ROOT / cfg.out, cfg.probe_items,
                   cfg.max_size_mb, rebuild)


def release(model, processor, profile, summary: dict, test_states, work: Path, out: Path, probe_items: int,
            max_size_mb: float, rebuild: dict) -> dict:
    """Probe on held-out screens (greedy generation, exact answers), save the HF checkpoint with its
    learning curve and ``metrics.json``; fail if the folder is over ``max_size_mb``."""
    from mobilerl.models import tiny
    from mobilerl.models.probe import ACCEPTANCE, release_items, score_generate

    items = release_items(test_states, profile.data, n_per_kind=probe_items)
    acc, _ = score_generate(model, processor, items)
    if out.exists():
        shutil.rmtree(out)
    tiny.save(model, processor, out, extra={"profile": profile.to_dict()})
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
            "next_action": acc.get("act"),  # the expert's next action, exact (when the profile trains it)
            "n_items": {k[2:]: v for k, v in acc.items() if k.startswith("n_")},
        },
        "acceptance": {k: {"target": v, "measured": acc.get(k), "met": (acc.get(k) or 0) >= v}
                       for k, v in ACCEPTANCE.items()},
        "train": summary,
        "rebuild": rebuild,
        "model": {"params": summary["params"], "text_params": summary["text_params"],
                  "size_mb": round(sum(f.stat().st_size for f in out.iterdir()) / 2**20, 2)},
        "held_out_protocol": "test-split tasks of world+lab (disjoint seeds/instructions), "
                             f"{profile.probe_per_template} per template, oracle + off-policy screens, "
                             "screens identical to a training screen dropped",
    }
    write_json(out / "metrics.json", metrics)
    size = metrics["model"]["size_mb"]
    if size > max_size_mb:
        raise SystemExit(f"pretrain: {out} is {size} MB, over max_size_mb={max_size_mb}")
    return metrics


def package_run(work: Path, states: Path, cfg: PretrainConfig) -> dict:
    """Release the model of a finished experiment run (``python -m mobilerl.models.pretrain PROFILE WORK
    --states STATES``) exactly as :func:`run` would: load ``WORK/last.pt``, probe, save to ``cfg.out``."""
    import torch
    from tokenizers import Tokenizer

    from mobilerl.models import tiny
    from mobilerl.models.pretrain import Profile, load_state_cache
    from mobilerl.models.tokenizer import wrap

    tiny.offline()
    state = torch.load(work / "last.pt", weights_only=False)
    profile = Profile.from_dict(state["profile"])
    processor = tiny.build_processor(wrap(Tokenizer.from_str(state["tokenizer"])))
    model = tiny.build_model(profile.model, processor.tokenizer, seed=profile.train.seed)
    model.load_state_dict(state["model"])
    model.eval()
    test = load_state_cache(states)[1]
    summary = json.loads((work / "summary.json").read_text()) if (work / "summary.json").exists() else {
        "steps": state["step"], "tokens": state["tokens"], "minutes": round(state["minutes"], 2)}
    summary.setdefault("params", tiny.n_params(model))
    summary.setdefault("text_params", tiny.n_params(model, True))
    rebuild = {"command": REBUILD, "profile": cfg.profile, "overrides": cfg.overrides,
               "released_from": f"experiment run {work.name}: {state['step']} steps, {state['tokens']} tokens, "
                                f"{state['minutes']:.1f} training minutes ({profile.train.threads} torch thread(s))"}
    return release(model, processor, profile, summary, test, work, ROOT / cfg.out, cfg.probe_items,
                   cfg.max_size_mb, rebuild)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Rebuild (or release an experiment run as) the tiny base.")
    ap.add_argument("--from-run", type=Path, default=None, help="release this finished run's last.pt")
    ap.add_argument("--states", type=Path, default=None, help="the run's screen cache (train/test.jsonl.gz)")
    args = ap.parse_args(argv)
    cfg = load_params("pretrain", PretrainConfig)
    if args.from_run is not None:
        metrics = package_run(args.from_run, args.states or args.from_run, cfg)
        print(json.dumps(metrics["probe"], indent=1))
        return
    if not cfg.mlflow:
        metrics = run(cfg)
    else:
        from mobilerl import tracking

        with tracking.stage_run("pretrain", cfg.model_dump()):
            metrics = run(cfg)
            tracking.log_metrics({"probe": metrics["probe"], "train": metrics["train"]})
    print(json.dumps(metrics["probe"], indent=1))


if __name__ == "__main__":
    main()
