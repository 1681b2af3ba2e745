"""The tiny base model: factory, tokenizer, its recipe (mobilerl.tinybase), training loop, the committed checkpoint."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from mobilerl.env.actions import Action, format_action, parse_action  # noqa: E402
from mobilerl.models import tiny  # noqa: E402
from mobilerl.models.tokenizer import single_token_numbers, train_tokenizer  # noqa: E402
from mobilerl.tinybase.data import build_example, corpus_texts, encode  # noqa: E402
from mobilerl.tinybase.recipe import DataConfig, Recipe, TrainConfig  # noqa: E402
from mobilerl.tinybase.screens import ScreenState, collect_states, load_states, save_states  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
TEMPLATES = ("ContactsAddContact", "AudioRecorderDeleteRecording", "SystemDeviceName", "LabSettingsBluetoothName")
SMALL = tiny.TinyShape(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=128)


@pytest.fixture(scope="module")
def states() -> list[ScreenState]:
    return collect_states(split="train", n_per_template=2, explore=1.0, render=0.5, templates=TEMPLATES)


@pytest.fixture(scope="module")
def tokenizer(states):
    return train_tokenizer(corpus_texts(states), vocab_size=2048)


@pytest.fixture(scope="module")
def processor(tokenizer):
    return tiny.build_processor(tokenizer)


def test_states_come_from_the_simulator(states, tmp_path):
    assert len(states) > 20
    assert all(s.task_id.split("/")[1] == "train" for s in states)
    assert any(s.action and s.action.startswith('do(action="Type"') for s in states)
    assert any(s.png for s in states) and any(not s.action for s in states)  # screenshots, off-policy
    save_states(states[:5], tmp_path / "s.jsonl.gz")
    assert load_states(tmp_path / "s.jsonl.gz") == states[:5]


def test_tokenizer_round_trips_actions_and_numbers(tokenizer, states):
    assert single_token_numbers(tokenizer) == []  # every 0-999 coordinate is one token
    acts = [
        Action("Tap", element=(12, 0, 999, 531)),
        Action("Type", text='Ines "Tanaka" (646) 692-5744 · Hauptstraße'),
        Action("Swipe", direction="up", dist="medium"),
        Action("Launch", app="SMS Messenger"),
        Action("Finish", message="2.10 MB"),
        Action("Back"),
    ]
    for a in acts:
        text = format_action(a)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert parse_action(tokenizer.decode(ids)) == a
    box = tokenizer('do(action="Tap", element=[12,0,999,531])', add_special_tokens=False)["input_ids"]
    assert len(box) <= 11
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_split_spaces_make_a_word_one_id_wherever_it_stands(states):
    """spaces='split': the instruction's word, the question's quoted cue and the Type action's first word
    are the same token ids (with 'prefix' they are not: " titled" vs "t"+"itle"+"d"), and text still
    round-trips exactly."""
    texts = list(corpus_texts(states))
    split = train_tokenizer(texts, vocab_size=2048, spaces="split")
    prefix = train_tokenizer(texts, vocab_size=2048)

    def ids(tok, s):
        return tok(s, add_special_tokens=False)["input_ids"]

    instruction = "Delete the recording Bedtime story"  # a frequent word of these templates' instructions
    for tok, same in ((split, True), (prefix, False)):
        word = ids(tok, "recording")
        assert (ids(tok, " recording")[-len(word):] == word) is same  # in the instruction
        assert (ids(tok, 'type after "recording"')[-len(word) - 1:-1] == word)  # a quoted cue: always bare
        action = format_action(Action("Type", text="recording"))
        assert (ids(tok, action)[-len(word) - 1:-1] == word)  # the Type action's first word: always bare
        assert tok.decode(ids(tok, action)) == action and tok.decode(ids(tok, instruction)) == instruction
    with pytest.raises(ValueError, match="spaces"):
        train_tokenizer(texts[:50], vocab_size=2048, spaces="none")


@pytest.mark.parametrize("coords", ["rel", "marks"])
def test_sequences_are_well_formed_and_dense(states, processor, coords):
    cfg = DataConfig(coords=coords, image_prob=1.0, lm_weight=0.1, max_len=1024)
    rng = random.Random(0)
    tok = processor.tokenizer
    answered = supervised = total = 0
    for st in states[:30]:
        ex = build_example(st, rng, cfg)
        enc = encode(ex, processor, cfg)
        assert len(enc.input_ids) <= cfg.max_len and len(enc.weights) == len(enc.input_ids)
        for s, e, kind in enc.answer_spans:
            answer = tok.decode(enc.input_ids[s : e - 1])
            assert enc.input_ids[e - 1] == tok.convert_tokens_to_ids("<|im_end|>")
            if kind in ("ground", "find", "type"):
                assert answer.startswith("<answer>") and answer.endswith("</answer>")
                action = parse_action(answer.removeprefix("<answer>").removesuffix("</answer>"))  # well-formed
                if kind == "ground":  # the marks frame names the line, the grid frame gives its box
                    assert (action.index is not None) is (coords == "marks")
            answered += 1
        if enc.pixel_values is not None:
            n_img = enc.input_ids.count(tok.convert_tokens_to_ids("<|image_pad|>"))
            assert n_img == int(enc.image_grid_thw.prod()) // 4
        supervised += sum(1 for w in enc.weights if w > 0)
        total += len(enc.weights)
    assert answered > 100
    assert supervised / total > 0.8  # most tokens carry a gradient



def test_model_builds_saves_reloads_offline_and_generates(tokenizer, processor, tmp_path):
    model = tiny.build_model(SMALL, tokenizer)
    assert model.config.text_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == model.config.text_config.eos_token_id
    tiny.save(model, processor, tmp_path / "m")
    again, proc = tiny.load(tmp_path / "m")
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    prompt = proc.tokenizer.apply_chat_template([{"role": "user", "content": 'tap "Save"'}], tokenize=False,
                                                add_generation_prompt=True)
    enc = proc.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = again.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]


def test_screenshot_goes_through_the_processor_and_model(states, tokenizer, processor):
    from mobilerl.tinybase.losses import loss_fn
    from mobilerl.tinybase.train import collate

    model = tiny.build_model(SMALL, tokenizer)
    cfg = DataConfig(image_prob=1.0)
    st = next(s for s in states if s.png)
    enc = encode(build_example(st, random.Random(0), cfg), processor, cfg)
    assert enc.pixel_values is not None
    ids_ = tiny.special_ids(tokenizer)
    ids, w, extra = collate([enc], ids_["pad"], ids_["image"])
    loss, _ = loss_fn(model, ids, w, extra)
    loss.backward()
    assert next(p for n, p in model.named_parameters() if "visual" in n).grad is not None


def test_twenty_steps_lower_the_loss(states, tokenizer, tmp_path):
    from mobilerl.tinybase.train import pretrain

    recipe = Recipe(
        model=SMALL,
        data=DataConfig(max_len=384, questions=12),
        train=TrainConfig(lr=3e-3, warmup_steps=5, batch_tokens=1536, max_steps=20, log_every=5, probe_every=10,
                          probe_items=3, threads=2),
    )
    model, _, summary = pretrain(recipe, tmp_path / "run", states, states[:10], tokenizer=tokenizer,
                                 log=lambda _: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "curve.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["type"] == "train"]
    assert summary["steps"] == 20 and losses[-1] < losses[0] - 0.5
    probes = [r for r in rows if r["type"] == "probe"]  # kept apart from the "type" question kind's accuracy
    assert [r["step"] for r in probes] == [10, 20]
    assert all(0 <= v <= 1 for r in probes for v in r["accuracy"].values()) and "ground" in probes[0]["accuracy"]
    assert set(probes[0]["items"]) == set(probes[0]["accuracy"])
    assert (tmp_path / "run" / "last.pt").exists()
    # resume: a second call continues from the checkpoint instead of starting over
    recipe.train.max_steps = 22
    _, _, again = pretrain(recipe, tmp_path / "run", states, states[:10], log=lambda _: None)
    assert again["steps"] == 22


@pytest.mark.skipif(not (BASE / "config.json").exists(), reason="no committed tiny base checkpoint")
def test_committed_base_loads_offline_and_reads_screens():
    from mobilerl.tinybase.probe import build_items, score_teacher_forced

    size = sum(f.stat().st_size for f in BASE.iterdir()) / 2**20
    assert size <= 25
    metrics = json.loads((BASE / "metrics.json").read_text())
    assert "command" in metrics["rebuild"]
    model, processor = tiny.load(BASE)
    recipe = Recipe.from_record(json.loads((BASE / "tiny.json").read_text())["profile"])
    held = collect_states(split="test", n_per_template=1, explore=0.0, seed=7, templates=TEMPLATES)
    items = build_items(held, recipe.data, n_per_kind=12, seed=0, kinds=("ground", "read"))
    acc = score_teacher_forced(model, processor, items, recipe.data)
    assert acc["ground"] >= 0.5 and acc["read"] >= 0.3, acc  # release probe: 100.0% / 96.5% (metrics.json); chance ~0


@pytest.mark.skipif(not (BASE / "tiny.json").exists(), reason="no committed tiny base checkpoint")
def test_the_released_base_was_trained_with_the_recipe_a_rebuild_trains():
    """The committed checkpoint's recipe is what ``dvc repro pretrain`` would train (params.yaml's recipe
    and overrides): a recipe change in configs/tiny.yaml lands together with a rebuilt, released base."""
    from mobilerl.config import load_params
    from mobilerl.tinybase.recipe import RETIRED, load_recipe
    from mobilerl.tracking import flatten
    from stages.pretrain import PretrainConfig

    cfg = load_params("pretrain", PretrainConfig)
    rebuild = flatten(load_recipe(ROOT / cfg.recipe, list(cfg.overrides)).to_dict())
    recorded = json.loads((BASE / "tiny.json").read_text())["profile"]
    # options removed since the release were at the value the code now always has there (from_record checks
    # it); an option added since the release counts at its default
    gone = {k: v for k, v in flatten(recorded).items() if k not in rebuild}
    assert gone == {k: RETIRED[k] for k in gone}, gone
    released = flatten(Recipe.from_record(recorded).to_dict())
    changed = sorted(k for k in set(rebuild) | set(released) if rebuild.get(k) != released.get(k))
    assert not changed, f"configs/tiny.yaml differs from the released base's recipe at {changed}"


def test_the_code_defaults_are_the_released_recipe_and_bad_keys_are_named():
    """``Recipe()`` is configs/tiny.yaml (the released recipe); a typo, a removed option or a bad value is an
    error that names the key, and a record holding a removed option at another value does not read."""
    from mobilerl.tinybase.recipe import load_recipe

    assert Recipe() == load_recipe(ROOT / "configs" / "tiny.yaml")
    for override, key in (("data.copy_punct=true", "data.copy_punct"), ("train.lr=fast", "train.lr"),
                          ("data.weights={tap: 1.0}", "data.weights"), ("model.hidden_size=100", "model")):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            load_recipe(ROOT / "configs" / "tiny.yaml", [override])
    with pytest.raises(ValueError, match=r"data\.act_pack"):
        Recipe.from_record({"data": {"act_pack": 0.5}})
    assert Recipe.from_record({"data": {"act_pack": 0.0}, "train": {"prev_sup": 0}}) == Recipe()


_STREAM_DIGEST = """
import hashlib, itertools, json, sys
from mobilerl.tinybase.data import stream_examples
from mobilerl.tinybase.probe import build_items
from mobilerl.tinybase.recipe import DataConfig
from mobilerl.tinybase.screens import load_states
states = load_states(sys.argv[1])
cfg = DataConfig(questions=12, novel_spans=0.5, random_spans=3)
h = hashlib.sha256()
for ex in itertools.islice(stream_examples(states, cfg, seed=3), 120):
    h.update(json.dumps(ex.messages, sort_keys=True, default=str).encode())
