"""Episode records shared by collection, evaluation and RL."""

from mobilerl.data.schema import (
    SCHEMA_VERSION,
    JsonlWriter,
    StepRecord,
    Trajectory,
    iter_jsonl,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "SCHEMA_VERSION",
    "JsonlWriter",
    "StepRecord",
    "Trajectory",
    "iter_jsonl",
    "read_jsonl",
    "write_jsonl",
]
