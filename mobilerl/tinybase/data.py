"""Screen-reading sequences for the tiny base's pretraining, generated from simulator screens.

A randomly initialised tiny model does not learn to *point* (name the line that carries a label) or to *copy*
(repeat an instruction span) from sparse SFT signal on a CPU; real pipelines start from a VLM pretrained on
GUI grounding, and this is the equivalent corpus. A sequence is one screen (:mod:`mobilerl.tinybase.screens`)
in the agent's own user prompt, then question/answer turns about it (:func:`make_qas`: ground, read, checked,
app, find, copy, type, and first the policy's own ``act`` turn), in the project tokenizer's chat template.
Answer tokens weigh 1 in the loss, other text ``lm_weight``; a share ``novel_spans`` of sequences gets random
words for its instruction spans; :func:`encode` also yields attention-supervision pairs.
"""

from __future__ import annotations

import io
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mobilerl.agent import prompt
from mobilerl.agent.prompt import quote_label
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action
from mobilerl.env.xml import UINode
from mobilerl.tinybase.recipe import ALL_KINDS, KINDS, DataConfig
from mobilerl.tinybase.screens import (
    Coords,
    Grounding,
    ScreenState,
    expert_answer,
    history_responses,
    render_lines,
    render_screen,
    tap_answer,
)

ACT_QUESTION = "action?"  # the act question's text (as the policy asks it, the prompt alone is the turn)
MAX_LABEL_CHARS = 60  # longer labels are not asked about (they are still shown)
MAX_READ_CHARS = 80


# --------------------------------------------------------------------------------------- questions


def _action_source(state: ScreenState, nodes: Sequence[UINode]) -> tuple[str, int, str] | None:
    """The source of the expert's action for attention supervision: the line whose box it taps, or the
    instruction span it types."""
    assert state.action is not None
    a = A.parse_action(state.action)
    if a.element is not None:
        i = next((i for i, n in enumerate(nodes) if n.bounds == a.element), None)
        return None if i is None else ("box", i, "")
    if a.name == A.TYPE and a.text and a.text in state.instruction:
        return ("instruction", 0, a.text)
    return None


@dataclass(frozen=True)
class QA:
    kind: str
    question: str
    answer: str
    # Where in the prompt the answer's words are copied from, for attention supervision
    # (``train.attn_sup``): ("box", i, "") the box of screen line i, ("label", i, "") its label, or
    # ("instruction", 0, span) the span's first occurrence in the instruction. None: not a copy.
    source: tuple[str, int, str] | None = None


def _parts(label: str) -> list[str]:
    """The names a line can be asked by: its label, and each side of ``text | desc``."""
    out = [label]
    if " | " in label:
        out.extend(p for p in label.split(" | ") if p)
    return out


def _unique_names(nodes: Sequence[UINode]) -> dict[str, int]:
    """name -> line index, for names that identify exactly one line."""
    count: dict[str, int] = {}
    where: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for p in dict.fromkeys(_parts(n.label)):  # ordered: a set's order changes with PYTHONHASHSEED
            count[p] = count.get(p, 0) + 1
            where[p] = i
    return {p: where[p] for p, c in count.items() if c == 1 and 0 < len(p) <= MAX_LABEL_CHARS}


def _checkable_name(nodes: Sequence[UINode], i: int) -> str:
    label = nodes[i].label
    if label and label.upper() not in ("ON", "OFF"):
        return label
    for j in range(i - 1, max(-1, i - 4), -1):
        if nodes[j].label and nodes[j].label.upper() not in ("ON", "OFF"):
            return nodes[j].label
    return ""


_QUOTED = re.compile(r"""(?:^|(?<=\s))(['"])([^'"]{1,80})\1(?=[\s.,;:!?)]|$)""")


def instruction_spans(instruction: str, typed: Iterable[str] = ()) -> list[str]:
    """Spans of the instruction an agent may have to type: the expert's typed texts that occur in it,
    and quoted strings."""
    out: list[str] = []
    for t in typed:
        if t and t in instruction and t not in out:
            out.append(t)
    for m in _QUOTED.finditer(instruction):
        if m.group(2) not in out:
            out.append(m.group(2))
    return out


