"""MLflow in one place: where runs go, the pipeline's parent run, one nested run per stage, registry.

Default: a local SQLite store and artifact folder under ``mlruns/`` (offline, nothing to start). Set
``MLFLOW_TRACKING_URI`` to use a server instead. A pipeline run (the Prefect flow) opens a parent run and
passes its id to stage processes in ``MOBILERL_PARENT_RUN_ID``; each stage then logs into a nested run
tagged with the git SHA, the stage's DVC lock hash and the Prefect flow-run id. A stage run on its own
(``dvc repro``, ``python -m stages.x``) gets a top-level run with the same tags.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "mobilerl"
PARENT_ENV = "MOBILERL_PARENT_RUN_ID"
# The experiment's kind, as MLflow 3's UI names it (its JS: CUSTOM_MODEL_DEVELOPMENT): UIs that read the tag open the
# experiment on its training runs. 3.17.2's UI ignores it (a feature flag fixed on) and follows its own GenAI /
# Model training switch, per browser, GenAI by default: ui_url() says Model training in the link.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
FLOW_RUN_ENV = "MOBILERL_PREFECT_FLOW_RUN_ID"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}"


def setup() -> str:
    """Point MLflow at the project's store and make sure the experiment exists; returns its id."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri()
    db_dir = Path(uri[len("sqlite:///"):]).parent if uri.startswith("sqlite:///") else None
    if db_dir is not None:
        db_dir.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(EXPERIMENT)
    kind, value = EXPERIMENT_KIND
    if exp is None:
        # artifacts beside the database (the default: mlruns/artifacts), so a store elsewhere (a test's,
        # a temporary pipeline copy's) keeps its artifacts, checkpoints included, out of the workspace
        artifacts = (db_dir / "artifacts").as_uri() if db_dir is not None else None
        return mlflow.create_experiment(EXPERIMENT, artifact_location=artifacts, tags={kind: value})
    if exp.tags.get(kind) != value:  # a store created before the tag was set
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, kind, value)
    return exp.experiment_id


def ui_url(experiment_id: str, search: str | None = None, base: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs (those matching ``search``, MLflow's filter syntax), as charts, in the MLflow UI (``make
    ui``), on its Model training side: MLflow 3.17's UI opens an experiment on the GenAI overview unless the
    browser's switch (top left) or the link says so."""
    url = f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&compareRunsMode=CHART"
    return url + (f"&searchFilter={quote(search)}" if search else "")


def compare_url(experiment_id: str, run_ids: list[str], base: str = "http://127.0.0.1:5000") -> str:
    """MLflow's run comparison page for ``run_ids``: their params and metrics in columns, side by side."""
    return f"{base}/#/compare-runs?runs={quote(json.dumps(run_ids))}&experiments={quote(json.dumps([experiment_id]))}"


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def dvc_lock_hash(stage: str) -> str:
    """A short hash of the stage's entry in dvc.lock (what DVC recorded for its deps/params/outs)."""
    lock = ROOT / "dvc.lock"
    if not lock.exists():
        return "none"
    import yaml

    entry = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get(stage)
    if entry is None:
        return "none"
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]


def flatten(d: Mapping[Any, Any], sep: str = ".") -> dict[str, Any]:
    """Nested mappings as one level, keys joined by ``sep``: ``{"a": {"b": 1}}`` → ``{"a.b": 1}``
    (params.yaml overrides, MLflow params; evaluation summaries with ``sep="/"``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            for k2, v2 in flatten(v, sep).items():
                out[f"{k}{sep}{k2}"] = v2
        else:
            out[f"{k}"] = v
    return out


def common_tags(stage: str | None = None) -> dict[str, str]:
    tags = {"mobilerl.git_sha": git_sha(), "mobilerl.prefect_flow_run_id": os.environ.get(FLOW_RUN_ENV, "")}
    if stage:
        tags["mobilerl.stage"] = stage
        tags["mobilerl.dvc_lock_hash"] = dvc_lock_hash(stage)
    return tags


@contextmanager
def stage_run(stage: str, params: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A (nested, when a pipeline run is open) MLflow run for one stage; yields the active run."""
    import mlflow

    experiment_id = setup()
    parent = os.environ.get(PARENT_ENV) or None
    with mlflow.start_run(experiment_id=experiment_id, run_name=stage, nested=parent is not None,
                          parent_run_id=parent, tags=common_tags(stage)) as run:
        if params:
            flat = {k: (json.dumps(v) if isinstance(v, list | tuple) else v) for k, v in flatten(params).items()}
            mlflow.log_params({k: str(v)[:6000] for k, v in flat.items()})
        yield run


