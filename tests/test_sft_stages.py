"""The SFT stages end to end, each run the way DVC runs it (``python -m stages.<name>``) in a temporary copy
of ``stages/``, ``mobilerl/``, ``configs/`` and ``params.yaml`` with a few expert episodes, a random-init tiny
checkpoint as the base, a few LLaMA-Factory steps and its own MLflow store: sft_data → sft_reasoning_free →
reasoning_bootstrap → reasoning_refine → sft_reasoning."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("world/train/ClockTimerStart/0", "world/train/ContactsEditNumber/0", "world/train/ContactsAddContact/1")


def _base_checkpoint(path: Path, dataset: Path) -> Path:
    """A random-init tiny Qwen2-VL whose tokenizer is trained on the dataset's text (realistic lengths)."""
    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import train_tokenizer

    recs = json.loads((dataset / "train.json").read_text())
    texts = [m["content"] for r in recs for m in r["messages"]]
    texts += ["<think>I tap it.</think>", "<think>The task: open the app.</think>"]
    tok = train_tokenizer(texts * 4, vocab_size=2048)
    shape = tiny.TinyShape(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                           intermediate_size=128)
    model = tiny.build_model(shape, tok, seed=0)
    tiny.save(model, tiny.build_processor(tok), path, extra={"shape": tiny.shape_dict(shape), "test": True})
    return path


