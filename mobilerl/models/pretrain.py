"""Screen-reading pretraining of the tiny base model (the ``pretrain`` stage's compute).

One run: collect train-split screens → train the tokenizer on them → build the tiny Qwen2-VL model →
train on dense multi-question sequences (:mod:`mobilerl.models.pretrain_data`) with AdamW, linear
warm-up and cosine decay → probe on held-out test-split screens (:mod:`mobilerl.models.probe`) → save
in HF format. A run checkpoints itself (``<work>/last.pt``: weights, optimizer, step, tokenizer) every
``save_every_minutes`` and resumes from there when started again with the same ``work`` folder, so a long
run can span sessions.

Loss: weighted token cross-entropy, ``sum(w_t · CE_t) / sum(w_t)`` with ``w = 1`` on answer tokens and
``data.lm_weight`` on the other text tokens. Logits are only computed where ``w > 0``.

Curves (one JSON object per line in ``<work>/curve.jsonl``): ``train`` rows (loss, answer-token
accuracy, tokens/s, learning rate, screen window) every ``log_every`` steps and ``probe`` rows (held-out
exact-answer accuracy per question kind, teacher-forced, under ``accuracy``; item counts under ``items``)
every ``probe_every`` steps, both with the step, wall-clock minutes and tokens seen. (Curves written before
2026-11-22 have the accuracies flat in the row, where the ``type`` kind's accuracy replaced the row's
``type: "probe"``.)
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mobilerl.models.pretrain_data import (
    KINDS,
    DataConfig,
    Encoded,
    ScreenState,
    encode,
    load_states,
    stream_examples,
)
from mobilerl.models.tiny import TinyShape


@dataclass
class TrainConfig:
    """Optimisation settings of the tiny profile (``configs/tiny.yaml`` → ``train:``)."""

    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.05
    beta2: float = 0.98
    grad_clip: float = 1.0
    batch_tokens: int = 12288  # tokens per optimizer step (sequences are added until reached)
    max_steps: int = 3000
    max_minutes: float = 110.0  # safety stop (the schedule is by steps)
    stop_step: int = 0  # > 0: stop there (the schedule still runs to max_steps; for short experiments)
    log_every: int = 20
    probe_every: int = 250
    probe_items: int = 60  # held-out items per kind for the in-training probe
    probe_window: int = 0  # > 0: also probe on windows of at most this many lines (keys "win_<kind>")
    probe_kinds: list[str] | None = None  # question kinds probed (None: all pretraining kinds)
    save_every_minutes: float = 10.0
    threads: int = 2
    seed: int = 0
    device: str = "cpu"  # torch device of the model and batches ("cuda" where one is lent; the CPU is the default)
    # Processes that draw and tokenize sequences beside the training loop (0: in the loop, one stream, the
    # released recipe's order). One CPU core draws ~270k tokens/s: enough for CPU training, not for a GPU.
    data_workers: int = 0
    # Attention supervision: weight of a loss that points heads of one layer, at the position predicting a
    # copied answer token (a box number, a read value, a span word), at that token's source in the prompt
    # (Encoded.attn_pairs). 0: off. A training signal only: the model's architecture is unchanged.
    attn_sup: float = 0.0
    attn_sup_layer: int = -1  # which decoder layer (negative: from the top)
    attn_sup_heads: int = 1  # how many of its heads (the first ones)
    # Copy readout: weight of a loss on what the supervised head (its first) writes from a pair's source
    # position, read out alone through lm_head, against the copied token (:func:`copy_readout_loss`). Needs
    # attn_sup > 0. 0: off.
    copy_readout: float = 0.0
    # Previous-word head: weight of a loss that points one head of an early layer, at every position, at the
    # nearest earlier token that is not whitespace (:func:`previous_word_targets`). With split spaces a word's
    # previous token is a space, so the copy head's keys carry no "which word came before" unless a head
    # brings it: the induction step of a span copy (after ``Peanut`` comes ``Noodles``, not another word after
    # a space) needs it. 0: off. A training signal only, like attn_sup.
    prev_sup: float = 0.0
    prev_sup_layer: int = 0  # which decoder layer
    prev_sup_head: int = 0  # which of its heads


@dataclass
class Profile:
    """The tiny profile: model shape, tokenizer, data and training settings."""

    model: TinyShape = field(default_factory=TinyShape)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    vocab_size: int = 4096
    spaces: str = "prefix"  # tokenizer: words keep their leading space ("prefix") or a space is its own token
    n_train_per_template: int | None = None  # train tasks per template for screens (None: all)
    explore: float = 0.5
    render: float = 0.1  # fraction of train states that keep a screenshot
    probe_per_template: int = 3  # test tasks per template for held-out screens
    states_seed: int = 0  # seeds the screens (train, held out: +1) and the tokenizer's sample; train.seed seeds the rest
    init: str | None = None  # start from this saved model (HF folder) instead of a random init (SFT runs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown key(s) in the tiny profile: {sorted(unknown)}")

        def sub(kind: type, key: str) -> Any:
            part = d.get(key) or {}
            fields = set(kind.__dataclass_fields__)
            bad = set(part) - fields
            if bad:
                raise ValueError(f"unknown key(s) {sorted(bad)} in '{key}:' of the tiny profile")
            return kind(**part)

        rest = {k: v for k, v in d.items() if k not in ("model", "data", "train")}
        return cls(model=sub(TinyShape, "model"), data=sub(DataConfig, "data"), train=sub(TrainConfig, "train"),
                   **rest)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_profile(path: Path | str, overrides: Sequence[str] = ()) -> Profile:
    """Read a profile YAML; ``overrides`` are ``section.key=value`` strings (YAML values)."""
    import yaml

    d = yaml.safe_load(Path(path).read_text()) or {}
    for o in overrides:
        key, _, val = o.partition("=")
        parts = key.split(".")
        cur = d
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = yaml.safe_load(val)
    return Profile.from_dict(d)


# --------------------------------------------------------------------------------------- batches


def collate(encs: Sequence[Encoded], pad_id: int, image_id: int):
    """Right-padded batch: ids (B, T), weights (B, T), and the model's extra inputs (image tensors), where
    ``extra["attn_pairs"]`` (N, 3: row, query, key) holds the attention-supervision targets."""
    import torch

    T = max(len(e.input_ids) for e in encs)
    ids = torch.full((len(encs), T), pad_id, dtype=torch.long)
    w = torch.zeros((len(encs), T), dtype=torch.float32)
    for b, e in enumerate(encs):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        w[b, :n] = torch.tensor(e.weights)
    images = [e for e in encs if e.pixel_values is not None]
    extra: dict[str, Any] = {}
    if images:
        extra["pixel_values"] = torch.cat([e.pixel_values for e in images])
        extra["image_grid_thw"] = torch.cat([e.image_grid_thw for e in images])
        extra["mm_token_type_ids"] = (ids == image_id).long()
    pairs = [(b, q, k) for b, e in enumerate(encs) for q, k in e.attn_pairs]
    extra["attn_pairs"] = torch.tensor(pairs, dtype=torch.long).reshape(-1, 3)
    return ids, w, extra


def length_bucketed(encs: Iterator[Encoded], batch_tokens: int, rng: random.Random, pool_batches: int = 8
                    ) -> Iterator[list[Encoded]]:
    """Batches of similar-length sequences whose padded size (B × max length) stays ≤ ``batch_tokens``.

    A pool of about ``pool_batches`` batches is drawn, sorted by length, cut, and served in random order:
    little padding, and the curriculum still advances (the pool is small).
    """
    while True:
        pool: list[Encoded] = []
        n = 0
        while n < pool_batches * batch_tokens:
            e = next(encs)
            pool.append(e)
            n += len(e.input_ids)
        pool.sort(key=lambda e: len(e.input_ids))
        out: list[list[Encoded]] = []
        cur: list[Encoded] = []
        for e in pool:
            if cur and (len(cur) + 1) * len(e.input_ids) > batch_tokens:
                out.append(cur)
                cur = []
            cur.append(e)
        if cur:
            out.append(cur)
        rng.shuffle(out)
        yield from out


_CAPTURE_ATTN = "mobilerl_sdpa_capture"


def _capturing_sdpa(module: Any, query: Any, key: Any, *args: Any, **kwargs: Any):
    """transformers' SDPA attention that also keeps the (post-RoPE) queries and keys of a module marked
    with a ``_mobilerl_capture`` dict, for :func:`attention_loss`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cap = getattr(module, "_mobilerl_capture", None)
    if cap is not None:
        cap["q"], cap["k"] = query, key
        cap["v"] = args[0] if args else kwargs.get("value")
    return sdpa_attention_forward(module, query, key, *args, **kwargs)


