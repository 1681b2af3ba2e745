"""The ablation study: the variant table, cells (config, resumability), E.5's split and judge, the aggregation
(Student-t interval, SPA win rate), the report section, and the flow's MLflow runs with a fake cell runner."""

from __future__ import annotations

import json
import math
import os
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from mobilerl.eval import ablation as agg
from mobilerl.rl.ablation import (
    INIT,
    AblationTable,
    cell_dir,
    cell_spec,
    eval_tasks,
    fingerprint,
    is_done,
    load_table,
)
from mobilerl.rl.config import RLConfig
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE_RL = yaml.safe_load((ROOT / "params.yaml").read_text())["rl"]

# ----------------------------------------------------------------------------------------- the variant table


def test_every_variant_validates_against_rlconfig_and_changes_only_its_own_switches():
    table = load_table()
    assert {"full", "no_adapr", "no_spa", "no_adapr_spa", "no_fcf", "bepa", "dynamic_sampling", "dart", "distrl",
            "e5_verifier", "e5_reward_model"} <= set(table.variants)
    assert {"full", "no_adapr", "no_spa", "no_adapr_spa", "no_fcf", "bepa", "dynamic_sampling", "dart",
            "distrl"} <= set(table.default)
    for v, o in table.variants.items():
        cfg = RLConfig.model_validate(cell_spec(table, v, 0, BASE_RL)["rl"])
        switches = {k: getattr(cfg, k) for k in ("spa", "adapr", "fcf")}
        assert switches == {k: o.get(k, True) for k in switches}, v  # each ablation turns off exactly its own
        peers = {k: getattr(cfg, k) is not None for k in ("bepa", "dynamic_sampling", "dart", "distrl")}
        assert peers == {k: k in o for k in peers}, v  # each peer variant is full plus its one option
        assert cfg.rounds == table.cell["rounds"] and cfg.overrides == BASE_RL["overrides"]
    e5 = [RLConfig.model_validate(cell_spec(table, v, 0, BASE_RL)["rl"]) for v in ("e5_verifier", "e5_reward_model")]
    assert [c.test_half for c in e5] == [0, 0] and [c.judge_all for c in e5] == [False, True]
    assert e5[1].reward_model and not e5[0].reward_model


def test_a_cell_layers_params_budget_variant_seed_and_names_bad_input(tmp_path):
    table = AblationTable(cell={"rounds": 7, "overrides": {"samples_per_task": 4}}, default=["full"],
                          variants={"full": {}, "lr": {"overrides": {"learning_rate": 1e-3}}, "bad": {"fcf": "maybe"}})
    spec = cell_spec(table, "lr", 3, BASE_RL, tmp_path, tmp_path / "cells")
    rl = spec["rl"]
    assert rl["rounds"] == 7 and rl["seed"] == 3 and rl["overrides"] == {
        **BASE_RL["overrides"], "samples_per_task": 4, "learning_rate": 1e-3}  # `overrides` merges key by key
    assert rl["work"] == "cells/lr/seed3/work" and rl["out"] == "cells/lr/seed3/policy"
    assert cell_spec(table, "lr", 3, BASE_RL, tmp_path, tmp_path / "cells", rounds=2)["rl"]["rounds"] == 2
    # the same parameters give the same cell (so the trainer's resume and the skip both apply); others do not
    again = cell_spec(table, "lr", 3, BASE_RL, tmp_path, tmp_path / "cells")
    assert fingerprint(again) == fingerprint(spec)
    assert fingerprint(cell_spec(table, "lr", 3, BASE_RL, tmp_path, tmp_path / "cells", eval_per_template=1)) != \
        fingerprint(spec)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        cell_spec(table, "nope", 0, BASE_RL)
    with pytest.raises(ValueError, match="variant 'bad'.*fcf"):
        cell_spec(table, "bad", 0, BASE_RL)
    with pytest.raises(ValueError, match="default: unknown variant"):
        AblationTable(default=["x"], variants={"full": {}})
    with pytest.raises(ValueError, match="'init' is the reference cell"):
        AblationTable(default=["full"], variants={"full": {}, "init": {}})
    ref = cell_spec(table, INIT, 0, BASE_RL, tmp_path, tmp_path / "cells")  # the RL init, untrained
    assert not ref["train"] and ref["overrides"] == {} and spec["train"]
    assert ref["rl"]["rounds"] == 7 and ref["rl"]["work"] == "cells/init/seed0/work"
    where = tmp_path / "cells" / "lr" / "seed3"
    where.mkdir(parents=True)
    assert not is_done(spec, where)
    (where / "result.json").write_text(json.dumps({"fingerprint": fingerprint(spec)}))
    assert is_done(spec, where) and not is_done(cell_spec(table, "lr", 3, BASE_RL, tmp_path, tmp_path / "cells",
                                                          rounds=2), where)


