"""Evaluation metrics: pass@k, Wilson interval, difficulty views, AndroidLab metrics, failure taxonomy."""

from __future__ import annotations

import math

import pytest

from mobilerl.eval.metrics import (
    TaskFeatures,
    classify_failure,
    complexity_level,
    difficulty_buckets,
    failure_flags,
    has_loop,
    lab_metrics,
    pass_at_k,
    semantic_features,
    semantic_score,
    summarize,
    tertile_buckets,
    wilson_interval,
)
from mobilerl.tracking import flatten
from mobilerl.trajectory import StepRecord, Trajectory

# ------------------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (8, 0, 1, 0.0),
        (8, 0, 8, 0.0),
        (8, 8, 1, 1.0),
        (8, 8, 8, 1.0),
        (4, 1, 2, 0.5),
        (5, 2, 2, 0.7),
        (8, 1, 1, 0.125),
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4)
        (8, 5, 4, 1.0),  # n - c = 3 < k: every 4-subset has a success
        (1, 1, 8, 1.0),  # k truncated to n
        (1, 0, 8, 0.0),
        (3, 1, 8, 1.0),  # k -> 3 = n: the one success is always drawn
    ],
)
def test_pass_at_k_exact(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_brute_force():
    from itertools import combinations

    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(combinations(outcomes, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4.0, 1, 1)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_wilson_interval_known_values():
    z2 = 1.959963984540054**2
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, z2 / (10 + z2)))  # 0.2775
    assert wilson_interval(10, 10) == pytest.approx((10 / (10 + z2), 1.0))  # 0.7225
    low, high = wilson_interval(81, 263)  # p = 81/263 = 0.308
    assert (low, high) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low90, high90 = wilson_interval(5, 10, confidence=0.90)
    assert 0.2366 < low90 < 0.5 < high90 < 0.7634
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(1, 10, confidence=1.0)


# -------------------------------------------------------------------------------- difficulty


@pytest.mark.parametrize(
    ("steps", "level"),
    [(0, 1), (1, 1), (10, 1), (11, 2), (20, 2), (21, 3), (30, 3), (31, 4), (50, 4), (10.5, 2)],
)
def test_complexity_level(steps, level):
    assert complexity_level(steps) == level


def test_semantic_features_from_tags_and_text():
    f = semantic_features(
        ("multi_app", "information_retrieval", "transcription", "screen_reading", "parameterized"),
        "What activities did I do {date} in the OpenTracks app?",
    )
    assert f == {
        "reason_score": 2,
        "perception_score": 1,
        "multi_app_flag": 1,
        "is_temporal_reasoning": 1,
        "is_aggregation_reasoning": 0,
        "is_multi_goal": 0,
    }
    assert semantic_score(("multi_app",), "Create a playlist. Then export it to Downloads") == 2
    assert semantic_features((), "How many expenses in total?")["is_aggregation_reasoning"] == 1
    assert semantic_features((), "Open the app and then delete the note")["is_multi_goal"] == 1
    assert semantic_features((), "Sometimes update the dateline")["is_temporal_reasoning"] == 0
    assert semantic_score((), "Add a contact named Bob") == 0


def test_tertile_buckets_equal_sized_with_ties_by_id():
    scores = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 2, "f": 5, "g": 5}
    b = tertile_buckets(scores, "S")
    assert b == {"a": "S1", "b": "S1", "c": "S1", "d": "S2", "e": "S2", "f": "S3", "g": "S3"}
    assert tertile_buckets({}, "S") == {}
    six = tertile_buckets({str(i): i for i in range(6)}, "D")
    assert [six[str(i)] for i in range(6)] == ["D1", "D1", "D2", "D2", "D3", "D3"]


def test_difficulty_buckets_semantic_and_combined():
    tasks = [
        TaskFeatures("long_simple", ("data_entry",), "Add the following recipes: {recipes}.", 40),
        TaskFeatures("short_simple", (), "Turn wifi off", 2),
        TaskFeatures("mid_simple", (), "Delete the file {name}", 21),
        TaskFeatures("short_hard", ("information_retrieval", "screen_reading"), "What did I do {date}?", 2),
        TaskFeatures("mid_hard", ("multi_app", "transcription"), "Copy the note. Then send it", 12),
        TaskFeatures(
            "long_hard", ("multi_app", "math_counting"), "How many songs in total? Then add one", 40
        ),
    ]
    b = difficulty_buckets(tasks)
    assert {k: v["semantic_score"] for k, v in b.items()} == {
        "long_simple": 0,
        "short_simple": 0,
        "mid_simple": 0,
        "short_hard": 3,
        "mid_hard": 3,
        "long_hard": 4,
    }
    # ties on the semantic score are broken by id
    assert {k: v["S"] for k, v in b.items()} == {
        "long_simple": "S1",
        "mid_simple": "S1",
        "short_simple": "S2",
        "mid_hard": "S2",
        "short_hard": "S3",
        "long_hard": "S3",
    }
    # combined = 0.5 * (S - 2) / 38 + semantic: the horizon only breaks ties between equal semantics
    assert b["long_simple"]["combined_score"] == pytest.approx(0.5)
    assert b["mid_hard"]["combined_score"] == pytest.approx(3 + 0.5 * 10 / 38)
    assert {k: v["D"] for k, v in b.items()} == {
        "short_simple": "D1",
        "mid_simple": "D1",
        "long_simple": "D2",
        "short_hard": "D2",
        "mid_hard": "D3",
        "long_hard": "D3",
    }
    same = difficulty_buckets([TaskFeatures("x", (), "a", 5), TaskFeatures("y", (), "b", 5)])
    assert same["x"]["combined_score"] == 0.0


