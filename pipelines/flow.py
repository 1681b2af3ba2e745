"""The Prefect flow ``mobilerl``: run dvc.yaml's stages in DVC's own order, with retries and a summary.

DVC owns the DAG and the caching: the flow asks DVC for the stage graph, sorts it topologically and
runs each stage as a Prefect task (``dvc repro --single-item <stage>``), so an up-to-date stage is
skipped by DVC itself. The flow opens the MLflow parent run; stage processes log nested runs under it
(``MOBILERL_PARENT_RUN_ID``) tagged with the Prefect flow-run id.

Parameters choose a preset (``configs/presets/<name>.yaml``: params.yaml overrides; none: params.yaml as
is), a ``cluster`` (``configs/clusters/<name>.yaml``: the env servers the `rl` stage runs its episodes on, e.g.
``local`` for docker/compose.yaml's RL cluster, ``ray`` for a Ray cluster that launches them; none: the in-process
simulator) and extra ``overrides``
(``{"evaluate.n_trials": 8}``), applied in that order. A run with ``isolated=True`` (the ``smoke``
deployment) works in a temporary copy of the repository, so its overrides never touch the workspace;
otherwise the overrides are written into ``params.yaml`` (as ``dvc exp run --set-param`` does), so
``dvc.lock`` records exactly what ran.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configs" / "presets"
CLUSTERS = ROOT / "configs" / "clusters"
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
}


def stage_order(repo_dir: Path = ROOT, targets: list[str] | None = None) -> list[str]:
    """dvc.yaml's stages in an order DVC would run them (dependencies first, file order on ties).
    Frozen stages (released artifacts such as the pretrained tiny base) are rebuilt on purpose only:
    ``dvc unfreeze <stage> && dvc repro <stage>``; the flow leaves them out."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(repo_dir)) as repo:
        stages = [s for s in repo.index.stages if getattr(s, "cmd", None) and not getattr(s, "frozen", False)]
        position = {s.name: i for i, s in enumerate(stages)}
        graph = repo.index.graph  # edge: stage -> a stage it depends on
        order = [s.name for s in nx.lexicographical_topological_sort(
            graph.reverse(copy=True), key=lambda s: f"{position.get(s.name, 10**6):06d}")
            if s.name in position]
        if targets:
            wanted: set[str] = set()
            by_name = {s.name: s for s in stages}
            for t in targets:
                if t not in by_name:
                    raise ValueError(f"unknown stage {t!r}; dvc.yaml has {', '.join(order)}")
                wanted.add(t)
                wanted.update(d.name for d in nx.descendants(graph, by_name[t]))
            order = [s for s in order if s in wanted]
    return order


