"""rl.cluster: ray (mobilerl.rl.ray_cluster) on a local Ray cluster of two nodes on this machine, as an operator
makes one (`ray start --head`, then `ray start --address` with other resources): the engine lands on the node
with GPUs (declared: it serves on the CPU), the env servers on the node with the `avd` resource; an env server's
actor killed mid-round is restarted by Ray on its port and rejoins; the run finishes and nothing its death cut
short is scored. AndroidWorld's servers (the stand-in as processes) likewise, and `ray job submit` runs the stage
on them. Every Ray test is in this file: `ray stop` would stop another worker's cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from test_rl_async_remote import Judge, lab, setup, tasks

from mobilerl.env.cluster import server_name
from mobilerl.models.profiles import load_profile
from mobilerl.rl.async_loop import train_async
from mobilerl.rl.config import RayConfig, RLConfig
from mobilerl.rl.ray_cluster import RayCluster

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def _start(args: list[str], env: dict[str, str]) -> None:
    out = subprocess.run([RAY, "start", *args, "--disable-usage-stats", "--object-store-memory", "80000000"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


class Nodes(NamedTuple):
    address: str  # the head's GCS, host:port
    dashboard: str  # its dashboard (the jobs API), http://127.0.0.1:port


@pytest.fixture(scope="module")
def two_nodes():
    """A head node with 1 GPU (declared) and the dashboard, and a worker node with 2 `avd`."""
    import secrets

    from env_servers import free_port

    # token auth, as docker/README.md sets it up: every node and the driver hold the cluster's token
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    _reload_auth()  # this process imported Ray before: its config read the mode then
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    # short: Ray's sockets live under it, and an AF_UNIX path has at most 107 bytes (pytest's tmp paths under xdist
    # reach that)
    temp = Path(tempfile.mkdtemp(prefix="mlrl-ray-", dir="/tmp"))
    port, dashboard = free_port(), free_port()
    _start(["--head", "--port", str(port), "--num-cpus", "1", "--num-gpus", "1", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard), "--ray-client-server-port", str(free_port()), "--temp-dir", str(temp)],
           env)
    address = f"{ray.util.get_node_ip_address()}:{port}"
    try:
        _start(["--address", address, "--num-cpus", "1", "--resources", json.dumps({"avd": 2})], env)
        yield Nodes(address, f"http://127.0.0.1:{dashboard}")
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        _reload_auth()


def _reload_auth() -> None:
    """Ray's C++ side reads RAY_AUTH_MODE / RAY_AUTH_TOKEN once; read them again (as ray.init does for a new
    local cluster)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def test_rl_cluster_ray_takes_its_pools_and_refuses_what_it_would_launch_twice():
    cfg = RLConfig.model_validate({"cluster": "ray", "ray": {"engines": {"count": 4}, "env_servers": {"count": 8}}})
    assert cfg.ray.engines.resources == {"GPU": 1.0} and cfg.ray.env_servers.resources == {"avd": 1.0}
    with pytest.raises(ValueError, match="rl.engines and rl.ray.engines both say"):
        RLConfig.model_validate({"cluster": "ray", "engines": ["http://127.0.0.1:8000/v1"], "ray": {"engines": {}}})
    with pytest.raises(ValueError, match="rl.ray.trainer.ranks \\(2\\) > 1 needs"):
        RLConfig.model_validate({"cluster": "ray", "ray": {"trainer": {"ranks": 2}}})
    with pytest.raises(ValueError, match="count"):
        RayConfig.model_validate({"env_servers": {"count": 0}})
    aw = {"cluster": "ray", "suite": "androidworld", "profile": "vl_smoke", "rollout_processes": 1,
          "ray": {"androidworld": {"count": 2, "command": ["serve", "--port", "{port}"]}}}
    assert RLConfig.model_validate({**aw, "androidworld": {}}).androidworld.urls == []  # Ray fills them in
    with pytest.raises(ValueError, match="rl.androidworld without urls"):
        RLConfig.model_validate({**aw, "androidworld": {"urls": ["http://a:5000"]}})
    with pytest.raises(ValueError, match="rl.androidworld.urls: empty"):
        RLConfig.model_validate({**aw, "cluster": None, "androidworld": {}})
    with pytest.raises(ValueError, match=r"rl.rollout_processes \(3\) > the 2 AndroidWorld"):
        RLConfig.model_validate({**aw, "androidworld": {}, "rollout_processes": 3})
    with pytest.raises(ValueError, match=r"\{port\}"):
        RayConfig.model_validate({"androidworld": {"command": ["serve"]}})