@contextmanager
def child_run(name: str, stage: str, **tags: str) -> Iterator[Any]:
    """A run nested in the active stage run (same experiment), e.g. one per policy × benchmark."""
    import mlflow

    active = mlflow.active_run()
    if active is None:
        raise RuntimeError("child_run needs an active stage run")
    with mlflow.start_run(experiment_id=active.info.experiment_id, run_name=name, nested=True,
                          tags={**common_tags(stage), **{f"mobilerl.{k}": v for k, v in tags.items()}}) as run:
        yield run


@contextmanager
def pipeline_run(name: str, params: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """The parent run of one pipeline execution; sets ``MOBILERL_PARENT_RUN_ID`` for stage processes."""
    import mlflow

    experiment_id = setup()
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, tags=common_tags()) as run:
        if params:
            mlflow.log_params({k: str(v)[:6000] for k, v in flatten(params).items()})
        old = os.environ.get(PARENT_ENV)
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run
        finally:
            if old is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = old


def log_run(name: str, parent_run_id: str, params: Mapping[str, Any], tags: Mapping[str, str],
            curve: list[Mapping[str, Any]], metrics: Mapping[str, Any], failed: bool = False) -> str:
    """A finished run nested under ``parent_run_id``, logged from records: each ``curve`` row's numeric keys at
    step ``row["round"]``, then ``metrics`` (flattened, step 0); returns its id. Cells of the ablation study log
    this way after they end, so a resumed or skipped cell still shows its whole curve."""
    import time

    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    experiment_id = setup()
    client = MlflowClient()
    run = client.create_run(experiment_id, run_name=name,
                            tags={"mlflow.parentRunId": parent_run_id, **common_tags(), **tags})
    rid = run.info.run_id
    now = int(time.time() * 1000)
    rows = [(int(r["round"]), {k: v for k, v in r.items() if k != "round"}) for r in curve]
    ms = [Metric(metric_key(k), float(v), now, step) for step, row in [*rows, (0, flatten(metrics))]
          for k, v in flatten(row).items() if isinstance(v, int | float) and not isinstance(v, bool) and v == v]
    ps = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
    for i in range(0, len(ps), 100):  # log_batch takes at most 100 params, 1000 metrics
        client.log_batch(rid, params=ps[i:i + 100])
    for i in range(0, len(ms), 1000):
        client.log_batch(rid, metrics=ms[i:i + 1000])
    client.set_terminated(rid, "FAILED" if failed else "FINISHED")
    return rid


def metric_key(key: str) -> str:
    """MLflow accepts letters, digits, ``_ - . / `` and spaces in metric names: ``pass@4`` → ``pass_at_4``."""
    key = key.replace(".", "/").replace("@", "_at_")
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", key)


def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Log the numeric leaves of a (nested) mapping; keys are namespaced with '/'."""
    import mlflow

    flat = {metric_key(k): float(v) for k, v in flatten(metrics).items()
            if isinstance(v, int | float) and not isinstance(v, bool) and v == v}
    if flat:
        mlflow.log_metrics(flat, step=step)


def log_images(images: Mapping[str, Any], step: int | None = None) -> None:
    """Log PIL images under their keys (MLflow's image view: one slider a key over the steps) to the active run;
    with none, an error (MLflow would start a run of its own, left open)."""
    import mlflow

    if images and mlflow.active_run() is None:
        raise RuntimeError("tracking.log_images needs an active run (a stage's or a child run)")
    for key, img in images.items():
        mlflow.log_image(img, key=metric_key(key), step=step)


def register_model(model_dir: Path, name: str, alias: str) -> str:
    """Log ``model_dir`` as the active run's artifact, register it as ``name`` and point ``alias`` at it.

    The version's source is the run's ``model`` artifact folder (an HF checkpoint, not an MLflow-flavoured
    model: ``mlflow.register_model("runs:/…")`` wants an ``MLmodel`` file or a LoggedModel in MLflow 3)."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    run = mlflow.active_run()
    assert run is not None, "register_model needs an active run"
    mlflow.log_artifacts(str(model_dir), artifact_path="model")
    client = MlflowClient()
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    version = client.create_model_version(name, source=mlflow.get_artifact_uri("model"), run_id=run.info.run_id)
    client.set_registered_model_alias(name, alias, version.version)
    return version.version
