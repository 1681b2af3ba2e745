"""Measure the trainer → rollout-engine weight sync on the CPU (docs/rl.md, "Rollout engines and weight sync"):
push time by checkpoint reload and by gloo broadcast, and the rollout–trainer logprob gap after each push.

    .venv/bin/python scripts/bench_weight_sync.py [--ckpt models/tiny-base] [--engines 1] [--pushes 5] --out sync.json

The engines are ``python -m mobilerl.models.serve_openai CKPT --weight-sync`` subprocesses on 127.0.0.1 (as a user
starts them); the trainer is this process, holding the checkpoint and moving every tensor by seeded noise before
each push (an update's worth of change). After a push: ``--requests`` RL prompts (the oracle's contexts on world/train
tasks, the tiny profile's prompt format) sampled at T = 1 through the engines, and the largest difference between the
engine's logprob of a sampled token and the trainer's teacher-forced recompute (the RL update's
``loss/logprob_gap_max``). Also timed: one round of those requests (the sampling the gap is measured on).

``scripts/engine_check.py`` (the GPU checks) reuses the prompts, the perturbation and the gap from here.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def rl_requests(n: int, seed: int = 0, obs_mode: str = "xml", prompt_style: str = "compact", max_history: int = 4,
                coords: str = "marks") -> list[Any]:
    """``n`` chat requests as the RL rollouts make them: the oracle's screens on world/train tasks, in a profile's
    prompt format (default: the tiny profile's; a screenshot ``obs_mode`` renders the screens and sends them)."""
    from mobilerl.agent import OraclePolicy, PolicyContext, PolicyOutput
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.env.sim.tasks import list_tasks
    from mobilerl.eval.runner import evaluate_sync

    contexts: list[PolicyContext] = []

    class Recording:
        name = "oracle"

        def __init__(self) -> None:
            self.oracle = OraclePolicy()

        async def act(self, ctx: PolicyContext) -> PolicyOutput:
            contexts.append(ctx)
            return await self.oracle.act(ctx)

    tasks = list_tasks("world", "train", n=1)
    rec = Recording()
    evaluate_sync(lambda s: rec, tasks[: max(4, n // 3)], concurrency=8, progress=False, base_seed=seed,
                  obs_mode=obs_mode)
    policy = ModelPolicy(None, obs_mode=obs_mode, prompt_style=prompt_style, max_history=max_history,  # type: ignore[arg-type]
                         coords=coords)
    return [policy.request(c) for c in contexts[:n]]


def perturb(model: torch.nn.Module, seed: int, scale: float) -> None:
    """Every parameter moved by N(0, scale²) noise, seeded: a stand-in for an optimiser step."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))


async def sample(url: str, requests: list[Any], max_new_tokens: int, seed: int = 0) -> tuple[list[Any], float]:
    """Every request at T = 1 through the engine, concurrently (as concurrent episodes send them); returns the
    generations and the wall seconds."""
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.openai_backend import OpenAIBackend

    client = OpenAIBackend(url, max_retries=1, timeout=600)
    sc = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(client.generate([r], dataclasses.replace(sc, seed=seed + i))
                                  for i, r in enumerate(requests)))
    wall = time.perf_counter() - t0
    await client.aclose()
    return [g for [g] in gens], wall


def logprob_gap(model: torch.nn.Module, processor: Any, requests: list[Any], gens: list[Any]) -> float:
    """The largest |engine logprob − trainer logprob| over the sampled tokens, the trainer's side computed as the
    RL update does (:func:`mobilerl.rl.batch.rows_logprobs`, T = 1)."""
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.rl.batch import Row, collate, micro_batches, rows_logprobs

    tb = HFBackend(model, processor, prefix_cache_tokens=0)
    rows = [Row(tb.prompt_ids(r), g.token_ids, g.logprobs, 0.0) for r, g in zip(requests, gens, strict=True)
            if g.token_ids]
    gap = 0.0
    with torch.no_grad():
        for mb in micro_batches(rows, 16384):
            b = {k: v.to(model.device) for k, v in collate(mb, tb.pad_id).items()}
            lp, _ = rows_logprobs(model, b, 1.0)
            gap = max(gap, float(((lp - b["behaviour_logprobs"]).abs() * b["response_mask"]).max()))
    return gap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engines(ckpt: Path, n: int, extra: list[str] = ()) -> tuple[list[subprocess.Popen], list[str]]:
    import httpx

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs, urls = [], []
    for _ in range(n):
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "mobilerl.models.serve_openai", str(ckpt), "--port",
                                       str(port), "--weight-sync", *extra], env=env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}/v1")
    deadline = time.time() + 300
    for p, u in zip(procs, urls, strict=True):
        while True:
            try:
                if httpx.get(u.removesuffix("/v1") + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"engine {u} did not start")
            time.sleep(0.3)
    return procs, urls


def bench_transport(transport: str, urls: list[str], model: torch.nn.Module, processor: Any, requests: list[Any],
                    pushes: int, scale: float, max_new_tokens: int, first_version: int) -> dict[str, Any]:
    from mobilerl.models.weight_sync import make_weight_sync

    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mobilerl-sync-") as d, \
            make_weight_sync(transport, urls, directory=d, address="127.0.0.1:0") as sync:  # type: ignore[arg-type]
        for i in range(pushes):
            version = first_version + i
            perturb(model, seed=version, scale=scale)
            stale_gens, _ = asyncio.run(sample(urls[0], requests, max_new_tokens, seed=version))
            t0 = time.perf_counter()
            timings = sync.push(model, version)
            wall = time.perf_counter() - t0
            gaps, sample_s = [], []
            for u in urls:
                gens, s = asyncio.run(sample(u, requests, max_new_tokens, seed=version))
                assert {g.policy_version for g in gens} == {str(version)}
                gaps.append(logprob_gap(model, processor, requests, gens))
                sample_s.append(s)
            rows.append({**timings, "push_wall_s": wall, "gap_after": max(gaps),
                         "gap_stale": logprob_gap(model, processor, requests, stale_gens),
                         "sample_s": statistics.mean(sample_s),
                         "tokens": float(sum(len(g.token_ids) for g in gens))})
            parts = ", ".join(f"{k.split('/')[1]} {v * 1000:.0f} ms" for k, v in timings.items() if k.endswith("_s"))
            print(f"  {transport} v{version}: push {wall * 1000:.0f} ms ({parts}); gap after "
                  f"{rows[-1]['gap_after']:.2e}, with the previous weights {rows[-1]['gap_stale']:.2e}")
    later = rows[1:] or rows  # the first broadcast push also forms the group
    return {"pushes": rows, "first_push_s": rows[0]["push_wall_s"],
            "median_push_s": statistics.median(r["push_wall_s"] for r in later),
            "max_gap_after": max(r["gap_after"] for r in rows), "bytes": rows[0]["sync/bytes"]}


def main(argv: list[str] | None = None) -> None:
    from mobilerl.models import tiny

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1e-3, help="noise per parameter per 'update'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ckpt = Path(args.ckpt)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // (args.engines + 1)))
    requests = rl_requests(args.requests)
    model, processor = tiny.load(ckpt)
    model.eval()
    procs, urls = start_engines(ckpt, args.engines, ["--device", "cpu"])
    out: dict[str, Any] = {"ckpt": str(ckpt), "engines": args.engines, "requests": len(requests),
                           "params": sum(p.numel() for p in model.parameters()), "cpus": os.cpu_count()}
    try:
        for k, transport in enumerate(("reload", "broadcast")):
            out[transport] = bench_transport(transport, urls, model, processor, requests, args.pushes, args.scale,
                                             args.max_new_tokens, first_version=1 + k * args.pushes)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    summary = {t: {k: out[t][k] for k in ("first_push_s", "median_push_s", "max_gap_after", "bytes")}
               for t in ("reload", "broadcast")}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
