"""One SFT run of a model profile, as the SFT stages run it: checks, LLaMA-Factory, MLflow logging.

Before any training, the dataset's prompt format (observation mode, prompt style, history, coordinate
frame) must be the one the profile evaluates with (a policy must be prompted as it was trained), and a
pretrained tiny base must have been taught the dataset's screen frame. ``init: random`` trains a random
init of the base's shape and tokenizer instead (the counterfactual of the tiny base). Used by the stages
`sft_reasoning_free`, `sft_random_init` and `sft_reasoning` (one config, three params sections).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, read_json, repo_path
from mobilerl.models.profiles import load_profile
from mobilerl.sft import llamafactory


class SFTConfig(StageConfig):
    """A LLaMA-Factory SFT run of a profile; schedule: configs/models/<profile>.yaml ``sft:``."""

    profile: str = Field("tiny", description="Model profile in configs/models/.")
    base: str | None = Field(None, description="Starting weights, repo-relative or absolute (null: the profile's).")
    dataset_dir: str = Field("data/sft/dataset", description="LLaMA-Factory dataset folder (with dataset_info.json).")
    dataset: str = Field("mobilerl_sft_train", description="Dataset name in its dataset_info.json.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="LLaMA-Factory arguments over the profile's (e.g. max_steps); "
                                                  "a null value keeps the profile's.")
    check_prompt_format: bool = Field(True, description="Refuse a dataset whose prompt format differs from the "
                                                        "profile's generation settings.")
    timeout_minutes: float | None = Field(None, gt=0, description="Kill the training after this long (null: no limit).")
    init: Literal["pretrained", "random"] = Field(
        "pretrained", description="Start from the base's weights, or from a random init of the same shape and "
                                  "tokenizer (the counterfactual of the tiny base; same data and budget).")
    registered_model: str = Field("mobilerl-policy", description="MLflow registered model name.")
    alias: str = Field("reasoning-free-sft", description="MLflow alias of the registered version.")


def rel(p: Path) -> str:
    """``p`` relative to the repository when inside it (metrics stay the same on every machine)."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def check_prompt_format(dataset_dir: Path, profile: Any) -> dict[str, Any]:
    """The dataset's prompt format (from its ``stats.json``); ``ValueError`` when the profile evaluates
    with another one (a policy must be prompted as it was trained)."""
    stats = read_json(dataset_dir / "stats.json")
    fmt = {"mode": stats.get("mode"), "prompt_style": stats.get("prompt_style", "full"),
           "max_history": stats.get("max_history"), "coords": stats.get("coords", "abs")}
    g = profile.generation
    fields = {"mode": "obs_mode", "prompt_style": "prompt_style", "max_history": "max_history", "coords": "coords"}
    bad = {k: (fmt[k], getattr(g, attr)) for k, attr in fields.items()
           if hasattr(g, attr) and fmt[k] != getattr(g, attr)}
    if bad:
        raise ValueError(f"{dataset_dir}: prompt format " + ", ".join(f"{k}={v[0]!r}" for k, v in bad.items())
                         + f" differs from what profile {profile.name!r} evaluates with ("
                         + ", ".join(f"{k}={v[1]!r}" for k, v in bad.items())
                         + "); rebuild the dataset (params sft_data) or change the profile's generation settings")
    return fmt


def check_base_frame(base: Path, coords: str) -> None:
    """``ValueError`` when ``base`` was pretrained (tiny profile: ``tiny.json``) on another screen frame than
    the dataset's ``coords``: a base taught boxes on the 0-999 grid cannot read numbered lines, and back."""
    meta = Path(base) / "tiny.json"
    if not meta.exists():
        return  # not a pretrained tiny base (a large profile's weights): nothing recorded to check
    info = json.loads(meta.read_text())
    frame = info.get("profile", {}).get("data", {}).get("coords")
    if frame is not None and frame != coords and "random_init_of" not in info:
        raise ValueError(f"{base} was pretrained on screens in the {frame!r} frame, but the SFT data is in "
                         f"{coords!r} (params sft_data.coords and the profile's generation.coords must be the base's)")