# ---------------------------------------------------------------------------- trajectories


def step(i, name="Tap", changed=True, xml="screen", invalid=False, **kw):
    action = None if invalid else {"name": name, "element": [0, 0, 10, 10] if name == "Tap" else None, **kw}
    return StepRecord(
        index=i,
        response="junk" if invalid else name,
        action=action,
        invalid="bad" if invalid else None,
        changed=changed and not invalid,
        xml_compressed=xml,
    )


AUTO = object()


def traj(task_id="t/0", success=False, finished=None, reward=AUTO, steps=(), optimal=0, error=None, **kw):
    steps = list(steps)
    finished = success if finished is None else finished
    if reward is AUTO:
        reward = (1.0 if success else 0.0) if error is None else None
    return Trajectory(
        task_id=task_id,
        success=success,
        finished=finished,
        reward=reward,
        steps=steps,
        optimal_steps=optimal,
        error=error,
        **kw,
    )


def test_failure_taxonomy():
    ok = traj(success=True, steps=[step(0), step(1, "Finish", changed=False)])
    assert classify_failure(ok) is None and failure_flags(ok) == []
    crashed = traj(error="env: EnvCrashed: worker died", steps=[step(0)])
    assert classify_failure(crashed) == "env_error"
    assert classify_failure(traj(error="policy: TimeoutError: llm")) == "policy_error"
    invalid = traj(reward=0.0, steps=[step(0), step(1, invalid=True), step(2)])
    assert classify_failure(invalid) == "invalid_actions"  # exactly 1/3
    assert classify_failure(traj(reward=0.0, steps=[step(0), step(1), step(2, invalid=True), step(3)])) == (
        "never_finished"
    )
    wrong = traj(finished=True, reward=0.0, steps=[step(0), step(1, "Finish", changed=False)])
    assert classify_failure(wrong) == "finished_wrong"
    stuck = traj(reward=0.0, steps=[step(0), *(step(i, "Back", changed=False) for i in range(1, 4))])
    assert classify_failure(stuck) == "loop"
    two_stuck = traj(reward=0.0, steps=[step(i, "Back", changed=False) for i in range(2)])
    assert classify_failure(two_stuck) == "never_finished"
    unverified = traj(finished=True, reward=None, steps=[step(0, "Finish")])
    assert classify_failure(unverified) == "unverified"
    # several kinds apply: invalid responses and a wrong finish; the primary one is invalid_actions
    both = traj(finished=True, reward=0.0, steps=[step(0, invalid=True), step(1, "Finish")])
    assert failure_flags(both) == ["invalid_actions", "finished_wrong"]
    assert classify_failure(both) == "invalid_actions"


def test_loop_detection_by_screen_cycles():
    # open an item, go back, open it, go back: A -> B -> A -> B with the same actions
    cycle = [
        step(0, "Tap", xml="list"),
        step(1, "Back", xml="item"),
        step(2, "Tap", xml="list"),
        step(3, "Back", xml="item"),
    ]
    assert has_loop(traj(steps=cycle))
    progress = [step(0, "Tap", xml="list"), step(1, "Back", xml="item"), step(2, "Tap", xml="list2")]
    assert not has_loop(traj(steps=progress))
    swipes = [
        step(i, "Swipe", xml=x, direction=d)
        for i, (x, d) in enumerate(zip("ABAB", ["up", "down"] * 2, strict=True))
    ]
    assert has_loop(traj(steps=swipes))
    # same action three times, but the screen changes each time (scrolling through a list): no loop
    scroll = [step(i, "Swipe", xml=f"page{i}", direction="up") for i in range(5)]
    assert not has_loop(traj(steps=scroll))


