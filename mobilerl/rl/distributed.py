"""The AdaGRPO update over N processes (``rl.trainer_backend`` ddp / deepspeed; started by torchrun, the
``deepspeed`` launcher or ``accelerate launch``), equal to the single-process update up to float summation order.

Rank 0 drives: it runs the rollouts, scores them, builds the rows (the frozen reference policy lives on rank 0
only, so reference logprobs are computed there), logs and writes checkpoints. The other ranks wait in
:meth:`DataParallel.follow` for the collective rank 0 announces next: an update, a checkpoint's consolidation, a
resume, a weight gather, or stop. A rank that fails ends the job through its launcher, which stops the others.

An update is :func:`mobilerl.rl.update.update` on every rank, with :class:`DataParallel` as its
:class:`~mobilerl.rl.update.Stepper`:

- rank 0's rows are broadcast (:meth:`DataParallel.begin_update`) and :func:`shard_rows` splits them the same way
  on every rank: balanced by forward tokens, identical sequences on one rank (they share one forward);
- every rank runs the update's micro-batch loss on its shard, each micro-batch's loss scaled by its share of the
  WHOLE step (all ranks' response tokens, or rows for the seq-mean aggregations), so the gradients summed over
  ranks are the single-process gradient;
- ``ddp``: one bucketed all-reduce sums the gradients before the step (DDP's no_sync accumulation, minus its need
  for every rank to run as many backwards: shards differ in micro-batches), then every replica clips and takes
  the same AdamW step;
- ``deepspeed``: ZeRO-2/3 reduce inside every backward, so a rank with fewer micro-batches runs zero-weighted
  padding ones, and the loss is multiplied by the world size because ZeRO averages gradients over ranks; the
  engine clips (at the profile's ``grad_clip``) and steps the same torch AdamW on its partition;
- metrics equal the single process's: the ranks' parts (normalised by the whole step) summed, the max of
  ``loss/logprob_gap_max``, the grad norm (the same on every rank) taken once.

Checkpoints are world-size independent: :meth:`DataParallel.full_state` returns the single-process trainer's
format (the model's full state dict, torch AdamW's state dict), from the replicas under ddp or consolidated from
the ZeRO partitions with DeepSpeed's ``safe_get_full_*`` (fp32 master weights), and
:meth:`DataParallel.load_full_state` puts such a state into any number of ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mobilerl.config import ROOT
from mobilerl.rl.batch import ResponseLogits, Row, micro_batches, row_key
from mobilerl.rl.dp_state import WorldSizeFreeState, cpu_tree

# the other ranks wait in one broadcast through a whole rollout phase; the default 10-30 min would end the run
TIMEOUT = timedelta(hours=6)
BUCKET_NUMEL = 1 << 25  # gradient elements per all-reduce
GAP_MAX = "loss/logprob_gap_max"


def launch_rank() -> int:
    """This process's rank as the launcher set it (torchrun, deepspeed and accelerate set ``RANK``); 0 alone."""
    return int(os.environ.get("RANK", "0"))


def init_process_group() -> None:
    """Join the launcher's process group (nccl with CUDA, gloo otherwise), or make a group of one without one."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=TIMEOUT)


def shard_rows(rows: Sequence[Row], world: int) -> list[list[Row]]:
    """``rows`` split over ``world`` ranks: each group of identical sequences (one forward) goes, longest first, to
    the rank with the fewest forward tokens so far (ties: the lower rank); a shard keeps the rows' order. The same
    rows give the same shards on every rank."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(row_key(r), []).append(i)
    load = [0] * world
    owner = [0] * len(rows)
    width = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    for members in sorted(groups.values(), key=lambda g: -width[g[0]]):  # stable: first seen first on ties
        k = min(range(world), key=lambda j: (load[j], j))
        load[k] += width[members[0]]
        for i in members:
            owner[i] = k
    return [[r for r, o in zip(rows, owner, strict=True) if o == k] for k in range(world)]


