"""Episodes over several real env servers (mobilerl.env.cluster): placement by free capacity, retries on another
server, replay of a failed step, health checks that mark a server down and bring it back, per-server figures;
a server killed mid-run and restarted."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import pytest
from env_servers import TOKEN, ThreadServer, free_port, serve_env, servers, wait_healthy

from mobilerl.agent.policy import OraclePolicy, ScriptedPolicy
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import EnvCrashed, EnvError, TaskSpec
from mobilerl.env.cluster import (
    EnvServers,
    EnvServersConfig,
    check_server_urls,
    merge_stats,
    server_metrics,
    server_name,
)
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.env.server import RemoteEnv
from mobilerl.eval.runner import evaluate
from mobilerl.rl.groups import make_groups

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
TAP = format_action(Action("Tap", element=BUTTON))
FINISH = format_action(Action("Finish", message="done"))


def counter_tasks(n: int, target: int = 3) -> list[TaskSpec]:
    """Fake tasks: tap the button ``target`` times, then finish (budget 10 responses)."""
    return [TaskSpec(f"c/{i}/{target}", "fake", "test", "Counter", "tap") for i in range(n)]


def tapper() -> ScriptedPolicy:
    return ScriptedPolicy([TAP, TAP, TAP, FINISH])


class OffByOne(CounterEnv):
    """A device that differs from CounterEnv: its counter starts at 1 (a replay there sees another screen)."""

    def reset(self, task):
        super().reset(task)
        self.count = 1
        return self._observe()


def cluster(urls, **cfg) -> EnvServers:
    cfg.setdefault("health_interval_s", 0.2)
    cfg.setdefault("wait_for_server_s", 5.0)
    return EnvServers(urls, EnvServersConfig(**cfg), token=TOKEN)


def run(envs: EnvServers, tasks, policy=None, n_trials: int = 1, concurrency: int = 16):
    policy = policy or tapper()
    return asyncio.run(evaluate(lambda seed: policy, tasks, n_trials=n_trials, concurrency=concurrency,
                                env_servers=envs, progress=False))


# -- placement and figures ------------------------------------------------------------------------------------


def test_episodes_spread_by_free_capacity_and_figures_are_per_server():
    with servers(1, 2, 3) as (a, b, c):
        envs = cluster([a.url, b.url, c.url])
        trajs = run(envs, counter_tasks(12))
        assert [t.success for t in trajs] == [True] * 12 and all(t.error is None for t in trajs)
        stats = envs.take_stats()
        # 6 slots (the servers' 1 + 2 + 3 workers), each episode on the server with the most free workers
        assert [stats[server_name(s.url)]["episodes"] for s in (a, b, c)] == [2, 4, 6]
        for s in (a, b, c):
            st = stats[server_name(s.url)]
            assert st["steps"] == 4 * st["episodes"] and st["failures"] == 0 and st["up"] == 1
            assert len(st["step_latency_s"]) == st["steps"]
        m = server_metrics(stats)
        key = f"envs/{server_name(c.url)}"
        assert m[f"{key}/steps"] == 24 and m[f"{key}/episodes"] == 6 and m["envs/up"] == 3
        assert 0 < m[f"{key}/step_latency_mean_s"] <= m[f"{key}/step_latency_p95_s"]
        assert envs.take_stats()[server_name(c.url)]["steps"] == 0  # taken: the next round starts from zero


def test_figures_of_several_processes_merge_and_name_servers_safely():
    a = {"h_1": {"episodes": 2, "resets": 2, "steps": 8, "failures": 1, "busy": 0, "replays": 0, "downs": 1,
                 "recoveries": 0, "up": 0, "url": "http://h:1", "step_latency_s": [0.1, 0.3]}}
    b = {"h_1": {**a["h_1"], "up": 1, "failures": 0, "downs": 0, "step_latency_s": [0.2]}}
    merged = merge_stats([a, None, b])["h_1"]
    assert merged["steps"] == 16 and merged["failures"] == 1 and merged["up"] == 0
    m = server_metrics({"h_1": merged})
    assert m["envs/h_1/step_latency_mean_s"] == pytest.approx(0.2) and m["envs/h_1/step_latency_p95_s"] == 0.3
    assert server_name("http://sim-env.cluster.local:8765") == "sim-env_cluster_local_8765"
    assert check_server_urls(["http://a:1/", "https://b:2"]) == ["http://a:1", "https://b:2"]
    for bad, why in ((["a:1"], "not an http"), (["http://a"], "not an http"), (["http://a:1", "http://a:1/"], "twice"),
                     ([], "empty list")):
        with pytest.raises(ValueError, match=f"rl.env_servers: .*{why}|rl.env_servers: {why}"):
            check_server_urls(bad)


# -- failures ------------------------------------------------------------------------------------------------


def test_a_failing_reset_is_retried_elsewhere_and_the_server_marked_down_then_back():
    with servers(2, 2) as (good, bad):
        bad.faults.fail["/reset"] = -1
        envs = cluster([good.url, bad.url], max_failures=2, health_interval_s=30)
        trajs = run(envs, counter_tasks(8))
        assert all(t.success for t in trajs)
        st = envs.take_stats()[server_name(bad.url)]
        # its /health answers, so it is marked down by its failed calls (2 in a row), not by a probe
        assert st["failures"] == 2 and st["downs"] == 1 and st["up"] == 0 and st["episodes"] == 0
        bad.faults.fail.clear()
        trajs = run(envs, counter_tasks(8))  # the next round's first probe finds it healthy
        st = envs.take_stats()[server_name(bad.url)]
        assert all(t.success for t in trajs) and st["recoveries"] == 1 and st["up"] == 1 and st["episodes"] > 0


def test_a_busy_server_is_tried_elsewhere_without_counting_against_its_health():
    with ThreadServer(3, acquire_timeout=0.2).start() as full, servers(1) as (free,):
        async def main():
            others = [RemoteEnv(full.url, TOKEN) for _ in range(3)]  # another client holds its 3 workers
            for r in others:
                await r.reset("c/0/1")
            envs = cluster([full.url, free.url])
            async with envs.pool(4) as pool, pool.acquire() as env:
                await env.reset(counter_tasks(1)[0])  # the most free capacity (3) is busy: 503, then elsewhere
                assert env.worker.server.url == free.url
            for r in others:
                await r.close()
            return envs.take_stats()[server_name(full.url)]

        st = asyncio.run(main())
        assert st["busy"] == 1 and st["failures"] == 0 and st["up"] == 1 and st["downs"] == 0


def test_a_hung_server_times_out_is_probed_down_and_returns_when_it_answers():
    with servers(2, 2) as (good, slow):
        envs = cluster([good.url, slow.url], request_timeout_s=0.5, health_timeout_s=0.3, max_failures=10)

        async def main():
            pool = envs.pool(4)
            async with pool:
                slow.faults.hang_s = 2.0  # every request, /health included, now stalls past the timeouts
                async with pool.acquire() as env, pool.acquire() as env2:
                    await env.reset(counter_tasks(1)[0])
                    await env2.reset(counter_tasks(1)[0])  # one of the two meets the hung server and moves on
                    assert {env.worker.server.url, env2.worker.server.url} == {good.url}
                state = next(s for s in envs.servers if s.url == slow.url)
                deadline = time.monotonic() + 5
                while state.up and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert not state.up and "health probe failed" in state.last_error
                slow.faults.hang_s = 0.0
                deadline = time.monotonic() + 5
                while not state.up and time.monotonic() < deadline:  # the periodic probe brings it back
                    await asyncio.sleep(0.05)
                assert state.up

        asyncio.run(main())
        st = envs.take_stats()[server_name(slow.url)]
        assert st["failures"] >= 1 and st["downs"] == 1 and st["recoveries"] == 1


def test_a_failed_step_is_replayed_on_another_server_and_the_episode_goes_on():
    with servers(4, 4) as (a, b):
        a.faults.fail["/step"], a.faults.fail_after["/step"] = 2, 5  # its 6th and 7th steps fail
        envs = cluster([a.url, b.url], max_failures=5)
        trajs = run(envs, counter_tasks(8))
        assert [t.success for t in trajs] == [True] * 8 and all(t.error is None for t in trajs)
        assert all(t.n_steps == 4 for t in trajs)  # the agent never saw the failure
        stats = envs.take_stats()
        assert stats[server_name(a.url)]["failures"] == 2
        assert stats[server_name(b.url)]["replays"] == 2

        # without replay, those episodes end as env failures: dropped from their group, never scored 0
        a.faults.fail["/step"], a.faults.fail_after["/step"] = 2, a.faults.seen["/step"] + 5
        envs = cluster([a.url, b.url], max_failures=5, replay=False)
        trajs = run(envs, counter_tasks(8))
        failed = [t for t in trajs if t.error is not None]
        assert len(failed) == 2 and all(t.error.startswith("env: EnvCrashed: step failed on") for t in failed)
        groups, dropped = make_groups(trajs)
        assert dropped == 2 and sum(len(g.trajectories) for g in groups) == 6


def test_a_replay_that_reaches_another_screen_fails_the_episode_as_an_env_failure():
    with servers(2) as (a,), servers(2, factory=OffByOne) as (other,):
        a.faults.fail["/step"], a.faults.fail_after["/step"] = 1, 1
        envs = cluster([a.url, other.url])

        async def main():
            async with envs.pool(2) as pool, pool.acquire() as env, pool.acquire() as env2:
                task = counter_tasks(1)[0]
                await env.reset(task)
                await env2.reset(task)  # both servers have a free worker: one episode on each
                on_a = env if env.worker.server.url == a.url else env2
                await on_a.step(Action("Tap", element=BUTTON))
                with pytest.raises(EnvCrashed, match="gave a different screen"):
                    await on_a.step(Action("Tap", element=BUTTON))

        asyncio.run(main())
        assert envs.take_stats()[server_name(other.url)]["replays"] == 1


def test_no_server_up_and_a_wrong_token_are_clear_errors():
    dead = f"http://127.0.0.1:{free_port()}"
    envs = cluster([dead], wait_for_server_s=0.3)
    with pytest.raises(EnvError, match=f"no env server is up: {dead}: health probe failed"):
        run(envs, counter_tasks(1))
    with servers(1) as (a,):
        wrong = EnvServers([a.url], EnvServersConfig(token_env="MOBILERL_TEST_TOKEN"), token="nope")
        with pytest.raises(EnvError, match="rejects the token in \\$MOBILERL_TEST_TOKEN"):
            run(wrong, counter_tasks(1))
    with pytest.raises(ValueError, match="set \\$MOBILERL_NO_SUCH_VAR"):
        EnvServers([dead], EnvServersConfig(token_env="MOBILERL_NO_SUCH_VAR"))


# -- a real server process killed mid-run, then restarted ---------------------------------------------------------


class SlowOracle(OraclePolicy):
    """The simulator's expert, 0.2 s a step: episodes last long enough to kill a server under them."""

    async def act(self, ctx):
        await asyncio.sleep(0.2)
        return await super().act(ctx)