def text_decoder(model: Any) -> Any:
    """The text decoder of a Qwen2-VL (``model.model.language_model``) or of a plain Qwen2 LM (``model.model``)."""
    return getattr(model.model, "language_model", model.model)


def decoder_layers(model: Any) -> Any:
    return text_decoder(model).layers


def enable_attention_capture(model: Any, layer: int) -> dict[str, Any]:
    """Route the model's attention through :func:`_capturing_sdpa` and mark decoder ``layer``; returns the
    dict its queries and keys land in on every forward (the same dict when a layer is marked twice; other
    marked layers stay marked). Outputs are unchanged (it is SDPA)."""
    from transformers import AttentionInterface

    AttentionInterface.register(_CAPTURE_ATTN, _capturing_sdpa)
    model.set_attn_implementation(_CAPTURE_ATTN)
    attn = decoder_layers(model)[layer].self_attn
    if getattr(attn, "_mobilerl_capture", None) is None:
        attn._mobilerl_capture = {}
    return attn._mobilerl_capture


def disable_attention_capture(model: Any) -> None:
    for m in decoder_layers(model):
        m.self_attn._mobilerl_capture = None
    model.set_attn_implementation("sdpa")


def attention_loss(q: Any, k: Any, pairs: Any, heads: int, scaling: float) -> tuple[Any, float]:
    """Mean NLL of the attention of ``heads`` heads at each pair's query position on its key position.

    ``q``, ``k``: (B, H, T, D) post-RoPE (no grouped-query attention); ``pairs``: (N, 3) row, query, key.
    Returns (loss, share of (pair, head) whose top-attended position is the key)."""
    import torch

    losses, hits, n = [], 0, 0
    for b in pairs[:, 0].unique().tolist():
        sel = pairs[pairs[:, 0] == b]
        qp, kp = sel[:, 1], sel[:, 2]
        scores = torch.einsum("hnd,htd->hnt", q[b, :heads, qp], k[b, :heads]) * scaling  # (h, n, T)
        future = torch.arange(k.shape[2], device=k.device).unsqueeze(0) > qp.unsqueeze(1)  # (n, T): causal
        scores = scores.masked_fill(future.unsqueeze(0), float("-inf"))
        logp = scores.log_softmax(-1)
        idx = kp.view(1, -1, 1).expand(scores.shape[0], -1, 1)
        losses.append(-logp.gather(-1, idx).squeeze(-1).reshape(-1))
        with torch.no_grad():
            hits += int((scores.argmax(-1) == kp.unsqueeze(0)).sum())
            n += scores.shape[0] * scores.shape[1]
    return torch.cat(losses).mean(), hits / max(n, 1)