@pytest.mark.slow
def test_the_reference_cell_evaluates_the_init_without_training(tmp_path):
    """`init`: the cell skips training and runs the RL init greedy on the cell's test tasks."""
    from rl_tasks import short_tasks, stage_root

    from mobilerl.rl.ablation import run_cell

    root = stage_root(tmp_path, short_tasks(2), [3, 3])
    table = AblationTable(cell={"rounds": 2}, default=["full"], variants={"full": {}})
    init = str(ROOT / "models" / "tiny-base")
    base = {"init": init, "templates_max_steps": None, "overrides": {"max_new_tokens": 8}}
    spec = cell_spec(table, INIT, 0, base, root, root / "cells", eval_per_template=1)
    spec["eval"]["processes"] = 1
    where = cell_dir(INIT, 0, root / "cells")
    where.mkdir(parents=True)
    result = run_cell(spec, where, root)
    assert result["rounds"] == 0 and result["curve"] == [] and result["init"] == init and is_done(spec, where)
    assert not (where / "work").exists() and not (where / "policy").exists()  # nothing trained, nothing written
    assert sorted(e["task_id"] for e in result["episodes"]) == sorted(t.task_id for t in short_tasks(2))
    assert len((where / "eval.jsonl").read_text().splitlines()) == result["eval"]["n_tasks"] == 2


# -------------------------------------------------------------------------------------------------- E.5


def _lists(tmp: Path) -> Path:
    """Task lists in ``tmp``: lab/test and world/test, 3 templates × 6 tasks each (optimal steps 3, 5, 9)."""
    from mobilerl.env.base import TaskSpec

    lists = tmp / "data" / "tasks" / "suites"
    lists.mkdir(parents=True)
    for suite in ("lab", "world"):
        tasks = [TaskSpec(task_id=f"{suite}/test/T{k}/{i}", suite=suite, split="test", template=f"T{k}",
                          instruction="do it", optimal_steps=steps) for k, steps in enumerate((3, 5, 9)) for i in range(6)]
        (lists / f"{suite}_test.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    return tmp


def test_e5_trains_on_one_half_of_the_test_split_and_evaluates_on_the_other(tmp_path):
    from mobilerl.rl.run import training_pool
    from mobilerl.tasks import halves

    root = _lists(tmp_path)
    a, b = halves(list(range(18)), key=str)
    assert sorted(a + b) == list(range(18)) and len(a) == len(b) == 9 and halves(list(range(18)), key=str) == (a, b)
    for half in (0, 1):
        cfg = RLConfig(suite="lab", test_half=half, templates_max_steps=None, tasks_per_template=None)
        pool, held_out = training_pool(cfg, root), eval_tasks(cfg, None, root)
        assert len(pool) + len(held_out) == 18 and not {t.task_id for t in pool} & {t.task_id for t in held_out}
        assert all(t.has_verifier and t.split == "test" for t in pool)
    cfg = RLConfig(suite="lab", test_half=0, templates_max_steps=6, tasks_per_template=None)
    assert {t.optimal_steps for t in training_pool(cfg, root) + eval_tasks(cfg, None, root)} == {3, 5}
    # a world cell evaluates on the test tasks of the pool's (short) templates, per_template of each
    world = eval_tasks(RLConfig(templates_max_steps=6), 2, root)
    assert len(world) == 4 and {t.optimal_steps for t in world} == {3, 5}
    with pytest.raises(ValueError, match="rl.judge_all needs rl.reward_model"):
        RLConfig(judge_all=True)


def test_judge_all_rewards_verified_episodes_by_the_judge_and_keeps_the_verifiers_verdict():
    from mobilerl.rl.groups import judge_rewards

    class Judge:
        def score(self, trajs):
            return [0.9] * len(trajs)  # a judge that calls everything a success (E.5's false positives)

    trajs = [Trajectory(task_id=f"lab/test/T/{i}", success=i == 0, reward=float(i == 0), steps=[], finished=True)
             for i in range(3)]
    assert judge_rewards(trajs, Judge()) == 0 and [t.success for t in trajs] == [True, False, False]
    assert judge_rewards(trajs, Judge(), everyone=True) == 3
    assert all(t.success for t in trajs) and [t.meta["verified"] for t in trajs] == [True, False, False]


# ------------------------------------------------------------------------------------------- aggregation


def test_student_t_interval_over_seeds():
    lo, hi = agg.t_interval([0.1, 0.2, 0.3])
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) · s / √n
    assert lo == pytest.approx(0.2 - half) and hi == pytest.approx(0.2 + half)
    assert agg.t_interval([0.4]) is None and agg.t_interval([0.2, 0.2]) == pytest.approx([0.2, 0.2])


