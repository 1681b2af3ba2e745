"""rl.curriculum (mobilerl/rl/reverse.py): episodes that start after the simulator's expert played a prefix."""

import dataclasses

import pytest

from mobilerl.agent.policy import PolicyOutput
from mobilerl.env.sim.tasks.registry import get_task
from mobilerl.eval.runner import evaluate_sync
from mobilerl.rl.batch import PromptFormat, trajectory_rows
from mobilerl.rl.config import RLConfig
from mobilerl.rl.reverse import ReverseCurriculum
from mobilerl.trajectory import Trajectory


class Finisher:
    """Says finish at once, with made-up tokens (a model policy's answer carries its ids and logprobs)."""

    name, version = "finisher", None

    def __init__(self) -> None:
        self.histories: list[tuple[str, ...]] = []

    def with_seed(self, seed: int):
        return self

    async def act(self, ctx) -> PolicyOutput:
        self.histories.append(ctx.history)
        return PolicyOutput('finish(message="done")', logprobs=[-0.1, -0.2], token_ids=[5, 6])


@pytest.fixture(scope="module")
def task():
    # a task whose expert's last turn is its finish: from the last step's start, saying finish solves it
    return get_task("world/train/AudioRecorderDeleteRecording/0")


def test_from_the_last_steps_start_finish_solves_what_it_cannot_from_the_first(task):
    policy = Finisher()
    whole, late = evaluate_sync(lambda s: policy, [task, dataclasses.replace(task, expert_prefix=task.optimal_steps - 1)],
                                progress=False, concurrency=1)
    assert not whole.success and late.success
    assert [s.expert for s in late.steps] == [True] * (task.optimal_steps - 1) + [False]
    assert all(s.logprobs is None for s in late.steps if s.expert)
    # the policy saw the expert's turns as its own history
    assert policy.histories[-1] == tuple(s.response for s in late.steps[:-1])
    fmt = PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks")
    rows = trajectory_rows(late, 1.0, fmt, lambda req: [1, 2, 3])
    assert len(rows) == 1 and rows[0].response_ids == [5, 6]  # the policy's own turn only
    again = Trajectory.from_dict(late.to_dict())
    assert [s.expert for s in again.steps] == [s.expert for s in late.steps]
    assert "expert" not in whole.steps[0].to_dict() and "expert_prefix" not in task.to_dict()  # bytes kept


def test_the_start_moves_back_as_groups_succeed_until_the_task_is_whole(task):
    rc = ReverseCurriculum(start=1, step=2, grow_at=0.5, per="task")
    [t] = rc.assign([task])
    assert t.expert_prefix == task.optimal_steps - 1 and t.task_id == task.task_id
    rc.update(task.task_id, [1, 0, 0, 0])  # 25 % < 50 %: stays
    assert rc.prefix(task) == task.optimal_steps - 1
    rc.update(task.task_id, [1, 1, 0, 0])
    assert rc.prefix(task) == task.optimal_steps - 3
    for _ in range(task.optimal_steps):
        rc.update(task.task_id, [1, 1])
    assert rc.prefix(task) == 0 and rc.metrics([task]) == {"reverse/prefix_mean": 0.0, "reverse/whole": 1.0}
    restored = ReverseCurriculum(per="task")
    restored.load_state_dict(rc.state_dict())
    assert restored.prefix(task) == 0
    # per template (the default): a sibling task's success moves this task's start too
    shared, sibling = ReverseCurriculum(), dataclasses.replace(task, task_id=task.task_id[:-1] + "9")
    shared.assign([task, sibling])
    shared.update(sibling.task_id, [1, 1])
    assert shared.prefix(task) == task.optimal_steps - 2
    with pytest.raises(ValueError, match="grow_at"):
        ReverseCurriculum(grow_at=0.0)
    assert RLConfig(curriculum={"start": 2}).curriculum.start == 2 and RLConfig().curriculum is None


def test_the_pool_measures_each_tasks_length_and_an_unknown_one_is_refused(task, tmp_path):
    from rl_tasks import stage_root

    from mobilerl.rl.run import training_pool

    unmeasured = dataclasses.replace(task, optimal_steps=0)  # as the train lists store them
    with pytest.raises(ValueError, match="no optimal_steps"):
        ReverseCurriculum().assign([unmeasured])
    root = stage_root(tmp_path, [unmeasured], [task.optimal_steps])
    assert [t.optimal_steps for t in training_pool(RLConfig(), root)] == [0]
    [t] = ReverseCurriculum().assign(training_pool(RLConfig(curriculum={}), root))
    assert t.optimal_steps == task.optimal_steps and t.expert_prefix == task.optimal_steps - 1