def copy_readout_loss(model: Any, layer: int, v: Any, pairs: Any, ids: Any, head: int = 0) -> tuple[Any, float]:
    """Mean CE of what head ``head`` of decoder ``layer`` writes when it attends a pair's key, read out alone
    (its value there through the head's slice of ``o_proj``, the final norm and ``lm_head``), against the token
    the pair's query predicts (the copied token). Attention supervision teaches the head *where* to look; this
    teaches its value-output path to carry *what* is there into the answer. Returns (loss, top-1 share)."""
    import torch.nn.functional as F

    attn = decoder_layers(model)[layer].self_attn
    d = v.shape[-1]
    w_o = attn.o_proj.weight[:, head * d:(head + 1) * d]  # (hidden, d)
    vals = v[pairs[:, 0], head, pairs[:, 2]]  # (N, d)
    logits = model.lm_head(text_decoder(model).norm(vals @ w_o.T))
    target = ids[pairs[:, 0], pairs[:, 1] + 1]
    acc = float((logits.argmax(-1) == target).float().mean()) if len(target) else 0.0
    return F.cross_entropy(logits, target), acc


def previous_word_targets(ids: Any, blank: Any, pad_id: int) -> Any:
    """(B, T) position of the nearest earlier token that is not whitespace (``blank[id]`` False), -1 where
    there is none and at padding. ``blank``: (vocab,) bool."""
    import torch

    T = ids.shape[1]
    pos = torch.arange(T, device=ids.device).expand_as(ids)
    word = ~blank[ids] & (ids != pad_id)
    last = torch.where(word, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # nearest word at or before t
    prev = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)  # ... strictly before t
    return prev.masked_fill(ids == pad_id, -1)


