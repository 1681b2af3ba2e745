"""docker/: what can be validated without a Docker engine."""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())


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
    assert set(files) == {"rollout", "simenv", "avd-worker", "trainer"}
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
    simenv = _entry(files["simenv"][1])
    _check_mobilerl_command(simenv + COMPOSE["services"]["simenv"]["command"])
    avd = _entry(files["avd-worker"][1])
    script = ROOT / "docker" / "avd" / "entrypoint.sh"
    assert avd[0] == "/usr/local/bin/avd-entrypoint.sh" and script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True)
    _check_mobilerl_command(avd[1:])
    assert _entry(files["trainer"][1]) == ["dvc", "repro"] and (ROOT / "dvc.yaml").is_file()
    rollout = _entry(files["rollout"][1])
    assert rollout[:2] == ["vllm", "serve"]
    assert 'vllm==0.28.0' in (ROOT / "pyproject.toml").read_text()


def test_published_ports_bind_loopback_only():
    for name, svc in COMPOSE["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
