"""Reasoning SFT data: matching, the simulator teacher, bootstrap filtering, refinement selection."""

from __future__ import annotations

import asyncio

import pytest

from mobilerl.agent import OraclePolicy
from mobilerl.env.actions import Action, parse_action
from mobilerl.env.sim.tasks import get_task
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import ChatRequest, Generation, SamplingConfig
from mobilerl.sft.reasoning import (
    PromptFormat,
    SimTeacher,
    actions_match,
    bootstrap_select,
    canonical_response,
    expert_episodes,
    expert_steps,
    propose,
    reasoning_records,
    refine_select,
)


@pytest.fixture(scope="module")
def trajs():
    tasks = [get_task(f"world/train/{n}/0", with_optimal=False)
             for n in ("ContactsAddContact", "ContactsEmailLookup", "ContactsDeleteContact")]
    trajs = evaluate_sync(lambda seed: OraclePolicy(), tasks, perturb="none", progress=False)
    assert all(t.success for t in trajs)
    return trajs


@pytest.fixture(scope="module")
def steps(trajs):
    return expert_steps(trajs)


def test_actions_match():
    tap = Action("Tap", element=(1, 2, 3, 4))
    assert actions_match(tap, Action("Tap", element=(1, 2, 3, 4)))
    assert not actions_match(tap, Action("Tap", element=(1, 2, 3, 5)))
    assert not actions_match(tap, Action("Long Press", element=(1, 2, 3, 4)))
    assert actions_match(Action("Launch", app="contacts"), Action("Launch", app="Contacts"))
    assert actions_match(Action("Finish", message="A@b.com."), Action("Finish", message="a@b.com"))
    assert not actions_match(Action("Type", text="Ada"), Action("Type", text="ada"))


def test_teacher_explains_and_sometimes_argues_wrong(steps):
    teacher = SimTeacher(p_wrong=0.3)
    for st in steps:
        teacher.register(st)
    cands = asyncio.run(propose(teacher, steps, k=6, sampling=SamplingConfig(temperature=1.0, seed=7)))
    flat = [c for cs in cands for c in cs]
    assert all("<think>" in c.text and "<answer>" in c.text for c in flat)
    assert all(c.action is not None for c in flat)  # the teacher's outputs always parse
    share = sum(c.accepted for c in flat) / len(flat)
    assert 0.5 < share < 0.9  # p_wrong = 0.3 of the proposals argue for another action
    chosen, stats = bootstrap_select(steps, cands)
    assert stats.acceptance_rate > 0.9 and stats.candidates == 6 * len(steps)
    for st in steps:  # every kept explanation ends in the expert's action
        if st.step_id in chosen:
            assert actions_match(parse_action(chosen[st.step_id]), st.action)
    tap_steps = [st for st in steps if st.action.name == "Tap"]
    texts = " ".join(chosen[st.step_id] for st in tap_steps if st.step_id in chosen)
    assert "Create contact" in texts  # it names the element it taps, read off the screen
    # same seed, same proposals
    again = asyncio.run(propose(teacher, steps, k=6, sampling=SamplingConfig(temperature=1.0, seed=7)))
    assert [c.text for cs in again for c in cs] == [c.text for c in flat]
    with pytest.raises(KeyError, match="register"):
        asyncio.run(SimTeacher().generate([ChatRequest(steps[0].messages())], SamplingConfig(seed=0)))


def test_terse_teacher_does_not_restate_the_task(steps):
    goal = ("The task:", "I need to:", "Goal —")
    texts = {}
    for restate in (1.0, 0.0):
        teacher = SimTeacher(p_wrong=0.0, restate_task=restate)
        for st in steps:
            teacher.register(st)
        cands = asyncio.run(propose(teacher, steps, k=2, sampling=SamplingConfig(temperature=1.0, seed=3)))
        texts[restate] = [c.text for cs in cands for c in cs]
    assert all(any(g in t for g in goal) for t in texts[1.0])
    assert not any(g in t for t in texts[0.0] for g in goal)
    assert all("<think>" in t for t in texts[0.0])  # still an explanation: the screen, the target, why
    with pytest.raises(ValueError, match="restate_task"):
        SimTeacher(restate_task=1.5)


