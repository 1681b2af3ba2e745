"""The concurrent evaluation runner: oracle ≈ 100 %, random ≈ 0 %, JSONL output, seeds, crash tolerance."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest

from mobilerl.agent import NoisyPolicy, OraclePolicy, RandomPolicy, ScriptedPolicy
from mobilerl.agent.runner import episode_seed
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import EnvCrashed, TaskSpec
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.sim.tasks import get_task, templates
from mobilerl.env.sim.tasks.registry import n_instances
from mobilerl.eval.metrics import is_env_error, summarize
from mobilerl.eval.runner import evaluate_sync, sim_template_texts
from mobilerl.trajectory import read_jsonl

TAP = format_action(Action("Tap", element=BUTTON))


def sample_world_test(per_template: int, seed: int = 0) -> list[TaskSpec]:
    """``per_template`` random instances of every world/test template (the suite grows over time).

    Same tasks as sampling ``list_tasks("world", "test")``, without building all of its instances.
    """
    rng = random.Random(seed)
    out = []
    for t in templates("world"):
        for i in sorted(rng.sample(range(n_instances(t, "test")), per_template)):
            out.append(get_task(f"world/test/{t.name}/{i}", with_optimal=False))
    return out


def test_oracle_scores_100_percent_on_world_test_sample(tmp_path):
    tasks = sample_world_test(per_template=2)
    assert len(tasks) >= 2 * 60
    out = tmp_path / "oracle.jsonl"
    trajs = evaluate_sync(lambda seed: OraclePolicy(), tasks, concurrency=8, out_path=out, progress=False)
    failed = [(t.task_id, t.error, t.answer) for t in trajs if not t.success]
    assert not failed, failed[:5]
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]
    assert all(t.finished and t.reward == 1.0 and t.n_invalid == 0 for t in trajs)
    # every trajectory is in the JSONL file (completion order)
    assert sorted(t.task_id for t in read_jsonl(out)) == sorted(t.task_id for t in tasks)
    s = summarize(trajs, template_texts=sim_template_texts(tasks))
    assert s["eval/success_rate"] == 1.0 and s["eval/pass@1"] == 1.0
    assert set(s["eval/by_semantic"]) == {"S1", "S2", "S3"}
    assert sum(s[k] for k in s if k.startswith("failures/")) == 0


def test_random_scores_near_zero():
    tasks = sample_world_test(per_template=1, seed=1)
    trajs = evaluate_sync(lambda seed: RandomPolicy(seed), tasks, concurrency=8, progress=False)
    sr = sum(t.success for t in trajs) / len(trajs)
    assert sr <= 0.05, sr
    assert all(t.error is None for t in trajs)
    assert all(t.n_steps <= t.max_steps for t in trajs)
    s = summarize(trajs)
    assert s["failures/finished_wrong"] + s["failures/never_finished"] + s["failures/loop"] >= 0.9 * len(
        trajs
    )
    assert 0 < s["lab/ror"] < 1


def test_a_slipping_expert_loses_success_with_its_error_rate():
    """NoisyPolicy: rate 0 is the oracle, rate 1 is the random policy (the expert is never asked), and
    random slips in between cost success without breaking the run."""
    tasks = sample_world_test(per_template=1, seed=2)

    def run(e):
        return evaluate_sync(lambda seed: NoisyPolicy(OraclePolicy(), e, seed), tasks, concurrency=8, progress=False)

    trajs = {e: run(e) for e in (0.0, 0.3, 1.0)}
    sr = {e: sum(t.success for t in ts) / len(ts) for e, ts in trajs.items()}
    assert sr[0.0] == 1.0
    assert 0.0 < sr[0.3] < 0.9, sr
    assert sr[1.0] <= 0.05, sr
    assert [t.steps[0].response for t in run(1.0)] == [t.steps[0].response for t in trajs[1.0]]  # seeded
    with pytest.raises(ValueError, match="noise"):
        NoisyPolicy(OraclePolicy(), 1.5)


def counter_task(name: str, target: int = 1) -> TaskSpec:
    return TaskSpec(
        task_id=f"fake/test/{name}/{target}", suite="fake", split="test", template=name, instruction="tap"
    )


class CrashOnSecondStep(CounterEnv):
    """Its step() dies (like a killed worker) on the second step of tasks named "crash"."""

    def step(self, action):
        if self.task_id is not None and "/crash" in self.task_id and self.steps >= 1:
            raise EnvCrashed("emulator died")
        return super().step(action)


@pytest.mark.parametrize("inline_env", [False, True])
def test_crashed_env_yields_error_trajectory_and_the_runner_goes_on(tmp_path, inline_env):
    built: list[CrashOnSecondStep] = []

    def factory():
        env = CrashOnSecondStep()
        built.append(env)
        return env

    tasks = [
        counter_task("ok", 2),
        counter_task("crash", 2),
        counter_task("ok2", 2),
        counter_task("crash2", 2),
    ]
    tasks += [counter_task(f"more{i}", 1) for i in range(6)]
    policy = ScriptedPolicy([TAP, TAP, "finish()"])
    trajs = evaluate_sync(
        lambda seed: policy,
        tasks,
        concurrency=2,
        env_factory=factory,
        progress=False,
        out_path=tmp_path / "x.jsonl",
        inline_env=inline_env,
    )
    by_id = {t.task_id: t for t in trajs}
    for tid in ("fake/test/crash/2", "fake/test/crash2/2"):
        t = by_id[tid]
        assert t.error is not None and "EnvCrashed: emulator died" in t.error and not t.success
        assert t.n_steps == 2
    ok = [t for t in trajs if "crash" not in t.task_id]
    assert len(ok) == 8 and all(t.error is None for t in ok)
    assert all(t.success for t in ok if t.task_id.endswith("/2"))  # 2 taps then finish
    assert len(built) == 2 + 2  # the pool replaced both crashed workers (no re-run by default)
    assert len(read_jsonl(tmp_path / "x.jsonl")) == len(tasks)
    assert summarize(trajs)["failures/env_error"] == 2


class KilledMidEpisode(CounterEnv):
    """Its worker process is SIGKILLed on the second step: of "/flaky" tasks the first time only (a marker
    file remembers, across worker processes), of "/doomed" tasks every time."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def step(self, action):
        import os
        import signal
        from pathlib import Path

        tid = self.task_id or ""
        if self.steps >= 1 and ("/doomed" in tid or ("/flaky" in tid and not Path(self.marker).exists())):
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def test_an_episode_whose_worker_is_killed_is_rerun_or_left_out_not_failed(tmp_path):
    tasks = [counter_task("ok", 2), counter_task("flaky", 2), counter_task("doomed", 2), counter_task("ok2", 2),
             counter_task("ok3", 1)]
    trajs = evaluate_sync(lambda seed: ScriptedPolicy([TAP, TAP, "finish()"]), tasks, concurrency=2,
                          env_factory=functools.partial(KilledMidEpisode, str(tmp_path / "killed-once")),
                          use_processes=True, progress=False, out_path=tmp_path / "x.jsonl", env_retries=2)
    by_id = {t.task_id: t for t in trajs}
    assert (tmp_path / "killed-once").exists()  # the flaky episode's first worker did die
    flaky, doomed = by_id["fake/test/flaky/2"], by_id["fake/test/doomed/2"]
    assert flaky.error is None and flaky.success  # re-run with the same seed, in a fresh worker
    assert doomed.error is not None and "SIGKILL" in doomed.error and is_env_error(doomed)
    s = summarize(trajs)
    assert s["eval/n_env_failed"] == 1 and s["eval/n_trajectories"] == 4
    assert s["eval/success_rate"] == 1.0  # the lost episode is not a failure of the policy
    kept = read_jsonl(tmp_path / "x.jsonl")
    assert sorted(t.task_id for t in kept) == sorted(t.task_id for t in trajs)  # each episode once, as it ended
    assert next(t for t in kept if t.task_id == "fake/test/flaky/2").success
    no_rerun = evaluate_sync(lambda seed: ScriptedPolicy([TAP, TAP, "finish()"]), tasks[2:3], env_retries=0,
                             env_factory=functools.partial(KilledMidEpisode, str(tmp_path / "m")),
                             use_processes=True, progress=False)
    assert summarize(no_rerun)["eval/n_env_failed"] == 1 and summarize(no_rerun)["eval/success_rate"] is None


