"""Trajectory records: what one episode of (task, policy, env) leaves behind, and their JSONL files.

One :class:`Trajectory` per episode; its ``steps`` are :class:`StepRecord` s, one per model response
(valid or not). A step holds the *observation it was chosen on* (the compressed XML of screen ``s_t``,
optionally a screenshot file) and what the action did (``effect``, ``changed``). These are the records
that collection, evaluation and RL all share; :func:`mobilerl.agent.rollout.rollout` produces them.

JSONL layout: one ``Trajectory.to_dict()`` per line (UTF-8). :func:`read_jsonl` names the file and the
1-based line number of any line that is not valid JSON or not a valid trajectory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Literal, get_args

SCHEMA_VERSION = 1

# Why an episode ended without an answer of its own: cut short by its env, by the inference engine serving its
# policy (unreachable or down: infrastructure, like env) or by its policy (``error`` holds the message), every
# response unparseable (parse), or its step budget spent (budget). Consumers decide by kind (the RL round:
# mobilerl.rl.groups.triage), never by the message's text.
ErrorKind = Literal["env", "engine", "policy", "parse", "budget"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


def _require(d: dict[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise ValueError(f"{what}: missing field {key!r}")
    return d[key]


@dataclass
class StepRecord:
    """One model turn.

    ``action`` is ``Action.to_dict()`` of the parsed action, or ``None`` when the response did not parse;
    then ``invalid`` holds the parser's reason, the env was not stepped, ``effect`` is ``None`` and
    ``changed`` is ``False``. ``xml_compressed`` is the screen the response was produced on (before the
    action). ``latency_s`` is the env's step time, ``policy_latency_s`` the policy's.
    ``step_instruction`` is the low-level instruction of this step where the data has one (AndroidControl).
    ``logprobs[i]`` is the sampling logprob of ``token_ids[i]`` (model policies; what RL's importance ratio
    needs); ``token_ids`` is None where the policy or backend gave none.
    """

    index: int
    response: str
    action: dict[str, Any] | None = None
    invalid: str | None = None
    effect: str | None = None
    changed: bool = False
    latency_s: float = 0.0
    policy_latency_s: float = 0.0
    xml_compressed: str = ""
    app: str = ""
    screenshot_path: str | None = None
    logprobs: list[float] | None = None
    step_instruction: str | None = None  # a per-step (low-level) instruction, where the data has one
    token_ids: list[int] | None = None
    expert: bool = False  # played by the simulator's expert (a reverse curriculum's prefix), not the policy

    @property
    def valid(self) -> bool:
        return self.action is not None

    @property
    def action_name(self) -> str | None:
        return None if self.action is None else self.action.get("name")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["token_ids"] is None:  # absent, not null: steps without tokens keep the bytes they always had
            del d["token_ids"]
        if not d["expert"]:
            del d["expert"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        if not isinstance(d, dict):
            raise ValueError(f"step record must be an object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        _require(kwargs, "index", "step record")
        _require(kwargs, "response", "step record")
        action = kwargs.get("action")
        if action is not None and (not isinstance(action, dict) or "name" not in action):
            raise ValueError(
                f"step {kwargs['index']}: action must be an object with a 'name', got {action!r}"
            )
        ids = kwargs.get("token_ids")
        if ids is not None and len(ids) != len(kwargs.get("logprobs") or []):
            raise ValueError(f"step {kwargs['index']}: {len(ids)} token ids but "
                             f"{len(kwargs.get('logprobs') or [])} logprobs")
        return cls(**kwargs)


@dataclass
class Trajectory:
    """One episode. ``success = finished and reward == 1.0``; ``reward`` is ``None`` for tasks whose
    verifier is hidden (lab train), and then ``success`` is ``False`` (a reward model scores them later).

    ``seed`` is the policy's seed for this episode; ``task_seed`` the task's (which also seeds the
    simulator's perturbations, so every trial of a task meets the same device). ``subgoals`` is the
    per-sub-goal state at the end of the episode (empty when the env did not report it). ``error_kind`` is
    set when the episode ended without finishing (:data:`ErrorKind`); ``error`` is the message of an env or
    policy failure that cut it short (``"env: ..."`` / ``"engine: ..."`` / ``"policy: ..."``, set by :meth:`fail`).
    ``source`` names where the episode comes from (``collected``, ``human``, ``androidcontrol``; empty for
    evaluation rollouts) and ``meta`` holds free-form, JSON-safe metadata (masking counts, origin ids).
    """

    task_id: str
    suite: str = ""
    split: str = ""
    template: str = ""
    instruction: str = ""
    difficulty: str = ""
    optimal_steps: int = 0
    max_steps: int = 0
    tags: list[str] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)
    task_type: str = "operation"
    has_verifier: bool = True
    steps: list[StepRecord] = field(default_factory=list)
    finished: bool = False
    answer: str | None = None
    reward: float | None = None
    success: bool = False
    subgoals: list[bool] = field(default_factory=list)
    final_xml_compressed: str | None = None
    policy: str = ""
    policy_version: str | None = None
    trial: int = 0
    seed: int | None = None
    task_seed: int | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    wall_time_s: float = 0.0
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def episode_id(self) -> str:
        """``task_id#trial``: unique within one collection."""
        return f"{self.task_id}#{self.trial}"

    def __post_init__(self) -> None:
        if self.error_kind is None and self.error:  # a record written before error kinds: its message's prefix
            head = str(self.error).split(":", 1)[0]
            self.error_kind = head if head in ("env", "engine", "policy") else "env"  # "runner: ..." is infrastructure
        elif self.error_kind is not None and self.error_kind not in ERROR_KINDS:
            raise ValueError(f"trajectory: error_kind {self.error_kind!r} is not one of {list(ERROR_KINDS)}")

    def fail(self, kind: ErrorKind, message: str) -> None:
        """Record the env, engine or policy failure that cut the episode short."""
        if kind not in ("env", "engine", "policy"):
            raise ValueError(f"fail() records env/engine/policy failures, not {kind!r}")
        self.error_kind, self.error = kind, f"{kind}: {message}"

    @property
    def n_invalid(self) -> int:
        return sum(1 for s in self.steps if s.action is None)

    @classmethod
    def for_task(cls, task: Any, **kwargs: Any) -> Trajectory:
        """A trajectory header filled from a :class:`~mobilerl.env.base.TaskSpec`."""
        return cls(
            task_id=task.task_id,
            suite=task.suite,
            split=task.split,
            template=task.template,
            instruction=task.instruction,
            difficulty=task.difficulty,
            optimal_steps=int(task.optimal_steps),
            max_steps=int(task.max_steps),
            tags=list(task.tags),
            apps=list(task.apps),
            task_type=task.task_type,
            has_verifier=bool(task.has_verifier),
            task_seed=task.seed,
            **kwargs,
        )

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        d["tags"] = list(self.tags)
        d["apps"] = list(self.apps)
        d["subgoals"] = list(self.subgoals)
        d["meta"] = dict(self.meta)
        d["steps"] = [s.to_dict() for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        if not isinstance(d, dict):
            raise ValueError(f"trajectory must be an object, got {type(d).__name__}")
        version = d.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(
                f"unsupported trajectory schema_version {version!r} (this code reads <= {SCHEMA_VERSION})"
            )
        _require(d, "task_id", "trajectory")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        steps = kwargs.pop("steps", [])
        if not isinstance(steps, list):
            raise ValueError("trajectory: 'steps' must be a list")
        for key in ("tags", "apps", "subgoals"):
            if key in kwargs:
                if not isinstance(kwargs[key], list | tuple):
                    raise ValueError(f"trajectory: {key!r} must be a list")
                kwargs[key] = list(kwargs[key])
        kwargs["subgoals"] = [bool(v) for v in kwargs.get("subgoals", [])]
        if not isinstance(kwargs.get("meta", {}), dict):
            raise ValueError("trajectory: 'meta' must be an object")
        try:
            traj = cls(**kwargs)
        except TypeError as e:
            raise ValueError(f"trajectory: {e}") from None
        traj.steps = [StepRecord.from_dict(s) for s in steps]
        return traj


# ---------------------------------------------------------------------------------------------- JSONL


def iter_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file (blank lines skipped).

    Raises ``ValueError("<path>:<line>: ...")`` on the first line that is not a valid trajectory.
    """
    path = Path(path)
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            try:
                yield Trajectory.from_dict(obj)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: not a valid trajectory: {e}") from None


def read_jsonl(path: str | os.PathLike) -> list[Trajectory]:
    """All trajectories of a JSONL file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path))


def _dumps(traj: Trajectory) -> str:
    return json.dumps(traj.to_dict(), ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: str | os.PathLike, trajectories: Iterable[Trajectory], append: bool = False) -> int:
    """Write (or append) trajectories, one JSON object per line; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for traj in trajectories:
            f.write(_dumps(traj) + "\n")
            n += 1
    return n


class JsonlWriter:
    """Streaming writer: ``write(traj)`` appends one line and flushes, so partial runs survive a crash.

    ``append=False`` truncates the file when opened. Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, traj: Trajectory) -> None:
        if self._f is None:
            raise ValueError(f"JsonlWriter for {self.path} is closed")
        self._f.write(_dumps(traj) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