for it in build_items(states, cfg, n_per_kind=40, seed=0):
    h.update(repr(it).encode())
print(h.hexdigest())
"""


def test_the_data_stream_and_probe_items_do_not_depend_on_the_hash_seed(states, tmp_path):
    """The same seed gives the same training sequences and probe items in every process: no set order (which
    PYTHONHASHSEED changes) decides what is asked (it did: a rebuild's stream and the probe's find items)."""
    import os
    import subprocess
    import sys

    save_states(states, tmp_path / "s.jsonl.gz")
    digests = set()
    for hs in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        out = subprocess.run([sys.executable, "-c", _STREAM_DIGEST, str(tmp_path / "s.jsonl.gz")], env=env,
                             capture_output=True, text=True, check=True, cwd=ROOT)
        digests.add(out.stdout.strip().splitlines()[-1])
    assert len(digests) == 1


def test_random_spans_are_well_posed_copy_questions():
    import random

    from mobilerl.tinybase.data import copy_qas, random_spans

    ins = "Send the message 'See you at noon' to Bob Smith, then reply to Alice: thanks."
    spans = random_spans(ins, random.Random(0), 6)
    assert spans
    for span in spans:
        assert span in ins and not ins.startswith(span)
        assert not set(span) & set(".,;:!?'\"") and len(span.split()) <= 8
        end = ins.index(span) + len(span)
        assert end == len(ins) or ins[end] in ".,;:!?'\" " and (ins[end] != " " or ins[end + 1] in "'\"")
    qas = copy_qas(ins, spans)
    assert qas and all(q.answer.startswith('do(action="Type", text="') for q in qas)



def test_well_posed_spans_end_where_the_text_ends_them():
    from mobilerl.tinybase.data import random_spans, well_posed_span

    ins = "Add a contact named Wei Wang with phone number +1 312 445-3799, then text 'Leila's phone' to Bob."
    assert not well_posed_span(ins, "Wei")  # the first name: nothing in the text says the span stops there
    assert not well_posed_span(ins, "Wei Wang")
    assert well_posed_span(ins, "Wei Wang with phone number +1 312 445-3799")  # a comma ends it
    assert well_posed_span(ins, "Leila's phone") and well_posed_span(ins, "Bob")  # a quote; the full stop
    assert well_posed_span("Rename it to Summer trip", "Summer trip")  # the end of the instruction
    assert not well_posed_span(ins, "Alice") and not well_posed_span(ins, "")
    spans = random_spans(ins, random.Random(3), 6)
    assert spans and all(well_posed_span(ins, sp) for sp in spans)  # the random copy spans are well-posed


def test_copy_questions_of_the_probe_and_of_training_are_well_posed(states):
    """The probe asks span copy only where the question determines the span; the training sequences do too,
    while the expert's partial spans still reach the type/act answers."""
    import itertools

    from mobilerl.tinybase.data import instruction_spans, stream_examples, typed_texts, well_posed_span
    from mobilerl.tinybase.probe import build_items

    typed = typed_texts(states)
    ill = [(s, sp) for s in states for sp in instruction_spans(s.instruction, typed.get(s.task_id, ()))
           if not well_posed_span(s.instruction, sp)]
    assert ill  # the fixture has partial spans (first names into a First name field)

    def copied(ex) -> list[str]:
        return [parse_action(m["content"].removeprefix("<answer>").removesuffix("</answer>")).text
                for k, m in zip(ex.kinds, ex.messages[1::2], strict=False) if k == "copy"]

    cfg = DataConfig(weights={"copy": 1.0}, type_frac=0.5, system_prob=0.0)
    items = build_items(states, cfg, n_per_kind=50, seed=0, kinds=("copy",))
    assert items
    for it in items:
        ins = states[it.state_index].instruction
        assert it.example.messages[0]["content"].startswith(f"Task: {ins}\n")
        assert all(well_posed_span(ins, t) for t in copied(it.example))
    n_copied = 0
    for ex in itertools.islice(stream_examples(states, cfg, seed=0), 300):
        assert all(well_posed_span(ex.instruction, t) for t in copied(ex))
        n_copied += len(copied(ex))
    assert n_copied > 100


