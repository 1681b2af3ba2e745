"""Screens for the tiny base's pretraining: snapshots of what the agent sees in the simulator, and their text.

:func:`collect_states` runs the oracle expert over a split's tasks of the ``world`` and ``lab`` suites (default
perturbations: pop-ups, loading screens, shuffled lists) and snapshots every screen it sees with the action it
takes there; ``explore`` adds off-policy screens (replay to a random step, then 1-3 random taps / swipes /
backs). Training draws from the ``train`` split; the held-out probe from ``test`` (disjoint device seeds and
instructions, :mod:`mobilerl.env.sim.tasks.registry`). A screen is shown as the agent sees it: the Appendix C
compressed XML, one line per node, in the frame of ``coords`` (:mod:`mobilerl.agent.prompt`).
"""

from __future__ import annotations

import gzip
import io
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from mobilerl.agent.prompt import mark_in
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action, to_relative
from mobilerl.env.xml import UINode, compress_nodes

Grounding = Literal["bbox", "index"]
Coords = Literal["rel", "abs", "marks"]  # marks: a line ends with its number [i], a tap names it (index=i)

# ------------------------------------------------------------------------------------------ states


@dataclass(frozen=True)
class ScreenState:
    """One snapshotted screen: what the agent sees, plus what the expert did there."""

    task_id: str
    instruction: str
    app: str
    width: int
    height: int
    nodes: tuple[UINode, ...]  # on-screen kept nodes, document order (compress_nodes)
    offscreen: tuple[UINode, ...] = ()  # kept nodes of scrolled-away content (not on screen)
    action: str | None = None  # the expert's action here (absolute pixels), None off-policy
    png: bytes | None = None  # screenshot, when collected with render=True
    history: tuple[str, ...] = ()  # the actions taken before this screen in the episode (absolute pixels)
    # the same actions as the marks frame writes them (a tap names the line of the screen it was taken on)
    history_marks: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = [[n.cls, list(n.flags), n.label, list(n.bounds)] for n in self.nodes]
        d["offscreen"] = [[n.cls, list(n.flags), n.label, list(n.bounds)] for n in self.offscreen]
        d["png"] = None if self.png is None else self.png.hex()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScreenState:
        def nodes(rows: list) -> tuple[UINode, ...]:
            return tuple(UINode(c, tuple(f), lab, tuple(b)) for c, f, lab, b in rows)  # type: ignore[arg-type]

        return cls(
            task_id=d["task_id"],
            instruction=d["instruction"],
            app=d["app"],
            width=d["width"],
            height=d["height"],
            nodes=nodes(d["nodes"]),
            offscreen=nodes(d["offscreen"]),
            action=d.get("action"),
            png=bytes.fromhex(d["png"]) if d.get("png") else None,
            history=tuple(d.get("history") or ()),
            history_marks=tuple(d.get("history_marks") or ()),
        )


def _snapshot(env: Any, obs: Any, action: Action | None, png_size: tuple[int, int] | None,
              history: Sequence[Action] = (), history_marks: Sequence[str] = ()) -> ScreenState:
    nodes = tuple(compress_nodes(obs.xml, width=obs.width, height=obs.height))
    on = set(nodes)
    every = compress_nodes(obs.xml, keep_offscreen=True, width=obs.width, height=obs.height)
    off = tuple(n for n in every if n not in on and n.label)
    png = None
    if png_size is not None and obs.screenshot is not None:
        buf = io.BytesIO()
        obs.screenshot.resize(png_size).save(buf, format="PNG", compress_level=1)
        png = buf.getvalue()
    return ScreenState(
        task_id=env.task.task_id,
        instruction=env.task.instruction,
        app=obs.app,
        width=obs.width,
        height=obs.height,
        nodes=nodes,
        offscreen=off,
        action=format_action(action) if action is not None else None,
        png=png,
        history=tuple(format_action(a) for a in history),
        history_marks=tuple(history_marks),
    )


def mark_action(action: Action, nodes: Sequence[UINode]) -> str:
    """``action`` as the marks frame writes it on a screen of ``nodes``: an element becomes the index of the
    line with its bounds (else the smallest line holding its centre); unchanged when no line does."""
    if action.element is None:
        return format_action(action)
    i = mark_index(nodes, action.element)
    return format_action(action if i is None else replace(action, element=None, index=i))


def mark_index(nodes: Sequence[UINode], box: Sequence[int]) -> int | None:
    """The line a pixel box names (:func:`mobilerl.agent.prompt.mark_in`, as the policy's frame does)."""
    return mark_in([n.bounds for n in nodes], box)


