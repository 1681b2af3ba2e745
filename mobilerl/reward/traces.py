"""Labelled traces for the reward model (MobileRL App. D.3.2): policies of graded quality on the lab suite.

The paper runs "all training and test tasks multiple times using medium-capability VLMs" and labels the traces
by a majority vote of three proprietary judges (train tasks) or the rule-based reward (test tasks). Here:

- **policies** — the oracle, the oracle slipping into random actions at several rates (:class:`NoisyPolicy`),
  the oracle that declares the task done before it is (:class:`EarlyFinishPolicy`: the trace whose last screen
  contradicts its finish, the paper's judge's main error, App. E.5), the SFT and RL checkpoints where
  their directories exist (the RL policy's failures are the ones RL with the judge must not pass), and the random policy;
- **labels** — the verifier on ``lab/test``; on ``lab/train``, whose verifiers are hidden from training code,
  the simulator's own check (:func:`~mobilerl.env.sim.env.hidden_ground_truth`) stands in for the vote,
  flipped with probability ``label_noise`` to model the vote's bias. An episode its policy cut short (a noisy
  oracle's script that no longer finds its element after a slip) is a failure; one the env cut short is dropped;
- **split by task** — ``lab/train`` traces train the judge, ``lab/test`` traces are held out (the two splits
  share no task), each with balanced classes (the majority class downsampled);
- **privacy** — every episode goes through :func:`mobilerl.data.collect.collect` (masked in memory before
  anything is written), and the stores are audited like the collection's (:mod:`mobilerl.data.audit`).

Layout under ``out``: ``stores/<policy>_<split>/`` (trajectory stores; screenshots only for
``test_screenshot_tasks`` held-out tasks unless ``train_screenshots``), ``index.jsonl`` (one kept trace a line:
store, episode id, policy, split, label, true label) and ``privacy_report.json``.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mobilerl.agent.policy import NoisyPolicy, OraclePolicy, PolicyContext, PolicyOutput, RandomPolicy
from mobilerl.config import ROOT, StageConfig
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action
from mobilerl.env.base import TaskSpec
from mobilerl.env.sim.env import SimEnv, hidden_ground_truth
from mobilerl.eval.config import CheckpointSpec, EvaluateConfig, checkpoint_path
from mobilerl.seeding import stable_seed
from mobilerl.tasks import TASK_LISTS, load_tasks, spread

SPLITS = ("train", "test")


class RewardTracesConfig(StageConfig):
    """``reward_traces``: which policies roll out on which lab tasks, how traces are labelled and stored."""

    train_per_template: int = Field(3, ge=1, description="lab/train tasks per template (40 templates).")
    test_per_template: int = Field(2, ge=1, description="lab/test tasks per template: the held-out traces.")
    max_tasks: int | None = Field(None, ge=1, description="Cap on tasks per split, spread over the templates "
                                                          "(null: no cap; smoke runs).")
    oracle: bool = Field(True, description="Roll out the oracle (near-always successful traces).")
    slip_rates: list[float] = Field([0.1, 0.3, 0.6], description="Noisy oracles: per-step probability of a "
                                                                 "random action instead of the expert's.")
    early_finish: float | None = Field(0.2, gt=0, le=1, description="Per-step probability that the oracle "
                                       "declares the task done early (null: no such policy).")
    random: bool = Field(True, description="Roll out the random policy (failures).")
    checkpoints: dict[str, CheckpointSpec] = Field(
        {}, description="The pipeline's checkpoint policies, SFT and RL (name -> {path, reasoning, max_new_tokens, "
                        "max_tasks}); one whose directory "
                        "does not exist is skipped. max_tasks caps its tasks per split.")
    profile: str = Field("tiny", description="Model profile of the checkpoints (backend and prompt format).")
    temperatures: list[float] = Field([1.0], min_length=1, description=(
        "Sampling temperatures each checkpoint policy rolls out at (its traces, all temperatures, one source)."))
    model_concurrency: int = Field(32, ge=1, description="Episodes in flight for a checkpoint policy.")
    label_noise: float = Field(0.0, ge=0, le=0.5, description="Probability of flipping a lab/train label "
                                                              "(the majority vote's bias; lab/test: never).")
    balance: bool = Field(True, description="Downsample the majority class of each split to the minority's size.")
    source_cap: float | None = Field(1.0, gt=0, description=(
        "A source keeps at most this many traces per task of its split, drawn before the classes are balanced, "
        "so no source dominates (null: all)."))
    train_screenshots: bool = Field(False, description="Store (masked) screenshots of the lab/train traces "
                                                       "too (the image-form judge of the large profiles).")
    test_screenshot_tasks: int | None = Field(
        4, ge=0, description="lab/test tasks (spread over templates) whose traces keep masked screenshots, for "
                             "the report's rendered examples (null: all).")
    mask_mode: Literal["token", "surrogate"] = Field("surrogate", description="Text masking before storage.")
    image_max_side: int = Field(1200, ge=64, description="Stored screenshot size, longer side (at 600 px the "
                                                         "audit's OCR misreads dates as phone numbers).")
    audit_ocr_images: int = Field(8, ge=0, description="Stored screenshots OCR'd per store by the privacy "
                                                        "audit (0: texts only).")
    perturb: str = Field("default", description="Simulator perturbation profile.")
    concurrency: int = Field(4, ge=1, description="Episodes in flight for the non-model policies.")
    mask_workers: int = Field(1, ge=1, description="Threads masking screenshots.")
    seed: int = Field(0, description="Base seed of the policies, the label noise and the balancing.")


class LabelEnv(SimEnv):
    """The simulator whose ``evaluate()`` is its own check on every task (hidden verifiers included): the label
    source. Renders screenshots only for the tasks in ``render_ids``."""

    def __init__(self, render_ids: frozenset[str], perturb: str = "default"):
        super().__init__(render=False, perturb=perturb)
        self.render_ids = render_ids

    def reset(self, task: TaskSpec | str) -> Any:
        self.render = (task if isinstance(task, str) else task.task_id) in self.render_ids
        return super().reset(task)

    def evaluate(self) -> float:
        return hidden_ground_truth(self)


@dataclass
class EarlyFinishPolicy:
    """``inner`` (the oracle) that, after its first step, declares the task done with probability ``rate`` at
    each step (``finish()``, as the oracle ends an operation task): traces that read like the expert's and end
    on a screen that does not show the task done."""

    inner: Any
    rate: float
    seed: int = 0
    name: str = "oracle_early_finish"
    version: str | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        if ctx.step > 0 and self._rng.random() < self.rate:
            return PolicyOutput(format_action(Action(A.FINISH)))
        return await self.inner.act(ctx)


@dataclass(frozen=True)
class Source:
    """A policy that rolls out: ``name`` (the source its traces count under), ``seed -> policy``, episodes in
    flight, its task cap, and ``store``, the name of its stores (a checkpoint's carries its temperature)."""

    name: str
    factory: Callable[[int], Any]
    concurrency: int
    cap: int | None = None
    store: str = ""

    def __post_init__(self) -> None:
        if not self.store:
            object.__setattr__(self, "store", self.name)


def policies(cfg: RewardTracesConfig, root: Path = ROOT) -> list[Source]:
    """The sources in rollout order; checkpoints without a directory are left out."""
    out: list[Source] = []
    if cfg.oracle:
        oracle = OraclePolicy()
        out.append(Source("oracle", lambda s: oracle, cfg.concurrency))
    for rate in cfg.slip_rates:
        name = f"noisy_{rate:g}"
        out.append(Source(name, functools.partial(_noisy, rate=rate, name=name), cfg.concurrency))
    if cfg.early_finish is not None:
        out.append(Source("oracle_early_finish", functools.partial(_early, rate=cfg.early_finish), cfg.concurrency))
    if cfg.random:
        out.append(Source("random", lambda s: RandomPolicy(s), cfg.concurrency))
    if cfg.checkpoints:
        from mobilerl.eval.checkpoints import checkpoint_policy

        builtin = {s.name for s in out}
        for name, spec in cfg.checkpoints.items():
            if name in builtin:
                raise ValueError(f"reward_traces.checkpoints.{name}: {name!r} is a built-in policy name; pick another")
            if not (checkpoint_path(spec, root) / "config.json").is_file():
                continue
            for temp in cfg.temperatures:
                ecfg = EvaluateConfig(profile=cfg.profile, temperature=temp, seed=cfg.seed, checkpoints=cfg.checkpoints)
                out.append(Source(name, checkpoint_policy(name, spec, ecfg, root).with_seed, cfg.model_concurrency,
                                  spec.max_tasks, f"{name}_t{temp:g}"))
    return out


def _noisy(seed: int, rate: float, name: str) -> NoisyPolicy:
    return NoisyPolicy(OraclePolicy(), rate, seed=seed, name=name)


def _early(seed: int, rate: float) -> EarlyFinishPolicy:
    return EarlyFinishPolicy(OraclePolicy(), rate, seed=seed)


def noisy_label(label: int, episode_id: str, rate: float, seed: int) -> int:
    """``label`` flipped with probability ``rate`` (a draw fixed by the episode id and seed)."""
    return 1 - label if rate > 0 and random.Random(stable_seed(seed, "label", episode_id)).random() < rate else label


def cap_sources(rows: list[dict[str, Any]], cap: int, seed: int) -> list[dict[str, Any]]:
    """``rows`` with each source (``policy``) downsampled to at most ``cap`` rows (kept in their order)."""
    rng = random.Random(seed)
    keep: set[int] = set()
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        keep |= {id(r) for r in (mine if len(mine) <= cap else rng.sample(mine, cap))}
    return [r for r in rows if id(r) in keep]


def balance(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """``rows`` with the majority label downsampled to the minority's count (kept in their order)."""
    by = {lab: [r for r in rows if r["label"] == lab] for lab in (0, 1)}
    n = min(len(v) for v in by.values())
    rng = random.Random(seed)
    keep = {id(r) for v in by.values() for r in (v if len(v) == n else rng.sample(v, n))}
    return [r for r in rows if id(r) in keep]


def collect_traces(cfg: RewardTracesConfig, out: Path, tasks_root: Path = TASK_LISTS,
                   root: Path = ROOT) -> dict[str, Any]:
    """Roll out every policy on both lab splits into masked stores under ``out``, label, balance, audit;
    returns the metrics (``index.jsonl`` lists the kept traces)."""
    from mobilerl.data.audit import audit, write_report
    from mobilerl.data.collect import collect_sync
    from mobilerl.data.masking import MaskingOptions
    from mobilerl.data.store import iter_store
    from mobilerl.env.factory import renders
    from mobilerl.models.profiles import load_profile

    masking = MaskingOptions(mode=cfg.mask_mode, image_max_side=cfg.image_max_side, seed=cfg.seed)
    tasks = {"train": spread(load_tasks("lab", "train", cfg.train_per_template, tasks_root), cfg.max_tasks),
             "test": spread(load_tasks("lab", "test", cfg.test_per_template, tasks_root), cfg.max_tasks)}
    overlap = {t.task_id for t in tasks["train"]} & {t.task_id for t in tasks["test"]}
    if overlap:
        raise ValueError(f"lab train and test task lists share tasks: {sorted(overlap)[:3]}")
    shots = {"train": frozenset(t.task_id for t in tasks["train"]) if cfg.train_screenshots else frozenset(),
             "test": frozenset(t.task_id for t in spread(tasks["test"], cfg.test_screenshot_tasks)
                               if cfg.test_screenshot_tasks != 0)}
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    per_store: dict[str, dict[str, Any]] = {}
    stores: list[Path] = []
    # a checkpoint of a screenshot profile sees the screen on every task (its traces keep them, masked)
    sees = cfg.checkpoints and renders(load_profile(cfg.profile).generation.obs_mode)
    for src in policies(cfg, root):
        name = src.name
        for split in SPLITS:
            store = f"{src.store}_{split}"
            render = (frozenset(t.task_id for t in tasks[split]) if sees and name in cfg.checkpoints
                      else shots[split])
            res = collect_sync(src.factory, spread(tasks[split], src.cap), out / "stores" / store, masking=masking,
                               concurrency=src.concurrency, env_factory=functools.partial(LabelEnv, render,
                                                                                          cfg.perturb),
                               base_seed=cfg.seed, mask_workers=cfg.mask_workers, source=name,
                               keep_secrets=False)
            if res.leaks_blocked:
                raise RuntimeError(f"reward_traces: {res.leaks_blocked} episodes of {store} still held planted "
                                   f"values after masking ({dict(res.leaked_categories)}); nothing of them stored")
            stores.append(out / "stores" / store)
            per_store[store] = {"episodes": res.n_episodes, "errors": res.n_errors, "positive": 0,
                                "wall_s": round(res.wall_s, 1)}
            for traj in iter_store(out / "stores" / store):
                if traj.error is not None and traj.error_kind != "policy":
                    continue  # an env failure says nothing about the policy; a policy that gave up failed
                truth = int(traj.finished and traj.reward == 1.0)
                label = noisy_label(truth, f"{store}/{traj.episode_id}", cfg.label_noise, cfg.seed) \
                    if split == "train" else truth
                per_store[store]["positive"] += truth
                rows[split].append({"store": store, "episode_id": traj.episode_id, "task_id": traj.task_id,
                                    "template": traj.template, "policy": name, "split": split, "label": label,
                                    "true_label": truth, "finished": traj.finished})
    capped = {s: cap_sources(rows[s], max(1, round(cfg.source_cap * len(tasks[s]))), cfg.seed)
              if cfg.source_cap is not None else rows[s] for s in SPLITS}
    kept = {s: balance(capped[s], cfg.seed) if cfg.balance else capped[s] for s in SPLITS}
    for s in SPLITS:
        if not kept[s] or len({r["label"] for r in kept[s]}) < 2:
            raise ValueError(f"reward_traces: the {s} split has traces of one class only "
                             f"({Counter(r['label'] for r in rows[s])}); add policies or tasks")
    t0 = time.perf_counter()
    report = audit(stores, ocr=cfg.audit_ocr_images > 0, ocr_max_images=cfg.audit_ocr_images or None,
                   seed=cfg.seed, progress=True)
    audit_s = time.perf_counter() - t0
    write_report(report, out / "privacy_report.json")
    with (out / "index.jsonl").open("w", encoding="utf-8") as f:
        for s in SPLITS:
            for r in kept[s]:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return {
        "stores": per_store,
        "privacy": {**{k: v for k, v in report.summary().items() if k != "stores"}, "wall_s": round(audit_s, 1)},
        **{s: {"collected": len(rows[s]), "kept": len(kept[s]),
               "positive": sum(r["label"] for r in kept[s]),
               "label_flips": sum(r["label"] != r["true_label"] for r in rows[s]),
               "tasks": len({r["task_id"] for r in kept[s]}),
               "by_source": dict(sorted(Counter(f"{r['policy']}/{r['label']}" for r in kept[s]).items()))}
           for s in SPLITS},
    }


def read_index(out: Path) -> list[dict[str, Any]]:
    """The kept traces of a ``reward_traces`` folder (``ValueError`` naming the line of a corrupt row)."""
    path = out / "index.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the `reward_traces` stage first")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        missing = [k for k in ("store", "episode_id", "policy", "split", "label") if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: trace row without {missing[0]!r}")
        rows.append(row)
    return rows