def test_novel_spans_replace_a_typed_span_everywhere_and_copy_questions_follow(states):
    """data.novel_spans: the span the expert types becomes random words in the instruction, on the screen,
    in the history and in the expert's action, so only copying answers the copy/type questions."""
    import random

    from mobilerl.tinybase.data import copy_qas, instruction_spans, typed_texts, with_novel_spans, word_pool

    typed = typed_texts(states)
    words = word_pool(states)
    st = next(s for s in states if s.action and s.action.startswith('do(action="Type"')
              and parse_action(s.action).text in s.instruction)
    spans = instruction_spans(st.instruction, typed[st.task_id])
    new, new_spans = with_novel_spans(st, spans, random.Random(0), words)
    old_text = parse_action(st.action).text
    new_text = parse_action(new.action).text
    assert new_text != old_text and new_text in new.instruction and old_text not in new.instruction
    assert new_text in new_spans and len(new_text.split()) == len(old_text.split())
    assert [t for t in old_text.split() if not t.isalpha()] == [t for t in new_text.split() if not t.isalpha()]
    assert all(w.lower() in {x.lower() for x in words} for w in new_text.split() if w.isalpha())
    assert not any(old_text in n.label for n in new.nodes + new.offscreen)
    assert all(old_text not in h for h in new.history)
    qas = copy_qas(new.instruction, new_spans)
    assert any(q.answer == format_action(Action("Type", text=new_text)) for q in qas)
    assert with_novel_spans(st, [], random.Random(0), words)[0] is st