def random_spans(instruction: str, rng: random.Random, k: int, max_words: int = 8) -> list[str]:
    """Up to ``k`` random spans of the instruction for extra span-copy practice on every screen: from a
    word (not the first) up to the next punctuation mark or quote, at most ``max_words`` words. Spans end
    where a span an agent types usually ends (a quote, the end of a clause), so the question is
    well-posed: the cue fixes the start and the text fixes the end."""
    starts = [m.start() for m in re.finditer(r"(?<=\s)[^\s'\"]", instruction)]
    out: list[str] = []
    for at in rng.sample(starts, min(len(starts), 3 * k)):
        m = re.match(r"[^.,;:!?'\"]+", instruction[at:])
        span = m.group(0).strip() if m else ""
        if span and len(span.split()) <= max_words and span not in out:
            out.append(span)
        if len(out) >= k:
            break
    return out


SPAN_ENDS = frozenset(".,;:!?'\"")


def well_posed_span(instruction: str, span: str) -> bool:
    """Whether ``type after "<cue>"`` determines ``span``: at its first occurrence in the instruction the span
    ends where the text says a span ends (the end of the instruction, a quote or a punctuation mark, after
    spaces at most, as :func:`random_spans` ends its spans). The expert also types parts of phrases (the
    first name of "named Wei Wang with …" into a First name field): a question can start such a span but not
    say where it stops, so answering it is a convention, not a copy."""
    at = instruction.find(span) if span else -1
    if at < 0:
        return False
    rest = instruction[at + len(span):].lstrip()
    return not rest or rest[0] in SPAN_ENDS


def typed_texts(states: Iterable[ScreenState]) -> dict[str, tuple[str, ...]]:
    """task id -> the texts the expert typed in that task (from the states' actions)."""
    out: dict[str, list[str]] = {}
    for st in states:
        if st.action and st.action.startswith('do(action="Type"'):
            text = A.parse_action(st.action).text or ""
            out.setdefault(st.task_id, [])
            if text and text not in out[st.task_id]:
                out[st.task_id].append(text)
    return {k: tuple(v) for k, v in out.items()}


def copy_qas(instruction: str, spans: Sequence[str]) -> list[QA]:
    """``type after "<cue>"`` → ``do(action="Type", text="<span>")``: the cue is the 1-3 words before
    the span's first occurrence (unique in the instruction); spans at the very start are skipped."""
    out = []
    for span in spans:
        at = instruction.find(span)
        if at <= 0:
            continue
        words = instruction[:at].rstrip(" '\"").split()
        for k in (1, 2, 3):
            cue = " ".join(words[-k:]).strip("'\"")
            if cue and '"' not in cue and instruction.count(cue) == 1:
                question = f"type after {quote_label(cue)}"
                out.append(QA("copy", question, format_action(Action(A.TYPE, text=span)), ("instruction", 0, span)))
                break
    return out


