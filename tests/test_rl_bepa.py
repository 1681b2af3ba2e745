"""BEPA (bepa.txt §4) as an option of the `rl` stage: the replacement rule (Eq. 3), the cache's refresh with the
policy's own successes and its plan-conditioned seeding, the replayed rows' old-policy logprobs under the plain
instruction, and the trainer's round with the option on (fake rollout workers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from rl_tasks import short_tasks

from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend
from mobilerl.rl.batch import PromptFormat, collate, rows_logprobs, step_requests, trajectory_rows
from mobilerl.rl.bepa import (
    BEPA,
    PLAN_HEADER,
    oracle_plan,
    plan_instruction,
    relogprob,
    replace_first_failure,
)
from mobilerl.rl.checkpoint import load_state, state_key
from mobilerl.rl.config import RLConfig
from mobilerl.rl.groups import Group, score_groups
from mobilerl.rl.loop import train
from mobilerl.rl.trainer import Trainer
from mobilerl.trajectory import StepRecord, Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
FMT = PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks")


def traj(task: str, success: bool, trial: int = 0, instruction: str = "do it", steps: int = 0) -> Trajectory:
    return Trajectory(task_id=task, instruction=instruction, success=success, reward=float(success), trial=trial,
                      finished=True, steps=[StepRecord(index=i, response=f"r{i}") for i in range(steps)])


class Recorder:
    """A fake rollout: ``outcome(task, trial)`` decides success; records the tasks it was asked to run."""

    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    def __call__(self, tasks, n, seed):
        self.calls.append(([t.task_id for t in tasks], [t.instruction for t in tasks], n, seed))
        return [traj(t.task_id, self.outcome(t.task_id, j), j, t.instruction, steps=2) for t in tasks for j in range(n)]


def marked(t: Trajectory) -> Trajectory:  # a stand-in for the old-policy recompute: a marked copy
    out = Trajectory.from_dict(t.to_dict())
    out.meta["relogprob"] = True
    return out


def test_the_first_failed_rollout_is_replaced_only_when_every_rollout_failed():
    cached = traj("a", True, 9)
    failed = [traj("a", False, i) for i in range(4)]
    assert replace_first_failure(failed, cached) == [cached, *failed[1:]]
    mixed = [traj("a", False, 0), traj("a", True, 1), traj("a", False, 2)]
    assert replace_first_failure(mixed, cached) is None  # the group has signal of its own
    assert replace_first_failure(failed, None) is None  # nothing cached: the group stays all-zero
    assert replace_first_failure([], cached) is None


def test_the_cache_is_refreshed_with_the_policys_own_success_and_replaces_that_tasks_failures():
    bepa = BEPA(seed_rollouts=2)
    rollout = Recorder(lambda task, trial: False)
    round0 = [Group("a", [traj("a", False, 0), traj("a", True, 1, steps=3), traj("a", False, 2)]),
              Group("b", [traj("b", True, 0, steps=1), traj("b", True, 1, steps=1)])]
    out, m = bepa.assimilate(round0, [], 0, rollout, marked)
    assert out == round0 and m["bepa/replaced"] == 0 and m["bepa/refreshed"] == 2 and m["bepa/cache_tasks"] == 2
    assert bepa.cache["a"].trial == 1 and bepa.cache["a"].meta["bepa"] == "own"  # a's only success
    assert rollout.calls == []  # no group failed whole: nothing to seed

    failed = [traj("a", False, i) for i in range(3)]
    round1 = [Group("a", failed), Group("c", [traj("c", False, 0), traj("c", True, 1)])]
    out, m = bepa.assimilate(round1, [], 1, rollout, marked)
    assert m["bepa/replaced"] == 1 and rollout.calls == []  # a has a cache entry: no seeding
    new = out[0].trajectories
    assert new[0].success and new[0].trial == 1 and new[0].meta["relogprob"] and new[1:] == failed[1:]
    assert round1[0].trajectories == failed  # the sampled group is left as it was (curriculum, metrics)
    assert out[1] is round1[1] and bepa.cache["c"].trial == 1  # c's success refreshed its entry
    score_groups(out, 1.0, 2.0, torch.Generator().manual_seed(0))
    assert out[0].advantages[0] > 0 > out[0].advantages[1]  # the group now has signal (Eq. 4)

    state = bepa.state_dict()
    restored = BEPA(seed_rollouts=2)
    restored.load_state_dict(json.loads(json.dumps(state)))  # JSON-safe, as the resume state needs
    assert restored.cache.keys() == bepa.cache.keys() and restored.seeded == bepa.seeded
    assert restored.cache["a"].to_dict() == bepa.cache["a"].to_dict()


def test_plan_conditioned_seeding_once_per_task_with_the_plain_instruction_in_the_cache():
    tasks = short_tasks(2)
    plan = oracle_plan(tasks[0])
    assert plan and plan[0].startswith("Open ") and plan[-1].startswith(("Stop", "Answer"))
    guided = plan_instruction(tasks[0].instruction, plan)
    assert guided.startswith(tasks[0].instruction) and PLAN_HEADER in guided and f"1. {plan[0]}" in guided

    bepa = BEPA(seed_rollouts=3, seed=7)
    wins = Recorder(lambda task, trial: task == tasks[0].task_id and trial >= 1)  # task 1 never succeeds
    groups = [Group(t.task_id, [traj(t.task_id, False, j, t.instruction) for j in range(2)]) for t in tasks]
    out, m = bepa.assimilate(groups, tasks, 0, wins, marked)
    [(ids, instructions, n, _)] = wins.calls
    assert ids == [t.task_id for t in tasks] and n == 3
    assert all(PLAN_HEADER in x and x.startswith(t.instruction) for x, t in zip(instructions, tasks, strict=True))
    assert m["bepa/seeded"] == 2 and m["bepa/seed_episodes"] == 6 and m["bepa/seed_successes"] == 2
    entry = bepa.cache[tasks[0].task_id]
    assert entry.instruction == tasks[0].instruction and entry.meta["bepa"] == "seed" and entry.trial >= 1
    assert tasks[1].task_id not in bepa.cache
    assert m["bepa/replaced"] == 1 and out[0].trajectories[0].instruction == tasks[0].instruction
    assert out[1] is groups[1]  # no success came of task 1's seeding: its group stays all-zero

    _, m = bepa.assimilate(groups, tasks, 1, wins, marked)
    assert len(wins.calls) == 1 and m["bepa/seeded"] == 0  # seeded once a run: the cost is bounded


@pytest.fixture(scope="module")
def guided_episode():
    """A tiny-base episode sampled with the oracle's plan in its prompt (taken as a success), and the backend."""
    backend = HFBackend.from_pretrained(BASE, device="cpu")
    policy = ModelPolicy(backend, obs_mode=FMT.obs_mode, prompt_style=FMT.prompt_style, max_history=FMT.max_history,
                         coords=FMT.coords, reuse_greedy=False,
                         sampling=SamplingConfig(temperature=1.0, max_new_tokens=24, seed=0))
    task = short_tasks(1)[0]
    guided = dataclasses.replace(task, instruction=plan_instruction(task.instruction, oracle_plan(task)))

    def rollout(tasks, n, seed):
        assert [t.instruction for t in tasks] == [guided.instruction]
        trajs = evaluate_sync(policy.with_seed, tasks, n_trials=n, base_seed=seed, progress=False)
        for t in trajs:
            t.success, t.reward = True, 1.0  # the tiny base rarely succeeds: the mechanics are what is tested
        return trajs

    return backend, task, rollout


