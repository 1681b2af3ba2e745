"""Stage `reward_model`: fine-tune the judge on the lab/train traces and measure it on the held-out lab/test ones.

Builds the judge's dataset from ``data/reward/traces`` (the text form for the tiny profile; the concatenated
screenshots for the large ones), trains it from the profile's base with the SFT stages' LLaMA-Factory runner,
registers it in MLflow with the alias ``reward-model`` and scores the held-out traces beside the majority-class
and "ended with finish" baselines (:mod:`mobilerl.reward.train`). Refuses traces whose privacy audit failed.

Outs: ``data/checkpoints/reward_model`` (weights + ``reward_model.json``, what
:meth:`mobilerl.reward.judge.RewardModel.from_checkpoint` loads), ``data/reward/dataset``, ``data/reward/eval``
(predictions, rendered examples); metrics: ``data/reward/metrics.json`` (``accuracy``, ``precision``, ``recall``,
``f1``, ``n``, ``confusion``, ``by_source``, ``baselines``).
"""

from __future__ import annotations

from mobilerl.config import ROOT, load_params, read_json, repo_path, write_json
from mobilerl.reward.train import RewardModelConfig, train_and_evaluate

SECTION = "reward_model"
OUT = ROOT / "data" / "reward"


def main() -> None:
    cfg = load_params(SECTION, RewardModelConfig)
    audit = read_json(repo_path(cfg.traces) / "privacy_report.json")
    if audit.get("findings"):
        raise SystemExit(f"reward_model: {repo_path(cfg.traces)} failed its privacy audit; rerun reward_traces")
    metrics = train_and_evaluate(SECTION, cfg, ROOT / "data" / "checkpoints" / SECTION, OUT / "dataset",
                                 OUT / "eval")
    write_json(OUT / "metrics.json", metrics)
    b = metrics["baselines"]
    print(f"reward_model: held-out accuracy {metrics['accuracy']:.3f}, precision {metrics['precision']:.3f}, "
          f"recall {metrics['recall']:.3f}, F1 {metrics['f1']:.3f} on {metrics['n']} traces "
          f"({metrics['confusion']}); baselines: majority {b['majority_class']['accuracy']:.3f}, "
          f"ended with finish {b['ended_with_finish']['accuracy']:.3f}; registered v{metrics['registered_version']}")


if __name__ == "__main__":
    main()