@pytest.mark.slow
def test_a_server_killed_mid_run_is_marked_down_its_episodes_replayed_and_a_restart_rejoins():
    from mobilerl.env.sim.tasks import list_tasks

    ports = [free_port() for _ in range(3)]
    procs = [serve_env(p) for p in ports]
    try:
        for p, proc in zip(ports, procs, strict=True):
            wait_healthy(p, proc)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        victim = urls[1]
        envs = cluster(urls, health_interval_s=0.5, request_timeout_s=10)
        tasks = [t for t in list_tasks("world", "test", n=1) if 4 <= t.optimal_steps <= 8][:6]
        killed = threading.Event()

        def killer():
            state = next(s for s in envs.servers if s.url == victim)
            deadline = time.monotonic() + 120
            while not (state.steps >= 2 and state.in_flight >= 1):  # episodes running there, a few steps in
                assert time.monotonic() < deadline
                time.sleep(0.02)
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait(10)
            killed.set()

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        trajs = run(envs, tasks, policy=SlowOracle(), n_trials=2, concurrency=6)
        thread.join(30)
        assert killed.is_set(), "the run ended before the server could be killed"
        stats = envs.take_stats()
        v = stats[server_name(victim)]
        assert v["downs"] == 1 and v["up"] == 0 and v["failures"] >= 1
        # the simulator is deterministic in the task: the killed server's episodes went on elsewhere by replay
        assert sum(st["replays"] for st in stats.values()) >= 2
        assert all(t.error is None for t in trajs), [t.error for t in trajs if t.error]
        assert all(t.success for t in trajs)  # the oracle solves each task, wherever its episode ran

        procs[1] = serve_env(ports[1])  # replaced on the same address
        wait_healthy(ports[1], procs[1])
        trajs = run(envs, tasks, policy=SlowOracle(), n_trials=2, concurrency=6)
        v = envs.take_stats()[server_name(victim)]
        assert all(t.success for t in trajs)
        assert v["up"] == 1 and v["recoveries"] == 1 and v["episodes"] >= 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


