"""AndroidWorld as an env backend of the pipeline: the env factory over AndroidWorld's servers, its suite as task
specs, the `evaluate` stage and the `rl` stage on them, typed config errors.

Every server test runs on two servers of each kind (tests/androidworld_stub.py): the stand-in, always, and the real
``server/android_server.py`` of google-research/android_world with the emulator stubbed, when
``$MOBILERL_ANDROID_WORLD`` names a checkout or a git mirror of it (skipped otherwise: CI has neither).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from androidworld_stub import HEIGHT, REGISTRY, WIDTH, Served, real_app, real_source, solve, standin_app
from tiny_checkpoint import screenshot_profile

from mobilerl.agent.policy import PolicyOutput
from mobilerl.config import ParamsError, validate_section
from mobilerl.env.actions import Action
from mobilerl.env.androidworld import AndroidWorldConfig, AndroidWorldEnv, androidworld_tasks
from mobilerl.env.base import EnvError, TaskSpec
from mobilerl.env.factory import env_factory, make_env
from mobilerl.eval.runner import evaluate_sync

ROOT = Path(__file__).resolve().parents[1]
MIRROR = os.environ.get("MOBILERL_ANDROID_WORLD", "")


@pytest.fixture(params=["standin", "real"])
def servers(request, tmp_path_factory):
    """Two AndroidWorld servers on loopback: the stand-in's, or the real server code's (with the mirror)."""
    if request.param == "real":
        if not MIRROR or not Path(MIRROR).exists():
            pytest.skip("no android_world source: set MOBILERL_ANDROID_WORLD to a checkout or git mirror of "
                        "google-research/android_world to run its real server/android_server.py")
        src = real_source(MIRROR, tmp_path_factory.mktemp("android_world"))
        apps = [real_app(src, f"android_server_{request.node.name}_{i}") for i in range(2)]
    else:
        apps = [standin_app(), standin_app()]
    served = [Served(app) for app in apps]
    yield served
    for s in served:
        s.stop()


def aw_config(servers, **kw) -> AndroidWorldConfig:
    return AndroidWorldConfig(urls=[s.url for s in servers], seed=7, max_steps=4, timeout_s=20, **kw)


class Scripted:
    """Solves each stub task from its goal (the instruction the suite listed), one response a step."""

    name, version = "scripted", None

    def with_seed(self, seed: int) -> Scripted:
        return Scripted()

    async def act(self, ctx) -> PolicyOutput:
        steps = solve(ctx.task.instruction)
        return PolicyOutput(steps[min(ctx.step, len(steps) - 1)])


def test_the_suite_is_listed_and_scored_through_the_env_factory(servers):
    cfg = aw_config(servers, max_steps_by_type={"StubTypeWord": 3})
    tasks = androidworld_tasks(cfg, "test")
    assert [t.task_id for t in tasks] == [f"androidworld/test/{k}/{i}" for k in REGISTRY for i in range(2)]
    assert {t.suite for t in tasks} == {"androidworld"} and {t.difficulty for t in tasks} == {"unknown"}
    assert [t.max_steps for t in tasks] == [4, 4, 3, 3, 4, 4]
    # every server holds the same suite now: its goals are the listed instructions
    for s in servers:
        env = AndroidWorldEnv(s.url)
        assert [env.task_goal(t.template, t.params["task_idx"]) for t in tasks] == [t.instruction for t in tasks]
        env.close()
    assert len(androidworld_tasks(cfg, "train", per_type=1)) == 3
    with pytest.raises(ValueError, match=r"androidworld\.task_types: \['Nope'\] not in the suite"):
        androidworld_tasks(aw_config(servers, task_types=["Nope"]))

    make = env_factory("androidworld", obs_mode="screenshot+xml", androidworld=cfg)
    shots: list = []

    class Watching(Scripted):
        async def act(self, ctx):
            shots.append(ctx.observation.screenshot)
            return await super().act(ctx)

    trajs = evaluate_sync(lambda seed: Watching(), tasks, env_factory=make, concurrency=8, progress=False)
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]
    assert all(t.error is None and t.success and t.reward == 1.0 for t in trajs), [(t.task_id, t.error) for t in trajs]
    assert all(im is not None and im.size == (WIDTH, HEIGHT) for im in shots)
    assert sorted(make._free) == sorted(cfg.urls)  # every env closed, every server free again
    done = [a for s in servers for a in s.device.actions]
    assert {"action_type": "answer", "text": str(sum(int(w) for w in tasks[4].instruction.split("?")[0].split()[2::2]))} in done
    assert sum(a == {"action_type": "status", "goal_status": "complete"} for a in done) == len(tasks)

    # a wrong answer scores 0 and an XML-only policy gets the screen size without the pixels
    class Wrong(Scripted):
        async def act(self, ctx):
            shots.append((ctx.observation.screenshot, ctx.observation.width))
            return PolicyOutput('finish(message="no")')

    shots.clear()
    make = env_factory("androidworld", obs_mode="xml", androidworld=cfg)
    trajs = evaluate_sync(lambda seed: Wrong(), tasks[4:], env_factory=make, progress=False)
    assert [t.reward for t in trajs] == [0.0, 0.0] and shots == [(None, WIDTH)] * 2


def test_a_restarted_server_is_brought_back_to_the_runs_suite_and_the_protocol_errors(servers):
    cfg = aw_config(servers, n_task_combinations=3)
    tasks = androidworld_tasks(cfg)
    assert len(tasks) == 9
    restarted = AndroidWorldEnv(servers[1].url)
    restarted.reinitialize_suite()  # its image's default suite (seed 42, 2 combinations), as after a restart
    make = env_factory("androidworld", obs_mode="screenshot", androidworld=cfg.model_copy(update={"urls": [servers[1].url]}))
    env = make()
    obs = env.reset(tasks[8])  # StubAnswerSum/2: no such task in the default suite
    assert env.goal == tasks[8].instruction and obs.screenshot is not None
    assert env.step(Action("Finish", message="x")).done
    assert env.evaluate() == 0.0
    with pytest.raises(EnvError, match="hold an env already"):
        make()  # its one server is leased
    env.close()
    make().close()  # free again

    with pytest.raises(EnvError, match="HTTP 500"):
        restarted.execute({"action_type": "open_app", "app_name": ""})  # the executor's own refusal
    with pytest.raises(EnvError, match="HTTP 500"):
        restarted.execute({"action_type": "fly"})  # not a JSONAction
    with pytest.raises(EnvError, match="HTTP 500"):
        restarted.reset("NoSuchTask/0")
    assert restarted.health() is True
    restarted.close()
    closing = AndroidWorldEnv(servers[0].url, close_server=True)
    closing.close()
    assert servers[0].device.closed


def test_config_errors_name_their_keys(monkeypatch, tmp_path):
    from mobilerl.eval.config import EvaluateConfig, check_policies
    from mobilerl.rl.config import RLConfig

    with pytest.raises(ParamsError, match=r"evaluate\.androidworld\.urls: .*'aw:5000' is not an http\(s\)://host:port"):
        validate_section("evaluate", EvaluateConfig, {"suites": ["androidworld"], "androidworld": {"urls": ["aw:5000"]}})
    with pytest.raises(ParamsError, match=r"rl\.androidworld\.urls: .*listed twice"):
        validate_section("rl", RLConfig, {"suite": "androidworld", "androidworld": {
            "urls": ["http://a:5000", "http://a:5000"]}})
    with pytest.raises(ParamsError, match=r"rl\.androidworld\.max_steps: "):
        validate_section("rl", RLConfig, {"suite": "androidworld", "androidworld": {
            "urls": ["http://a:5000"], "max_steps": 0}})
    with pytest.raises(ParamsError, match=r"evaluate\.androidworld \(the servers' URLs\) is needed by"):
        validate_section("evaluate", EvaluateConfig, {"suites": ["androidworld"]})
    with pytest.raises(ParamsError, match=r"evaluate\.androidworld\.urls: empty"):
        validate_section("evaluate", EvaluateConfig, {"suites": ["androidworld"], "androidworld": {}})
    with pytest.raises(ParamsError, match=r"rl\.androidworld \(the servers' URLs\) is needed by"):
        validate_section("rl", RLConfig, {"androidworld": {"urls": ["http://a:5000"]}})
    aw = {"urls": ["http://a:5000"]}
    with pytest.raises(ValueError, match=r"evaluate\.policies\[0\]: the oracle .* cannot run the androidworld suite"):
        check_policies(EvaluateConfig(suites=["androidworld"], androidworld=aw, policies=["oracle"]))
    with pytest.raises(ValueError, match=r"evaluate\.profile: 'tiny' reads the UI tree only"):
        check_policies(EvaluateConfig(suites=["androidworld"], androidworld=aw, policies=["c"],
                                      checkpoints={"c": "models/tiny-base"}))
    with pytest.raises(ParamsError, match=r"rl\.profile: 'tiny' reads the UI tree only"):
        validate_section("rl", RLConfig, {"suite": "androidworld", "androidworld": aw, "rollout_processes": 1})
    screenshot_profile(monkeypatch, tmp_path)
    with pytest.raises(ParamsError, match=r"rl\.rollout_processes \(2\) > the 1 AndroidWorld server\(s\)"):
        validate_section("rl", RLConfig, {"suite": "androidworld", "androidworld": aw, "profile": "tiny_shots"})
    with pytest.raises(ParamsError, match=r"rl\.androidworld and rl\.env_servers"):
        validate_section("rl", RLConfig, {"suite": "androidworld", "androidworld": aw, "profile": "tiny_shots",
                                          "env_servers": ["http://b:8765"]})
    with pytest.raises(ValueError, match="needed by, and only by, env backend androidworld"):
        make_env("androidworld")
    with pytest.raises(ValueError, match="2 processes share 1 AndroidWorld server"):
        env_factory("androidworld", androidworld=AndroidWorldConfig(**aw)).shard(0, 2)
    two = env_factory("androidworld", androidworld=AndroidWorldConfig(urls=["http://a:1", "http://b:2"]))
    assert [s.config.urls for s in (two.shard(0, 2), two.shard(1, 2))] == [["http://a:1"], ["http://b:2"]]


def test_evaluate_stage_scores_a_checkpoint_on_androidworld_per_task(servers, monkeypatch, tmp_path):
    """Acceptance: the `evaluate` stage's run of the vl_smoke checkpoint (Qwen2.5-VL class, screenshot+xml, pixel
    bounds) and the random baseline against the AndroidWorld servers completes with one result per task, and the
    summary counts them."""
    import contextlib
    import types

    import mobilerl.eval.benchmark as B
    from mobilerl.eval.config import EvaluateConfig, check_policies
    from mobilerl.models.profiles import load_profile
    from mobilerl.models.random_init import ensure_weights
    from mobilerl.trajectory import read_jsonl

    profile = "vl_smoke"
    ckpt = ensure_weights(load_profile(profile))
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r"))
    monkeypatch.setattr(B.tracking, "child_run", lambda *a, **k: contextlib.nullcontext(run))
    monkeypatch.setattr(B.tracking, "log_metrics", lambda metrics: None)
    monkeypatch.setattr(B.tracking, "log_images", lambda images, step=None: None)
    cfg = validate_section("evaluate", EvaluateConfig, {
        "suites": ["androidworld"], "policies": ["random", "ckpt"], "checkpoints": {"ckpt": str(ckpt)},
        "profile": profile, "temperature": 0.0, "max_per_template": 1, "offline_per_template": 0,
        "androidworld": {"urls": [s.url for s in servers], "max_steps": 2, "timeout_s": 30}})
    check_policies(cfg)
    summary, offline, _ = B.evaluate_policies(cfg, tmp_path / "out")
    for name in ("random", "ckpt"):
        trajs = read_jsonl(tmp_path / "out" / f"{name}__androidworld.jsonl")
        assert sorted(t.task_id for t in trajs) == [f"androidworld/test/{k}/0" for k in sorted(REGISTRY)]
        assert all(t.error_kind in (None, "budget", "parse") and t.reward in (0.0, 1.0) for t in trajs), \
            [t.error for t in trajs]
        assert summary[name]["androidworld"]["eval/n_trajectories"] == 3
    steps = [st for t in read_jsonl(tmp_path / "out" / "ckpt__androidworld.jsonl") for st in t.steps]
    assert steps and all(st.logprobs for st in steps)  # the model answered every step, from the screenshot
    assert offline == {}


def test_rl_stage_trains_on_androidworld_servers(servers, monkeypatch, tmp_path):
    """`rl` with `suite: androidworld`: the pool is the servers' suite, a round's episodes run on them through a
    rollout engine (weights pushed by reload), the round completes and the policy is written."""
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.serve_openai import ServerThread
    from mobilerl.models.weight_server import TorchEngineWeights, WeightServer
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run as run_stage

    profile = screenshot_profile(monkeypatch, tmp_path)
    base = ROOT / "models" / "tiny-base"
    engine = HFBackend.from_pretrained(base, device="cpu", max_batch=8)
    with ServerThread(engine, weights=WeightServer(TorchEngineWeights(engine))) as srv:
        cfg = RLConfig(profile=profile, init=str(base), out="out", work="work", rounds=1, suite="androidworld",
                       engines=[srv.base_url], androidworld={"urls": [s.url for s in servers], "max_steps": 2},
                       overrides={"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16})
        summary, curve = run_stage(cfg, tmp_path, progress=False)
    assert summary["pool"] == 6 and summary["rounds"] == 1 and len(curve) == 1
    assert (tmp_path / "out" / "config.json").is_file()
    assert sum(s.device.resets for s in servers) == 4  # 2 tasks x 2 samples, each reset on a server
    assert curve[0]["time/sync_s"] > 0  # the round's weights went to the engine


def test_rollout_workers_give_each_concurrent_shard_its_own_servers(monkeypatch):
    from mobilerl.rl.rollout import PolicySpec, RolloutWorkers

    spec = PolicySpec(init="x", backend={}, obs_mode="screenshot", prompt_style="compact", max_history=4,
                      coords="abs", reasoning=False, temperature=1.0, max_new_tokens=8)
    urls = [f"http://127.0.0.1:{5000 + i}" for i in range(3)]
    workers = RolloutWorkers(spec, 2, androidworld=AndroidWorldConfig(urls=urls))
    jobs: list = []
    monkeypatch.setattr(workers._pool, "map", lambda fn, js: jobs.extend(js) or [([], 0.0, None)] * len(js))
    workers.run([TaskSpec(f"androidworld/train/T/{i}", "androidworld", "train", "T", "t") for i in range(4)], 1, 0)
    workers.close()
    held = [job[-1].config.urls for job in jobs]
    assert held == [urls[0::2], urls[1::2]]  # disjoint: no server runs two episodes at once


def test_pickled_factories_start_with_their_servers_free():
    import pickle

    f = env_factory("androidworld", obs_mode="screenshot", androidworld=AndroidWorldConfig(urls=["http://a:1"]))
    f._free.clear()
    g = pickle.loads(pickle.dumps(f))
    assert g._free == ["http://a:1"] and g.capacity == 1 and g.screenshot is True
