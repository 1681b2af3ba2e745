"""Iterative refinement of the reasoning set by the policy itself (MobileRL §2.1).

Starting from the bootstrap set D_0 (:mod:`mobilerl.sft.bootstrap`), for rounds t = 1…T:

1. train π_t on D_{t-1} with LLaMA-Factory — from π_{t-1} (``continue_training``; π_0 = the reasoning-free
   checkpoint) or from the reasoning-free checkpoint every round;
2. π_t proposes ``k`` candidates for (a seeded sample of ``steps_per_round``) train steps, prompted with the
   explanations of D_{t-1} in their histories;
3. candidates whose action matches the expert's are scored by π_t's mean token log-probability and the best
   explanation replaces the step's current one (steps without a match keep theirs; steps the teacher
   could not explain enter the set when π_t explains them): D_t
   (:func:`mobilerl.sft.reasoning.refine_select`).

The acceptance rate (steps with at least one matching candidate) is recorded per round, with the
candidates' match rate, ``<think>`` rate and parse failures, and each round's loss curve. The validation
records of D_0 are carried over unchanged. The policy is served by the profile's generation backend
(``hf`` on CPU, ``vllm`` on GPU) loaded from each round's checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import StageConfig, checked_settings, read_json, repo_path
from mobilerl.data.sft import write_sharegpt
from mobilerl.models.backends import make_backend
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.profiles import ReasoningSettings, load_profile, reasoning_settings
from mobilerl.sft import llamafactory
from mobilerl.sft.bootstrap import source_stores
from mobilerl.sft.reasoning import (
    PromptFormat,
    acceptance_by_action,
    episodes_by_split,
    load_images,
    propose,
    reasoning_records,
    refine_select,
    with_history,
)
from mobilerl.sft.train import rel


class RefineConfig(StageConfig):
    """T rounds: train π_t, π_t proposes, the best-scored matching explanation is kept."""

    profile: str = Field("tiny", description="Model profile in configs/models/.")
    init: str = Field("data/checkpoints/sft_reasoning_free", description="π weights before the first round.")
    bootstrap: str = Field("data/reasoning/bootstrap", description="The bootstrap set D_0.")
    rounds: int = Field(2, ge=1, description="Refinement rounds T.")
    continue_training: bool = Field(True, description="Round t trains from π_{t-1} (true) or from init every round "
                                                        "(false).")
    k: int = Field(4, ge=1, description="Candidates per step.")
    temperature: float = Field(1.0, gt=0, description="π's sampling temperature for proposals.")
    top_p: float = Field(1.0, gt=0, le=1, description="π's nucleus sampling.")
    reasoning_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Keys of the profile's reasoning section changed for this stage (null: the "
                                          "profile's), e.g. "
                                          "{think_tokens: 32}: a candidate is capped at think + answer tokens.")
    steps_per_round: int | None = Field(None, ge=1, description="Train steps proposed for per round (seeded "
                                                                "sample; null: all).")
    train_overrides: dict[str, Any] = Field(default_factory=dict,
                                            description="LLaMA-Factory arguments over the profile's, per round "
                                                        "(a null value keeps the profile's).")
    generation: dict[str, Any] = Field(default_factory=dict,
                                       description="Extra make_backend keys for the round's policy, "
                                                   "e.g. {max_batch: 32}.")
    timeout_minutes: float | None = Field(None, gt=0, description="Kill a round's training after this long.")
    name: str = Field("mobilerl_reasoning", description="Dataset name prefix in dataset_info.json.")
    seed: int = Field(0, description="Step sampling and proposal seed.")

    def settings(self) -> ReasoningSettings:
        return reasoning_settings(self.profile, self.reasoning_overrides)


def policy_backend(profile: Any, checkpoint: Path, extra: dict[str, Any]) -> Any:
    """π_t behind the profile's generation backend, loaded from the round's checkpoint."""
    kind = extra.get("kind", profile.generation.kind)
    if kind == "openai":
        raise ValueError("reasoning_refine.generation.kind: the policy changes every round; use hf or vllm "
                         "(they load each round's checkpoint), not an external server")
    spec: dict[str, Any] = {"kind": kind, "model": str(checkpoint)}
    if kind == "hf":
        spec.update(dtype=profile.inference_dtype, max_batch=profile.generation.max_batch)
    spec.update({k: v for k, v in extra.items() if k != "kind"})
    return make_backend(spec)


ROUND_TIMINGS = ("propose_s", "score_s")



def without_timings(r: dict[str, Any]) -> dict[str, Any]:
    """A round's record for ``rounds.json`` inside the dataset folder: without the wall-clock figures, so
    that a re-run that builds the same corpus writes the same folder and DVC does not re-run
    `sft_reasoning` (the timings stay in the stage's metrics, ``refine.json``)."""
    out = {k: v for k, v in r.items() if k not in ROUND_TIMINGS}
    out["train"] = {k: v for k, v in r["train"].items() if k not in llamafactory.TrainResult.TIMINGS}
    return out


def refine(cfg: RefineConfig, boot_dir: Path, stores: Path, out: Path, checkpoint: Path) -> dict[str, Any]:
    """T refinement rounds from the bootstrap set ``boot_dir`` (episodes from ``stores``): D_T into ``out``
    (the dataset, ``explanations.json``, ``rounds.json``), π_T's weights into ``checkpoint``; logs each
    round to the active MLflow run and returns the metrics."""
    profile = load_profile(cfg.profile)
    budget = checked_settings(cfg, "reasoning_refine", "reasoning_overrides", "reasoning").max_new_tokens
    stats0 = read_json(boot_dir / "stats.json")
    fmt = PromptFormat.of_dataset(stats0)
    carried = {k: stats0.get(k) for k in ("mode", "prompt_style", "max_history", "coords", "val_fraction", "seed",
                                          "sources", "reasoning", "action_weights")}
    weights = carried["action_weights"] or {}
    episodes = episodes_by_split(source_stores(stats0, stores), stats0["val_fraction"], stats0["seed"],
                                 stats0.get("coords", "abs"))
    explanations: dict[str, str] = read_json(boot_dir / "explanations.json")
    train_ids = {st.step_id for ep in episodes["train"] for st in ep}
    init = repo_path(cfg.init)
    rng = random.Random(cfg.seed)
    rounds: list[dict[str, Any]] = []
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".reasoning_refine.", dir=checkpoint.parent))  # same disk: moves are cheap
    try:
        previous = init
        for t in range(1, cfg.rounds + 1):
            # 1. π_t: fine-tune on D_{t-1}
            data_dir = work / f"data_{t}"
            write_sharegpt(data_dir, cfg.name,
                           {"train": reasoning_records(episodes["train"], explanations, fmt, weights, cfg.seed)},
                           {**carried, "stage": "reasoning_refine", "round": t})
            ckpt = work / f"round_{t}"
            base = previous if cfg.continue_training else init
            res = llamafactory.train_sft(profile, base=base, dataset=f"{cfg.name}_train", dataset_dir=data_dir, output_dir=ckpt,
                            overrides={k: v for k, v in cfg.train_overrides.items() if v is not None},
                            timeout_s=cfg.timeout_minutes * 60 if cfg.timeout_minutes else None)
            for step, loss in res.losses:
                tracking.log_metrics({f"round_{t}/loss/train": loss}, step=step)
            if res.overlength:
                print(f"warning: round {t}: {res.overlength} samples longer than cutoff_len (prompt tails cut)",
                      flush=True)
            # 2. π_t proposes for the train steps (histories: the current explanations)
            steps = [st for ep in episodes["train"] for st in with_history(ep, explanations)]
            if cfg.steps_per_round is not None and len(steps) > cfg.steps_per_round:
                steps = rng.sample(steps, cfg.steps_per_round)
            images = load_images(steps, fmt)
            backend = policy_backend(profile, ckpt, cfg.generation)
            sampling = SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p,
                                      max_new_tokens=budget, seed=cfg.seed + 100_000 * t)
            t0 = time.perf_counter()
            cands = asyncio.run(propose(backend, steps, cfg.k, sampling, fmt, images))
            t1 = time.perf_counter()
            # 3. score the matches by π_t, keep the best explanation per step: D_t
            before = dict(explanations)
            explanations, st = asyncio.run(refine_select(backend, steps, cands, explanations, t, fmt, images))
            t2 = time.perf_counter()
            if hasattr(backend, "aclose"):
                asyncio.run(backend.aclose())
            del backend
            flat = [c for cs in cands for c in cs]
            r = {**st.to_dict(),
                 "candidate_acceptance": st.accepted_candidates / max(1, st.candidates),
                 "think_rate": sum("<think>" in c.text and "</think>" in c.text for c in flat) / max(1, len(flat)),
                 "truncated_rate": sum(c.truncated for c in flat) / max(1, len(flat)),
                 "parse_failure_rate": st.parse_failures / max(1, st.candidates),
                 "changed": sum(explanations.get(k) != before.get(k) for k in explanations),
                 "added": sum(k not in before for k in explanations),
                 "coverage": sum(k in explanations for k in train_ids) / max(1, len(train_ids)),
                 "acceptance_by_action": acceptance_by_action(steps, cands),
                 "train": res.summary(), "propose_s": t1 - t0, "score_s": t2 - t1}
            rounds.append(r)
            tracking.log_metrics({"refine": {k: v for k, v in r.items() if k not in ("round", "train")},
                                  "refine/train": r["train"]}, step=t)
            print(f"reasoning_refine: round {t}: acceptance {r['acceptance_rate']:.1%} of {r['steps']} steps "
                  f"(candidates {r['candidate_acceptance']:.1%}, think {r['think_rate']:.1%}), {r['changed']} "
                  f"explanations changed; train {res.wall_s:.0f}s, propose {r['propose_s']:.0f}s, "
                  f"score {r['score_s']:.0f}s", flush=True)
            if previous != init:
                shutil.rmtree(previous, ignore_errors=True)
            previous = ckpt
        # D_T and π_T
        records = {"train": reasoning_records(episodes["train"], explanations, fmt, weights, cfg.seed),
                   "val": reasoning_records(episodes["val"], explanations, fmt)}
        data_stats = write_sharegpt(out, cfg.name, records, {**carried, "stage": "reasoning_refine",
                                                             "rounds": cfg.rounds})
        (out / "explanations.json").write_text(json.dumps(explanations, indent=0, sort_keys=True,
                                                          ensure_ascii=False) + "\n")
        (out / "rounds.json").write_text(json.dumps([without_timings(r) for r in rounds], indent=1) + "\n")
        if checkpoint.exists():
            shutil.rmtree(checkpoint)
        shutil.move(str(previous), checkpoint)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_round = {k: {f"round_{r['round']}": r[k] for r in rounds}  # flat keys: `dvc metrics show` skips lists
                for k in ("acceptance_rate", "candidate_acceptance", "think_rate", "changed")}
    return {"rounds": cfg.rounds, **by_round, "per_round": rounds,
            "train": data_stats["train"], "val": data_stats["val"], "init": rel(init)}