def make_qas(
    state: ScreenState,
    rng: random.Random,
    coords: Coords = "marks",
    grounding: Grounding = "bbox",
    weights: dict[str, float] | None = None,
    n: int = 16,
    spans: Sequence[str] = (),
) -> list[QA]:
    """Up to ``n`` questions about the screen of ``state``; ``spans``: the instruction spans to ask copies of.

    Kinds are drawn by ``weights`` among those the screen supports; a question is asked at most once.
    ``grounding="index"`` (numbered lines that keep their boxes) is only the tokenizer corpus' rendering.
    """
    nodes = state.nodes
    w, h = state.width, state.height
    names = _unique_names(nodes)
    pools: dict[str, list[QA]] = {k: [] for k in ALL_KINDS}
    # a box answer copies the line's box, a marks answer its number; an index answer (numbered lines that
    # keep their boxes) was not supervised
    copies_box = grounding == "bbox" or coords == "marks"
    for name, i in names.items():
        box = ("box", i, "") if copies_box else None
        pools["ground"].append(QA("ground", f"tap {quote_label(name)}", tap_answer(nodes, i, w, h, coords, grounding),
                                  box))
        nxt = next((j for j in range(i + 1, len(nodes)) if nodes[j].label), None)
        if nxt is not None and len(nodes[nxt].label) <= MAX_READ_CHARS and name == nodes[i].label:
            pools["read"].append(QA("read", f"read {quote_label(name)}", nodes[nxt].label, ("label", nxt, "")))
    for i, nd in enumerate(nodes):
        if "checkable" in nd.flags:
            name = _checkable_name(nodes, i)
            if name in names:
                yes = "yes" if "checked" in nd.flags else "no"
                pools["checked"].append(QA("checked", f"checked {quote_label(name)}?", yes))
    pools["app"].append(QA("app", "app?", state.app))
    on_names = set(names)
    for name, i in names.items():
        pools["find"].append(QA("find", f"find {quote_label(name)}", tap_answer(nodes, i, w, h, coords, grounding),
                                ("box", i, "") if copies_box else None))
    off_count: dict[str, int] = {}
    for nd in state.offscreen:
        off_count[nd.label] = off_count.get(nd.label, 0) + 1
    for nd in state.offscreen:
        lab = nd.label
        if off_count[lab] != 1 or lab in on_names or len(lab) > MAX_LABEL_CHARS:
            continue
        below = nd.bounds[1] >= h // 2
        direction = "up" if below else "down"  # swipe up scrolls the content down
        act = format_action(Action(A.SWIPE, direction=direction, dist="medium"))
        pools["find"].append(QA("find", f"find {quote_label(lab)}", act))
    if state.action and state.action.startswith('do(action="Type"'):
        text = A.parse_action(state.action).text or ""
        if text and text in state.instruction:
            pools["type"].append(QA("type", "type?", state.action, _action_source(state, nodes)))
    pools["copy"].extend(copy_qas(state.instruction, spans))
    if state.action:
        pools["act"].append(QA("act", ACT_QUESTION, expert_answer(state, nodes, coords, grounding),
                               _action_source(state, nodes) if copies_box else None))
    weights = weights or {k: 1.0 for k in KINDS}
    for pool in pools.values():
        rng.shuffle(pool)
    out: list[QA] = []
    asked: set[str] = set()
    while len(out) < n:
        kinds = [k for k in ALL_KINDS if pools[k] and weights.get(k, 0) > 0]
        if not kinds:
            break
        k = rng.choices(kinds, [weights[k] for k in kinds])[0]
        qa = pools[k].pop()
        if qa.question in asked:
            continue
        asked.add(qa.question)
        out.append(qa)
    return out


# --------------------------------------------------------------------------------------- sequences


@dataclass
class Example:
    messages: list[dict[str, Any]]
    kinds: list[str]
    image: bytes | None = None
    # For attention supervision: each answer's QA.source, the screen lines and the instruction shown.
    sources: list[tuple[str, int, str] | None] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    instruction: str = ""


IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
ACTION_KINDS = ("ground", "find", "copy", "type", "act")  # kinds whose answer is an action


def prompt_text(state: ScreenState, screen: str, cfg: DataConfig, with_image: bool = False) -> str:
    """The first user turn up to the first question: the agent's own user prompt
    (:func:`mobilerl.agent.prompt.user_prompt`: task, previous actions, app, screen elements)."""
    img = IMAGE_PLACEHOLDER if with_image else ""
    text = prompt.user_prompt(state.instruction, history_responses(state, cfg.coords), screen, app=state.app,
                              mode="xml", max_history=cfg.max_history, coords=cfg.coords)
    return img + text + "\n"


def system_message(cfg: DataConfig) -> dict[str, str]:
    return {"role": "system", "content": prompt.system_prompt("xml", style=cfg.system_style)}


def question_turn(state: ScreenState, screen: str, qa: QA, cfg: DataConfig, first: bool = True,
                  with_image: bool = False) -> str:
    """The user turn that asks ``qa``: the prompt (first turn only), then the question. The ``act`` question
    is the policy's own turn: the user prompt exactly, nothing after it."""
    if qa.kind == "act":
        return prompt_text(state, screen, cfg, with_image).rstrip("\n")
    return (prompt_text(state, screen, cfg, with_image) if first else "") + qa.question


def wrap_answer(qa: QA) -> str:
    return f"<answer>{qa.answer}</answer>" if qa.kind in ACTION_KINDS else qa.answer


