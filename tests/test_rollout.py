"""The multi-turn rollout loop, the non-model policies and the trajectory records."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from mobilerl.agent import (
    OraclePolicy,
    PolicyContext,
    RandomPolicy,
    ScriptedPolicy,
    parse_compressed,
    rollout,
)
from mobilerl.agent.policy import PolicyError, PolicyOutput
from mobilerl.env.actions import Action, format_action, parse_action
from mobilerl.env.base import EnvCrashed, EnvError, Observation, StepResult, TaskSpec
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.pool import ThreadEnv
from mobilerl.env.sim import SimEnv
from mobilerl.env.sim.tasks import get_task
from mobilerl.env.xml import compress_xml
from mobilerl.eval.metrics import classify_failure
from mobilerl.trajectory import StepRecord, Trajectory, read_jsonl, write_jsonl

TAP = format_action(Action("Tap", element=BUTTON))
FINISH = 'finish(message="done")'


def counter_task(target: int = 2, complexity: float = 1.0) -> TaskSpec:
    return TaskSpec(
        task_id=f"fake/test/Counter/{target}",
        suite="fake",
        split="test",
        template="Counter",
        instruction=f"Tap Add {target} times",
        complexity=complexity,
        optimal_steps=target + 1,
    )


def run(coro):
    return asyncio.run(coro)


def test_malformed_responses_are_invalid_steps_and_count():
    inner = CounterEnv()
    env = ThreadEnv(inner)
    responses = ["tap the add button please", TAP, "<think>hmm</think>", f"<answer>{TAP}</answer>", FINISH]
    policy = ScriptedPolicy(responses, logprobs=[[-0.1, -0.2], None, None, None, [-1.0]])
    traj = run(rollout(env, policy, counter_task(2), trial=3, seed=7))
    assert [s.response for s in traj.steps] == responses
    assert [s.valid for s in traj.steps] == [False, True, False, True, True]
    assert "no do(...) or finish(...)" in traj.steps[0].invalid
    assert traj.steps[2].invalid == "empty action"
    assert traj.steps[0].action is None and traj.steps[0].effect is None and not traj.steps[0].changed
    assert inner.steps == 3  # the env was stepped only for valid actions
    assert traj.steps[1].changed and traj.steps[1].action == parse_action(TAP).to_dict()
    assert traj.finished and traj.answer == "done" and traj.reward == 1.0 and traj.success
    assert traj.error is None and traj.n_invalid == 2 and traj.n_steps == 5
    assert traj.trial == 3 and traj.seed == 7 and traj.policy == "scripted"
    assert traj.steps[0].logprobs == [-0.1, -0.2] and traj.steps[1].logprobs is None
    assert "Count: 0" in traj.steps[0].xml_compressed and "Count: 2" in traj.final_xml_compressed
    assert [s.index for s in traj.steps] == list(range(5))


def test_an_unresolved_index_action_is_an_invalid_step():
    inner = CounterEnv()
    policy = ScriptedPolicy(['<answer>do(action="Tap", index=0)</answer>', TAP, FINISH])
    traj = run(rollout(ThreadEnv(inner), policy, counter_task(1)))
    assert [s.valid for s in traj.steps] == [False, True, True]
    assert "marks" in traj.steps[0].invalid and inner.steps == 2 and traj.success


def test_a_parser_crash_is_an_invalid_step_not_a_crashed_episode(monkeypatch):
    """parse_action raises only ActionParseError; should a bug let anything else out, the step is invalid
    (the exception's type named) and the episode goes on."""
    import importlib

    rollout_module = importlib.import_module("mobilerl.agent.rollout")  # the package re-exports the function

    def broken(text):
        if text == "boom":
            raise RecursionError("maximum recursion depth exceeded during ast construction")
        return parse_action(text)

    monkeypatch.setattr(rollout_module, "parse_action", broken)
    inner = CounterEnv()
    traj = run(rollout(ThreadEnv(inner), ScriptedPolicy(["boom", TAP, FINISH]), counter_task(1)))
    assert [s.valid for s in traj.steps] == [False, True, True]
    assert "RecursionError" in traj.steps[0].invalid
    assert traj.error is None and traj.success and inner.steps == 2


def test_invalid_steps_spend_the_budget():
    inner = CounterEnv()
    task = counter_task(1, complexity=0.6)  # max_steps = 6
    traj = run(rollout(ThreadEnv(inner), ScriptedPolicy(["do(action='Fly')"], repeat_last=True), task))
    assert traj.n_steps == task.max_steps == 6
    assert traj.n_invalid == 6 and inner.steps == 0
    assert not traj.finished and not traj.success and traj.reward == 0.0
    assert classify_failure(traj) == "invalid_actions"
    assert traj.error_kind == "parse" and traj.error is None  # nothing parsed: the policy's failure, not a fault


def test_success_needs_finish():
    # CounterEnv's verifier passes once the count is reached, but the agent never finishes.
    traj = run(rollout(ThreadEnv(CounterEnv()), ScriptedPolicy([TAP], repeat_last=True), counter_task(1)))
    assert traj.reward == 1.0 and not traj.finished and not traj.success
    assert traj.n_steps == 10 and traj.error_kind == "budget"
    assert all(s.changed for s in traj.steps)  # each tap bumps the counter: progress, not a loop
    assert classify_failure(traj) == "never_finished"


def test_history_holds_previous_responses():
    seen: list[tuple[str, ...]] = []

    class Recorder:
        async def act(self, ctx: PolicyContext):
            seen.append(ctx.history)
            assert ctx.step == len(ctx.history) and ctx.episode_id == "fake/test/Counter/1#0"
            assert ctx.xml_compressed == compress_xml(ctx.observation.xml)
            return await ScriptedPolicy(["junk", TAP, FINISH]).act(ctx)

    traj = run(rollout(ThreadEnv(CounterEnv()), Recorder(), counter_task(1)))
    assert seen == [(), ("junk",), ("junk", TAP)]
    assert traj.success and traj.policy == "Recorder"


class CrashingEnv:
    """An async env that dies on its ``crash_at``-th step (or on reset/evaluate)."""

    def __init__(self, crash_at: int = 2, fail: str = "step"):
        self.crash_at, self.fail, self.steps = crash_at, fail, 0

    async def reset(self, task):
        if self.fail == "reset":
            raise EnvError("unknown task id")
        return Observation(xml=CounterEnv()._xml(), app="Counter")

    async def step(self, action):
        self.steps += 1
        if self.fail == "step" and self.steps >= self.crash_at:
            raise EnvCrashed("env worker process 1234 was killed by SIGKILL")
        return StepResult(
            Observation(xml=CounterEnv()._xml(), app="Counter"), done=False, info={"effect": "tap"}
        )

    async def evaluate(self):
        if self.fail == "evaluate":
            raise EnvCrashed("gone")
        return 0.0

    async def close(self):
        pass


@pytest.mark.parametrize("fail", ["reset", "step", "evaluate"])
def test_env_errors_end_the_trajectory_without_raising(fail):
    traj = run(rollout(CrashingEnv(fail=fail), ScriptedPolicy([TAP], repeat_last=True), counter_task(3)))
    assert traj.error is not None and traj.error.startswith("env: ") and traj.error_kind == "env"
    assert not traj.success and traj.reward is None
    if fail == "reset":
        assert traj.steps == [] and "EnvError: unknown task id" in traj.error
    elif fail == "step":
        assert "EnvCrashed" in traj.error and "SIGKILL" in traj.error
        assert traj.n_steps == 2 and traj.steps[0].effect == "tap"
    assert classify_failure(traj) == "env_error"


def test_policy_failure_is_recorded():
    traj = run(rollout(ThreadEnv(CounterEnv()), ScriptedPolicy([TAP]), counter_task(3)))
    assert traj.error is not None and traj.error.startswith("policy: PolicyError")
    assert traj.error_kind == "policy"
    assert traj.n_steps == 1 and classify_failure(traj) == "policy_error"


class _BarrierEnv(CounterEnv):
    """A CounterEnv whose reset waits until every env of the group is inside its own reset."""

    def __init__(self, barrier: threading.Barrier):
        super().__init__()
        self.barrier = barrier

    def reset(self, task):
        self.barrier.wait()  # BrokenBarrierError after its timeout if the resets ran one at a time
        return super().reset(task)


def test_rollouts_do_not_block_each_other():
    # Structural, not timed: the four resets meet at a barrier, which they pass only if all four are in
    # flight at once; rollouts that blocked each other (or the loop) would leave the first one waiting.
    barrier = threading.Barrier(4, timeout=30)

    async def main():
        envs = [ThreadEnv(_BarrierEnv(barrier)) for _ in range(4)]
        policy = ScriptedPolicy([TAP, TAP, FINISH])
        return await asyncio.gather(*(rollout(e, policy, counter_task(2), trial=i) for i, e in enumerate(envs)))

    trajs = run(main())
    assert not barrier.broken
    assert all(t.success and t.error is None for t in trajs), [t.error for t in trajs]


def test_oracle_policy_on_sim_with_subgoals_and_screenshots(tmp_path):
    task = get_task("lab/test/LabCalendarAddNote/0", with_optimal=False)
    assert len(task.subgoals) > 1
    env = ThreadEnv(SimEnv(render=True))
    traj = run(rollout(env, OraclePolicy(), task, keep_screenshots_dir=tmp_path))
    assert traj.success and traj.reward == 1.0 and traj.error is None
    assert traj.subgoals == [True] * len(task.subgoals)
    assert all(s.valid for s in traj.steps)
    paths = [s.screenshot_path for s in traj.steps]
    assert all(p is not None and p.endswith(f"step{i:03d}.png") for i, p in enumerate(paths))
    folder = tmp_path / task.task_id.replace("/", "_") / "trial0"
    assert all(Path(p).parent == folder and Path(p).stat().st_size > 1000 for p in paths)


def test_hidden_verifier_gives_no_reward():
    task = get_task("lab/train/LabCalendarAddNote/0", with_optimal=False)
    assert not task.has_verifier
    traj = run(rollout(ThreadEnv(SimEnv()), OraclePolicy(), task))
    assert traj.finished and traj.reward is None and not traj.success and traj.subgoals == []
    assert classify_failure(traj) == "unverified"


def test_oracle_policy_rejects_non_sim_tasks():
    async def main():
        obs = Observation(xml=CounterEnv()._xml(), app="Counter")
        await OraclePolicy().act(PolicyContext(counter_task(), obs, ""))

    with pytest.raises(PolicyError, match="only drives simulator tasks"):
        run(main())


def test_random_policy_emits_plausible_actions():
    xml = CounterEnv()._xml()
    ctx = PolicyContext(counter_task(), Observation(xml=xml, app="Counter"), compress_xml(xml))
    policy = RandomPolicy(seed=1)
    actions = [parse_action(run(policy.act(ctx)).text) for _ in range(400)]
    names = {a.name for a in actions}
    assert names == {"Tap", "Long Press", "Type", "Swipe", "Launch", "Back", "Home", "Wait", "Finish"}
    assert {a.element for a in actions if a.name == "Tap"} == {BUTTON}  # the only clickable element
    assert 0.01 < sum(a.name == "Finish" for a in actions) / len(actions) < 0.12
    again = RandomPolicy(seed=1)
    assert [parse_action(run(again.act(ctx)).text) for _ in range(400)] == actions


def test_parse_compressed_handles_semicolons_and_numbering():
    text = "Button;clickable focusable;Save; now;[10,20][30,40]\n[1] TextView;;x;[0,0][0,5]\nnot a node"
    nodes = parse_compressed(text)
    assert len(nodes) == 1 and nodes[0].label == "Save; now" and nodes[0].bounds == (10, 20, 30, 40)
    assert nodes[0].flags == ("clickable", "focusable")


# ------------------------------------------------------------------------------ records / JSONL


def _traj() -> Trajectory:
    traj = run(rollout(ThreadEnv(CounterEnv()), ScriptedPolicy(["bad", TAP, FINISH]), counter_task(1)))
    traj.subgoals = [True, False]
    return traj


def test_trajectory_round_trip(tmp_path):
    traj = _traj()
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj
    path = tmp_path / "sub" / "t.jsonl"
    assert write_jsonl(path, [traj, traj]) == 2
    write_jsonl(path, [traj], append=True)
    assert read_jsonl(path) == [traj] * 3
    assert isinstance(read_jsonl(path)[0].steps[0], StepRecord)


def test_token_ids_travel_with_logprobs_into_records_jsonl_and_stores(tmp_path):
    """A policy's token ids reach its step records beside their logprobs and survive JSONL and the Parquet
    store; records without any keep the bytes they had (no ``token_ids`` key, no store column)."""
    import pyarrow.parquet as pq

    from mobilerl.data.masking import mask_trajectory
    from mobilerl.data.privacy import TextMasker
    from mobilerl.data.store import StoreWriter, iter_store

    policy = ScriptedPolicy([TAP, TAP, FINISH], logprobs=[[-0.5, -0.25], None, [-1.0]], token_ids=[[5, 6], None, [9]])
    traj = run(rollout(ThreadEnv(CounterEnv()), policy, counter_task(2)))
    assert [s.token_ids for s in traj.steps] == [[5, 6], None, [9]]
    assert [s.logprobs for s in traj.steps] == [[-0.5, -0.25], None, [-1.0]]
    d = traj.to_dict()
    assert d["steps"][0]["token_ids"] == [5, 6] and "token_ids" not in d["steps"][1]
    assert Trajectory.from_dict(json.loads(json.dumps(d))) == traj
    assert "token_ids" not in json.dumps(_traj().to_dict())
    with pytest.raises(ValueError, match="1 token ids but 2 logprobs"):
        StepRecord.from_dict({**d["steps"][0], "token_ids": [5]})
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        PolicyOutput("x", [-0.1], [1, 2])

    def columns(root):
        return pq.read_schema(root / "trajectories.parquet").field("steps").type.value_type.names

    plain = _traj()
    with StoreWriter(tmp_path / "plain") as w:
        w.write(plain)
    assert "token_ids" not in columns(tmp_path / "plain")
    # batch 1: the row group without token ids is on disk before the first episode with them arrives
    for batch, reproducible in ((1, True), (1, False), (64, True)):
        root = tmp_path / f"store{batch}{reproducible}"
        with StoreWriter(root, batch=batch, reproducible=reproducible) as w:
            w.write(plain)
            w.write(traj)
        assert "token_ids" in columns(root)
        back = {t.task_id: t for t in iter_store(root)}
        assert [s.token_ids for s in back[traj.task_id].steps] == [[5, 6], None, [9]]
        assert [s.logprobs for s in back[traj.task_id].steps] == [[-0.5, -0.25], None, [-1.0]]
        assert all(s.token_ids is None for s in back[plain.task_id].steps)
        assert [s.response for s in back[plain.task_id].steps] == [s.response for s in plain.steps]
    # Masking that changes a response drops its token ids (they would decode to the unmasked text).
    secret = run(rollout(ThreadEnv(CounterEnv()), ScriptedPolicy(
        ['finish(message="call 0612345678")'], logprobs=[[-0.5]], token_ids=[[3]]), counter_task(3)))
    kept = run(rollout(ThreadEnv(CounterEnv()), ScriptedPolicy([FINISH], logprobs=[[-0.5]], token_ids=[[3]]),
                       counter_task(3)))
    masked = mask_trajectory(secret, TextMasker("token"))
    assert "0612345678" not in masked.steps[0].response and masked.steps[0].token_ids is None
    assert mask_trajectory(kept, TextMasker("token")).steps[0].token_ids == [3]


def test_corrupt_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps(_traj().to_dict())
    path.write_text(good + "\n\n" + good[:50] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.jsonl:3: not valid JSON"):
        read_jsonl(path)
    path.write_text(good + "\n" + json.dumps({"steps": []}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: not a valid trajectory: .*task_id"):
        read_jsonl(path)
    bad_step = json.loads(good)
    bad_step["steps"][0] = {"index": 0}
    path.write_text(json.dumps(bad_step) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.jsonl:1: .*missing field 'response'"):
        read_jsonl(path)