def previous_word_loss(q: Any, k: Any, targets: Any, head: int, scaling: float) -> tuple[Any, float]:
    """Mean NLL of head ``head``'s causal attention on each position's :func:`previous_word_targets`;
    returns (loss, share of positions whose top-attended position is the target)."""
    import torch

    qh, kh = q[:, head], k[:, head]  # (B, T, D)
    scores = torch.einsum("btd,bsd->bts", qh, kh) * scaling
    T = scores.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    logp = scores.masked_fill(future, float("-inf")).log_softmax(-1)
    valid = targets >= 0
    picked = logp.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)[valid]
    with torch.no_grad():
        acc = float((logp.argmax(-1)[valid] == targets[valid]).float().mean()) if valid.any() else 0.0
    return -picked.mean(), acc


def blank_token_table(tokenizer: Any) -> Any:
    """(vocab,) bool: which token ids decode to whitespace only (a split space, a newline)."""
    import torch

    texts = (tokenizer.decode([i]) for i in range(len(tokenizer)))
    return torch.tensor([bool(t) and not t.strip() for t in texts])


def loss_fn(model: Any, ids, w, extra: dict[str, Any], attn: dict[str, Any] | None = None):
    """Weighted next-token CE over positions with weight > 0; returns (loss, answer stats).

    ``attn``: attention supervision, ``{"capture": dict from enable_attention_capture, "weight": float,
    "heads": int}``; adds ``weight`` × :func:`attention_loss` over ``extra["attn_pairs"]``. With a ``"prev"``
    entry, ``{"capture", "weight", "head", "blank", "pad"}``, also ``weight`` × :func:`previous_word_loss`."""
    import torch
    import torch.nn.functional as F

    dev = model.device
    ids, w = ids.to(dev), w.to(dev)
    extra = {k: v.to(dev) for k, v in extra.items()}
    pairs = extra.pop("attn_pairs", None)
    # Right padding needs no attention mask under causal attention: no real token attends a pad.
    hidden = model.model(input_ids=ids, use_cache=False, **extra).last_hidden_state  # (B, T, H)
    tw = w[:, 1:]  # weight of predicting token t+1 from position t
    sel = tw > 0
    logits = model.lm_head(hidden[:, :-1][sel])  # (N, V)
    target = ids[:, 1:][sel]
    ce = F.cross_entropy(logits, target, reduction="none")
    ww = tw[sel]
    loss = (ce * ww).sum() / ww.sum().clamp_min(1e-6)
    with torch.no_grad():
        ans = ww >= 1.0
        stats = {
            "answer_loss": float(ce[ans].mean()) if ans.any() else float("nan"),
            "answer_acc": float((logits[ans].argmax(-1) == target[ans]).float().mean()) if ans.any() else 0.0,
            "answer_tokens": int(ans.sum()),
            "weighted_tokens": int(sel.sum()),
        }
    if attn is not None and "capture" in attn and pairs is not None and len(pairs):
        cap = attn["capture"]
        head_dim = cap["q"].shape[-1]
        a_loss, a_acc = attention_loss(cap["q"], cap["k"], pairs, attn["heads"], head_dim ** -0.5)
        loss = loss + attn["weight"] * a_loss
        stats.update({"attn_loss": a_loss.item(), "attn_acc": a_acc, "attn_pairs": int(len(pairs))})
        if attn.get("readout", 0) > 0:
            r_loss, r_acc = copy_readout_loss(model, attn["layer"], cap["v"], pairs, ids)
            loss = loss + attn["readout"] * r_loss
            stats.update({"readout_loss": r_loss.item(), "readout_acc": r_acc})
    prev = (attn or {}).get("prev")
    if prev is not None:
        cap = prev["capture"]
        targets = previous_word_targets(ids, prev["blank"].to(dev), prev["pad"])
        p_loss, p_acc = previous_word_loss(cap["q"], cap["k"], targets, prev["head"], cap["q"].shape[-1] ** -0.5)
        loss = loss + prev["weight"] * p_loss
        stats.update({"prev_loss": p_loss.item(), "prev_acc": p_acc})
    return loss, stats


