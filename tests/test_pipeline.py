"""Orchestration: the DVC DAG, the Prefect flow (the whole DAG once, on the vl_smoke preset), MLflow runs, params."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mobilerl.config import ParamsError, StageConfig, load_params
from pipelines.flow import ROOT, apply_overrides, load_cluster, load_overrides, stage_order


def test_dag_matches_stage_modules():
    dag = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    modules = {p.stem for p in (ROOT / "stages").glob("*.py")} - {"__init__", "common"}
    used = set()
    for name, stage in dag.items():
        # `python -m stages.<module>`, or `python -m stages.<module> <section>` for a second instance of a
        # stage (sft_random_init runs sft_reasoning_free's code on its own params section)
        cmd = stage["cmd"].split()
        assert cmd[:2] == ["python", "-m"] and cmd[2].startswith("stages.")
        module = cmd[2].removeprefix("stages.")
        assert cmd[3:] in ([], [name]) and (module == name or cmd[3:] == [name])
        assert f"stages/{module}.py" in stage["deps"]
        used.add(module)
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        for section in stage.get("params", []):
            assert section in params, f"{name} reads params section {section!r} that params.yaml lacks"
    assert used == modules


def test_stage_order_is_dvc_order():
    order = stage_order()
    dag = {k: v for k, v in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()
           if not v.get("frozen")}  # frozen stages are rebuilt on purpose, never by the flow
    assert sorted(order) == sorted(dag)
    outs = {}
    for name, stage in dag.items():
        for o in stage.get("outs", []) + stage.get("metrics", []):
            outs[o if isinstance(o, str) else next(iter(o))] = name
    for name, stage in dag.items():  # every producer comes before its consumer
        for d in stage["deps"]:
            if d in outs:
                assert order.index(outs[d]) < order.index(name), (d, outs[d], name)
    assert stage_order(targets=["evaluate"])[-1] == "evaluate"
    with pytest.raises(ValueError, match="unknown stage"):
        stage_order(targets=["nope"])


def test_params_errors_name_the_key(tmp_path):
    class Cfg(StageConfig):
        n: int = 1

    p = tmp_path / "params.yaml"
    p.write_text("s:\n  n: 2\n  typo: 3\n")
    with pytest.raises(ParamsError, match=r"s\.typo"):
        load_params("s", Cfg, p)
    p.write_text("s:\n  n: lots\n")
    with pytest.raises(ParamsError, match=r"s\.n"):
        load_params("s", Cfg, p)
    with pytest.raises(ParamsError, match="no 'other:' section"):
        load_params("other", Cfg, p)
    with pytest.raises(ParamsError, match="not found"):
        load_params("s", Cfg, tmp_path / "missing.yaml")
    p.write_text("s: [unclosed\n")
    with pytest.raises(ParamsError, match="malformed YAML"):
        load_params("s", Cfg, p)


def test_overrides_and_presets(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("# keep me\nevaluate:\n  n_trials: 1  # trials\n  suites: [world]\n")
    apply_overrides(p, {"evaluate.n_trials": 8})
    text = p.read_text()
    assert "# keep me" in text and "n_trials: 8" in text
    with pytest.raises(KeyError, match="no key"):
        apply_overrides(p, {"evaluate.n_trails": 8})
    smoke = load_overrides("smoke", {"evaluate.n_trials": 2})
    assert smoke["evaluate.max_per_template"] == 1 and smoke["evaluate.n_trials"] == 2
    with pytest.raises(ValueError, match="unknown preset"):
        load_overrides("huge", None)


@pytest.mark.parametrize("overrides, key", [
    ({"rl.rounds": "sixty"}, r"rl\.rounds"),
    ({"evaluate.n_trials": 0}, r"evaluate\.n_trials"),
    ({"evaluate.n_trials": 8, "rl.overrides": {"learning_rate": -1.0}}, r"rl\.overrides\.learning_rate"),
    ({"rl.overrides": {"bogus": 1}}, r"rl\.overrides: unknown key"),
    ({"reasoning_refine.reasoning_overrides": {"think_tokens": 0}}, r"reasoning_refine\.reasoning_overrides\.think_tokens"),
    ({"reasoning_bootstrap.reasoning_overrides": {"teacher": {"kind": "openai"}}},
     r"reasoning_bootstrap\.reasoning_overrides\.teacher.*base_url"),
])
def test_a_bad_override_leaves_params_untouched_and_names_its_key(tmp_path, overrides, key):
    p = tmp_path / "params.yaml"
    p.write_text((ROOT / "params.yaml").read_text())
    before = p.read_bytes()
    with pytest.raises(ParamsError, match=key):
        apply_overrides(p, overrides)
    assert p.read_bytes() == before and sorted(x.name for x in tmp_path.iterdir()) == ["params.yaml"]


def test_overrides_are_written_in_one_step(tmp_path, monkeypatch):
    import pipelines.flow as F

    p = tmp_path / "params.yaml"
    p.write_text((ROOT / "params.yaml").read_text())
    before = p.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(F.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        apply_overrides(p, {"evaluate.n_trials": 8})
    assert p.read_bytes() == before and sorted(x.name for x in tmp_path.iterdir()) == ["params.yaml"]
    monkeypatch.undo()
    apply_overrides(p, {"evaluate.n_trials": 8, "rl.overrides": {"learning_rate": 2.0e-3}})
    assert "n_trials: 8" in p.read_text() and sorted(x.name for x in tmp_path.iterdir()) == ["params.yaml"]


def test_every_params_section_has_its_typed_config_for_override_checks():
    import yaml

    from pipelines.flow import STAGE_CONFIGS

    assert set(yaml.safe_load((ROOT / "params.yaml").read_text())) == set(STAGE_CONFIGS)


def test_a_bad_profile_override_is_a_params_error_naming_its_key():
    from mobilerl.config import checked_settings
    from mobilerl.rl.config import RLConfig

    with pytest.raises(ParamsError, match=r"rl\.overrides\.learning_rate: Input should be greater"):
        checked_settings(RLConfig(overrides={"learning_rate": -1.0}))
    with pytest.raises(ParamsError, match=r"rl\.overrides: unknown key"):
        checked_settings(RLConfig(overrides={"bogus": 1}))
    assert checked_settings(RLConfig(overrides={"learning_rate": 1.0e-3})).learning_rate == 1.0e-3


def test_cluster_parameter_points_the_rl_stage_at_env_servers(tmp_path):
    """`cluster=local` becomes whole-value rl overrides that params.yaml takes and the rl config validates; the
    flow's default (deployment `full`) is no cluster: the in-process simulator."""
    import inspect

    from mobilerl.rl.config import RLConfig
    from pipelines.flow import mobilerl

    assert inspect.signature(mobilerl.fn).parameters["cluster"].default is None
    p = tmp_path / "params.yaml"
    p.write_text((ROOT / "params.yaml").read_text())
    assert load_params("rl", RLConfig, p).env_servers is None
    overrides = load_cluster("local")
    apply_overrides(p, overrides)
    cfg = load_params("rl", RLConfig, p)
    assert cfg.env_servers == [f"http://127.0.0.1:{port}" for port in (8781, 8782, 8783, 8784)]
    assert cfg.env_pool.health_interval_s == 10 and cfg.env_pool.replay
    with pytest.raises(ValueError, match="unknown cluster 'nowhere'; known: .*local"):
        load_cluster("nowhere")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl: [http://a:1]\n")
    with pytest.raises(ValueError, match="expected params.yaml sections"):
        load_cluster(str(bad))
    bad.write_text("rl:\n  env_servers: [a:1]\n")
    before = p.read_bytes()
    with pytest.raises(ParamsError, match="rl.env_servers.*'a:1' is not an http"):
        apply_overrides(p, load_cluster(str(bad)))  # refused before anything is written
    assert p.read_bytes() == before


VL = "Qwen2_5_VLForConditionalGeneration"


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _changed(a: dict, b: dict, prefix: str) -> bool:
    keys = [k for k in a if k.startswith(prefix)]
    assert keys, prefix
    return any(not a[k].equal(b[k]) for k in keys)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # every stage of the DAG, five of them LLaMA-Factory runs: ~5 min on 2 idle cores
def test_smoke_deployment_end_to_end_and_selective_repro(tmp_path, monkeypatch):
    """The whole DAG once, in the paper's shape: the flow runs every stage with the vl_smoke preset (Qwen2.5-VL
    class, screenshot+xml, pixel bounds, the full prompt; tiny random weights built from config) under Prefect's
    test harness and logs nested MLflow runs. Screenshots are stored, trained on (both SFT stages, the judge),
    shown to the RL policy and to the evaluated checkpoints. Then, in its working copy, changing one stage's param
    re-runs only that stage and what depends on it, and `rl` runs again asynchronously. (The text-only profile's
    stages are each tested on their own: test_sft_stages.py, test_reward_stages.py, test_evaluate_stage.py, ...)"""
    from prefect.testing.utilities import prefect_test_harness

    from mobilerl.data.store import iter_store
    from pipelines.flow import mobilerl

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MOBILERL_PARENT_RUN_ID", raising=False)
    with prefect_test_harness(server_startup_timeout=180):  # ~10 s on idle cores, far more beside another worker
        summary = mobilerl(preset="vl_smoke", isolated=True, keep_workdir=True)
    work = Path(summary["workdir"])
    try:
        assert [r["stage"] for r in summary["stages"]] == stage_order(work)
        assert all(r["status"] == "ran" for r in summary["stages"])
        print("stage seconds:", {r["stage"]: round(r["seconds"], 1) for r in summary["stages"]})
        report = (work / "reports" / "report.md").read_text()
        assert "| oracle |" in report and "| random |" in report
        assert "## AdaGRPO (the `rl` stage)" in report and "2 rounds" in report
        assert "## Reward model (held-out lab/test traces)" in report and "| trained judge |" in report
        # MLflow: the parent run with one nested run per stage (and the evaluate sub-runs)
        import mlflow

        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        runs = mlflow.search_runs(experiment_names=["mobilerl"], output_format="list")
        parent = summary["mlflow_parent_run_id"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
        assert {r.data.tags["mobilerl.stage"] for r in children} == set(stage_order(work))
        assert all(r.data.tags.get("mobilerl.git_sha") for r in children)
        # the RL run shows what the policy did: masked episode images of its first and last round
        [rl_run] = [r for r in children if r.data.tags["mobilerl.stage"] == "rl"]
        shots = [a.path for a in mlflow.MlflowClient().list_artifacts(rl_run.info.run_id, "images")]
        assert {p.split("+step+")[1].split("+")[0] for p in shots if p.endswith(".png")} == {"0", "1"}, shots
        # ... and an evaluated checkpoint's run its failures, one a template
        [ev] = [r for r in runs if r.info.run_name == "sft_reasoning_free/world"]
        fails = [a.path for a in mlflow.MlflowClient().list_artifacts(ev.info.run_id, "images")]
        assert any(p.startswith("images/failures~") and p.endswith(".png") for p in fails), fails
        oracle = [r for r in runs if r.info.run_name == "oracle/world"]
        assert oracle, sorted(r.info.run_name for r in runs)
        assert oracle[0].data.metrics["eval/success_rate"] == 1.0
        offline = [r for r in runs if r.info.run_name == "sft_reasoning_free/offline"]
        m = offline[0].data.metrics if offline else {}
        n_steps = int(m.get("androidcontrol/high/n_steps", 0))
        assert n_steps > 0 and m["androidcontrol/low/n_steps"] == n_steps
        assert "Offline step accuracy" in report and "| miss: wrong element | miss: off element |" in report
        n_episodes = int(m["androidcontrol/high/n_episodes"])
        assert n_episodes > 0 and f"| sft_reasoning_free | high | {n_episodes} | {n_steps} |" in report
        # the sampling study: 2 trials of 1 task, so pass@2 and no pass@4 column
        sampled = [r for r in runs if r.info.run_name == "sft_reasoning_free/world/sampled"]
        assert sampled and sampled[0].data.metrics["eval/n_trajectories"] == 2
        assert "eval/pass@4" not in sampled[0].data.metrics
        assert "## pass@k with sampling — world" in report and "| pass@1 | pass@2 | run |" in report

        # collection stored (masked) screenshots of every step
        data = work / "data"
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
        sft_traces = list(iter_store(data / "reward" / "traces" / "stores" / "sft_reasoning_free_t1_test"))
        assert sft_traces and all(t.error is None and all(s.screenshot_path for s in t.steps) for t in sft_traces)
        assert list(iter_store(data / "reward" / "traces" / "stores" / "adagrpo_t1_test"))  # the RL policy's, after rl

        # evaluate scored every checkpoint, online and offline, none failing for want of a screenshot
        evaluated = json.loads((data / "eval" / "summary.json").read_text())
        checkpoints = {"sft_random_init", "sft_reasoning_free", "sft_reasoning", "adagrpo"}
        assert set(evaluated) == {"oracle", "random"} | checkpoints
        assert all(s["world"]["eval/n_trajectories"] >= 1 and s["world"]["eval/n_errors"] == 0
                   for s in evaluated.values())
        for f in (data / "eval" / "trajectories").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                assert json.loads(line).get("error") is None, (f.name, line[:300])
        offline = json.loads((data / "eval" / "offline.json").read_text())
        assert all(offline[p]["androidcontrol/high/n_steps"] > 0 for p in checkpoints)

        # Selective re-run: change the report's param only.
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        apply_overrides(work / "params.yaml", {"report.title": "Changed title"})
        repro = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=work, env=env, capture_output=True,
                               text=True, check=True)
        out = repro.stdout
        assert "is empty" not in out + repro.stderr  # no empty file among any stage's deps
        assert "Running stage 'report'" in out
        assert "Running stage 'tasks'" not in out and "Running stage 'evaluate'" not in out
        assert "Changed title" in (work / "reports" / "report.md").read_text()

        # rl again, asynchronously: both modes ran their rounds on screenshots (a screenshot-less policy stops a
        # round with its error), within the staleness bound
        sync_curve = (data / "checkpoints" / "adagrpo.curve.jsonl").read_text()
        apply_overrides(work / "params.yaml", {"rl.async": {"max_staleness": 1}, "rl.algo": {"tis_cap": 2.0}})
        subprocess.run([sys.executable, "-m", "dvc", "repro", "--single-item", "rl"], cwd=work, env=env,
                       capture_output=True, text=True, check=True)
        for text, mode in ((sync_curve, "sync"), ((data / "checkpoints" / "adagrpo.curve.jsonl").read_text(), "async")):
            curve = [json.loads(x) for x in text.splitlines()]
            assert [c["round"] for c in curve] == [0, 1] and all(c["rollout/episodes"] == 4 for c in curve), mode
        assert "async/staleness_max" in curve[-1] and max(c["async/staleness_max"] for c in curve) <= 1
        assert sum(c["screens/pruned"] for c in curve) > 0 and not (work / ".cache" / "rl" / "screens").exists()
        assert json.loads((data / "checkpoints" / "adagrpo" / "config.json").read_text())["architectures"] == [VL]
        assert (data / "checkpoints" / "adagrpo" / "model.safetensors").is_file()
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def test_every_stage_config_field_has_a_description():
    """One sentence a knob lives in its typed config (params.yaml keeps at most a line of why)."""
    import importlib

    for stage in (ROOT / "stages").glob("[a-z]*.py"):
        importlib.import_module(f"stages.{stage.stem}")

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    missing = [f"{c.__module__}.{c.__name__}.{k}" for c in subclasses(StageConfig)
               for k, f in c.model_fields.items() if not f.description]
    assert not missing, f"fields without a description: {missing}"


def test_every_preset_and_cluster_passes_the_override_checks(tmp_path):
    """The checks refuse bad overrides, not the shipped presets and clusters."""
    from pipelines.flow import CLUSTERS, PRESETS

    for overrides in ([load_overrides(p.stem, None) for p in sorted(PRESETS.glob("*.yaml"))]
                      + [load_cluster(c.stem) for c in sorted(CLUSTERS.glob("*.yaml"))]):
        p = tmp_path / "params.yaml"
        p.write_text((ROOT / "params.yaml").read_text())
        apply_overrides(p, overrides)


def test_a_stages_output_is_logged_as_it_comes_and_its_progress_bar_once_per_interval(tmp_path):
    """`make run` and a deployment's Prefect log show a stage's lines while it runs (not all at its end) and a
    bar's redraws at most once per interval, its final state always."""
    from pipelines.flow import stream

    child = ("import sys, time\n"
             "print('started')\n"  # no flush: the stage's Python is made unbuffered
             "time.sleep(1.0)\n"
             "for i in range(1, 51):\n"
             "    sys.stderr.write(f'\\rsteps {i}/50'); sys.stderr.flush(); time.sleep(0.02)\n"
             "sys.stderr.write('\\n')\n"
             "print('done')\n")
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    code, lines = stream([sys.executable, "-c", child], str(tmp_path), dict(os.environ),
                         lambda line: seen.append((time.monotonic() - t0, line)), redraw_every_s=0.5)
    end = time.monotonic() - t0
    assert code == 0 and lines[0] == "started" and lines[-1] == "done"
    assert seen[0] == (pytest.approx(seen[0][0]), "started") and seen[0][0] < end - 0.8  # live, not at the end
    bars = [line for _, line in seen if line.startswith("steps")]
    assert bars[0] == "steps 1/50" and bars[-1] == "steps 50/50" and 2 <= len(bars) <= 5  # ~1 s of redraws
    code, lines = stream([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"], str(tmp_path),
                         dict(os.environ), lambda line: None)
    assert code == 3 and lines == ["x"]