def test_simulator_runs_on_the_event_loop_with_the_same_episodes(monkeypatch):
    """The built-in simulator's calls run inline (no thread per call) and give the episodes threads give."""
    import mobilerl.env.pool as pool_mod

    made: list[str] = []
    for cls in (pool_mod.InlineEnv, pool_mod.ThreadEnv):
        orig = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _o=orig, _n=cls.__name__, **k: (made.append(_n), _o(self, *a, **k))[1])
    tasks = sample_world_test(per_template=1, seed=3)[:40]
    inline = evaluate_sync(lambda seed: RandomPolicy(seed), tasks, concurrency=8, progress=False)
    assert set(made) == {"InlineEnv"}
    made.clear()
    threaded = evaluate_sync(lambda seed: RandomPolicy(seed), tasks, concurrency=8, progress=False, inline_env=False)
    assert set(made) == {"ThreadEnv"}
    assert [[s.response for s in t.steps] for t in inline] == [[s.response for s in t.steps] for t in threaded]
    assert [t.final_xml_compressed for t in inline] == [t.final_xml_compressed for t in threaded]
    assert [t.reward for t in inline] == [t.reward for t in threaded]


def test_trials_get_distinct_seeds_on_the_same_task():
    seeds: list[int] = []

    def factory(seed):
        seeds.append(seed)
        return RandomPolicy(seed)

    tasks = [counter_task("a"), counter_task("b")]
    trajs = evaluate_sync(factory, tasks, n_trials=3, env_factory=CounterEnv, progress=False, base_seed=5)
    assert [(t.task_id, t.trial) for t in trajs] == [(t.task_id, i) for t in tasks for i in range(3)]
    assert len(set(seeds)) == 6 and sorted(seeds) == sorted(t.seed for t in trajs)
    assert trajs[0].seed == episode_seed(5, "fake/test/a/1", 0) != episode_seed(6, "fake/test/a/1", 0)
    assert len({t.task_seed for t in trajs if t.task_id == "fake/test/a/1"}) == 1
    s = summarize(trajs, k_values=(1, 2, 4))
    assert s["eval/trials_per_task"] == 3