def test_spa_win_rate_pairs_tasks_both_solve_by_seed_and_splits_ties():
    assert agg.win_rate([(3, 4), (4, 4), (5, 4), (2, 6)]) == {"pairs": 4, "wins": 2, "ties": 1, "losses": 1,
                                                              "win_rate": 2.5 / 4}
    assert agg.win_rate([])["win_rate"] is None

    def cell(seed, eps):
        return {"seed": seed, "episodes": [{"task_id": t, "template": t.split("/")[2], "optimal_steps": o,
                                            "success": s, "steps": n} for t, o, s, n in eps]}

    full = [cell(0, [("w/t/A/0", 3, True, 3), ("w/t/B/0", 5, True, 5), ("w/t/C/0", 6, True, 6)]),
            cell(1, [("w/t/A/0", 3, True, 4)])]
    no_spa = [cell(0, [("w/t/A/0", 3, True, 5), ("w/t/B/0", 5, True, 5), ("w/t/C/0", 6, False, 3)]),
              cell(1, [("w/t/A/0", 3, True, 3)]), cell(2, [("w/t/A/0", 3, True, 9)])]
    w = agg.spa_win_rate(full, no_spa)
    by = {r["bucket"]: r for r in w["buckets"]}
    assert set(by) == {"≤ 3", "5"}  # C: only full solved it; seed 2 has no full cell
    assert by["≤ 3"] == {"bucket": "≤ 3", "templates": 1, "pairs": 2, "wins": 1, "ties": 0, "losses": 1,
                         "win_rate": 0.5}
    assert by["5"]["ties"] == 1 and by["5"]["win_rate"] == 0.5
    assert w["all"]["pairs"] == 3 and w["all"]["win_rate"] == pytest.approx(1.5 / 3) and w["seeds"] == [0, 1]


def fake_result(variant, seed, rate, rounds=4, steps=4.0, overrides=None, finished_at=1.0, judged=False):
    """A cell's result.json as :func:`mobilerl.rl.ablation.run_cell` writes it (numbers chosen by the test)."""
    curve = [{"round": r, "rollout/success": rate * (r + 1) / rounds, "loss/policy": 0.1}
             for r in range(rounds)]
    if judged:
        for row in curve:
            row["rollout/verified_success"] = row["rollout/success"] / 2
    return {"variant": variant, "seed": seed, "fingerprint": "x", "rounds": rounds, "suite": "world",
            "overrides": overrides if overrides is not None else {}, "curve": curve,
            "eval": {"success_rate": rate, "n_tasks": 10, "n_errors": 0, "steps_success": steps, "mean_steps": 8.0},
            "eval_summary": {"eval/success_rate": rate},
            "episodes": [{"task_id": f"world/test/T/{i}", "template": "T", "optimal_steps": 4,
                          "success": i < 10 * rate, "steps": 3 + (variant == "no_spa")} for i in range(10)],
            "time": {"total_s": 120.0}, "finished_at": finished_at}