def test_the_replayed_rows_carry_the_old_policys_logprobs_under_the_plain_instruction(guided_episode):
    backend, task, rollout = guided_episode
    cfg = RLConfig(bepa={"seed_rollouts": 1}, overrides={"kl_coef": 0.0, "learning_rate": 1e-3})
    trainer = Trainer(cfg, HFBackend.from_pretrained(BASE, device="cpu").model, backend.prompt_ids,
                      backend.pad_id, FMT)
    failed = [dataclasses.replace(traj(task.task_id, False, j, task.instruction), trial=j) for j in range(3)]
    out, m = trainer.hooks.get("bepa").assimilate([Group(task.task_id, failed)], [task], 0, rollout, relogprob(trainer))
    assert m["bepa/seeded"] == 1 and m["bepa/replaced"] == 1
    replayed = out[0].trajectories[0]
    sampled = trainer.hooks.get("bepa").cache[task.task_id]  # holds the plan-conditioned behaviour logprobs
    assert replayed.n_steps > 0 and replayed.instruction == task.instruction

    requests = step_requests(replayed, FMT)
    assert all(PLAN_HEADER not in m["content"] for r in requests for m in r.messages)  # the plan is not trained
    rows = trajectory_rows(replayed, 1.0, FMT, backend.prompt_ids)
    assert [r.prompt_ids for r in rows] == [backend.prompt_ids(r) for r in requests]
    with torch.no_grad():
        b = collate(rows, backend.pad_id)
        old, _ = rows_logprobs(trainer.model, b, 1.0)
    mask = b["response_mask"] > 0
    got = torch.tensor([lp for r in rows for lp in r.behaviour_logprobs])
    assert torch.allclose(got, old[mask], atol=1e-5)  # π_θold under the plain prompt ...
    behaviour = torch.tensor([lp for s in sampled.steps for lp in s.logprobs])
    assert (got - behaviour).abs().max() > 1e-3  # ... not the plan-conditioned sampling's

    score_groups(out, 1.0, None, torch.Generator().manual_seed(0))
    train_rows, _ = trainer.batch(out, 0)
    assert [r.behaviour_logprobs for r in train_rows] == [r.behaviour_logprobs for r in rows]  # the others: no tokens
    stats = trainer.update(train_rows)
    assert abs(stats["loss/ratio_mean"] - 1.0) < 1e-4  # the ratio starts at 1: r_t = π_θ / π_θold


