"""The asynchronous mode over remote engines and env servers (rl.async with rl.engines and rl.env_servers,
mobilerl.rl.async_engines): the config's peer options; engine failures dropped and counted, never scored; a run
over two engines and two env servers rendering screenshots that keeps the staleness bound and the rollout/trainer
logprob gap; an engine and an env server SIGKILLed mid-round, their episodes run again elsewhere, both restarted,
the engine back with the current weights, the run finished."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from env_servers import TOKEN, ThreadServer, free_port, serve_env, wait_healthy

from mobilerl.env.cluster import server_name
from mobilerl.env.factory import env_factory, renders
from mobilerl.models.hf_backend import HFBackend
from mobilerl.models.profiles import load_profile
from mobilerl.models.serve_openai import ServerThread
from mobilerl.models.weight_server import TorchEngineWeights, WeightServer
from mobilerl.rl.async_engines import remote_workers
from mobilerl.rl.async_loop import train_async
from mobilerl.rl.batch import PromptFormat
from mobilerl.rl.config import RLConfig
from mobilerl.rl.groups import RoundError, make_groups, round_metrics
from mobilerl.rl.run import policy_spec
from mobilerl.rl.trainer import Trainer
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- config, triage

def test_async_takes_engines_env_servers_and_the_peers_that_fit_and_names_why_others_do_not():
    ok = RLConfig.model_validate({"async": {"max_staleness": 1}, "engines": ["http://127.0.0.1:8001/v1"],
                                  "env_servers": ["http://127.0.0.1:8765"], "distrl": {}, "judge_all": True,
                                  "reward_model": "judge", "algo": {"tis_cap": 2.0}})
    assert ok.async_.reruns == 2 and ok.async_.engine_wait_s == 300
    for key, why in (("dart", "rollout count"), ("bepa", "seeds its cache"), ("dynamic_sampling", "admission bound")):
        with pytest.raises(ValueError, match=f"rl.async is not combined with rl.{key} \\(.*{why}"):
            RLConfig.model_validate({"async": {"max_staleness": 1}, key: {}})
    with pytest.raises(ValueError, match="async.reruns"):
        RLConfig.model_validate({"async": {"max_staleness": 1, "reruns": -1}})


def test_engine_failures_leave_their_group_counted_and_an_outage_stops_the_round():
    def traj(task: str, kind: str | None = None) -> Trajectory:
        return Trajectory(task_id=task, success=kind is None, finished=kind is None, reward=1.0 if kind is None else None,
                          error=f"{kind}: down" if kind else None, error_kind=kind)

    groups, dropped = make_groups([traj("a"), traj("a", "engine"), traj("b", "env"), traj("b")])
    assert [len(g.trajectories) for g in groups] == [1, 1] and dropped == 2
    assert all(t.error is None for g in groups for t in g.trajectories)  # none of them scored
    m = round_metrics(groups, 1, 1)
    assert m["rollout/engine_failures"] == 1 and m["rollout/env_failures"] == 1 and m["rollout/success"] == 1.0
    from mobilerl.rl.groups import triage

    with pytest.raises(RoundError, match="all 2 episodes failed on their env or engine"):
        triage([traj("a", "engine"), traj("b", "env")], whole=True)
    assert triage([traj("a", "engine")])[0] == []  # one group of a round may lose every episode


# ----------------------------------------------------------------------------------------------- helpers

class Judge:
    """Half the episodes succeed (the tiny base solves nothing), so groups have signal and the weights move."""

    def score(self, trajs):
        return [0.9 if i % 2 == 0 else 0.1 for i in range(len(trajs))]


class RecordingTrainer(Trainer):
    """The real trainer; keeps every trajectory each round trains."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.trained: list[tuple[int, Trajectory]] = []

    def batch(self, groups, r, ctx=None):
        self.trained += [(r, t) for g in groups for t in g.trajectories]
        return super().batch(groups, r, ctx)


def engine_thread(init: Path, port: int = 0) -> ServerThread:
    """An HF engine with the weight endpoints in a thread of this process, on 127.0.0.1 (``port`` 0: any)."""
    backend = HFBackend.from_pretrained(init, device="cpu", max_batch=8)
    return ServerThread(backend, port=port, model_name=backend.name,  # as serve_openai names it
                        weights=WeightServer(TorchEngineWeights(backend))).start()


