"""The official MobileRL format as prompt style ``mobilerl``: its observation tree, its chat, its answers, and
an evaluation of a "released checkpoint" through the OpenAI-compatible backend on recorded responses."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from mobilerl.agent import prompt as P
from mobilerl.env.actions import ActionParseError
from mobilerl.env.xml import TREE_HEADER, compress_tree
from mobilerl.models.generation import ChatRequest, Generation, SamplingConfig, content_parts

FIX = Path(__file__).parent / "fixtures"
RESPONSES = json.loads((FIX / "mobilerl" / "responses.json").read_text())


@pytest.mark.parametrize("dump, tree", [("messages_chat_dump.xml", "messages_chat_tree.txt"),
                                        ("device_settings_dump.xml", "device_settings_tree.txt"),
                                        ("mobilerl/corner_cases_dump.xml", "corner_cases_tree.txt")])
def test_tree_is_the_official_harness_observation(dump, tree):
    # recorded: THUDM/MobileRL android_lab/utils_mobile/xml_tool.py, UIXMLTree(xml_version="v4").process(dump,
    # level=1, str_type="plain_text", width=1080, height=2400)[0].strip() (it also matched on 377 simulator screens)
    expected = (FIX / "mobilerl" / tree).read_text().rstrip("\n")
    assert compress_tree((FIX / dump).read_text(), 1080, 2400) == expected


def test_tree_corner_cases_read_as_intended():
    lines = compress_tree((FIX / "mobilerl" / "corner_cases_dump.xml").read_text(), 1080, 2400).split("\n")
    assert "\n".join(lines[:2]) == TREE_HEADER
    assert "    LinearLayout;click;Vibrate| On for all alarms;[0,416,999,499]" in lines  # labels absorbed
    assert "        Switch;click check checked;ON;[814,437,962,478]" in lines  # a clickable child stays
    assert "        TextView;;Empty list;[0,420,1080,1000]" in lines  # a repeated grid box keeps its pixels
    assert not any("dot" in t or "Off the left edge" in t for t in lines)  # too small; negative x
    assert lines[-2:] == ["        TextView;;Alarm 07:30;[37,49,555,83]", "    TextView;;Past the bottom;[0,957,999,1040]"]
    with pytest.raises(ValueError, match="screen size"):
        compress_tree("<hierarchy/>", 0, 2400)


def test_chat_layout_follows_the_official_harness():
    # observed: THUDM/MobileRL android_lab/evaluation/evaluation.py Multi_ScreenshotTask.run_step with the
    # AndroidWorld config (picture_round 2, with_xml), android_lab/agent/model.py RLAgent.prompt_to_message
    first = P.mobilerl_messages("Mark Rafael as a favorite.", [], [], "Home", "TREE0")
    assert [m["role"] for m in first] == ["system", "user"] and first[0]["content"] == P.MOBILERL_SYSTEM_PROMPT
    assert first[1]["content"] == '<image>Mark Rafael as a favorite.\n\n{"current_app": "Home"}\nTREE0'
    second = P.mobilerl_messages("Mark Rafael as a favorite.", ["R0"], ["Home"], "Contacts", "TREE1")
    assert [m["content"] for m in second[1:]] == [
        '<image>Mark Rafael as a favorite.\n\n{"current_app": "Contacts"}',  # shown again: names the current app
        "R0", '<image>** Screen Info **\n\n{"current_app": "Contacts"}\nTREE1']
    fourth = P.mobilerl_messages("Task", ["R0", "R1", "R2"], ["Home", "Contacts", "Contacts"], "Contacts", "T3",
                                 system="OFFICIAL")
    assert fourth[0]["content"] == "OFFICIAL"
    assert [m["content"] for m in fourth[1:]] == [
        'Task\n\n{"current_app": "Home"}', "R0", '** Screen Info **\n\n{"current_app": "Contacts"}', "R1",
        '<image>** Screen Info **\n\n{"current_app": "Contacts"}', "R2",
        '<image>** Screen Info **\n\n{"current_app": "Contacts"}\nT3']
    assert sum(m["content"].count(P.IMAGE_TOKEN) for m in fourth) == 2
    no_images = P.mobilerl_messages("Task", ["R0"], ["Home"], "Home", "T1", screenshots=False)
    assert P.IMAGE_TOKEN not in json.dumps(no_images)
    with pytest.raises(ValueError, match="one app per earlier step"):
        P.mobilerl_messages("Task", ["R0"], [], "Home")
    with pytest.raises(ValueError, match="multi-turn"):
        P.build_messages("Task", style="mobilerl")


@pytest.mark.parametrize("response, expected", [
    # the official format (android_lab/templates/android_screenshot_template.py AW_SYSTEM_PROMPT_THINKING) and
    # its executor's grid (android_lab/page_executor/text_executor.py TextOnlyExecutor_v4: v * size / 999)
    (RESPONSES["world/test/ContactsFavorite/0"][1], 'do(action="Tap", element=[0,2052,1080,2201])'),
    ('<think>\nScroll the list.\n</think>\n<answer>\ndo(action="Swipe", direction="up", dist="long", '
     'element=[0, 126, 999, 869])\n</answer>', 'do(action="Swipe", element=[0,303,1080,2088], direction="up", '
                                               'dist="long")'),
    ('<think>\nA box past 999 is pixels already.\n</think>\n<answer>\ndo(action="Tap", element=[0, 420, 1080, 1000])'
     '\n</answer>', 'do(action="Tap", element=[0,420,1080,1000])'),
    (RESPONSES["world/test/FilesSizeQuery/0"][-1], 'finish(message="1.39 MB")'),
    ('<think>\nx\n</think>\n<answer>\ndo(action="Type", text="Hello World")\n</answer>',
     'do(action="Type", text="Hello World")'),
])
def test_answers_convert_to_env_pixels(response, expected):
    assert P.mobilerl_action_to_env(response, (1080, 2400)) == expected


def test_an_answer_without_an_action_is_an_invalid_step():
    with pytest.raises(ActionParseError):
        P.mobilerl_action_to_env("<think>\nI am not sure.\n</think>\n<answer>\n\n</answer>", (1080, 2400))


def test_profile_and_policy_insist_on_the_grid(tmp_path, monkeypatch):
    import mobilerl.models.profiles as profiles
    from mobilerl.agent.model_policy import ModelPolicy

    g = profiles.load_profile("mobilerl_9b").generation
    assert (g.kind, g.prompt_style, g.coords, g.obs_mode) == ("openai", "mobilerl", "rel", "screenshot+xml")
    monkeypatch.setattr(profiles, "PROFILES", tmp_path)
    (tmp_path / "x.yaml").write_text("name: x\nweights: w\ntemplate: t\nimage_max_pixels: 10\nimage_min_pixels: 1\n"
                                     "generation: {prompt_style: mobilerl, coords: abs}\n")
    with pytest.raises(ValueError, match="coords must be rel"):
        profiles.load_profile("x")
    with pytest.raises(ValueError, match="coords must be 'rel'"):
        ModelPolicy(backend=None, prompt_style="mobilerl")  # type: ignore[arg-type]


class RecordedModel:
    """A stand-in for the released checkpoint: answers each episode (found by its instruction) with its
    recorded responses, in order; keeps every request it was sent."""

    def __init__(self, by_instruction: dict[str, list[str]]) -> None:
        self.by_instruction, self.requests = by_instruction, []

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for r in requests:
            self.requests.append(r)
            first = next(p["text"] for p in content_parts(r.messages[1]["content"]) if p["type"] == "text")
            answers = self.by_instruction[first.split("\n\n")[0]]
            text = answers[sum(m["role"] == "assistant" for m in r.messages)]
            out.append(Generation(text, [ord(c) for c in text], [-0.01] * len(text), "stop"))
        return out


def test_evaluate_a_released_checkpoint_through_the_openai_backend(tmp_path, monkeypatch):
    """`evaluate`'s checkpoint policy for the mobilerl_9b profile, served by an OpenAI-compatible server (here
    one answering recorded responses), solves the two episodes the responses were written for."""
    import mobilerl.models.profiles as profiles
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.eval.checkpoints import checkpoint_policy
    from mobilerl.eval.config import EvaluateConfig, check_policies
    from mobilerl.eval.runner import evaluate_sync
    from mobilerl.models.serve_openai import ServerThread

    tasks = [get_task(t, with_optimal=False) for t in RESPONSES]
    model = RecordedModel({t.instruction: RESPONSES[t.task_id] for t in tasks})
    with ServerThread(model, model_name="MobileRL-9B") as srv:  # type: ignore[arg-type]
        text = (profiles.PROFILES / "mobilerl_9b.yaml").read_text()
        (tmp_path / "official.txt").write_text("OFFICIAL PROMPT\n")  # the harness' own text, saved by the user
        text = re.sub(r"base_url: \S+", f"base_url: {srv.base_url}", text)
        text = re.sub(r"# system_prompt_file: \S+", f"system_prompt_file: {tmp_path / 'official.txt'}", text)
        (tmp_path / "mobilerl_9b.yaml").write_text(text)
        monkeypatch.setattr(profiles, "PROFILES", tmp_path)
        cfg = EvaluateConfig(profile="mobilerl_9b", policies=["mobilerl"], checkpoints={"mobilerl": "MobileRL-9B"},
                             temperature=0.0)
        check_policies(cfg)  # no model directory needed: the server holds the weights
        policy = checkpoint_policy("mobilerl", cfg.checkpoints["mobilerl"], cfg)
        trajs = evaluate_sync(policy.with_seed, tasks, env_factory=lambda: SimEnv(render=True, perturb="none"),
                              progress=False, concurrency=2)
    assert [(t.success, t.n_steps) for t in trajs] == [(True, 4), (True, 4)], [t.error for t in trajs]
    assert trajs[1].answer == "1.39 MB"
    steps = sorted(model.requests, key=lambda r: len(r.messages))
    assert [len(r.images or []) for r in steps] == [1, 1, 2, 2, 2, 2, 2, 2]  # the last two screens
    last = steps[-1].messages
    assert last[0]["content"] == "OFFICIAL PROMPT" and len(last) == 8
    assert last[-1]["content"].split("\n")[3] == TREE_HEADER.split("\n")[0]
