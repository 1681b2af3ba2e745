"""Stage `rl`: AdaGRPO online RL (MobileRL §2.2) from a warm-up checkpoint on the simulator's train tasks.

The stage is :func:`mobilerl.rl.run.run`; the config is :class:`mobilerl.rl.config.RLConfig` (mechanism
switches here, hyper-parameters in the profile's ``rl:`` section). A killed run resumes from its last checkpoint
in ``rl.work``. With ``rl.trainer_backend`` ddp / deepspeed it runs under a launcher (``torchrun
--nproc_per_node N -m stages.rl``): every rank trains, rank 0 alone rolls out, logs and writes (docs/rl.md).
Outs: the policy in ``data/checkpoints/adagrpo`` (MLflow alias ``adagrpo``) and its per-round curve
``data/checkpoints/adagrpo.curve.jsonl``; metrics ``data/checkpoints/adagrpo.json``.
"""

from __future__ import annotations

import json

from mobilerl import tracking
from mobilerl.config import ROOT, checked_settings, load_params, write_json
from mobilerl.rl.config import RLConfig
from mobilerl.rl.distributed import launch_rank
from mobilerl.rl.run import run

CHECKPOINTS = ROOT / "data" / "checkpoints"


def main() -> None:
    cfg = load_params("rl", RLConfig)
    checked_settings(cfg)  # a bad override fails before anything runs, naming rl.overrides.<key>
    if launch_rank() != 0:  # a data-parallel follower (torchrun -m stages.rl): rank 0 logs, writes and registers
        run(cfg, ROOT, progress=False)
        return
    with tracking.stage_run("rl", cfg.model_dump()) as run_:
        summary, curve = run(cfg, ROOT, log_metrics=tracking.log_metrics, log_images=tracking.log_images)
        summary["registered_version"] = tracking.register_model(ROOT / cfg.out, cfg.registered_model, cfg.alias)
        summary["mlflow_run_id"] = run_.info.run_id
    (CHECKPOINTS / "adagrpo.curve.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    write_json(CHECKPOINTS / "adagrpo.json", summary)
    print(f"rl: {summary['rounds']} rounds in {summary['wall_s'] / 60:.1f} min; rollout success "
          f"{summary['success_first5']:.3f} (first 5) -> {summary['success_last5']:.3f} (last 5); "
          f"registered {cfg.registered_model}@{cfg.alias} v{summary['registered_version']}")


if __name__ == "__main__":
    main()