def engine_process(init: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "mobilerl.models.serve_openai", str(init), "--port", str(port),
                             "--weight-sync", "--device", "cpu", "--max-batch", "8"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def setup(profile: str, obs_mode: str | None, engines: list[str], envs: list[str], work: Path, tasks: int = 2,
          **cfg):
    """A recording trainer on the profile's checkpoint and the stage's policy spec (observation mode switched to
    ``obs_mode``), for rl.async over ``engines`` and ``envs``."""
    p = load_profile(profile)
    init = ROOT / p.weights
    mode = obs_mode or p.generation.obs_mode
    config = RLConfig.model_validate({
        "profile": profile, "init": str(init), "fcf": False, "algo": {"tis_cap": 2.0}, "engines": engines, "env_servers": envs,
        "rollout_concurrency": 2, "env_pool": {"health_interval_s": 0.3, "wait_for_server_s": 30,
                                               "request_timeout_s": 15},
        **cfg, "overrides": {"train_batch_size": tasks, "samples_per_task": 2, "max_new_tokens": 10,
                             "learning_rate": 1e-3, "kl_coef": 0.0}})
    g = p.generation
    backend = HFBackend.from_pretrained(init, device="cpu", fast_prefill=False, prefix_cache_tokens=0)
    trainer = RecordingTrainer(config, backend.model, backend.prompt_ids, backend.pad_id,
                               PromptFormat(mode, g.prompt_style, g.max_history, g.coords),
                               backend.image_inputs if renders(mode) else None)
    spec = dataclasses.replace(policy_spec(config, init, work), obs_mode=mode)
    return config, trainer, remote_workers(config, spec, trainer, work)


def tasks(n: int, max_steps: int = 3) -> list:
    """The first world/train task of ``n`` templates, their budget cut to ``max_steps`` (``rl_tasks.short_tasks``
    without the oracle runs that list every template's optimal steps: seconds here)."""
    from mobilerl.env.sim.tasks.registry import get_task, templates

    return [dataclasses.replace(get_task(f"world/train/{t.name}/0", with_optimal=False), complexity=max_steps / 10)
            for t in templates("world")[:n]]


def lab(pool):  # the judge rewards them (their verifier hidden)
    return [dataclasses.replace(t, has_verifier=False) for t in pool]


# ----------------------------------------------------------------------------------------------- screenshots

@pytest.mark.slow
@pytest.mark.parametrize("profile,obs_mode", [("tiny", "screenshot+xml")])  # vl_smoke: its own mode
def test_two_engines_and_two_rendering_env_servers_keep_the_bound_and_the_logprob_gap(
        tmp_path, monkeypatch, profile, obs_mode):
    monkeypatch.setenv("MOBILERL_ENV_TOKEN", TOKEN)
    init = ROOT / load_profile(profile).weights
    mode = obs_mode or load_profile(profile).generation.obs_mode
    assert renders(mode)
    engines = [engine_thread(init) for _ in range(2)]
    envs = [ThreadServer(2, env_factory("sim", obs_mode=mode)).start() for _ in range(2)]
    urls = [e.base_url for e in engines]
    try:
        cfg, trainer, workers = setup(profile, obs_mode, urls, [e.url for e in envs],
                                      tmp_path, tasks=1, rounds=2, checkpoint_every=2, weight_sync="reload",
                                      lab_share=1.0, reward_model="the Judge", **{"async": {"max_staleness": 1}})
        with workers as w:
            curve = train_async(trainer, w, lab(tasks(2, max_steps=2)), tmp_path, progress=False, judge=Judge())
        versions = [httpx.get(f"{u}/weights").json()["version"] for u in urls]
    finally:
        for e in engines:
            e.stop()
        for e in envs:
            e.stop()
    assert [c["round"] for c in curve] == [0, 1] and versions == [2, 2]  # each engine holds the last publish
    ages = [r - int(t.policy_version) for r, t in trainer.trained]
    assert trainer.trained and all(0 <= a <= 1 for a in ages), ages  # every trajectory within the bound
    assert ages.count(0) > 0 and all(c["train/rows"] > 0 for c in curve)  # on-policy rows were trained
    gap = max(c["loss/logprob_gap_max"] for c in curve)
    assert gap <= 1e-3, gap  # the engines' screenshots are the trainer's: same pixels, same vision inputs
    assert {t.meta["engine"] for _, t in trainer.trained} <= set(urls)
    shots = [s.screenshot_path for _, t in trainer.trained for s in t.steps]
    assert shots and all(p and p.startswith(str(tmp_path / "screens")) for p in shots)
    assert all(p.endswith(".png.enc") for p in shots)  # sealed at rest with the run's key (mobilerl.sealed)
    for c in curve:
        assert c["async/staleness_0"] + c["async/staleness_1"] == c["rollout/episodes"]
        assert c["engines/up"] == 2 and sum(c[f"engines/{server_name(u)}/requests"] for u in urls) > 0
        assert sum(c[f"envs/{server_name(e.url)}/steps"] for e in envs) > 0


# ----------------------------------------------------------------------------------------------- faults

@pytest.mark.slow
def test_an_engine_and_an_env_server_killed_mid_round_rerun_elsewhere_and_rejoin(tmp_path, monkeypatch):
    """SIGKILL one engine process and one env server process while episodes run on both, then start a fresh engine
    (the init checkpoint, version 0) and env server on their addresses (in this process: an engine process takes
    tens of seconds to import). The killed ones' episodes run again elsewhere (none scored), the engine rejoins with
    the current weights and serves episodes again, the run ends."""
    monkeypatch.setenv("MOBILERL_ENV_TOKEN", TOKEN)
    init = ROOT / load_profile("tiny").weights
    pe, pv = free_port(), free_port()
    procs = {"engine": engine_process(init, pe), "env": serve_env(pv, size=2)}
    survivor = engine_thread(init)
    spare = ThreadServer(4, env_factory("sim")).start()  # room for every slot while the other server is down
    back_env = ThreadServer(2, env_factory("sim"))
    back_env.port, back_env.url = pv, f"http://127.0.0.1:{pv}"
    back: list[ServerThread] = []
    victim, victim_env = f"http://127.0.0.1:{pe}/v1", f"http://127.0.0.1:{pv}"
    killed, restarted = threading.Event(), threading.Event()
    try:
        wait_healthy(pe, procs["engine"], timeout=120)
        wait_healthy(pv, procs["env"])
        rounds = 6
        cfg, trainer, workers = setup("tiny", None, [victim, survivor.base_url], [victim_env, spare.url], tmp_path,
                                      rounds=rounds, checkpoint_every=rounds, weight_sync="broadcast",
                                      **{"async": {"max_staleness": 1, "engine_wait_s": 120}})
        fleet, servers = workers.fleet, workers.envs
        engine_state = next(e for e in fleet.engines if e.url == victim)
        env_state = next(s for s in servers.servers if s.url == victim_env)

        def killer() -> None:
            deadline = time.monotonic() + 120
            while not (engine_state.in_flight >= 1 and env_state.in_flight >= 1 and env_state.steps >= 1):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)
            for p in procs.values():
                p.send_signal(signal.SIGKILL)
                p.wait(10)
            at["kill"] = fleet.version
            killed.set()
            while fleet.version == at["kill"] and time.monotonic() < deadline:  # back once a newer version is out
                time.sleep(0.01)
            back.append(engine_thread(init, pe))
            back_env.start()
            restarted.set()

        at: dict[str, int] = {}

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        with workers as w:
            curve = train_async(trainer, w, tasks(3), tmp_path, progress=False)
        thread.join(60)
        assert killed.is_set() and restarted.is_set(), "the run ended before the servers could be killed"
        version = httpx.get(f"{victim}/weights", timeout=10).json()["version"]
    finally:
        for server in (survivor, spare, back_env, *back):
            server.stop()
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(30)

    assert [c["round"] for c in curve] == list(range(rounds))  # the run finished
    n = sum(c["rollout/episodes"] + c["async/dropped_stale"] + c["rollout/env_failures"] + c["rollout/engine_failures"]
            for c in curve)
    assert n == rounds * 2 * 2  # every episode trained, dropped as stale or counted as a failure: none vanish
    assert all(t.error is None for _, t in trainer.trained)  # nothing cut short by a killed process was scored
    rerun = [t for _, t in trainer.trained if t.meta.get("reruns")]
    assert any(e.startswith("engine:") for t in rerun for e in t.meta["reruns"]), "the killed engine's episodes"
    total = {k: sum(c.get(k, 0.0) for c in curve) for k in {k for c in curve for k in c}}
    ve, vs = server_name(victim), server_name(victim_env)
    assert total[f"engines/{ve}/downs"] >= 1 and total[f"engines/{ve}/rejoins"] >= 1
    assert total[f"envs/{vs}/downs"] >= 1 and total[f"envs/{vs}/recoveries"] >= 1
    assert total[f"envs/{vs}/failures"] >= 1
    # the killed env server's episodes went on elsewhere: replayed there (the simulator is deterministic) or run
    # again (as env failures, or as engine ones when the killed engine served them too)
    assert total[f"envs/{vs}/replays"] + total[f"envs/{server_name(spare.url)}/replays"] + len(rerun) >= 1
    # the fresh engine took the weights current when it rejoined (not its init's version 0), sampled episodes with
    # them, and holds the last version published
    after = [t for _, t in trainer.trained if t.meta["engine"] == victim and int(t.policy_version) > at["kill"]]
    assert after, "the restarted engine served no episode"
    assert version == rounds and back[0].server.started
