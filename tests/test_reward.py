"""The reward model's pieces: the renderer draws each action, labels come from the end state (not the finish
message), the judge scores from logprobs or votes (recorded OpenAI-format responses, no network), the metrics."""

from __future__ import annotations

import asyncio
import functools
import json
import math
from pathlib import Path

import httpx
import pytest
from PIL import Image

from mobilerl.eval.render import TAP_COLOUR, describe_action, draw_action, render_png, text_form
from mobilerl.reward import judge as J
from mobilerl.trajectory import StepRecord, Trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "reward"
SCREEN = "TextView;clickable;Save;[100,200][500,300]\nTextView;;Groceries;[0,400][1080,500]"


def _traj(instruction: str = "add milk to Groceries", finished: bool = True) -> Trajectory:
    steps = [StepRecord(0, "r", {"name": "Tap", "element": [100, 200, 500, 300]}, changed=True, xml_compressed=SCREEN),
             StepRecord(1, "r", {"name": "Type", "text": "milk"}, changed=True, xml_compressed=SCREEN),
             StepRecord(2, "r", {"name": "Swipe", "direction": "up", "dist": "long"}, changed=False,
                        xml_compressed=SCREEN),
             StepRecord(3, "garbage")]
    if finished:
        steps.append(StepRecord(4, "r", {"name": "Finish", "message": "added milk"}, xml_compressed=SCREEN))
    return Trajectory("lab/test/X/0", instruction=instruction, steps=steps, finished=finished,
                      final_xml_compressed="TextView;;Groceries: milk;[0,400][1080,500]",
                      meta={"screen_size": [1080, 2400]})


def test_text_form_numbers_the_actions_and_shows_the_final_screen():
    t = _traj()
    text = text_form(t, screens=1)
    assert text.splitlines()[:7] == ["Task: add milk to Groceries", "Actions:",
                                     '1. Tap "Save" [100,200][500,300]', '2. Type "milk"',
                                     "3. Swipe up (long) (no visible change)", "4. invalid response (no action)",
                                     '5. Finish: "added milk"']
    assert text.endswith("Final screen:\nTextView;;Groceries: milk;[0,400][1080,500]")
    two = text_form(t, screens=2)
    assert "Screen -1:\n" + SCREEN in two and "Final screen:" in two
    unfinished = text_form(_traj(finished=False), screens=0)
    assert "(the episode ended without finish)" in unfinished and "Final screen" not in unfinished
    assert describe_action(StepRecord(0, "r", {"name": "Finish"})) == "Finish"


def test_render_draws_the_tapped_box_the_swipe_arrow_and_the_texts(tmp_path):
    white = Image.new("RGB", (540, 1200), "white")
    tap = draw_action(white, {"name": "Tap", "element": [100, 200, 500, 300]}, (1080, 2400))
    assert tap.getpixel((50, 100)) == TAP_COLOUR and tap.getpixel((150, 125)) == (255, 255, 255)  # outline only
    swipe = draw_action(white, {"name": "Swipe", "direction": "up", "dist": "long"}, (1080, 2400))
    assert swipe.getpixel((270, 600)) != (255, 255, 255)  # the arrow crosses the middle
    for action in ({"name": "Type", "text": "milk"}, {"name": "Finish", "message": "added milk"}):
        drawn = draw_action(white, action, (1080, 2400))
        assert any(p != (255, 255, 255) for p in drawn.crop((0, 500, 540, 600)).getdata())  # the banner
    root = tmp_path / "store"
    (root / "images" / "ep").mkdir(parents=True)
    t = _traj()
    for i, s in enumerate(t.steps):
        white.save(root / "images" / "ep" / f"step{i:03d}.png")
        s.screenshot_path = f"images/ep/step{i:03d}.png"
    white.save(root / "images" / "ep" / "step005.png")  # the frame after the finish
    img = render_png(t, root, tmp_path / "trace.png")
    assert (tmp_path / "trace.png").is_file() and img.width == 6 * (270 + 6) + 6  # 5 steps + the final screen
    panel = img.crop((6, 30, 6 + 270, 30 + 600))
    assert any(r > 200 and g < 80 and b < 80 for r, g, b in panel.getdata())  # the first step's tapped box (resized)
    assert render_png(_traj(), None).width == 5 * (270 + 6) + 6  # no store: blank screens, still drawn