def test_aggregate_means_intervals_curves_and_keeps_a_variants_latest_budget():
    results = [fake_result("full", s, r) for s, r in ((0, 0.3), (1, 0.4), (2, 0.5))]
    results += [fake_result("no_spa", s, r, steps=5.0, overrides={"spa": False}) for s, r in ((0, 0.2), (1, 0.2))]
    results += [fake_result("no_spa", 2, 0.9, rounds=2, overrides={"spa": False}, finished_at=0.5)]  # older budget
    results += [fake_result("e5_reward_model", 0, 0.2, overrides={"test_half": 0, "judge_all": True}, judged=True)]
    s = agg.aggregate(results, ["full", "no_spa"])
    full, no_spa, e5 = (s["variants"][v] for v in ("full", "no_spa", "e5_reward_model"))
    assert list(s["variants"]) == ["full", "no_spa", "e5_reward_model"] and s["cells"] == 6
    assert full["success_rate"] == pytest.approx(0.4) and full["ci95"] == pytest.approx(agg.t_interval([0.3, 0.4, 0.5]))
    assert no_spa["seeds"] == [0, 1] and no_spa["rounds"] == 4 and no_spa["steps_success"] == 5.0
    assert full["curve"] == pytest.approx([0.1, 0.2, 0.3, 0.4]) and full["curve_key"] == "rollout/success"
    assert e5["e5"] and e5["curve_key"] == "rollout/verified_success" and e5["curve"][-1] == pytest.approx(0.1)
    assert e5["curve_judged"][-1] == pytest.approx(0.2) and e5["ci95"] is None
    assert s["spa_win_rate"]["all"]["win_rate"] == 1.0  # full's successes take 3 steps, no_spa's 4
    m = agg.metrics(s)
    assert m["full"] == {"success_rate": pytest.approx(0.4), "ci95": full["ci95"], "seeds": [0, 1, 2],
                         "steps_success": 4.0, "rounds": 4} and m["spa_win_rate"] == 1.0


# ------------------------------------------------------------------------------------------------ report


def test_report_section_table_figures_goal_and_the_empty_case(tmp_path):
    from mobilerl.eval.report import ReportConfig, build_report

    md, metrics = build_report({}, ReportConfig(), tmp_path, ablation={"cells": 0, "variants": {}})
    assert "## AdaGRPO ablations" in md and "No ablation results yet" in md and "ablation" not in metrics
    assert "No ablation results yet" in build_report({}, ReportConfig(), tmp_path)[0]
    assert not list(tmp_path.glob("ablation_*.png"))

    results = [fake_result("full", s, r) for s, r in ((0, 0.30), (1, 0.32), (2, 0.34))]
    results += [fake_result("no_adapr", s, r, overrides={"adapr": False}) for s, r in ((0, 0.10), (1, 0.12), (2, 0.14))]
    results += [fake_result("no_spa", s, r, overrides={"spa": False}) for s, r in ((0, 0.2), (1, 0.4), (2, 0.3))]
    results += [fake_result("bepa", s, 0.35, overrides={"bepa": {}}) for s in (0, 1, 2)]
    results += [fake_result(v, 0, 0.1, overrides={"test_half": 0, **extra}, judged=bool(extra))
                for v, extra in (("e5_verifier", {}), ("e5_reward_model", {"judge_all": True}))]
    results += [{**fake_result("init", 0, 0.4, rounds=0), "init": "data/checkpoints/sft"}]  # ahead, but no peer
    summary = agg.aggregate(results, ["init", "full", "no_adapr", "no_spa", "bepa"])
    md, metrics = build_report({}, ReportConfig(), tmp_path, ablation=summary)
    assert "| init | no RL: the init `data/checkpoints/sft` | 1 | 40.0 | +8.0 | 4.00 | 0 |" in md
    assert "Each variant × seed trains 4 rounds" in md and summary["variants"]["init"]["curve"] == []
    rows = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| ") and " | 15 |" not in line]
    stored = json.loads(json.dumps(summary, sort_keys=True))  # as summary.json holds it: keys sorted
    md_stored = build_report({}, ReportConfig(), tmp_path, ablation=stored)[0]
    order = ["| init", "| full", "| no_adapr", "| no_spa", "| bepa"]
    assert [r for r in rows if r in order] == order
    assert [x.split(" | ")[0] for x in md_stored.splitlines() if x.split(" | ")[0] in order] == order
    assert "| full | AdaGRPO as the `rl` stage | 3 | 32.0 [27.0, 37.0] | – | 4.00 | 4 |" in md
    assert "| no_adapr | `adapr: false` | 3 | 12.0 [7.0, 17.0] | -20.0 |" in md
    assert "1 of 2 (no_adapr)" in md  # no_spa is 2 points behind but its interval overlaps full's
    assert "Peer options ahead of full (mean): bepa of bepa." in md
    assert "| all | 1 | 9 | 9 / 0 / 0 | 100.0 |" in md  # 2 + 4 + 3 tasks both solve (seeds 0-2), full shorter
    assert "| e5_reward_model | 1 | 10 world/test | 10.0 | 5.0 |" in md
    for f in ("ablation_curves.png", "ablation_spa_win_rate.png", "ablation_e5.png"):
        assert (tmp_path / f).stat().st_size > 1000 and f"(figures/{f})" in md
    assert metrics["ablation"]["no_spa"]["success_rate"] == pytest.approx(0.3)
    assert metrics["ablation"]["e5_verifier"]["seeds"] == [0]


