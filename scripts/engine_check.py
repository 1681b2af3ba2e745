"""The RL rollout engines on a GPU (called by scripts/gpu_check.sh): weight sync into the HF engine and into vLLM
by checkpoint reload and by broadcast, the rollout–trainer logprob gap after each sync, and generation throughput.

    python3 scripts/engine_check.py --out OUT_DIR/engines.json [--ckpt models/tiny-base]

Engines are ``serve_openai --weight-sync`` subprocesses on GPU 0 (``--engine hf`` in fp32, then ``--engine vllm``
in fp32 with eager execution); the trainer is this process with the checkpoint on GPU 1 when there is one (GPU 0
otherwise), and moves every tensor by seeded noise before each push. Broadcast runs over NCCL when trainer and
engine have a GPU each; on one GPU it runs over gloo (NCCL refuses two ranks on one device), and the report says
so. Each engine: the gap at start (same weights), with the trainer one update ahead (stale), after a reload push,
after two broadcast pushes; a refused push (a wrong shape) that leaves the version; and completion tokens/s for
``--requests`` RL prompts sampled at T = 1 with ``--max-new-tokens``. Checks: every gap after a push under
``--tol-hf`` / ``--tol-vllm`` (vLLM's kernels are not the trainer's), every version as pushed. Prints "no GPU:
skipped" without a GPU and names what is missing when vLLM or the server's packages are not installed.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_sync import ROOT, logprob_gap, perturb, rl_requests, sample, start_engines  # noqa: E402


def check_engine(kind: str, extra: list[str], ckpt: Path, model: torch.nn.Module, processor: Any,
                 requests: list[Any], args: argparse.Namespace, bcast_backend: str, tol: float,
                 first_version: int) -> dict[str, Any]:
    import httpx

    from mobilerl.models.weight_sync import make_weight_sync

    out: dict[str, Any] = {"engine": kind, "broadcast_backend": bcast_backend}
    t0 = time.perf_counter()
    procs, [url] = start_engines(ckpt, 1, extra)
    out["start_s"] = time.perf_counter() - t0
    failures: list[str] = []
    few = requests[: args.gap_requests]
    try:
        def gap(tag: str, version: int | None, seed: int) -> None:
            gens, _ = asyncio.run(sample(url, few, args.max_new_tokens, seed=seed))
            out[f"gap_{tag}"] = logprob_gap(model, processor, few, gens)
            versions = {g.policy_version for g in gens}
            if version is not None:
                if versions != {str(version)}:
                    failures.append(f"{kind}: completions after the {tag} push report {versions}, not {version}")
                if out[f"gap_{tag}"] > tol:
                    failures.append(f"{kind}: logprob gap after the {tag} push {out[f'gap_{tag}']:.2e} > {tol}")
            print(f"  {kind}: gap {tag} {out[f'gap_{tag}']:.2e} (versions {sorted(map(str, versions))})")

        gap("at_start", None, seed=1)
        v = first_version
        perturb(model, seed=v, scale=args.scale)
        gap("stale", None, seed=2)
        with make_weight_sync("reload", [url], directory=Path(args.out).parent / f"weights-{kind}") as sync:
            t = time.perf_counter()
            out["reload_timings"] = sync.push(model, v)
            out["reload_s"] = time.perf_counter() - t
        gap("reload", v, seed=3)
        with make_weight_sync("broadcast", [url], address="127.0.0.1:0", backend=bcast_backend) as sync:
            for i in range(2):  # the first push also forms the group
                v += 1
                perturb(model, seed=v, scale=args.scale)
                t = time.perf_counter()
                out[f"broadcast_{i}_timings"] = sync.push(model, v)
                out[f"broadcast_{i}_s"] = time.perf_counter() - t
                gap(f"broadcast_{i}", v, seed=4 + i)
            name = next(iter(sync.schema or {}))
            bad = [{"name": n, "dtype": m.dtype, "shape": [1] if n == name else list(m.shape)}
                   for n, m in (sync.schema or {}).items()]
            r = httpx.post(f"{url}/weights/update", json={"version": v + 1, "params": bad}, timeout=60)
            state = httpx.get(f"{url}/weights", timeout=60).json()
            out["bad_push"] = {"status": r.status_code, "message": r.json()["error"]["message"][:200],
                               "version_after": state["version"]}
            if r.status_code != 400 or state["version"] != v:
                failures.append(f"{kind}: a wrong-shape push was not refused cleanly: {out['bad_push']}")
        gens, wall = asyncio.run(sample(url, requests, args.max_new_tokens, seed=9))
        tokens = sum(len(g.token_ids) for g in gens)
        out["throughput"] = {"requests": len(requests), "completion_tokens": tokens, "wall_s": wall,
                             "tokens_per_s": tokens / wall}
        print(f"  {kind}: start {out['start_s']:.1f} s; reload {out['reload_s'] * 1000:.0f} ms; broadcast "
              f"({bcast_backend}) {out['broadcast_0_s'] * 1000:.0f} / {out['broadcast_1_s'] * 1000:.0f} ms; "
              f"{tokens / wall:.0f} completion tokens/s over {len(requests)} requests")
    except Exception as e:  # noqa: BLE001 - one engine's failure is reported, the other still runs
        failures.append(f"{kind}: {type(e).__name__}: {e}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    out["failures"] = failures
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--gap-requests", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--scale", type=float, default=1e-3)
    ap.add_argument("--tol-hf", type=float, default=1e-3)
    ap.add_argument("--tol-vllm", type=float, default=2e-3)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--cpu", action="store_true", help="a dry run of this script on the CPU (HF engine, gloo)")
    args = ap.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"gpus": torch.cuda.device_count()}
    if not torch.cuda.is_available() and not args.cpu:
        print("engine checks (vLLM weight sync, logprob gap, throughput): no GPU: skipped")
        Path(args.out).write_text(json.dumps({**report, "skipped": "no GPU"}, indent=1) + "\n")
        return 0
    missing = [m for m in ("fastapi", "uvicorn", "httpx", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"engine checks: skipped, the server needs {missing} (put their wheels under .whl/)")
        Path(args.out).write_text(json.dumps({**report, "skipped": f"missing {missing}"}, indent=1) + "\n")
        return 1
    from mobilerl.models import tiny

    gpus = torch.cuda.device_count()
    trainer_device = torch.device("cuda", 1 if gpus >= 2 else 0) if not args.cpu else torch.device("cpu")
    bcast = "nccl" if gpus >= 2 and not args.cpu else "gloo"
    if bcast == "gloo" and not args.cpu:
        print("  one GPU: broadcast over gloo (NCCL needs a GPU for each of trainer and engine)")
    ckpt = Path(args.ckpt)
    requests = rl_requests(args.requests)
    report.update(ckpt=str(ckpt), trainer_device=str(trainer_device), broadcast_backend=bcast,
                  requests=len(requests), max_new_tokens=args.max_new_tokens)
    kinds = args.engines.split(",")
    for n, kind in enumerate(kinds):
        if kind == "vllm" and importlib.util.find_spec("vllm") is None:
            print("  vLLM is not installed (the gpu extra: pip install -c constraints.txt -e '.[gpu]'): "
                  "vLLM checks skipped")
            report["vllm"] = {"skipped": "vllm not installed"}
            continue
        model, processor = tiny.load(ckpt)  # fresh: each engine starts from the checkpoint
        model = model.to(trainer_device).eval()
        extra = (["--device", "cpu" if args.cpu else "cuda:0", "--dtype", "fp32"] if kind == "hf" else
                 ["--engine", "vllm", "--dtype", "fp32", "--gpu-memory-utilization", "0.3", "--max-model-len",
                  "4096", "--enforce-eager"])
        report[kind] = check_engine(kind, extra, ckpt, model, processor, requests, args, bcast,
                                    args.tol_hf if kind == "hf" else args.tol_vllm, first_version=10 * (n + 1))
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    failures = [f for k in kinds for f in report.get(k, {}).get("failures", [])]
    report["failures"] = failures
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    for f in failures:
        print("FAILED", f)
    print(f"engine checks: {'ok' if not failures else f'{len(failures)} failed'} -> {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