def encoded_stream(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, attn_pairs: bool,
                   progress: Any = None) -> Generator[Encoded, None, None]:
    """Endless tokenized training sequences (those with at least one answer left after the cut)."""
    for x in stream_examples(states, dcfg, seed=seed, progress=progress):
        e = encode(x, processor, dcfg, attn_pairs=attn_pairs)
        if e.answer_spans:
            yield e


def _worker(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, attn_pairs: bool,
            shared: Any, queue: Any) -> None:
    import torch

    torch.set_num_threads(1)
    for e in encoded_stream(states, dcfg, processor, seed, attn_pairs, lambda: shared.value):
        queue.put(e)


def shared_progress(value: float = 0.0) -> Any:
    """The training progress (0-1) as a double in shared memory (``.value``): the loop sets it, the data
    stream reads it (the curriculum, ``data.act_pack_from``), in this process or in forked data workers."""
    import multiprocessing as mp

    return mp.get_context("fork").Value("d", value, lock=False)


def worker_stream(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, workers: int,
                  attn_pairs: bool, progress: Any) -> Generator[Encoded, None, None]:
    """:func:`encoded_stream` drawn by ``workers`` forked processes (seeds ``seed + i``), interleaved as
    they come; ``progress`` is a :func:`shared_progress` the loop updates. Fork start: the states are
    inherited, not pickled."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue(maxsize=64 * workers)
    procs = [ctx.Process(target=_worker, args=(states, dcfg, processor, seed + i, attn_pairs, progress, queue),
                         daemon=True) for i in range(workers)]
    for p in procs:
        p.start()  # now, not at the first batch

    def drain() -> Generator[Encoded, None, None]:
        import queue as queue_mod

        try:
            while True:
                try:
                    yield queue.get(timeout=5)
                except queue_mod.Empty:
                    dead = [p.exitcode for p in procs if not p.is_alive()]
                    if dead:  # its traceback went to stderr
                        raise RuntimeError(f"pretraining data worker(s) exited with code(s) {dead}") from None
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.join(timeout=5)

    return drain()


def lr_at(step: int, cfg: TrainConfig, minutes: float = 0.0) -> float:
    """Linear warm-up, then cosine decay over whichever runs out first: ``max_steps`` or ``max_minutes``
    (a run stopped by the clock still ends at the low learning rate)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    if cfg.max_minutes > 0:
        t = max(t, minutes / cfg.max_minutes)
    t = min(1.0, t)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


# ------------------------------------------------------------------------------------------ run


