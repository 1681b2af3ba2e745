"""Suites, splits and task ids.

Task id: ``{suite}/{split}/{template}/{index}``. ``test`` instances use fixed seeds (index 0…n_test-1);
``train`` instances are drawn from a disjoint seed stream and re-drawn (a bounded number of times) when
their instruction equals one of the template's test instructions, so that no train task equals a test
task in content and initial state. Lab ``train`` tasks expose no verifier (``has_verifier=False``): they
are scored by the reward model; :func:`mobilerl.env.sim.env.hidden_ground_truth` keeps the real check.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
import re
from functools import cache, lru_cache

from mobilerl.env.base import TaskSpec
from mobilerl.env.sim.device import Device, Perturb
from mobilerl.env.sim.tasks.base import Template
from mobilerl.seeding import sim_seed

SUITES = ("world", "lab")
_INDEX_RE = re.compile(r"0|[1-9][0-9]*")
SPLITS = ("train", "test")
N_TEST = {"world": 20, "lab": 5}
N_TRAIN = {"world": 40, "lab": 30}
TRAIN_REDRAWS = 12


@cache
def _all_templates() -> dict[str, Template]:
    import mobilerl.env.sim.tasks as pkg

    found: dict[str, Template] = {}
    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod in ("base", "registry"):
            continue
        module = importlib.import_module(f"{pkg.__name__}.{mod}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Template) and obj is not Template and obj.name:
                if obj.__module__ != module.__name__:
                    continue
                key = f"{obj.suite}/{obj.name}"
                if key in found:
                    raise ValueError(f"template {key} defined twice")
                found[key] = obj()
    return dict(sorted(found.items()))


def templates(suite: str) -> list[Template]:
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; expected one of {SUITES}")
    return [t for key, t in _all_templates().items() if key.startswith(suite + "/")]


def template(suite: str, name: str) -> Template:
    try:
        return _all_templates()[f"{suite}/{name}"]
    except KeyError:
        raise KeyError(f"unknown template {name!r} in suite {suite!r}") from None


def n_instances(t: Template, split: str) -> int:
    return getattr(t, "n_" + split, None) or (N_TEST if split == "test" else N_TRAIN)[t.suite]


def _draw(t: Template, seed: int) -> tuple[dict, str]:
    dev = Device(seed=seed, perturb=Perturb())
    params = t.sample(random.Random(sim_seed(seed, "params")), dev)
    return params, t.instruction(params)


def param_canaries(task: TaskSpec) -> dict[str, str]:
    """The raw personal values (``value -> category``) drawn for ``task`` 's parameters — the ones its
    instruction and expected inputs hold — re-derived from the task seed, in memory."""
    from mobilerl.env.sim import content

    t = template(task.suite, task.template)
    with content.recording() as rec:
        dev = Device(seed=task.seed, perturb=Perturb())
        t.sample(random.Random(sim_seed(task.seed, "params")), dev)
    return rec


@lru_cache(maxsize=256)
def _test_instructions(suite: str, name: str) -> frozenset[str]:
    t = template(suite, name)
    return frozenset(_draw(t, _seed(t, "test", i, 0))[1] for i in range(n_instances(t, "test")))


def _seed(t: Template, split: str, index: int, attempt: int) -> int:
    return sim_seed(t.suite, t.name, split, index, attempt)


@lru_cache(maxsize=8192)
def _instance(suite: str, name: str, split: str, index: int) -> tuple[int, str]:
    """(seed, params-json) of one instance; cached because parameter drawing builds a device."""
    import json

    t = template(suite, name)
    if split == "test":
        seed = _seed(t, "test", index, 0)
        params, _ = _draw(t, seed)
        return seed, json.dumps(params, sort_keys=True)
    taken = _test_instructions(suite, name)
    # A template whose instruction never varies cannot avoid the test instructions: its train instances
    # differ from test ones by the device seed alone, so redrawing would only waste time.
    redraws = 1 if len(taken) == 1 else TRAIN_REDRAWS
    for attempt in range(redraws):
        seed = _seed(t, "train", index, attempt)
        params, instr = _draw(t, seed)
        if instr not in taken:
            break
    return seed, json.dumps(params, sort_keys=True)


def get_task(task_id: str, with_optimal: bool = True) -> TaskSpec:
    import json

    parts = task_id.split("/")
    # A canonical index only: int() would also read "٣", "1_0", " 3 " and "+3" (aliases of one instance).
    if len(parts) != 4 or not _INDEX_RE.fullmatch(parts[3]):
        shown = task_id if len(task_id) <= 200 else task_id[:200] + "…"
        raise KeyError(f"malformed task id {shown!r}; expected suite/split/template/index")
    suite, split, name, idx = parts
    index = int(idx)
    if split not in SPLITS:
        raise KeyError(f"unknown split {split!r} in {task_id!r}; expected train or test")
    t = template(suite, name)
    seed, pjson = _instance(suite, name, split, index)
    params = json.loads(pjson)
    steps = optimal_steps(task_id) if with_optimal else 0
    return TaskSpec(
        task_id=task_id,
        suite=suite,
        split=split,
        template=t.name,
        instruction=t.instruction(params),
        params=params,
        seed=seed,
        difficulty=t.difficulty,
        optimal_steps=steps,
        complexity=t.complexity,
        tags=tuple(t.tags),
        apps=tuple(t.apps),
        task_type=t.task_type,
        has_verifier=not (suite == "lab" and split == "train"),
        subgoals=tuple(desc for desc, _ in t.subgoals(params)),
    )


def list_tasks(suite: str, split: str, n: int | None = None, with_optimal: bool = True) -> list[TaskSpec]:
    """All instances of a suite split (``n`` per template overrides the default count)."""
    out = []
    for t in templates(suite):
        count = n if n is not None else n_instances(t, split)
        out.extend(get_task(f"{suite}/{split}/{t.name}/{i}", with_optimal) for i in range(count))
    return out


@lru_cache(maxsize=8192)
def optimal_steps(task_id: str) -> int:
    """Steps the oracle expert takes on the unperturbed instance (its finish action included)."""
    from mobilerl.env.sim.env import run_oracle

    result = run_oracle(get_task(task_id, with_optimal=False), perturb=Perturb())
    return result.steps
