"""The reward-model stages end to end, run the way DVC runs them (``python -m stages.<name>``) in a temporary copy
of the code with three lab templates a split, the tiny base, a few LLaMA-Factory steps and its own MLflow store:
reward_traces → reward_model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ("LabSettingsDisableNotifications", "LabClockCountdownNoStart", "LabCalendarAddNote")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from mobilerl.env.sim.tasks.registry import get_task
    from pipelines.flow import apply_overrides

    work = tmp_path_factory.mktemp("reward-stages")
    for folder in ("stages", "mobilerl", "configs", "models/tiny-base"):
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "params.yaml", work / "params.yaml")
    suites = work / "data" / "tasks" / "suites"
    suites.mkdir(parents=True)
    for split in ("train", "test"):
        lines = [json.dumps(get_task(f"lab/{split}/{t}/0", with_optimal=False).to_dict()) for t in TEMPLATES]
        (suites / f"lab_{split}.jsonl").write_text("\n".join(lines) + "\n")
    apply_overrides(work / "params.yaml", {
        "reward_traces.train_per_template": 1, "reward_traces.test_per_template": 1,
        "reward_traces.slip_rates": [0.5], "reward_traces.checkpoints": {}, "reward_traces.test_screenshot_tasks": 1,
        "reward_traces.audit_ocr_images": 1,
        "reward_model.base": "models/tiny-base",  # no SFT checkpoint here
        "reward_model.overrides": {"max_steps": 3, "per_device_train_batch_size": 2, "warmup_ratio": 0.0},
        "reward_model.examples": 1})
    env = {k: v for k, v in os.environ.items() if k not in ("MOBILERL_PARENT_RUN_ID", "PYTHONPATH")}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")

    def run(stage: str) -> str:
        proc = subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=540)
        assert proc.returncode == 0, f"{stage} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return proc.stdout

    run.work = work  # type: ignore[attr-defined]
    run.env = env  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def traces(repo):
    repo("reward_traces")
    return repo.work / "data" / "reward" / "traces"


@pytest.mark.timeout(900)
def test_reward_traces_are_labelled_balanced_split_by_task_and_audited(repo, traces):
    from mobilerl.data.store import iter_store
    from mobilerl.reward.traces import read_index

    m = json.loads((repo.work / "data" / "reward" / "traces.json").read_text())
    rows = read_index(traces)
    for split in ("train", "test"):
        kept = [r for r in rows if r["split"] == split]
        assert len(kept) == m[split]["kept"] > 0 and 2 * sum(r["label"] for r in kept) == len(kept)  # balanced
        assert all(r["task_id"].startswith(f"lab/{split}/") for r in kept)
    assert not {r["task_id"] for r in rows if r["split"] == "train"} & {r["task_id"] for r in rows if r["split"] == "test"}
    assert m["privacy"]["passed"] and (traces / "privacy_report.json").is_file()
    assert {s.removesuffix("_train").removesuffix("_test") for s in m["stores"]} == {
        "oracle", "noisy_0.5", "oracle_early_finish", "random"}
    shots = {t.task_id for s in m["stores"] for t in iter_store(traces / "stores" / s)
             if any(st.screenshot_path for st in t.steps)}
    assert len(shots) == 1 and next(iter(shots)).startswith("lab/test/")  # test_screenshot_tasks: 1
    oracle = {t.task_id: t for t in iter_store(traces / "stores" / "oracle_train")}
    assert all(t.reward is not None for t in oracle.values()) and any(t.success for t in oracle.values())  # hidden check


@pytest.mark.timeout(900)
def test_reward_model_trains_registers_and_reports_against_baselines(repo, traces):
    import mlflow
    from mlflow import MlflowClient

    from mobilerl.reward.judge import RewardModel
    from mobilerl.reward.train import load_traces

    out = repo("reward_model")
    assert "held-out accuracy" in out
    m = json.loads((repo.work / "data" / "reward" / "metrics.json").read_text())
    n_test = json.loads((repo.work / "data" / "reward" / "traces.json").read_text())["test"]["kept"]
    assert m["n"] == n_test and sum(m["confusion"].values()) == n_test
    assert {"accuracy", "precision", "recall", "f1"} <= set(m) and set(m["baselines"]) == {"majority_class",
                                                                                         "ended_with_finish"}
    assert set(m["by_source"]) <= {"oracle", "noisy_0.5", "oracle_early_finish", "random"}
    assert m["train"]["steps"] == 3 and m["dataset"]["records"] > 0
    ckpt = repo.work / "data" / "checkpoints" / "reward_model"
    assert 0 < m["threshold"] < 1 and json.loads((ckpt / "reward_model.json").read_text())["threshold"] == m["threshold"]
    assert sum(b["n"] for b in m["calibration"]["bins"]) == n_test and 0 <= m["calibration"]["ece"] <= 1
    mlflow.set_tracking_uri(repo.env["MLFLOW_TRACKING_URI"])
    assert MlflowClient().get_model_version_by_alias("mobilerl-reward-model", "reward-model").version == \
        m["registered_version"]
    preds = (repo.work / "data" / "reward" / "eval" / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == n_test and list((repo.work / "data" / "reward" / "eval" / "examples").glob("*.png"))
    items = load_traces(traces, "test")[:3]
    scores = RewardModel.from_checkpoint(ckpt).score([t for t, _, _ in items], [r for _, _, r in items])
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    records = json.loads((repo.work / "data" / "reward" / "dataset" / "train.json").read_text())
    assert all(r["messages"][2]["content"] in ("0", "1") for r in records)  # answer: score