def _random_action(state: ScreenState, rng: random.Random) -> Action:
    r = rng.random()
    taps = [n for n in state.nodes if "clickable" in n.flags and n.bounds[1] > 90]
    if r < 0.6 and taps:
        return Action(A.TAP, element=rng.choice(taps).bounds)
    if r < 0.85:
        return Action(A.SWIPE, direction=rng.choice(("up", "down")), dist=rng.choice(A.DISTANCES))
    return Action(A.BACK)


def _collect_task(task_id: str, seed: int, explore: float, render: float,
                  png_size: tuple[int, int]) -> list[ScreenState]:
    from mobilerl.env.sim import SimEnv
    from mobilerl.env.sim.screen import Screen
    from mobilerl.env.sim.tasks.base import OracleAgent
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.seeding import sim_seed

    rng = random.Random(sim_seed(seed, task_id))
    task = get_task(task_id, with_optimal=False)
    shots = rng.random() < render
    env = SimEnv(render=shots, perturb="default")
    obs = env.reset(task)
    agent = OracleAgent(env.tmpl, task.params)
    out: list[ScreenState] = []
    actions: list[Action] = []
    marks: list[str] = []
    try:
        done = False
        while not done:
            a = agent.act(Screen(obs.xml, obs.app, obs.width, obs.height))
            out.append(_snapshot(env, obs, a, png_size if shots else None, actions, marks))
            actions.append(a)
            marks.append(mark_action(a, out[-1].nodes))
            res = env.step(a)
            obs, done = res.observation, res.done
    except Exception:  # noqa: BLE001 — an expert failure only ends this task's snapshots
        pass
    if actions and rng.random() < explore:
        # Off-policy screens: replay to a random step, then wander for 1-3 random actions.
        env = SimEnv(render=shots, perturb="default")
        obs = env.reset(task)
        k = rng.randrange(len(actions))
        done_actions, done_marks = list(actions[:k]), list(marks[:k])
        for a in done_actions:
            obs = env.step(a).observation
        for _ in range(rng.randint(1, 3)):
            s = _snapshot(env, obs, None, None)
            a = _random_action(s, rng)
            res = env.step(a)
            done_actions.append(a)
            done_marks.append(mark_action(a, s.nodes))
            obs = res.observation
            out.append(_snapshot(env, obs, None, png_size if shots else None, done_actions, done_marks))
            if res.done:
                break
    return out


def _collect_shard(args: tuple) -> list[ScreenState]:
    task_ids, seed, explore, render, png_size = args
    out: list[ScreenState] = []
    for tid in task_ids:
        out.extend(_collect_task(tid, seed, explore, render, png_size))
    return out


def task_ids(suites: Sequence[str], split: str, n_per_template: int | None = None,
             templates: Iterable[str] | None = None) -> list[str]:
    from mobilerl.env.sim.tasks import registry

    wanted = set(templates) if templates is not None else None
    out = []
    for suite in suites:
        for t in registry.templates(suite):
            if wanted is not None and t.name not in wanted:
                continue
            n = n_per_template if n_per_template is not None else registry.n_instances(t, split)
            out.extend(f"{suite}/{split}/{t.name}/{i}" for i in range(n))
    return out


