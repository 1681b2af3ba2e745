"""Stage `pretrain`: rebuild the tiny base model (screen-reading pretraining, :mod:`mobilerl.tinybase`).

A released artefact, rebuilt on purpose (the stage is ``frozen`` in dvc.yaml; see docs/tiny_base.md):

    dvc unfreeze pretrain && dvc repro pretrain && dvc freeze pretrain     # or: python -m stages.pretrain

Reads ``pretrain:`` of params.yaml and the recipe (``configs/tiny.yaml``); writes ``models/tiny-base/`` (HF
format, ``tiny.json`` with the recipe, ``metrics.json`` with the release probe and the rebuild command,
``curve.jsonl`` with the learning curve). ``--from-run WORK`` releases a finished experiment run instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from mobilerl.config import StageConfig, load_params, repo_path


class PretrainConfig(StageConfig):
    recipe: str = Field("configs/tiny.yaml", description="The tiny base's recipe (model shape, data, optimisation).")
    overrides: list[str] = Field(
        default_factory=list, description="Recipe overrides, 'section.key=value' (YAML values)."
    )
    out: str = Field("models/tiny-base", description="Where the released checkpoint is written (committed).")
    work: str = Field(".cache/pretrain", description="Checkpoint/resume folder of the run (not committed).")
    resume: bool = Field(True, description="Continue the run in `work` if a checkpoint is there.")
    probe_items: int = Field(200, ge=10, description="Held-out items per question kind in the release probe.")
    max_size_mb: float = Field(25.0, gt=0, description="Largest allowed checkpoint folder (MB).")
    mlflow: bool = Field(True, description="Log params/metrics to the project's MLflow store.")


def run(cfg: PretrainConfig, from_run: Path | None = None, states: Path | None = None) -> dict:
    """Rebuild (or release the finished run ``from_run``, its screen cache in ``states``); returns the metrics."""
    from mobilerl import tinybase

    if from_run is not None:
        return tinybase.release_run(from_run, states or from_run, repo_path(cfg.out), cfg.probe_items,
                                    cfg.max_size_mb, cfg.recipe, list(cfg.overrides))
    return tinybase.rebuild(repo_path(cfg.recipe), list(cfg.overrides), repo_path(cfg.out), repo_path(cfg.work),
                            cfg.resume, cfg.probe_items, cfg.max_size_mb, recipe_name=cfg.recipe)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Rebuild (or release an experiment run as) the tiny base.")
    ap.add_argument("--from-run", type=Path, default=None, help="release this finished run's last.pt")
    ap.add_argument("--states", type=Path, default=None, help="the run's screen cache (train/test.jsonl.gz)")
    args = ap.parse_args(argv)
    cfg = load_params("pretrain", PretrainConfig)
    if args.from_run is not None or not cfg.mlflow:
        metrics = run(cfg, args.from_run, args.states)
    else:
        from mobilerl import tracking

        with tracking.stage_run("pretrain", cfg.model_dump()):
            metrics = run(cfg)
            tracking.log_metrics({"probe": metrics["probe"], "train": metrics["train"]})
    print(json.dumps(metrics["probe"], indent=1))


if __name__ == "__main__":
    main()
