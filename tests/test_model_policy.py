"""ModelPolicy: the prompt module's chat through a generation backend, inside the real rollout loop."""

from __future__ import annotations

import asyncio
import functools

import pytest
from tiny_checkpoint import session_checkpoint

from mobilerl.agent import PolicyContext, prompt, rollout
from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.agent.policy import Policy
from mobilerl.env.base import TaskSpec
from mobilerl.env.fake import CounterEnv
from mobilerl.env.pool import ThreadEnv
from mobilerl.env.sim import SimEnv
from mobilerl.env.sim.tasks import get_task
from mobilerl.eval.runner import evaluate
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=0)


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> HFBackend:
    return HFBackend.from_pretrained(session_checkpoint(tmp_path_factory), device="cpu", max_batch=16,
                                     batch_wait_ms=20)


def short_task(i: int) -> TaskSpec:
    return TaskSpec(task_id=f"fake/test/Counter/{i}", suite="fake", split="test", template="Counter",
                    instruction="Tap Add once, then finish", complexity=0.3)  # 3 responses at most


def test_rollout_on_a_simulator_task_runs(hf):
    policy = ModelPolicy(hf, obs_mode="xml", sampling=SAMPLING, name="tiny-random")
    assert isinstance(policy, Policy)
    task = get_task("world/test/CameraTakePhoto/0")
    traj = asyncio.run(rollout(ThreadEnv(SimEnv()), policy, task, seed=0))
    assert traj.error is None and traj.policy == "tiny-random"
    assert 1 <= len(traj.steps) <= task.max_steps
    for s in traj.steps:  # an untrained model: mostly invalid actions, never a crash
        assert s.logprobs and all(lp <= 0 for lp in s.logprobs)
        assert s.token_ids and len(s.token_ids) == len(s.logprobs)  # RL recomputes the logprobs of these ids
        assert s.valid or s.invalid
    assert traj.success is False


def test_prompt_follows_the_prompt_module_and_screenshot_modes(hf):
    env = SimEnv(render=True)
    task = get_task("world/test/CameraTakePhoto/0")
    obs = env.reset(task)
    ctx = PolicyContext(task, obs, "Button;clickable;Start;[1,2][3,4]", ("<answer>do(action=\"Back\")</answer>",), 1, "e#0")
    req = ModelPolicy(hf, obs_mode="screenshot+xml").request(ctx)
    user = req.messages[1]["content"]
    assert req.messages[0]["role"] == "system" and "Step 1: <answer>do(action=\"Back\")</answer>" in user
    assert user.count("<image>") == 1 and len(req.images) == 1 and "Button;clickable;Start" in user
    assert ModelPolicy(hf, obs_mode="xml").request(ctx).images is None
    out = asyncio.run(ModelPolicy(hf, obs_mode="screenshot", sampling=SAMPLING).act(ctx))
    assert out.logprobs and isinstance(out.text, str)
    with pytest.raises(ValueError, match="obs_mode"):
        ModelPolicy(hf, obs_mode="pixels")
    # No screenshot from a non-rendering env: the episode records a policy error instead of crashing.
    traj = asyncio.run(rollout(ThreadEnv(SimEnv(render=False)), ModelPolicy(hf, obs_mode="screenshot"), task))
    assert traj.error is not None and traj.error.startswith("policy: PolicyError") and "screenshot" in traj.error


def test_seeded_steps_are_reproducible(hf):
    # A step's sample depends on (base seed, episode id, step) only, not on batching or arrival order.
    policy = ModelPolicy(hf, obs_mode="xml", sampling=SAMPLING)
    task = short_task(1)
    ctx = PolicyContext(task, CounterEnv().reset(task), "Button;clickable;Add;[390,1100][690,1300]", (), 0, "e#0")
    a = asyncio.run(policy.act(ctx)).text
    assert asyncio.run(policy.act(ctx)).text == a
    assert asyncio.run(policy.with_seed(1).act(ctx)).text != a


def test_sixteen_concurrent_episodes_make_batched_generate_calls(hf):
    policy = ModelPolicy(hf, obs_mode="xml", sampling=SAMPLING)
    tasks = [short_task(i) for i in range(16)]
    before = dict(batches=hf.stats.batches, items=hf.stats.items)
    trajs = asyncio.run(evaluate(policy.with_seed, tasks, concurrency=16, env_factory=functools.partial(CounterEnv),
                                 progress=False))
    calls = hf.stats.batches - before["batches"]
    items = hf.stats.items - before["items"]
    assert len(trajs) == 16 and all(t.error is None for t in trajs)
    assert items == sum(len(t.steps) for t in trajs) >= 16
    # 16 episodes in lockstep: each step's 16 requests share a few generate calls, not 16.
    assert calls <= items / 4, (calls, items, hf.stats.sizes)
    assert hf.stats.max_batch_seen >= 8


