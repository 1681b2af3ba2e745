"""The `reward_model` stage's library: the judge's SFT data, its training, its measured accuracy.

:func:`build_dataset` turns the ``reward_traces`` lab/train traces into a LLaMA-Factory sharegpt dataset (the
judge's chat, :func:`~mobilerl.reward.judge.judge_messages`, and its answer, :func:`~mobilerl.reward.judge.target`).
:func:`train_and_evaluate` trains it from the profile's base with the SFT stages' runner
(:func:`mobilerl.sft.train.train`), registers it in MLflow, and scores the held-out lab/test traces:
accuracy, precision, recall, F1 and the confusion matrix, overall and per source policy, beside two baselines
(the training set's majority class; "the episode ended with finish"), and the zero-shot judge when an
OpenAI-compatible endpoint is configured. A score above the judge's threshold is a predicted success: the
threshold is chosen on the training traces (:func:`choose_threshold`), never on the held-out ones, and saved in
the judge's settings; :func:`calibration` bins the held-out scores for the report's reliability diagram.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import StageConfig, repo_path
from mobilerl.eval.render import render_png
from mobilerl.reward.judge import JudgeSettings, RewardModel, judge_messages, target
from mobilerl.reward.traces import read_index
from mobilerl.sft.train import SFTConfig, train
from mobilerl.trajectory import Trajectory

DATASET = "mobilerl_reward"


class ZeroShotConfig(StageConfig):
    """``reward_model.zero_shot``: a judge through any OpenAI-compatible endpoint, measured beside the trained one."""

    base_url: str | None = Field(None, description="Endpoint, e.g. http://127.0.0.1:8000/v1 (null: not run).")
    model: str | None = Field(None, description="Served model name (null: the server's first).")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key.")
    samples: int = Field(3, ge=1, description="Sampled answers a trace; the majority vote decides.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the votes.")
    max_new_tokens: int = Field(512, ge=1, description="Answer cap (reasoning included).")
    max_traces: int | None = Field(200, ge=1, description="Held-out traces it scores (null: all).")


class RewardModelConfig(StageConfig):
    """``reward_model``: the judge's format, its fine-tuning and its evaluation."""

    profile: str = Field("tiny", description="Model profile in configs/models/ (schedule and backend).")
    base: str | None = Field("models/tiny-base", description="Starting weights (null: the profile's).")
    traces: str = Field("data/reward/traces", description="The reward_traces folder (index.jsonl, stores/).")
    answer: Literal["think", "score"] = Field("score", description="Answer <think>…</think><answer>1|0</answer> "
                                                                   "or the bare 1|0.")
    view: Literal["text", "image"] = Field("text", description="text: the text form (tiny profile); image: the "
                                                               "concatenated screenshots + action descriptions.")
    screens: int = Field(1, ge=0, description="Last screens whose compressed XML the text form shows.")
    overrides: dict[str, Any] = Field({}, description="LLaMA-Factory arguments over the profile's (max_steps, "
                                                      "...); a null value keeps the profile's.")
    timeout_minutes: float | None = Field(None, gt=0, description="Kill the training after this long (null: no limit).")
    max_new_tokens: int = Field(96, ge=8, description="Answer cap of the think format.")
    examples: int = Field(4, ge=0, description="Held-out traces rendered for the report, right and wrong each.")
    registered_model: str = Field("mobilerl-reward-model", description="MLflow registered model name.")
    alias: str = Field("reward-model", description="MLflow alias of the registered version.")
    zero_shot: ZeroShotConfig = Field(default_factory=ZeroShotConfig, description="The zero-shot judge.")

    def settings(self) -> JudgeSettings:
        return JudgeSettings(answer=self.answer, view=self.view, screens=self.screens)


def load_traces(traces: Path, split: str) -> list[tuple[Trajectory, dict[str, Any], Path]]:
    """The kept traces of ``split`` (train | test): ``(trajectory, index row, store root)``, in index order."""
    from mobilerl.data.store import iter_store

    rows = [r for r in read_index(traces) if r["split"] == split]
    out = []
    for store in dict.fromkeys(r["store"] for r in rows):
        root = traces / "stores" / store
        by_id = {t.episode_id: t for t in iter_store(root)}
        for r in (r for r in rows if r["store"] == store):
            if r["episode_id"] not in by_id:
                raise ValueError(f"{traces / 'index.jsonl'}: {r['episode_id']} is not in store {root}")
            out.append((by_id[r["episode_id"]], r, root))
    return out