def test_train_seed_changes_the_run_not_the_screens_or_the_tokenizer(states, monkeypatch):
    """``train.seed`` seeds the init and the data stream only; the screens (train, held out) and the tokenizer's
    sample follow ``states_seed``, so a seed-spread rebuild trains and is probed on the same screens."""
    import mobilerl.tinybase.screens as screens
    import mobilerl.tinybase.train as pt
    from mobilerl.tinybase.recipe import load_recipe

    seen = []
    monkeypatch.setattr(screens, "collect_states", lambda **kw: seen.append(("train", kw["seed"])) or list(states))
    monkeypatch.setattr(screens, "held_out_states", lambda **kw: seen.append(("test", kw["seed"])) or [])
    monkeypatch.setattr(pt, "TOKENIZER_STATES", len(states) // 2)  # the tokenizer samples the screens
    vocab = {}
    for key in ("train.seed=0", "train.seed=1", "states_seed=3"):
        recipe = load_recipe(ROOT / "configs" / "tiny.yaml", [key, "vocab_size=2048"])
        pt.prepare_states(recipe, log=lambda msg: None)
        if key.startswith("train.seed"):
            vocab[key] = pt.make_tokenizer(recipe, states).get_vocab()
    assert seen == [("train", 0), ("test", 1), ("train", 0), ("test", 1), ("train", 3), ("test", 4)]
    assert vocab["train.seed=0"] == vocab["train.seed=1"]


def test_lr_schedule_decays_by_the_clock_as_well_as_by_steps():
    from mobilerl.tinybase.train import lr_at

    cfg = TrainConfig(lr=1e-3, min_lr_ratio=0.1, warmup_steps=10, max_steps=10_000, max_minutes=60)
    assert lr_at(0, cfg) < lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg, minutes=30) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(100, cfg, minutes=60) == pytest.approx(1e-4)
    assert lr_at(10_000, cfg, minutes=1) == pytest.approx(1e-4)