def build_example(
    state: ScreenState, rng: random.Random, cfg: DataConfig, n_questions: int | None = None,
    spans: Sequence[str] = (),
) -> Example:
    """A chat (``messages``) asking many questions about one screen."""
    qas = make_qas(state, rng, cfg.coords, "bbox", cfg.weights, n_questions or cfg.questions, spans)
    # The next-action question is the policy's own turn: first, with no question after the prompt.
    qas.sort(key=lambda qa: qa.kind != "act")
    lines = render_lines(state.nodes, state.width, state.height, cfg.coords)
    screen = "\n".join(lines)  # = render_screen(state.nodes, ...)
    with_image = state.png is not None and rng.random() < cfg.image_prob
    msgs: list[dict[str, Any]] = []
    if qas and rng.random() < cfg.system_prob:
        msgs.append(system_message(cfg))
    for j, qa in enumerate(qas):
        user = question_turn(state, screen, qa, cfg, first=j == 0, with_image=with_image)
        msgs.append({"role": "user", "content": user})
        msgs.append({"role": "assistant", "content": wrap_answer(qa)})
    return Example(msgs, [qa.kind for qa in qas], state.png if with_image else None, [qa.source for qa in qas],
                   lines, state.instruction)


def chat_text(messages: Sequence[dict[str, Any]]) -> str:
    """The chat template of the project tokenizer, inlined (kept equal to ``tokenizer.CHAT_TEMPLATE``)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


@dataclass
class Encoded:
    input_ids: list[int]
    weights: list[float]  # per-token loss weight of predicting this token (0 for the first)
    answer_spans: list[tuple[int, int, str]]  # (start, end) token positions of each answer, its kind
    pixel_values: Any = None
    image_grid_thw: Any = None
    # (query, key) token positions: the position that predicts a copied answer token, and that token's
    # source in the prompt (attention supervision; text-only sequences).
    attn_pairs: list[tuple[int, int]] = field(default_factory=list)


def encode(example: Example, processor: Any, cfg: DataConfig, max_len: int | None = None,
           attn_pairs: bool = False) -> Encoded:
    """Tokenize through the processor; weight answers 1 and other text ``lm_weight``; cut at ``max_len``.
    ``attn_pairs``: also compute :attr:`Encoded.attn_pairs` (:func:`copy_pairs`; text-only examples).

    The cut keeps whole question/answer turns (the sequence ends after an ``<|im_end|>``).
    """
    tok = processor.tokenizer
    text = chat_text(example.messages)
    if example.image is not None:
        from PIL import Image

        img = Image.open(io.BytesIO(example.image)).convert("RGB")
        enc = processor(text=[text], images=[img], return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        pixel_values, grid = enc["pixel_values"], enc["image_grid_thw"]
    else:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=attn_pairs)
        ids, offsets = enc["input_ids"], enc.get("offset_mapping")
        pixel_values = grid = None
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    h = len(header)
    specials = set(tok.all_special_ids)
    limit = max_len or cfg.max_len
    weights = [0.0] * len(ids)
    spans: list[tuple[int, int, str]] = []
    i, turn = 0, 0
    cut = len(ids)
    while i < len(ids):
        if ids[i : i + h] == header:
            s = i + h  # after "<|im_start|>assistant\n"
            e = ids.index(im_end, s) + 1  # the answer and its <|im_end|>
            if e > limit:
                cut = i
                break
            for t in range(s, e):
                weights[t] = 1.0
            kind = example.kinds[turn] if turn < len(example.kinds) else "?"
            spans.append((s, e, kind))
            turn += 1
            i = e
            continue
        if ids[i] not in specials:
            weights[i] = cfg.lm_weight
        i += 1
    if cut < len(ids):
        # Keep whole turns: end right after the last answer that fits (its <|im_end|>).
        cut = spans[-1][1] if spans else min(cut, limit)
        ids, weights = ids[:cut], weights[:cut]
    with_pairs = attn_pairs and example.image is None and example.sources
    pairs = copy_pairs(example, text, ids, offsets, spans, tok) if with_pairs else []
    return Encoded(ids, weights, spans, pixel_values, grid, pairs)


def _source_chars(example: Example, text: str) -> list[tuple[int, int] | None]:
    """Each answer's source as a character range of ``text`` (None where it has none or is not found)."""
    starts: list[int] = []
    at = 0
    for line in example.lines:  # the screen lines, in order, in the first user turn
        at = text.find(line, at)
        if at < 0:
            starts = []
            break
        starts.append(at)
        at += len(line)
    instr = example.instruction.strip()
    instr_at = text.find(instr) if instr else -1
    out: list[tuple[int, int] | None] = []
    for src in example.sources:
        r = None
        if src is not None:
            what, i, span = src
            if what in ("box", "label") and starts and 0 <= i < len(starts):
                line = example.lines[i]
                if what == "box":
                    b = line.rfind(";[") + 1
                    r = (starts[i] + b, starts[i] + len(line))
                else:  # Class;flags;label;[box]: the label starts after the second ';'
                    b = line.index(";", line.index(";") + 1) + 1
                    e = line.rfind(";[")
                    r = (starts[i] + b, starts[i] + e) if e > b else None
            elif what == "instruction" and instr_at >= 0 and span:
                k = instr.find(span)
                r = (instr_at + k, instr_at + k + len(span)) if k >= 0 else None
        out.append(r)
    return out