class FakeWorkers:
    """Rollout workers without a model: episodes of no steps whose success is ``outcome(task, trial)``."""

    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    def run(self, tasks, n, base_seed, weights=None, version=0):
        self.calls.append(([t.task_id for t in tasks], [t.instruction for t in tasks], base_seed))
        return [traj(t.task_id, self.outcome(t, j), j, t.instruction) for t in tasks for j in range(n)], 0.0


def test_a_round_with_bepa_trains_on_the_injected_success_but_the_curriculum_sees_the_failures(tmp_path):
    base = short_tasks(1)[0]
    pool = [dataclasses.replace(base, task_id=f"world/train/{base.template}/{i}") for i in range(2)]
    workers = FakeWorkers(lambda t, j: PLAN_HEADER in t.instruction)  # only plan-conditioned episodes succeed
    cfg = RLConfig(bepa={"seed_rollouts": 2}, rounds=2, fcf_patience=3, adapr=False,
                   overrides={"train_batch_size": 2, "samples_per_task": 3, "kl_coef": 0.0})
    trainer = Trainer(cfg, torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    curve = train(trainer, workers, pool, tmp_path, progress=False)
    assert [c["bepa/seeded"] for c in curve] == [2, 0] and [c["bepa/replaced"] for c in curve] == [2, 2]
    assert [c["bepa/cache_tasks"] for c in curve] == [2, 2]
    assert len(workers.calls) == 3  # round 0: on-policy + seeding; round 1: on-policy only
    assert all(c["rollout/success"] == 0.0 for c in curve)  # on-policy metrics: the injection is not counted
    assert trainer.curriculum.failures == {t.task_id: 2 for t in pool}  # FCF sees two all-zero rounds
    assert "bepa" in trainer.state_dict()["hooks"] and "hooks" not in Trainer(
        RLConfig(), torch.nn.Linear(2, 2), lambda req: [], 0, FMT).state_dict()

    # resumed after round 0: the cache and the seeded tasks come back, so round 1 neither seeds again nor misses
    first = Trainer(cfg.model_copy(update={"rounds": 1}), torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    train(first, FakeWorkers(workers.outcome), pool, tmp_path / "b", progress=False)
    resumed = Trainer(cfg, torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    resumed.load_state_dict(load_state(tmp_path / "b", state_key(RLConfig().state_key)))
    later = FakeWorkers(workers.outcome)
    tail = train(resumed, later, pool, tmp_path / "b", progress=False)
    assert later.calls == workers.calls[2:] and tail[-1]["bepa/replaced"] == 2 and tail[-1]["bepa/seeded"] == 0
    assert {k: t.to_dict() for k, t in resumed.hooks.get("bepa").cache.items()} == {
        k: t.to_dict() for k, t in trainer.hooks.get("bepa").cache.items()}
