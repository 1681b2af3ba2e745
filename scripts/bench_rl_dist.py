"""Benchmark the RL update: one process against N data-parallel processes (gloo on CPU, nccl with CUDA), on the
same rows; prints the seconds of an update (after a warm-up one) and the response tokens/s.

    .venv/bin/python scripts/bench_rl_dist.py [--init models/tiny-base] [--rows 128] [--world 2] [--repeats 3]
        [--backend ddp|deepspeed --deepspeed-config configs/deepspeed/zero2.json]

The rows are the shape of the `rl` stage's on the tiny policy (a ~300-token prompt, ~12 answer tokens, a third
of them repeated as replays: the docs/rl.md runs), of random token ids; the update is the trainer's, at
``micro_batch_tokens`` 16384. On a 2-core machine the processes share the cores: the figures say what the
communication and sharding cost, not what N devices would gain.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def rows(n: int, seed: int = 0) -> list[Any]:
    from mobilerl.rl.batch import Row

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % 3 == 2:  # a replay of an earlier row: the same tokens, an older policy's logprobs
            r = out[i - 2]
            out.append(Row(r.prompt_ids, r.response_ids, [lp - 0.1 for lp in r.behaviour_logprobs], 1.0, False))
            continue
        p, k = int(torch.randint(250, 350, (1,), generator=g)), int(torch.randint(6, 18, (1,), generator=g))
        out.append(Row(torch.randint(10, 4000, (p,), generator=g).tolist(),
                       torch.randint(10, 4000, (k,), generator=g).tolist(),
                       (-8.0 + torch.randn(k, generator=g)).tolist(), float(torch.randn(1, generator=g))))
    return out


def trainer(init: str, backend: dict[str, Any]) -> Any:
    from mobilerl.models import tiny
    from mobilerl.rl.batch import PromptFormat
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.trainer import Trainer

    model = tiny.load(ROOT / init, with_processor=False)[0]
    return Trainer(RLConfig(overrides={"learning_rate": 1e-4}, **backend), model, lambda req: [], 0, PromptFormat())


def timed(t: Any, data: list[Any], repeats: int) -> list[float]:
    import copy

    t.update(copy.deepcopy(data))  # warm-up (and the reference logprobs)
    times = []
    for _ in range(repeats):
        batch = copy.deepcopy(data)
        t0 = time.perf_counter()
        t.update(batch)
        times.append(time.perf_counter() - t0)
    return times


def rank_main(rank: int, world: int, port: int, args: dict[str, Any], backend: dict[str, Any], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(args["threads"])
    t = trainer(args["init"], backend)
    if rank == 0:
        times = timed(t, rows(args["rows"]), args["repeats"])
        t.dp.stop()
        Path(out).write_text(json.dumps(times))
    else:
        t.follow()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="models/tiny-base")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", choices=["ddp", "deepspeed"], default="ddp")
    ap.add_argument("--deepspeed-config", default=None)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    data = rows(args.rows)
    tokens = sum(len(r.response_ids) for r in data)

    torch.set_num_threads(cores)
    single = timed(trainer(args.init, {}), data, args.repeats)
    backend = {"trainer_backend": args.backend, "deepspeed_config": args.deepspeed_config}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/times.json"
        shared = {"init": args.init, "rows": args.rows, "repeats": args.repeats,
                  "threads": max(1, cores // args.world)}
        torch.multiprocessing.spawn(rank_main, args=(args.world, port, shared, backend, out), nprocs=args.world)
        spread = json.loads(Path(out).read_text())
    best1, bestn = min(single), min(spread)
    print(f"{args.rows} rows, {tokens} response tokens, {cores} cores")
    print(f"  1 process ({cores} threads): {best1:.2f} s an update, {tokens / best1:.0f} tokens/s")
    print(f"  {args.world} processes {args.backend} ({max(1, cores // args.world)} threads each): "
          f"{bestn:.2f} s an update, {tokens / bestn:.0f} tokens/s ({best1 / bestn:.2f}x)")


if __name__ == "__main__":
    main()
