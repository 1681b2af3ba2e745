"""DAPO's dynamic sampling as an option of the `rl` stage: groups without reward variance are set aside and more
tasks are drawn until the batch holds ``train_batch_size`` groups with signal or the draw cap is reached; the
draws are seeded by (seed, round, draw) and the discarded groups still update the curriculum."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mobilerl.env.sim.tasks import list_tasks
from mobilerl.rl.batch import PromptFormat
from mobilerl.rl.config import RLConfig
from mobilerl.rl.dynamic_sampling import fill_batch, has_signal
from mobilerl.rl.groups import Group
from mobilerl.rl.loop import train
from mobilerl.rl.trainer import Trainer
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import StepRecord, Trajectory

FMT = PromptFormat()


def traj(task: str, success: bool, trial: int = 0, steps: int = 0) -> Trajectory:
    return Trajectory(task_id=task, success=success, reward=float(success), trial=trial, finished=True,
                      steps=[StepRecord(index=i, response=f"r{i}") for i in range(steps)])


def test_signal_is_non_zero_reward_variance_after_spa():
    def group(*outcomes, steps=(1, 1, 1)):
        return Group("a", [traj("a", o, i, s) for i, (o, s) in enumerate(zip(outcomes, steps, strict=True))])

    assert has_signal(group(True, False, False), None)
    assert not has_signal(group(False, False, False), 1.0)
    assert not has_signal(group(True, True, True), None)
    assert not has_signal(group(True, True, True, steps=(2, 3, 4)), None)  # binary: all equal
    assert has_signal(group(True, True, True, steps=(2, 3, 4)), 1.0)  # SPA ranks the shorter successes higher
    assert not has_signal(Group("a", [traj("a", True)]), None)  # one episode left: no variance


def test_fill_batch_draws_until_enough_groups_have_signal_and_stops_at_the_cap():
    def groups(draw, n, signal_every):
        return [Group(f"{draw}/{i}", [traj(f"{draw}/{i}", i % signal_every == 0, 0), traj(f"{draw}/{i}", False, 1)])
                for i in range(n)]

    signal = lambda g: has_signal(g, None)  # noqa: E731
    seen_sets = []

    def draw(d, seen):
        seen_sets.append(set(seen))
        return groups(d, 4, 2)  # 2 of 4 with signal

    kept, drawn, m = fill_batch(groups(0, 4, 4), draw, want=4, max_draws=5, signal=signal)  # 1 of 4 first
    assert m["sampling/draws"] == 3 and len(drawn) == 12 and m["sampling/groups_with_signal"] == 5
    assert m["sampling/discarded"] == 7 and m["sampling/surplus"] == 1 and m["sampling/trained_groups"] == 4
    assert [g.task_id for g in kept] == ["0/0", "1/0", "1/2", "2/0"]  # draw order, trimmed to the batch
    assert seen_sets[1] == {g.task_id for g in drawn[:8]}  # each draw knows every task drawn before it

    kept, drawn, m = fill_batch(groups(0, 4, 99), lambda d, seen: groups(d, 4, 99), 4, 3, signal)
    assert m["sampling/draws"] == 3 and m["sampling/groups_with_signal"] == 3 and len(kept) == 3  # capped
    assert m["sampling/discarded"] == 9

    kept, _, m = fill_batch(groups(0, 4, 1), draw, 4, 3, signal)
    assert m["sampling/draws"] == 1 and len(kept) == 4  # the first draw was enough: no more rollouts

    _, _, m = fill_batch(groups(0, 4, 99), lambda d, seen: [], 4, 3, signal)
    assert m["sampling/draws"] == 2 and m["sampling/groups"] == 4  # the pool is spent
    with pytest.raises(ValueError, match="dynamic_sampling.max_draws"):
        fill_batch([], draw, 4, 0, signal)


class FakeWorkers:
    """Rollout workers without a model: episodes of no steps; a task of even index succeeds on trial 0 only
    (signal), one of odd index never does."""

    def __init__(self):
        self.calls = []

    def run(self, tasks, n, base_seed, weights=None, version=0):
        self.calls.append(([t.task_id for t in tasks], base_seed, version))
        return [traj(t.task_id, int(t.task_id.rsplit("/", 1)[1]) % 2 == 0 and j == 0, j)
                for t in tasks for j in range(n)], 0.0


def _run(tmp_path, **cfg):
    base = list_tasks("world", "train", n=1)[0]
    pool = [dataclasses.replace(base, task_id=f"world/train/{base.template}/{i}") for i in range(24)]
    config = RLConfig(rounds=2, fcf=False, adapr=False, **cfg,
                      overrides={"train_batch_size": 4, "samples_per_task": 2, "kl_coef": 0.0})
    trainer = Trainer(config, torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    trained = []
    batch = trainer.batch
    trainer.batch = lambda groups, r, ctx=None: (trained.append([g.task_id for g in groups]), batch(groups, r, ctx))[1]
    workers = FakeWorkers()
    curve = train(trainer, workers, pool, tmp_path, progress=False)
    return curve, workers.calls, trained, trainer


def test_a_round_draws_new_tasks_until_its_batch_has_signal_and_discards_still_update_the_curriculum(tmp_path):
    curve, calls, trained, trainer = _run(tmp_path / "a", dynamic_sampling={"max_draws": 6})
    for r, c in enumerate(curve):
        per_round = [x for x in calls if x[2] == r]
        assert len(per_round) == c["sampling/draws"]
        assert [x[1] for x in per_round] == [stable_seed(0, "rollout", r)] + [
            stable_seed(0, "rollout", r, d) for d in range(1, len(per_round))]  # seeded by (seed, round, draw)
        drawn = [t for x in per_round for t in x[0]]
        assert len(drawn) == len(set(drawn)) == 4 * len(per_round)  # a draw never repeats a task of the round
        assert c["sampling/groups_with_signal"] >= 4 and len(trained[r]) == 4
        assert all(int(t.rsplit("/", 1)[1]) % 2 == 0 for t in trained[r])  # only groups with signal are trained
        assert c["sampling/discarded"] == len(drawn) - c["sampling/groups_with_signal"]
        assert c["rollout/episodes"] == 2 * len(drawn)  # rollout/* covers every drawn group
    assert max(c["sampling/draws"] for c in curve) > 1
    odd = {t for x in calls for t in x[0] if int(t.rsplit("/", 1)[1]) % 2}
    assert odd and all(trainer.curriculum.failures[t] >= 1 for t in odd)  # discarded groups count for FCF

    again, calls2, trained2, _ = _run(tmp_path / "b", dynamic_sampling={"max_draws": 6})
    assert calls2 == calls and trained2 == trained  # draws depend on (seed, round, draw) only: resume is exact

    capped, calls3, _, _ = _run(tmp_path / "c", dynamic_sampling={"max_draws": 1})
    assert len(calls3) == 2 and all(c["sampling/draws"] == 1 for c in capped)


def test_off_by_default_one_draw_a_round_and_no_sampling_metrics(tmp_path):
    curve, calls, trained, _ = _run(tmp_path)
    assert len(calls) == 2 and [x[1] for x in calls] == [stable_seed(0, "rollout", r) for r in range(2)]
    assert all(len(t) == 4 for t in trained)  # every group, signal or not
    assert not any(k.startswith(("sampling/", "bepa/")) for c in curve for k in c)