def _run(task_id: str, responses: list[str] | None):
    """One episode of ``task_id`` labelled like reward_traces: scripted responses (None: the oracle)."""
    from mobilerl.agent import OraclePolicy, ScriptedPolicy
    from mobilerl.env.sim.tasks.registry import get_task
    from mobilerl.eval.runner import evaluate_sync
    from mobilerl.reward.traces import LabelEnv

    policy = OraclePolicy() if responses is None else ScriptedPolicy(responses)
    [traj] = evaluate_sync(lambda s: policy, [get_task(task_id, with_optimal=False)], progress=False,
                           env_factory=functools.partial(LabelEnv, frozenset(), "default"), inline_env=True)
    return traj


@pytest.mark.parametrize("split", ["test", "train"])
def test_a_finish_message_the_final_screen_contradicts_is_labelled_a_failure(split):
    task = f"lab/{split}/LabSettingsDisableNotifications/0"
    app = "Calendar" if split == "test" else "Camera"
    liar = _run(task, [f'finish(message="I disabled {app}\'s notifications")'])
    assert liar.finished and liar.answer.startswith("I disabled") and liar.reward == 0.0 and not liar.success
    assert "Final screen:" in text_form(liar) and "Finish: \"I disabled" in text_form(liar)
    expert = _run(task, None)  # the hidden check stands in for the vote on lab/train
    assert expert.finished and expert.reward == 1.0 and expert.success


def test_labels_noise_and_balance():
    from mobilerl.reward.traces import balance, noisy_label

    flips = sum(noisy_label(1, f"ep{i}", 0.2, 0) == 0 for i in range(1000))
    assert 150 < flips < 250 and noisy_label(1, "ep1", 0.2, 0) == noisy_label(1, "ep1", 0.2, 0)
    assert all(noisy_label(0, f"ep{i}", 0.0, 0) == 0 for i in range(50))
    rows = [{"label": int(i % 4 == 0), "i": i} for i in range(40)]
    kept = balance(rows, seed=0)
    assert sum(r["label"] for r in kept) == 10 and len(kept) == 20
    assert [r["i"] for r in kept] == sorted(r["i"] for r in kept)  # order kept


def test_a_checkpoint_rolls_out_at_each_temperature_as_one_source_and_no_source_dominates():
    from mobilerl.reward.traces import RewardTracesConfig, cap_sources, policies

    cfg = RewardTracesConfig(slip_rates=[], early_finish=None, random=False, temperatures=[0.7, 1.0],
                             checkpoints={"sft": {"path": "models/tiny-base", "max_tasks": 5},
                                          "absent": {"path": "data/no/such/checkpoint"}})
    srcs = policies(cfg)
    assert [(s.name, s.store, s.cap) for s in srcs] == [("oracle", "oracle", None), ("sft", "sft_t0.7", 5),
                                                         ("sft", "sft_t1", 5)]
    assert [s.factory(0).sampling.temperature for s in srcs[1:]] == [0.7, 1.0]
    rows = [{"policy": "sft", "i": i} for i in range(30)] + [{"policy": "oracle", "i": 30 + i} for i in range(4)]
    kept = cap_sources(rows, 10, seed=0)
    assert sum(r["policy"] == "sft" for r in kept) == 10 and sum(r["policy"] == "oracle" for r in kept) == 4
    assert [r["i"] for r in kept] == sorted(r["i"] for r in kept)


class _Backend:
    """Answers by the trajectory's instruction, with a token table (as the HF backend has)."""

    def __init__(self, answers: dict[str, tuple[str, float]]):
        self.answers = answers
        self.requests = []

    async def generate(self, requests, sampling):
        from mobilerl.models.generation import Generation

        self.requests += requests
        out = []
        for r in requests:
            text, p = next(v for k, v in self.answers.items() if k in r.messages[1]["content"])
            ids = [ord(c) for c in text]
            lps = [0.0 if c not in "01" else math.log(p) for c in text]
            out.append(Generation(text, ids, lps, "stop"))
        return out

    def token_text(self, token_id: int) -> str:
        return chr(token_id)