def test_copy_pairs_point_each_copied_answer_token_at_its_source(states, processor):
    """Attention-supervision targets: the position predicting a copied answer token → that token in the
    prompt, inside the line (box, read value) or instruction span the answer comes from."""
    from mobilerl.tinybase.data import random_spans

    cfg = DataConfig(coords="rel", questions=24, max_len=4096, image_prob=0.0, system_prob=0.0,
                     weights={"ground": 1.0, "read": 1.0, "copy": 1.0})
    tok = processor.tokenizer
    seen = {"ground": 0, "read": 0, "copy": 0}
    for i, st in enumerate(states[:30]):
        spans = random_spans(st.instruction, random.Random(i), 3)
        ex = build_example(st, random.Random(i), cfg, spans=spans)
        enc = encode(ex, processor, cfg, attn_pairs=True)
        assert not encode(ex, processor, cfg).attn_pairs  # computed only when asked for
        for q, k in enc.attn_pairs:
            assert enc.input_ids[q + 1] == enc.input_ids[k] and k < q
        for turn, (s, e, kind) in enumerate(enc.answer_spans):
            pairs = [(q, k) for q, k in enc.attn_pairs if s - 1 <= q < e - 1]
            src = ex.sources[turn]
            if src is None:
                assert not pairs
                continue
            if kind in seen and pairs:
                seen[kind] += 1
            src_text = tok.decode(enc.input_ids[min(k for _, k in pairs):max(k for _, k in pairs) + 1]) if pairs else ""
            if kind == "ground":  # the four numbers of the box, copied from the target line, in order
                assert len(pairs) == 4 and [k for _, k in pairs] == sorted(k for _, k in pairs)
                line = ex.lines[src[1]]
                assert src_text in line
                box = parse_action(tok.decode(enc.input_ids[s:e]).split("<answer>")[1].split("</answer>")[0])
                assert line.endswith(f"[{box.element[0]},{box.element[1]}][{box.element[2]},{box.element[3]}]")
            elif kind == "read" and pairs:
                assert src_text.strip() in ex.lines[src[1]]
            elif kind == "copy" and pairs:
                assert src_text.strip() in st.instruction
    assert seen["ground"] > 10 and seen["read"] > 5 and seen["copy"] > 0, seen



