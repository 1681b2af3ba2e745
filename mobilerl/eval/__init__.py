"""Evaluation: metrics, the concurrent runner, offline AndroidControl step evaluation."""

from mobilerl.eval.metrics import (
    classify_failure,
    complexity_level,
    difficulty_buckets,
    failure_flags,
    has_loop,
    lab_metrics,
    pass_at_k,
    semantic_features,
    semantic_score,
    summarize,
    tertile_buckets,
    wilson_interval,
)
from mobilerl.eval.runner import evaluate, evaluate_sync, sim_template_texts

__all__ = [
    "classify_failure",
    "complexity_level",
    "difficulty_buckets",
    "evaluate",
    "evaluate_sync",
    "failure_flags",
    "has_loop",
    "lab_metrics",
    "pass_at_k",
    "semantic_features",
    "semantic_score",
    "sim_template_texts",
    "summarize",
    "tertile_buckets",
    "wilson_interval",
]