# ----------------------------------------------------------------------------------- the flow and MLflow

FAKE_CELL = """
import json, sys
from pathlib import Path
from mobilerl.rl.ablation import fingerprint
where = Path(sys.argv[1])
spec = json.loads((where / "cell.json").read_text())
with open(where.parents[1] / "calls.txt", "a") as f:
    f.write(f"{spec['variant']}/{spec['seed']}\\n")
rounds = spec["rl"]["rounds"] if spec["train"] else 0
rate = {"full": 0.4, "no_spa": 0.2}.get(spec["variant"], 0.1) + 0.01 * spec["seed"]
(where / "work").mkdir(exist_ok=True)
curve = [{"round": r, "rollout/success": rate * r / rounds, "loss/policy": 0.5} for r in range(rounds)]
(where / "work" / "curve.jsonl").write_text("".join(json.dumps(c) + "\\n" for c in curve))
if spec["variant"] == "no_fcf" and spec["seed"] == 1:
    sys.exit("boom")
result = {"variant": spec["variant"], "seed": spec["seed"], "fingerprint": fingerprint(spec), "rounds": rounds,
          "suite": "world", "overrides": spec["overrides"], "curve": curve,
          "eval": {"success_rate": rate, "n_tasks": 5, "n_errors": 0, "steps_success": 4.0, "mean_steps": 6.0},
          "eval_summary": {"eval/success_rate": rate, "eval/mean_steps": 6.0},
          "episodes": [], "time": {"total_s": 1.0}, "finished_at": 1.0}
(where / "result.json").write_text(json.dumps(result))
"""


@pytest.fixture(scope="module")
def prefect_api():
    """Prefect's test harness (a temporary local API on SQLite), shared by the flow and deployment tests."""
    from prefect.testing.utilities import prefect_test_harness

    os.environ.pop("PREFECT_API_URL", None)
    with prefect_test_harness(server_startup_timeout=180):  # ~10 s on idle cores, far more on busy ones
        yield


