"""AdaGRPO ablations (MobileRL Table 4c, Figure 4b, Figure 6, Appendix E.5): one *cell* per variant × seed.

A variant is a set of :class:`~mobilerl.rl.config.RLConfig` overrides (``configs/ablation.yaml``, data, not
code), applied over ``params.yaml``'s ``rl:`` section and the table's ``cell:`` budget. A cell trains with the
`rl` stage's code (:func:`mobilerl.rl.run.run`) in its own folder ``<dir>/<variant>/seed<k>/`` (``work/``
the resumable run, ``policy/`` the trained policy), then evaluates the policy greedily with the verifier on the
test tasks of the pool's templates (E.5 variants: on the held-out half of the test split), and writes
``result.json``: the per-round curve, the evaluation and each episode's steps (for the SPA win rate).

``cell.json`` holds the cell's full config; ``result.json`` records its fingerprint, so a rerun with the same
parameters skips a finished cell, and a killed one resumes from its last rl checkpoint (the trainer resumes from
``work/`` when the config is the same). ``python -m mobilerl.rl.ablation <cell dir>`` runs one cell (what the
Prefect flow ``pipelines/ablation.py`` starts, one process a cell).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from mobilerl.config import ROOT, StageConfig, write_json
from mobilerl.env.base import TaskSpec
from mobilerl.rl.config import RLConfig

log = logging.getLogger(__name__)

TABLE = ROOT / "configs" / "ablation.yaml"
CELLS = ROOT / "experiments" / "ablation"
INIT = "init"  # the reference cell: the RL init evaluated as the cells are, without training


class EvalSpec(StageConfig):
    """How a cell's policy is evaluated: greedy, verifier-scored, on test tasks it was not trained on."""

    per_template: int | None = Field(
        4, ge=1, description="Test tasks per template of the pool's templates (None: all); E.5 variants use the "
                             "whole held-out half.")
    processes: int = Field(2, ge=1, description="Evaluation worker processes, each loading the policy.")


class AblationTable(StageConfig):
    """``configs/ablation.yaml``: the shared cell budget, the evaluation, the default variants and the variants."""

    cell: dict[str, Any] = Field(default_factory=dict,
                                 description="RLConfig fields every cell sets over params.yaml's rl: (its budget).")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="The evaluation of every cell's policy.")
    default: list[str] = Field(description="Variants the deployment runs when none are named.")
    variants: dict[str, dict[str, Any]] = Field(description="Variant name -> RLConfig overrides over the cell budget.")

    @model_validator(mode="after")
    def _known_defaults(self) -> AblationTable:
        unknown = [v for v in self.default if v not in self.variants]
        if unknown:
            raise ValueError(f"default: unknown variant(s) {unknown}")
        if INIT in self.variants:
            raise ValueError(f"variants: {INIT!r} is the reference cell (the RL init, untrained), not a variant")
        if "full" not in self.variants:
            raise ValueError("variants: needs 'full', the reference every ablation is compared with")
        return self


def load_table(path: Path = TABLE) -> AblationTable:
    try:
        return AblationTable.model_validate(yaml.safe_load(path.read_text()) or {})
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found") from None
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{path}: {problems}") from None


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; a dict value (``overrides``) merges key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def cell_dir(variant: str, seed: int, cells: Path = CELLS) -> Path:
    return cells / variant / f"seed{seed}"


