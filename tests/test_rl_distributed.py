"""The data-parallel AdaGRPO update (mobilerl/rl/distributed.py) on the tiny base, 2 gloo processes on CPU: the
update equals the single-process one (uneven shards, a rank without rows, two aggregations, ppo_epochs 2), its
metrics too, and a checkpoint saved by either world size resumes in the other with the same next update."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from mobilerl.rl.batch import PromptFormat, Row, micro_batches
from mobilerl.rl.config import RLConfig
from mobilerl.rl.distributed import deepspeed_config, shard_rows
from mobilerl.rl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
FMT = PromptFormat()
# clipping on (the first step's norm is ~10x this), a KL term with the reference on rank 0, small micro-batches.
# Adam moves every weight by ~lr a step whatever the gradient's size, and from its second step on it turns float
# summation noise on a gradient element that nearly cancels into up to a few % of lr: at lr 1e-4 the 1e-5
# tolerance is a tenth of a step, far above that noise and far below what a wrong share of the loss gives
TOKEN_MEAN = {"overrides": {"kl_coef": 0.01, "learning_rate": 1e-4, "grad_clip": 0.05}, "micro_batch_tokens": 256}
SEQ_MEAN = {"overrides": {"kl_coef": 0.0, "learning_rate": 1e-4, "ppo_epochs": 2},
            "aggregation": "seq-mean-token-mean", "micro_batch_tokens": 256}


def _model():
    from mobilerl.models import tiny

    return tiny.load(BASE, with_processor=False)[0]


def _trainer(cfg: dict[str, Any], **backend: Any) -> Trainer:
    return Trainer(RLConfig(**cfg, **backend), _model(), lambda req: [], 0, FMT)


def _rows(seed: int, n: int) -> list[Row]:
    """``n`` rows of random token ids (prompts 12-70 tokens, answers 2-12), three of them twice (a shared forward),
    behaviour logprobs the base model's plus noise (the ratio leaves the clip range on some tokens)."""
    from mobilerl.rl.batch import collate, rows_logprobs

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p, r = int(torch.randint(12, 70, (1,), generator=g)), int(torch.randint(2, 12, (1,), generator=g))
        rows.append(Row(torch.randint(10, 4000, (p,), generator=g).tolist(),
                        torch.randint(10, 4000, (r,), generator=g).tolist(), [0.0] * r,
                        float(torch.randn(1, generator=g)), on_policy=i % 4 != 3))
    rows += [Row(r.prompt_ids, r.response_ids, r.behaviour_logprobs, -r.advantage, False) for r in rows[:3]]
    with torch.no_grad():
        logp, _ = rows_logprobs(_model(), collate(rows, 0), 1.0)
    for r, lp in zip(rows, logp.tolist(), strict=True):
        noise = (torch.randn(len(r.response_ids), generator=g) * 0.3).tolist()
        r.behaviour_logprobs = [a + b for a, b in zip(lp[: len(r.response_ids)], noise, strict=True)]
    return rows


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.state_dict()["model"].items()}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, backend: dict[str, Any], data: dict[str, Any], out: str) -> None:
    """One rank of the run the tests compare with the single process; rank 0 drives, rank 1 follows."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    if backend.get("trainer_backend") == "deepspeed":
        import deepspeed.ops

        # DeepSpeed's CPU shared-memory allreduce is a C++ JIT build (~40 s of both cores on a clean clone) that
        # only speeds up large CPU tensors; gloo reduces these (GPU runs never build it)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    res: dict[str, Any] = {}

    def session(cfg: dict[str, Any], drive) -> Trainer:
        t = _trainer(cfg, **backend)
        if rank == 0:
            drive(t)
            t.dp.stop()
        else:
            t.follow()
        return t

    def a(t: Trainer) -> None:
        res["stats1"] = t.update(copy.deepcopy(data["rows1"]))
        res["w1"] = _weights(t)
        torch.save(t.state_dict(), Path(out) / "state_dist.pt")
        res["stats2"] = t.update(copy.deepcopy(data["rows2"]))
        res["w2"] = _weights(t)
        res["stats_one"] = t.update(copy.deepcopy(data["one"]))  # one row: rank 1 has none
        res["w3"] = _weights(t)

    def resumed(t: Trainer) -> None:  # the single process's checkpoint, then its next update
        t.load_state_dict(torch.load(Path(out) / "state_single.pt", weights_only=False))
        t.update(copy.deepcopy(data["rows2"]))
        res["w2_resumed"] = _weights(t)

    def b(t: Trainer) -> None:
        res["stats_b"] = t.update(copy.deepcopy(data["rows1"]))
        res["wb"] = _weights(t)

    last = session(TOKEN_MEAN, a)
    session(TOKEN_MEAN, resumed)
    session(SEQ_MEAN, b)
    if last.dp.engine is None:  # a replica: rank 1's weights are rank 0's
        res["replica"] = {k: v.detach().clone() for k, v in last.model.state_dict().items()}
    torch.save(res, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _run_both(tmp_path: Path, backend: dict[str, Any]) -> None:
    """The single-process sequence here, the same on 2 processes (spawned), then both compared."""
    data = {"rows1": _rows(0, 13), "rows2": _rows(1, 9), "one": _rows(2, 1)[:1]}
    single = _trainer(TOKEN_MEAN)
    stats1 = single.update(copy.deepcopy(data["rows1"]))
    w1 = _weights(single)
    torch.save(single.state_dict(), tmp_path / "state_single.pt")
    single.update(copy.deepcopy(data["rows2"]))
    w2 = _weights(single)
    stats_one = single.update(copy.deepcopy(data["one"]))
    w3 = _weights(single)
    seq = _trainer(SEQ_MEAN)
    stats_b = seq.update(copy.deepcopy(data["rows1"]))
    wb = _weights(seq)
    assert stats1["loss/grad_norm"] > 5 * TOKEN_MEAN["overrides"]["grad_clip"]  # clipping is exercised
    mine = [micro_batches(s, 256) for s in shard_rows(data["rows1"], 2)]
    assert len(mine[0]) != len(mine[1]) or sum(map(len, mine[0])) != sum(map(len, mine[1]))  # uneven shards

    torch.multiprocessing.spawn(_rank, args=(2, _port(), backend, data, str(tmp_path)), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"rank{k}.pt", weights_only=False) for k in (0, 1))

    gaps = {"update 1": _close(w1, r0["w1"]), "update 2": _close(w2, r0["w2"]),
            "one row (rank 1 idle)": _close(w3, r0["w3"]), "seq-mean, 2 epochs": _close(wb, r0["wb"]),
            "resumed 1 -> 2 processes": _close(w2, r0["w2_resumed"])}
    print(backend, {k: f"{v:.1e}" for k, v in gaps.items()})
    assert all(v < 1e-5 for v in gaps.values()), gaps
    assert _close(w1, w2) > 5e-5 and _close(w2, w3) > 5e-5  # the steps moved the weights (Adam: ~lr each)
    for mine_, theirs in ((stats1, r0["stats1"]), (stats_one, r0["stats_one"]), (stats_b, r0["stats_b"])):
        assert mine_.keys() == theirs.keys()
        for k in mine_:
            assert theirs[k] == pytest.approx(mine_[k], rel=1e-4, abs=1e-6), k
    if "replica" in r0:
        assert all(torch.equal(r0["replica"][k], r1["replica"][k]) for k in r0["replica"])

    resumed = _trainer(TOKEN_MEAN)  # 2 processes → 1: the distributed checkpoint, the same next update
    resumed.load_state_dict(torch.load(tmp_path / "state_dist.pt", weights_only=False))
    assert _close(w1, _weights(resumed)) < 1e-5
    resumed.update(copy.deepcopy(data["rows2"]))
    assert _close(w2, _weights(resumed)) < 1e-5


def test_shards_are_deterministic_balanced_and_keep_identical_sequences_together():
    rows = [Row([1] * p, [2, i % 5], [0.0, 0.0], 0.0) for i, p in enumerate([40, 10, 10, 30, 25, 5, 40])]
    rows.append(Row([1] * 40, [2, 0], [0.0, 0.0], 1.0))  # the same sequence as rows[0]
    shards = shard_rows(rows, 3)
    assert shard_rows(rows, 3) == shards
    assert sorted(id(r) for s in shards for r in s) == sorted(id(r) for r in rows)
    assert any(rows[0] in s and rows[-1] in s for s in shards)
    loads = [sum(len(r.prompt_ids) + len(r.response_ids) for r in {id(r): r for r in s}.values()
                 if r is not rows[-1]) for s in shards]
    assert max(loads) - min(loads) <= 42  # greedy longest-first: within one sequence's width
    assert all(s == sorted(s, key=rows.index) for s in shards)  # order kept
    assert shard_rows(rows[:1], 2) == [rows[:1], []]


def test_config_names_a_missing_deepspeed_file_and_resolves_auto(tmp_path):
    with pytest.raises(ValueError, match="rl.deepspeed_config"):
        RLConfig(trainer_backend="deepspeed")
    with pytest.raises(ValueError, match="rl.deepspeed_config"):
        RLConfig(deepspeed_config="configs/deepspeed/zero2.json")
    with pytest.raises(ValueError, match="rl.deepspeed_config: nowhere.json does not exist"):
        deepspeed_config("nowhere.json", 2, 1.0, torch.float32)
    cfg = deepspeed_config("configs/deepspeed/zero3.json", 4, 0.5, torch.bfloat16)
    assert (cfg["train_batch_size"], cfg["gradient_accumulation_steps"], cfg["gradient_clipping"]) == (4, 1, 0.5)
    assert cfg["bf16"]["enabled"] is True and cfg["fp16"]["enabled"] is False
    assert cfg["zero_optimization"]["stage"] == 3 and "auto" not in str(cfg)
    bad = tmp_path / "ds.json"
    bad.write_text('{"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}')
    with pytest.raises(ValueError, match="'optimizer'"):
        deepspeed_config(str(bad), 2, 1.0, torch.float32)


def test_two_gloo_processes_give_the_single_process_update_and_resume_across_world_sizes(tmp_path):
    _run_both(tmp_path, {"trainer_backend": "ddp"})


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_gives_the_single_process_update_and_resume_across_world_sizes(tmp_path, stage):
    pytest.importorskip("deepspeed")
    _run_both(tmp_path, {"trainer_backend": "deepspeed", "deepspeed_config": f"configs/deepspeed/zero{stage}.json"})


RUN = """
import json, sys
from pathlib import Path
from mobilerl.rl.config import RLConfig
from mobilerl.rl import round as rl_round
from mobilerl.rl import run as rl_run