def test_prompt_style_is_passed_to_the_prompt_module(hf):
    task = short_task(2)
    ctx = PolicyContext(task, CounterEnv().reset(task), "Button;clickable;Add;[390,1100][690,1300]", ("<answer>x</answer>",),
                        1, "e#0")
    compact = ModelPolicy(hf, obs_mode="xml", prompt_style="compact", max_history=0).request(ctx).messages
    assert compact == prompt.messages_for_context(ctx, mode="xml", style="compact", max_history=0)
    assert compact[0]["content"] == prompt.system_prompt("xml", False, "compact")
    assert len(compact[0]["content"]) < len(ModelPolicy(hf, obs_mode="xml").request(ctx).messages[0]["content"]) / 3
    with pytest.raises(ValueError, match="prompt_style"):
        ModelPolicy(hf, prompt_style="terse")


class _Fixed:
    """A generation backend that always answers the same text."""

    def __init__(self, text: str):
        self.text = text

    async def generate(self, requests, sampling):
        from mobilerl.models.generation import Generation

        return [Generation(self.text, [1], [-0.1], "stop") for _ in requests]


def test_grid_frame_policy_sees_grid_bounds_and_acts_in_pixels():
    task = short_task(3)
    obs = CounterEnv().reset(task)
    ctx = PolicyContext(task, obs, "Button;clickable;Add;[390,1100][690,1300]", (), 0, "e#0")
    policy = ModelPolicy(_Fixed('<answer>do(action="Tap", element=[500,500,600,600])</answer>'), obs_mode="xml",
                         coords="rel")
    screen = policy.request(ctx).messages[1]["content"]
    box = prompt.screen_in_frame("Button;clickable;Add;[390,1100][690,1300]", (obs.width, obs.height), "rel")
    assert box in screen and "[390,1100]" not in screen
    out = asyncio.run(policy.act(ctx))
    assert out.text.startswith("<answer>") and out.action_text is not None
    x1, y1, _, _ = prompt.parse_action(out.action_text).element
    assert (x1, y1) == (round(500 * obs.width / 1000), round(500 * obs.height / 1000))
    bad = asyncio.run(ModelPolicy(_Fixed("no action here"), coords="rel").act(ctx))
    assert bad.action_text is None and bad.invalid.startswith("no do(...) or finish(...) call in 'no action here'")
    with pytest.raises(ValueError, match="coords"):
        ModelPolicy(_Fixed(""), coords="pixels")


def test_marks_frame_policy_sees_numbered_lines_and_acts_on_the_line_box():
    task = short_task(3)
    obs = CounterEnv().reset(task)
    xml = "TextView;;Count: 0;[0,0][500,100]\nButton;clickable;Add;[390,1100][690,1300]"
    ctx = PolicyContext(task, obs, xml, (), 0, "e#0")
    policy = ModelPolicy(_Fixed('<answer>do(action="Tap", index=1)</answer>'), obs_mode="xml", coords="marks")
    screen = policy.request(ctx).messages[1]["content"]
    assert "Button;clickable;Add;[1]" in screen and "[390,1100]" not in screen
    out = asyncio.run(policy.act(ctx))
    assert prompt.parse_action(out.action_text).element == (390, 1100, 690, 1300)
    far = asyncio.run(ModelPolicy(_Fixed('<answer>do(action="Tap", index=9)</answer>'), coords="marks").act(ctx))
    assert far.action_text is None and far.invalid.startswith("index=9 names no element")
    # the rollout records the policy's reason as it is (not a parse error about an "invalid (...)" text)
    traj = asyncio.run(rollout(ThreadEnv(CounterEnv()), ModelPolicy(
        _Fixed('<answer>do(action="Tap", index=9)</answer>'), coords="marks", obs_mode="xml"), short_task(1)))
    assert traj.steps[0].invalid.startswith("index=9 names no element") and traj.n_invalid == traj.n_steps


class _Counting(_Fixed):
    calls = 0

    async def generate(self, requests, sampling):
        self.calls += len(requests)
        return await super().generate(requests, sampling)


