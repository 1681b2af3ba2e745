"""World-size independent checkpoints of a data-parallel group (:class:`mobilerl.rl.distributed.DataParallel`):
the single-process trainer's format (the model's full state dict, torch AdamW's state dict), from the replicas
under ddp or consolidated from the ZeRO partitions with DeepSpeed's ``safe_get_full_*`` (fp32 master weights), and
such a state put into any number of ranks. Every method but the rank-0 entry points is a collective."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


class WorldSizeFreeState:
    """The checkpoint half of a data-parallel group; the group sets ``model``, ``optimizer``, ``rank``,
    ``device``, ``engine`` (DeepSpeed's or None) and ``zero_stage``."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    device: torch.device
    engine: Any
    zero_stage: int

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]  # the torch optimiser's order

    def _full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """ZeRO partitions → the single-process state on rank 0 (collective; other ranks get empty dicts)."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        params = self._trainable()
        inner = self.optimizer  # the torch AdamW, stepping this rank's flat partition
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
        frozen = [p for p in self.model.parameters() if not p.requires_grad]
        with self._gather(frozen):
            local = self.model.state_dict()
            names = dict(self.model.named_parameters(remove_duplicate=False))
            model = {k: master[id(names[k])] if k in names and id(names[k]) in master else v.detach().cpu().clone()
                     for k, v in local.items()} if self.rank == 0 else {}
        if self.rank != 0:
            return {}, {}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
        if len(groups) != 1:
            raise RuntimeError(f"expected the trainer's one AdamW parameter group, found {len(groups)}")
        return model, {"state": state, "param_groups": [{**groups[0], "params": list(range(len(params)))}]}

    def _load_head(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any]
                   ) -> dict[str, Any]:
        """Rank 0: what every rank needs before the tensors: the AdamW hyper-parameters and the step of each
        trainable parameter that has state (by its position); raises on a state of another model."""
        n = len(self._trainable())
        groups = optimizer["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != n:
            raise ValueError(f"optimizer state: {len(groups)} group(s) of {[len(g['params']) for g in groups]} "
                             f"parameters; this trainer has 1 of {n}")
        local = self.model.state_dict()
        if sorted(local) != sorted(model):
            missing, extra = sorted(set(local) - set(model)), sorted(set(model) - set(local))
            raise ValueError(f"model state: missing keys {missing[:5]}, unexpected keys {extra[:5]}")
        pos = {j: i for i, j in enumerate(groups[0]["params"])}
        return {"hyper": {k: v for k, v in groups[0].items() if k != "params"},
                "steps": {pos[j]: float(st["step"]) for j, st in optimizer["state"].items()}}

    def _load_full_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                         head: dict[str, Any] | None) -> None:
        """A single-process state on rank 0 → every rank (collective: tensors are broadcast one at a time)."""
        params = self._trainable()
        box = [head]
        dist.broadcast_object_list(box, src=0)
        hyper, steps = box[0]["hyper"], box[0]["steps"]
        if self.engine is None:
            self._load_replica(model, optimizer, params, hyper, steps)
        else:
            self._load_zero(model, optimizer, params, hyper, steps)

    def _receive(self, value: torch.Tensor | None, like: torch.Tensor | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """Rank 0's ``value`` on every rank (as ``dtype`` on this rank's device; ``like`` gives the shape)."""
        shape = like if isinstance(like, torch.Size) else like.shape
        buf = (value.detach().to(self.device, dtype).reshape(shape).clone() if self.rank == 0
               else torch.empty(shape, dtype=dtype, device=self.device))
        dist.broadcast(buf, src=0)
        return buf

    def _load_replica(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                      params: list[torch.nn.Parameter], hyper: dict[str, Any], steps: dict[int, float]) -> None:
        local = self.model.state_dict()  # views of the parameters and buffers
        with torch.no_grad():
            for k, t in local.items():  # the same order on every rank
                t.copy_(self._receive(model.get(k), t, t.dtype))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i in sorted(steps):
            p = params[i]
            state[i] = {"step": torch.tensor(steps[i])}
            for key in ("exp_avg", "exp_avg_sq"):
                state[i][key] = self._receive(self._state_tensor(optimizer, i, key), p, p.dtype)
        self.optimizer.load_state_dict({"state": state, "param_groups": [{**hyper,
                                                                            "params": list(range(len(params)))}]})

    def _state_tensor(self, optimizer: dict[str, Any], i: int, key: str) -> torch.Tensor | None:
        """Rank 0: the ``key`` state of the i-th trainable parameter in ``optimizer`` (ids as its group lists)."""
        if self.rank != 0:
            return None
        ids = optimizer["param_groups"][0]["params"]
        return optimizer["state"][ids[i]][key]

    def _load_zero(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any],
                   params: list[torch.nn.Parameter], hyper: dict[str, Any], steps: dict[int, float]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        names = {id(p): k for k, p in self.model.named_parameters()}
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
        frozen = [(k, p) for k, p in self.model.named_parameters() if not p.requires_grad]
        for k, p in frozen:
            w = self._receive(model.get(k), getattr(p, "ds_shape", p.shape), p.dtype)
            with self._gather([p], modifier_rank=0), torch.no_grad():
                p.data.copy_(w)
        persistent = set(self.model.state_dict())
        with torch.no_grad():
            for k, b in self.model.named_buffers():
                if k in persistent:
                    b.copy_(self._receive(model.get(k), b, b.dtype))
        for g in self.optimizer.param_groups:
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
    def _gathered(self) -> Iterator[None]:
        with self._gather(list(self.model.parameters())):
            yield


def cpu_tree(tree: Any) -> Any:
    """``tree`` (nested dicts / lists of tensors) with its tensors on the CPU."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: cpu_tree(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(cpu_tree(v) for v in tree)
    return tree
