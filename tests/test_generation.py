"""Generation backends: the tiny model offline through the HF backend (batching, seeds, logprobs = score),
the OpenAI client on recorded vLLM responses and end to end through serve_openai, make_backend, vLLM (GPU)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from tiny_checkpoint import session_checkpoint

from mobilerl.models.backends import make_backend
from mobilerl.models.generation import (
    ChatRequest,
    GenerationError,
    MicroBatcher,
    SamplingConfig,
    content_parts,
)
from mobilerl.models.hf_backend import HFBackend
from mobilerl.models.openai_backend import OpenAIBackend, parse_chat_completion, parse_prompt_logprobs
from mobilerl.models.serve_openai import ServerThread, create_app

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
SCREEN = "Task: open the Contacts app\nScreen:\nButton;clickable;OK;[10,20][300,400]\n"


def run(coro):
    return asyncio.run(coro)


def text_request(suffix: str = "") -> ChatRequest:
    return ChatRequest([{"role": "user", "content": SCREEN + suffix}])


def image_request() -> ChatRequest:
    img = Image.new("RGB", (108, 240), (30, 120, 200))
    return ChatRequest([{"role": "user", "content": "<image>" + SCREEN}], [img])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return session_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def hf(ckpt) -> HFBackend:
    return HFBackend.from_pretrained(ckpt, device="cpu", max_batch=8, batch_wait_ms=20)


# ---------------------------------------------------------------------------------- interface


def test_requests_and_sampling_validate():
    assert content_parts("a <image> b") == [
        {"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b"}
    ]
    with pytest.raises(ValueError, match="1 image placeholder"):
        ChatRequest([{"role": "user", "content": "<image> x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        ChatRequest([{"content": "x"}])
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="unknown sampling key"):
        SamplingConfig.from_dict({"temprature": 1})
    assert SamplingConfig(stop="x").stop == ("x",)
    assert SamplingConfig(temperature=0).logprob_temperature == 1.0


def test_micro_batcher_batches_groups_and_propagates_errors():
    from concurrent.futures import ThreadPoolExecutor

    calls: list[list] = []

    def fn(items):
        calls.append(list(items))
        if any(i == "boom" for _, i in items):
            raise RuntimeError("boom")
        return [i * 10 for _, i in items]

    async def main():
        mb = MicroBatcher(fn, ThreadPoolExecutor(1), max_batch=4, wait_s=0.05, key=lambda it: it[0])
        out = await asyncio.gather(*(mb.submit(("a" if i % 3 else "b", i)) for i in range(10)))
        assert out == [i * 10 for i in range(10)]
        assert all(len(c) <= 4 and len({k for k, _ in c}) == 1 for c in calls)
        assert mb.stats.items == 10 and mb.stats.batches == len(calls) <= 4
        res = await asyncio.gather(mb.submit(("a", 1)), mb.submit(("a", "boom")), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in res)
        await mb.aclose()

    run(main())
    mb2 = MicroBatcher(fn, ThreadPoolExecutor(1))
    assert run(mb2.submit(("x", 2))) == 20 and run(mb2.submit(("x", 3))) == 30  # rebinds to each new loop


# -------------------------------------------------------------------------------- HF backend


def test_tiny_checkpoint_loads_offline_and_generates(hf, ckpt):
    assert (ckpt / "tiny.json").exists() and (ckpt / "config.json").exists()
    [g] = run(hf.generate([text_request()], SamplingConfig(temperature=0, max_new_tokens=8)))
    assert g.finish_reason in ("stop", "length") and g.prompt_tokens > 10
    assert 1 <= len(g.token_ids) == len(g.logprobs) <= 8
    assert all(lp <= 0 for lp in g.logprobs)
    assert g.text == hf.tokenizer.decode([t for t in g.token_ids if t not in hf.eos_ids], skip_special_tokens=True)


def test_text_prefill_is_the_transformers_forward(hf, ckpt):
    """The lean text prefill the backend uses for text-only prompts gives the transformers forward's logits
    and cache, and generation with it is generation without it."""
    import torch

    from mobilerl.models.text_prefill import TextPrefill

    assert hf._text_prefill is not None  # the tiny Qwen2-VL takes the lean path
    enc = hf._encode([hf.render(text_request("Tap OK please"))], [])
    n = enc["input_ids"].shape[1]
    with torch.inference_mode():
        out = hf.model(**enc, position_ids=torch.arange(n).unsqueeze(0), use_cache=True)
        logits, kv = hf._text_prefill(enc["input_ids"])
    torch.testing.assert_close(logits, out.logits[0, -1], rtol=1e-5, atol=1e-5)
    assert len(kv) == len(out.past_key_values.layers)
    for (k, v), layer in zip(kv, out.past_key_values.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, layer.values, rtol=1e-5, atol=1e-5)
    plain = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=8, fast_prefill=False)
    assert plain._text_prefill is None
    reqs = [text_request(s) for s in ("", "Back", "hello")]
    sc = SamplingConfig(temperature=0, max_new_tokens=10)

    async def both(backend):
        return [g for [g] in await asyncio.gather(*(backend.generate([r], sc) for r in reqs))]

    for fast, slow in zip(run(both(hf)), run(both(plain)), strict=True):
        assert fast.token_ids == slow.token_ids
        np.testing.assert_allclose(fast.logprobs, slow.logprobs, atol=1e-4)
    assert TextPrefill.for_model(torch.nn.Linear(2, 2)) is None  # anything else keeps the transformers forward


def test_seeded_sampling_is_deterministic_and_seeds_differ_per_request(hf):
    sc = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=7)
    a = run(hf.generate([text_request()] * 3, sc))
    b = run(hf.generate([text_request()] * 3, sc))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1  # seeds 7, 8, 9: distinct samples of one prompt


def test_batched_equals_unbatched(hf):
    reqs = [text_request(s) for s in ("", "Back", "Tap OK please", "hello")] + [image_request()]

    async def sequential(sc):
        return [(await hf.generate([r], sc))[0] for r in reqs]

    async def concurrent(sc):  # separate callers; the micro-batcher puts them in one left-padded batch
        return [g for [g] in await asyncio.gather(*(hf.generate([r], sc) for r in reqs))]

    for sc in (SamplingConfig(temperature=0, max_new_tokens=10),):
        before = hf.stats.batches
        one = run(sequential(sc))
        assert hf.stats.batches - before == len(reqs)
        before = hf.stats.batches
        many = run(concurrent(sc))
        assert hf.stats.batches - before == 1
        assert [g.text for g in one] == [g.text for g in many]
        for x, y in zip(one, many, strict=True):
            assert x.token_ids == y.token_ids
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
    # Sampling is per row (own generator): the batch composition does not change a seeded sample.
    seeded = [SamplingConfig(temperature=1.0, max_new_tokens=10, seed=100 + i) for i in range(len(reqs))]
    one = [run(hf.generate([r], s))[0] for r, s in zip(reqs, seeded, strict=True)]

    async def seeded_batch():
        return [g for [g] in await asyncio.gather(*(hf.generate([r], s) for r, s in zip(reqs, seeded, strict=True)))]

    assert [g.token_ids for g in run(seeded_batch())] == [g.token_ids for g in one]


def test_generate_and_score_agree(hf):
    for req in (text_request(), image_request()):
        for sc in (SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3),
                   SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=4)):
            [g] = run(hf.generate([req], sc))
            s = run(hf.score(req, g.token_ids, temperature=sc.logprob_temperature))
            np.testing.assert_allclose(s, g.logprobs, atol=1e-4)
    # Text is scored as a finished turn: its tokens, then the end-of-turn token.
    text = 'do(action="Back")'
    ids = hf.tokenizer(text, add_special_tokens=False)["input_ids"]
    by_text = run(hf.score(text_request(), text))
    assert len(by_text) == len(ids) + 1
    np.testing.assert_allclose(by_text, run(hf.score(text_request(), [*ids, hf.eos_id])), atol=1e-6)


def test_sampled_logprobs_are_token_logprobs_of_a_teacher_forced_forward(hf):
    """The one definition of a token logprob (:mod:`mobilerl.models.logprobs`, what the RL trainer recomputes):
    a response's logprobs are ``token_logprobs`` of a plain transformers forward over the prompt and the
    returned token ids, at the sampling temperature (1 when greedy)."""
    import torch

    from mobilerl.models.logprobs import token_logprobs

    for req in (text_request("Tap OK please"), image_request()):
        enc = hf.processor(text=[hf.render(req)], images=list(req.images) if req.images else None,
                           return_tensors="pt")
        p = enc["input_ids"].shape[1]
        for sc in (SamplingConfig(temperature=0, max_new_tokens=12),
                   SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3),
                   SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=4)):
            [g] = run(hf.generate([req], sc))
            assert len(g.token_ids) == len(g.logprobs) >= 1
            tail = torch.tensor([g.token_ids])
            # per-token inputs go on over the answer: its ids, attention 1, token type 0 (text)
            fill = {"input_ids": tail, "attention_mask": torch.ones_like(tail)}
            inputs = {k: torch.cat([v, fill.get(k, torch.zeros_like(tail)).to(v.dtype)], 1)
                      if v.shape == enc["input_ids"].shape else v for k, v in enc.items()}
            with torch.inference_mode():
                logits = hf.model(**inputs).logits[0]  # (p + n, V): position i predicts token i + 1
            ids = inputs["input_ids"][0]
            recomputed = token_logprobs(logits[p - 1:-1], ids[p:], sc.logprob_temperature)
            np.testing.assert_allclose(recomputed.numpy(), g.logprobs, atol=1e-4)


def test_stop_strings_cut_text_and_stop_early(hf):
    req = text_request("x")
    [g] = run(hf.generate([req], SamplingConfig(temperature=1.0, max_new_tokens=16, seed=11)))
    assert len(g.text) >= 4
    stop = g.text[2:4]
    [h] = run(hf.generate([req], SamplingConfig(temperature=1.0, max_new_tokens=16, seed=11, stop=(stop,))))
    assert h.finish_reason == "stop" and stop not in h.text and g.text.startswith(h.text)
    assert h.token_ids == g.token_ids[: len(h.token_ids)] and len(h.token_ids) <= len(g.token_ids)


def test_rows_ending_early_are_dropped_from_the_batch_without_changing_the_others(hf, monkeypatch):
    # Make rows 0-3 end after two tokens: their second sampled tokens become end-of-turn tokens (unless rows
    # 4-5 ever sample them). Once at most half of the rows are live, the batch cache is compacted (rows and
    # left padding dropped): every row must still match its unbatched generation.
    from mobilerl.models.decode_cache import growing_layer

    reqs = [text_request(s) for s in ("", "Back", "Tap OK please", "hello", "Swipe up", "x y z")]
    scs = [SamplingConfig(temperature=1.0, max_new_tokens=10, seed=100 * i) for i in range(len(reqs))]
    free = [run(hf.generate([r], sc))[0] for r, sc in zip(reqs, scs, strict=True)]
    late = set(free[4].token_ids) | set(free[5].token_ids)
    be = HFBackend(hf.model, hf.processor, max_batch=8, batch_wait_ms=20)
    be.eos_ids = set(hf.eos_ids) | ({g.token_ids[1] for g in free[:4]} - late)
    selects = []
    layer = growing_layer()
    orig = layer.select
    monkeypatch.setattr(layer, "select", lambda self, rows, start: (selects.append(len(rows)), orig(self, rows, start)))

    one = [run(be.generate([r], sc))[0] for r, sc in zip(reqs, scs, strict=True)]
    assert sum(len(g.token_ids) <= 2 and g.finish_reason == "stop" for g in one) >= 3
    assert [g.finish_reason for g in one[4:]] == ["length"] * 2

    async def batch():
        return [g for [g] in await asyncio.gather(*(be.generate([r], sc) for r, sc in zip(reqs, scs, strict=True)))]

    many = run(batch())
    assert selects and min(selects) <= len(reqs) // 2  # the batch shrank
    for x, y in zip(one, many, strict=True):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason and x.text == y.text
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)


LONG = ("Task: add a contact named Alice with phone 555 and open the Contacts app\n"
        "Button;clickable;OK;[10,20][300,400]\nTextView;;Contacts;[0,0][999,80]\n" * 3)


def test_prefix_cache_prefills_only_what_is_new_and_changes_nothing(hf, ckpt):
    """A prompt that starts like an earlier one reuses its keys/values: the same logits and cache as a full
    prefill, the same generations as a backend without the cache; new weights empty the cache."""
    import torch

    from mobilerl.models.text_prefill import PrefixCache

    enc = hf._encode([hf.render(text_request(LONG + "Tap OK"))], [])
    ids = enc["input_ids"]
    n = ids.shape[1]
    with torch.inference_mode():
        full_logits, full_kv = hf._text_prefill(ids)
        head_logits, head_kv = hf._text_prefill(ids[:, : n - 7])
        logits, kv = hf._text_prefill(ids, [(k[:, :, : n - 9], v[:, :, : n - 9]) for k, v in head_kv])
    torch.testing.assert_close(logits, full_logits, rtol=1e-5, atol=1e-5)
    for (k, v), (fk, fv) in zip(kv, full_kv, strict=True):
        torch.testing.assert_close(k, fk, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, fv, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="must leave a token"):
        hf._text_prefill(ids, full_kv)

    cached = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=4, prefix_cache_tokens=4096)
    plain = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=4, prefix_cache_tokens=0)
    assert plain.prefix_cache is None
    reqs = [text_request(LONG + s) for s in ("", "Back", "Tap OK please", "Back")]
    sc = SamplingConfig(temperature=0, max_new_tokens=8)
    for r in reqs:  # one at a time: each prompt after the first finds its start in the cache
        [a], [b] = run(cached.generate([r], sc)), run(plain.generate([r], sc))
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    pc = cached.prefix_cache
    assert pc.lookups == 4 and pc.hits == 3 and pc.reused_tokens >= 3 * len(LONG) // 4
    with torch.no_grad():  # an RL update: the cached keys are stale
        next(cached.model.parameters()).add_(0.5)
    [a] = run(cached.generate([reqs[1]], sc))
    assert pc.hits == 3 and pc.lookups == 5  # the cache was emptied before the lookup
    plain2 = HFBackend(cached.model, cached.processor, prefix_cache_tokens=0)
    assert a.token_ids == run(plain2.generate([reqs[1]], sc))[0].token_ids
    with torch.no_grad():
        next(cached.model.parameters()).sub_(0.5)

    lru = PrefixCache(100, block=4, min_prefix=3)
    kv1 = [(torch.zeros(1, 1, 40, 2), torch.zeros(1, 1, 40, 2))]
    lru.insert(list(range(40)), kv1)
    assert lru.lookup(list(range(10)) + [99, 98]) [0][0].shape[2] == 10  # the shared start, token by token
    assert lru.lookup(list(range(40)))[0][0].shape[2] == 39  # a whole known prompt still runs its last token
    assert lru.lookup([5, 6, 7, 8, 9]) is None and lru.lookup([0, 1, 9, 9, 9]) is None  # < min_prefix
    lru.insert(list(range(100, 170)), [(torch.zeros(1, 1, 70, 2),) * 2])  # 110 tokens > 100: the oldest goes
    assert lru.lookup(list(range(20))) is None and lru.lookup(list(range(100, 120))) is not None


def test_prompt_lookup_guesses_copies_and_loops():
    from mobilerl.models.speculation import PromptLookup

    assert PromptLookup([5, 1, 2, 3, 4, 9, 1, 2]).draft([], 3) == [3, 4, 9]  # "1 2" went on as "3 4 9"
    # The longest matching n-gram wins: "1 2 3" continued "8 0", the later "2 3" continued "5 1".
    assert PromptLookup([1, 2, 3, 8, 0, 2, 3, 5, 1, 1, 2, 3]).draft([], 2) == [8, 0]
    lk = PromptLookup([10, 11, 12, 13, 14, 20])
    assert lk.draft([11, 12], 3) == [13, 14, 20]  # the 2-gram "11 12" continues as in the prompt
    assert lk.draft([11, 12, 13], 2) == [14, 20]  # incremental: the new tokens are indexed too
    assert PromptLookup([8, 3, 3, 3]).draft([], 5) == [3, 3, 3, 3, 3]  # a loop copies into itself
    assert PromptLookup([1, 2, 3]).draft([], 4) == []  # nothing to copy


def test_speculative_decoding_is_plain_greedy_decoding(ckpt):
    """Prompt-lookup guesses checked in one forward give the tokens, logprobs and finish reasons of plain
    decoding, in batches with sampled rows, stop strings and the token cap, while running fewer forwards."""
    model_kw = dict(device="cpu", max_batch=8, batch_wait_ms=50, prefix_cache_tokens=0)
    spec = HFBackend.from_pretrained(ckpt, speculate_tokens=6, speculate_rows=8, prefill_draft=0, batch_draft=0,
                                     **model_kw)
    plain = HFBackend(spec.model, spec.processor, max_batch=8, batch_wait_ms=50, speculate_tokens=0,
                      prefix_cache_tokens=0, prefill_draft=0, batch_draft=0)
    forwards = {}
    for name, be in (("spec", spec), ("plain", plain)):
        be.model._fw = 0
        forwards[name] = be.model.register_forward_pre_hook(lambda m, a: setattr(m, "_fw", m._fw + 1))
    reqs = [text_request(LONG + s) for s in ("", "Back", "Tap OK please", "hello", "x y z")]
    scs = [SamplingConfig(temperature=0, max_new_tokens=40), SamplingConfig(temperature=0, max_new_tokens=17),
           SamplingConfig(temperature=1.0, max_new_tokens=40, seed=5), SamplingConfig(temperature=0, max_new_tokens=40),
           SamplingConfig(temperature=0, max_new_tokens=40)]

    async def batch(be, scs):
        return [g for [g] in await asyncio.gather(*(be.generate([r], sc) for r, sc in zip(reqs, scs, strict=True)))]

    for group in (scs, [replace_stop(sc) for sc in scs]):
        counts = {}
        results = {}
        for name, be in (("spec", spec), ("plain", plain)):
            before = be.model._fw
            results[name] = run(batch(be, group))
            counts[name] = be.model._fw - before
        for x, y in zip(results["spec"], results["plain"], strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason and x.text == y.text
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
        assert counts["spec"] < counts["plain"]
    assert results["plain"][1].finish_reason == "length" and len(results["plain"][1].token_ids) == 17
    for h in forwards.values():
        h.remove()


def test_response_lookup_guesses_how_answers_usually_go():
    from mobilerl.models.speculation import ResponseLookup

    lk = ResponseLookup(window=3)
    assert lk.draft([], 4) == []  # nothing seen yet
    for r in ([1, 2, 3, 7, 0], [1, 2, 4, 7, 0], [1, 2, 3, 8, 0]):
        lk.add(r)
    assert lk.draft([], 5) == [1, 2, 3, 7, 0]  # the most frequent successor of each context
    assert lk.draft([], 5, stop={2}) == [1, 2]  # a guess ends after a stop token (end of turn)
    assert lk.draft([1, 2, 4], 2) == [7, 0]  # "2 4" went on as "7"
    assert lk.draft([9], 2) == []  # a token never seen: no guess
    lk.add([5, 6])  # the window forgets the first answer
    lk.add([5, 6])
    assert lk.draft([], 2) == [5, 6] and lk.draft([1, 2], 1) == [3]


@pytest.mark.parametrize("prefill_draft,batch_draft", [(8, 0), (0, 4), (8, 4)])
def test_drafts_from_recent_answers_are_plain_greedy_decoding(ckpt, prefill_draft, batch_draft):
    """Answer tokens guessed from the backend's recent answers, checked inside the prompt's prefill or in
    a decoding forward of the whole batch, give the tokens, logprobs and finish reasons of plain decoding
    (greedy and sampled rows, stop strings, a token cap shorter than the guess) with fewer decoding
    forwards once the backend has seen the answers it guesses from."""
    kw = dict(max_batch=8, batch_wait_ms=50, speculate_tokens=0)
    draft = HFBackend.from_pretrained(ckpt, device="cpu", prefill_draft=prefill_draft, batch_draft=batch_draft, **kw)
    plain = HFBackend(draft.model, draft.processor, prefill_draft=0, batch_draft=0, **kw)
    reqs = [text_request(LONG + s) for s in ("", "", "Tap OK please", "hello", "")]
    scs = [SamplingConfig(temperature=0, max_new_tokens=40), SamplingConfig(temperature=0, max_new_tokens=3),
           SamplingConfig(temperature=1.0, max_new_tokens=40, seed=5), SamplingConfig(temperature=0, max_new_tokens=40),
           SamplingConfig(temperature=0, max_new_tokens=40)]
    draft.model._fw = 0
    hook = draft.model.register_forward_pre_hook(lambda m, a: setattr(m, "_fw", m._fw + 1))

    async def batch(be, scs):
        return [g for [g] in await asyncio.gather(*(be.generate([r], sc) for r, sc in zip(reqs, scs, strict=True)))]

    forwards = []
    for group in (scs, scs, [replace_stop(sc) for sc in scs]):
        results = {}
        for name, be in (("draft", draft), ("plain", plain)):
            before = be.model._fw
            results[name] = run(batch(be, group))
            forwards.append(be.model._fw - before)
        for x, y in zip(results["draft"], results["plain"], strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason and x.text == y.text
            assert x.prompt_tokens == y.prompt_tokens
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
    hook.remove()
    assert results["plain"][1].finish_reason == "length" and len(results["plain"][1].token_ids) == 3
    assert forwards[2] < forwards[3]  # the second round: the first round's answers are guessed
    assert draft.responses.draft([], 4) == list(results["plain"][0].token_ids[:4])


def replace_stop(sc: SamplingConfig) -> SamplingConfig:
    from dataclasses import replace

    return replace(sc, stop=("Contacts",))


def test_sampler_draws_from_the_nucleus_per_row_streams():
    import torch

    from mobilerl.models.sampler import Sampler

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    n = 4000
    cfgs = [SamplingConfig(temperature=0), SamplingConfig(temperature=1.0), SamplingConfig(temperature=1.0, top_p=0.7),
            SamplingConfig(temperature=1.0)]
    sampler = Sampler(cfgs, [1, 2, 3, 4], n, suppress=[3], device="cpu")
    rows = torch.arange(4)
    draws = torch.stack([sampler(logits, rows, t) for t in range(n)])  # (n, 4)
    assert (draws[:, 0] == 0).all()  # greedy
    assert not (draws == 3).any()  # suppressed, never drawn
    freq = torch.bincount(draws[:, 1], minlength=4).float() / n  # softmax without token 3: 0.5/.95, .3/.95, .15/.95
    np.testing.assert_allclose(freq[:3].numpy(), [0.526, 0.316, 0.158], atol=0.03)
    assert set(draws[:, 2].tolist()) == {0, 1}  # nucleus 0.7 of the renormalised probabilities: tokens 0 and 1
    # A row's draws depend on its seed, not on the other rows or their order.
    alone = Sampler([cfgs[3]], [4], n, suppress=[3], device="cpu")
    assert all(int(alone(logits[:1], torch.tensor([0]), t)) == int(draws[t, 3]) for t in range(50))


def test_text_requests_are_tokenized_as_the_processor_would(hf):
    req = text_request("Tap OK")
    text = hf.render(req)
    enc = hf._encode([text], [])
    assert enc["input_ids"][0].tolist() == hf.processor(text=[text], return_tensors="pt")["input_ids"][0].tolist()


def test_line_token_cache_gives_the_tokenizers_ids(hf):
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mobilerl.models.text_prefill import LineTokenCache

    assert hf.line_tokens is not None  # the project's tokenizer qualifies
    texts = [hf.render(text_request(s)) for s in ("", "Tap OK", "\n  indented\n\nafter a blank line", "x \ny\n")]
    texts += ["line one\n line two\n\tthree\nfour;;5,6;[7]\n\n\n", '<|im_start|>user\nhi "x"\n<|im_end|>\n', ""]
    for t in texts + texts:  # the second time from the cache
        ids = hf._encode([t], [])["input_ids"][0].tolist() if t else []
        assert hf.line_tokens(t) == ids == hf.tokenizer(t, add_special_tokens=False)["input_ids"]
    assert hf.line_tokens.hits > 0
    batch = hf._encode(texts[:3], [])  # left-padded as the tokenizer pads
    ref = hf.tokenizer(texts[:3], padding=True, padding_side="left", return_tensors="pt")
    assert batch["input_ids"].tolist() == ref["input_ids"].tolist()
    assert batch["attention_mask"].tolist() == ref["attention_mask"].tolist()
    # Tokenizers whose pieces would not concatenate to the whole are not taken.
    def fast(pre, norm=None):
        tk = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tk.pre_tokenizer = pre
        if norm is not None:
            tk.normalizer = norm
        return PreTrainedTokenizerFast(tokenizer_object=tk)

    assert LineTokenCache.for_tokenizer(fast(pre_tokenizers.Metaspace())) is None  # a space before every piece
    assert LineTokenCache.for_tokenizer(fast(pre_tokenizers.Whitespace(), normalizers.NFC())) is None
    assert LineTokenCache.for_tokenizer(fast(pre_tokenizers.ByteLevel(add_prefix_space=False))) is None  # looks ahead
    split = pre_tokenizers.Split(Regex(r"[A-Za-z]+|\d|\s+|[^\sA-Za-z\d]+"), "isolated")
    assert LineTokenCache.for_tokenizer(fast(pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))) is not None
    assert LineTokenCache.for_tokenizer(fast(pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]))) is None
    off = HFBackend(hf.model, hf.processor, line_token_cache=0)
    assert off.line_tokens is None


def test_answers_longer_than_the_decoding_room_grow_the_cache(hf, monkeypatch):
    """The batch cache starts with room for DECODE_ROOM new tokens and grows; the answers are those of a
    cache with room for every token from the start."""
    import mobilerl.models.hf_backend as hb

    reqs = [text_request(s) for s in ("", "Back", "Tap OK please")]
    scs = [SamplingConfig(temperature=0, max_new_tokens=40), SamplingConfig(temperature=1.0, max_new_tokens=40, seed=2),
           SamplingConfig(temperature=0, max_new_tokens=25)]
    be = HFBackend(hf.model, hf.processor, max_batch=8, batch_wait_ms=50, speculate_tokens=0)

    async def batch():
        return [g for [g] in await asyncio.gather(*(be.generate([r], sc) for r, sc in zip(reqs, scs, strict=True)))]

    results = {}
    for room in (3, 1000):
        monkeypatch.setattr(hb, "DECODE_ROOM", room)
        results[room] = run(batch())
    assert max(len(g.token_ids) for g in results[3]) > 3 * 3  # grew more than once
    for x, y in zip(results[3], results[1000], strict=True):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)


# ---------------------------------------------------------------------- OpenAI client, recorded


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def mock_client(handler, **kw) -> OpenAIBackend:
    return OpenAIBackend("http://vllm.test:8000", model="Qwen2.5-VL-7B-Instruct", transport=httpx.MockTransport(handler),
                         backoff_s=0.0, **kw)


def test_openai_client_parses_recorded_vllm_response():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer sk-test"
        return httpx.Response(200, json=recorded("chat_completion.json"))

    client = mock_client(handler, api_key="sk-test")
    gens = run(client.generate([image_request(), text_request()], SamplingConfig(temperature=1.0, seed=5, stop="\n")))
    g = gens[0]
    assert g.text == '<answer>do(action="Back")</answer>' and g.finish_reason == "stop"
    assert g.token_ids[:3] == [27, 9217, 29] and g.token_ids[-1] == 151645
    assert len(g.logprobs) == 12 and g.logprobs[0] == pytest.approx(-0.0213) and g.prompt_tokens == 1342
    p0, p1 = seen
    assert p0["logprobs"] is True and p0["return_tokens_as_token_ids"] is True and p0["stop"] == ["\n"]
    assert {p0["seed"], p1["seed"]} == {5, 6}  # request i: seed + i
    parts = next(p for p in (p0, p1) if isinstance(p["messages"][0]["content"], list))["messages"][0]["content"]
    assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1] == {"type": "text", "text": SCREEN}


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b.pop("choices"), "no choices"),
        (lambda b: b["choices"][0].update(logprobs=None), "no choices\\[0\\].logprobs.content"),
        (lambda b: b["choices"][0].update(finish_reason="tool_calls"), "unexpected finish_reason"),
        (lambda b: b["choices"][0]["logprobs"]["content"][2].update(logprob="x"), r"logprobs.content\[2\]"),
        (lambda b: b["choices"][0]["message"].update(content=7), "not a string"),
    ],
)
def test_malformed_responses_raise_clear_errors(mutate, match):
    body = recorded("chat_completion.json")
    mutate(body)
    with pytest.raises(GenerationError, match=match):
        parse_chat_completion(body)


def test_http_errors_retries_and_non_json():
    calls = {"n": 0}

    def flaky(request):
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("connection refused")
        if calls["n"] == 2:
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, json=recorded("chat_completion.json"))

    [g] = run(mock_client(flaky, max_retries=2).generate([text_request()], SamplingConfig()))
    assert calls["n"] == 3 and g.finish_reason == "stop"
    down = mock_client(lambda r: httpx.Response(502, text="bad gateway"), max_retries=2)
    with pytest.raises(GenerationError, match="failed after 3 attempts; last error: HTTP 502: bad gateway"):
        run(down.generate([text_request()], SamplingConfig()))
    bad = mock_client(lambda r: httpx.Response(400, json={"error": {"message": "max_tokens too large"}}))
    with pytest.raises(GenerationError, match="HTTP 400.*max_tokens too large"):
        run(bad.generate([text_request()], SamplingConfig()))
    html = mock_client(lambda r: httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(GenerationError, match="non-JSON"):
        run(html.generate([text_request()], SamplingConfig()))


def test_openai_score_on_recorded_prompt_logprobs():
    base = recorded("prompt_logprobs.json")
    head = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]  # ...<|im_start|>assistant\n
    completion = [2982, 15294]
    tail = [151645, 198]

    def entries(ids):
        return [None] + [{str(t): {"logprob": -0.01 * (i + 1), "rank": 1, "decoded_token": "x"}}
                         for i, t in enumerate(ids[1:])]

    def handler(request):
        p = json.loads(request.content)
        assert p["prompt_logprobs"] == 0 and p["max_tokens"] == 1 and "top_logprobs" not in p
        ids = head if p["add_generation_prompt"] else head + completion + ([] if p["continue_final_message"] else tail)
        return httpx.Response(200, json={**base, "prompt_logprobs": entries(ids)})

    out = run(mock_client(handler).score(text_request(), "do("))
    n = len(head)
    assert out == pytest.approx([-0.01 * n, -0.01 * (n + 1), -0.01 * (n + 2)])
    ids, lps = parse_prompt_logprobs(base)
    assert ids[:3] == [None, 872, 198] and lps[0] is None and lps[1] == pytest.approx(-9.4712)

    def misaligned(request):
        p = json.loads(request.content)
        ids = head if p["add_generation_prompt"] else [*head[:-1], 999, *completion, *tail]
        return httpx.Response(200, json={**base, "prompt_logprobs": entries(ids)})

    with pytest.raises(GenerationError, match="do not line up"):
        run(mock_client(misaligned).score(text_request(), "do("))
    with pytest.raises(GenerationError, match="no prompt_logprobs"):
        run(mock_client(lambda r: httpx.Response(200, json=base | {"prompt_logprobs": None})).score(text_request(), "x"))
    with pytest.raises(ValueError, match="temperature 1"):
        run(mock_client(handler).score(text_request(), "x", temperature=0.5))


# ----------------------------------------------------------- end to end: client -> server -> HF


def test_openai_client_through_serve_openai_matches_hf(hf):
    client = OpenAIBackend("http://mobilerl.test", transport=httpx.ASGITransport(app=create_app(hf, model_name="tiny")))
    reqs = [text_request(), image_request()]
    for sc in (SamplingConfig(temperature=1.0, max_new_tokens=10, seed=21),
               SamplingConfig(temperature=0.0, max_new_tokens=10)):
        direct = run(hf.generate(reqs, sc))
        remote = run(client.generate(reqs, sc))
        for d, r in zip(direct, remote, strict=True):
            assert (d.text, d.token_ids, d.finish_reason) == (r.text, r.token_ids, r.finish_reason)
            np.testing.assert_allclose(r.logprobs, d.logprobs, atol=1e-4)
    for req in reqs:
        np.testing.assert_allclose(
            run(client.score(req, 'do(action="Back")')), run(hf.score(req, 'do(action="Back")')), atol=1e-4
        )


def test_serve_openai_over_a_real_socket_with_a_token(hf):
    with ServerThread(hf, model_name="tiny", api_key="s3cret") as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        good = OpenAIBackend(srv.base_url, api_key="s3cret", max_retries=0)
        assert run(good.model_name()) == "tiny"
        [g] = run(good.generate([text_request()], SamplingConfig(temperature=0, max_new_tokens=4)))
        [d] = run(hf.generate([text_request()], SamplingConfig(temperature=0, max_new_tokens=4)))
        assert g.token_ids == d.token_ids
        with pytest.raises(GenerationError, match="HTTP 401"):
            run(OpenAIBackend(srv.base_url, model="tiny", api_key="wrong", max_retries=0).generate(
                [text_request()], SamplingConfig(max_new_tokens=2)))
        r = httpx.post(f"{srv.base_url}/chat/completions", headers={"Authorization": "Bearer s3cret"},
                       json={"messages": [{"role": "user", "content": [
                           {"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}]}]})
        assert r.status_code == 400 and "data: image URLs" in r.json()["error"]["message"]
        for body, status in (({"messages": [{"role": "user", "content": "x"}], "stream": True}, 400),
                             ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}, 404),
                             ({"messages": []}, 400)):
            r = httpx.post(f"{srv.base_url}/chat/completions", headers={"Authorization": "Bearer s3cret"}, json=body)
            assert r.status_code == status, r.text


# ------------------------------------------------------------------------------- make_backend


def test_make_backend_builds_and_names_bad_keys(ckpt, monkeypatch):
    assert isinstance(make_backend({"kind": "hf", "model": str(ckpt), "max_batch": 4}), HFBackend)
    monkeypatch.setenv("TEST_KEY", "k")
    ob = make_backend({"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "TEST_KEY"})
    assert isinstance(ob, OpenAIBackend) and ob.api_key == "k"
    with pytest.raises(ValueError, match="generation.max_btach: unknown key for kind 'hf'"):
        make_backend({"kind": "hf", "model": str(ckpt), "max_btach": 4})
    with pytest.raises(ValueError, match="generation.base_url: required"):
        make_backend({"kind": "openai"})
    with pytest.raises(ValueError, match="generation.kind must be one of"):
        make_backend({"kind": "tgi"})
    with pytest.raises(ValueError, match="generation.prefix_cache_tokens: Input should be greater than or equal to 0"):
        make_backend({"kind": "hf", "model": str(ckpt), "prefix_cache_tokens": -1})
    with pytest.raises(ValueError, match="generation.fast_prefil: unknown key for kind 'hf'"):
        make_backend({"kind": "hf", "model": str(ckpt), "fast_prefil": False})
    with pytest.raises(ValueError, match="NOPE_KEY"):
        make_backend({"kind": "openai", "base_url": "http://x", "api_key_env": "NOPE_KEY"})
    from mobilerl.models.vllm_backend import vllm_available

    if not vllm_available():
        with pytest.raises(ImportError, match="GPU extra"):
            make_backend({"kind": "vllm", "model": str(ckpt)})


def test_cuda_model_calls_leave_out_cudnn_attention():
    """On CUDA the backend's model calls exclude cuDNN SDPA (a plan per sequence length: 9x slower bf16 on
    an H200, docs/evaluation.md); the choice is scoped to the call and CPU calls are untouched."""
    import torch

    from mobilerl.models.hf_backend import attention_kernels

    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    with attention_kernels(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled()) == before
    with attention_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before[0]


# ----------------------------------------------------------------------------------------- vLLM


@pytest.mark.gpu
def test_vllm_backend_agrees_with_hf(ckpt):
    from mobilerl.models.vllm_backend import VLLMBackend, vllm_available

    if not vllm_available():
        pytest.skip("needs CUDA and vLLM (the gpu extra)")
    vb = VLLMBackend(ckpt, dtype="fp32", gpu_memory_utilization=0.3, max_model_len=2048,
                     engine_kwargs={"enforce_eager": True})
    hb = HFBackend.from_pretrained(ckpt, device="cuda")
    reqs = [text_request(), image_request()]
    sc = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=1)
    gens = run(vb.generate(reqs, sc))
    for req, g in zip(reqs, gens, strict=True):
        assert len(g.token_ids) == len(g.logprobs) >= 1
        np.testing.assert_allclose(run(hb.score(req, g.token_ids)), g.logprobs, atol=2e-3)
        np.testing.assert_allclose(run(vb.score(req, g.token_ids)), g.logprobs, atol=2e-3)
    assert [g.token_ids for g in run(vb.generate(reqs, sc))] == [g.token_ids for g in gens]  # seeded


# ------------------------------------------------------------------------------- load_weights


def test_load_weights_swaps_in_the_files_weights_and_refuses_other_shapes(ckpt, tmp_path):
    """``HFBackend.load_weights``: generation after the load gives the new weights' logprobs (the prefix cache
    holds none of the old keys), whether the file stores a tied tensor under either name; a file of another
    shape is refused naming the parameter, and the weights stay."""
    import copy

    import torch
    from safetensors.torch import save_file, save_model

    backend = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=4, batch_wait_ms=1)
    new = copy.deepcopy(backend.model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5, alpha=1.0)
    save_model(new, str(tmp_path / "new.safetensors"))  # tied embeddings once (the trainer's writer)
    reference = HFBackend(new, backend.processor, max_batch=4, batch_wait_ms=1)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8, seed=0)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=5)

    async def logprobs(b: HFBackend) -> list[list[float]]:
        gens = await b.generate([text_request(), text_request(" again")], greedy)
        gens += await b.generate([text_request()], sampled)
        return [g.logprobs for g in gens]

    before = run(logprobs(backend))  # also fills the prefix cache with the old weights' keys
    want = run(logprobs(reference))
    assert not np.allclose(before[0], want[0], atol=1e-3)
    run(asyncio.to_thread(backend.load_weights, tmp_path / "new.safetensors"))
    got = run(logprobs(backend))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)

    # a tied tensor under its other name (save_file of the full state dict minus one alias) loads the same
    state = {k: v.contiguous() for k, v in backend.model.state_dict().items()}
    tied = [k for k in state if state[k].data_ptr() == state.get("lm_head.weight", torch.empty(0)).data_ptr()]
    if len(tied) > 1:
        save_file({k: v.clone() for k, v in state.items() if k != tied[0]}, str(tmp_path / "alias.safetensors"))
        backend.load_weights(tmp_path / "alias.safetensors")

    bad = {k: v.clone() for k, v in new.state_dict().items() if k != "lm_head.weight"}
    name = next(k for k in bad if k.endswith("embed_tokens.weight"))
    bad[name] = bad[name][:-1]
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match=f"{name}: shape"):
        backend.load_weights(tmp_path / "bad.safetensors")
    np.testing.assert_allclose(run(logprobs(backend))[0], want[0], atol=1e-4)
    run(backend.aclose())
    run(reference.aclose())
