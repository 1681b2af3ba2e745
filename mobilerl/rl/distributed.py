"""The AdaGRPO update over N processes (``rl.trainer_backend`` ddp / deepspeed; started by torchrun, the
``deepspeed`` launcher or ``accelerate launch``), equal to the single-process update up to float summation order.

Rank 0 drives: it runs the rollouts, scores them, builds the rows (the frozen reference policy lives on rank 0
only, so reference logprobs are computed there), logs and writes checkpoints. The other ranks wait in
:meth:`DataParallel.follow` for the collective rank 0 announces next: an update, a checkpoint's consolidation, a
resume, a weight gather, or stop. A rank that fails ends the job through its launcher, which stops the others.

An update (:meth:`DataParallel.update`):

- rank 0's rows are broadcast and :func:`shard_rows` splits them the same way on every rank: balanced by forward
  tokens, identical sequences on one rank (they share one forward);
- every rank runs the trainer's micro-batch loss code (:meth:`Trainer.micro_step`) on its shard, each
  micro-batch's loss scaled by its share of the WHOLE step (all ranks' response tokens, or rows for the seq-mean
  aggregations), so the gradients summed over ranks are the single-process gradient;
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
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from mobilerl.config import ROOT
from mobilerl.rl.batch import ResponseLogits, Row, micro_batches

if TYPE_CHECKING:
    from mobilerl.rl.trainer import Trainer

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
    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((tuple(r.prompt_ids), tuple(r.response_ids)), []).append(i)
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


class DataParallel:
    """A trainer's data-parallel group: ``backend`` "ddp" (torch.distributed) or "deepspeed" (ZeRO per
    ``ds_config``). Built by :class:`~mobilerl.rl.trainer.Trainer` after its optimiser, on every rank."""

    def __init__(self, trainer: Trainer, backend: str, ds_config: str | None) -> None:
        init_process_group()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local}") if dist.get_backend() == "nccl" else torch.device("cpu")
        trainer.model.to(self.device)
        if self.rank != 0:
            trainer.ref = None  # rank 0 fills the rows' reference logprobs before it broadcasts them
        elif trainer.ref is not None:
            trainer.ref.to(self.device)
        self.engine: Any = None
        self.zero_stage = 0
        if backend == "ddp":
            for t in trainer.model.state_dict().values():  # the replicas start equal
                dist.broadcast(t, src=0)
        elif backend == "deepspeed":
            import deepspeed

            if ds_config is None:
                raise ValueError("rl.deepspeed_config is needed by rl.trainer_backend: deepspeed")
            dtype = next(trainer.model.parameters()).dtype
            config = deepspeed_config(ds_config, self.world, trainer.settings.grad_clip, dtype)
            self.engine, _, _, _ = deepspeed.initialize(model=ResponseLogits(trainer.model),
                                                        optimizer=trainer.optimizer, config=config)
            self.zero_stage = self.engine.zero_optimization_stage()
        else:
            raise ValueError(f"rl.trainer_backend: unknown {backend!r}")

    # ------------------------------------------------------------------------------------------ driving

    def _announce(self, op: str) -> None:
        if self.rank != 0:
            raise RuntimeError(f"{op}: rank {self.rank} follows rank 0 (DataParallel.follow), it does not drive")
        dist.broadcast_object_list([op], src=0)

    def follow(self, trainer: Trainer) -> None:
        """Ranks > 0: run the collectives rank 0 announces, until it stops."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            op = box[0]
            if op == "stop":
                return
            if op == "update":
                self._update(trainer, [])
            elif op == "state":
                self._full_state(trainer)
            elif op == "load":
                self._load_full_state(trainer, {}, {}, None)
            elif op == "gather":
                with self._gathered(trainer):
                    pass
            else:
                raise RuntimeError(f"rank {self.rank}: unknown collective {op!r} from rank 0")

    def stop(self) -> None:
        """Rank 0: release the followers (their run returns)."""
        self._announce("stop")

    def update(self, trainer: Trainer, rows: list[Row]) -> dict[str, float]:
        """Rank 0: one update over ``rows`` on every rank (see the module's docstring); returns the metrics."""
        self._announce("update")
        return self._update(trainer, rows)

    def full_state(self, trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Rank 0: the model's and the optimiser's state dicts in the single-process format."""
        if self.engine is None:  # replicas: rank 0 holds it all (on the CPU: the state loads on any machine)
            return _cpu(trainer.model.state_dict()), _cpu(trainer.optimizer.state_dict())
        self._announce("state")
        return self._full_state(trainer)

    def load_full_state(self, trainer: Trainer, model: dict[str, torch.Tensor], optimizer: dict[str, Any]) -> None:
        """Rank 0: put a single-process-format state (from any world size) into every rank."""
        head = self._load_head(trainer, model, optimizer)  # checked before the other ranks are involved
        self._announce("load")
        self._load_full_state(trainer, model, optimizer, head)

    def gathered(self, trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
        """Rank 0: a context in which ``trainer.model`` holds its whole weights (gathered under ZeRO-3)."""
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        self._announce("gather")
        return self._gathered(trainer)

    # ------------------------------------------------------------------------------------------- update

    def _update(self, trainer: Trainer, rows: list[Row]) -> dict[str, float]:
        s, cfg = trainer.settings, trainer.cfg
        if self.rank == 0 and trainer.ref is not None:
            trainer.reference_logprobs(rows)
        box = [rows]
        dist.broadcast_object_list(box, src=0)
        rows = box[0]
        total_tokens = sum(len(r.response_ids) for r in rows)
        batches = micro_batches(shard_rows(rows, self.world)[self.rank], cfg.micro_batch_tokens)
        real = len(batches)
        if self.engine is not None:  # ZeRO reduces in every backward: every rank runs as many
            n = torch.tensor([real], device=self.device)
            dist.all_reduce(n, op=dist.ReduceOp.MAX)
            smallest = min(rows, key=lambda r: len(r.prompt_ids) + len(r.response_ids))
            batches += [[smallest]] * (int(n.item()) - real)
        stats: dict[str, float] = defaultdict(float)
        old: dict[int, torch.Tensor] = {}  # rl.tis_cap: each micro-batch's π_old (epoch 0, before any step)
        trainer.model.train()
        for epoch in range(s.ppo_epochs):
            if self.engine is None:
                trainer.optimizer.zero_grad(set_to_none=True)
                for i, mb in enumerate(batches):
                    trainer.micro_step(mb, epoch, total_tokens, len(rows), stats, old=old, key=i).backward()
                self._all_reduce_grads(trainer)
                gn = float(torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), s.grad_clip))
                trainer.optimizer.step()
            else:
                for i, mb in enumerate(batches):
                    self.engine.set_gradient_accumulation_boundary(i == len(batches) - 1)
                    pad = i >= real
                    loss = trainer.micro_step(mb, epoch, total_tokens, len(rows),
                                              defaultdict(float) if pad else stats, model=self.engine, old=old, key=i)
                    self.engine.backward(loss * (0.0 if pad else float(self.world)))  # ZeRO averages: × N sums
                self.engine.step()
                gn = float(self.engine.get_global_grad_norm())
            stats["loss/grad_norm"] += gn / s.ppo_epochs
        trainer.model.eval()
        out = self._combine(stats)
        out["train/rows"] = float(len(rows))
        out["train/tokens"] = float(total_tokens)
        return out

    def _all_reduce_grads(self, trainer: Trainer) -> None:
        """Sum the gradients over ranks; a parameter without one here gets zeros if another rank has one (the
        single process would have it), and stays without one if no rank has."""
        params = [p for p in trainer.model.parameters() if p.requires_grad]
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

    def _combine(self, stats: dict[str, float]) -> dict[str, float]:
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, dict(stats))
        out: dict[str, float] = defaultdict(float)
        for part in every:
            for k, v in part.items():
                out[k] = max(out[k], v) if k == GAP_MAX else out[k] + v
        out["loss/grad_norm"] = stats["loss/grad_norm"]  # taken after the reduction: the same on every rank
        return dict(out)

    # -------------------------------------------------------------------------------------- checkpoints

    def _trainable(self, trainer: Trainer) -> list[torch.nn.Parameter]:
        return [p for p in trainer.model.parameters() if p.requires_grad]  # the torch optimiser's order

    def _full_state(self, trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """ZeRO partitions → the single-process state on rank 0 (collective; other ranks get empty dicts)."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        params = self._trainable(trainer)
        inner = trainer.optimizer  # the torch AdamW, stepping this rank's flat partition
        step = next((float(st["step"]) for st in inner.state.values() if "step" in st), None)
        master: dict[int, torch.Tensor] = {}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i, p in enumerate(params):  # every rank, the same order: each call is a collective
            w = safe_get_full_fp32_param(p)
            if step is not None:
                m, v = (safe_get_full_optimizer_state(p, k) for k in ("exp_avg", "exp_avg_sq"))
            if self.rank == 0:
                master[id(p)] = w.detach().cpu().clone()
                if step is not None:
                    state[i] = {"step": torch.tensor(step), "exp_avg": m.detach().cpu().clone(),
                                "exp_avg_sq": v.detach().cpu().clone()}
        frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
        with self._gather(frozen):
            local = trainer.model.state_dict()
            names = dict(trainer.model.named_parameters(remove_duplicate=False))
            model = {k: master[id(names[k])] if k in names and id(names[k]) in master else v.detach().cpu().clone()
                     for k, v in local.items()} if self.rank == 0 else {}
        if self.rank != 0:
            return {}, {}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
        if len(groups) != 1:
            raise RuntimeError(f"expected the trainer's one AdamW parameter group, found {len(groups)}")
        return model, {"state": state, "param_groups": [{**groups[0], "params": list(range(len(params)))}]}

    def _load_head(self, trainer: Trainer, model: dict[str, torch.Tensor], optimizer: dict[str, Any]
                   ) -> dict[str, Any]:
        """Rank 0: what every rank needs before the tensors: the AdamW hyper-parameters and the step of each
        trainable parameter that has state (by its position); raises on a state of another model."""
        n = len(self._trainable(trainer))
        groups = optimizer["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != n:
            raise ValueError(f"optimizer state: {len(groups)} group(s) of {[len(g['params']) for g in groups]} "
                             f"parameters; this trainer has 1 of {n}")
        local = trainer.model.state_dict()
        if sorted(local) != sorted(model):
            missing, extra = sorted(set(local) - set(model)), sorted(set(model) - set(local))
            raise ValueError(f"model state: missing keys {missing[:5]}, unexpected keys {extra[:5]}")
        pos = {j: i for i, j in enumerate(groups[0]["params"])}
        return {"hyper": {k: v for k, v in groups[0].items() if k != "params"},
                "steps": {pos[j]: float(st["step"]) for j, st in optimizer["state"].items()}}

    def _load_full_state(self, trainer: Trainer, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                         head: dict[str, Any] | None) -> None:
        """A single-process state on rank 0 → every rank (collective: tensors are broadcast one at a time)."""
        params = self._trainable(trainer)
        box = [head]
        dist.broadcast_object_list(box, src=0)
        hyper, steps = box[0]["hyper"], box[0]["steps"]
        if self.engine is None:
            self._load_replica(trainer, model, optimizer, params, hyper, steps)
        else:
            self._load_zero(trainer, model, optimizer, params, hyper, steps)

    def _receive(self, value: torch.Tensor | None, like: torch.Tensor | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """Rank 0's ``value`` on every rank (as ``dtype`` on this rank's device; ``like`` gives the shape)."""
        shape = like if isinstance(like, torch.Size) else like.shape
        buf = (value.detach().to(self.device, dtype).reshape(shape).clone() if self.rank == 0
               else torch.empty(shape, dtype=dtype, device=self.device))
        dist.broadcast(buf, src=0)
        return buf

    def _load_replica(self, trainer: Trainer, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                      params: list[torch.nn.Parameter], hyper: dict[str, Any], steps: dict[int, float]) -> None:
        local = trainer.model.state_dict()  # views of the parameters and buffers
        with torch.no_grad():
            for k, t in local.items():  # the same order on every rank
                t.copy_(self._receive(model.get(k), t, t.dtype))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i in sorted(steps):
            p = params[i]
            state[i] = {"step": torch.tensor(steps[i])}
            for key in ("exp_avg", "exp_avg_sq"):
                state[i][key] = self._receive(self._state_tensor(optimizer, i, key), p, p.dtype)
        trainer.optimizer.load_state_dict({"state": state, "param_groups": [{**hyper,
                                                                            "params": list(range(len(params)))}]})

    def _state_tensor(self, optimizer: dict[str, Any], i: int, key: str) -> torch.Tensor | None:
        """Rank 0: the ``key`` state of the i-th trainable parameter in ``optimizer`` (ids as its group lists)."""
        if self.rank != 0:
            return None
        ids = optimizer["param_groups"][0]["params"]
        return optimizer["state"][ids[i]][key]

    def _load_zero(self, trainer: Trainer, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                   params: list[torch.nn.Parameter], hyper: dict[str, Any], steps: dict[int, float]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        names = {id(p): k for k, p in trainer.model.named_parameters()}
        if steps:
            self._prime_adam(max(steps.values()))
        for i, p in enumerate(params):
            shape = getattr(p, "ds_shape", p.shape)
            w = self._receive(model.get(names[id(p)]), shape, torch.float32)
            safe_set_full_fp32_param(p, w)  # the fp32 master of this rank's partition
            with self._gather([p], modifier_rank=0), torch.no_grad():  # the (low-precision) model weight
                p.data.copy_(w.to(p.dtype))
            if i in steps:
                for key in ("exp_avg", "exp_avg_sq"):
                    safe_set_full_optimizer_state(p, self._receive(self._state_tensor(optimizer, i, key), shape,
                                                                   torch.float32), key)
        frozen = [(k, p) for k, p in trainer.model.named_parameters() if not p.requires_grad]
        for k, p in frozen:
            w = self._receive(model.get(k), getattr(p, "ds_shape", p.shape), p.dtype)
            with self._gather([p], modifier_rank=0), torch.no_grad():
                p.data.copy_(w)
        persistent = set(trainer.model.state_dict())
        with torch.no_grad():
            for k, b in trainer.model.named_buffers():
                if k in persistent:
                    b.copy_(self._receive(model.get(k), b, b.dtype))
        for g in trainer.optimizer.param_groups:
            g.update({k: v for k, v in hyper.items() if k in g})

    def _prime_adam(self, step: float) -> None:
        """Create the torch AdamW state of this rank's flat partitions (it is lazy: none before the first step)
        so that DeepSpeed's ``safe_set_full_optimizer_state`` has tensors to write into, at ``step``."""
        opt = self.engine.optimizer
        flats = (opt.fp32_partitioned_groups_flat if self.zero_stage == 3 else opt.single_partition_of_fp32_groups)
        inner = opt.optimizer
        for flat in flats:
            st = inner.state[flat]
            st.setdefault("exp_avg", torch.zeros_like(flat))
            st.setdefault("exp_avg_sq", torch.zeros_like(flat))
            st["step"] = torch.tensor(step)
        if self.zero_stage < 3:  # ZeRO-1/2 link each parameter's fragment of the state after the first step
            opt._hp_optimizer_states_linked = False
            opt._lazy_init_hp_params_optimizer_state()

    # ------------------------------------------------------------------------------------------ gathers

    def _gather(self, params: list[torch.nn.Parameter], modifier_rank: int | None = None
                ) -> contextlib.AbstractContextManager[Any]:
        if self.zero_stage != 3 or not params:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)

    @contextlib.contextmanager
    def _gathered(self, trainer: Trainer) -> Iterator[None]:
        with self._gather(list(trainer.model.parameters())):
            yield


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


def _cpu(tree: Any) -> Any:
    """``tree`` (nested dicts / lists of tensors) with its tensors on the CPU."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_cpu(v) for v in tree)
    return tree
