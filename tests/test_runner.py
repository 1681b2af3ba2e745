"""The episode runner (mobilerl.agent.runner): order, seeds, hooks, whose failure an error is, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from mobilerl.agent import ScriptedPolicy
from mobilerl.agent.runner import Episode, episode_seed, run_episodes
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import EnvCrashed, TaskSpec
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.pool import EnvPool, InlineEnv

TAP = format_action(Action("Tap", element=BUTTON))


def task(name: str, target: int = 1) -> TaskSpec:
    return TaskSpec(task_id=f"fake/test/{name}/{target}", suite="fake", split="test", template=name,
                    instruction="tap")


class Crashing(CounterEnv):
    """Its step() dies like a killed emulator on tasks named "crash"."""

    def step(self, action):
        if self.task_id is not None and "/crash/" in self.task_id:
            raise EnvCrashed("emulator died")
        return super().step(action)


def run(tasks, factory, size=2, **kwargs) -> list[Episode]:
    async def go():
        async with EnvPool(lambda: InlineEnv(Crashing()), size=size) as pool:
            return await run_episodes(pool, factory, tasks, progress=False, **kwargs)

    return asyncio.run(go())


def test_episodes_come_back_in_task_trial_order_with_their_seeds_and_what_was_taken():
    tasks = [task("a", 1), task("b", 2), task("c", 1)]
    seen: list[tuple[str, int]] = []

    async def hook(ep: Episode) -> None:
        seen.append((ep.task.task_id, ep.trial))

    eps = run(tasks, lambda seed: ScriptedPolicy([TAP, TAP, "finish()"]), n_trials=2, base_seed=7,
              take=lambda env: env.worker.env.count, on_episode=hook)
    assert [(e.task.task_id, e.trial) for e in eps] == [(t.task_id, k) for t in tasks for k in range(2)]
    assert [e.index for e in eps] == list(range(6)) and sorted(seen) == sorted((e.task.task_id, e.trial) for e in eps)
    assert all(e.seed == e.trajectory.seed == episode_seed(7, e.task.task_id, e.trial) for e in eps)
    assert [e.taken for e in eps] == [2] * 6  # the env's counter after the episode, read inside the lease
    assert all(e.failed_in is None for e in eps)
    # a wrong answer is the policy's doing, not a failure: the reward stands
    wrong = run([task("d", 3)], lambda seed: ScriptedPolicy(["finish()"]))[0]
    assert wrong.failed_in is None and wrong.trajectory.reward == 0.0 and not wrong.trajectory.success


def test_an_env_crash_is_told_apart_from_a_policy_failure():
    def factory(seed):
        if seed == episode_seed(0, "fake/test/nopolicy/1", 0):
            raise RuntimeError("no checkpoint")
        return ScriptedPolicy([TAP, "finish()"])

    eps = run([task("ok"), task("crash"), task("nopolicy"), task("ok2")], factory)
    by = {e.task.template: e for e in eps}
    assert by["crash"].failed_in == "env" and "EnvCrashed: emulator died" in by["crash"].trajectory.error
    assert by["nopolicy"].failed_in == "policy" and by["nopolicy"].trajectory.error == "policy: RuntimeError: no checkpoint"
    assert by["ok"].failed_in is None and by["ok"].trajectory.success and by["ok2"].trajectory.success
    # a policy that raises during the rollout is the policy's failure too
    [broke] = run([task("short", 3)], lambda seed: ScriptedPolicy([TAP]))
    assert broke.failed_in == "policy" and broke.trajectory.error.startswith("policy: ")


def test_a_failing_hook_cancels_the_episodes_still_running():
    tasks = [task(f"t{i}", 2) for i in range(12)]
    finished: list[str] = []

    class Slow(ScriptedPolicy):
        async def act(self, ctx):
            await asyncio.sleep(0.01)
            return await super().act(ctx)

    async def hook(ep: Episode) -> None:
        finished.append(ep.task.task_id)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run(tasks, lambda seed: Slow([TAP, TAP, "finish()"]), size=2, on_episode=hook)
    assert 1 <= len(finished) < len(tasks)  # the rest were cancelled, not run to their end


def test_argument_checks():
    with pytest.raises(ValueError, match="n_trials"):
        run([task("a")], lambda seed: ScriptedPolicy(["finish()"]), n_trials=0)
    assert run([], lambda seed: ScriptedPolicy(["finish()"])) == []