def make_groups(trajs, _real=rl_round.make_groups):
    # a stand-in verifier: the tiny base solves nothing, so every other episode of a task succeeds and every
    # group has an advantage to train on
    for i, t in enumerate(trajs):
        t.success, t.reward = i % 2 == 0, float(i % 2 == 0)
    return _real(trajs)

if __name__ == "__main__":  # the rollout workers are spawned: they import this file
    rl_round.make_groups = make_groups
    cfg = RLConfig.model_validate(json.loads(sys.argv[1]))
    summary, curve = rl_run.run(cfg, Path(sys.argv[2]), progress=False)
    print("RANK_RESULT", json.dumps({"rounds": len(curve), "train": [c.get("train/rows", 0.0) for c in curve]}))
"""


@pytest.mark.slow
def test_the_rl_stage_under_torchrun_with_two_processes_ends_with_the_single_process_policy(tmp_path):
    """The stage's loop launched as users launch it (torchrun, 2 gloo processes): rank 0 rolls out, checkpoints and
    writes the policy, rank 1 follows and exits; the policy is the one-process run's."""
    from safetensors.torch import load_file
    from test_rl_trainer import _stage_root

    def cfg(name: str, backend: str) -> str:
        return json.dumps({"init": str(BASE), "out": f"out_{name}", "work": f"work_{name}", "rounds": 2,
                           "checkpoint_every": 1, "rollout_processes": 1, "max_batch": 1, "trainer_backend": backend,
                           "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16,
                                         "learning_rate": 1e-4}})

    root = _stage_root(tmp_path)
    script = tmp_path / "run_rl.py"
    script.write_text(RUN)
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # this checkout's mobilerl
    subprocess.run([sys.executable, str(script), cfg("one", "single"), str(root)], check=True, env=env, timeout=900)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(_port()), str(script), cfg("two", "ddp"), str(root)],
                         check=True, env=env, timeout=900, capture_output=True, text=True).stdout
    results = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("RANK_RESULT")]
    assert sorted(r["rounds"] for r in results) == [0, 2]  # rank 1 follows: no curve of its own
    assert all(n > 0 for r in results if r["rounds"] for n in r["train"])  # every round trained
    curves = [[json.loads(x) for x in (root / f"work_{n}" / "curve.jsonl").read_text().splitlines()]
              for n in ("one", "two")]
    for one, two in zip(*curves, strict=True):  # the same rollouts and rows, the same metrics
        for k in ("rollout/success", "train/rows", "train/tokens", "train/sequences", "loss/policy", "loss/grad_norm",
                  "loss/entropy", "loss/kl_ref", "buffer/size"):
            assert two[k] == pytest.approx(one[k], rel=1e-4, abs=1e-6), k
    a, b = load_file(root / "out_one" / "model.safetensors"), load_file(root / "out_two" / "model.safetensors")
    gaps = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    # two Adam steps of ~1e-4 each: a few elements whose gradient nearly cancels carry float noise up to ~5 % of it
    assert a.keys() == b.keys() and gaps.max() < 5e-5 and (gaps > 1e-6).float().mean() < 1e-4
    assert not (root / "work_two" / "state.pt").exists()
