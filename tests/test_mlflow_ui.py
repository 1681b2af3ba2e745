"""`make ui`: MLflow's server with the project's app (mobilerl/mlflow_app.py), as a new browser sees it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_mlflow_ui  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_make_uis_server_is_mlflows_and_its_page_defaults_a_new_browser_to_model_training(tmp_path, monkeypatch):
    from mobilerl.mlflow_app import WORKFLOW_KEY

    for var in ("MOBILERL_PARENT_RUN_ID", "MLFLOW_TRACKING_URI"):  # make_store sets them: restored after the test
        monkeypatch.delenv(var, raising=False)
    uri, experiment_id, _ = check_mlflow_ui.make_store(tmp_path)
    proc, base = check_mlflow_ui.serve(uri, tmp_path)
    try:
        page = httpx.get(f"{base}/", timeout=30).text
        assert f"localStorage.getItem('{WORKFLOW_KEY}')===null" in page and page.count(WORKFLOW_KEY) == 2
        assert "<div id=\"root\">" in page or "id=\"root\"" in page  # MLflow's own page, only the default added
        found = httpx.post(f"{base}/ajax-api/2.0/mlflow/runs/search", json={"experiment_ids": [experiment_id]},
                           timeout=30).json()  # the API behind it is MLflow's
        assert sorted(r["info"]["run_name"] for r in found["runs"]) == ["pipeline/default", "rl", "sft_reasoning_free"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.skipif(CHROMIUM is None or importlib.util.find_spec("playwright") is None,
                    reason="needs Chromium (apt-get install chromium) and Playwright (pip install playwright)")
def test_a_new_browser_lands_on_the_training_runs_and_plain_mlflow_would_not():
    ours = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_mlflow_ui.py"), "--chromium", CHROMIUM],
                          capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stdout + ours.stderr[-2000:]
    plain = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_mlflow_ui.py"), "--chromium", CHROMIUM,
                            "--plain"], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 1 and "workflowType=genai" in plain.stdout, plain.stdout  # the check can fail


def test_images_go_to_the_active_run_and_without_one_are_an_error(tmp_path, monkeypatch):
    import mlflow
    from PIL import Image

    from mobilerl import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracking.setup()
    img = {"episodes/failure": Image.new("RGB", (8, 8))}
    with pytest.raises(RuntimeError, match="needs an active run"):
        tracking.log_images(img, step=0)
    assert mlflow.active_run() is None and not mlflow.search_runs(experiment_names=["mobilerl"], output_format="list")
    with mlflow.start_run() as run:
        tracking.log_images(img, step=3)
    logged = [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "images")]
    assert any("+step+3+" in p and p.endswith(".png") for p in logged), logged
