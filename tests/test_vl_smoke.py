"""The paper's screenshot configuration on CPU: the ``vl_smoke`` profile (Qwen2.5-VL class, screenshot+xml, pixel
bounds, the full prompt; tiny random weights built from config): RL's rows rebuilt from kept screenshots, and the
released-checkpoint evaluation in the official MobileRL format through ``serve_openai``. Every stage of the DAG on
it: tests/test_pipeline.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.flow import OFFLINE_ENV, ROOT, apply_overrides, isolated_copy

VL = "Qwen2_5_VLForConditionalGeneration"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": ""}


def test_rl_rows_rebuild_screenshot_prompts(tmp_path):
    """RL on screenshots: a rollout keeps each step's screenshot, the trainer rebuilds the prompt with it and its
    forward (pixel_values, M-RoPE from the image grid) gives the rollout's logprobs back, which the same forward
    without the image does not; the update's gradient reaches the vision tower."""
    import dataclasses

    import torch

    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.eval.runner import evaluate_sync
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.profiles import load_profile
    from mobilerl.models.random_init import ensure_weights
    from mobilerl.rl.batch import PromptFormat, collate, rows_logprobs, trajectory_rows
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.update import SingleProcess, update

    profile = load_profile("vl_smoke")
    g = profile.generation
    backend = HFBackend.from_pretrained(ensure_weights(profile), device="cpu")
    assert type(backend.model).__name__ == VL
    policy = ModelPolicy(backend, obs_mode=g.obs_mode, prompt_style=g.prompt_style, coords=g.coords,
                         max_history=g.max_history, sampling=SamplingConfig(temperature=1.0, max_new_tokens=6, seed=0))
    task = dataclasses.replace(get_task("world/train/CameraTakePhoto/0", with_optimal=False), complexity=0.2)
    [traj] = evaluate_sync(policy.with_seed, [task], obs_mode=g.obs_mode, progress=False,
                           keep_screenshots_dir=tmp_path / "screens")  # as the rollout workers keep them
    assert traj.error is None and traj.n_steps == 2 and all(s.screenshot_path for s in traj.steps)
    fmt = PromptFormat(g.obs_mode, g.prompt_style, g.max_history, g.coords)
    rows = trajectory_rows(traj, 1.0, fmt, backend.prompt_ids)
    assert len(rows) == 2 and all(r.images for r in rows)
    batch = collate(rows, backend.pad_id, vision=backend.image_inputs)
    with torch.no_grad():
        lp, _ = rows_logprobs(backend.model, batch, 1.0)
        blind, _ = rows_logprobs(backend.model, {k: v for k, v in batch.items() if "pixel" not in k
                                                 and k != "image_grid_thw"}, 1.0)
    gap = ((lp - batch["behaviour_logprobs"]).abs() * batch["response_mask"]).max().item()
    assert gap <= 1e-4
    # random weights answer nearly uniformly whatever they see, so the image's share is small, but far above noise
    assert ((blind - batch["behaviour_logprobs"]).abs() * batch["response_mask"]).max().item() > 20 * max(gap, 1e-5)
    with pytest.raises(ValueError, match="no vision encoder"):
        collate(rows, backend.pad_id)
    model = backend.model
    before = model.model.visual.patch_embed.proj.weight.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    s = profile.rl.model_copy(update={"kl_coef": 0.0})
    m = update(model, rows, SingleProcess(model, opt, 1.0), s, backend.pad_id, "token-mean", RLConfig().algo,
               16384, backend.image_inputs)
    assert m["loss/logprob_gap_max"] <= 1e-3
    assert not model.model.visual.patch_embed.proj.weight.equal(before)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve_openai exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


@pytest.mark.timeout(300)
def test_vl_smoke_released_checkpoint_evaluated_in_the_official_format(tmp_path):
    """A user evaluating the released checkpoint: serve it (`serve_openai`, 127.0.0.1), point a profile in the
    official MobileRL format at it (prompt_style mobilerl, 0-999 answers) and run the `evaluate` stage: per-task
    results, every episode on the screen (no policy error), through the env factory's rendering simulator."""
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.models.profiles import load_profile
    from mobilerl.models.random_init import ensure_weights

    weights = ensure_weights(load_profile("vl_smoke"))
    port = _free_port()
    t_start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "mobilerl.models.serve_openai", str(weights), "--port", str(port),
                               "--name", "VL-Smoke", "--device", "cpu"], env=_env(tmp_path), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    work = isolated_copy()
    try:
        profile = (ROOT / "configs" / "models" / "vl_smoke_mobilerl.yaml").read_text()
        (work / "configs" / "models" / "vl_smoke_mobilerl.yaml").write_text(
            re.sub(r"base_url: \S+", f"base_url: http://127.0.0.1:{port}/v1", profile))
        lists = work / "data" / "tasks" / "suites"  # two world/test tasks (the tasks stage's list format)
        lists.mkdir(parents=True)
        tasks = [get_task(f"world/test/{name}/0") for name in ("CameraTakePhoto", "ClockEarliestAlarmQuery")]
        (lists / "world_test.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
        apply_overrides(work / "params.yaml", {
            "evaluate.profile": "vl_smoke_mobilerl", "evaluate.suites": ["world"], "evaluate.policies": ["vl"],
            "evaluate.checkpoints": {"vl": {"path": "VL-Smoke", "max_new_tokens": 12}},
            "evaluate.max_per_template": 1, "evaluate.model_max_tasks": 2, "evaluate.model_processes": 1,
            "evaluate.pass_k": {"policies": []}, "evaluate.world_all": []})
        _wait_healthy(f"http://127.0.0.1:{port}/health", server)
        t_up = time.perf_counter() - t_start
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "stages.evaluate"], cwd=work, env=_env(tmp_path),
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        print(f"evaluate stage: {time.perf_counter() - t0:.1f}s, server up after {t_up:.1f}s")
        trajs = [json.loads(x) for x in (work / "data" / "eval" / "trajectories" / "vl__world.jsonl")
                 .read_text().splitlines()]
        assert len(trajs) == 2 and len({t["task_id"] for t in trajs}) == 2
        assert all(t.get("error") is None and t["steps"] for t in trajs), [t.get("error") for t in trajs]
        summary = json.loads((work / "data" / "eval" / "summary.json").read_text())
        assert summary["vl"]["world"]["eval/n_trajectories"] == 2 and summary["vl"]["world"]["eval/n_errors"] == 0
        assert json.loads((work / "data" / "eval" / "offline.json").read_text()) == {}  # no raw dumps offline
        assert "no offline step evaluation for profile vl_smoke_mobilerl" in run.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