def build_dataset(items: Sequence[tuple[Trajectory, dict[str, Any], Path]], settings: JudgeSettings,
                  out: Path) -> dict[str, Any]:
    """The judge's LLaMA-Factory dataset ``{DATASET}_train`` in ``out`` (replaced); returns its stats."""
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    records = []
    for k, (traj, row, root) in enumerate(items):
        messages, images = judge_messages(traj, settings, root)
        rec: dict[str, Any] = {"messages": [*messages, {"role": "assistant",
                                                         "content": target(traj, int(row["label"]), settings.answer)}]}
        if images:
            name = f"images/{k:05d}.png"
            images[0].save(out / name)
            rec["images"] = [name]
        records.append(rec)
    (out / "train.json").write_text(json.dumps(records, ensure_ascii=False, indent=0) + "\n")
    columns = {"messages": "messages", **({"images": "images"} if settings.view == "image" else {})}
    info = {f"{DATASET}_train": {"file_name": "train.json", "formatting": "sharegpt", "columns": columns,
                                 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                          "assistant_tag": "assistant", "system_tag": "system"}}}
    (out / "dataset_info.json").write_text(json.dumps(info, indent=1) + "\n")
    stats = {"records": len(records), "positive": sum(int(r["label"]) for _, r, _ in items),
             "answer": settings.answer, "view": settings.view, "screens": settings.screens}
    (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
    return stats


def binary_metrics(pred: Sequence[int], labels: Sequence[int]) -> dict[str, Any]:
    """Accuracy, precision, recall, F1 (of the success class) and the confusion matrix; 0 where undefined."""
    tp = sum(p == 1 and y == 1 for p, y in zip(pred, labels, strict=True))
    fp = sum(p == 1 and y == 0 for p, y in zip(pred, labels, strict=True))
    tn = sum(p == 0 and y == 0 for p, y in zip(pred, labels, strict=True))
    fn = sum(p == 0 and y == 1 for p, y in zip(pred, labels, strict=True))
    n = len(labels)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"accuracy": (tp + tn) / n if n else 0.0, "precision": precision, "recall": recall, "f1": f1, "n": n,
            "confusion": {"tp": tp, "fp": fp, "tn": tn, "fn": fn}}


def choose_threshold(scores: Sequence[float], labels: Sequence[int]) -> float:
    """The threshold with the highest accuracy of ``score > t`` on ``(scores, labels)`` (the training traces),
    among 0.5 and the midpoints between distinct scores; of equals, the one nearest 0.5."""
    xs = sorted(set(scores))
    candidates = [0.5, *((a + b) / 2 for a, b in zip(xs, xs[1:], strict=False))]

    def acc(t: float) -> float:
        return sum((s > t) == bool(y) for s, y in zip(scores, labels, strict=True)) / max(1, len(labels))

    best = max(candidates, key=lambda t: (acc(t), -abs(t - 0.5)))
    return min(max(best, 1e-6), 1 - 1e-6)


def calibration(scores: Sequence[float], labels: Sequence[int], bins: int = 10) -> dict[str, Any]:
    """Reliability of P(completed): per equal-width score bin, its traces, mean score and share of successes;
    ``ece`` is the expected calibration error (the bins' |mean score − success share|, weighted by traces)."""
    rows = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, s in enumerate(scores) if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if idx:
            rows.append({"low": lo, "high": hi, "n": len(idx), "mean_score": sum(scores[i] for i in idx) / len(idx),
                         "success_rate": sum(labels[i] for i in idx) / len(idx)})
    n = max(1, len(scores))
    return {"bins": rows, "ece": sum(r["n"] * abs(r["mean_score"] - r["success_rate"]) for r in rows) / n}


def judge_report(pred: Sequence[int], labels: Sequence[int], policies: Sequence[str]) -> dict[str, Any]:
    """:func:`binary_metrics` overall, and per source policy under ``by_source``."""
    out = binary_metrics(pred, labels)
    out["by_source"] = {name: binary_metrics([p for p, q in zip(pred, policies, strict=True) if q == name],
                                             [y for y, q in zip(labels, policies, strict=True) if q == name])
                        for name in sorted(set(policies))}
    return out


def zero_shot_judge(cfg: ZeroShotConfig, settings: JudgeSettings, transport: Any = None) -> RewardModel:
    """The k-sample zero-shot judge of ``cfg`` (``transport``: an httpx transport, for recorded responses)."""
    import os

    from mobilerl.models.openai_backend import OpenAIBackend

    if cfg.base_url is None:
        raise ValueError("reward_model.zero_shot.base_url: not set")
    key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if cfg.api_key_env and not key:
        raise ValueError(f"reward_model.zero_shot.api_key_env: environment variable {cfg.api_key_env!r} is not set")
    backend = OpenAIBackend(cfg.base_url, model=cfg.model, api_key=key, vllm_extensions=False, transport=transport,
                            name="zero-shot-judge")
    return RewardModel(backend, JudgeSettings("think", settings.view, settings.screens), samples=cfg.samples,
                       temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)