def cell_spec(table: AblationTable, variant: str, seed: int, base_rl: dict[str, Any], root: Path = ROOT,
              cells: Path = CELLS, rounds: int | None = None, eval_per_template: int | None = None) -> dict[str, Any]:
    """The full config of one cell (what ``cell.json`` holds): the RLConfig (params.yaml's ``rl:`` ← the table's
    ``cell:`` ← the variant ← seed, ``rounds``, the cell's own ``work``/``out``) and the evaluation, validated;
    errors name the variant and the key. Variant :data:`INIT` is the reference cell: no training (``train``
    false), its evaluation runs ``rl.init``."""
    if variant not in table.variants and variant != INIT:
        raise ValueError(f"unknown variant {variant!r} (configs/ablation.yaml has {', '.join(table.variants)})")
    overrides = table.variants.get(variant, {})
    where = cell_dir(variant, seed, cells)
    rel = where.relative_to(root).as_posix() if where.is_relative_to(root) else str(where)
    own = {"seed": seed, "work": f"{rel}/work", "out": f"{rel}/policy", **({"rounds": rounds} if rounds else {})}
    d = merged(base_rl, table.cell, overrides, own)
    known = {f.alias or k for k, f in RLConfig.model_fields.items()} | set(RLConfig.model_fields)
    missing = sorted(set(d) - known)
    if missing:
        raise ValueError(f"configs/ablation.yaml: variant {variant!r}: RLConfig has no field {missing}")
    try:
        cfg = RLConfig.model_validate(d)
        cfg.settings()
    except ValidationError as e:
        problems = "; ".join(f"rl.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"configs/ablation.yaml: variant {variant!r}: {problems}") from None
    except ValueError as e:
        raise ValueError(f"configs/ablation.yaml: variant {variant!r}: {e}") from None
    ev = table.eval.model_copy(update={"per_template": eval_per_template} if eval_per_template else {})
    # the fingerprint reads the fields set away from their defaults, so a new option (off) keeps finished cells
    return {"variant": variant, "seed": seed, "overrides": overrides, "train": variant != INIT,
            "rl": cfg.model_dump(), "rl_set": cfg.model_dump(exclude_defaults=True), "eval": ev.model_dump()}


def fingerprint(spec: dict[str, Any]) -> str:
    key = {"rl": spec.get("rl_set", spec["rl"]), "eval": spec["eval"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def is_done(spec: dict[str, Any], where: Path) -> bool:
    """The cell finished with exactly this config (its ``result.json`` carries the same fingerprint)."""
    try:
        return json.loads((where / "result.json").read_text()).get("fingerprint") == fingerprint(spec)
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def eval_tasks(cfg: RLConfig, per_template: int | None, root: Path = ROOT) -> list[TaskSpec]:
    """The cell's evaluation tasks: the test tasks (first ``per_template`` of each template) of the templates the
    pool keeps (``templates_max_steps``); with ``test_half``, the other half of the split the pool trained on."""
    from mobilerl.tasks import halves, load_tasks

    lists = root / "data" / "tasks" / "suites"
    test = load_tasks(cfg.suite, "test", root=lists)
    longest: dict[str, int] = {}
    for t in test:
        longest[t.template] = max(longest.get(t.template, 0), t.optimal_steps)
    keep = {k for k, v in longest.items() if cfg.templates_max_steps is None or v <= cfg.templates_max_steps}
    if cfg.test_half is not None:
        tasks = halves(load_tasks(cfg.suite, "test", per_template=cfg.tasks_per_template, root=lists))[1 - cfg.test_half]
    else:
        tasks = load_tasks(cfg.suite, "test", per_template=per_template, root=lists)
    return [t for t in tasks if t.template in keep]


def evaluate_policy(name: str, cfg: RLConfig, tasks: list[TaskSpec], processes: int, root: Path,
                    out_path: Path) -> list:
    """The trained policy (``cfg.out``) greedy on ``tasks`` with the `evaluate` stage's checkpoint policy, its
    responses capped as in training (``max_new_tokens``); trajectories kept in ``out_path``."""
    from mobilerl.eval.checkpoints import checkpoint_policy, run_checkpoint
    from mobilerl.eval.config import EvaluateConfig
    from mobilerl.eval.runner import evaluate_sync

    ecfg = EvaluateConfig(
        suites=[cfg.suite], policies=[name], profile=cfg.profile, temperature=0.0, n_trials=1, seed=0,
        model_processes=processes,
        checkpoints={name: {"path": str(root / cfg.out), "reasoning": cfg.reasoning,
                            "max_new_tokens": cfg.settings().max_new_tokens}})
    if processes > 1:
        return run_checkpoint(name, tasks, ecfg, root, out_path=out_path)
    policy = checkpoint_policy(name, ecfg.checkpoints[name], ecfg, root)
    return evaluate_sync(policy.with_seed, tasks, concurrency=ecfg.model_concurrency, perturb=ecfg.perturb,
                         base_seed=ecfg.seed, progress=False, out_path=out_path, obs_mode=policy.obs_mode,
                         env_retries=ecfg.env_retries)


def run_cell(spec: dict[str, Any], where: Path, root: Path = ROOT) -> dict[str, Any]:
    """Train (resuming from ``where/work`` when it holds a checkpoint of this config) and evaluate one cell (the
    reference cell: evaluate ``rl.init``); writes and returns ``where/result.json``."""
    from mobilerl.eval.metrics import summarize
    from mobilerl.eval.runner import sim_template_texts
    from mobilerl.rl.run import run

    cfg = RLConfig.model_validate(spec["rl"])
    name = f"{spec['variant']}-seed{spec['seed']}"
    t0 = time.perf_counter()

    def progress(m: dict[str, float], r: int) -> None:
        print(f"{name} round {r}: success {m['rollout/success']:.3f}, {m['time/step_s']:.1f}s", flush=True)

    train = spec.get("train", True)
    summary, curve = run(cfg, root, log_metrics=progress, progress=False) if train else ({}, [])
    rl_s = time.perf_counter() - t0
    tasks = eval_tasks(cfg, spec["eval"]["per_template"], root)
    t1 = time.perf_counter()
    policy_cfg = cfg if train else cfg.model_copy(update={"out": cfg.init})
    trajs = evaluate_policy(name, policy_cfg, tasks, spec["eval"]["processes"], root, where / "eval.jsonl")
    eval_s = time.perf_counter() - t1
    s = summarize(trajs, template_texts=sim_template_texts(tasks))
    ok = [t for t in trajs if t.success]
    result = {
        "variant": spec["variant"], "seed": spec["seed"], "fingerprint": fingerprint(spec),
        "overrides": spec["overrides"], "rounds": cfg.rounds if train else 0, "suite": cfg.suite,
        "init": None if train else cfg.init, "rl": summary, "curve": curve,
        "eval": {"success_rate": s["eval/success_rate"], "n_tasks": len(tasks), "n_errors": s["eval/n_errors"],
                 "steps_success": sum(t.n_steps for t in ok) / len(ok) if ok else None,
                 "mean_steps": s["eval/mean_steps"]},
        "eval_summary": s,
        "episodes": [{"task_id": t.task_id, "template": t.template, "optimal_steps": t.optimal_steps,
                      "success": bool(t.success), "steps": t.n_steps} for t in trajs],
        "time": {"rl_s": rl_s, "eval_s": eval_s, "total_s": time.perf_counter() - t0}, "finished_at": time.time(),
    }
    tmp = where / "result.json.tmp"
    write_json(tmp, result)
    os.replace(tmp, where / "result.json")  # a cell counts as done only once its result is whole
    print(f"{name}: eval success {result['eval']['success_rate']:.3f} on {len(tasks)} tasks; rl {rl_s / 60:.1f} min, "
          f"eval {eval_s / 60:.1f} min", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mobilerl.rl.ablation <cell dir holding cell.json>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    where = Path(args[0]).resolve()
    spec = json.loads((where / "cell.json").read_text())
    run_cell(spec, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