def test_flow_runs_cells_once_logs_nested_runs_and_survives_a_failed_cell(tmp_path, monkeypatch, prefect_api):
    import mlflow

    import pipelines.ablation as flow_mod

    cells = tmp_path / "cells"
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE_CELL)
    monkeypatch.setattr(flow_mod, "CELLS", cells)
    monkeypatch.setattr(flow_mod, "CELL_CMD", [sys.executable, str(script)])
    monkeypatch.delenv("MOBILERL_PARENT_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))

    def calls():
        return (cells / "calls.txt").read_text().split()

    with pytest.raises(RuntimeError, match=r"1 cell\(s\) failed: no_fcf/seed1"):
        flow_mod.ablation(variants=["full", "no_spa", "no_fcf"], seeds=[0, 1], rounds=3, report=False)
    assert sorted(calls()) == sorted(["init/0", "full/0", "full/1", "no_spa/0", "no_spa/1", "no_fcf/0", "no_fcf/1",
                                      "no_fcf/1"])  # the reference cell first; the failed cell was retried once
    summary = json.loads((cells / "summary.json").read_text())
    assert summary["variants"]["full"]["seeds"] == [0, 1] and summary["variants"]["no_fcf"]["seeds"] == [0]
    assert summary["variants"]["full"]["success_rate"] == pytest.approx(0.405)
    plan = flow_mod.ablation(variants=["full", "no_fcf"], seeds=[0, 1], rounds=3, dry_run=True)["cells"]
    assert [p["done"] for p in plan] == [True, True, True, True, False]
    again = flow_mod.ablation(variants=["full", "no_spa"], seeds=[0, 1], rounds=3, report=False)
    assert len(calls()) == 8  # every finished cell skipped
    assert [c["status"] for c in again["cells"]] == ["done earlier"] * 5
    assert json.loads((cells / "summary.json").read_text())["variants"]["init"]["rounds"] == 0
    assert again["mlflow_ui"].endswith("/runs?workflowType=machine_learning&compareRunsMode=CHART&searchFilter=" +
                                       urllib.parse.quote(f"tags.`mlflow.parentRunId` = '{again['mlflow_parent_run_id']}'"))
    ids = [c["mlflow_run_id"] for c in again["cells"]]
    assert len(set(ids)) == 5 and all(urllib.parse.quote(i) in again["mlflow_compare"] for i in ids)
    assert "/#/compare-runs?runs=" in again["mlflow_compare"]
    assert json.loads((cell_dir("full", 0, cells) / "cell.json").read_text())["rl"]["work"] == str(
        cell_dir("full", 0, cells) / "work")

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("mobilerl")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = mlflow.search_runs(experiment_names=["mobilerl"], output_format="list")
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == again["mlflow_parent_run_id"]]
    ref = next(r for r in nested if r.info.run_name == "init/seed0")
    assert ref.data.params["rounds"] == "0" and "eval/success_rate" in ref.data.metrics
    nested = [r for r in nested if r is not ref]
    assert sorted(r.info.run_name for r in nested) == ["full/seed0", "full/seed1", "no_spa/seed0", "no_spa/seed1"]
    assert {(r.data.tags["variant"], r.data.tags["seed"]) for r in nested} == {
        ("full", "0"), ("full", "1"), ("no_spa", "0"), ("no_spa", "1")}
    assert len({frozenset(r.data.metrics) for r in nested}) == 1  # identical keys: the compare view overlays them
    assert {"rollout/success", "loss/policy", "eval/success_rate", "eval/steps_success"} <= set(nested[0].data.metrics)
    assert next(r for r in nested if r.info.run_name == "no_spa/seed1").data.params["spa"] == "False"
    client = mlflow.MlflowClient()
    history = client.get_metric_history(nested[0].info.run_id, "rollout/success")
    assert [m.step for m in history] == [0, 1, 2]  # a skipped cell still shows its whole curve
    failed = [r for r in runs if r.info.run_name == "no_fcf/seed1"]
    assert failed and failed[0].info.status == "FAILED" and "rollout/success" in failed[0].data.metrics


def test_deployment_ablation_is_flow_mobilerl_with_its_own_entrypoint(prefect_api):
    """Prefect keeps both functions named ``mobilerl`` apart: each deployment has its own entrypoint, so
    ``prefect deployment run mobilerl/ablation`` runs the ablation flow (pipelines/serve.py serves both)."""
    from prefect.client.orchestration import get_client

    from pipelines.ablation import ablation
    from pipelines.flow import mobilerl

    ids = [d.apply() for d in (mobilerl.to_deployment(name="full"), ablation.to_deployment(name="ablation"))]
    with get_client(sync_client=True) as client:
        full = client.read_deployment_by_name("mobilerl/full")
        study = client.read_deployment_by_name("mobilerl/ablation")
    assert study.id == ids[1] and full.flow_id == study.flow_id  # one flow, two deployments
    assert study.entrypoint.endswith("pipelines/ablation.py:ablation")
    assert full.entrypoint.endswith("pipelines/flow.py:mobilerl")
    assert {"variants", "seeds", "rounds", "eval_per_template", "dry_run"} <= set(
        study.parameter_openapi_schema["properties"])
