"""Evaluation metrics over trajectories: pure functions, no I/O.

What comes from where:

- ``pass@k`` — MobileRL Appendix E.2.3: per task with ``c`` successes in ``n`` trials, the unbiased
  estimator ``pass@k = 1 − C(n−c, k) / C(n, k)`` (:func:`pass_at_k` truncates ``k`` to ``n``); a category's
  value is the mean over its tasks, and ``None`` when one of its tasks has fewer than ``k`` trials (an n = 1
  evaluation has pass@1 only).
- complexity levels — MobileRL §3 ("Success Rates by Task Complexity"): level 1 ≤ 10 steps, 2: 11–20,
  3: 21–30, 4: > 30 (we bucket by the task's optimal step count).
- semantic score, S1/S2/S3 and D1/D2/D3 — MobileRL Appendix E.2.2 (see :func:`semantic_features`,
  :func:`semantic_score`, :func:`difficulty_buckets`).
- SR, Sub-SR, reversed redundancy ratio (RRR), reasonable operation ratio (ROR) — AndroidLab's
  metrics, as MobileRL reports for AndroidLab.
- Wilson score interval for a success rate, and a failure taxonomy of failed trajectories (ours).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any

from mobilerl.trajectory import Trajectory

# --------------------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (MobileRL App. E.2.3): ``1 − C(n−c, k) / C(n, k)``, with ``k ← min(k, n)``.

    Computed with exact integer arithmetic (``n=4, c=1, k=2`` → 0.5; ``n=5, c=2, k=2`` → 0.7; ``c=0`` →
    0.0; ``c=n`` → 1.0). Raises ``ValueError`` unless ``n ≥ 1``, ``0 ≤ c ≤ n`` and ``k ≥ 1``.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"pass_at_k: {name} must be an int, got {v!r}")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got {k}")
    k = min(k, n)
    if c == 0:
        return 0.0
    if n - c < k:  # every k-subset contains a success
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``p̂ = successes / n``.

    ``z = Φ⁻¹(1 − (1 − confidence)/2)``; centre ``(p̂ + z²/2n) / (1 + z²/n)``; half-width
    ``z/(1 + z²/n) · sqrt(p̂(1−p̂)/n + z²/4n²)``. ``n = 0`` gives the uninformative ``(0.0, 1.0)``.
    The bounds are clipped to [0, 1] (and are exactly 0 / 1 at ``p̂ = 0`` / ``p̂ = 1``).
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"wilson_interval: confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


# ------------------------------------------------------------------------------ difficulty views


def complexity_level(optimal_steps: float) -> int:
    """MobileRL §3 complexity level of a task of ``optimal_steps`` steps: 1 (≤ 10), 2 (11–20),
    3 (21–30), 4 (> 30); i.e. ``clip(ceil(steps / 10), 1, 4)``."""
    if optimal_steps is None or optimal_steps < 0:
        raise ValueError(f"complexity_level: optimal_steps must be >= 0, got {optimal_steps!r}")
    return min(4, max(1, math.ceil(optimal_steps / 10)))


REASONING_TAGS = frozenset({"math_counting", "memorization", "information_retrieval", "transcription"})
PERCEPTION_TAGS = frozenset({"complex_ui_understanding", "screen_reading"})

_TEMPORAL = re.compile(
    r"\b(?:weeks?|weekdays?|weekends?|today|tomorrow|yesterday|dates?|times?|days?|months?|hours?)\b"
)
_AGGREGATION = re.compile(r"\b(?:how many|how much|total|sum|duration|distance|count|average)\b")
_THEN = re.compile(r"\bthen\b")
_CLAUSE_THEN = re.compile(r"(?:^|[.;,:!?]\s*)then\b")


def semantic_features(tags: Iterable[str], text: str) -> dict[str, int]:
    """The App. E.2.2 features of a task from its tags and (lower-cased) template/instruction text.

    - ``reason_score = |tags ∩ {math_counting, memorization, information_retrieval, transcription}|``
    - ``perception_score = |tags ∩ {complex_ui_understanding, screen_reading}|``
    - ``multi_app_flag = [multi_app ∈ tags]``
    - ``is_temporal_reasoning``: a temporal word (week, today, tomorrow, date, time, day, …)
    - ``is_aggregation_reasoning``: an aggregation cue (how many, total, sum, duration, distance, …)
    - ``is_multi_goal``: "and then", a clause that starts with "then", or "then" twice
    """
    tags = set(tags)
    low = text.lower()
    return {
        "reason_score": len(tags & REASONING_TAGS),
        "perception_score": len(tags & PERCEPTION_TAGS),
        "multi_app_flag": int("multi_app" in tags),
        "is_temporal_reasoning": int(_TEMPORAL.search(low) is not None),
        "is_aggregation_reasoning": int(_AGGREGATION.search(low) is not None),
        "is_multi_goal": int(
            "and then" in low or _CLAUSE_THEN.search(low) is not None or len(_THEN.findall(low)) >= 2
        ),
    }


def semantic_score(tags: Iterable[str], text: str) -> int:
    """``semantic_score`` = the sum of the six :func:`semantic_features` (App. E.2.2)."""
    return sum(semantic_features(tags, text).values())


def tertile_buckets(scores: Mapping[str, float], prefix: str) -> dict[str, str]:
    """Split ids into three equal-sized buckets by ascending score: ``{prefix}1`` (lowest third),
    ``{prefix}2``, ``{prefix}3``. Rank ``r`` of ``n`` (ties broken by id) goes to bucket
    ``floor(3r/n) + 1``, so sizes differ by at most one and equal scores may straddle a boundary."""
    order = sorted(scores, key=lambda i: (scores[i], i))
    n = len(order)
    return {tid: f"{prefix}{3 * r // n + 1}" for r, tid in enumerate(order)}


@dataclass(frozen=True)
class TaskFeatures:
    """What the difficulty views need of a task: id, tags, text (template text, else instruction) and
    optimal step count ``S``."""

    task_id: str
    tags: tuple[str, ...]
    text: str
    optimal_steps: int


def difficulty_buckets(tasks: Iterable[TaskFeatures]) -> dict[str, dict[str, Any]]:
    """Semantic (S1–S3) and combined (D1–D3) buckets of App. E.2.2, per task id.

    ``norm_steps = (S − S_min) / (S_max − S_min)`` over the given tasks (0 when all are equal);
    ``combined = 0.5 · norm_steps + 1.0 · semantic_score``; each split into tertiles by
    :func:`tertile_buckets`. Returns ``{task_id: {"semantic_score", "combined_score", "S", "D"}}``.
    """
    tasks = {t.task_id: t for t in tasks}
    if not tasks:
        return {}
    sem = {tid: float(semantic_score(t.tags, t.text)) for tid, t in tasks.items()}
    steps = [t.optimal_steps for t in tasks.values()]
    lo, hi = min(steps), max(steps)
    comb = {
        tid: 0.5 * ((t.optimal_steps - lo) / (hi - lo) if hi > lo else 0.0) + sem[tid]
        for tid, t in tasks.items()
    }
    s_b, d_b = tertile_buckets(sem, "S"), tertile_buckets(comb, "D")
    return {
        tid: {"semantic_score": int(sem[tid]), "combined_score": comb[tid], "S": s_b[tid], "D": d_b[tid]}
        for tid in tasks
    }


# ------------------------------------------------------------------------------ AndroidLab metrics


def subgoal_fraction(traj: Trajectory) -> float:
    """Fraction of sub-goals met at the end (Sub-SR's per-episode term). A success counts 1.0; an
    episode with no sub-goal report (e.g. ended by an error or a spent budget of invalid steps) 0.0."""
    if traj.success:
        return 1.0
    if not traj.subgoals:
        return 0.0
    return sum(traj.subgoals) / len(traj.subgoals)


def reasonable_operation_ratio(trajs: Iterable[Trajectory]) -> float | None:
    """AndroidLab ROR: the share of operations after which the screen changed. Invalid responses count
    as operations that changed nothing; ``finish`` is not an operation. ``None`` without operations."""
    ops = changed = 0
    for t in trajs:
        for s in t.steps:
            if s.action_name == "Finish":
                continue
            ops += 1
            changed += bool(s.changed) and s.action is not None
    return changed / ops if ops else None


def reversed_redundancy_ratio(trajs: Iterable[Trajectory]) -> float | None:
    """AndroidLab RRR: mean over successful episodes with a known optimum of ``optimal_steps / steps``
    (both count the finish action). ``None`` when there is no such episode."""
    vals = [t.optimal_steps / t.n_steps for t in trajs if t.success and t.optimal_steps > 0 and t.n_steps > 0]
    return sum(vals) / len(vals) if vals else None


def lab_metrics(trajs: Sequence[Trajectory]) -> dict[str, float | None]:
    """AndroidLab-style metrics: ``sr``, ``sub_sr`` (over episodes with a verifier), ``rrr``, ``ror``,
    ``mean_steps_success`` and ``mean_excess_steps_success`` (``steps − optimal`` on successes)."""
    verified = [t for t in trajs if t.has_verifier]
    succ = [t for t in trajs if t.success]
    known = [t for t in succ if t.optimal_steps > 0]
    return {
        "sr": sum(t.success for t in trajs) / len(trajs) if trajs else None,
        "sub_sr": sum(subgoal_fraction(t) for t in verified) / len(verified) if verified else None,
        "rrr": reversed_redundancy_ratio(trajs),
        "ror": reasonable_operation_ratio(trajs),
        "mean_steps_success": sum(t.n_steps for t in succ) / len(succ) if succ else None,
        "mean_excess_steps_success": (
            sum(t.n_steps - t.optimal_steps for t in known) / len(known) if known else None
        ),
    }


# ------------------------------------------------------------------------------ failure taxonomy

FAILURE_KINDS = (
    "env_error",
    "policy_error",
    "invalid_actions",
    "finished_wrong",
    "loop",
    "never_finished",
    "unverified",
)


def _key(step: Any) -> tuple:
    if step.action is None:
        return ("<invalid>", step.response)
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in step.action.items()))


def has_loop(traj: Trajectory, max_period: int = 4) -> bool:
    """Whether the agent went round in circles.

    Either the same valid action three times in a row with no screen change, or a block of ``p``
    (screen, action) pairs, ``2 ≤ p ≤ max_period``, occurring twice back to back (screens compared by
    their compressed XML): ``A→B→A→B`` with the same actions brings nothing.
    """
    steps = traj.steps
    run = 0
    prev = None
    for s in steps:
        k = _key(s)
        if s.action is not None and not s.changed and k == prev:
            run += 1
        elif s.action is not None and not s.changed:
            run = 1
        else:
            run = 0
        prev = k
        if run >= 3:
            return True
    pairs = [(s.xml_compressed, _key(s)) for s in steps if s.action is not None]
    n = len(pairs)
    for p in range(2, max_period + 1):
        for i in range(n - 2 * p + 1):
            if pairs[i : i + p] == pairs[i + p : i + 2 * p] and len({x for x, _ in pairs[i : i + p]}) > 1:
                return True
    return False


def is_env_error(traj: Trajectory) -> bool:
    """Whether the episode was cut short by the infrastructure (its env crashed, timed out or could not be
    leased, or the engine serving the policy was unreachable), not by the policy: it says nothing about the
    policy, so evaluation re-runs it or leaves it out of the success rate (:data:`~mobilerl.trajectory.ErrorKind`
    ``env`` and ``engine``)."""
    return traj.error_kind in ("env", "engine")


def failure_flags(traj: Trajectory, invalid_share: float = 1 / 3) -> list[str]:
    """Every failure kind that applies to a failed trajectory (``[]`` for a success)."""
    if traj.success:
        return []
    flags = []
    if traj.error is not None:
        flags.append("policy_error" if traj.error_kind == "policy" else "env_error")
    if traj.steps and traj.n_invalid / traj.n_steps >= invalid_share:
        flags.append("invalid_actions")
    if traj.finished and traj.reward is not None and traj.error is None:
        flags.append("finished_wrong")
    if has_loop(traj):
        flags.append("loop")
    if not traj.finished and traj.error is None:
        flags.append("never_finished")
    if traj.finished and traj.reward is None and traj.error is None:
        flags.append("unverified")
    return flags


def classify_failure(traj: Trajectory) -> str | None:
    """The primary failure kind of a trajectory (``None`` for a success), by precedence:
    ``env_error`` / ``policy_error`` (cut short), ``invalid_actions`` (≥ 1/3 of responses unparseable),
    ``finished_wrong`` (finished, verifier said no), ``loop`` (see :func:`has_loop`), ``never_finished``
    (budget spent without finish), ``unverified`` (finished a task whose verifier is hidden)."""
    flags = failure_flags(traj)
    for kind in FAILURE_KINDS:
        if kind in flags:
            return kind
    return None


# ---------------------------------------------------------------------------------- summary


def _group_stats(trajs: Sequence[Trajectory], k_values: Sequence[int]) -> dict[str, Any]:
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t.success)
    n = len(trajs)
    c = sum(t.success for t in trajs)
    low, high = wilson_interval(c, n)
    out: dict[str, Any] = {
        "n_tasks": len(by_task),
        "n_trajectories": n,
        "success_rate": c / n if n else None,
        "success_ci_low": low,
        "success_ci_high": high,
    }
    fewest = min(map(len, by_task.values()), default=0)
    for k in k_values:
        # The unbiased estimate needs k trials of every task; with fewer it would be pass@n under another name.
        vals = [pass_at_k(len(v), sum(v), k) for v in by_task.values()] if fewest >= k else []
        out[f"pass@{k}"] = sum(vals) / len(vals) if vals else None
    return out


def grouped(
    trajs: Sequence[Trajectory], key: Mapping[str, str] | None, attr: str | None, k_values: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """Per-group statistics (``{n_tasks, n_trajectories, success_rate, success_ci_low/high, pass@k…}``, as in
    :func:`summarize`'s ``by_*`` views), groups in sorted order: a trajectory's group is ``key[task_id]``
    (tasks missing from ``key`` are left out) or, without ``key``, its attribute ``attr`` (e.g. ``"template"``)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        g = key.get(t.task_id) if key is not None else str(getattr(t, attr or ""))
        if g is not None:
            groups[g].append(t)
    return {g: _group_stats(groups[g], k_values) for g in sorted(groups)}


def summarize(
    trajectories: Sequence[Trajectory],
    k_values: Sequence[int] = (1, 2, 4, 8),
    template_texts: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """All evaluation metrics of a set of trajectories (several trials per task allowed).

    Episodes cut short by an env failure (:func:`is_env_error`) are left out of every rate and group and
    counted in ``eval/n_env_failed`` (``failures/env_error`` counts them too). Keys are namespaced:
    ``eval/…`` (overall SR, its 95 % Wilson interval, pass@k over tasks, counts,
    ``eval/by_difficulty``, ``eval/by_complexity`` (levels 1–4; tasks without an optimal step count go
    to ``"unknown"``), ``eval/by_semantic`` (S1–S3), ``eval/by_combined`` (D1–D3), ``eval/by_app``),
    ``lab/…`` (:func:`lab_metrics`), ``failures/…`` (count of each primary failure kind). Each ``by_*``
    value maps a group to ``{n_tasks, n_trajectories, success_rate, success_ci_low/high, pass@k…}``.
    Semantic features read ``template_texts[t.template]`` when given, else the instruction.
    :func:`mobilerl.tracking.flatten` (``sep="/"``) turns the result into flat keys for a metrics logger.

    pass@k averages per-task estimates; with unequal trials per task, each task uses its own ``n``, and a group
    with a task of fewer than ``k`` trials has pass@k ``None`` (not estimable; the report prints "–"). The
    Wilson interval treats trajectories as independent, which trials of one task are not: read it as a
    lower bound on the uncertainty.
    """
    everything = list(trajectories)
    trajs = [t for t in everything if not is_env_error(t)]  # an env failure is not the policy's failure
    overall = _group_stats(trajs, k_values)
    out: dict[str, Any] = {f"eval/{k}": v for k, v in overall.items()}
    trials = Counter(t.task_id for t in trajs)
    out["eval/trials_per_task"] = (sum(trials.values()) / len(trials)) if trials else 0.0
    out["eval/n_errors"] = sum(t.error is not None for t in everything)
    out["eval/n_env_failed"] = len(everything) - len(trajs)  # left out of every rate here (failures/* counts them)
    out["eval/mean_steps"] = sum(t.n_steps for t in trajs) / len(trajs) if trajs else None
    out["eval/invalid_step_rate"] = (
        sum(t.n_invalid for t in trajs) / max(1, sum(t.n_steps for t in trajs)) if trajs else None
    )

    out["eval/by_difficulty"] = grouped(trajs, None, "difficulty", k_values)
    levels = {
        t.task_id: (str(complexity_level(t.optimal_steps)) if t.optimal_steps > 0 else "unknown")
        for t in trajs
    }
    out["eval/by_complexity"] = grouped(trajs, levels, None, k_values)
    feats = {}
    for t in trajs:
        text = (template_texts or {}).get(t.template, t.instruction)
        feats[t.task_id] = TaskFeatures(t.task_id, tuple(t.tags), text, t.optimal_steps)
    buckets = difficulty_buckets(feats.values())
    out["eval/by_semantic"] = grouped(trajs, {k: v["S"] for k, v in buckets.items()}, None, k_values)
    out["eval/by_combined"] = grouped(trajs, {k: v["D"] for k, v in buckets.items()}, None, k_values)
    by_app: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_app["+".join(t.apps) if t.apps else "unknown"].append(t)
    out["eval/by_app"] = {a: _group_stats(v, k_values) for a, v in sorted(by_app.items())}

    for k, v in lab_metrics(trajs).items():
        out[f"lab/{k}"] = v
    kinds = Counter(classify_failure(t) for t in everything if not t.success)
    for kind in FAILURE_KINDS:
        out[f"failures/{kind}"] = kinds.get(kind, 0)
    return out