def test_target_style_names_a_unique_target_in_the_bases_question_words(steps):
    import re

    teacher = SimTeacher(p_wrong=0.0, style="target")
    for st in steps:
        teacher.register(st)
    cands = asyncio.run(propose(teacher, steps, k=1, sampling=SamplingConfig(temperature=1.0, seed=1)))
    by_kind: dict[str, list[str]] = {}
    for st, [c] in zip(steps, cands, strict=True):
        assert c.accepted
        think = c.text.split("<think>")[1].split("</think>")[0]
        by_kind.setdefault(st.action.name, []).append(think)
        if st.action.name == "Tap":
            m = re.search(r'tap "([^"]+)"(?: of "([^"]+)")?$', think)
            assert m, think
            labels = [ln.split(";")[2] for ln in st.xml_compressed.splitlines() if ln.count(";") >= 3]
            # the name picks out one line: unique itself, or qualified by a unique neighbour
            assert labels.count(m.group(1)) == 1 or (m.group(2) and labels.count(m.group(2)) == 1), think
        if st.action.name == "Type":
            assert think.endswith(f'type "{st.action.text}"')
    assert any(t.endswith('tap "Create contact"') for t in by_kind["Tap"])
    assert all(t.endswith("open Contacts") for t in by_kind["Launch"])
    with pytest.raises(ValueError, match="style"):
        SimTeacher(style="poetry")


class _Scorer:
    """A policy stand-in whose score prefers longer explanations; proposes the expert action twice."""

    def __init__(self, steps):
        self.by_prompt = {st.messages()[1]["content"]: st for st in steps}

    async def generate(self, requests, sampling):
        st = self.by_prompt[requests[0].messages[1]["content"]]
        call = str(st.action)
        texts = [f"<think>short</think><answer>{call}</answer>",
                 f"<think>a much longer explanation</think><answer>{call}</answer>",
                 "<answer>do(action=\"Back\")</answer>", "garbage"]
        return [Generation(texts[i % 4], [], [], "stop") for i in range(len(requests))]

    async def score(self, request, completion, *, temperature=1.0):
        return [-1.0 / len(completion)] * 3


def test_refinement_keeps_the_best_scored_explanation(steps):
    policy = _Scorer(steps)
    cands = asyncio.run(propose(policy, steps, k=4, sampling=SamplingConfig(seed=1)))
    current = {st.step_id: "<think>old</think><answer>x</answer>" for st in steps}
    updated, stats = asyncio.run(refine_select(policy, steps, cands, current, round_no=1))
    assert stats.round == 1 and stats.acceptance_rate == 1.0 and stats.parse_failures == len(steps)
    assert all("much longer" in updated[st.step_id] for st in steps)


def test_reasoning_records_carry_the_kept_explanations_in_their_histories(trajs):
    ep = expert_episodes(trajs)[0]
    assert len(ep) >= 3 and ep[0].action.name == "Launch"
    explained = {ep[0].step_id: '<think>open it</think><answer>do(action="Launch", app="contacts")</answer>',
                 ep[2].step_id: f"<think>why 2</think><answer>{ep[2].action}</answer>",
                 ep[1].step_id: f"<answer>{ep[1].action}</answer>"}  # no think: not a reasoning sample
    fmt = PromptFormat("xml", "compact", None)
    recs = reasoning_records([ep], explained, fmt)
    assert len(recs) == 2
    first, third = (r["messages"] for r in recs)
    assert first[0]["content"] == third[0]["content"] and "<think>" in first[0]["content"]  # reasoning, compact
    # the response names the expert's action as the expert spelled it (the match was case-insensitive)
    assert first[2]["content"] == canonical_response(explained[ep[0].step_id], ep[0].action)
    assert 'app="Contacts"' in first[2]["content"] and first[2]["content"].startswith("<think>open it</think>")
    user = third[1]["content"]
    assert f"Step 1: {first[2]['content']}" in user  # an explained step shows its explanation
    assert f"Step 2: <answer>{ep[1].action}</answer>" in user  # an unexplained one its bare answer
    last_only = reasoning_records([ep], explained, PromptFormat("xml", "compact", 1))[1]["messages"][1]["content"]
    assert "(the last 1):\nStep 1: <answer>" in last_only and "Step 2:" not in last_only
    # the SFT dataset's action_weights carry over: a Launch step weighted 3 appears three times
    weighted = reasoning_records([ep], explained, fmt, {"Launch": 3.0, "Finish": 0.0})
    assert len(weighted) == 4 and weighted[:3] == [recs[0]] * 3 and weighted[3] == recs[1]
    with pytest.raises(ValueError, match="unknown action name"):
        reasoning_records([ep], explained, fmt, {"launch": 2.0})
    with pytest.raises(ValueError, match="prompt style"):
        PromptFormat("xml", "tiny")