@pytest.mark.slow
def test_two_nodes_place_engine_and_env_servers_by_resource_and_a_killed_env_actor_rejoins(two_nodes, tmp_path,
                                                                                        monkeypatch):
    from env_servers import TOKEN

    monkeypatch.setenv("MOBILERL_ENV_TOKEN", TOKEN)
    monkeypatch.setenv("MOBILERL_API_KEY", "ray-test-key")  # the engine's, handed to its actor
    init = ROOT / load_profile("tiny").weights
    ray_cfg = RayConfig.model_validate({
        "address": two_nodes.address, "bind": "node", "max_restarts": 2, "start_timeout_s": 180,
        "engines": {"count": 1, "engine": "hf", "device": "cpu", "max_batch": 8},
        "env_servers": {"count": 2, "size": 2, "isolate": False}})
    rounds = 4
    with RayCluster(ray_cfg, model=init, render=True, token_env="MOBILERL_ENV_TOKEN") as cluster:
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        infos = {name: cluster.info(name) for name in ("engine-0", "env-0", "env-1")}
        assert "GPU" in nodes[infos["engine-0"]["node"]]  # each where its resource is
        assert all("avd" in nodes[infos[f"env-{i}"]["node"]] for i in (0, 1))
        assert all(not i["restarted"] for i in infos.values())
        rl = cluster.configure(RLConfig.model_validate({"cluster": "ray", "ray": ray_cfg.model_dump()}))
        assert rl.engines == cluster.engines and rl.env_servers == cluster.env_servers and rl.cluster is None
        cfg, trainer, workers = setup("tiny", "screenshot+xml", rl.engines, rl.env_servers, tmp_path, rounds=rounds,
                                      checkpoint_every=rounds, weight_sync="reload", lab_share=1.0,
                                      reward_model="the Judge", engines_api_key_env=rl.engines_api_key_env,
                                      **{"async": {"max_staleness": 1}})
        victim = infos["env-0"]["url"]
        state = next(s for s in workers.envs.servers if s.url == victim)
        killed: dict[str, int] = {}

        def killer() -> None:  # SIGKILL the actor (its server dies with it) while an episode runs there
            deadline = time.monotonic() + 120
            while not (state.in_flight >= 1 and state.steps >= 1) and time.monotonic() < deadline:
                time.sleep(0.005)
            if time.monotonic() < deadline:
                os.kill(infos["env-0"]["pid"], signal.SIGKILL)
                killed["version"] = workers.fleet.version or 0

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        with workers as w:
            curve = train_async(trainer, w, lab(tasks(2, max_steps=2)), tmp_path, progress=False, judge=Judge())
        thread.join(30)
        after = cluster.info("env-0")
    assert killed, "the run ended before the env server's actor could be killed"
    assert after["restarted"] and after["pid"] != infos["env-0"]["pid"] and after["url"] == victim  # same port
    assert [c["round"] for c in curve] == list(range(rounds))  # the run finished
    n = sum(c["rollout/episodes"] + c["async/dropped_stale"] + c["rollout/env_failures"] + c["rollout/engine_failures"]
            for c in curve)
    assert n == rounds * 2 * 2  # every episode trained, dropped as stale or counted as a failure: none vanish
    assert all(t.error is None for _, t in trainer.trained)  # nothing the killed actor cut short was scored
    total = {k: sum(c.get(k, 0.0) for c in curve) for k in {k for c in curve for k in c}}
    vs = server_name(victim)
    assert total[f"envs/{vs}/downs"] >= 1 and total[f"envs/{vs}/recoveries"] >= 1, total  # down, then back
    assert total[f"envs/{vs}/failures"] >= 1
    rerun = sum(1 for _, t in trainer.trained if t.meta.get("reruns"))
    assert rerun + sum(total[f"envs/{server_name(u)}/replays"] for u in rl.env_servers) >= 1  # went on elsewhere
    assert curve[-1][f"envs/{vs}/up"] == 1.0


DRIVER = """
import json, os, sys
from pathlib import Path
from typing import NamedTuple
from mobilerl.rl.config import RLConfig
from mobilerl.rl.run import run
if __name__ == "__main__":  # as a file (ray job submit), the rollout processes (spawned) import it again
    cfg = RLConfig.model_validate(json.loads(sys.argv[1]))
    summary, curve = run(cfg, Path(sys.argv[2]), progress=False)
    print("RESULT " + json.dumps({"summary": summary, "rounds": [c["round"] for c in curve],
                                  "world": os.environ.get("WORLD_SIZE"), "engines": curve[-1].get("engines/up"),
                                  "episodes": curve[-1]["rollout/episodes"]}))
"""


@pytest.mark.slow
def test_the_rl_stage_under_ray_runs_its_second_trainer_rank_as_an_actor(two_nodes, tmp_path):
    """`run` itself (the stage's entry) as a driver process: Ray starts the engine, the env server and trainer rank
    1, which joins rank 0's (this driver's) ddp group; two asynchronous rounds, the policy written."""
    from env_servers import TOKEN
    from rl_tasks import short_tasks, stage_root

    root = stage_root(tmp_path / "root", short_tasks(2, max_steps=2))
    init = ROOT / load_profile("tiny").weights
    cfg = {"profile": "tiny", "init": str(init), "out": str(tmp_path / "out"), "work": str(tmp_path / "work"),
           "rounds": 2, "checkpoint_every": 1, "fcf": False, "rollout_concurrency": 2, "cluster": "ray",
           "trainer_backend": "ddp", "state_key": str(tmp_path / "state.key"), "async": {"max_staleness": 1},
           "ray": {"address": two_nodes.address, "start_timeout_s": 180,
                   "engines": {"engine": "hf", "device": "cpu", "max_batch": 8},
                   "env_servers": {"size": 2, "isolate": False}, "trainer": {"ranks": 2, "resources": {"CPU": 1}}},
           "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 8}}
    env = {**os.environ, "MOBILERL_ENV_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MOBILERL_API_KEY", None)  # the run makes one for its engine
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cfg), str(root)], env=env, capture_output=True,
                         text=True, timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["rounds"] == [0, 1] and result["world"] == "2" and result["engines"] == 1.0
    assert (tmp_path / "out" / "curriculum.json").is_file() and result["summary"]["rounds"] == 2
    assert "ray: engine-0 at http://" in out.stdout and "ray: env-0 at http://" in out.stdout


