"""Held-out screen-reading probe for the tiny base: grounding, reading, state questions, span copy.

Protocol: probe screens come from the simulator's ``test`` split (:func:`held_out_states`), whose device
seeds and instructions are disjoint from the ``train`` split that pretraining draws from (the registry
redraws train instances whose instruction equals a test one). Each probe item is **one** question about
a **full** screen, in the same chat format as training (``Task/Screen`` user turn, answer turn).

Scoring: an item is correct iff the model's answer equals the target string exactly (``ground``: the
same element's box on the 0-999 grid, or its index; ``read``: the same text; ``type``: the same
``do(action="Type", text=…)``). Two equivalent ways are implemented:

- :func:`score_teacher_forced` — one forward pass; correct iff the argmax at every answer position
  (answer tokens and the closing ``<|im_end|>``) is the target token. This is exactly "greedy decoding
  reproduces the answer", at a fraction of the cost, and is what training logs use.
- :func:`score_generate` — ``model.generate`` greedy decoding from the prompt, then string comparison
  (and, for ``ground`` in ``bbox`` mode, also whether the tap's centre lands inside the target).

Acceptance figures (``scripts/probe_tiny_base.py``): ``ground`` = grounding exact element, ``read`` =
reading, ``copy`` = instruction-span copy (``type after "<words>"`` → the ``Type`` action with the span of
the instruction that follows those words; only spans that end at a punctuation mark, a quote or the end of
the instruction, :func:`~mobilerl.models.pretrain_data.well_posed_span`, since the question cannot say where
any other span stops). ``type`` (the Type action on a screen where the expert types
a span of the instruction, with no cue) is reported beside them.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mobilerl.models.pretrain_data import (
    ACT_QUESTION,
    ALL_KINDS,
    KINDS,
    QA,
    DataConfig,
    Example,
    ScreenState,
    chat_text,
    encode,
    make_qas,
    mark_action,
    question_turn,
    render_screen,
    system_message,
    wrap_answer,
)

ACCEPTANCE = {"ground": 0.90, "read": 0.90, "copy": 0.95}


@dataclass
class ProbeItem:
    kind: str
    example: Example  # one user turn + one assistant turn
    state_index: int


def held_out_states(
    n_per_template: int | None = 3, seed: int = 1, explore: float = 0.5, render: float = 0.0, workers: int = 1,
) -> list[ScreenState]:
    """Screens from ``test``-split tasks (never used in training)."""
    from mobilerl.models.pretrain_data import collect_states

    return collect_states(split="test", n_per_template=n_per_template, explore=explore, seed=seed, render=render,
                          workers=workers)


def _ask(st: ScreenState, screen: str, qa: QA, cfg: DataConfig) -> list[dict[str, str]]:
    """One probe question as messages: the system prompt where the profile's sequences may have one, then
    the user turn (:func:`question_turn`)."""
    system = [system_message(cfg)] if cfg.prompt == "policy" and cfg.system_prob > 0 else []
    return [*system, {"role": "user", "content": question_turn(st, screen, qa, cfg)}]


def build_items(
    states: Sequence[ScreenState], cfg: DataConfig, n_per_kind: int = 200, seed: int = 0,
    kinds: Sequence[str] = KINDS, max_lines: int = 0,
) -> list[ProbeItem]:
    """Up to ``n_per_kind`` single-question items per kind, each on a different screen where possible.

    ``max_lines > 0`` asks about a random window of at most that many consecutive lines instead of the
    full screen (to watch the mechanism form before the curriculum reaches full screens).
    """
    from mobilerl.models.pretrain_data import instruction_spans, typed_texts, well_posed_span

    rng = random.Random(seed)
    numbered = cfg.numbered_lines
    typed = typed_texts(states)
    by_kind: dict[str, list[ProbeItem]] = defaultdict(list)
    order = list(range(len(states)))
    rng.shuffle(order)
    for si in order:
        st = states[si]
        if not st.nodes:
            continue
        nodes = st.nodes
        if 0 < max_lines < len(nodes):
            start = rng.randrange(len(nodes) - max_lines + 1)
            nodes = nodes[start : start + max_lines]
        full = len(nodes) == len(st.nodes)
        spans = instruction_spans(st.instruction, typed.get(st.task_id, ()))
        qas = make_qas(st, nodes, rng, cfg.coords, cfg.grounding, full, {k: 1.0 for k in ALL_KINDS}, n=64,
                       spans=spans)
        seen: set[str] = set()
        screen = None
        for qa in qas:
            if qa.kind not in kinds or qa.kind in seen or len(by_kind[qa.kind]) >= n_per_kind:
                continue
            if qa.kind == "copy" and not well_posed_span(st.instruction, qa.source[2] if qa.source else ""):
                continue  # the question cannot say where the span ends (the items of the other kinds stay)
            seen.add(qa.kind)
            if screen is None:
                screen = render_screen(nodes, st.width, st.height, cfg.coords, numbered)
            msgs = [*_ask(st, screen, qa, cfg), {"role": "assistant", "content": wrap_answer(qa, cfg)}]
            by_kind[qa.kind].append(ProbeItem(qa.kind, Example(msgs, [qa.kind]), si))
        if all(len(by_kind[k]) >= n_per_kind for k in kinds):
            break
    return [it for k in kinds for it in by_kind[k]]


def release_items(states: Sequence[ScreenState], cfg: DataConfig, n_per_kind: int = 200,
                  seed: int = 12345) -> list[ProbeItem]:
    """The release probe's items: every screen-reading kind, plus the expert's next action (``act``)
    when the profile trains it."""
    kinds = (*KINDS, "act") if cfg.weights.get("act", 0) > 0 else KINDS
    return build_items(states, cfg, n_per_kind=n_per_kind, seed=seed, kinds=kinds)


def _batches(items: Sequence[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def score_teacher_forced(
    model: Any, processor: Any, items: Sequence[ProbeItem], cfg: DataConfig, batch_size: int = 16,
    max_len: int = 4096,
) -> dict[str, float]:
    """Exact-answer accuracy per kind by teacher forcing (see module docstring); plus ``n_<kind>``."""
    import torch

    model.eval()
    pad = processor.tokenizer.pad_token_id
    right: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    with torch.no_grad():
        for batch in _batches(list(items), batch_size):
            encs = [encode(it.example, processor, cfg, max_len=max_len) for it in batch]
            T = max(len(e.input_ids) for e in encs)
            ids = torch.full((len(encs), T), pad, dtype=torch.long)
            for b, e in enumerate(encs):
                ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
            ids = ids.to(model.device)
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            for b, (e, it) in enumerate(zip(encs, batch, strict=True)):
                total[it.kind] += 1
                if not e.answer_spans:
                    continue
                s, t, _ = e.answer_spans[0]
                logits = model.lm_head(hidden[b, s - 1 : t - 1])
                ok = bool((logits.argmax(-1) == ids[b, s:t]).all())
                right[it.kind] += ok
    out = {k: right[k] / total[k] for k in total if total[k]}
    out.update({f"n_{k}": total[k] for k in total})
    return out


def _center_inside(pred: str, target: str) -> bool:
    from mobilerl.env.actions import ActionParseError, parse_action

    try:
        p, t = parse_action(pred), parse_action(target)
    except ActionParseError:
        return False
    if p.name != t.name or p.center is None or t.element is None:
        return False
    x, y = p.center
    x1, y1, x2, y2 = t.element
    return x1 <= x <= x2 and y1 <= y <= y2


def score_generate(
    model: Any, processor: Any, items: Sequence[ProbeItem], batch_size: int = 16, max_new_tokens: int = 64,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy generation accuracy per kind, plus per-item records (prompt-free: kind, target, output).

    A batch generates up to ``max_new_tokens`` tokens, or 16 more than its longest target where that is longer
    (a recipe's directions copied into a ``Type`` run past 64 tokens): a right answer is never cut off, and an
    output longer than its target is wrong wherever it stops."""
    import torch

    tok = processor.tokenizer
    model.eval()
    right: dict[str, int] = defaultdict(int)
    center: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    rows: list[dict[str, Any]] = []
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        for batch in _batches(list(items), batch_size):
            prompts = [chat_text(it.example.messages[:-1]) + "<|im_start|>assistant\n" for it in batch]
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            longest = max(len(tok(it.example.messages[-1]["content"], add_special_tokens=False)["input_ids"])
                          for it in batch)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max(max_new_tokens, longest + 16), do_sample=False)
            new = out[:, enc["input_ids"].shape[1] :]
            for it, seq in zip(batch, new, strict=True):
                text = tok.decode(seq, skip_special_tokens=True).strip()
                target = it.example.messages[-1]["content"]
                ok = text == target
                total[it.kind] += 1
                right[it.kind] += ok
                if it.kind in ("ground", "find"):
                    center[it.kind] += ok or _center_inside(text, target)
                rows.append({"kind": it.kind, "target": target, "output": text, "correct": ok})
    finally:
        tok.padding_side = old_side
    acc = {k: right[k] / total[k] for k in total}
    acc.update({f"{k}_center_hit": center[k] / total[k] for k in center})
    acc.update({f"n_{k}": total[k] for k in total})
    return acc, rows