def _supervision_batch(states, tokenizer, processor, n_states=4, questions=12, max_len=768, attn_pairs=True):
    """A small model and one collated batch of grounding/reading sequences, for the head-supervision tests."""
    from mobilerl.tinybase.train import collate

    torch.manual_seed(0)
    model = tiny.build_model(SMALL, tokenizer)
    cfg = DataConfig(coords="rel", questions=questions, max_len=max_len, image_prob=0.0, system_prob=0.0,
                     weights={"ground": 1.0, "read": 1.0})
    encs = [encode(build_example(st, random.Random(i), cfg), processor, cfg, attn_pairs=attn_pairs)
            for i, st in enumerate(states[:n_states])]
    ids_ = tiny.special_ids(tokenizer)
    return model, ids_, *collate(encs, ids_["pad"], ids_["image"])


def _train_30_steps(model, ids, w, extra, attn):
    """30 AdamW steps on one batch; returns the loss stats of the first step and of the last."""
    from mobilerl.tinybase.losses import loss_fn

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss, stats = loss_fn(model, ids, w, extra, attn)
        loss.backward()
        opt.step()
        opt.zero_grad()
        first = first or stats
    return first, stats


def test_attention_supervision_points_a_head_without_changing_the_forward(states, tokenizer, processor):
    from mobilerl.tinybase.losses import disable_attention_capture, enable_attention_capture, loss_fn

    model, _, ids, w, extra = _supervision_batch(states, tokenizer, processor)
    assert extra["attn_pairs"].shape[1] == 3 and len(extra["attn_pairs"]) > 20
    model.eval()
    with torch.no_grad():
        plain, _ = loss_fn(model, ids, w, extra)
        cap = enable_attention_capture(model, -1)
        attn = {"capture": cap, "weight": 1.0, "heads": 1}
        captured, stats = loss_fn(model, ids, w, extra, attn)
        lm_only, _ = loss_fn(model, ids, w, extra)
    assert torch.allclose(plain, lm_only) and cap["q"].shape[:3] == (ids.shape[0], SMALL.num_attention_heads, ids.shape[1])
    assert captured > plain and stats["attn_pairs"] == len(extra["attn_pairs"])
    first, stats = _train_30_steps(model, ids, w, extra, attn)
    assert stats["attn_loss"] < first["attn_loss"] - 1.0 and stats["attn_acc"] > first["attn_acc"] + 0.2
    disable_attention_capture(model)
    assert model.config._attn_implementation == "sdpa"


def test_copy_readout_teaches_the_heads_value_path_to_carry_the_copied_token(states, tokenizer, processor):
    """``train.copy_readout``: what the supervised head writes from a pair's source, read out alone through
    lm_head, is scored against the copied token; training on it raises that readout's top-1 accuracy, and the
    model's forward is unchanged by the capture."""
    from mobilerl.tinybase.losses import (
        copy_readout_loss,
        disable_attention_capture,
        enable_attention_capture,
        loss_fn,
    )

    model, _, ids, w, extra = _supervision_batch(states, tokenizer, processor)
    with torch.no_grad():
        plain, _ = loss_fn(model, ids, w, extra)
    attn = {"capture": enable_attention_capture(model, -1), "weight": 0.1, "heads": 1, "layer": -1, "readout": 1.0}
    with torch.no_grad():
        both, stats = loss_fn(model, ids, w, extra, attn)
        r_loss, r_acc = copy_readout_loss(model, -1, attn["capture"]["v"], extra["attn_pairs"], ids)
    assert both > plain and stats["readout_acc"] == r_acc and r_acc < 0.2
    assert attn["capture"]["v"].shape == attn["capture"]["k"].shape
    first, stats = _train_30_steps(model, ids, w, extra, attn)
    assert stats["readout_loss"] < first["readout_loss"] - 1.0 and stats["readout_acc"] > first["readout_acc"] + 0.3
    disable_attention_capture(model)