_CONTENT: dict[tuple[int, int], bool] = {}


def _is_content(tok: Any, t: int) -> bool:
    """Whether token ``t`` holds a letter or digit (punctuation is not supervised: it repeats everywhere)."""
    key = (id(tok), t)
    if key not in _CONTENT:
        _CONTENT[key] = any(c.isalnum() for c in tok.decode([t]))
    return _CONTENT[key]


def copy_pairs(example: Example, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
               spans: Sequence[tuple[int, int, str]], tok: Any) -> list[tuple[int, int]]:
    """Attention targets for answers that copy from the prompt: for each letter/digit token of such an
    answer, (the position that predicts it, the position of the same token in its source), matched in
    order. A source token that the answer spells differently (a word-initial space) is skipped."""
    chars = _source_chars(example, text)
    pairs: list[tuple[int, int]] = []
    for turn, (s, e, _) in enumerate(spans):
        r = chars[turn] if turn < len(chars) else None
        if r is None:
            continue
        src = [j for j in range(s) if offsets[j][1] > r[0] and offsets[j][0] < r[1]]
        cur = 0
        for a in range(s, e):
            if not _is_content(tok, ids[a]):
                continue
            j = next((x for x in range(cur, len(src)) if ids[src[x]] == ids[a]), None)
            if j is None:
                continue
            pairs.append((a - 1, src[j]))
            cur = j + 1
    return pairs


_WORD = re.compile(r"[A-Za-z]{2,}")


def word_pool(states: Iterable[ScreenState], limit: int = 20000) -> list[str]:
    """Alphabetic words (2+ letters) of the states' instructions and screen labels: the vocabulary
    :func:`with_novel_spans` draws replacement words from (words the tokenizer has seen)."""
    words: set[str] = set()
    for st in states:
        words.update(_WORD.findall(st.instruction))
        for n in st.nodes:
            words.update(_WORD.findall(n.label))
        if len(words) >= limit:
            break
    return sorted(words)


