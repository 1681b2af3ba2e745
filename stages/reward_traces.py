"""Stage `reward_traces`: labelled lab-suite traces of policies of graded quality, for the reward model.

The oracle, noisy oracles, the oracle that declares the task done early, the SFT and RL checkpoints (where present)
and the random policy roll out on lab/train and lab/test (:mod:`mobilerl.reward.traces`); every episode is
masked before storage and the stores pass the privacy audit or the stage fails. Labels: the verifier on
lab/test, the simulator's hidden check on lab/train (optionally noised); classes balanced; split by task.

Outs: ``data/reward/traces/`` (``stores/``, ``index.jsonl``, ``privacy_report.json``); metrics:
``data/reward/traces.json``.
"""

from __future__ import annotations

from mobilerl import tracking
from mobilerl.config import ROOT, load_params, write_json
from mobilerl.reward.traces import RewardTracesConfig, collect_traces

OUT = ROOT / "data" / "reward"
SECTION = "reward_traces"


def main() -> None:
    cfg = load_params(SECTION, RewardTracesConfig)
    with tracking.stage_run(SECTION, cfg.model_dump()) as run_:
        metrics = collect_traces(cfg, OUT / "traces")
        tracking.log_metrics({SECTION: {s: {k: v for k, v in metrics[s].items() if k != "by_source"}
                                        for s in ("train", "test")}})
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(OUT / "traces.json", metrics)
    for s in ("train", "test"):
        m = metrics[s]
        print(f"reward_traces: {s}: {m['kept']} of {m['collected']} traces kept ({m['positive']} positive) over "
              f"{m['tasks']} tasks; {m['by_source']}")
    privacy = metrics["privacy"]
    print(f"reward_traces: privacy audit: {privacy['findings']} findings")
    if not privacy["passed"]:
        raise SystemExit(f"reward_traces: the privacy audit found {privacy['findings']} items "
                         f"({privacy['findings_by_category']}); see {OUT / 'traces' / 'privacy_report.json'}")


if __name__ == "__main__":
    main()