def deepspeed_config(path: str, world: int, grad_clip: float, dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed JSON at ``path`` (repo-relative: the SFT stages' configs/deepspeed/zero{2,3}.json) with its
    "auto" values set for the RL update: micro-batch 1 and no accumulation in DeepSpeed's sense (the trainer
    accumulates its token-budget micro-batches into one engine.step), clipping at the profile's ``grad_clip``,
    bf16/fp16 as the model's dtype; ZeRO sizes left "auto" take DeepSpeed's defaults; no round-robin gradients."""
    file = Path(path) if Path(path).is_absolute() else ROOT / path
    if not file.is_file():
        raise ValueError(f"rl.deepspeed_config: {path} does not exist")
    cfg = json.loads(file.read_text())
    for key in ("optimizer", "scheduler"):
        if key in cfg:
            raise ValueError(f"{path}: {key!r}: the RL trainer brings its own AdamW (the profile's learning_rate)")
    cfg.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=world,
               gradient_clipping=grad_clip)
    for key, on in (("bf16", dtype == torch.bfloat16), ("fp16", dtype == torch.float16)):
        if cfg.get(key, {}).get("enabled") == "auto":
            cfg[key]["enabled"] = on
    zero = {k: v for k, v in cfg.get("zero_optimization", {}).items() if v != "auto"}
    # round-robin gradients only help ZeRO-2's CPU offload, and under them DeepSpeed 0.19.8 maps each parameter to
    # the wrong fp32 fragment (when no parameter is padded), which the consolidated checkpoint reads
    zero["round_robin_gradients"] = False
    cfg["zero_optimization"] = zero
    left = [k for k, v in cfg.items() if v == "auto"]
    if left:
        raise ValueError(f"{path}: no RL value for 'auto' key(s) {left}")
    return cfg


class DataParallel(WorldSizeFreeState):
    """A trainer's data-parallel group on every rank: ``backend`` "ddp" (torch.distributed) or "deepspeed" (ZeRO
    per ``ds_config``) over ``model`` and its torch ``optimizer``; the update's :class:`~mobilerl.rl.update.Stepper`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, backend: str,
                 ds_config: str | None) -> None:
        init_process_group()
        self.model, self.optimizer, self.grad_clip = model, optimizer, grad_clip
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local}") if dist.get_backend() == "nccl" else torch.device("cpu")
        model.to(self.device)
        self.engine: Any = None
        self.zero_stage = 0
        if backend == "ddp":
            for t in model.state_dict().values():  # the replicas start equal
                dist.broadcast(t, src=0)
        elif backend == "deepspeed":
            import deepspeed

            if ds_config is None:
                raise ValueError("rl.deepspeed_config is needed by rl.trainer_backend: deepspeed")
            config = deepspeed_config(ds_config, self.world, grad_clip, next(model.parameters()).dtype)
            self.engine, _, _, _ = deepspeed.initialize(model=ResponseLogits(model), optimizer=optimizer,
                                                        config=config)
            self.zero_stage = self.engine.zero_optimization_stage()
        else:
            raise ValueError(f"rl.trainer_backend: unknown {backend!r}")

    # ------------------------------------------------------------------------------------------ driving

    def _announce(self, op: str) -> None:
        if self.rank != 0:
            raise RuntimeError(f"{op}: rank {self.rank} follows rank 0 (DataParallel.follow), it does not drive")
        dist.broadcast_object_list([op], src=0)

    def follow(self, update: Callable[[list[Row]], Any]) -> None:
        """Ranks > 0: run the collectives rank 0 announces (``update`` of the rows it broadcasts), until it stops."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            op = box[0]
            if op == "stop":
                return
            if op == "update":
                update(self._rows([]))
            elif op == "state":
                self._full_state()
            elif op == "load":
                self._load_full_state({}, {}, None)
            elif op == "gather":
                with self._gathered():
                    pass
            else:
                raise RuntimeError(f"rank {self.rank}: unknown collective {op!r} from rank 0")

    def stop(self) -> None:
        """Rank 0: release the followers (their run returns)."""
        self._announce("stop")

    def begin_update(self, rows: list[Row]) -> list[Row]:
        """Rank 0: start an update on every rank; returns the rows every rank now holds."""
        self._announce("update")
        return self._rows(rows)

    def _rows(self, rows: list[Row]) -> list[Row]:
        box = [rows]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Rank 0: the model's and the optimiser's state dicts in the single-process format."""
        if self.engine is None:  # replicas: rank 0 holds it all (on the CPU: the state loads on any machine)
            return cpu_tree(self.model.state_dict()), cpu_tree(self.optimizer.state_dict())
        self._announce("state")
        return self._full_state()

    def load_full_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any]) -> None:
        """Rank 0: put a single-process-format state (from any world size) into every rank."""
        head = self._load_head(model, optimizer)  # checked before the other ranks are involved
        self._announce("load")
        self._load_full_state(model, optimizer, head)

    def gathered(self) -> contextlib.AbstractContextManager[Any]:
        """Rank 0: a context in which the model holds its whole weights (gathered under ZeRO-3)."""
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        self._announce("gather")
        return self._gathered()

    # ------------------------------------------------------------------------------- the update's Stepper

    def batches(self, rows: Sequence[Row], max_tokens: int) -> tuple[list[list[Row]], int]:
        """This rank's shard in micro-batches; under ZeRO (which reduces in every backward) padded with
        zero-weighted ones to the most any rank has."""
        batches = micro_batches(shard_rows(rows, self.world)[self.rank], max_tokens)
        real = len(batches)
        if self.engine is not None:
            n = torch.tensor([real], device=self.device)
            dist.all_reduce(n, op=dist.ReduceOp.MAX)
            smallest = min(rows, key=lambda r: len(r.prompt_ids) + len(r.response_ids))
            batches += [[smallest]] * (int(n.item()) - real)
        return batches, real

    def forward_model(self) -> Any:
        return self.model if self.engine is None else self.engine  # the engine must run every forward under ZeRO

    def zero_grad(self) -> None:
        if self.engine is None:
            self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, pad: bool, last: bool) -> None:
        if self.engine is None:
            loss.backward()
            return
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * (0.0 if pad else float(self.world)))  # ZeRO averages: × N sums

    def step(self) -> float:
        if self.engine is not None:
            self.engine.step()
            return float(self.engine.get_global_grad_norm())
        self._all_reduce_grads()
        gn = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        self.optimizer.step()
        return gn

    def _all_reduce_grads(self) -> None:
        """Sum the gradients over ranks; a parameter without one here gets zeros if another rank has one (the
        single process would have it), and stays without one if no rank has."""
        params = self._trainable()
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        grads = []
        for p, h in zip(params, has.tolist(), strict=True):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
            if h:
                grads.append(p.grad)
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset: offset + g.numel()].view_as(g))
                offset += g.numel()

    def combine(self, stats: dict[str, float]) -> dict[str, float]:
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, dict(stats))
        out: dict[str, float] = defaultdict(float)
        for part in every:
            for k, v in part.items():
                out[k] = max(out[k], v) if k == GAP_MAX else out[k] + v
        out["loss/grad_norm"] = stats["loss/grad_norm"]  # taken after the reduction: the same on every rank
        return dict(out)

def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive tensors of one dtype, about ``BUCKET_NUMEL`` elements a bucket."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > BUCKET_NUMEL or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket
