"""Stage `evaluate` (mobilerl.eval): checkpoint policies by name (profile settings, clear errors) next to the
baselines, the pass@k study, the offline step evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tiny_checkpoint import session_checkpoint

from mobilerl.agent import prompt
from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.config import ParamsError, load_params
from mobilerl.env.sim.tasks import get_task
from mobilerl.eval.checkpoints import make_policy_factory, policy_tasks
from mobilerl.eval.config import EvaluateConfig, check_policies
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.hf_backend import HFBackend
from mobilerl.models.profiles import load_profile


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return session_checkpoint(tmp_path_factory)


def config(tmp_path: Path, **evaluate) -> EvaluateConfig:
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"evaluate": evaluate}))
    return load_params("evaluate", EvaluateConfig, p)


def test_params_name_bad_policies_and_checkpoints(tmp_path):
    ok = config(tmp_path, policies=["oracle", "random"])
    check_policies(ok)
    assert ok.checkpoints == {} and ok.profile == "tiny"
    cfg = config(tmp_path, policies=["oracle", "sft"], checkpoints={"sft": "data/checkpoints/nope"})
    assert cfg.checkpoints["sft"].path == "data/checkpoints/nope" and cfg.checkpoints["sft"].reasoning is False
    with pytest.raises(ValueError, match=r"evaluate\.checkpoints\.sft: .*nope is not a model directory"):
        check_policies(cfg, root=tmp_path)
    with pytest.raises(ValueError, match=r"evaluate\.policies\[1\]: unknown policy 'sfT' \(known: oracle, random, sft"):
        check_policies(config(tmp_path, policies=["oracle", "sfT"], checkpoints={"sft": "x"}))
    with pytest.raises(ValueError, match=r"evaluate\.checkpoints\.random: 'random' is a baseline name"):
        check_policies(config(tmp_path, checkpoints={"random": "x"}))
    with pytest.raises(ParamsError, match=r"evaluate\.checkpoints\.sft\.reasonig"):
        config(tmp_path, checkpoints={"sft": {"path": "x", "reasonig": True}})
    with pytest.raises(ParamsError, match=r"evaluate\.model_concurrency"):
        config(tmp_path, model_concurrency=0)
    with pytest.raises(ValueError, match=r"evaluate\.pass_k\.policies\[0\]: 'oracle' is not a checkpoint"):
        check_policies(config(tmp_path, pass_k={"policies": ["oracle"]}))
    with pytest.raises(ParamsError, match=r"evaluate\.pass_k\.n_trials"):
        config(tmp_path, pass_k={"n_trials": 1})


def test_report_has_the_sampling_study_with_only_the_estimable_pass_at_k():
    from mobilerl.eval.report import ReportConfig, metrics_json, render_markdown

    def summary(n, c, k_max, level_tasks):
        return {"eval/n_tasks": level_tasks, "n_trials": n, "temperature": 1.0, "mlflow_run_id": "abcdef0123",
                "eval/success_rate": c, "eval/success_ci_low": 0.0, "eval/success_ci_high": 1.0,
                **{f"eval/pass@{k}": (c if k <= k_max else None) for k in (1, 2, 4, 8)},
                "eval/by_complexity": {"1": {"n_tasks": level_tasks, **{f"pass@{k}": (c if k <= k_max else None)
                                                                        for k in (1, 2, 4, 8)}}},
                "eval/by_difficulty": {}, "eval/by_semantic": {}, "eval/by_combined": {}}

    greedy = {"sft": {"world": summary(1, 0.0, 1, 5)}}
    sampled = {"sft": {"world": summary(4, 0.5, 4, 5)}}
    md = render_markdown(greedy, ReportConfig(), [], None, sampled)
    assert "| sft | 1 | 5 | 0.0 | – | – | – | `abcdef01` |" in md  # greedy, one trial: pass@1 only
    assert "## pass@k with sampling — world" in md and "sampled 4 times at temperature 1.0" in md
    assert "| policy | level | tasks | pass@1 | pass@2 | pass@4 | run |" in md  # no pass@8 column
    assert "| sft | all | 5 | 50.0 | 50.0 | 50.0 | `abcdef01` |" in md
    m = metrics_json(greedy, ReportConfig(), None, sampled)
    assert m["sft"]["sampled"]["world"]["pass@4"] == 0.5 and m["sft"]["sampled"]["world"]["pass@8"] is None
    assert m["sft"]["world"]["pass@2"] is None


def test_each_checkpoint_runs_its_own_task_cap_spread_over_templates(tmp_path):
    from types import SimpleNamespace

    cfg = config(tmp_path, policies=["oracle", "a", "b"], model_max_tasks=20,
                 checkpoints={"a": "x", "b": {"path": "y", "max_tasks": 10}})
    tasks = [SimpleNamespace(template=f"T{i // 3}", n=i) for i in range(30)]  # 10 templates x 3, in suite order
    assert policy_tasks("oracle", tasks, cfg) == tasks
    assert len(policy_tasks("a", tasks, cfg)) == 20
    few = policy_tasks("b", tasks, cfg)
    assert len(few) == 10 and len({t.template for t in few}) == 10  # one per template, not the first ten
    with pytest.raises(ParamsError, match=r"evaluate\.checkpoints\.b\.max_tasks"):
        config(tmp_path, checkpoints={"b": {"path": "y", "max_tasks": 0}})


def test_tiny_profile_prompts_compact_xml():
    g = load_profile("tiny").generation
    assert (g.kind, g.obs_mode, g.prompt_style, g.coords) == ("hf", "xml", "compact", "marks")
    assert g.max_batch >= 32 and 16 <= g.max_new_tokens <= 256  # the longest oracle Type text is ~206 tokens


def test_checkpoint_policy_runs_through_the_runner(ckpt, tmp_path):
    cfg = config(tmp_path, policies=["oracle", "ck"], model_concurrency=8, temperature=1.0, seed=3,
                 checkpoints={"ck": {"path": str(ckpt), "max_new_tokens": 6}})
    check_policies(cfg)
    factory, concurrency = make_policy_factory("ck", cfg)
    assert concurrency == 8 and make_policy_factory("oracle", cfg)[1] == cfg.concurrency
    policy = factory(11)
    g = load_profile("tiny").generation
    assert isinstance(policy, ModelPolicy) and isinstance(policy.backend, HFBackend)
    assert (policy.obs_mode, policy.prompt_style, policy.max_history) == (g.obs_mode, g.prompt_style, g.max_history)
    assert policy.sampling.max_new_tokens == 6 and policy.sampling.seed == 11 and policy.name == "ck"
    assert policy.backend._batcher.max_batch == g.max_batch
    for reasoning, cap in ((False, g.max_new_tokens), (True, load_profile("tiny").reasoning.max_new_tokens)):
        c = config(tmp_path, policies=["ck"], checkpoints={"ck": {"path": str(ckpt), "reasoning": reasoning}})
        assert make_policy_factory("ck", c)[0](0).sampling.max_new_tokens == cap  # no cap set: the profile's
    task = get_task("world/test/CameraTakePhoto/0")
    [traj] = evaluate_sync(factory, [task], n_trials=1, concurrency=concurrency, progress=False, base_seed=cfg.seed)
    assert traj.error is None and traj.policy == "ck" and traj.policy_version == str(ckpt)
    # An untrained model: mostly its whole budget, every step with its logprobs.
    assert 1 <= len(traj.steps) <= task.max_steps and all(s.logprobs and len(s.logprobs) <= 6 for s in traj.steps)
    req = policy.request(_ctx(task))
    assert req.messages[0]["content"] == prompt.system_prompt("xml", False, "compact")


def test_checkpoint_episodes_run_in_worker_processes(ckpt, tmp_path):
    from mobilerl.eval.checkpoints import run_checkpoint

    cfg = config(tmp_path, policies=["ck"], model_concurrency=8, temperature=1.0, seed=3, model_processes=2,
                 checkpoints={"ck": {"path": str(ckpt), "max_new_tokens": 6}})
    tasks = [get_task(f"world/test/{t}/0") for t in ("CameraTakePhoto", "ContactsAddContact", "SystemWifiTurnOnOff")]
    out = tmp_path / "ck.jsonl"
    trajs = run_checkpoint("ck", tasks, cfg, out_path=out)
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks] and all(t.error is None for t in trajs)
    assert all(t.policy == "ck" and s.logprobs for t in trajs for s in t.steps)  # each worker loaded the model
    assert out.exists() and not list(tmp_path.glob("ck.jsonl.part*"))
    with pytest.raises(ParamsError, match=r"evaluate\.model_processes"):
        config(tmp_path, model_processes=0)


def _ctx(task):
    from mobilerl.agent import PolicyContext
    from mobilerl.env.sim import SimEnv
    from mobilerl.env.xml import compress_xml

    obs = SimEnv().reset(task)
    return PolicyContext(task, obs, compress_xml(obs.xml, width=obs.width, height=obs.height))


def test_inspect_policy_selects_short_templates_and_reports_pass_at_k(ckpt, capsys):
    import importlib.util
    import statistics

    spec = importlib.util.spec_from_file_location("inspect_policy", Path(__file__).parents[1] / "scripts" /
                                                  "inspect_policy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tasks, optimal = mod.select_tasks(2.0, 1, None)
    assert len(tasks) == len(optimal) >= 2 and all(v <= 2.0 for v in optimal.values())
    assert {t.template for t in tasks} == set(optimal)
    queries, q_opt = mod.select_tasks(3.0, 2, "query")
    assert all(t.task_type == "query" for t in queries) and len(queries) == 2 * len(q_opt)
    assert "CameraTakePhoto" not in q_opt and statistics.mean(q_opt.values()) <= 3.0
    # An untrained checkpoint on the 2-step templates, 2 sampled trials: a table row per template, nothing solved.
    assert mod.main([str(ckpt), "--max-optimal", "2", "--per-template", "1", "--trials", "2", "--temperature",
                     "1.0", "--max-new-tokens", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "pass@2" in out and "pass@4" not in out
    assert all(name in out for name in optimal)
    assert f"0 / {2 * len(tasks)} episodes solved" in out


def test_pass_k_study_samples_every_task_n_times(ckpt, tmp_path, monkeypatch):
    from mobilerl import tracking
    from mobilerl.eval.benchmark import pass_k_study

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "trajectories").mkdir()
    cfg = config(tmp_path, policies=["ck"], model_concurrency=8, temperature=0.0, seed=3, model_processes=1,
                 checkpoints={"ck": {"path": str(ckpt), "max_new_tokens": 6}},
                 pass_k={"policies": ["ck"], "n_trials": 3, "max_tasks": 2})
    check_policies(cfg)
    tasks = [get_task(f"world/test/{t}/0") for t in ("CameraTakePhoto", "ContactsAddContact", "SystemWifiTurnOnOff")]
    with tracking.stage_run("evaluate"):
        out = pass_k_study(cfg, {"world": tasks}, tmp_path / "trajectories")
    s = out["ck"]["world"]
    assert (s["n_trials"], s["temperature"], s["eval/n_tasks"], s["eval/n_trajectories"]) == (3, 1.0, 2, 6)
    assert s["eval/pass@2"] is not None and s["eval/pass@4"] is None and s["mlflow_run_id"]
    kept = (tmp_path / "trajectories" / "ck__world__sampled.jsonl").read_text().splitlines()
    assert len(kept) == 6
    # sampled at temperature 1.0: the three trials of a task are not all the same response sequence
    import json

    by_task: dict[str, set] = {}
    for t in map(json.loads, kept):
        by_task.setdefault(t["task_id"], set()).add(tuple(st["response"] for st in t["steps"]))
    assert len(by_task) == 2 and all(len(v) > 1 for v in by_task.values())


def test_world_all_runs_its_checkpoints_greedy_on_every_task_into_the_reports_metrics(ckpt, tmp_path, monkeypatch):
    import contextlib
    import types

    import mobilerl.eval.benchmark as B
    from mobilerl.eval.report import ReportConfig, metrics_json

    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r"))
    monkeypatch.setattr(B.tracking, "child_run", lambda *a, **k: contextlib.nullcontext(run))
    monkeypatch.setattr(B.tracking, "log_metrics", lambda metrics: None)
    world = [get_task(f"world/test/{t}/0") for t in ("CameraTakePhoto", "ContactsAddContact", "SystemWifiTurnOnOff")]
    monkeypatch.setattr(B, "load_tasks", lambda suite, split, cap=None: world[:cap])  # the suite, 3 tasks long
    cfg = config(tmp_path, suites=["world"], policies=["ck"], model_max_tasks=1, temperature=1.0, model_processes=1,
                 offline_per_template=0, failure_images=0, world_all=["ck"],
                 checkpoints={"ck": {"path": str(ckpt), "max_new_tokens": 4}})
    check_policies(cfg)
    summary, _, _ = B.evaluate_policies(cfg, tmp_path / "out")
    assert summary["ck"]["world"]["eval/n_trajectories"] == 1  # the capped, sampled evaluation
    s = summary["ck"]["world_all"]
    assert (s["eval/n_trajectories"], s["temperature"]) == (3, 0.0)  # every task, greedy
    assert len((tmp_path / "out" / "ck__world_all.jsonl").read_text().splitlines()) == 3
    m = metrics_json(summary, ReportConfig())["ck"]["world_all"]
    assert m["n"] == 3 and m["success_ci_low"] <= m["success_rate"] <= m["success_ci_high"]
    with pytest.raises(ValueError, match=r"evaluate\.world_all\[0\]: 'nope'"):
        check_policies(config(tmp_path, world_all=["nope"]))


def test_the_random_baseline_is_scored_offline_as_the_floor(tmp_path, monkeypatch):
    import contextlib
    import types

    import mobilerl.eval.offline as O
    from mobilerl.agent import OraclePolicy, RandomPolicy
    from mobilerl.eval.androidcontrol import from_trajectory

    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))  # no MLflow store to migrate (~1 min)
    monkeypatch.setattr(O.tracking, "child_run", lambda *a, **k: contextlib.nullcontext(run))
    monkeypatch.setattr(O.tracking, "log_metrics", lambda metrics: None)
    cfg = config(tmp_path, policies=["random"])
    tasks = [get_task(f"world/test/{t}/0", with_optimal=False)
             for t in ("ContactsAddContact", "SystemWifiTurnOnOff", "ClockStopWatchRunning", "SmsSendToContact")]
    episodes = [from_trajectory(t) for t in evaluate_sync(lambda seed: OraclePolicy(), tasks, progress=False)]
    m = O.evaluate_offline("random", RandomPolicy(0), episodes, cfg)  # a policy without a coords frame
    n = m["androidcontrol/high/n_steps"]
    assert n == sum(len(e.actions) for e in episodes) >= 12 and m["mlflow_run_id"] == "r1"
    assert 0.0 <= m["androidcontrol/high/step_success_rate"] < 0.15  # random taps rarely hit the expert's element
    assert m["androidcontrol/high/invalid_rate"] == 0.0


def test_report_shows_the_rl_curve_and_templates_before_and_after(tmp_path):
    from mobilerl.eval.report import ReportConfig, build_report, template_table
    from mobilerl.trajectory import StepRecord, Trajectory

    def traj(template, policy, success, steps):
        return Trajectory(task_id=f"world/test/{template}/0", template=template, success=success, policy=policy,
                          steps=[StepRecord(index=i, response="") for i in range(steps)])

    curve = [{"round": r, "rollout/success": 0.02 if r < 5 else 0.08} for r in range(12)]
    trajs = {"sft_reasoning_free": [traj("A", "x", False, 9), traj("B", "x", True, 6)],
             "adagrpo": [traj("A", "y", True, 4), traj("B", "y", True, 3)]}
    table = template_table(trajs, "sft_reasoning_free", "adagrpo")
    assert table["A"]["adagrpo"] == {"n": 1, "solved": 1, "steps": [4]}
    md, metrics = build_report({}, ReportConfig(), tmp_path, rl_curve=curve, rl_templates=table)
    assert "| A | 0/1 (–) | 1/1 (4.0) |" in md and "| B | 1/1 (6.0) | 1/1 (3.0) |" in md
    assert (tmp_path / "rl_curve.png").is_file()
    assert metrics["rl"]["success_first5"] == pytest.approx(0.02)
    assert metrics["rl"]["success_last5"] == pytest.approx(0.08)


def test_report_puts_the_reward_models_held_out_figures_beside_its_baselines(tmp_path):
    from mobilerl.eval.report import ReportConfig, build_report

    def figures(tp, fp, tn, fn):
        n = tp + fp + tn + fn
        p, r = tp / max(1, tp + fp), tp / max(1, tp + fn)
        return {"n": n, "accuracy": (tp + tn) / n, "precision": p, "recall": r, "f1": 2 * p * r / max(1e-9, p + r),
                "confusion": {"tp": tp, "fp": fp, "tn": tn, "fn": fn}}

    reward = {**figures(74, 17, 60, 3), "baselines": {"majority_class": figures(77, 77, 0, 0)},
              "by_source": {"oracle": figures(39, 0, 0, 1), "sft_reasoning_free": figures(0, 3, 14, 0)},
              "threshold": 0.62, "calibration": {"ece": 0.071, "bins": [
                  {"low": 0.0, "high": 0.1, "n": 60, "mean_score": 0.04, "success_rate": 0.05},
                  {"low": 0.9, "high": 1.0, "n": 94, "mean_score": 0.95, "success_rate": 0.79}]}}
    md, metrics = build_report({}, ReportConfig(), tmp_path, reward=reward, reward_examples=["reward_wrong_0.png"])
    assert metrics["reward_model"]["accuracy"] == pytest.approx(134 / 154) and metrics["reward_model"]["n"] == 154
    assert metrics["reward_model"]["by_source"] == {"oracle": {"n": 40, "accuracy": 39 / 40},
                                                    "sft_reasoning_free": {"n": 17, "accuracy": 14 / 17}}
    assert metrics["reward_model"]["threshold"] == 0.62 and metrics["reward_model"]["ece"] == 0.071
    assert "| trained judge | 154 | 0.870 | 0.813 | 0.961 | 0.881 | 74 / 17 / 60 / 3 |" in md
    assert "| baseline: majority class | 154 | 0.500 |" in md and "| oracle | 40 |" in md
    assert "![reward_wrong_0](figures/reward_wrong_0.png)" in md
    assert "threshold 0.620" in md and (tmp_path / "reward_reliability.png").stat().st_size > 1000


def test_too_many_episodes_lost_to_env_failures_fail_the_stage(tmp_path, monkeypatch):
    import contextlib
    import types

    import mobilerl.eval.benchmark as B
    from mobilerl.trajectory import Trajectory

    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
    monkeypatch.setattr(B.tracking, "child_run", lambda *a, **k: contextlib.nullcontext(run))
    monkeypatch.setattr(B.tracking, "log_metrics", lambda metrics: None)
    tasks = [get_task(f"world/test/ContactsAddContact/{i}", with_optimal=False) for i in range(10)]
    trajs = [Trajectory.for_task(t, error="env: EnvCrashed: process 7 was killed by SIGKILL") if i < 2
             else Trajectory.for_task(t) for i, t in enumerate(tasks)]
    monkeypatch.setattr(B, "evaluate_sync", lambda *a, **k: trajs)
    cfg = config(tmp_path, policies=["random"])
    assert (cfg.env_retries, cfg.max_env_failed_share) == (2, 0.05)
    with pytest.raises(RuntimeError, match=r"2 of 10 episodes \(20\.0%\) lost.*evaluate\.max_env_failed_share = 0\.05"):
        B.run_policy("random", None, 1, tasks, cfg, "random/world", tmp_path / "x.jsonl")
    s = B.run_policy("random", None, 1, tasks, config(tmp_path, policies=["random"], max_env_failed_share=0.2),
                     "random/world", tmp_path / "x.jsonl")
    assert s["eval/n_env_failed"] == 2 and s["eval/n_trajectories"] == 8 and s["eval/n_errors"] == 2
