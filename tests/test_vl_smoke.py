"""The paper's screenshot configuration on CPU: the ``vl_smoke`` profile (Qwen2.5-VL class, screenshot+xml, pixel
bounds, the full prompt; tiny random weights built from config) through every stage of the DAG, RL's rows rebuilt
from kept screenshots, and the released-checkpoint evaluation in the official MobileRL format through
``serve_openai``."""

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

from pipelines.flow import OFFLINE_ENV, ROOT, apply_overrides, isolated_copy, load_overrides

VL = "Qwen2_5_VLForConditionalGeneration"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": ""}


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _changed(a: dict, b: dict, prefix: str) -> bool:
    keys = [k for k in a if k.startswith(prefix)]
    assert keys, prefix
    return any(not a[k].equal(b[k]) for k in keys)


def _copy_built_weights(work: Path) -> None:
    """The profile's weights as the isolated copy would build them (the same build: same record), to spare the
    copy a second build of what this checkout built already."""
    from mobilerl.models.profiles import load_profile
    from mobilerl.models.random_init import ensure_weights

    src = ensure_weights(load_profile("vl_smoke"))
    shutil.copytree(src, work / src.relative_to(ROOT))


def _repro(work: Path, env: dict[str, str], *args: str) -> dict[str, float]:
    """``dvc repro ARGS`` in ``work``; the seconds of each stage it ran (from its "Running stage" lines)."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", *args], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds: dict[str, float] = {}
    lines: list[str] = []
    stage, t0 = None, time.perf_counter()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        m = re.match(r"Running stage '([^']+)'", line)
        if m:
            now = time.perf_counter()
            if stage is not None:
                seconds[stage] = now - t0
            stage, t0 = m.group(1), now
    if stage is not None:
        seconds[stage] = time.perf_counter() - t0
    assert proc.wait() == 0, "".join(lines[-60:])
    return seconds


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~3 min on 2 idle cores; far more beside other CPU-bound work
def test_vl_smoke_dag_on_screenshots(tmp_path):
    """Every stage of dvc.yaml with the vl_smoke preset, then `rl` again asynchronously: screenshots are stored,
    trained on (both SFT stages, the judge), shown to the RL policy and the evaluated checkpoints."""
    from mobilerl.data.store import iter_store

    work = isolated_copy()
    try:
        apply_overrides(work / "params.yaml", load_overrides("vl_smoke", None))
        _copy_built_weights(work)
        env = _env(tmp_path)
        seconds = _repro(work, env)  # every stage, DVC's order (Prefect and MLflow nesting: test_pipeline.py)
        apply_overrides(work / "params.yaml", {"rl.async": {"max_staleness": 1}, "rl.tis_cap": 2.0})
        seconds["rl (async)"] = _repro(work, env, "--single-item", "rl")["rl"]
        print("stage seconds:", {k: round(v, 1) for k, v in seconds.items()})
        data = work / "data"
        assert set(seconds) >= {"tasks", "collect", "sft_reasoning_free", "reasoning_refine", "sft_reasoning",
                                "reward_model", "rl", "evaluate", "report"}

        # collection stored (masked) screenshots of every step
        steps = [s for t in iter_store(data / "collect" / "stores" / "collected") for s in t.steps]
        assert steps and all(s.screenshot_path for s in steps)
        assert all((data / "collect" / "stores" / "collected" / s.screenshot_path).is_file() for s in steps)

        # both SFT stages trained on images through LLaMA-Factory: rows with images, and the vision tower
        # (trainable here) moved, which only a gradient through pixel_values does; the projector stayed frozen
        base = _weights(work / ".cache" / "models" / "vl_smoke")
        for dataset, ckpt, init in (("sft/dataset", "sft_reasoning_free", base),
                                    ("reasoning/refine", "sft_reasoning", None)):
            rows = json.loads((data / dataset / "train.json").read_text())
            assert rows and all(r["images"] and "<image>" in r["messages"][1]["content"] for r in rows)
            assert all((data / dataset / r["images"][0]).is_file() for r in rows)
            out = data / "checkpoints" / ckpt
            assert json.loads((out / "config.json").read_text())["architectures"] == [VL]
            after = _weights(out)
            before = init if init is not None else _weights(data / "checkpoints" / "sft_reasoning_free")
            assert _changed(before, after, "visual.patch_embed") and _changed(before, after, "visual.blocks")
            assert not _changed(before, after, "visual.merger")

        # the judge trained on and scored the rendered trace images
        judge_rows = json.loads((data / "reward" / "dataset" / "train.json").read_text())
        assert judge_rows and all(r["images"] and r["messages"][1]["content"].startswith("<image>")
                                  for r in judge_rows)
        assert json.loads((data / "checkpoints" / "reward_model" / "reward_model.json").read_text())["view"] == "image"
        assert _changed(base, _weights(data / "checkpoints" / "reward_model"), "visual.blocks")
        reward = json.loads((data / "reward" / "metrics.json").read_text())
        assert reward["n"] >= 2 and list((data / "reward" / "eval" / "examples").glob("*.png"))
        # the SFT policy's traces saw the screen on tasks whose screenshots the judge's test set does not keep
        sft_traces = list(iter_store(data / "reward" / "traces" / "stores" / "sft_reasoning_free_test"))
        assert sft_traces and all(t.error is None and all(s.screenshot_path for s in t.steps) for t in sft_traces)

        # rl: both modes ran their rounds on screenshots (a screenshot-less policy stops a round with its error)
        curve = [json.loads(x) for x in (data / "checkpoints" / "adagrpo.curve.jsonl").read_text().splitlines()]
        assert [c["round"] for c in curve] == [0, 1] and all(c["rollout/episodes"] == 4 for c in curve)
        assert "async/staleness_max" in curve[-1] and max(c["async/staleness_max"] for c in curve) <= 1
        assert sum(c["screens/pruned"] for c in curve) > 0 and not (work / ".cache" / "rl" / "screens").exists()
        assert json.loads((data / "checkpoints" / "adagrpo" / "config.json").read_text())["architectures"] == [VL]

        # evaluate scored every checkpoint, online and offline, none failing for want of a screenshot
        summary = json.loads((data / "eval" / "summary.json").read_text())
        checkpoints = {"sft_random_init", "sft_reasoning_free", "sft_reasoning", "adagrpo"}
        assert set(summary) == {"oracle", "random"} | checkpoints
        assert all(s["world"]["eval/n_trajectories"] >= 1 and s["world"]["eval/n_errors"] == 0 for s in summary.values())
        for f in (data / "eval" / "trajectories").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                assert json.loads(line).get("error") is None, (f.name, line[:300])
        offline = json.loads((data / "eval" / "offline.json").read_text())
        assert all(offline[p]["androidcontrol/high/n_steps"] > 0 for p in checkpoints)
        assert (work / "reports" / "report.md").is_file()
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    m = update(model, rows, SingleProcess(model, opt, 1.0), s, backend.pad_id, "token-mean", None, 16384,
               backend.image_inputs)
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
            "evaluate.pass_k": {"policies": []}})
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