def test_lab_metrics():
    trajs = [
        traj("a", success=True, steps=[step(0), step(1), step(2, "Finish", changed=False)], optimal=3),
        traj(
            "b",
            success=True,
            steps=[step(0), step(1, changed=False), step(2), step(3, "Finish", changed=False)],
            optimal=2,
        ),
        traj("c", reward=0.0, steps=[step(0, invalid=True), step(1)], subgoals=[True, False, False, True]),
        traj("d", reward=None, has_verifier=False, steps=[step(0)]),
    ]
    m = lab_metrics(trajs)
    assert m["sr"] == 0.5
    assert m["sub_sr"] == pytest.approx((1 + 1 + 0.5) / 3)  # over the three tasks with a verifier
    assert m["rrr"] == pytest.approx((3 / 3 + 2 / 4) / 2)
    assert m["ror"] == pytest.approx(6 / 8)  # finish steps excluded; the invalid step counts as unchanged
    assert m["mean_steps_success"] == 3.5
    assert m["mean_excess_steps_success"] == pytest.approx(((3 - 3) + (4 - 2)) / 2)
    assert lab_metrics([]) == {
        "sr": None,
        "sub_sr": None,
        "rrr": None,
        "ror": None,
        "mean_steps_success": None,
        "mean_excess_steps_success": None,
    }


def test_summarize_pass_at_k_and_buckets():
    trajs = []
    # task "easy": 8 trials, 8 successes; "mid": 2 of 8; "hard": 0 of 8
    for tid, c, diff, steps, tags in [
        ("easy", 8, "easy", 4, ()),
        ("mid", 2, "medium", 15, ("screen_reading",)),
        ("hard", 0, "hard", 35, ("multi_app", "memorization")),
    ]:
        for i in range(8):
            ok = i < c
            trajs.append(
                traj(
                    tid,
                    success=ok,
                    reward=1.0 if ok else 0.0,
                    finished=ok,
                    optimal=steps,
                    difficulty=diff,
                    tags=list(tags),
                    trial=i,
                    instruction=f"do {tid}",
                    apps=["Contacts"],
                    steps=[step(0), step(1, "Finish", changed=False)] if ok else [step(0)],
                )
            )
    s = summarize(trajs, k_values=(1, 2, 4, 8))
    assert s["eval/n_tasks"] == 3 and s["eval/n_trajectories"] == 24 and s["eval/trials_per_task"] == 8
    assert s["eval/success_rate"] == pytest.approx(10 / 24)
    assert s["eval/success_ci_low"] < 10 / 24 < s["eval/success_ci_high"]
    assert s["eval/pass@1"] == pytest.approx((1 + 0.25 + 0) / 3)
    assert s["eval/pass@2"] == pytest.approx((1 + (1 - math.comb(6, 2) / math.comb(8, 2)) + 0) / 3)
    assert s["eval/pass@8"] == pytest.approx(2 / 3)
    assert s["eval/by_difficulty"]["medium"]["pass@1"] == pytest.approx(0.25)
    assert set(s["eval/by_complexity"]) == {"1", "2", "4"}
    assert s["eval/by_complexity"]["4"]["success_rate"] == 0.0
    assert {g: v["n_tasks"] for g, v in s["eval/by_semantic"].items()} == {"S1": 1, "S2": 1, "S3": 1}
    assert s["eval/by_semantic"]["S3"]["success_rate"] == 0.0  # the multi_app + memorization task
    assert s["eval/by_combined"]["D1"]["success_rate"] == 1.0
    assert s["eval/by_app"]["Contacts"]["n_trajectories"] == 24
    assert s["lab/sr"] == s["eval/success_rate"]
    assert s["failures/never_finished"] == 14 and s["failures/env_error"] == 0
    flat = flatten(s, sep="/")
    assert flat["eval/by_difficulty/medium/pass@1"] == pytest.approx(0.25)
    assert all(not isinstance(v, dict) for v in flat.values())
    empty = summarize([])
    assert empty["eval/n_trajectories"] == 0 and empty["eval/success_rate"] is None


def test_pass_at_k_of_a_group_needs_k_trials_of_every_task():
    """With one trial a task, pass@8 is not estimable: None (the report prints "–"), not pass@1 renamed."""
    trajs = [traj(f"t{i}", success=i == 0, reward=float(i == 0), finished=i == 0, trial=0) for i in range(4)]
    s = summarize(trajs, k_values=(1, 2, 8))
    assert s["eval/pass@1"] == pytest.approx(0.25)
    assert s["eval/pass@2"] is None and s["eval/pass@8"] is None
    assert all(g["pass@2"] is None for g in s["eval/by_difficulty"].values())
    # two trials of every task: pass@2 is estimable, pass@8 still is not
    trajs += [traj(f"t{i}", success=False, reward=0.0, finished=False, trial=1) for i in range(4)]
    s = summarize(trajs, k_values=(1, 2, 8))
    assert s["eval/pass@2"] == pytest.approx(0.25) and s["eval/pass@8"] is None