def rollout_success(
    model: Any, processor: Any, task_ids: Sequence[str], cfg: DataConfig, batch_size: int = 16,
    max_new_tokens: int = 48, perturb: str = "default",
) -> dict[str, Any]:
    """Closed-loop episodes with greedy actions (the ``act`` question on the current full screen).

    For the SFT counterfactual (``act`` kind). Episodes run in lockstep so generation is batched. The
    answer is mapped back to the env's pixels (grid → pixels, ``index=i`` → the line's box); a response
    that does not parse is an invalid step (counted in the budget, env not stepped).
    """
    import torch

    from mobilerl.env import actions as A
    from mobilerl.env.sim import SimEnv
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.env.xml import compress_nodes
    from mobilerl.models.pretrain_data import resolve_index_action

    tok = processor.tokenizer
    numbered = cfg.numbered_lines
    results: dict[str, bool] = {}
    steps: dict[str, int] = {}
    model.eval()
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        for chunk in _batches(list(task_ids), batch_size):
            envs = {}
            for tid in chunk:
                env = SimEnv(render=False, perturb=perturb)
                env.reset(get_task(tid, with_optimal=False))
                envs[tid] = env
            used = dict.fromkeys(chunk, 0)
            history: dict[str, list[str]] = {tid: [] for tid in chunk}
            marks: dict[str, list[str]] = {tid: [] for tid in chunk}  # the same actions in the marks frame
            live = list(chunk)
            while live:
                prompts, nodes_of = [], {}
                for tid in live:
                    env = envs[tid]
                    obs = env._observe()
                    nodes = compress_nodes(obs.xml, width=obs.width, height=obs.height)
                    nodes_of[tid] = nodes
                    st = ScreenState(tid, env.task.instruction, obs.app, obs.width, obs.height, tuple(nodes),
                                     history=tuple(history[tid]), history_marks=tuple(marks[tid]))
                    screen = render_screen(nodes, obs.width, obs.height, cfg.coords, numbered)
                    msgs = _ask(st, screen, QA("act", ACT_QUESTION, ""), cfg)
                    prompts.append(chat_text(msgs) + "<|im_start|>assistant\n")
                enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
                with torch.no_grad():
                    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
                texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                still = []
                for tid, text in zip(live, texts, strict=True):
                    env = envs[tid]
                    used[tid] += 1
                    try:
                        act = A.parse_action(resolve_index_action(text.strip(), nodes_of[tid]))
                        if act.element is not None and cfg.coords == "rel" and "index=" not in text:
                            act = A.convert_action(act, env.device.width, env.device.height, "absolute")
                        done = env.step(act).done
                        history[tid].append(A.format_action(act))
                        marks[tid].append(mark_action(act, nodes_of[tid]))
                    except A.ActionParseError:
                        done = used[tid] >= env.task.max_steps
                    if done or used[tid] >= env.task.max_steps:
                        results[tid] = bool(env.device.finished and env.tmpl.check(env.device, env.task.params))
                        steps[tid] = used[tid]
                    else:
                        still.append(tid)
                live = still
    finally:
        tok.padding_side = old_side
    n = len(results)
    return {"success_rate": sum(results.values()) / max(1, n), "episodes": n,
            "mean_steps": sum(steps.values()) / max(1, n), "per_task": results}
