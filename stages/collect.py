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

import shutil
from typing import Literal

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, load_params, write_json

TASKS = ROOT / "data" / "tasks" / "suites"
OUT = ROOT / "data" / "collect"
STORES = OUT / "stores"


class MaskingConfig(StageConfig):
    mode: Literal["token", "surrogate"] = Field(
        "surrogate", description="token: [PHONE] (the paper); surrogate: consistent realistic fakes.")
    known_categories: list[Literal["PERSON_NAME", "ADDRESS"]] = Field(
        ["PERSON_NAME", "ADDRESS"], description="Planted values masked as known values (regex-less categories).")
    faces: bool = Field(True, description="Mask faces (Haar cascades).")
    qr: bool = Field(True, description="Mask QR codes.")
    ocr: bool = Field(False, description="OCR screenshots and mask flagged text (slow: ~1 s per image).")
    thorough_faces: bool = Field(False, description="All face cascades at 1280 px (slower, smaller faces).")
    style: Literal["fill", "blur"] = Field("fill", description="How masked image regions are hidden.")
    image_max_side: int | None = Field(1200, ge=64, description="Stored screenshot size (longer side; null: as captured).")
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
    max_tasks: int | None = Field(None, ge=1, description="Cap on the number of tasks, spread over templates.")
    n_trials: int = Field(1, ge=1, description="Episodes per task.")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(4, ge=1, description="Episodes in flight (env pool size).")
    mask_workers: int = Field(2, ge=1, description="Threads masking screenshots.")
    seed: int = Field(0, description="Base seed of the policies.")
    replay_check: bool = Field(True, description="Replay every stored episode and compare verifier results.")
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    human_dirs: list[str] = Field([], description="Human-annotated exports (episodes.jsonl + images) to import.")
    androidcontrol: AndroidControlConfig = Field(default_factory=AndroidControlConfig)


def load_tasks(suite: str, split: str, per_template: int | None = None) -> list:
    """The first ``per_template`` tasks of each template from the `tasks` stage's list."""
    import json

    from mobilerl.env.base import TaskSpec

    path = TASKS / f"{suite}_{split}.jsonl"
    if not path.exists():
        raise SystemExit(f"collect: {path} not found: run the `tasks` stage first (dvc repro tasks)")
    out, seen = [], {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = TaskSpec.from_dict(json.loads(line))
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(f"{path}:{lineno}: corrupt task record: {e}") from None
        seen[t.template] = seen.get(t.template, 0) + 1
        if per_template is None or seen[t.template] <= per_template:
            out.append(t)
    return out


def _tasks(cfg: CollectConfig):
    tasks = load_tasks(cfg.suite, cfg.split, cfg.n_per_template)
    if cfg.max_tasks is not None and len(tasks) > cfg.max_tasks:
        step = len(tasks) / cfg.max_tasks
        tasks = [tasks[int(i * step)] for i in range(cfg.max_tasks)]
    return tasks


def _masking(cfg: CollectConfig):
    from mobilerl.data.collect import MaskingOptions

    m = cfg.masking
    return MaskingOptions(mode=m.mode, known_categories=tuple(m.known_categories), faces=m.faces, qr=m.qr,
                          ocr=m.ocr, thorough_faces=m.thorough_faces, style=m.style,
                          image_max_side=m.image_max_side, seed=m.seed)


def run(cfg: CollectConfig) -> dict:
    from mobilerl.agent import OraclePolicy
    from mobilerl.data.androidcontrol import convert_to_store
    from mobilerl.data.collect import collect_sync, import_human, replay_check

    if STORES.exists():
        shutil.rmtree(STORES)
    STORES.mkdir(parents=True)
    opts = _masking(cfg)
    tasks = _tasks(cfg)
    policy = OraclePolicy()
    res = collect_sync(lambda seed: policy, tasks, STORES / "collected", masking=opts, n_trials=cfg.n_trials,
                       concurrency=cfg.concurrency, perturb=cfg.perturb, base_seed=cfg.seed,
                       mask_workers=cfg.mask_workers, source="collected")
    metrics: dict = {"collected": res.summary(), "tasks": len(tasks)}
    if cfg.replay_check:
        rep = replay_check(STORES / "collected", res.secrets, perturb=cfg.perturb)
        metrics["replay"] = {k: (len(v) if isinstance(v, list) else v) for k, v in rep.items()}
        metrics["replay"]["differ_ids"] = rep["differ"][:20]
    res.secrets.clear()  # the raw values live no longer than needed
    for i, d in enumerate(cfg.human_dirs):
        name = "human" if len(cfg.human_dirs) == 1 else f"human{i}"
        metrics[name] = import_human(ROOT / d, STORES / name, masking=opts).summary()
    if cfg.androidcontrol.paths:
        ac = cfg.androidcontrol
        metrics["androidcontrol"] = convert_to_store([ROOT / p for p in ac.paths], STORES / "androidcontrol",
                                                     split=ac.split, masking=opts, max_episodes=ac.max_episodes,
                                                     add_finish=ac.add_finish).summary()
    return metrics


def main() -> None:
    cfg = load_params("collect", CollectConfig)
    with tracking.stage_run("collect", cfg.model_dump()) as run_:
        metrics = run(cfg)
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