# -- the rl stage on env servers ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_rl_stage_runs_on_env_servers_and_logs_per_server_figures(tmp_path, monkeypatch):
    """`rl.env_servers`: the stage's rollout workers run their episodes on the servers; a server stopped after
    round 0 is marked down in round 1, which runs on the other; MLflow's callback gets envs/<server>/... a round."""
    from rl_tasks import short_tasks, stage_root

    from mobilerl.env.factory import env_factory
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run as run_stage

    stage_root(tmp_path, short_tasks(2), [3, 3])
    monkeypatch.setenv("MOBILERL_ENV_TOKEN", TOKEN)
    with servers(2, 2, factory=env_factory("sim")) as (a, b):
        cfg = RLConfig(init=str(BASE), out="out", work="work", rounds=2, checkpoint_every=1, rollout_processes=1, max_batch=1, env_servers=[a.url, b.url],
                       env_pool={"health_interval_s": 0.5, "wait_for_server_s": 10},
                       overrides={"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16})
        logged: list[tuple[int, dict]] = []

        def log_metrics(m, r):
            logged.append((r, m))
            if r == 0:
                b.stop()  # gone between rounds

        summary, curve = run_stage(cfg, tmp_path, log_metrics=log_metrics, progress=False)
    assert summary["rounds"] == 2 and [r for r, _ in logged] == [0, 1]
    na, nb = server_name(a.url), server_name(b.url)
    (_, m0), (_, m1) = logged
    assert m0["rollout/episodes"] == 4 and m0["rollout/env_failures"] == 0
    assert m0[f"envs/{na}/episodes"] + m0[f"envs/{nb}/episodes"] == 4 and m0["envs/up"] == 2
    assert m0[f"envs/{na}/steps"] > 0 and m0[f"envs/{na}/step_latency_p95_s"] > 0
    assert m1[f"envs/{nb}/downs"] == 1 and m1[f"envs/{nb}/up"] == 0 and m1[f"envs/{nb}/episodes"] == 0
    assert m1[f"envs/{na}/episodes"] == 4 and m1["rollout/episodes"] == 4
    assert curve[1][f"envs/{nb}/up"] == 0  # the curve (curve.jsonl) keeps them too
