"""DART's options of the rl stage (dart.txt §4): rollouts per task by success rate, high-entropy step selection,
the per-task counts through the episode runner and the trainer, and the resume state."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from rl_tasks import short_tasks

from mobilerl.agent import RandomPolicy
from mobilerl.env.base import TaskSpec
from mobilerl.env.fake import CounterEnv
from mobilerl.eval.runner import evaluate_sync
from mobilerl.rl.checkpoint import load_state, state_key
from mobilerl.rl.dart import (
    DartCurator,
    allocate_rollouts,
    entropy_mask,
    high_entropy_steps,
    rollout_weight,
    step_entropy,
)
from mobilerl.rl.loop import train
from mobilerl.rl.trainer import Trainer
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"


# ------------------------------------------------------------------------------------- rollout counts


def test_rollout_weight_is_flat_to_the_threshold_then_falls_to_the_floor():
    assert rollout_weight(0.0) == rollout_weight(0.3) == rollout_weight(0.6) == 1.0
    assert rollout_weight(0.8) == pytest.approx(1 - 0.75 * 0.5)
    assert rollout_weight(1.0) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="success rate"):
        rollout_weight(1.5)


def test_allocation_is_monotone_bounded_and_spends_the_budget():
    rng = random.Random(0)
    for _ in range(300):
        g = rng.randint(1, 24)
        lo, n = rng.randint(2, 4), rng.randint(4, 10)
        hi = rng.randint(n, 16)
        rates = [rng.choice([0.0, 0.25, 0.5, 0.6, 0.7, 0.875, 1.0, rng.random()]) for _ in range(g)]
        counts = allocate_rollouts(rates, g * n, lo, hi)
        assert all(lo <= c <= hi for c in counts)
        assert sum(counts) == g * n  # lo <= n <= hi: the budget is reachable
        for i in range(g):
            for j in range(g):
                if rates[i] < rates[j]:
                    assert counts[i] >= counts[j], (rates, counts)
    # unsolved and hopeless tasks alike keep the full count (the paper: low success keeps maximum sampling)
    assert allocate_rollouts([0.0, 0.1, 0.6, 0.0], 32, 2, 12) == [8, 8, 8, 8]
    # solved tasks give rollouts up to the unsolved ones, within the bounds
    counts = allocate_rollouts([0.0, 0.0, 1.0, 1.0, 0.9], 40, 2, 12)
    assert counts[0] == counts[1] == 12 and counts[2] == counts[3] < counts[4] < 12 and sum(counts) == 40
    # a budget outside [G·lo, G·hi] pins every task at a bound
    assert allocate_rollouts([0.0, 1.0], 2, 2, 8) == [2, 2]
    assert allocate_rollouts([0.0, 1.0], 30, 2, 8) == [8, 8]
    with pytest.raises(ValueError, match="min rollouts"):
        allocate_rollouts([0.5], 8, 1, 8)


def test_curator_tracks_recent_success_and_names_bad_bounds():
    cur = DartCurator(2, 12, 8, window=4)
    assert cur.success_rate("new") == 0.0
    cur.update("a", [1, 1, 1, 1])
    cur.update("b", [0, 1, 0, 0])
    cur.update("b", [1, 1])  # window 4: the last four outcomes are 0, 0, 1, 1
    assert cur.success_rate("a") == 1.0 and cur.success_rate("b") == 0.5
    counts, m = cur.rollout_counts(["a", "b", "new"])
    assert sum(counts) == 24 and counts[0] < counts[1] == counts[2]
    assert m["dart/rollouts_per_task_mean"] == 8.0
    restored = DartCurator(2, 12, 8, window=4)
    restored.load_state_dict(cur.state_dict())
    assert restored.rollout_counts(["a", "b", "new"])[0] == counts
    with pytest.raises(ValueError, match="rl.dart.max_rollouts"):
        DartCurator(2, 6, 8)


def test_per_task_counts_run_that_many_episodes_with_the_uniform_runs_seeds():
    tasks = [TaskSpec(task_id=f"fake/test/{k}/2", suite="fake", split="test", template=k, instruction="tap",
                      complexity=0.3) for k in ("a", "b")]
    run = {"env_factory": CounterEnv, "progress": False, "base_seed": 7}
    uniform = evaluate_sync(lambda s: RandomPolicy(s), tasks, n_trials=3, **run)
    mixed = evaluate_sync(lambda s: RandomPolicy(s), tasks, n_trials=[1, 3], **run)
    assert [(t.task_id, t.trial) for t in mixed] == [(tasks[0].task_id, 0)] + [(tasks[1].task_id, j)
                                                                              for j in range(3)]
    by_key = {(t.task_id, t.trial): t for t in uniform}
    for t in mixed:  # an episode's seed is its (task, trial)'s, whatever the other counts
        u = by_key[(t.task_id, t.trial)]
        assert t.seed == u.seed and [s.response for s in t.steps] == [s.response for s in u.steps]
    with pytest.raises(ValueError, match="2 counts for 1 tasks"):
        evaluate_sync(lambda s: RandomPolicy(s), tasks[:1], n_trials=[1, 2], **run)


# ---------------------------------------------------------------------------------- entropy selection


def test_step_entropy_is_the_masked_token_mean():
    ent = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert step_entropy(ent, mask).tolist() == [2.0, 2.0]


def test_entropy_mask_keeps_exactly_the_top_share_of_each_group():
    gen = torch.Generator().manual_seed(0)
    for n_steps, keep in [(10, 0.8), (5, 0.8), (7, 0.5), (1, 0.8), (3, 1.0)]:
        b = 2 * n_steps
        tok = torch.rand((b, 6), generator=gen)
        lengths = torch.randint(1, 7, (b,), generator=gen)
        mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).float()
        groups = torch.tensor([0] * n_steps + [1] * n_steps)
        out = entropy_mask(tok, mask, groups, keep)
        kept = out.sum(dim=1) > 0
        assert torch.equal(out, mask * kept.unsqueeze(1).float())  # whole steps, the response mask otherwise
        h = step_entropy(tok, mask)
        for g in (0, 1):
            sel = groups == g
            assert int(kept[sel].sum()) == math.ceil(round(keep * n_steps, 9))
            if not kept[sel].all():
                assert h[sel & kept].min() >= h[sel & ~kept].max()  # the highest-entropy steps


def test_ties_keep_the_earlier_step_and_the_count_stays_exact():
    h = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5])
    assert high_entropy_steps(h, torch.zeros(5, dtype=torch.long), 0.8).tolist() == [True] * 4 + [False]
    with pytest.raises(ValueError, match="keep share"):
        high_entropy_steps(h, torch.zeros(5, dtype=torch.long), 0.0)


# ---------------------------------------------------------------------------------------- in the trainer


@pytest.fixture(scope="module")
def sampled():
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(BASE, device="cpu")
    policy = ModelPolicy(backend, obs_mode="xml", prompt_style="compact", max_history=4, coords="marks",
                         reuse_greedy=False, sampling=SamplingConfig(temperature=1.0, max_new_tokens=24, seed=0))
    trajs = evaluate_sync(policy.with_seed, short_tasks(2, max_steps=2), n_trials=3, progress=False, concurrency=6)
    return backend, trajs


def _trainer(backend, **cfg):
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.rl.batch import PromptFormat
    from mobilerl.rl.config import RLConfig

    c = RLConfig(overrides={"kl_coef": 0.0, "samples_per_task": 3, "train_batch_size": 2}, adapr=False, **cfg)
    model = HFBackend.from_pretrained(BASE, device="cpu").model
    return Trainer(c, model, backend.prompt_ids, backend.pad_id,
                   PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks"))


def _groups(trajs):
    from mobilerl.rl.groups import make_groups, score_groups

    trajs = [Trajectory.from_dict(t.to_dict()) for t in trajs]
    for i, t in enumerate(trajs):
        t.success = i % 3 == 0  # a success in every group: every trajectory gives loss
        t.reward = float(t.success)
    groups, _ = make_groups(trajs)
    score_groups(groups, 1.0, None, torch.Generator().manual_seed(0))
    return groups


def test_the_trainer_trains_the_top_entropy_steps_of_each_task(sampled):
    from mobilerl.rl.batch import collate, rows_logprobs

    backend, trajs = sampled
    plain, _ = _trainer(backend).batch(_groups(trajs), 0)
    trainer = _trainer(backend, dart={})
    rows, m = trainer.batch(_groups(trajs), 0)
    key = [(tuple(r.prompt_ids), tuple(r.response_ids), r.advantage) for r in plain]
    kept = [(tuple(r.prompt_ids), tuple(r.response_ids), r.advantage) for r in rows]
    assert set(kept) <= set(key)
    # the step entropies the selection should have seen, one row at a time
    with torch.no_grad():
        h = [float(rows_logprobs(trainer.model, collate([r], backend.pad_id), 1.0, entropy=True)[1].mean())
             for r in plain]
    task_of = [t.task_id for g in _groups(trajs) for t in g.trajectories for s in t.steps if s.token_ids]
    assert len(task_of) == len(plain)
    for task in set(task_of):
        idx = [i for i, t in enumerate(task_of) if t == task]
        mine = [i for i in idx if key[i] in kept]
        assert len(mine) == math.ceil(round(0.8 * len(idx), 9)) or len({key[i] for i in idx}) < len(idx)
        dropped = [i for i in idx if key[i] not in kept]
        if dropped:
            assert min(h[i] for i in mine) >= max(h[i] for i in dropped) - 1e-4
    assert 0 < m["dart/steps_kept_share"] < 1 and 0 < m["dart/tokens_kept_share"] <= 1
    assert m["dart/steps_kept_share"] == pytest.approx(len(rows) / len(plain))


def test_defaults_leave_the_trainer_as_it_was(sampled):
    backend, _ = sampled
    trainer = _trainer(backend)
    assert not trainer.hooks
    assert set(trainer.state_dict()) == {"round", "model", "optimizer", "buffer", "curriculum"}


class FakeWorkers:
    """Rollout workers without a model: task ``easy`` always succeeds, ``hard`` never; records the counts."""

    def __init__(self) -> None:
        self.counts: list[list[int]] = []

    def run(self, tasks, n, base_seed, weights=None, version=0):
        counts = [n] * len(tasks) if isinstance(n, int) else list(n)
        self.counts.append(counts)
        out = [Trajectory(task_id=t.task_id, trial=j, seed=base_seed + j, success="easy" in t.task_id,
                          reward=float("easy" in t.task_id), steps=[], finished=True)
               for t, c in zip(tasks, counts, strict=True) for j in range(c)]
        return out, 0.0


def test_train_spends_fewer_rollouts_on_a_solved_task_and_resumes_the_stats(tmp_path):
    from mobilerl.rl.batch import PromptFormat
    from mobilerl.rl.config import RLConfig

    cfg = RLConfig(overrides={"kl_coef": 0.0, "samples_per_task": 4, "train_batch_size": 4}, rounds=2, dart={"max_rollouts": 8},
                   checkpoint_every=1, fcf=False)
    pool = [TaskSpec(task_id=f"world/train/{k}/{i}", suite="world", split="train", template=k, instruction="x")
            for k, i in (("easy", 0), ("hard", 0), ("hard", 1), ("hard", 2))]
    trainer = Trainer(cfg, torch.nn.Linear(2, 2), lambda req: [], 0, PromptFormat())
    workers = FakeWorkers()
    curve = train(trainer, workers, pool, tmp_path, progress=False)
    assert workers.counts[0] == [4, 4, 4, 4]  # nothing seen yet: every task at samples_per_task
    easy = [t.task_id for t in pool].index("world/train/easy/0")
    assert workers.counts[1][easy] == 2 and sum(workers.counts[1]) == 16
    assert sorted(c for i, c in enumerate(workers.counts[1]) if i != easy) == [4, 5, 5]  # the freed two
    assert curve[1]["dart/rollouts_per_task_min"] == 2.0 and curve[1]["dart/rollouts_per_task_mean"] == 4.0
    restored = Trainer(cfg, torch.nn.Linear(2, 2), lambda req: [], 0, PromptFormat())
    restored.load_state_dict(load_state(tmp_path, state_key(RLConfig().state_key)))
    assert restored.hooks.get("dart").state_dict() == trainer.hooks.get("dart").state_dict()
    ids = [t.task_id for t in pool]
    assert restored.hooks.get("dart").rollout_counts(ids) == trainer.hooks.get("dart").rollout_counts(ids)