def test_next_action_turn_is_the_policy_prompt_exactly(states):
    """With ``prompt: policy`` the expert's-next-action question (``act``) is asked as the policy itself is
    asked: the first user turn is ``mobilerl.agent.prompt``'s user prompt, no question after it, with the
    SFT's history window and system prompt style; the answer is the expert's action in the answer tag."""
    from mobilerl.agent import prompt
    from mobilerl.tinybase.screens import expert_answer, history_responses, render_screen

    cfg = DataConfig(coords="rel", image_prob=0.0, questions=6, system_prob=1.0, max_history=2,
                     system_style="compact", weights={"ground": 1.0, "read": 1.0, "act": 50.0})
    on_policy = [s for s in states if s.action and len(s.history) > 2]
    assert on_policy
    for i, st in enumerate(on_policy[:10]):
        ex = build_example(st, random.Random(i), cfg)
        assert ex.kinds[0] == "act" and ex.kinds.count("act") == 1
        sys_msg, user, answer = ex.messages[:3]
        assert sys_msg == {"role": "system", "content": prompt.system_prompt("xml", style="compact")}
        screen = render_screen(st.nodes, st.width, st.height, cfg.coords, False)
        assert user["content"] == prompt.user_prompt(st.instruction, history_responses(st, cfg.coords), screen,
                                                     app=st.app, mode="xml", max_history=2)
        assert "Previous actions (the last 2):" in user["content"] and "Step 2:" in user["content"]
        assert "Step 3:" not in user["content"]
        assert answer["content"] == f"<answer>{expert_answer(st, st.nodes, cfg.coords, 'bbox')}</answer>"
        assert all(not m["content"].startswith("Task:") for m in ex.messages[3::2])  # later turns: question only


def test_marks_frame_pretraining_shows_what_the_policy_sees_and_points_at_the_mark(states, processor):
    """``coords: marks``: the screen is the prompt module's marks rendering of the pixel screen, the history
    and the expert's answer name lines as the policy would, and a grounding answer's attention target is
    the number at the end of the line it names."""
    from mobilerl.agent import prompt as PR
    from mobilerl.tinybase.screens import expert_answer, history_responses, render_screen

    cfg = DataConfig(coords="marks", questions=12, max_len=4096, max_history=4, image_prob=0.0, system_prob=0.0,
                     weights={"ground": 2.0, "act": 50.0})
    on_policy = [s for s in states if s.action and len(s.history) >= 2]
    assert on_policy and all(len(s.history_marks) == len(s.history) for s in states)
    tok = processor.tokenizer
    grounded = 0
    for i, st in enumerate(on_policy[:12]):
        pixels = render_screen(st.nodes, st.width, st.height, "abs")
        marks = render_screen(st.nodes, st.width, st.height, "marks")
        assert marks == PR.screen_in_frame(pixels, None, "marks")
        want = PR.in_frame(pixels, parse_action(st.action), None, "marks")[1]
        assert expert_answer(st, st.nodes, "marks", "bbox") == format_action(want)
        assert all("element=" not in h for h in history_responses(st, "marks"))
        ex = build_example(st, random.Random(i), cfg)
        assert ex.messages[0]["content"] == PR.user_prompt(st.instruction, history_responses(st, "marks"), marks,
                                                           app=st.app, mode="xml", max_history=4, coords="marks")
        enc = encode(ex, processor, cfg, attn_pairs=True)
        for s, e, kind in enc.answer_spans:
            if kind != "ground":
                continue
            answer = parse_action(tok.decode(enc.input_ids[s:e]).split("<answer>")[1].split("</answer>")[0])
            assert isinstance(answer, Action) and answer.index is not None
            [(q, k)] = [(q, k) for q, k in enc.attn_pairs if s - 1 <= q < e - 1]
            assert tok.decode([enc.input_ids[k]]) == str(answer.index)
            assert ex.lines[answer.index].endswith(f"[{answer.index}]")
            grounded += 1
    assert grounded > 5
    with pytest.raises(ValueError, match="re-collect"):
        history_responses(dataclasses.replace(on_policy[0], history_marks=()), "marks")