def load_overrides(preset: str | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The preset's overrides (flattened ``section.key`` form) updated by explicit ``overrides``."""
    import yaml

    merged: dict[str, Any] = {}
    if preset is not None:
        path = PRESETS / f"{preset}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in PRESETS.glob("*.yaml"))
            raise ValueError(f"unknown preset {preset!r}; known: {', '.join(known)}")
        from mobilerl.tracking import flatten

        merged.update(flatten(yaml.safe_load(path.read_text()) or {}))
    merged.update(overrides or {})
    return merged


def load_cluster(cluster: str) -> dict[str, Any]:
    """A cluster file (``configs/clusters/<name>.yaml``, or a path) as ``section.key`` overrides: its sections are
    params.yaml's, and each key's value is taken whole (a URL list, a settings mapping)."""
    import yaml

    path = Path(cluster) if cluster.endswith((".yaml", ".yml")) else CLUSTERS / f"{cluster}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in CLUSTERS.glob("*.yaml"))
        raise ValueError(f"unknown cluster {cluster!r}; known: {', '.join(known)} (or a path to a .yaml file)")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: expected params.yaml sections (e.g. `rl:`) of `key: value` entries")
    return {f"{section}.{key}": value for section, keys in data.items() for key, value in keys.items()}


# Each params.yaml section's typed config ("module:class"), to validate overrides before they are written.
STAGE_CONFIGS = {
    "pretrain": "stages.pretrain:PretrainConfig",
    "tasks": "stages.tasks:TasksConfig",
    "collect": "stages.collect:CollectConfig",
    "privacy_audit": "stages.privacy_audit:PrivacyAuditConfig",
    "sft_data": "stages.sft_data:SftDataConfig",
    "sft_reasoning_free": "mobilerl.sft.train:SFTConfig",
    "sft_random_init": "mobilerl.sft.train:SFTConfig",
    "reasoning_bootstrap": "mobilerl.sft.bootstrap:BootstrapConfig",
    "reasoning_refine": "mobilerl.sft.refine:RefineConfig",
    "sft_reasoning": "mobilerl.sft.train:SFTConfig",
    "evaluate": "mobilerl.eval.config:EvaluateConfig",
    "report": "mobilerl.eval.report:ReportConfig",
    "reward_traces": "mobilerl.reward.traces:RewardTracesConfig",
    "reward_model": "mobilerl.reward.train:RewardModelConfig",
    "rl": "mobilerl.rl.config:RLConfig",
}


def validate_sections(params: dict[str, Any], sections: set[str], source: Path) -> None:
    """Each of ``sections`` of ``params`` as its stage's typed config would load it (the rl stage's profile
    overrides too, and the reasoning stages'); a ParamsError naming the bad key otherwise."""
    import importlib

    from mobilerl.config import checked_settings, validate_section

    for section in sorted(sections):
        if section not in STAGE_CONFIGS:
            continue
        module, name = STAGE_CONFIGS[section].split(":")
        cfg = validate_section(section, getattr(importlib.import_module(module), name), params[section], source)
        if hasattr(cfg, "settings") and hasattr(cfg, "overrides"):
            checked_settings(cfg, section)
        elif hasattr(cfg, "reasoning_overrides"):
            checked_settings(cfg, section, "reasoning_overrides", "reasoning")


def apply_overrides(params_path: Path, overrides: dict[str, Any]) -> None:
    """Write ``section.key: value`` overrides into params.yaml, keeping its comments (ruamel). Every section they
    touch is validated first (a ParamsError naming the key, the file untouched), and the file is replaced in
    one step (a temporary file renamed over it), so a failed run never leaves a half-written or wrong one."""
    if not overrides:
        return
    import io

    import yaml
    from ruamel.yaml import YAML

    y = YAML()
    data = y.load(params_path.read_text())
    for dotted, value in overrides.items():
        *path, last = dotted.split(".")
        node = data
        for key in path:
            if key not in node:
                raise KeyError(f"override {dotted!r}: params.yaml has no section {key!r}")
            node = node[key]
        if last not in node:
            raise KeyError(f"override {dotted!r}: params.yaml has no key {last!r} in {'.'.join(path)}")
        node[last] = value
    buf = io.StringIO()
    y.dump(data, buf)
    text = buf.getvalue()
    validate_sections(yaml.safe_load(text), {dotted.split(".")[0] for dotted in overrides}, params_path)
    tmp = params_path.with_name(f".{params_path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, params_path)
    finally:
        tmp.unlink(missing_ok=True)


def isolated_copy() -> Path:
    """The tracked files of the repository (plus the .dvc folder) in a temporary directory."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    dest = Path(tempfile.mkdtemp(prefix="mobilerl-run-"))
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shutil.copytree(ROOT / ".dvc", dest / ".dvc", dirs_exist_ok=True, ignore=shutil.ignore_patterns("tmp", "cache"))
    # the bytecode too (sources keep their mtimes, so it stays valid): without it, where PYTHONDONTWRITEBYTECODE
    # is set, every stage's process compiles the library again
    for cache in (p for folder in ("mobilerl", "stages", "pipelines") for p in (ROOT / folder).rglob("__pycache__")):
        shutil.copytree(cache, dest / cache.relative_to(ROOT), dirs_exist_ok=True)
    subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "core.no_scm", "true"], cwd=dest,
                   check=True, capture_output=True)
    return dest


def stream(cmd: list[str], cwd: str, env: dict[str, str], emit: Callable[[str], None],
           redraw_every_s: float = 30.0) -> tuple[int, list[str]]:
    """Run ``cmd`` (stderr into stdout, Python unbuffered) and hand each line of its output to ``emit`` as it
    comes; returns the exit code and the lines. A progress bar's redraws (ended by a carriage return) are handed
    on at most once per ``redraw_every_s``, the last one at the end: a long stage says how far it is, once."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    buf, pending, last_redraw = b"", "", float("-inf")
    while chunk := proc.stdout.read1(1 << 16):
        buf += chunk
        while (m := re.search(rb"\r\n|\r|\n", buf)) and (m.end() < len(buf) or m.group() != b"\r"):
            text, newline = buf[: m.start()].decode(errors="replace").strip(), m.group() != b"\r"
            buf = buf[m.end():]
            if not text:
                continue
            if newline:
                pending = ""
                lines.append(text)
                emit(text)
            elif time.monotonic() - last_redraw >= redraw_every_s:
                pending, last_redraw = "", time.monotonic()
                emit(text)
            else:
                pending = text
    for text in (pending, buf.decode(errors="replace").strip()):
        if text:
            lines.append(text)
            emit(text)
    return proc.wait(), lines


@task(retries=1, retry_delay_seconds=5, task_run_name="stage-{stage}")
def run_stage(stage: str, workdir: str, env: dict[str, str]) -> dict[str, Any]:
    """``dvc repro --single-item <stage>``: DVC decides whether the stage is stale and runs it; its output is logged
    line by line as it comes, each line with the stage's name."""
    log = get_run_logger()
    t0 = time.perf_counter()

    def emit(line: str) -> None:
        if "Warning" not in line:
            log.info("%s | %s", stage, line)

    code, lines = stream([sys.executable, "-m", "dvc", "repro", "--single-item", stage], workdir, env, emit)
    if code != 0:
        raise RuntimeError(f"stage {stage!r} failed (exit {code}); see the log above")
    skipped = any("didn't change, skipping" in line for line in lines)
    return {"stage": stage, "status": "up to date" if skipped else "ran", "seconds": time.perf_counter() - t0}


@flow(name="mobilerl", log_prints=True)
def mobilerl(preset: str | None = None, overrides: dict[str, Any] | None = None, stages: list[str] | None = None,
             isolated: bool = False, keep_workdir: bool = False, cluster: str | None = None) -> dict[str, Any]:
    """Run the MobileRL pipeline (all of dvc.yaml, or ``stages`` and what they depend on); ``cluster`` points the
    `rl` stage at env servers (configs/clusters/<name>.yaml; None: the in-process simulator)."""
    from prefect.runtime import flow_run

    from mobilerl import tracking

    log = get_run_logger()
    merged = load_overrides(preset, None)
    merged.update(load_cluster(cluster) if cluster else {})
    merged.update(overrides or {})
    name = preset or "default"
    workdir = isolated_copy() if isolated else ROOT
    apply_overrides(workdir / "params.yaml", merged)
    order = stage_order(workdir, stages)
    log.info("preset %s, %d stage(s) in DVC order: %s", name, len(order), " → ".join(order))
    env = {**os.environ, **OFFLINE_ENV,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "MLFLOW_TRACKING_URI": tracking.tracking_uri(),
           tracking.FLOW_RUN_ENV: str(flow_run.get_id() or "")}
    results = []
    with tracking.pipeline_run(f"pipeline/{name}", {"preset": name, **merged}) as run:
        env[tracking.PARENT_ENV] = run.info.run_id
        for stage in order:
            results.append(run_stage(stage, str(workdir), env))
    report = workdir / "reports" / "report.md"
    summary = {"preset": name, "workdir": str(workdir), "mlflow_parent_run_id": run.info.run_id,
               "stages": results, "report": str(report) if report.exists() else None,
               "mlflow_ui": "make ui  (http://127.0.0.1:5000)"}
    for r in results:
        log.info("%-22s %-11s %7.1fs", r["stage"], r["status"], r["seconds"])
    log.info("report: %s", summary["report"])
    log.info("MLflow: parent run %s; browse with %s", run.info.run_id, summary["mlflow_ui"])
    if isolated and not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        summary["workdir"] = None
    return summary


if __name__ == "__main__":
    mobilerl(preset=sys.argv[1] if len(sys.argv) > 1 else None)