def with_novel_spans(state: ScreenState, spans: Sequence[str], rng: random.Random,
                     words: Sequence[str]) -> tuple[ScreenState, list[str]]:
    """The state with each span (a text the agent types, a quoted name) replaced by random words,
    everywhere it occurs: instruction, screen lines, history and the expert's action.

    The train split has a few thousand distinct spans, each seen on many screens, so a small model
    can answer ``type after "label"`` by recalling the span that goes with this instruction instead of
    copying it; a fresh span every time leaves copying as the only way. Alphabetic words are replaced
    (capitalisation kept), digits and punctuation stay, so the span keeps its shape.
    """
    if not spans or not words:
        return state, list(spans)

    def fresh(span: str) -> str:
        out = []
        for tok in span.split(" "):
            if tok.isalpha():
                w = rng.choice(words)
                w = w.capitalize() if tok[0].isupper() else w.lower()
                out.append(w)
            else:
                out.append(tok)
        return " ".join(out)

    mapping = {sp: fresh(sp) for sp in sorted(dict.fromkeys(spans), key=len, reverse=True) if sp}

    def sub(text: str | None) -> str | None:
        if not text:
            return text
        for old, new in mapping.items():
            text = text.replace(old, new)
        return text

    def nodes(ns: tuple[UINode, ...]) -> tuple[UINode, ...]:
        return tuple(UINode(n.cls, n.flags, sub(n.label) or "", n.bounds) if any(o in n.label for o in mapping)
                     else n for n in ns)

    new_state = replace(state, instruction=sub(state.instruction) or "", nodes=nodes(state.nodes),
                        offscreen=nodes(state.offscreen), action=sub(state.action),
                        history=tuple(sub(h) or "" for h in state.history),
                        history_marks=tuple(sub(h) or "" for h in state.history_marks))
    return new_state, [mapping.get(sp, sp) for sp in spans]


def stream_examples(states: Sequence[ScreenState], cfg: DataConfig, seed: int = 0) -> Iterator[Example]:
    """Endless examples.

    States are drawn uniformly, except that a share ``cfg.type_frac`` of the sequences is drawn from the
    (rare) states where the expert types a span of the instruction, so span copying gets examples. Copy
    questions are asked only where the question determines the span (:func:`well_posed_span`).
    """
    rng = random.Random(seed)
    typed = typed_texts(states)
    words = word_pool(states) if cfg.novel_spans > 0 else []
    type_states = [
        s for s in states
        if s.action and s.action.startswith('do(action="Type"')
        and (A.parse_action(s.action).text or "\0") in s.instruction
    ]
    while True:
        if type_states and rng.random() < cfg.type_frac:
            st = type_states[rng.randrange(len(type_states))]
        else:
            st = states[rng.randrange(len(states))]
        if not st.nodes:
            continue
        st, spans = copy_spans(st, typed.get(st.task_id, ()), rng, cfg, words)
        spans = [x for x in spans if well_posed_span(st.instruction, x)]
        ex = build_example(st, rng, cfg, spans=spans)
        if ex.messages:
            yield ex


def copy_spans(st: ScreenState, typed: Sequence[str], rng: random.Random, cfg: DataConfig,
               words: Sequence[str]) -> tuple[ScreenState, list[str]]:
    """The screen (with its spans renewed where ``cfg.novel_spans`` draws it) and the instruction spans its
    copy questions ask: the typed and quoted spans, then ``cfg.random_spans`` random ones, drawn from the
    instruction as the sequence shows it."""
    spans = instruction_spans(st.instruction, typed)
    if spans and cfg.novel_spans > 0 and rng.random() < cfg.novel_spans:
        st, spans = with_novel_spans(st, spans, rng, words)
    if not cfg.random_spans:
        return st, spans
    extra = random_spans(st.instruction, rng, cfg.random_spans, cfg.span_words)
    return st, spans + [x for x in extra if x not in spans]


def corpus_texts(states: Iterable[ScreenState], rng: random.Random | None = None) -> Iterator[str]:
    """Text for training the tokenizer: every rendering of the screens, questions and answers."""
    rng = rng or random.Random(0)
    for mode in prompt.OBSERVATION_MODES:
        for reasoning in (False, True):
            yield prompt.system_prompt(mode, reasoning) * 20
    # the corpus the released tokenizer was trained on: prompts in the 0-999 grid frame, the whole history
    grid = DataConfig(coords="rel", max_history=None)
    for st in states:
        yield prompt_text(st, "", grid)
        for coords in ("rel", "abs"):
            for numbered in (False, True):
                yield render_screen(st.nodes, st.width, st.height, coords, numbered)  # type: ignore[arg-type]
        yield f"Task: {st.instruction}"
        if st.action:
            yield st.action
        for grounding in ("bbox", "index"):
            qas = make_qas(st, rng, "rel", grounding, None, 8)  # type: ignore[arg-type]
            msgs = []
            for qa in qas:
                msgs += [{"role": "user", "content": qa.question}, {"role": "assistant", "content": qa.answer}]
            yield chat_text(msgs)