def _androidworld_pool(count: int) -> dict:
    """rl.ray.androidworld over the tests' AndroidWorld stand-in, a process per actor as AndroidWorld's server is."""
    stub = ROOT / "tests" / "androidworld_stub.py"
    return {"count": count, "command": [sys.executable, str(stub), "--host", "{host}", "--port", "{port}"]}


@pytest.mark.slow
def test_androidworld_servers_run_as_actors_on_the_avd_node_and_a_killed_one_comes_back(two_nodes):
    from test_androidworld_backend import Scripted

    from mobilerl.env.androidworld import androidworld_tasks
    from mobilerl.env.factory import env_factory
    from mobilerl.eval.runner import evaluate_sync

    ray_cfg = RayConfig.model_validate({"address": two_nodes.address, "start_timeout_s": 120,
                                        "androidworld": _androidworld_pool(2)})
    rl_in = RLConfig.model_validate({"cluster": "ray", "suite": "androidworld", "profile": "vl_smoke",
                                     "rollout_processes": 1, "androidworld": {"max_steps": 3, "timeout_s": 30},
                                     "ray": ray_cfg.model_dump()})
    assert rl_in.androidworld.urls == []
    with RayCluster(ray_cfg, model=ROOT / "models" / "tiny-base", render=True) as cluster:
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        infos = {f"androidworld-{i}": cluster.info(f"androidworld-{i}") for i in range(2)}
        assert all("avd" in nodes[i["node"]] for i in infos.values())
        rl = cluster.configure(rl_in)
        assert rl.androidworld.urls == cluster.androidworld == [i["url"] for i in infos.values()]
        tasks = androidworld_tasks(rl.androidworld, "train", per_type=1)
        assert len(tasks) == 3
        # the server dies: its actor ends, Ray starts another, which binds the same port
        os.kill(infos["androidworld-0"]["server_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while not (after := cluster.info("androidworld-0", timeout=90))["restarted"]:
            assert time.monotonic() < deadline, "Ray did not restart the AndroidWorld server's actor"
            time.sleep(0.5)
        assert after["url"] == infos["androidworld-0"]["url"] and after["pid"] != infos["androidworld-0"]["pid"]
        make = env_factory("androidworld", obs_mode="screenshot", androidworld=rl.androidworld)
        trajs = evaluate_sync(lambda seed: Scripted(), tasks, env_factory=make, concurrency=2, progress=False)
    # an episode on each server, the restarted one first (the lease's order): every one solved
    assert all(t.error is None and t.success for t in trajs), [(t.task_id, t.error) for t in trajs]


@pytest.mark.slow
def test_ray_job_submit_runs_the_rl_stage_on_androidworld_servers_ray_launched(two_nodes, tmp_path):
    """`ray job submit` (the jobs API of the head's dashboard) runs the stage's `run` as the job's driver, which
    joins the cluster (address auto) and has Ray start AndroidWorld's servers on the `avd` node; one round of
    the vl_smoke model (Qwen2.5-VL class, screenshots) on them."""
    from mobilerl.models.random_init import ensure_weights

    init = ensure_weights(load_profile("vl_smoke"))
    cfg = {"profile": "vl_smoke", "init": str(init), "out": str(tmp_path / "out"), "work": str(tmp_path / "work"),
           "rounds": 1, "fcf": False, "suite": "androidworld", "rollout_processes": 1, "cluster": "ray",
           "state_key": str(tmp_path / "state.key"), "androidworld": {"max_steps": 2, "timeout_s": 30},
           "ray": {"address": "auto", "start_timeout_s": 120, "androidworld": _androidworld_pool(2)},
           "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 8}}
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = subprocess.run([RAY, "job", "submit", "--address", two_nodes.dashboard, "--", sys.executable, str(driver),
                          json.dumps(cfg), str(tmp_path)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=420)
    assert out.returncode == 0 and "succeeded" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["rounds"] == [0] and result["summary"]["pool"] == 6  # the suite the servers listed
    assert result["episodes"] == 4  # 2 tasks x 2 samples, on the servers Ray started
    assert "ray: androidworld-0 at http://" in out.stdout and "ray: androidworld-1 at http://" in out.stdout
