"""One pretraining run of the tiny base: screens → tokenizer → model → training loop → held-out probe.

Collect train-split screens (:mod:`mobilerl.tinybase.screens`), train the tokenizer on them, build the tiny
Qwen2-VL model, train it on screen-reading sequences (:mod:`mobilerl.tinybase.data`) with AdamW, linear
warm-up and a cosine decay that follows the clock as well as the steps, and the loss of
:mod:`mobilerl.tinybase.losses`. A run checkpoints itself (``<work>/last.pt``: weights, optimizer, step,
tokenizer) every ``save_every_minutes`` and resumes from there when started again with the same ``work``.

Curves (``<work>/curve.jsonl``, one JSON object a line): ``train`` rows (loss, answer-token accuracy, tokens/s,
learning rate) every ``log_every`` steps and ``probe`` rows (held-out exact-answer accuracy per question kind,
teacher-forced, under ``accuracy``; item counts under ``items``) every ``probe_every`` steps.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from mobilerl.tinybase import screens
from mobilerl.tinybase.data import Encoded, encode, stream_examples
from mobilerl.tinybase.losses import disable_attention_capture, enable_attention_capture, loss_fn
from mobilerl.tinybase.recipe import KINDS, DataConfig, Recipe, TrainConfig, load_recipe
from mobilerl.tinybase.screens import ScreenState

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
    little padding, and a small pool keeps the stream's order roughly.
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


def encoded_stream(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, attn_pairs: bool
                   ) -> Generator[Encoded, None, None]:
    """Endless tokenized training sequences (those with at least one answer left after the cut)."""
    for x in stream_examples(states, dcfg, seed=seed):
        e = encode(x, processor, dcfg, attn_pairs=attn_pairs)
        if e.answer_spans:
            yield e


def _worker(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, attn_pairs: bool,
            queue: Any) -> None:
    import torch

    torch.set_num_threads(1)
    for e in encoded_stream(states, dcfg, processor, seed, attn_pairs):
        queue.put(e)


def worker_stream(states: Sequence[ScreenState], dcfg: DataConfig, processor: Any, seed: int, workers: int,
                  attn_pairs: bool) -> Generator[Encoded, None, None]:
    """:func:`encoded_stream` drawn by ``workers`` forked processes (seeds ``seed + i``), interleaved as
    they come (a GPU needs 2+; one CPU core draws ~270k tokens/s). Fork start: the states are inherited,
    not pickled."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue(maxsize=64 * workers)
    procs = [ctx.Process(target=_worker, args=(states, dcfg, processor, seed + i, attn_pairs, queue),
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


def prepare_states(recipe: Recipe, log: Any = print) -> tuple[list[ScreenState], list[ScreenState]]:
    """The recipe's train-split screens, and its held-out test-split screens not among them."""
    t0 = time.time()
    train = screens.collect_states(split="train", n_per_template=recipe.n_train_per_template,
                                   explore=recipe.explore, seed=recipe.states_seed, render=recipe.render,
                                   workers=recipe.train.threads)
    log(f"collected {len(train)} train-split screens in {time.time() - t0:.0f}s")
    t0 = time.time()
    test = screens.held_out_states(n_per_template=recipe.probe_per_template, seed=recipe.states_seed + 1,
                                   workers=recipe.train.threads)
    n_all = len(test)
    test = screens.held_out_only(test, train)
    log(f"collected {len(test)} held-out test-split screens in {time.time() - t0:.0f}s "
        f"({n_all - len(test)} identical to a train screen dropped)")
    return train, test


TOKENIZER_STATES = 12000  # screens sampled for the tokenizer corpus (all labels recur; minutes → seconds)


def make_tokenizer(recipe: Recipe, train_states: Sequence[ScreenState]):
    from mobilerl.models.tokenizer import train_tokenizer
    from mobilerl.tinybase.data import corpus_texts

    rng = random.Random(recipe.states_seed)
    sample = list(train_states)
    if len(sample) > TOKENIZER_STATES:
        sample = rng.sample(sample, TOKENIZER_STATES)
    return train_tokenizer(corpus_texts(sample, rng), recipe.vocab_size, spaces=recipe.spaces)


def pretrain(
    recipe: Recipe,
    work: Path | str,
    train_states: Sequence[ScreenState],
    test_states: Sequence[ScreenState],
    tokenizer: Any = None,
    log: Any = print,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train (or resume) in ``work``; returns (model, processor, summary). See the module docstring."""
    import torch

    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import wrap
    from mobilerl.tinybase.probe import build_items, score_teacher_forced

    tiny.offline()
    cfg, dcfg = recipe.train, recipe.data
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
    elif tokenizer is None:
        tokenizer = make_tokenizer(recipe, train_states)
    processor = tiny.build_processor(tokenizer)
    model = tiny.build_model(recipe.model.tiny_shape(), tokenizer, seed=cfg.seed)
    # The data stream starts before the model moves to its device: workers fork from a process with no CUDA.
    step0 = state["step"] if state is not None else 0
    seed = cfg.seed * 1_000_003 + step0
    attn_pairs = cfg.attn_sup > 0
    if cfg.data_workers > 0:
        encoded = worker_stream(train_states, dcfg, processor, seed, cfg.data_workers, attn_pairs)
    else:
        encoded = encoded_stream(train_states, dcfg, processor, seed, attn_pairs)
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
                    "profile": recipe.to_dict()}, tmp)
        tmp.replace(ckpt_path)

    def run_probe() -> dict[str, float]:
        acc = score_teacher_forced(model, processor, probe_items, dcfg)
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
    model.train()
    last_probe: dict[str, float] = {}
    while step < cfg.max_steps and minutes() < cfg.max_minutes:
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
    """``python -m mobilerl.tinybase.train RECIPE WORK [--set k=v ...] [--states DIR] [--out DIR]``
    (experiments; the pipeline's entry point is ``python -m stages.pretrain``)."""
    import argparse

    from mobilerl.models import tiny

    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("work")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--states", default=None, help="cache folder for collected screens (reused if present)")
    ap.add_argument("--out", default=None, help="save the final model here (HF format)")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "profile.json").write_text(json.dumps(recipe.to_dict(), indent=1))
    logf = (work / "log.txt").open("a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if args.states and (Path(args.states) / "train.jsonl.gz").exists():
        train, test = screens.load_state_cache(args.states)
        log(f"loaded {len(train)} train / {len(test)} held-out screens from {args.states}")
    else:
        train, test = prepare_states(recipe, log)
        if args.states:
            screens.save_states(train, Path(args.states) / "train.jsonl.gz")
            screens.save_states(test, Path(args.states) / "test.jsonl.gz")
    tok = None
    tok_name = f"tokenizer_{recipe.vocab_size}" + ("" if recipe.spaces == "prefix" else f"_{recipe.spaces}")
    tok_path = Path(args.states) / f"{tok_name}.json" if args.states else None
    if tok_path is not None and tok_path.exists():
        from tokenizers import Tokenizer

        from mobilerl.models.tokenizer import wrap

        tok = wrap(Tokenizer.from_file(str(tok_path)))
    elif tok_path is not None:
        tok = make_tokenizer(recipe, train)
        tok.backend_tokenizer.save(str(tok_path))
    model, processor, summary = pretrain(recipe, work, train, test, tokenizer=tok, log=log)
    log(json.dumps(summary))
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.out:
        tiny.save(model, processor, args.out, extra={"profile": recipe.to_dict(), "summary": summary})


if __name__ == "__main__":
    main()
