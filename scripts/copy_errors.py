"""Where does a base's copy head look when a span copy goes wrong?

    .venv/bin/python scripts/copy_errors.py --model models/tiny-base --states STATES [--split train]

For each span-copy item of the release probe (the same 200 items, ``scripts/probe_tiny_base.py``), the answer is
teacher-forced up to its first wrong token (greedy decoding agrees with teacher forcing up to that token), and
the attention of the supervised copy head (head 0 of the last layer, ``train.attn_sup``) at the position that
predicts it is compared with where the token is in the instruction:

- ``head on the source, wrong token out``: the head looks at the right token; what it writes does not win
  (a readout error);
- ``head elsewhere (the token there)``: it looks at another place and the output is the token there (a lookup
  error: ``monthly_budget.md`` → ``monthly_plan.md``);
- ``head elsewhere (not the output)``, ``span not in the prompt``.

It prints the counts and a few examples (target token → output token) per kind.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-base"))
    ap.add_argument("--states", type=Path, required=True, help="a pretraining run's screen cache")
    ap.add_argument("--split", choices=("test", "train"), default="test")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from mobilerl.models import tiny
    from mobilerl.tinybase.data import encode
    from mobilerl.tinybase.losses import enable_attention_capture
    from mobilerl.tinybase.probe import release_items
    from mobilerl.tinybase.recipe import Recipe
    from mobilerl.tinybase.screens import load_state_cache

    torch.set_num_threads(args.threads)
    model, proc = tiny.load(args.model)
    model.eval()
    tok = proc.tokenizer
    recipe = Recipe.from_record(json.loads((Path(args.model) / "tiny.json").read_text())["profile"])
    train, test = load_state_cache(args.states)
    states = test if args.split == "test" else train
    items = [it for it in release_items(states, recipe.data, n_per_kind=args.items, seed=args.seed)
             if it.kind == "copy"]
    cap = enable_attention_capture(model, -1)
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    for it in items:
        e = encode(it.example, proc, recipe.data, max_len=4096)
        ids = torch.tensor([e.input_ids])
        with torch.no_grad():
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
        s, t, _ = e.answer_spans[0]
        pred = model.lm_head(hidden[s - 1 : t - 1]).argmax(-1)
        wrong = (pred != ids[0, s:t]).nonzero()
        if not len(wrong):
            counts["right"] += 1
            continue
        j = s + int(wrong[0])  # the first wrong token, predicted at position j - 1
        ans = ids[0, s:t].tolist()
        at = next(i for i in range(len(ans) + 1) if tok.decode(ans[:i]).endswith('text="'))
        span = ans[at:]
        end = next((i for i, x in enumerate(span) if tok.decode([x]).startswith('"')), len(span))
        span = span[:end]
        prompt = ids[0, :s].tolist()
        src = next((i for i in range(len(prompt) - len(span) + 1) if prompt[i : i + len(span)] == span), None)
        want, got = tok.decode([int(ids[0, j])]), tok.decode([int(pred[j - s])])
        m = j - (s + at)  # the wrong token's place in the span (len(span): the span's end)
        if src is None or not 0 <= m <= len(span):
            kind = "span not in the prompt"
        else:
            top = int((cap["q"][0, 0, j - 1] @ cap["k"][0, 0, :j].T).argmax())
            if top == src + m:
                kind = "head on the source, wrong token out"
            elif tok.decode([int(ids[0, top])]) == got:
                kind = "head elsewhere (the token there)"
            else:
                kind = "head elsewhere (not the output)"
        counts[kind] += 1
        examples[kind].append(f"{want!r}->{got!r}")
    print(f"{args.model}, {args.split} split, {len(items)} span-copy items")
    for kind, n in counts.most_common():
        print(f"  {n:4d}  {kind}  {' '.join(examples[kind][:10])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