def prepare_states(profile: Profile, log: Any = print) -> tuple[list[ScreenState], list[ScreenState]]:
    from mobilerl.models.pretrain_data import collect_states
    from mobilerl.models.probe import held_out_states

    t0 = time.time()
    train = collect_states(split="train", n_per_template=profile.n_train_per_template,
                           explore=profile.explore, seed=profile.states_seed, render=profile.render,
                           workers=profile.train.threads)
    log(f"collected {len(train)} train-split screens in {time.time() - t0:.0f}s")
    t0 = time.time()
    test = held_out_states(n_per_template=profile.probe_per_template, seed=profile.states_seed + 1,
                           workers=profile.train.threads)
    n_all = len(test)
    test = held_out_only(test, train)
    log(f"collected {len(test)} held-out test-split screens in {time.time() - t0:.0f}s "
        f"({n_all - len(test)} identical to a train screen dropped)")
    return train, test


def held_out_only(test: Sequence[ScreenState], train: Sequence[ScreenState]) -> list[ScreenState]:
    """``test`` less any screen identical to a ``train`` one (a screen trained on is not held out)."""
    seen = {s.nodes for s in train}
    return [s for s in test if s.nodes not in seen]


def load_state_cache(folder: Path | str) -> tuple[list[ScreenState], list[ScreenState]]:
    """A run's screen cache (``--states``: ``train.jsonl.gz``, ``test.jsonl.gz``) as
    :func:`prepare_states` returns the screens: train, and held-out ones not among them."""
    train = load_states(Path(folder) / "train.jsonl.gz")
    return train, held_out_only(load_states(Path(folder) / "test.jsonl.gz"), train)


TOKENIZER_STATES = 12000  # screens sampled for the tokenizer corpus (all labels recur; minutes → seconds)


def make_tokenizer(profile: Profile, train_states: Sequence[ScreenState]):
    from mobilerl.models.pretrain_data import corpus_texts
    from mobilerl.models.tokenizer import train_tokenizer

    rng = random.Random(profile.states_seed)
    sample = list(train_states)
    if len(sample) > TOKENIZER_STATES:
        sample = rng.sample(sample, TOKENIZER_STATES)
    return train_tokenizer(corpus_texts(sample, rng), profile.vocab_size, spaces=profile.spaces)


