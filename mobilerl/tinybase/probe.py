"""Held-out screen-reading probe for the tiny base: grounding, reading, state questions, span copy, next action.

Probe screens come from the simulator's ``test`` split (:func:`mobilerl.tinybase.screens.held_out_states`),
whose seeds and instructions are disjoint from the ``train`` split of pretraining; an item is one question
about a full screen, in the training chat format, and is correct iff the answer equals the target exactly.
:func:`score_teacher_forced` checks in one forward pass that the argmax at every answer position (the
closing ``<|im_end|>`` included) is the target token, which is greedy decoding reproducing the answer;
:func:`score_generate` decodes greedily. ``copy`` items use only spans that the question determines
(:func:`~mobilerl.tinybase.data.well_posed_span`).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mobilerl.tinybase.data import (
    QA,
    Example,
    chat_text,
    encode,
    instruction_spans,
    make_qas,
    question_turn,
    system_message,
    typed_texts,
    well_posed_span,
    wrap_answer,
)
from mobilerl.tinybase.recipe import ALL_KINDS, KINDS, DataConfig
from mobilerl.tinybase.screens import ScreenState, render_screen

ACCEPTANCE = {"ground": 0.90, "read": 0.90, "copy": 0.95}


@dataclass
class ProbeItem:
    kind: str
    example: Example  # one user turn + one assistant turn
    state_index: int


def _ask(st: ScreenState, screen: str, qa: QA, cfg: DataConfig) -> list[dict[str, str]]:
    """One probe question as messages: the system prompt where the recipe's sequences may have one, then
    the user turn (:func:`question_turn`)."""
    system = [system_message(cfg)] if cfg.system_prob > 0 else []
    return [*system, {"role": "user", "content": question_turn(st, screen, qa, cfg)}]


def build_items(
    states: Sequence[ScreenState], cfg: DataConfig, n_per_kind: int = 200, seed: int = 0,
    kinds: Sequence[str] = KINDS,
) -> list[ProbeItem]:
    """Up to ``n_per_kind`` single-question items per kind, each on a different screen where possible."""
    rng = random.Random(seed)
    typed = typed_texts(states)
    by_kind: dict[str, list[ProbeItem]] = defaultdict(list)
    order = list(range(len(states)))
    rng.shuffle(order)
    for si in order:
        st = states[si]
        if not st.nodes:
            continue
        spans = instruction_spans(st.instruction, typed.get(st.task_id, ()))
        qas = make_qas(st, rng, cfg.coords, "bbox", {k: 1.0 for k in ALL_KINDS}, n=64, spans=spans)
        seen: set[str] = set()
        screen = None
        for qa in qas:
            if qa.kind not in kinds or qa.kind in seen or len(by_kind[qa.kind]) >= n_per_kind:
                continue
            if qa.kind == "copy" and not well_posed_span(st.instruction, qa.source[2] if qa.source else ""):
                continue  # the question cannot say where the span ends (the items of the other kinds stay)
            seen.add(qa.kind)
            if screen is None:
                screen = render_screen(st.nodes, st.width, st.height, cfg.coords)
            msgs = [*_ask(st, screen, qa, cfg), {"role": "assistant", "content": wrap_answer(qa)}]
            by_kind[qa.kind].append(ProbeItem(qa.kind, Example(msgs, [qa.kind]), si))
        if all(len(by_kind[k]) >= n_per_kind for k in kinds):
            break
    return [it for k in kinds for it in by_kind[k]]


def release_items(states: Sequence[ScreenState], cfg: DataConfig, n_per_kind: int = 200,
                  seed: int = 12345) -> list[ProbeItem]:
    """The release probe's items: every screen-reading kind, plus the expert's next action (``act``)
    when the recipe trains it."""
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
