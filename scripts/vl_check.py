"""The screenshot-profile RL path on a GPU (called by scripts/gpu_check.sh, check ``vl``): a VLM profile's prompts with
screenshots through vLLM, weight sync by reload and by broadcast with the rollout–trainer logprob gap after each,
and one asynchronous `rl` round over that engine and env servers rendering screenshots.

    python3 scripts/vl_check.py --out OUT_DIR/vl.json [--profile vl_smoke] [--ckpt DIR] [--cpu | --dry]

Profile: ``--profile`` (default ``vl_smoke``, the tiny random Qwen2.5-VL shaped like qwen2_5_vl_7b); a profile this
tree does not have falls back to ``tiny`` with its observation mode set to ``screenshot+xml`` (the report says so).
The checkpoint is ``--ckpt`` or the profile's ``weights``. The engine is ``serve_openai CKPT --engine vllm
--weight-sync`` on GPU 0 (eager, fp32); the trainer holds the checkpoint on GPU 1 when there is one (GPU 0
otherwise; broadcast over NCCL with two GPUs, gloo with one) and moves every tensor by seeded noise before each push.
Gaps: at start, after a reload push, after two broadcast pushes, each under ``--tol``, every completion reporting the
version pushed. The asynchronous round: the `rl` stage with ``rl.async: {max_staleness: 1}``, ``rl.engines`` = that
engine and ``rl.env_servers`` = two ``mobilerl env serve --render`` processes, 2 rounds on 2 short world/train tasks:
the policy versions of the trajectories within the bound and ``loss/logprob_gap_max``. A tree whose ``rl.async`` does
not take engines yet says so and skips that part.

``--dry`` resolves the profile, checkpoint, commands and configs and prints them, starting nothing (what the suite
runs on the CPU); ``--cpu`` runs it all on the CPU (the HF engine, gloo). Without a GPU (and neither flag) it prints
"no GPU: skipped". Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_sync import ROOT, _free_port, perturb, rl_requests, sample, start_engines  # noqa: E402

FALLBACK = "tiny"
SCREENSHOT_MODE = "screenshot+xml"


def resolve(profile_name: str, ckpt: str | None, tmp: Path) -> dict[str, Any]:
    """The profile the check runs (written under ``tmp`` when it is the fallback), its prompt format and checkpoint."""
    import yaml

    from mobilerl.models import profiles

    plan: dict[str, Any] = {"asked": profile_name}
    if (profiles.PROFILES / f"{profile_name}.yaml").is_file():
        profile = profiles.load_profile(profile_name)
        plan["profile"] = profile_name
    else:
        data = yaml.safe_load((profiles.PROFILES / f"{FALLBACK}.yaml").read_text())
        data["name"] = f"{FALLBACK}_screenshots"
        data["generation"]["obs_mode"] = SCREENSHOT_MODE
        folder = tmp / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        for p in profiles.PROFILES.glob("*.yaml"):
            (folder / p.name).write_text(p.read_text())
        (folder / f"{data['name']}.yaml").write_text(yaml.safe_dump(data))
        profiles.PROFILES = folder  # this process only: the trainer and the rl stage run here
        profile = profiles.load_profile(data["name"])
        plan["profile"] = data["name"]
        plan["fallback"] = f"no profile {profile_name!r} in this tree: {FALLBACK} with obs_mode {SCREENSHOT_MODE}"
    g = profile.generation
    if g.obs_mode == "xml":
        raise SystemExit(f"profile {plan['profile']}: obs_mode xml reads no screenshots; pick a screenshot profile")
    path = Path(ckpt) if ckpt else profile.weights_path
    if not (path / "config.json").is_file():
        raise SystemExit(f"checkpoint {path} has no config.json (build the profile's weights or pass --ckpt)")
    plan.update(ckpt=str(path), obs_mode=g.obs_mode, prompt_style=g.prompt_style, max_history=g.max_history,
                coords=g.coords)
    return plan


def engine_args(cpu: bool) -> list[str]:
    return (["--engine", "hf", "--device", "cpu"] if cpu else
            ["--engine", "vllm", "--dtype", "fp32", "--enforce-eager", "--gpu-memory-utilization", "0.3",
             "--max-model-len", "8192"])


def rl_config(plan: dict[str, Any], engine: str, env_servers: list[str], device: str) -> dict[str, Any]:
    return {"profile": plan["profile"], "init": plan["ckpt"], "out": "out", "work": "work", "rounds": 2,
            "checkpoint_every": 1, "suite": "world", "templates_max_steps": None, "tasks_per_template": None,
            "async": {"max_staleness": 1}, "algo": {"tis_cap": 2.0}, "engines": [engine], "env_servers": env_servers,
            "env_pool": {"health_interval_s": 1.0, "wait_for_server_s": 60}, "device": device,
            "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16}}


def image_gap(scorer: Any, requests: list[Any], gens: list[Any]) -> float:
    """The largest |engine logprob - trainer logprob| over the sampled tokens, the trainer's forward given the
    screenshots (``HFBackend.score``: the processor's pixel values; ``bench_weight_sync.logprob_gap`` feeds token ids
    only, as the RL update's rows do today)."""

    async def scores() -> list[list[float]]:
        return [await scorer.score(r, g.token_ids) for r, g in zip(requests, gens, strict=True) if g.token_ids]

    pairs = [g for g in gens if g.token_ids]
    return max((abs(a - b) for ours, g in zip(asyncio.run(scores()), pairs, strict=True)
                for a, b in zip(ours, g.logprobs, strict=True)), default=0.0)


def check_sync(plan: dict[str, Any], args: argparse.Namespace, report: dict[str, Any], failures: list[str],
               engines: list[subprocess.Popen]) -> str:
    """Reload and broadcast pushes into the engine, the gap after each; returns the engine's URL (its process is
    left running, in ``engines``)."""
    import torch

    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.weight_sync import make_weight_sync

    gpus = torch.cuda.device_count()
    device = "cpu" if args.cpu else f"cuda:{1 if gpus >= 2 else 0}"
    bcast = "nccl" if gpus >= 2 and not args.cpu else "gloo"
    trainer = HFBackend.from_pretrained(plan["ckpt"], device=device, dtype="fp32", prefix_cache_tokens=0)
    model, processor = trainer.model, trainer.processor
    fmt = {k: plan[k] for k in ("obs_mode", "prompt_style", "max_history", "coords")}
    requests = rl_requests(args.requests, **fmt)
    report.update(trainer_device=device, broadcast_backend=bcast, requests=len(requests),
                  images=sum(bool(r.images) for r in requests))
    if not report["images"]:
        failures.append("no request carries a screenshot: the profile's prompts were built without images")

    scorer = HFBackend(model, processor, prefix_cache_tokens=0)

    def gap(tag: str, version: int | None, seed: int) -> None:
        gens, _ = asyncio.run(sample(url, requests, args.max_new_tokens, seed=seed))
        report[f"gap_{tag}"] = image_gap(scorer, requests, gens)
        versions = {g.policy_version for g in gens}
        if version is not None and versions != {str(version)}:
            failures.append(f"completions after the {tag} push report {versions}, not {version}")
        if version is not None and report[f"gap_{tag}"] > args.tol:
            failures.append(f"logprob gap after the {tag} push {report[f'gap_{tag}']:.2e} > {args.tol}")
        print(f"  gap {tag}: {report[f'gap_{tag}']:.2e} (versions {sorted(map(str, versions))})")

    t0 = time.perf_counter()
    procs, [url] = start_engines(Path(plan["ckpt"]), 1, engine_args(args.cpu))
    engines += procs
    report["engine_start_s"] = time.perf_counter() - t0
    gap("at_start", None, seed=1)
    perturb(model, seed=1, scale=args.scale)
    with make_weight_sync("reload", [url], directory=Path(args.out).parent / "vl-weights") as sync:
        report["reload"] = sync.push(model, 1)
    gap("reload", 1, seed=2)
    with make_weight_sync("broadcast", [url], address="127.0.0.1:0", backend=bcast) as sync:
        for v in (2, 3):  # the first push also forms the group
            perturb(model, seed=v, scale=args.scale)
            report[f"broadcast_v{v}"] = sync.push(model, v)
            gap(f"broadcast_v{v}", v, seed=v + 1)
    return url


def check_async_round(plan: dict[str, Any], url: str, args: argparse.Namespace, report: dict[str, Any],
                      failures: list[str]) -> None:
    """One asynchronous rl run (2 rounds) over the engine at ``url`` and two rendering env servers."""
    from mobilerl.env.sim.tasks import get_task
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run as run_stage

    root = Path(tempfile.mkdtemp(prefix="mobilerl-vl-"))
    ports = [_free_port() for _ in range(2)]
    servers = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        cfg = RLConfig.model_validate(rl_config(plan, url, servers, "cpu" if args.cpu else "cuda"))
    except ValueError as e:
        if "rl.async is not combined" in str(e):
            why = next(ln.strip() for ln in str(e).splitlines() if "rl.async" in ln)
            report["async_round"] = f"skipped: this tree's rl.async does not take rl.engines yet ({why[:200]})"
            print(f"  async round: {report['async_round']}")
            return
        raise
    lists = root / "data" / "tasks" / "suites"
    lists.mkdir(parents=True)
    tasks = [dataclasses.replace(get_task(f"world/train/{n}/0"), complexity=0.3)
             for n in ("AudioRecorderDeleteRecording", "CameraTakePhoto")]
    for split in ("train", "test"):
        (lists / f"world_{split}.jsonl").write_text(
            "".join(json.dumps(dataclasses.replace(t, split=split).to_dict()) + "\n" for t in tasks))
    env = {**os.environ, "MOBILERL_ENV_TOKEN": os.environ.setdefault("MOBILERL_ENV_TOKEN", "vl-check"),
           "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "mobilerl.cli", "env", "serve", "--port", str(p), "--backend",
                               "sim", "--size", "2", "--render", "--no-isolate"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    try:
        summary, curve = run_stage(cfg, root, progress=False)
        gaps = [c.get("loss/logprob_gap_max") for c in curve if c.get("loss/logprob_gap_max") is not None]
        stale = [v for c in curve for k, v in c.items() if "staleness" in k and k.endswith("max")]
        report["async_round"] = {"rounds": summary["rounds"], "logprob_gap_max": max(gaps) if gaps else None,
                                 "staleness_max": max(stale) if stale else None}
        if gaps and max(gaps) > args.tol:
            failures.append(f"async rounds: loss/logprob_gap_max {max(gaps):.2e} > {args.tol}")
        if stale and max(stale) > 1:
            failures.append(f"async rounds: a trajectory {max(stale)} versions stale, the bound is 1")
        print(f"  async round: {report['async_round']}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="vl_smoke")
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1e-3)
    ap.add_argument("--tol", type=float, default=2e-3, help="largest gap after a push (vLLM's kernels are not HF's)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="run it all on the CPU (HF engine, gloo)")
    mode.add_argument("--dry", action="store_true", help="resolve and print the plan; start nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plan = resolve(args.profile, args.ckpt, Path(tempfile.mkdtemp(prefix="mobilerl-vl-")))
    report: dict[str, Any] = {"plan": plan}
    import torch

    if args.dry:
        from mobilerl.rl.config import RLConfig

        report["engine"] = ["serve_openai", plan["ckpt"], "--weight-sync", *engine_args(False)]
        report["rl"] = rl_config(plan, "http://127.0.0.1:8000/v1", ["http://127.0.0.1:8765"], "cuda")
        try:
            RLConfig.model_validate(report["rl"])
            report["rl_valid"] = True
        except ValueError as e:
            report["rl_valid"] = next((ln.strip() for ln in str(e).splitlines() if "rl." in ln), str(e))[:300]
        print(json.dumps(report, indent=1))
        out.write_text(json.dumps(report, indent=1) + "\n")
        return 0
    if not torch.cuda.is_available() and not args.cpu:
        print("VLM path checks (vLLM weight sync with screenshots, async round): no GPU: skipped")
        out.write_text(json.dumps({**report, "skipped": "no GPU"}, indent=1) + "\n")
        return 0
    if not args.cpu and importlib.util.find_spec("vllm") is None:
        print("VLM path checks: vLLM is not installed (pip install -e '.[gpu]'): skipped")
        out.write_text(json.dumps({**report, "skipped": "no vllm"}, indent=1) + "\n")
        return 1
    print(f"VLM path: profile {plan['profile']} ({plan.get('fallback', 'as asked')}), checkpoint {plan['ckpt']}")
    failures: list[str] = []
    engines: list[subprocess.Popen] = []
    try:
        url = check_sync(plan, args, report, failures, engines)
        check_async_round(plan, url, args, report, failures)
    except Exception as e:  # noqa: BLE001 - reported with what ran before it
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        for p in engines:
            p.terminate()
            p.wait(timeout=60)
    report["failures"] = failures
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for f in failures:
        print(f"  FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
