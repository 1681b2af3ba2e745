"""Trajectory stores on disk: one Parquet table of episodes (steps nested) plus PNG screenshots.

Layout of a store directory (``docs/data_schema.md`` has the column list)::

    <root>/trajectories.parquet          one row per episode, ``steps`` a list of structs
    <root>/images/<episode dir>/stepNNN.png   screenshots; ``steps[i].screenshot_path`` is relative to <root>
    <root>/manifest.json                 schema version, counts, how the data was masked

Rows round-trip :class:`~mobilerl.trajectory.Trajectory` (``meta`` is stored as a JSON string, actions as
a struct with every action field, absent ones null; the ``token_ids`` step column only in stores where some
step has them). :class:`StoreWriter` appends row groups as episodes arrive, so a long collection streams to
disk; :func:`read_store` / :func:`iter_store` read them back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mobilerl.trajectory import SCHEMA_VERSION, StepRecord, Trajectory

TABLE = "trajectories.parquet"
MANIFEST = "manifest.json"
IMAGES = "images"

ACTION_TYPE = pa.struct([
    ("name", pa.string()),
    ("element", pa.list_(pa.int32())),
    ("text", pa.string()),
    ("app", pa.string()),
    ("direction", pa.string()),
    ("dist", pa.string()),
    ("message", pa.string()),
])
STEP_TYPE = pa.struct([
    ("index", pa.int32()),
    ("response", pa.string()),
    ("action", ACTION_TYPE),
    ("invalid", pa.string()),
    ("effect", pa.string()),
    ("changed", pa.bool_()),
    ("latency_s", pa.float64()),
    ("policy_latency_s", pa.float64()),
    ("xml_compressed", pa.string()),
    ("app", pa.string()),
    ("screenshot_path", pa.string()),
    ("logprobs", pa.list_(pa.float32())),
    ("step_instruction", pa.string()),
])
SCHEMA = pa.schema([
    ("episode_id", pa.string()),
    ("source", pa.string()),
    ("task_id", pa.string()),
    ("suite", pa.string()),
    ("split", pa.string()),
    ("template", pa.string()),
    ("instruction", pa.string()),
    ("difficulty", pa.string()),
    ("optimal_steps", pa.int32()),
    ("max_steps", pa.int32()),
    ("tags", pa.list_(pa.string())),
    ("apps", pa.list_(pa.string())),
    ("task_type", pa.string()),
    ("has_verifier", pa.bool_()),
    ("n_steps", pa.int32()),
    ("finished", pa.bool_()),
    ("answer", pa.string()),
    ("reward", pa.float64()),
    ("success", pa.bool_()),
    ("subgoals", pa.list_(pa.bool_())),
    ("final_xml_compressed", pa.string()),
    ("policy", pa.string()),
    ("policy_version", pa.string()),
    ("trial", pa.int32()),
    ("seed", pa.int64()),
    ("task_seed", pa.int64()),
    ("error", pa.string()),
    ("error_kind", pa.string()),
    ("wall_time_s", pa.float64()),
    ("meta", pa.string()),
    ("schema_version", pa.int32()),
    ("steps", pa.list_(STEP_TYPE)),
], metadata={"mobilerl.schema_version": str(SCHEMA_VERSION)})
# The ids of the tokens the logprobs belong to: a column only in stores where some step has them (model
# policies), so stores without (the oracle's collections, human data) keep the schema, and bytes, they had.
STEP_TYPE_TOKENS = pa.struct([*(STEP_TYPE.field(i) for i in range(STEP_TYPE.num_fields)),
                              ("token_ids", pa.list_(pa.int32()))])
SCHEMA_TOKENS = SCHEMA.set(SCHEMA.get_field_index("steps"), pa.field("steps", pa.list_(STEP_TYPE_TOKENS)))

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def episode_dir(episode_id: str) -> str:
    """A file-system-safe directory name for an episode id (``world/train/X/3#0`` → ``world_train_X_3_0``)."""
    return _UNSAFE.sub("_", episode_id).strip("_") or "episode"


def image_path(episode_id: str, step: int) -> str:
    """The store-relative path of a step's screenshot."""
    return f"{IMAGES}/{episode_dir(episode_id)}/step{step:03d}.png"


def _action_row(a: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None:
        return None
    el = a.get("element")
    return {"name": a.get("name"), "element": list(el) if el is not None else None, "text": a.get("text"),
            "app": a.get("app"), "direction": a.get("direction"), "dist": a.get("dist"),
            "message": a.get("message")}


def to_row(traj: Trajectory) -> dict[str, Any]:
    d = traj.to_dict()
    steps = d.pop("steps")
    row = {k: d.get(k) for k in SCHEMA.names if k in d}
    row["episode_id"] = traj.episode_id
    row["n_steps"] = len(steps)
    row["meta"] = json.dumps(d.get("meta") or {}, ensure_ascii=False, sort_keys=True)
    row["steps"] = [{**{k: s.get(k) for k in STEP_TYPE_TOKENS.names}, "action": _action_row(s.get("action"))}
                    for s in steps]
    return row


def from_row(row: dict[str, Any]) -> Trajectory:
    d = dict(row)
    d.pop("episode_id", None)
    d.pop("n_steps", None)
    d["meta"] = json.loads(d.get("meta") or "{}")
    steps = []
    for s in d.pop("steps") or []:
        s = dict(s)
        a = s.get("action")
        if a is not None:
            a = {k: v for k, v in a.items() if v is not None or k == "name"}
            if a.get("element") is not None:
                a["element"] = [int(v) for v in a["element"]]
            s["action"] = {**{k: None for k in ACTION_TYPE.names}, **a}
        if s.get("logprobs") is not None:
            s["logprobs"] = [float(v) for v in s["logprobs"]]
        if s.get("token_ids") is not None:
            s["token_ids"] = [int(v) for v in s["token_ids"]]
        steps.append(StepRecord.from_dict(s))
    d = {k: v for k, v in d.items() if v is not None or k in ("reward", "answer", "error", "error_kind", "final_xml_compressed",
                                                              "policy_version", "seed", "task_seed")}
    traj = Trajectory.from_dict({**d, "steps": []})
    traj.steps = steps
    return traj


TASK_ORDER = [("task_id", "ascending"), ("trial", "ascending"), ("episode_id", "ascending")]  # iter_store "task"
TIMING_FIELDS = ("wall_time_s",)  # episode fields that measure the machine, not the episode
STEP_TIMING_FIELDS = ("latency_s", "policy_latency_s")


class StoreWriter:
    """Appends episodes to ``<root>/trajectories.parquet`` (row groups of ``batch`` episodes) and writes
    the manifest on close. ``root`` is created; an existing table is replaced.

    ``reproducible`` (default): the stored bytes depend only on the episodes, not on the machine or on the
    order concurrent episodes finished in. The wall-clock fields (:data:`TIMING_FIELDS`,
    :data:`STEP_TIMING_FIELDS`) are stored as 0 and the table is rewritten in :func:`iter_store`'s
    ``"task"`` order on close
    (it is read back whole for that: a store's size in memory once). A DVC stage that re-collects the same
    episodes then writes the same output, and the stages after it are not re-run. ``reproducible=False``
    keeps the timings and the completion order (manifest ``reproducible: false``). The table has the
    ``token_ids`` step column (:data:`SCHEMA_TOKENS`) once some step has token ids; row groups written before
    that are rewritten with it. Not thread-safe: callers that write from several threads hold a lock around
    ``write``.
    """

    def __init__(self, root: str | os.PathLike, batch: int = 64, manifest: dict[str, Any] | None = None,
                 reproducible: bool = True):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        self.reproducible = reproducible
        self.manifest = dict(manifest or {})
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp = self.root / (TABLE + ".tmp")
        self.schema = SCHEMA  # SCHEMA_TOKENS from the first step with token ids on
        self.count = 0
        self.n_steps = 0

    def write(self, traj: Trajectory) -> None:
        row = to_row(traj)
        if self.reproducible:
            row.update(dict.fromkeys(TIMING_FIELDS, 0.0))
            for s in row["steps"]:
                s.update(dict.fromkeys(STEP_TIMING_FIELDS, 0.0))
        if self.schema is SCHEMA and any(s["token_ids"] is not None for s in row["steps"]):
            self._widen()
        self._rows.append(row)
        self.count += 1
        self.n_steps += traj.n_steps
        if len(self._rows) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        table = pa.Table.from_pylist(self._rows, schema=self.schema)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        self._writer.write_table(table)
        self._rows = []

    def _widen(self) -> None:
        """Switch to :data:`SCHEMA_TOKENS`, rewriting the row groups already written (their token ids null)."""
        self.schema = SCHEMA_TOKENS
        if self._writer is None:
            return
        self._writer.close()
        with pq.ParquetFile(self._tmp) as pf:
            groups = [pf.read_row_group(i).to_pylist() for i in range(pf.num_row_groups)]
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        for rows in groups:
            self._writer.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        self._flush()
        if self._writer is None:  # no episode: an empty table with the schema
            pq.write_table(pa.Table.from_pylist([], schema=SCHEMA), self._tmp)
        else:
            self._writer.close()
            self._writer = None
            if self.reproducible:
                self._sort_in_task_order()
        os.replace(self._tmp, self.root / TABLE)
        manifest = {"schema_version": SCHEMA_VERSION, "episodes": self.count, "steps": self.n_steps,
                    "table": TABLE, "images": IMAGES, "reproducible": self.reproducible, **self.manifest}
        (self.root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n")

    def _sort_in_task_order(self) -> None:
        table = pq.read_table(self._tmp, schema=self.schema).sort_by(TASK_ORDER)
        pq.write_table(table, self._tmp, compression="zstd", row_group_size=self.batch)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and self._writer is not None:
            self._writer.close()
            self._writer = None
            self._tmp.unlink(missing_ok=True)
            return
        self.close()


def write_store(root: str | os.PathLike, trajectories: Iterable[Trajectory], *, reproducible: bool = True,
                **manifest: Any) -> int:
    with StoreWriter(root, manifest=manifest, reproducible=reproducible) as w:
        for t in trajectories:
            w.write(t)
    return w.count


def iter_store(root: str | os.PathLike, order: str = "task") -> Iterator[Trajectory]:
    """Episodes of a store (or of a ``.parquet`` file).

    ``order="task"`` (default): sorted by (task id, trial, episode id), so that everything built from a
    store (SFT data, reasoning corpora, audits) is the same however the collection's concurrent episodes
    happened to finish; it reads the whole table at once. ``order="file"``: file order, streamed one row
    group at a time (for stores too big to hold)."""
    if order not in ("task", "file"):
        raise ValueError(f"order must be 'task' or 'file', got {order!r}")
    path = Path(root)
    path = path if path.suffix == ".parquet" else path / TABLE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: not a trajectory store")
    pf = pq.ParquetFile(path)
    if order == "file":
        for i in range(pf.num_row_groups):
            for row in pf.read_row_group(i).to_pylist():
                yield from_row(row)
        return
    table = pf.read().sort_by(TASK_ORDER)
    for batch in table.to_batches(max_chunksize=256):
        for row in batch.to_pylist():
            yield from_row(row)


def read_store(root: str | os.PathLike) -> list[Trajectory]:
    return list(iter_store(root))
