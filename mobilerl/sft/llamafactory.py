"""Run LLaMA-Factory SFT from a model profile: build its YAML, launch it, read back the loss curve.

One function builds the training arguments (:func:`train_args`) from a profile plus the stage's own
settings; :func:`run` writes them next to the output, runs ``llamafactory-cli train`` in a subprocess
(with DeepSpeed through torchrun when the profile names a DeepSpeed config; gloo on CPU), and parses
``trainer_log.jsonl`` into a :class:`TrainResult` (loss per step, tokens/s, wall time).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mobilerl.models.profiles import ROOT, ModelProfile

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "DO_NOT_TRACK": "true", "GRADIO_ANALYTICS_ENABLED": "False", "DISABLE_VERSION_CHECK": "1"}


@dataclass
class TrainResult:
    output_dir: Path
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    train_runtime_s: float = 0.0
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    wall_s: float = 0.0

    @property
    def first_loss(self) -> float | None:
        return self.losses[0][1] if self.losses else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None


def train_args(
    profile: ModelProfile,
    *,
    dataset: str,
    dataset_dir: Path,
    output_dir: Path,
    model_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """LLaMA-Factory ``train`` arguments for an SFT run of ``profile`` on ``dataset`` (a name in
    ``dataset_dir/dataset_info.json``), starting from ``model_path`` (default: the profile's weights)."""
    s = profile.sft
    args: dict[str, Any] = {
        "model_name_or_path": str(model_path or profile.weights_path),
        "trust_remote_code": True,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": s.finetuning_type,
        "freeze_vision_tower": s.freeze_vision_tower,
        "dataset": dataset,
        "dataset_dir": str(dataset_dir),
        "template": profile.template,
        "cutoff_len": s.cutoff_len,
        "packing": s.packing,
        "image_max_pixels": profile.image_max_pixels,
        "image_min_pixels": profile.image_min_pixels,
        "overwrite_cache": True,
        "preprocessing_num_workers": 1,
        "dataloader_num_workers": 0,
        "output_dir": str(output_dir),
        "overwrite_output_dir": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "plot_loss": False,
        "report_to": "none",
        "per_device_train_batch_size": s.per_device_train_batch_size,
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "learning_rate": s.learning_rate,
        "num_train_epochs": s.num_train_epochs,
        "lr_scheduler_type": s.lr_scheduler_type,
        "warmup_ratio": s.warmup_ratio,
        "bf16": profile.dtype == "bf16",
        "fp16": profile.dtype == "fp16",
        "include_num_input_tokens_seen": True,
        "seed": 0,
    }
    if s.lr_scheduler_type == "cosine_with_min_lr":
        args["lr_scheduler_kwargs"] = {"min_lr": s.min_lr}
    if s.deepspeed:
        args["deepspeed"] = str(ROOT / s.deepspeed)
    if profile.dtype == "fp32":
        args["use_cpu"] = not _cuda()
    args.update(overrides or {})
    return args


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def run(args: dict[str, Any], log_path: Path | None = None, timeout_s: float | None = None) -> TrainResult:
    """Train with LLaMA-Factory; raise with the tail of its log if it fails."""
    out = Path(args["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "llamafactory_train.yaml"
    cfg.write_text(yaml.safe_dump(args, sort_keys=False))
    env = {**os.environ, **OFFLINE_ENV}
    if args.get("deepspeed"):
        env.update({"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": env.get("NPROC_PER_NODE", "1"),
                    "MASTER_ADDR": "127.0.0.1"})
    cli = shutil.which("llamafactory-cli", path=str(Path(sys.executable).parent)) or "llamafactory-cli"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log_path = log_path or out / "llamafactory.log"
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.run([cli, "train", str(cfg)], stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"llamafactory-cli train failed (exit {proc.returncode}); last lines of {log_path}:\n{tail}")
    return read_result(out, wall)


def read_result(out: Path, wall_s: float = 0.0) -> TrainResult:
    res = TrainResult(output_dir=out, wall_s=wall_s)
    log = out / "trainer_log.jsonl"
    if log.exists():
        for lineno, line in enumerate(log.read_text().splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{log}:{lineno}: malformed log record: {e.msg}") from None
            if "loss" in rec and rec.get("current_steps") is not None:
                res.losses.append((int(rec["current_steps"]), float(rec["loss"])))
    results = out / "train_results.json"
    if results.exists():
        r = json.loads(results.read_text())
        res.train_runtime_s = float(r.get("train_runtime", 0.0))
        res.samples_per_s = r.get("train_samples_per_second")
        tokens = r.get("num_input_tokens_seen")
        if tokens and res.train_runtime_s:
            res.tokens_per_s = float(tokens) / res.train_runtime_s
    return res