def _copies(responses, weights: dict) -> int:
    """Records a set of kept responses becomes under the SFT data's (integer) action_weights."""
    from mobilerl.env.actions import parse_action

    return sum(int(weights.get(parse_action(r).name, 1)) for r in responses)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A working copy: stage code, params, the expert store, a passed audit; a runner for its stages."""
    from mobilerl.agent import OraclePolicy
    from mobilerl.data.collect import MaskingOptions, collect_sync
    from mobilerl.env.sim.tasks.registry import get_task
    from pipelines.flow import apply_overrides

    work = tmp_path_factory.mktemp("sft-stages")
    # the library too: its ROOT (where stages read params and write outs) is the folder holding mobilerl/
    for folder in ("stages", "mobilerl", "configs"):
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "params.yaml", work / "params.yaml")
    policy = OraclePolicy()
    collect_sync(lambda s: policy, [get_task(t, with_optimal=False) for t in TASKS],
                 work / "data" / "collect" / "stores" / "collected",
                 masking=MaskingOptions(mode="surrogate", image_max_side=600, faces=False), concurrency=2,
                 progress=False)
    (work / "data" / "privacy").mkdir(parents=True)
    (work / "data" / "privacy" / "metrics.json").write_text('{"passed": true}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("MOBILERL_PARENT_RUN_ID", "PYTHONPATH")}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")

    def run(stage: str, **overrides) -> dict:
        apply_overrides(work / "params.yaml", overrides)
        proc = subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=540)
        assert proc.returncode == 0, f"{stage} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return {"stdout": proc.stdout}

    run("sft_data", **{"sft_data.val_fraction": 0.0})
    base = _base_checkpoint(work / "base", work / "data" / "sft" / "dataset")
    lf = {"max_steps": 4, "learning_rate": 0.005, "per_device_train_batch_size": 2, "warmup_ratio": 0.0}
    apply_overrides(work / "params.yaml", {
        "sft_reasoning_free.base": str(base), "sft_reasoning_free.overrides": lf,
        "sft_reasoning.overrides": lf,
        "reasoning_refine.train_overrides": {"max_steps": 2, "per_device_train_batch_size": 2},
        "reasoning_refine.steps_per_round": 3, "reasoning_refine.k": 2,
        "reasoning_refine.reasoning_overrides": {"think_tokens": 8, "answer_tokens": 8},
        "reasoning_refine.generation": {"max_batch": 8}})
    run.work = work  # type: ignore[attr-defined]
    run.env = env  # type: ignore[attr-defined]
    return run


def _generates(path: Path) -> str:
    from mobilerl.models.backends import make_backend
    from mobilerl.models.generation import ChatRequest, SamplingConfig

    backend = make_backend({"kind": "hf", "model": str(path)})
    [gen] = asyncio.run(backend.generate([ChatRequest([{"role": "user", "content": "Task: open Clock"}])],
                                         SamplingConfig(temperature=0, max_new_tokens=4)))
    assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids)
    return gen.text


def _alias_version(repo, name: str, alias: str) -> str:
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(repo.env["MLFLOW_TRACKING_URI"])
    return MlflowClient().get_model_version_by_alias(name, alias).version


@pytest.fixture(scope="module")
def reasoning_free(repo):
    repo("sft_reasoning_free")
    return repo.work / "data" / "checkpoints" / "sft_reasoning_free"


@pytest.fixture(scope="module")
def bootstrap(repo):
    repo("reasoning_bootstrap", **{"reasoning_bootstrap.reasoning_overrides": {"teacher": {"kind": "sim", "p_wrong": 0.5}},
                                   "reasoning_bootstrap.k": 3})
    return repo.work / "data" / "reasoning" / "bootstrap"


@pytest.fixture(scope="module")
def refine(repo, reasoning_free, bootstrap):
    repo("reasoning_refine")
    return repo.work / "data" / "reasoning" / "refine"


@pytest.mark.timeout(900)
def test_sft_reasoning_free_trains_registers_and_loads(repo, reasoning_free):
    m = json.loads((repo.work / "data" / "checkpoints" / "sft_reasoning_free.json").read_text())
    assert m["steps"] == 4 and m["final_loss"] < m["first_loss"], m  # LLaMA-Factory lowers the loss
    assert m["tokens_per_s"] > 0 and m["prompt_format"] == {"mode": "xml", "prompt_style": "compact",
                                                            "max_history": 4, "coords": "marks"}
    assert (reasoning_free / "tiny.json").exists() and (reasoning_free / "trainer_log.jsonl").exists()
    assert json.loads((reasoning_free / "config.json").read_text())["use_cache"] is True
    assert isinstance(_generates(reasoning_free), str)
    assert _alias_version(repo, "mobilerl-policy", "reasoning-free-sft") == m["registered_version"]


def test_bootstrap_keeps_only_matching_candidates(repo, bootstrap):
    from mobilerl.env.actions import parse_action
    from mobilerl.sft.reasoning import actions_match, episodes_by_split

    m = json.loads((bootstrap.parent / "bootstrap.json").read_text())
    episodes = episodes_by_split({"collected": repo.work / "data" / "collect" / "stores" / "collected"}, 0.0, 0, "marks")
    expert = {st.step_id: st.action for ep in episodes["train"] for st in ep}
    assert m["steps"] == len(expert) and m["candidates"] == 3 * len(expert)
    proposals = [json.loads(line) for line in (bootstrap / "proposals.jsonl").read_text().splitlines()]
    assert len(proposals) == m["candidates"]
    rejected = [p for p in proposals if not p["accepted"]]
    assert rejected and all(not actions_match(parse_action(p["text"]), expert[p["step_id"]]) for p in rejected)
    kept = json.loads((bootstrap / "explanations.json").read_text())
    assert len(kept) == m["accepted_steps"] > 0
    assert m["acceptance_rate"] == m["accepted_steps"] / m["steps"]
    for step_id, text in kept.items():  # every kept explanation argues for the expert's action
        assert actions_match(parse_action(text), expert[step_id]) and "<think>" in text
    train = json.loads((bootstrap / "train.json").read_text())
    weights = json.loads((bootstrap / "stats.json").read_text())["action_weights"]  # carried from sft_data
    assert weights == {"Finish": 2.0}  # params.yaml: integer weights, so the count is exact
    assert len(train) == _copies(kept.values(), weights) > len(kept)
    for rec in train:
        sys_msg, user, answer = (x["content"] for x in rec["messages"])
        assert "<think>" in sys_msg and answer.startswith("<think>") and "</think><answer>" in answer
    # the histories show the kept explanations of the earlier steps
    assert any("Step 1: <think>" in rec["messages"][1]["content"] for rec in train)
    info = json.loads((bootstrap / "dataset_info.json").read_text())
    assert set(info) == {"mobilerl_reasoning_train", "mobilerl_reasoning_val"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_refine_records_acceptance_per_round(repo, refine):
    m = json.loads((refine.parent / "refine.json").read_text())
    assert m["rounds"] == 2 and set(m["acceptance_rate"]) == {"round_1", "round_2"}
    assert [r["round"] for r in m["per_round"]] == [1, 2]
    for r in m["per_round"]:
        assert r["steps"] == 3 and r["candidates"] == 6 and 0.0 <= r["acceptance_rate"] <= 1.0
        assert m["acceptance_rate"][f"round_{r['round']}"] == r["acceptance_rate"]
        assert r["train"]["steps"] == 2
    from mobilerl.sft.refine import without_timings

    # the dataset folder's copy leaves out the timings (a re-run with the same corpus writes the same bytes)
    stored = json.loads((refine / "rounds.json").read_text())
    assert stored == [without_timings(r) for r in m["per_round"]] and "propose_s" in m["per_round"][0]
    assert not {"propose_s", "score_s"} & set(stored[0]) and "wall_s" not in stored[0]["train"]
    kept = json.loads((refine / "explanations.json").read_text())
    boot = json.loads((refine.parent / "bootstrap" / "explanations.json").read_text())
    assert set(boot) <= set(kept)  # refinement replaces or adds explanations, never drops one
    weights = json.loads((refine / "stats.json").read_text())["action_weights"]
    assert len(json.loads((refine / "train.json").read_text())) == _copies(kept.values(), weights) > len(kept)
    ckpt = repo.work / "data" / "checkpoints" / "reasoning_refine"
    assert isinstance(_generates(ckpt), str)
    assert not list(ckpt.parent.glob(".reasoning_refine.*"))  # round work folders are cleaned up
    import mlflow

    mlflow.set_tracking_uri(repo.env["MLFLOW_TRACKING_URI"])
    run = mlflow.search_runs(experiment_names=["mobilerl"], filter_string="tags.`mobilerl.stage` = 'reasoning_refine'",
                             output_format="list")[0]
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "refine/acceptance_rate")
    assert sorted(h.step for h in history) == [1, 2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_reasoning_trains_the_corpus_from_the_reasoning_free_checkpoint(repo, refine):
    repo("sft_reasoning")
    m = json.loads((repo.work / "data" / "checkpoints" / "sft_reasoning.json").read_text())
    assert m["steps"] == 4 and m["final_loss"] < m["first_loss"], m
    assert m["base"].endswith("data/checkpoints/sft_reasoning_free") and "mobilerl_reasoning_train" in m["dataset"]
    ckpt = repo.work / "data" / "checkpoints" / "sft_reasoning"
    assert json.loads((ckpt / "tiny.json").read_text())["sft"]["dataset"] == "mobilerl_reasoning_train"
    assert isinstance(_generates(ckpt), str)
    assert _alias_version(repo, "mobilerl-policy", "reasoning-sft") == m["registered_version"]


def test_prompt_format_mismatch_is_refused(tmp_path):
    """A dataset built for another prompt format than the profile evaluates with is an error that names it."""
    from types import SimpleNamespace

    from mobilerl.sft.train import check_prompt_format

    profile = SimpleNamespace(name="tiny", generation=SimpleNamespace(obs_mode="xml", prompt_style="compact",
                                                                      max_history=None))
    (tmp_path / "stats.json").write_text(json.dumps({"mode": "xml", "prompt_style": "compact", "max_history": None}))
    assert check_prompt_format(tmp_path, profile)["mode"] == "xml"
    (tmp_path / "stats.json").write_text(json.dumps({"mode": "screenshot+xml", "prompt_style": "compact"}))
    with pytest.raises(ValueError, match=r"mode='screenshot\+xml'"):
        check_prompt_format(tmp_path, profile)


def test_a_base_pretrained_in_another_frame_is_refused(tmp_path):
    from mobilerl.sft.train import check_base_frame

    (tmp_path / "tiny.json").write_text(json.dumps({"profile": {"data": {"coords": "rel"}}}))
    check_base_frame(tmp_path, "rel")
    with pytest.raises(ValueError, match="'rel' frame, but the SFT data is in 'marks'"):
        check_base_frame(tmp_path, "marks")
    check_base_frame(tmp_path / "elsewhere", "marks")  # weights without tiny.json (large profiles): not checked


def test_refine_adopts_the_best_scored_matching_explanations(repo, bootstrap, tmp_path, monkeypatch):
    """The refinement loop with a scripted policy (training stubbed out): matching proposals are scored,
    the best one replaces the step's explanation, and the written corpus shows it."""
    import mobilerl.sft.llamafactory as LF
    import mobilerl.sft.refine as R
    from mobilerl.models.generation import Generation
    from mobilerl.sft.reasoning import PromptFormat, episodes_by_split

    stores = repo.work / "data" / "collect" / "stores"
    stats = json.loads((bootstrap / "stats.json").read_text())
    fmt = PromptFormat.of_dataset(stats)
    episodes = episodes_by_split({"collected": stores / "collected"}, stats["val_fraction"], stats["seed"],
                                 stats.get("coords", "abs"))

    def screen_key(user: str) -> str:  # the prompt without its history (which changes between rounds)
        return "\n".join(line for line in user.splitlines() if not line.startswith(("Step ", "Previous actions")))

    expert = {screen_key(st.messages(fmt)[1]["content"]): st.action for ep in episodes["train"] for st in ep}

    class Policy:
        async def generate(self, requests, sampling):
            action = expert[screen_key(requests[0].messages[1]["content"])]
            texts = [f"<think>refined, short</think><answer>{action}</answer>",
                     f"<think>refined, and a much longer explanation</think><answer>{action}</answer>",
                     '<think>wrong</think><answer>do(action="Back")</answer>' if action.name != "Back" else "junk"]
            return [Generation(texts[i % 3], [], [], "stop") for i in range(len(requests))]

        async def score(self, request, completion, *, temperature=1.0):
            return [-1.0 / len(completion)]  # prefers the longer explanation

    def fake_train(profile, *, output_dir, **kw):
        Path(output_dir).mkdir(parents=True)
        (Path(output_dir) / "config.json").write_text("{}")
        return LF.TrainResult(Path(output_dir), losses=[(1, 2.0), (2, 1.0)])

    monkeypatch.setattr(LF, "train_sft", fake_train)
    monkeypatch.setattr(R, "policy_backend", lambda profile, ckpt, extra: Policy())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = R.RefineConfig(rounds=2, k=3, steps_per_round=5, init=str(tmp_path / "init"))
    from mobilerl import tracking

    with tracking.stage_run("reasoning_refine"):
        m = R.refine(cfg, bootstrap, stores, tmp_path / "refine", tmp_path / "ckpt" / "reasoning_refine")
    for r in m["per_round"]:
        assert r["steps"] == 5 and r["candidates"] == 15 and r["accepted_candidates"] >= 2 * r["accepted_steps"]
        assert r["acceptance_rate"] >= 0.8 and r["changed"] >= 1
    kept = json.loads((tmp_path / "refine" / "explanations.json").read_text())
    refined = {k for k, v in kept.items() if "refined" in v}
    assert len(refined) >= 4 and all("much longer" in kept[k] for k in refined)  # the best-scored one
    train = json.loads((tmp_path / "refine" / "train.json").read_text())
    weights = json.loads((tmp_path / "refine" / "stats.json").read_text())["action_weights"]
    assert sum("much longer" in r["messages"][2]["content"] for r in train) == _copies([kept[k] for k in refined],
                                                                                       weights)
    assert (tmp_path / "ckpt" / "reasoning_refine" / "config.json").exists()