def test_marks_frame_teacher_answers_with_the_experts_line(trajs):
    """In the marks frame the steps show numbered lines, the expert's taps name a line, and the teacher,
    reasoning in pixels, answers with that line's index (and a wrong tap names another line)."""
    assert not actions_match(Action("Tap", index=3), Action("Tap", index=4))
    eps = expert_episodes(trajs, coords="marks")
    steps = [st for ep in eps for st in ep]
    fmt = PromptFormat("xml", "compact", 4, "marks")
    taps = [st for st in steps if st.action.name == "Tap"]
    assert taps and all(st.action.index is not None and st.action.element is None for st in taps)
    for st in taps:  # the index names the line whose pixel box the expert tapped
        line = st.xml_compressed.splitlines()[st.action.index]
        assert line.endswith(f"[{st.action.index}]")
        assert st.screen_px.splitlines()[st.action.index].endswith(
            "[{},{}][{},{}]".format(*st.action_px.element))
    assert "Class;flags;label;[index]" in taps[0].messages(fmt)[1]["content"]
    teacher = SimTeacher(p_wrong=0.5)
    for st in steps:
        teacher.register(st, fmt)
    cands = asyncio.run(propose(teacher, steps, k=4, sampling=SamplingConfig(temperature=1.0, seed=2), fmt=fmt))
    flat = [(st, c) for st, cs in zip(steps, cands, strict=True) for c in cs]
    assert all(c.action.element is None for _, c in flat)  # no pixel box leaks into a marks answer
    right = [(st, c) for st, c in flat if c.accepted]
    assert right and all(c.action == st.action for st, c in right)
    assert any(c.action.name == "Tap" and not c.accepted for _, c in flat)