def train_and_evaluate(section: str, cfg: RewardModelConfig, out: Path, dataset_dir: Path, eval_dir: Path
                       ) -> dict[str, Any]:
    """Build the dataset, train the judge into ``out``, register it, score the held-out traces (the stage)."""
    traces = repo_path(cfg.traces)
    settings = cfg.settings()
    train_items, test_items = load_traces(traces, "train"), load_traces(traces, "test")
    if {r["task_id"] for _, r, _ in train_items} & {r["task_id"] for _, r, _ in test_items}:
        raise ValueError(f"{traces}: a held-out task has traces in the training split")
    sft = SFTConfig(profile=cfg.profile, base=cfg.base, dataset_dir=str(dataset_dir), dataset=f"{DATASET}_train",
                    overrides=cfg.overrides, check_prompt_format=False, timeout_minutes=cfg.timeout_minutes,
                    registered_model=cfg.registered_model, alias=cfg.alias)
    with tracking.stage_run(section, cfg.model_dump()) as run_:
        data = build_dataset(train_items, settings, dataset_dir)
        metrics: dict[str, Any] = {"dataset": data, "train": train(sft, out, prefix="reward_model/")}
        settings.save(out)
        metrics.update(evaluate(cfg, out, train_items, test_items, eval_dir))  # saves the chosen threshold
        metrics["registered_version"] = tracking.register_model(out, cfg.registered_model, cfg.alias)
        figures = {k: metrics[k] for k in ("accuracy", "precision", "recall", "f1", "threshold")}
        tracking.log_metrics({"reward_model": {**figures, "ece": metrics["calibration"]["ece"]},
                              "reward_model/baselines": {f"{b}/accuracy": m["accuracy"]
                                                         for b, m in metrics["baselines"].items()}})
        metrics["mlflow_run_id"] = run_.info.run_id
    return metrics


def evaluate(cfg: RewardModelConfig, model_dir: Path, train_items: Sequence, test_items: Sequence,
             eval_dir: Path) -> dict[str, Any]:
    """The trained judge (and the zero-shot one) on the held-out traces, beside the baselines; writes
    ``predictions.jsonl`` and rendered ``examples/`` into ``eval_dir``."""
    from mobilerl.models.backends import profile_spec
    from mobilerl.models.profiles import load_profile

    spec = {k: v for k, v in profile_spec(load_profile(cfg.profile)).items() if k != "model"}
    judge = RewardModel.from_checkpoint(model_dir, spec, max_new_tokens=cfg.max_new_tokens)
    train_scores = judge.score([t for t, _, _ in train_items], [root for _, _, root in train_items])
    threshold = choose_threshold(train_scores, [int(r["label"]) for _, r, _ in train_items])
    dataclasses.replace(judge.settings, threshold=threshold).save(model_dir)
    trajs = [t for t, _, _ in test_items]
    roots = [root for _, _, root in test_items]
    labels = [int(r["label"]) for _, r, _ in test_items]
    policies = [r["policy"] for _, r, _ in test_items]
    scores = judge.score(trajs, roots)
    pred = [int(s > threshold) for s in scores]
    majority = int(2 * sum(int(r["label"]) for _, r, _ in train_items) >= len(train_items))
    result: dict[str, Any] = judge_report(pred, labels, policies)
    result["threshold"] = threshold
    result["calibration"] = calibration(scores, labels)
    result["unparsed_answers"] = judge.unparsed
    result["baselines"] = {"majority_class": binary_metrics([majority] * len(labels), labels),
                           "ended_with_finish": binary_metrics([int(t.finished) for t in trajs], labels)}
    if cfg.zero_shot.base_url:
        k = cfg.zero_shot.max_traces or len(trajs)
        zs = zero_shot_judge(cfg.zero_shot, cfg.settings()).score(trajs[:k], roots[:k])
        result["zero_shot"] = judge_report([int(s > 0.5) for s in zs], labels[:k], policies[:k])
    if eval_dir.exists():
        shutil.rmtree(eval_dir)
    (eval_dir / "examples").mkdir(parents=True)
    with (eval_dir / "predictions.jsonl").open("w", encoding="utf-8") as f:
        for (traj, row, _), s, p in zip(test_items, scores, pred, strict=True):
            f.write(json.dumps({"episode_id": traj.episode_id, "store": row["store"], "policy": row["policy"],
                                "label": int(row["label"]), "score": s, "pred": p}) + "\n")
    shown = {"right": 0, "wrong": 0}
    for (traj, row, root), p in sorted(zip(test_items, pred, strict=True),
                                       key=lambda it: not any(s.screenshot_path for s in it[0][0].steps)):
        kind = "right" if p == int(row["label"]) else "wrong"
        if shown[kind] < cfg.examples:
            render_png(traj, root, eval_dir / "examples" / f"{kind}_{shown[kind]}.png")
            shown[kind] += 1
    return result
