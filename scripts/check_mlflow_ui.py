"""`make ui` as a new browser sees it: headless Chromium (an empty profile) opens the MLflow UI's start page, clicks the
`mobilerl` experiment and must land on its training runs (the pipeline run, its nested stage runs), not on the GenAI
overview; then the RL run's page must show its episode images. The store is a small one made here the way the
stages log (mobilerl.tracking); the server is `make ui`'s (mlflow server --app-name mobilerl).

    .venv/bin/python scripts/check_mlflow_ui.py [--chromium /usr/bin/chromium] [--screenshot ui.png]

Needs Chromium (Debian: apt-get install chromium) and Playwright (pip install playwright); exits 0 when the page
is right, 1 with what it saw otherwise. tests/test_mlflow_ui.py runs it where both are present.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def make_store(folder: Path) -> tuple[str, str, str]:
    """A tracking store like a pipeline run's: a parent run, nested stage runs, an RL run with metrics and images;
    returns (tracking URI, experiment id, RL run id)."""
    os.environ["MLFLOW_TRACKING_URI"] = uri = f"sqlite:///{folder / 'mlflow.db'}"
    from PIL import Image

    from mobilerl import tracking

    with tracking.pipeline_run("pipeline/default", {"preset": "default"}):  # stage runs nest under it
        with tracking.stage_run("sft_reasoning_free", {"lr": 1e-3}):
            tracking.log_metrics({"sft/final_loss": 0.5})
        with tracking.stage_run("rl", {"rounds": 3}) as rl:
            for r in range(3):
                tracking.log_metrics({"rollout/success": 0.1 * r}, step=r)
            tracking.log_images({"episodes/failure": Image.new("RGB", (64, 32), "white")}, step=0)
    return uri, rl.info.experiment_id, rl.info.run_id


def serve(uri: str, folder: Path, app: str | None = "mobilerl") -> tuple[subprocess.Popen, str]:
    """``make ui``'s server on a free port (``app`` None: plain ``mlflow server``); returns it and its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen([str(mlflow), "server", *(["--app-name", app] if app else []), "--workers", "1",
                             "--host", "127.0.0.1", "--port", str(port), "--backend-store-uri", uri, "--default-artifact-root",
                             (folder / "artifacts").as_uri()], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"mlflow server did not come up on {base}")


def check(base: str, experiment_id: str, rl_run: str, chromium: str, screenshot: Path | None,
          plain: bool = False) -> list[str]:
    """What is wrong with the pages the new browser lands on (empty: nothing)."""
    from playwright.sync_api import Error, sync_playwright

    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()  # an empty profile
        page.goto(base + "/", wait_until="load")
        link = page.get_by_role("link", name="mobilerl", exact=True).first
        link.wait_for(timeout=60_000)
        if not plain and "collects usage data" in page.inner_text("body"):
            problems.append("the start page asks about the UI's usage telemetry: its default (off) was not set")
        link.click()
        try:  # the parent run, and the count with its two nested runs
            page.get_by_text("pipeline/default").first.wait_for(timeout=30_000)
            page.get_by_text("3 matching runs").wait_for(timeout=10_000)
        except Error:
            pass
        text = page.inner_text("body")
        if screenshot is not None:
            page.screenshot(path=str(screenshot))
        if "/runs?workflowType=machine_learning" not in page.url or "No data available" in text:
            problems.append(f"landed on {page.url}, not the training runs: {' | '.join(text.split()[:60])}")
        elif "pipeline/default" not in text or "3 matching runs" not in text:
            problems.append(f"the runs page lacks the pipeline run or its nested runs: {' | '.join(text.split()[:80])}")
        page.goto(f"{base}/#/experiments/{experiment_id}/runs/{rl_run}/artifacts", wait_until="load")
        try:
            page.get_by_text("images", exact=True).first.wait_for(timeout=30_000)
        except Error:
            problems.append("the RL run's artifacts show no images folder")
        browser.close()
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--screenshot", type=Path)
    ap.add_argument("--plain", action="store_true", help="plain `mlflow server` (the control: it must fail)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mobilerl-ui-") as tmp:
        uri, experiment_id, rl_run = make_store(Path(tmp))
        proc, base = serve(uri, Path(tmp), None if args.plain else "mobilerl")
        try:
            problems = check(base, experiment_id, rl_run, args.chromium, args.screenshot, args.plain)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print("ok: a new browser lands on the mobilerl experiment's training runs")


if __name__ == "__main__":
    main()