def test_bootstrap_with_an_instruct_model_behind_an_openai_server(tmp_path):
    """The 7B profile's reasoning stage with its M, an instruct VLM behind an OpenAI-compatible server (here a
    loopback server answering with chat completions in vLLM's shapes, tests/fixtures/vllm/teacher_responses.json):
    M sees the screenshot, the full prompt and the thought's budget, and is capped at it; a thought inline, one the
    server's reasoning parser returned apart, and GLM's boxed answer are kept in the paper's format; a response
    cut at the budget and one without a thought are rejected."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    from mobilerl.config import ParamsError, checked_settings
    from mobilerl.data.store import write_store
    from mobilerl.env.actions import format_action
    from mobilerl.models.profiles import load_profile
    from mobilerl.sft.bootstrap import BootstrapConfig, bootstrap
    from mobilerl.sft.reasoning import episodes_by_split

    tasks = [get_task(f"world/train/{n}/0", with_optimal=False) for n in ("ClockStopWatchRunning", "ContactsAddContact")]
    trajs = evaluate_sync(lambda seed: OraclePolicy(), tasks, perturb="none", progress=False,
                          obs_mode="screenshot+xml", keep_screenshots_dir=tmp_path / "screens")
    assert all(t.success for t in trajs)
    stores = tmp_path / "stores"
    write_store(stores / "collected", trajs)
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "stats.json").write_text(json.dumps({"mode": "screenshot+xml", "prompt_style": "full", "max_history": None,
                                                "coords": "abs", "val_fraction": 0.0, "seed": 0,
                                                "sources": {"collected": {}}}))
    fmt = PromptFormat("screenshot+xml", "full")
    expert = {st.messages(fmt)[1]["content"].replace("<image>", ""): format_action(st.action)  # what M is shown
              for ep in episodes_by_split({"collected": stores / "collected"}, 0.0, 0)["train"] for st in ep}
    fixtures = json.loads((Path(__file__).parent / "fixtures" / "vllm" / "teacher_responses.json").read_text())
    order = ["inline", "reasoning_parser", "glm_box", "truncated", "no_thought"]
    budget = load_profile("qwen2_5_vl_7b").reasoning
    seen: list[dict] = []
    lock = threading.Lock()

    class Server(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            system, user = body["messages"]
            text = "".join(p["text"] for p in user["content"] if p["type"] == "text")
            n = body["seed"]  # the step's seed + the candidate's index (steps' seeds are 1000 apart)
            with lock:
                seen.append({"user": text, "system": system["content"], "body": body,
                             "images": [p for p in user["content"] if p["type"] == "image_url"]})
            reply = json.loads(json.dumps(fixtures[order[n % len(order)]]).replace("{call}",
                                                                                    expert[text].replace('"', '\\"')))
            msg = reply["choices"][0]["message"]
            words = (msg["reasoning_content"] or "").split() + msg["content"].split()
            reply["choices"][0]["logprobs"]["content"] = [{"token": w, "logprob": -0.1} for w in words]
            out = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        teacher = {**budget.teacher, "base_url": f"http://127.0.0.1:{server.server_port}/v1", "max_retries": 0}
        cfg = BootstrapConfig(profile="qwen2_5_vl_7b", reasoning_overrides={"teacher": teacher}, k=len(order))
        m = bootstrap(cfg, sft, stores, tmp_path / "out")
    finally:
        server.shutdown()

    n_steps = len(expert)
    assert m["teacher"] == "openai" and m["steps"] == n_steps and len(seen) == n_steps * len(order)
    assert m["acceptance_rate"] == 1.0 and m["candidate_acceptance"] == pytest.approx(3 / 5)
    assert m["truncated_rate"] == pytest.approx(1 / 5)
    for s in seen:  # the screenshot, the full prompt, the budget stated and enforced
        assert len(s["images"]) == 1 and s["images"][0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert "Actions:" in s["system"] and "within 512 tokens" in s["system"]
        assert s["body"]["max_tokens"] == budget.max_new_tokens == 576
        assert s["body"]["model"] == "Qwen2.5-VL-7B-Instruct"
    verdicts = [json.loads(x) for x in (tmp_path / "out" / "proposals.jsonl").read_text().splitlines()]
    assert [v["accepted"] for v in verdicts[:len(order)]] == [True, True, True, False, False]
    records = json.loads((tmp_path / "out" / "train.json").read_text())
    assert len(records) == n_steps and all(r["images"] for r in records)
    thoughts = {r["messages"][2]["content"].split("</think>")[0] for r in records}
    calls = {r["messages"][2]["content"].split("<answer>")[1] for r in records}
    assert calls == {f"{c}</answer>" for c in expert.values()}  # the expert's call, no box markers, no padding
    assert any("reasoning parser" in t or "the element is visible" in t for t in thoughts)
    assert all(r["messages"][2]["content"].startswith("<think>") and "<|" not in r["messages"][2]["content"]
               for r in records)

    with pytest.raises(ParamsError, match=r"reasoning_bootstrap\.reasoning_overrides\.think_tokens"):
        checked_settings(BootstrapConfig(profile="qwen2_5_vl_7b", reasoning_overrides={"think_tokens": 0}),
                         "reasoning_bootstrap", "reasoning_overrides", "reasoning")
    with pytest.raises(ParamsError, match=r"reasoning_overrides\.teacher.*unknown key 'p_wrongg'"):
        checked_settings(BootstrapConfig(reasoning_overrides={"teacher": {"kind": "sim", "p_wrongg": 0.5}}),
                         "reasoning_bootstrap", "reasoning_overrides", "reasoning")