def test_greedy_policy_answers_a_repeated_prompt_from_memory_and_sampling_does_not():
    task = short_task(4)
    obs = CounterEnv().reset(task)
    ctx = PolicyContext(task, obs, "Button;clickable;Add;[390,1100][690,1300]", (), 0, "e#0")
    moved = PolicyContext(task, obs, "Button;clickable;Add;[390,1200][690,1400]", (), 1, "e#0")
    greedy = ModelPolicy(_Counting('<answer>do(action="Back")</answer>'), sampling=SamplingConfig(temperature=0))
    outs = [asyncio.run(greedy.act(c)) for c in (ctx, ctx, moved, ctx)]
    assert greedy.backend.calls == 2 and greedy.reused == 2  # the changed screen is a new prompt
    assert outs[0] is outs[1] is outs[3] and outs[2].text == outs[0].text
    assert outs[3].token_ids == [1] and outs[3].logprobs == [-0.1]  # a reused answer reuses its tokens
    assert greedy.with_seed(1).reused == 0 and not greedy.with_seed(1)._answered  # a new episode forgets
    sampled = ModelPolicy(_Counting('<answer>do(action="Back")</answer>'), sampling=SamplingConfig(temperature=1.0))
    for _ in range(3):
        asyncio.run(sampled.act(ctx))
    assert sampled.backend.calls == 3 and sampled.reused == 0
    off = ModelPolicy(_Counting("x"), sampling=SamplingConfig(temperature=0), reuse_greedy=False)
    for _ in range(2):
        asyncio.run(off.act(ctx))
    assert off.backend.calls == 2


def test_a_stuck_greedy_agent_is_answered_from_memory_once_its_history_window_is_full():
    """An agent repeating one action on an unchanged screen: with a history window of 4, the prompts of steps 6,
    7, ... equal step 5's (the window does not number steps from the episode's start), so a greedy policy calls
    the model 6 times for 10 steps and records the same trajectory as without reuse."""
    task = TaskSpec(task_id="fake/test/Counter/9", suite="fake", split="test", template="Counter",
                    instruction="Tap Add nine times, then finish", complexity=1.0)  # 10 responses at most
    trajs = {}
    for reuse in (True, False):
        policy = ModelPolicy(_Counting('<answer>do(action="Back")</answer>'), obs_mode="xml", max_history=4,
                             sampling=SamplingConfig(temperature=0), reuse_greedy=reuse)
        trajs[reuse] = asyncio.run(rollout(ThreadEnv(CounterEnv()), policy, task))
        assert trajs[reuse].n_steps == 10
        assert policy.backend.calls == (6 if reuse else 10) and policy.reused == (4 if reuse else 0)
    assert [s.response for s in trajs[True].steps] == [s.response for s in trajs[False].steps]
    assert [s.xml_compressed for s in trajs[True].steps] == [s.xml_compressed for s in trajs[False].steps]


class _NoIds(_Fixed):
    """A plain OpenAI-style server: logprobs without token ids."""

    async def generate(self, requests, sampling):
        from mobilerl.models.generation import Generation

        return [Generation(self.text, [], [-0.1, -0.2], "stop") for _ in requests]


def test_token_ids_come_with_the_logprobs_and_with_a_reused_answer(hf):
    task = short_task(5)
    ctx = PolicyContext(task, CounterEnv().reset(task), "Button;clickable;Add;[390,1100][690,1300]", (), 0, "e#0")
    greedy = ModelPolicy(hf, obs_mode="xml", sampling=SamplingConfig(temperature=0, max_new_tokens=12))
    first = asyncio.run(greedy.act(ctx))
    again = asyncio.run(greedy.act(ctx))
    assert greedy.reused == 1 and again.token_ids == first.token_ids and again.logprobs == first.logprobs
    [gen] = asyncio.run(hf.generate([greedy.request(ctx)], greedy.sampling))
    assert first.token_ids == gen.token_ids and len(first.token_ids) == len(first.logprobs) >= 1
    unknown = asyncio.run(ModelPolicy(_NoIds("x")).act(ctx))
    assert unknown.token_ids is None and unknown.logprobs == [-0.1, -0.2]



def test_a_screenshot_policy_evaluated_through_the_factory_sees_screenshots(hf):
    # evaluate(obs_mode=...) builds rendering simulators for a screenshot mode: no "needs a screenshot" errors.
    task = get_task("world/test/CameraTakePhoto/0")
    for mode in ("screenshot", "screenshot+xml"):
        policy = ModelPolicy(hf, obs_mode=mode, sampling=SAMPLING)
        [traj] = asyncio.run(evaluate(policy.with_seed, [task], obs_mode=mode, progress=False))
        assert traj.error is None or "screenshot" not in traj.error, traj.error
        assert traj.steps and all(s.response for s in traj.steps)
    # the XML default still renders nothing, so the same policy fails the episode the way it names
    [traj] = asyncio.run(evaluate(ModelPolicy(hf, obs_mode="screenshot", sampling=SAMPLING).with_seed, [task],
                                  progress=False))
    assert traj.error is not None and "screenshot" in traj.error
