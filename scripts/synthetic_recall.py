"""Does a model of the tiny base's shape learn to copy and to look things up, in isolation, on this CPU?

    .venv/bin/python scripts/synthetic_recall.py repeat --minutes 5    # BOS span SEP span: position suffices
    .venv/bin/python scripts/synthetic_recall.py recall --minutes 10   # key -> span pairs: lookup by content

The pretraining's span-copy question needs a content-addressed lookup (find the cue, copy what follows). This
tests that skill apart from the screens: random token ids, a Qwen2 decoder of the tiny base's shape, AdamW. It
prints the teacher-forced accuracy of the supervised tokens every 25 steps and stops at 98 % or after
``--minutes``. Measured figures: experiments/tiny_base/HISTORY.md.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mobilerl.tinybase.losses import attention_loss, copy_readout_loss, enable_attention_capture

BOS, SEP, DOT, QUERY, EQ, PAD, FIRST = 1, 2, 3, 4, 5, 0, 8  # ids below FIRST are structure tokens


def repeat_batch(rng: random.Random, args: argparse.Namespace) -> tuple[list[list[int]], list[list[int]]]:
    xs, labels = [], []
    for _ in range(args.batch):
        span = [rng.randrange(FIRST, FIRST + args.vocab) for _ in range(args.span)]
        xs.append([BOS, *span, SEP, *span])
        labels.append([-100] * (args.span + 2) + span)
    return xs, labels


def recall_batch(rng: random.Random, args: argparse.Namespace) -> tuple[list[list[int]], list[list[int]]]:
    xs, labels, args.pairs = [], [], []
    for b in range(args.batch):
        keys = rng.sample(range(FIRST, FIRST + args.vocab), 8)
        spans = [[rng.randrange(FIRST, FIRST + args.vocab) for _ in range(rng.randint(3, 6))] for _ in keys]
        x, where = [BOS], []
        for k, s in zip(keys, spans, strict=True):
            where.append(len(x) + 1)  # the span's first token
            x += [k, *s, DOT]
        x += [rng.randrange(FIRST, FIRST + args.vocab) for _ in range(args.filler)]
        y = [-100] * len(x)
        for j in rng.sample(range(8), 4):
            question = [QUERY, keys[j]] + [EQ] * args.gap
            # attention-supervision pairs (row, query, key): the position predicting each answer token -> its source
            first = len(x) + len(question)
            args.pairs += [(b, first + i - 1, where[j] + i) for i in range(len(spans[j]))]
            x += question + spans[j] + [DOT]
            y += [-100] * len(question) + spans[j] + [DOT]
        xs.append(x)
        labels.append(y)
    return xs, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", choices=["repeat", "recall"])
    ap.add_argument("--vocab", type=int, default=4096, help="random token ids (the base's vocabulary: 4096)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--span", type=int, default=48, help="repeat: span length")
    ap.add_argument("--filler", type=int, default=0, help="recall: random tokens between the pairs and the questions")
    ap.add_argument("--gap", type=int, default=1, help="recall: tokens between the key and the answer (0 or 1)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-sup", type=float, default=0.0,
                    help="recall: weight of the pretraining's attention supervision (last layer, head 0, answer -> source)")
    ap.add_argument("--readout", type=float, default=0.0,
                    help="recall, with --attn-sup: weight of the copy-readout loss (train.copy_readout)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = Qwen2Config(vocab_size=FIRST + args.vocab, hidden_size=128, intermediate_size=384,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                      tie_word_embeddings=True, rope_theta=10000.0, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    make = repeat_batch if args.task == "repeat" else recall_batch
    cap_attn = enable_attention_capture(model, -1) if args.attn_sup > 0 else None
    scaling = (cfg.hidden_size // cfg.num_attention_heads) ** -0.5
    t0, tokens, step = time.time(), 0, 0
    while True:
        step += 1
        xs, ys = make(rng, args)
        n = max(map(len, xs))
        x = torch.tensor([a + [PAD] * (n - len(a)) for a in xs])
        y = torch.tensor([a + [-100] * (n - len(a)) for a in ys])
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, step / 50)
        out = model(input_ids=x, labels=y)
        loss, extra = out.loss, ""
        if cap_attn is not None:
            pairs = torch.tensor(args.pairs)
            a_loss, a_acc = attention_loss(cap_attn["q"], cap_attn["k"], pairs, 1, scaling)
            loss = loss + args.attn_sup * a_loss
            extra += f" attn_acc {a_acc:.2f}"
            if args.readout > 0:
                r_loss, r_acc = copy_readout_loss(model, -1, cap_attn["v"], pairs, x)
                loss = loss + args.readout * r_loss
                extra += f" readout_acc {r_acc:.2f}"
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        tokens += x.numel()
        if step % 25 == 0:
            with torch.no_grad():
                pred, target = out.logits[:, :-1].argmax(-1), y[:, 1:]
                keep = target != -100
                acc = (pred[keep] == target[keep]).float().mean().item()
            minutes = (time.time() - t0) / 60
            print(f"step {step} {minutes:.1f} min {tokens / 1e6:.2f}M tokens loss {out.loss.item():.3f} "
                  f"token acc {acc:.3f}{extra}", flush=True)
            if acc > 0.98 or minutes > args.minutes:
                break


if __name__ == "__main__":
    main()