def pretrain(
    profile: Profile,
    work: Path | str,
    train_states: Sequence[ScreenState],
    test_states: Sequence[ScreenState],
    tokenizer: Any = None,
    log: Any = print,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train (or resume) in ``work``; returns (model, processor, summary). See the module docstring."""
    import torch

    from mobilerl.models import tiny
    from mobilerl.models.probe import build_items, score_teacher_forced
    from mobilerl.models.tokenizer import wrap

    tiny.offline()
    cfg, dcfg = profile.train, profile.data
    torch.set_num_threads(cfg.threads)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path = work / "last.pt"
    state: dict[str, Any] | None = None
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False, map_location="cpu")
        from tokenizers import Tokenizer

        tokenizer = wrap(Tokenizer.from_str(state["tokenizer"]))
        log(f"resuming from {ckpt_path} at step {state['step']}")
    elif profile.init:
        _, init_proc = tiny.load(profile.init)
        tokenizer = init_proc.tokenizer
    elif tokenizer is None:
        tokenizer = make_tokenizer(profile, train_states)
    processor = tiny.build_processor(tokenizer)
    if profile.init and state is None:
        model, _ = tiny.load(profile.init)
        log(f"initialised from {profile.init}")
    else:
        model = tiny.build_model(profile.model, tokenizer, seed=cfg.seed)
    # The data stream starts before the model moves to its device: workers fork from a process with no CUDA.
    step0 = state["step"] if state is not None else 0
    progress = shared_progress(step0 / max(1, cfg.max_steps))
    seed = cfg.seed * 1_000_003 + step0
    if cfg.data_workers > 0:
        encoded = worker_stream(train_states, dcfg, processor, seed, cfg.data_workers, cfg.attn_sup > 0, progress)
    else:
        encoded = encoded_stream(train_states, dcfg, processor, seed, cfg.attn_sup > 0, lambda: progress.value)
    batches = length_bucketed(encoded, cfg.batch_tokens, random.Random(cfg.seed + step0))
    model.to(cfg.device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, cfg.beta2), eps=1e-8,
    )
    step, tokens, minutes_before = 0, 0, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, tokens, minutes_before = state["step"], state["tokens"], state["minutes"]
    probe_items = build_items(test_states, dcfg, n_per_kind=cfg.probe_items, seed=cfg.seed,
                              kinds=tuple(cfg.probe_kinds or KINDS))
    win_items = (build_items(test_states, dcfg, n_per_kind=cfg.probe_items, seed=cfg.seed + 1,
                             kinds=("ground", "read"), max_lines=cfg.probe_window) if cfg.probe_window else [])
    log(f"model: {tiny.n_params(model) / 1e6:.2f}M params ({tiny.n_params(model, True) / 1e6:.2f}M text), "
        f"vocab {len(tokenizer)}; probe items {len(probe_items)}")

    ids_special = tiny.special_ids(tokenizer)
    curve = (work / "curve.jsonl").open("a")
    t_start = time.time()
    t_save = time.time()
    window: list[float] = []
    win_tokens = 0
    t_win = time.time()

    def minutes() -> float:
        return minutes_before + (time.time() - t_start) / 60

    def write(row: dict[str, Any]) -> None:
        curve.write(json.dumps(row) + "\n")
        curve.flush()

    def save_ckpt() -> None:
        tmp = work / "last.pt.tmp"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "tokens": tokens,
                    "minutes": minutes(), "tokenizer": tokenizer.backend_tokenizer.to_str(),
                    "profile": profile.to_dict()}, tmp)
        tmp.replace(ckpt_path)

    def run_probe() -> dict[str, float]:
        acc = score_teacher_forced(model, processor, probe_items, dcfg)
        if win_items:
            win = score_teacher_forced(model, processor, win_items, dcfg)
            acc.update({f"win_{k}": v for k, v in win.items() if not k.startswith("n_")})
        model.train()
        # Nested: a question kind is called "type", which a flat row would write over the row's own "type".
        row = {"type": "probe", "step": step, "minutes": round(minutes(), 2), "tokens": tokens,
               "accuracy": {k: v for k, v in acc.items() if not k.startswith("n_")},
               "items": {k[2:]: v for k, v in acc.items() if k.startswith("n_")}}
        write(row)
        log("probe " + " ".join(f"{k}={v:.3f}" for k, v in acc.items() if not k.startswith("n_")))
        return acc

    attn: dict[str, Any] | None = None
    if cfg.attn_sup > 0:
        attn = {"capture": enable_attention_capture(model, cfg.attn_sup_layer), "weight": cfg.attn_sup,
                "heads": cfg.attn_sup_heads, "layer": cfg.attn_sup_layer, "readout": cfg.copy_readout}
        log(f"attention supervision: weight {cfg.attn_sup}, layer {cfg.attn_sup_layer}, {cfg.attn_sup_heads} head(s)"
            + (f", copy readout {cfg.copy_readout}" if cfg.copy_readout else ""))
    if cfg.prev_sup > 0:
        attn = attn or {}
        attn["prev"] = {"capture": enable_attention_capture(model, cfg.prev_sup_layer), "weight": cfg.prev_sup,
                        "head": cfg.prev_sup_head, "blank": blank_token_table(tokenizer), "pad": ids_special["pad"]}
        log(f"previous-word head: weight {cfg.prev_sup}, layer {cfg.prev_sup_layer}, head {cfg.prev_sup_head}")
    model.train()
    last_probe: dict[str, float] = {}
    last = min(cfg.max_steps, cfg.stop_step or cfg.max_steps)
    while step < last and minutes() < cfg.max_minutes:
        encs = next(batches)
        ids, w, extra = collate(encs, ids_special["pad"], ids_special["image"])
        lr = lr_at(step, cfg, minutes())
        for g in opt.param_groups:
            g["lr"] = lr
        loss, stats = loss_fn(model, ids, w, extra, attn)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += int(ids.numel())
        win_tokens += int(ids.numel())
        progress.value = step / cfg.max_steps
        window.append(loss.item())
        if step % cfg.log_every == 0:
            dt = time.time() - t_win
            row = {"type": "train", "step": step, "minutes": round(minutes(), 2), "tokens": tokens,
                   "loss": sum(window) / len(window), "lr": lr, "grad_norm": float(gnorm),
                   "tok_per_s": win_tokens / max(dt, 1e-6), "seq_len": int(ids.shape[1]),
                   "batch": int(ids.shape[0]), "supervised_frac": stats["weighted_tokens"] / ids.numel(),
                   "answer_frac": stats["answer_tokens"] / ids.numel(), **stats}
            write(row)
            log(f"step {step} {row['minutes']:.1f}min loss {row['loss']:.3f} ans_loss {stats['answer_loss']:.3f} "
                f"ans_acc {stats['answer_acc']:.3f} {row['tok_per_s']:.0f} tok/s T={ids.shape[1]} B={ids.shape[0]}"
                + (f" attn_loss {stats['attn_loss']:.3f} attn_acc {stats['attn_acc']:.3f}" if "attn_loss" in stats else "")
                + (f" prev_acc {stats['prev_acc']:.3f}" if "prev_acc" in stats else "")
                + (f" readout_acc {stats['readout_acc']:.3f}" if "readout_acc" in stats else ""))
            window, win_tokens, t_win = [], 0, time.time()
        if step % cfg.probe_every == 0:
            last_probe = run_probe()
        if time.time() - t_save > cfg.save_every_minutes * 60:
            save_ckpt()
            t_save = time.time()
    save_ckpt()
    if not last_probe or step % cfg.probe_every:
        last_probe = run_probe()
    curve.close()
    encoded.close()  # ends the data workers, if any
    model.to("cpu")
    if attn is not None:
        disable_attention_capture(model)
    model.eval()
    summary = {"steps": step, "tokens": tokens, "minutes": round(minutes(), 2), "probe_teacher_forced": last_probe,
               "params": tiny.n_params(model), "text_params": tiny.n_params(model, True)}
    return model, processor, summary


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m mobilerl.models.pretrain PROFILE WORK [--set k=v ...] [--states DIR] [--out DIR]``
    (experiments; the pipeline's entry point is ``python -m stages.pretrain``)."""
    import argparse

    from mobilerl.models import tiny
    from mobilerl.models.pretrain_data import save_states

    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("work")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--states", default=None, help="cache folder for collected screens (reused if present)")
    ap.add_argument("--out", default=None, help="save the final model here (HF format)")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile, args.overrides)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "profile.json").write_text(json.dumps(profile.to_dict(), indent=1))
    logf = (work / "log.txt").open("a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if args.states and (Path(args.states) / "train.jsonl.gz").exists():
        train, test = load_state_cache(args.states)
        log(f"loaded {len(train)} train / {len(test)} held-out screens from {args.states}")
    else:
        train, test = prepare_states(profile, log)
        if args.states:
            save_states(train, Path(args.states) / "train.jsonl.gz")
            save_states(test, Path(args.states) / "test.jsonl.gz")
    tok = None
    tok_name = f"tokenizer_{profile.vocab_size}" + ("" if profile.spaces == "prefix" else f"_{profile.spaces}")
    tok_path = Path(args.states) / f"{tok_name}.json" if args.states else None
    if tok_path is not None and tok_path.exists():
        from tokenizers import Tokenizer

        from mobilerl.models.tokenizer import wrap

        tok = wrap(Tokenizer.from_file(str(tok_path)))
    elif tok_path is not None:
        tok = make_tokenizer(profile, train)
        tok.backend_tokenizer.save(str(tok_path))
    model, processor, summary = pretrain(profile, work, train, test, tokenizer=tok, log=log)
    log(json.dumps(summary))
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.out:
        tiny.save(model, processor, args.out, extra={"profile": profile.to_dict(), "summary": summary})


if __name__ == "__main__":
    main()
