"""Run LLaMA-Factory SFT from a model profile: build its YAML, launch it, read back the loss curve.

One function builds the training arguments (:func:`train_args`) from a profile plus the stage's own
settings; :func:`run` writes them next to the output, runs ``llamafactory-cli train`` in a subprocess
(with DeepSpeed through torchrun when the profile names a DeepSpeed config; gloo on CPU), and parses
``trainer_log.jsonl`` into a :class:`TrainResult` (loss per step, tokens/s, wall time).
:func:`train_sft` does both and leaves a checkpoint that loads like its base (:func:`finalize_checkpoint`).
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
    overlength: int | None = None  # samples longer than cutoff_len: LLaMA-Factory cuts their prompt's tail

    @property
    def first_loss(self) -> float | None:
        return self.losses[0][1] if self.losses else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    TIMINGS = ("train_runtime_s", "tokens_per_s", "samples_per_s", "wall_s")  # the wall-clock keys of summary()

    def summary(self) -> dict[str, float | int | None]:
        """Numbers for metrics files and MLflow (tokens/s: input tokens of the packed sequences, padding
        included, over the trainer's runtime)."""
        return {"first_loss": self.first_loss, "final_loss": self.final_loss, "steps": len(self.losses),
                "train_runtime_s": self.train_runtime_s, "tokens_per_s": self.tokens_per_s,
                "samples_per_s": self.samples_per_s, "wall_s": self.wall_s,
                "overlength_samples": self.overlength}


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
    ``dataset_dir/dataset_info.json``), starting from ``model_path`` (default: the profile's weights).

    ``overrides`` named like a field of the profile's ``sft:`` section (``min_lr``, ``learning_rate``, ...)
    replace that field, validated as the profile is; other keys are LLaMA-Factory arguments as they are."""
    overrides = dict(overrides or {})
    if model_path is None:
        from mobilerl.models.random_init import ensure_weights

        model_path = ensure_weights(profile)
    s = profile.sft
    own = {k: overrides.pop(k) for k in list(overrides) if k in type(s).model_fields}
    if own:
        s = type(s).model_validate({**s.model_dump(), **own})
    args: dict[str, Any] = {
        "model_name_or_path": str(model_path),
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
        "disable_gradient_checkpointing": not s.gradient_checkpointing,
        "seed": 0,
    }
    if s.max_steps is not None:
        args["max_steps"] = s.max_steps
    if s.lr_scheduler_type == "cosine_with_min_lr":
        args["lr_scheduler_kwargs"] = {"min_lr": s.min_lr}
    if s.deepspeed:
        args["deepspeed"] = str(ROOT / s.deepspeed)
    if profile.dtype == "fp32":
        args["use_cpu"] = not _cuda()
    args.update(overrides)
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
        proc = subprocess.Popen([cli, "train", str(cfg)], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            watch(proc, out / "trainer_log.jsonl", timeout_s=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"llamafactory-cli train failed (exit {proc.returncode}); last lines of {log_path}:\n{tail}")
    return read_result(out, wall)


def watch(proc: subprocess.Popen, trainer_log: Path, every_s: float = 30.0, timeout_s: float | None = None,
          poll_s: float = 1.0) -> None:
    """Wait for ``proc``, printing at most every ``every_s`` (and once at the end) its progress as LLaMA-Factory's
    ``trainer_log.jsonl`` has it: steps done of all, loss, elapsed and remaining time. Raises
    ``subprocess.TimeoutExpired`` past ``timeout_s``."""
    t0, last, shown = time.monotonic(), float("-inf"), None

    def show() -> None:
        nonlocal shown
        try:
            recs = [json.loads(x) for x in trainer_log.read_text().splitlines()[-2:]]
        except (OSError, json.JSONDecodeError):  # not written yet, or a line half-written
            return
        if not recs or recs[-1].get("current_steps") is None or recs[-1] == shown:
            return
        rec = shown = recs[-1]
        losses = [r["loss"] for r in recs if isinstance(r.get("loss"), float)]  # the last line may be the summary's
        loss = f", loss {losses[-1]:.4f}" if losses else ""
        print(f"sft: step {rec['current_steps']}/{rec.get('total_steps', '?')}{loss}, "
              f"{rec.get('elapsed_time', '?')} elapsed, ETA {rec.get('remaining_time', '?')}", flush=True)

    while True:
        if time.monotonic() - last >= every_s:
            last = time.monotonic()
            show()
        try:
            proc.wait(timeout=poll_s)
            break
        except subprocess.TimeoutExpired:
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise subprocess.TimeoutExpired(proc.args, timeout_s) from None
    show()


def train_sft(
    profile: ModelProfile,
    *,
    base: Path,
    dataset: str,
    dataset_dir: Path,
    output_dir: Path,
    overrides: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> TrainResult:
    """One SFT run of ``profile`` from ``base`` on ``dataset``: train (:func:`run`), then make the output a
    checkpoint that loads like the base (:func:`finalize_checkpoint`)."""
    if not (Path(base) / "config.json").exists():
        raise FileNotFoundError(f"{base}/config.json not found: no starting weights there")
    if not (Path(dataset_dir) / "dataset_info.json").exists():
        raise FileNotFoundError(f"{dataset_dir}/dataset_info.json not found: no SFT dataset there")
    args = train_args(profile, dataset=dataset, dataset_dir=Path(dataset_dir), output_dir=Path(output_dir),
                      model_path=Path(base), overrides=overrides)
    result = run(args, timeout_s=timeout_s)
    result.overlength = count_overlength(Path(dataset_dir), dataset, Path(base), args["cutoff_len"])
    finalize_checkpoint(Path(base), Path(output_dir), {
        "base": str(base), "dataset": dataset, "steps": len(result.losses), "final_loss": result.final_loss})
    return result


def count_overlength(dataset_dir: Path, dataset: str, tokenizer_dir: Path, cutoff_len: int) -> int | None:
    """How many samples of ``dataset`` exceed ``cutoff_len`` text tokens in ``tokenizer_dir``'s chat template
    (image tokens not counted).
    LLaMA-Factory truncates them (the end of the prompt, i.e. the screen, goes first; see its
    ``infer_seqlen``) without saying so; None when the tokenizer or the file cannot be read."""
    try:
        from transformers import AutoTokenizer

        info = json.loads((dataset_dir / "dataset_info.json").read_text())[dataset]
        records = json.loads((dataset_dir / info["file_name"]).read_text())
        tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        texts = [tok.apply_chat_template(r["messages"], tokenize=False) for r in records]
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    except Exception:  # noqa: BLE001 — a diagnostic; never fail a finished training over it
        return None
    return sum(n > cutoff_len for n in lengths)


def finalize_checkpoint(base: Path, out: Path, extra: dict[str, Any] | None = None) -> None:
    """Make LLaMA-Factory's output directory load like its base: the base's ``generation_config.json``
    (LLaMA-Factory rewrites its eos as a list), ``use_cache`` back on (training switched it off), and for a
    tiny base its ``tiny.json`` (what tells :func:`mobilerl.models.backends.make_backend` to take the tiny
    loader), with ``extra`` recorded under ``"sft"``."""
    base, out = Path(base), Path(out)
    if (base / "generation_config.json").exists():
        shutil.copyfile(base / "generation_config.json", out / "generation_config.json")
    cfg_path = out / "config.json"
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text())
        for c in (cfg, cfg.get("text_config") or {}):
            if c.get("use_cache") is False:
                c["use_cache"] = True
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if (base / "tiny.json").exists():
        meta = json.loads((base / "tiny.json").read_text())
        if extra:
            meta["sft"] = extra
        (out / "tiny.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


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