def collect_states(
    suites: Sequence[str] = ("world", "lab"),
    split: str = "train",
    n_per_template: int | None = None,
    explore: float = 0.5,
    seed: int = 0,
    render: float = 0.0,
    png_size: tuple[int, int] = (108, 240),
    templates: Iterable[str] | None = None,
    workers: int = 1,
) -> list[ScreenState]:
    """Snapshot the screens the expert sees on ``split`` tasks (plus off-policy ones, see module doc).

    ``render`` is the fraction of tasks whose states keep a downscaled screenshot. Duplicate screens
    (same lines, app, instruction and action) are kept once. Deterministic given the arguments (each
    task draws from its own seeded RNG), whatever ``workers`` (processes) is.
    """
    ids = task_ids(suites, split, n_per_template, templates)
    if workers > 1:
        import multiprocessing as mp

        # Shards of whole templates keep each worker's registry caches warm.
        tmpls = sorted({tid.rsplit("/", 1)[0] for tid in ids})
        shard_of = {t: i % workers for i, t in enumerate(tmpls)}
        shards = [[tid for tid in ids if shard_of[tid.rsplit("/", 1)[0]] == w] for w in range(workers)]
        with mp.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_collect_shard, [(sh, seed, explore, render, png_size) for sh in shards])
        by_task: dict[str, list[ScreenState]] = {}
        for part in parts:
            for s in part:
                by_task.setdefault(s.task_id, []).append(s)
        states = [s for tid in ids for s in by_task.get(tid, [])]
    else:
        states = _collect_shard((ids, seed, explore, render, png_size))
    out: list[ScreenState] = []
    seen: set[int] = set()
    for s in states:
        key = hash((s.instruction, s.app, s.nodes, s.action))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def save_states(states: Sequence[ScreenState], path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for s in states:
            f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")


def load_states(path: Path | str) -> list[ScreenState]:
    with gzip.open(Path(path), "rt", encoding="utf-8") as f:
        return [ScreenState.from_json(json.loads(line)) for line in f]


def held_out_states(
    n_per_template: int | None = 3, seed: int = 1, explore: float = 0.5, render: float = 0.0, workers: int = 1,
) -> list[ScreenState]:
    """Screens from ``test``-split tasks (never used in training)."""
    return collect_states(split="test", n_per_template=n_per_template, explore=explore, seed=seed, render=render,
                          workers=workers)


def held_out_only(test: Sequence[ScreenState], train: Sequence[ScreenState]) -> list[ScreenState]:
    """``test`` less any screen identical to a ``train`` one (a screen trained on is not held out)."""
    seen = {s.nodes for s in train}
    return [s for s in test if s.nodes not in seen]


def load_state_cache(folder: Path | str) -> tuple[list[ScreenState], list[ScreenState]]:
    """A run's screen cache (``train.jsonl.gz``, ``test.jsonl.gz``) as the run has its screens: train, and
    held-out ones not among them."""
    train = load_states(Path(folder) / "train.jsonl.gz")
    return train, held_out_only(load_states(Path(folder) / "test.jsonl.gz"), train)


# ----------------------------------------------------------------------------------------- screens


def node_box(n: UINode, width: int, height: int, coords: Coords) -> tuple[int, int, int, int]:
    return to_relative(n.bounds, width, height) if coords == "rel" else n.bounds


def render_line(n: UINode, width: int, height: int, coords: Coords = "rel", index: int | None = None,
                mark: int | None = None) -> str:
    """One compressed-XML line (:meth:`UINode.line`), bounds on the 0-999 grid when ``coords='rel'``, the
    line's number ``mark`` in their place when ``coords='marks'`` (as :func:`mobilerl.agent.prompt.screen_in_frame`)."""
    if coords == "marks":
        if mark is None:
            raise ValueError("coords='marks' renders a line with its number: pass mark=")
        line = f"{n.cls};{' '.join(n.flags)};{n.label};[{mark}]"
    else:
        x1, y1, x2, y2 = node_box(n, width, height, coords)
        line = f"{n.cls};{' '.join(n.flags)};{n.label};[{x1},{y1}][{x2},{y2}]"
    return line if index is None else f"[{index}] {line}"


def render_lines(
    nodes: Sequence[UINode], width: int, height: int, coords: Coords = "rel", numbered: bool = False
) -> list[str]:
    """The lines of :func:`render_screen`."""
    return [render_line(n, width, height, coords, i if numbered else None, i) for i, n in enumerate(nodes)]


def render_screen(
    nodes: Sequence[UINode], width: int, height: int, coords: Coords = "rel", numbered: bool = False
) -> str:
    """The screen text: :func:`mobilerl.env.xml.compress_xml` output, optionally on the 0-999 grid."""
    return "\n".join(render_lines(nodes, width, height, coords, numbered))


def tap_answer(
    nodes: Sequence[UINode], i: int, width: int, height: int, coords: Coords, grounding: Grounding
) -> str:
    if grounding == "index" or coords == "marks":
        return f'do(action="Tap", index={i})'
    return format_action(Action(A.TAP, element=node_box(nodes[i], width, height, coords)))


def expert_answer(state: ScreenState, nodes: Sequence[UINode], coords: Coords, grounding: Grounding) -> str:
    """The expert's action at ``state`` as the model should write it (grid coordinates / line index)."""
    assert state.action is not None
    a = A.parse_action(state.action)
    if a.element is None:
        return state.action
    if coords == "marks":
        return mark_action(a, nodes)
    if grounding == "index":
        for i, n in enumerate(nodes):
            if n.bounds == a.element:
                return f'do(action="{a.name}", index={i})'
    if coords == "rel":
        a = A.convert_action(a, state.width, state.height, "relative")
    return format_action(a)


def history_responses(state: ScreenState, coords: Coords) -> list[str]:
    """The episode's previous actions as a reasoning-free policy wrote them (``<answer>…</answer>``)."""
    if coords == "marks":
        if len(state.history_marks) != len(state.history):
            raise ValueError("states collected before the marks frame existed have no history_marks: re-collect them")
        return [f"<answer>{h}</answer>" for h in state.history_marks]
    out = []
    for h in state.history:
        a = A.parse_action(h)
        if a.element is not None and coords == "rel":
            a = A.convert_action(a, state.width, state.height, "relative")
        out.append(f"<answer>{format_action(a)}</answer>")
    return out

