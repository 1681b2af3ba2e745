"""Stage `collect`: expert trajectories with privacy masking before storage (MobileRL App. D, D.2).

Runs the policy (the simulator's oracle by default) over a task list of the `tasks` stage through the
async env pool, masks every step in memory (texts and screenshots) and writes a trajectory store; then
replays every stored episode (surrogates put back in memory) and checks it reaches the same verifier
result. Optionally imports human-annotated exports and converts AndroidControl files into stores of their
own, through the same masking.

Outs: ``data/collect/stores/{collected,human,androidcontrol}/`` (Parquet + PNG, ``docs/data_schema.md``);
metrics: ``data/collect/metrics.json``. Fails when a planted value survives masking (the episode is not
written) or when a replay does not reproduce its stored result.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.agent import OraclePolicy
from mobilerl.config import ROOT, StageConfig, load_params, repo_path, write_json
from mobilerl.data.collect import collect_stores
from mobilerl.data.masking import MaskingOptions
from mobilerl.tasks import load_tasks, spread

OUT = ROOT / "data" / "collect"
STORES = OUT / "stores"


class MaskingConfig(StageConfig):
    mode: Literal["token", "surrogate"] = Field(
        "surrogate", description="token: [PHONE] (the paper); surrogate: consistent realistic fakes.")
    known_categories: list[Literal["PERSON_NAME", "ADDRESS"]] = Field(
        ["PERSON_NAME", "ADDRESS"], description="Planted values masked as known values (regex-less categories).")
    faces: bool = Field(True, description="Mask faces (Haar cascades).")
    qr: bool = Field(True, description="Mask QR codes.")
    ocr: bool = Field(False, description="OCR every screenshot and mask flagged text (~1 s each; the audit "
                                          "OCRs the stored ones regardless).")
    thorough_faces: bool = Field(False, description="All face cascades at 1280 px (slower, smaller faces).")
    style: Literal["fill", "blur"] = Field("fill", description="How masked image regions are hidden.")
    image_max_side: int | None = Field(
        1200, ge=64, description="Stored screenshot size, longer side (null: as captured, 1080x2400).")
    seed: int = Field(0, description="Seed of the surrogate values.")


class AndroidControlConfig(StageConfig):
    paths: list[str] = Field([], description="AndroidControl TFRecord (GZIP) or JSONL episode files.")
    split: str = Field("train", description="Split name recorded in the task ids.")
    max_episodes: int | None = Field(None, ge=1, description="Cap on converted episodes.")
    add_finish: bool = Field(True, description="Append a finish() step on the last screen.")


class CollectConfig(StageConfig):
    suite: Literal["world", "lab"] = Field("world", description="Task suite to collect on.")
    split: Literal["train", "test"] = Field("train", description="Its split (train: never the benchmark).")
    policy: Literal["oracle"] = Field("oracle", description="Policy (model policies join with the SFT stages).")
    n_per_template: int | None = Field(2, ge=1, description="Tasks per template from the task list (null: all).")
    max_tasks: int | None = Field(None, ge=1, description="Cap on the total, spread over templates (null: no cap).")
    n_trials: int = Field(1, ge=1, description="Episodes per task.")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(4, ge=1, description="Episodes in flight (env pool size).")
    mask_workers: int = Field(2, ge=1, description="Threads masking screenshots.")
    seed: int = Field(0, description="Base seed of the policies.")
    replay_check: bool = Field(True, description="Replay every stored episode and compare verifier results.")
    masking: MaskingConfig = Field(default_factory=MaskingConfig, description="How data is masked before storage.")
    human_dirs: list[str] = Field(
        [], description="Human-annotated exports to import (episodes.jsonl + images, docs/data_schema.md).")
    androidcontrol: AndroidControlConfig = Field(default_factory=AndroidControlConfig,
                                                  description="AndroidControl files converted into a store.")


def masking_options(m: MaskingConfig) -> MaskingOptions:
    return MaskingOptions(mode=m.mode, known_categories=tuple(m.known_categories), faces=m.faces, qr=m.qr,
                          ocr=m.ocr, thorough_faces=m.thorough_faces, style=m.style,
                          image_max_side=m.image_max_side, seed=m.seed)


def main() -> None:
    cfg = load_params("collect", CollectConfig)
    tasks = spread(load_tasks(cfg.suite, cfg.split, cfg.n_per_template), cfg.max_tasks, float_step=True)
    policy = OraclePolicy()
    ac = cfg.androidcontrol
    with tracking.stage_run("collect", cfg.model_dump()) as run_:
        metrics = collect_stores(
            STORES, tasks, masking_options(cfg.masking), lambda seed: policy, n_trials=cfg.n_trials,
            concurrency=cfg.concurrency, perturb=cfg.perturb, base_seed=cfg.seed, mask_workers=cfg.mask_workers,
            replay=cfg.replay_check, human_dirs=[repo_path(d) for d in cfg.human_dirs],
            androidcontrol={"paths": [repo_path(p) for p in ac.paths], "split": ac.split,
                            "max_episodes": ac.max_episodes, "add_finish": ac.add_finish})
        tracking.log_metrics({"collect": {k: v for k, v in metrics.items() if k != "replay"},
                              "collect/replay": metrics.get("replay", {})})
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(OUT / "metrics.json", metrics)
    c = metrics["collected"]
    print(f"collect: {c['episodes']} episodes, {c['steps']} steps, success {c['success_rate']}, "
          f"masked text spans {c['masked_text_spans']}, image regions {c['masked_image_regions']}, "
          f"{c['wall_s']:.0f}s")
    if "replay" in metrics:
        print(f"collect: replay {metrics['replay']}")
    problems = []
    if c["leaks_blocked"]:
        problems.append(f"{c['leaks_blocked']} episodes still held planted values after masking "
                        f"({c['leaked_categories']}); they were not written")
    if metrics.get("replay", {}).get("differ"):
        problems.append(f"{metrics['replay']['differ']} stored episodes replay to a different verifier result")
    if c["episodes"] == 0:
        problems.append("no episode was collected")
    if problems:
        raise SystemExit("collect: " + "; ".join(problems))


if __name__ == "__main__":
    main()