def train(cfg: SFTConfig, out: Path, dataset_dir: Path | None = None, base: Path | None = None,
          prefix: str = "") -> dict[str, Any]:
    """Train ``cfg`` into ``out``; logs the loss curve (``{prefix}loss/train``) and summary to the active
    MLflow run; returns the metrics (the curve itself stays in ``out/trainer_log.jsonl``)."""
    from mobilerl.models.random_init import ensure_weights

    profile = load_profile(cfg.profile)
    dataset_dir = dataset_dir or repo_path(cfg.dataset_dir)
    base = base or (repo_path(cfg.base) if cfg.base else ensure_weights(profile))
    if cfg.init == "random":
        base = random_init_like(base, out.parent / f"{out.name}.init")
    fmt = check_prompt_format(dataset_dir, profile) if cfg.check_prompt_format else None
    if fmt is not None:
        check_base_frame(base, fmt["coords"])
    result = llamafactory.train_sft(profile, base=base, dataset=cfg.dataset, dataset_dir=dataset_dir, output_dir=out,
                                    overrides={k: v for k, v in cfg.overrides.items() if v is not None},
                                    timeout_s=cfg.timeout_minutes * 60 if cfg.timeout_minutes else None)
    for step, loss in result.losses:
        tracking.log_metrics({f"{prefix}loss/train": loss}, step=step)
    summary = result.summary()
    tracking.log_metrics({f"{prefix}sft": summary})
    if result.overlength:
        print(f"warning: {result.overlength} samples of {cfg.dataset} are longer than the profile's cutoff_len; "
              "LLaMA-Factory cut the end of their prompts (the screen). A smaller max_history (params sft_data "
              "and the profile's generation) or a larger cutoff_len avoids it.", flush=True)
    return {**summary, "base": rel(base), "dataset": f"{rel(dataset_dir)}:{cfg.dataset}", "prompt_format": fmt}


def random_init_like(base: Path, where: Path) -> Path:
    """A randomly initialised copy of ``base`` (same config and tokenizer) at ``where``: the tiny checkpoint's
    shape under its next seed, or the next seed of the config ``base`` was built from (``random_init``)."""
    from mobilerl.models import random_init, tiny

    if random_init.random_like(base, where) is not None:
        return where
    _, processor = tiny.load(base)
    # the base's recorded recipe, kept whole (a rebuild of today's Recipe would drop its retired keys)
    recorded = json.loads((base / "tiny.json").read_text())["profile"]
    model = tiny.build_model(tiny.TinyShape(**recorded["model"]), processor.tokenizer, seed=recorded["train"]["seed"] + 1)
    tiny.save(model, processor, where, extra={"profile": recorded, "random_init_of": rel(base)})
    return where


def train_registered(section: str, cfg: SFTConfig, out: Path) -> dict[str, Any]:
    """An SFT stage's run: :func:`train` into ``out`` inside the stage's MLflow run, the checkpoint registered
    under ``cfg.alias``; returns the metrics (with the registered version and the run id)."""
    with tracking.stage_run(section, cfg.model_dump()) as run_:
        metrics = train(cfg, out)
        metrics["registered_version"] = tracking.register_model(out, cfg.registered_model, cfg.alias)
        metrics["mlflow_run_id"] = run_.info.run_id
    return metrics


def summary_line(section: str, cfg: SFTConfig, m: dict[str, Any]) -> str:
    return (f"{section}: loss {m['first_loss']:.3f} -> {m['final_loss']:.3f} in {m['steps']} steps, "
            f"{m['wall_s']:.0f}s, {m['tokens_per_s']:.0f} tokens/s; registered {cfg.registered_model}@{cfg.alias} "
            f"v{m['registered_version']}")