def test_data_workers_draw_the_same_kind_of_sequences_and_stop(states, processor):
    """``train.data_workers``: forked processes draw and tokenize sequences; the stream yields encoded
    sequences with answers and its workers end when it is closed."""
    import multiprocessing as mp

    from mobilerl.tinybase.train import worker_stream

    cfg = DataConfig(max_len=384, questions=8)
    stream = worker_stream(states, cfg, processor, seed=5, workers=2, attn_pairs=False)
    got = [next(stream) for _ in range(12)]
    assert all(e.answer_spans and len(e.input_ids) <= 384 for e in got)
    assert len(mp.active_children()) >= 2
    stream.close()
    assert not [p for p in mp.active_children() if p.is_alive()]
    broken = worker_stream([], cfg, processor, seed=5, workers=1, attn_pairs=False)
    with pytest.raises(RuntimeError, match="data worker"):  # a worker that dies is an error, not a hang
        next(broken)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pretraining_runs_on_cuda(states, tokenizer, tmp_path):
    from mobilerl.tinybase.train import pretrain

    recipe = Recipe(model=SMALL, data=DataConfig(max_len=384, questions=12),
                      train=TrainConfig(lr=3e-3, warmup_steps=5, batch_tokens=1536, max_steps=20, log_every=5,
                                        probe_every=10, probe_items=3, device="cuda", data_workers=1,
                                        attn_sup=0.1))
    model, _, summary = pretrain(recipe, tmp_path / "run", states, states[:10], tokenizer=tokenizer,
                                 log=lambda _: None)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "curve.jsonl").read_text().splitlines()
              if '"train"' in x]
    assert summary["steps"] == 20 and losses[-1] < losses[0] and model.device.type == "cpu"


@pytest.mark.skipif(not (BASE / "config.json").exists(), reason="no committed tiny base checkpoint")
def test_generation_probe_does_not_cut_off_a_long_right_answer():
    """A recipe's directions copied into a Type run past 64 tokens: an answer as long as its target must not
    be cut at the probe's default cap (two of the released base's 200 span-copy items were)."""
    from mobilerl.tinybase.data import Example
    from mobilerl.tinybase.probe import ProbeItem, score_generate

    _, processor = tiny.load(BASE)
    tok = processor.tokenizer
    words = "Preheat the oven. Stretch the dough, spread the sauce, top with cheese and bake for ten minutes."
    targets = [f'<answer>do(action="Type", text="{words} {words}")</answer>', '<answer>do(action="Back")</answer>']
    assert len(tok(targets[0], add_special_tokens=False)["input_ids"]) > 64

    class Echo:  # a "model" that answers every item with its target, as far as max_new_tokens allows
        device = torch.device("cpu")

        def eval(self):
            return self

        def generate(self, input_ids, attention_mask, max_new_tokens, do_sample):
            rows = [tok(t, add_special_tokens=False)["input_ids"][:max_new_tokens] for t in targets]
            width = max(map(len, rows))
            new = torch.full((len(rows), width), tok.pad_token_id or 0, dtype=torch.long)
            for i, r in enumerate(rows):
                new[i, :len(r)] = torch.tensor(r)
            return torch.cat((input_ids, new), dim=1)

    items = [ProbeItem("copy", Example([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": t}],
                                       ["copy"]), i) for i, t in enumerate(targets)]
    acc, rows = score_generate(Echo(), processor, items)
    assert acc["copy"] == 1.0, rows



def test_experiment_entry_point_runs_a_tiny_recipe(states, tokenizer, tmp_path):
    """``python -m mobilerl.tinybase.train RECIPE WORK --states DIR --set ... --out DIR``, as the scripts and the
    history's experiments invoke it: a screen cache and its tokenizer are reused, the model is saved with its
    recipe."""
    import subprocess
    import sys

    cache = tmp_path / "states"
    save_states(states, cache / "train.jsonl.gz")
    save_states(states[:10], cache / "test.jsonl.gz")
    tokenizer.backend_tokenizer.save(str(cache / "tokenizer_2048_split.json"))
    sets = ["vocab_size=2048", "model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=128",
            "data.max_len=512", "data.questions=8", "train.max_steps=2", "train.batch_tokens=1024",
            "train.log_every=1", "train.probe_every=2", "train.probe_items=2", "train.threads=1"]
    cmd = [sys.executable, "-m", "mobilerl.tinybase.train", "configs/tiny.yaml", str(tmp_path / "work"),
           "--states", str(cache), "--out", str(tmp_path / "model"), *(x for s in sets for x in ("--set", s))]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    recorded = json.loads((tmp_path / "model" / "tiny.json").read_text())
    assert recorded["summary"]["steps"] == 2 and recorded["profile"]["model"]["hidden_size"] == 64
    assert Recipe.from_record(recorded["profile"]).train.max_steps == 2