def test_score_is_p_yes_from_the_answer_digits_logprob():
    backend = _Backend({"Task: add milk": ("<think>ok</think><answer>1</answer>", 0.8),
                        "Task: add eggs": ("0", 0.7), "Task: add bread": ("no idea", 1.0)})
    rm = J.RewardModel(backend, J.JudgeSettings(answer="think"))
    scores = rm.score([_traj("add bread"), _traj("add milk"), _traj("add eggs")])  # batched shortest first
    assert scores[0] == 0.0 and scores[1] == pytest.approx(0.8) and scores[2] == pytest.approx(0.3)
    assert rm.unparsed == 1
    system, user = backend.requests[0].messages
    assert "<answer>1</answer>" in system["content"] and user["content"] == text_form(_traj("add milk"))
    assert J.parse_answer("<think>1 or 0?</think><answer> 0 </answer>") == 0 and J.parse_answer("1") == 1


def test_zero_shot_judge_majority_vote_from_recorded_responses():
    from mobilerl.reward.train import ZeroShotConfig, zero_shot_judge

    recorded = json.loads((FIXTURES / "judge_responses.json").read_text())
    seen = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["temperature"] == 1.0 and body["logprobs"] is True and body["model"] == "judge"
        user = body["messages"][1]["content"]
        seen.append(user)
        key = next(k for k in recorded if k in user)
        return httpx.Response(200, json=recorded[key].pop(0))

    cfg = ZeroShotConfig(base_url="http://judge.invalid/v1", model="judge", samples=3)
    rm = zero_shot_judge(cfg, J.JudgeSettings(), transport=httpx.MockTransport(server))
    liar = _traj("turn off notifications for Calendar")
    scores = rm.score([liar, _traj("open the Clock app")])
    assert scores == [pytest.approx(1 / 3), pytest.approx(2 / 3)]  # votes 0,0,1 -> failure; 1,1,? -> success
    assert [s > 0.5 for s in scores] == [False, True] and rm.unparsed == 1
    assert len(seen) == 6 and all(r == [] for r in recorded.values())
    assert rm.settings.answer == "think"  # the zero-shot judge reasons before it answers


def test_binary_metrics_and_per_policy_report():
    from mobilerl.reward.train import binary_metrics, judge_report

    m = binary_metrics([1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert m["confusion"] == {"tp": 2, "fp": 1, "tn": 1, "fn": 1} and m["n"] == 5
    assert m["accuracy"] == pytest.approx(0.6) and m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(2 / 3)
    assert binary_metrics([0, 0], [0, 0])["f1"] == 0.0  # undefined -> 0
    r = judge_report([1, 0, 1], [1, 0, 0], ["oracle", "random", "random"])
    assert r["by_source"]["oracle"]["accuracy"] == 1.0 and r["by_source"]["random"]["confusion"]["fp"] == 1


def test_judge_settings_round_trip_and_errors(tmp_path):
    s = J.JudgeSettings(answer="think", view="text", screens=2)
    s.save(tmp_path)
    assert J.JudgeSettings.load(tmp_path) == s
    with pytest.raises(FileNotFoundError, match="not a reward model directory"):
        J.JudgeSettings.load(tmp_path / "nope")
    with pytest.raises(ValueError, match="answer must be one of"):
        J.JudgeSettings(answer="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature > 0"):
        J.RewardModel(_Backend({}), samples=3)
    assert asyncio.run(J.RewardModel(_Backend({})).ascore([])) == []


def test_the_threshold_is_chosen_on_the_training_scores_and_the_calibration_bins_the_held_out_ones():
    from mobilerl.reward.train import calibration, choose_threshold

    # a judge whose failures score up to 0.7: at 0.5 it passes two of them, above 0.7 none
    scores, labels = [0.1, 0.6, 0.7, 0.8, 0.9, 0.95], [0, 0, 0, 1, 1, 1]
    t = choose_threshold(scores, labels)
    assert 0.7 <= t < 0.8 and [int(s > t) for s in scores] == labels
    assert choose_threshold([0.2, 0.9], [0, 1]) == 0.5  # of equals, the one nearest 0.5
    c = calibration([0.05, 0.05, 0.95, 0.95, 1.0], [0, 1, 1, 1, 1], bins=10)
    assert [(b["n"], b["success_rate"]) for b in c["bins"]] == [(2, 0.5), (3, 1.0)]
    assert c["ece"] == pytest.approx((2 * 0.45 + 3 * abs(2.9 / 3 - 1.0)) / 5)
    s = J.JudgeSettings(threshold=0.7)
    assert J.RewardModel(_Backend({}), s).threshold == 0.7
    with pytest.raises(ValueError, match="threshold must be in"):
        J.JudgeSettings(threshold=1.0)