def test_process_workers():
    tasks = [counter_task(f"p{i}", 1) for i in range(4)]
    trajs = evaluate_sync(
        lambda seed: ScriptedPolicy([TAP, "finish()"]),
        tasks,
        concurrency=2,
        env_factory=functools.partial(CounterEnv, target=1),
        use_processes=True,
        progress=False,
    )
    assert all(t.success for t in trajs), [t.error for t in trajs]


def test_argument_checks_and_sync_wrapper_in_a_loop():
    with pytest.raises(ValueError, match="n_trials"):
        evaluate_sync(lambda s: RandomPolicy(s), [counter_task("a")], n_trials=0, progress=False)
    assert evaluate_sync(lambda s: RandomPolicy(s), [], progress=False) == []

    async def inside():
        evaluate_sync(lambda s: RandomPolicy(s), [counter_task("a")], progress=False)

    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(inside())


def test_policy_factory_failure_is_a_policy_error():
    def broken(seed):
        raise RuntimeError("no checkpoint")

    trajs = evaluate_sync(
        broken, [counter_task("a"), counter_task("b")], env_factory=CounterEnv, progress=False
    )
    assert [t.error for t in trajs] == ["policy: RuntimeError: no checkpoint"] * 2
    assert summarize(trajs)["failures/policy_error"] == 2


def _random_policies() -> object:
    return RandomPolicy


def _dies() -> object:
    import os

    os._exit(3)


def test_evaluation_in_worker_processes_gives_the_same_episodes(tmp_path, capsys):
    from mobilerl.eval.runner import evaluate_in_processes

    tasks = [get_task(f"world/test/{t.name}/0") for t in templates("world")[:6]]
    one = evaluate_sync(RandomPolicy, tasks, n_trials=2, concurrency=4, progress=False, base_seed=5)
    out = tmp_path / "t.jsonl"
    two = evaluate_in_processes(_random_policies, tasks, processes=2, threads=1, n_trials=2, concurrency=4,
                                base_seed=5, out_path=out, desc="random/world")
    bar = capsys.readouterr().err.split("\r")[-1]  # the parent's bar of its workers' episodes, at its end
    assert bar.startswith("random/world: 100%") and "12/12" in bar, bar
    assert [(t.task_id, t.trial) for t in two] == [(t.task_id, t.trial) for t in one]
    assert [[s.response for s in t.steps] for t in two] == [[s.response for s in t.steps] for t in one]
    assert [t.reward for t in two] == [t.reward for t in one]
    assert [(t.task_id, t.trial) for t in read_jsonl(out)] == [(t.task_id, t.trial) for t in one]
    assert not list(tmp_path.glob("t.jsonl.part*"))
    with pytest.raises(RuntimeError, match="evaluation worker 0 of 2 died"):
        evaluate_in_processes(_dies, tasks, processes=2)


class ShotRecorder(OraclePolicy):
    """The expert, noting whether each observation it is shown carries a screenshot (as a PNG on the wire)."""

    def __init__(self) -> None:
        super().__init__()
        self.pngs: list[bytes | None] = []

    async def act(self, ctx):
        self.pngs.append(ctx.observation.png())
        return await super().act(ctx)


@pytest.mark.parametrize("obs_mode, shots", [("xml", False), ("screenshot", True), ("screenshot+xml", True)])
def test_the_default_envs_render_exactly_for_screenshot_modes(obs_mode, shots):
    policy = ShotRecorder()
    [traj] = evaluate_sync(lambda seed: policy, [get_task("world/test/CameraTakePhoto/0")], obs_mode=obs_mode,
                           progress=False)
    assert traj.success and policy.pngs
    if shots:
        assert all(p is not None and p.startswith(b"\x89PNG\r\n\x1a\n") for p in policy.pngs)
    else:
        assert all(p is None for p in policy.pngs)
    with pytest.raises(ValueError, match="unknown observation mode 'pixels'"):
        evaluate_sync(lambda seed: policy, [get_task("world/test/CameraTakePhoto/0")], obs_mode="pixels")


def test_a_checkpoint_runs_in_its_profiles_observation_mode():
    from mobilerl.eval.checkpoints import obs_mode_of
    from mobilerl.eval.config import EvaluateConfig

    cfg = EvaluateConfig(checkpoints={"ckpt": "models/x"}, profile="mobilerl_9b")
    assert obs_mode_of("ckpt", cfg) == "screenshot+xml"  # that profile's generation.obs_mode
    assert obs_mode_of("oracle", cfg) == "xml"
    assert obs_mode_of("ckpt", cfg.model_copy(update={"profile": "tiny"})) == "xml"
