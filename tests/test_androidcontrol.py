"""Offline AndroidControl-style step evaluation (Table 8 rules, Low/High modes) on hand-made fixtures."""

from __future__ import annotations

import asyncio

import pytest

from mobilerl.agent import PolicyContext, PolicyOutput, ScriptedPolicy
from mobilerl.data.androidcontrol_actions import GTStep, from_androidcontrol
from mobilerl.env.actions import Action, format_action
from mobilerl.eval.androidcontrol import (
    ACEpisode,
    judge_response,
    judge_step,
    miss_kind,
    run_androidcontrol,
    step_metrics,
    token_f1,
)

SCREEN = "\n".join(
    [
        "FrameLayout;;;[0,0][1080,2400]",
        "Button;clickable focusable;Compose;[800,2000][1040,2200]",
        "LinearLayout;clickable;Inbox row;[0,400][1080,600]",
        "TextView;clickable;Alice;[40,420][500,480]",
        "EditText;clickable focusable;Search;[40,150][1040,260]",
    ]
)


def tap(box):
    return Action("Tap", element=box)


def test_from_androidcontrol_conversions():
    gt = from_androidcontrol({"action_type": "click", "x": 100, "y": 450}, SCREEN)
    assert gt.action == tap((40, 420, 500, 480))  # smallest box containing the point
    assert gt.point == (100, 450)
    lp = from_androidcontrol({"action_type": "long_press", "x": 900, "y": 2100}, SCREEN)
    assert lp.action == Action("Long Press", element=(800, 2000, 1040, 2200))
    nowhere = from_androidcontrol({"action_type": "click", "x": 5, "y": 2300}, "")
    assert nowhere.action.element == (5, 2300, 6, 2301) and nowhere.point == (5, 2300)
    # AndroidControl scrolls name where the content goes; our swipes name where the finger goes
    assert from_androidcontrol({"action_type": "scroll", "direction": "down"}).action.direction == "up"
    assert from_androidcontrol({"action_type": "scroll", "direction": "left"}).action.direction == "right"
    assert from_androidcontrol({"action_type": "open_app", "app_name": "Gmail"}).action == Action(
        "Launch", app="Gmail"
    )
    assert from_androidcontrol({"action_type": "input_text", "text": "hi"}).action == Action(
        "Type", text="hi"
    )
    for kind, name in [("navigate_home", "Home"), ("navigate_back", "Back"), ("wait", "Wait")]:
        assert from_androidcontrol({"action_type": kind}).action == Action(name)
    with pytest.raises(ValueError, match="unknown AndroidControl action_type"):
        from_androidcontrol({"action_type": "teleport"})
    with pytest.raises(ValueError, match="needs integer x and y"):
        from_androidcontrol({"action_type": "click", "x": 1})
    with pytest.raises(ValueError, match="direction"):
        from_androidcontrol({"action_type": "scroll", "direction": "sideways"})


def test_token_f1():
    assert token_f1("hello world", "hello world") == 1.0
    assert token_f1("Hello, World!", "hello world") == 1.0
    assert token_f1("hello", "hello world") == pytest.approx(2 / 3)
    assert token_f1("a b c d", "a x y z") == pytest.approx(0.25)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # multiset overlap


def test_grounding_rule_point_in_predicted_box():
    gt = GTStep(tap((40, 420, 500, 480)), point=(100, 450))
    j = judge_step(gt, tap((90, 440, 110, 460)))
    assert j.type_match and j.grounded and j.success
    j = judge_step(gt, tap((0, 400, 1080, 600)))  # a bigger box that still contains the point
    assert j.success
    j = judge_step(gt, tap((100, 450, 100, 450)))  # bounds are inclusive
    assert j.success
    j = judge_step(gt, tap((800, 2000, 1040, 2200)))
    assert j.type_match and j.grounded is False and not j.success
    j = judge_step(gt, Action("Long Press", element=(90, 440, 110, 460)))
    assert not j.type_match and j.grounded is False and not j.success
    # without an original point, the GT box's centre is used
    assert judge_step(GTStep(tap((0, 0, 100, 100))), tap((40, 40, 60, 60))).success


@pytest.mark.parametrize(
    ("gt", "pred", "ok"),
    [
        (Action("Swipe", direction="up", dist="medium"), Action("Swipe", direction="up", dist="long"), True),
        (
            Action("Swipe", direction="up", dist="medium"),
            Action("Swipe", direction="down", dist="medium"),
            False,
        ),
        (Action("Launch", app="Gmail"), Action("Launch", app=" gmail "), True),
        (Action("Launch", app="Gmail"), Action("Launch", app="Google Mail"), False),
        (Action("Type", text="Meeting at 10 AM tomorrow"), Action("Type", text="meeting at 10 am"), True),
        (Action("Type", text="Meeting at 10 AM tomorrow"), Action("Type", text="meeting"), False),  # F1 = 1/3
        (Action("Type", text="a b"), Action("Type", text="a c"), False),  # F1 = 0.5 is not > 0.5
        (Action("Back"), Action("Back"), True),
        (Action("Home"), Action("Back"), False),
        (Action("Wait"), Action("Wait"), True),
        (Action("Finish"), Action("Finish", message="anything"), True),
    ],
)
def test_table8_rules(gt, pred, ok):
    j = judge_step(GTStep(gt), pred)
    assert j.success is ok
    assert j.grounded is None
    assert j.type_match is (gt.name == pred.name)


def test_unparseable_response_is_wrong_and_invalid():
    j = judge_response(GTStep(Action("Back")), "I would go back")
    assert j.invalid and not j.type_match and not j.success
    assert judge_response(
        GTStep(Action("Back")), '<think>x</think><answer>do(action="Back")</answer>'
    ).success


def test_step_metrics():
    gt_tap = GTStep(tap((0, 0, 100, 100)), (50, 50))
    js = [
        judge_step(gt_tap, tap((40, 40, 60, 60))),  # right
        judge_step(gt_tap, tap((200, 200, 300, 300))),  # right type, wrong place
        judge_step(gt_tap, Action("Back")),  # wrong type
        judge_step(GTStep(Action("Home")), Action("Home")),
        judge_step(GTStep(Action("Home")), None),
    ]
    m = step_metrics(js)
    assert m["n_steps"] == 5
    assert m["type_accuracy"] == pytest.approx(3 / 5)
    assert m["grounding_accuracy"] == pytest.approx(1 / 2)  # among typed-right grounding steps
    assert m["grounding_accuracy_all"] == pytest.approx(1 / 3)
    assert m["step_success_rate"] == pytest.approx(2 / 5)
    assert m["invalid_rate"] == pytest.approx(1 / 5)


def test_grounding_misses_tell_a_wrong_element_from_pointing_at_nothing():
    gt = GTStep(tap((800, 2000, 1040, 2200)), (900, 2100))  # Compose
    assert judge_step(gt, tap((800, 2000, 1040, 2200)), SCREEN).miss is None  # right: no miss
    assert judge_step(gt, tap((0, 400, 1080, 600)), SCREEN).miss == "wrong_element"  # the Inbox row
    assert judge_step(gt, tap((41, 151, 1039, 259)), SCREEN).miss == "wrong_element"  # Search, a pixel off (grid)
    assert judge_step(gt, tap((300, 900, 700, 1100)), SCREEN).miss == "off_element"  # nothing is there
    assert judge_step(gt, tap((40, 420, 300, 480)), SCREEN).miss == "off_element"  # half of Alice's box: IoU < 0.9
    assert judge_step(gt, tap((300, 900, 700, 1100))).miss is None  # screen unknown: not classified
    assert judge_step(gt, Action("Back"), SCREEN).miss is None  # a type error is not a grounding miss
    assert miss_kind(None, SCREEN) == "off_element" and miss_kind((0, 400, 1080, 600), "") == "off_element"
    js = [judge_step(gt, tap(b), SCREEN) for b in
          [(800, 2000, 1040, 2200), (0, 400, 1080, 600), (40, 150, 1040, 260), (300, 900, 700, 1100)]]
    m = step_metrics([*js, judge_step(gt, Action("Back"), SCREEN)])
    assert m["grounding_accuracy"] == pytest.approx(1 / 4)
    assert m["grounding_wrong_element"] == pytest.approx(2 / 4) and m["grounding_off_element"] == pytest.approx(1 / 4)


def _episode(eid="ep1") -> ACEpisode:
    gts = [
        from_androidcontrol({"action_type": "open_app", "app_name": "Gmail"}),
        from_androidcontrol({"action_type": "click", "x": 900, "y": 2100}, SCREEN),
        from_androidcontrol({"action_type": "input_text", "text": "hello alice"}),
    ]
    return ACEpisode(
        episode_id=eid,
        goal="Email Alice hello",
        step_instructions=["Open Gmail", "Tap Compose", "Type hello alice"],
        observations=["", SCREEN, SCREEN],
        actions=gts,
    )


class Recorder:
    """Answers from a script keyed by step index and records what it was shown."""

    def __init__(self, answers):
        self.answers = answers
        self.seen: list[PolicyContext] = []

    async def act(self, ctx):
        self.seen.append(ctx)
        key = ctx.observation.step
        return PolicyOutput(self.answers[key])


def test_high_mode_replaces_wrong_predictions_with_ground_truth():
    ep = _episode()
    answers = [
        'do(action="Launch", app="gmail")',
        'do(action="Back")',
        'do(action="Type", text="Hello Alice!")',
    ]
    pol = Recorder(answers)
    res = asyncio.run(run_androidcontrol(pol, [ep], mode="high"))
    assert [s.judgement.success for s in res.steps] == [True, False, True]
    assert [c.task.instruction for c in pol.seen] == ["Email Alice hello"] * 3
    assert pol.seen[1].history == (answers[0],)
    # the wrong second prediction was replaced by the ground-truth action in the history
    assert pol.seen[2].history == (answers[0], f"<answer>{format_action(ep.actions[1].action)}</answer>")
    assert pol.seen[1].xml_compressed == SCREEN
    m = res.metrics
    assert m["androidcontrol/high/grounding_wrong_element"] is None  # the miss was a type error (Back)
    assert m["androidcontrol/high/step_success_rate"] == pytest.approx(2 / 3)
    assert m["androidcontrol/high/episode_success_rate"] == 0.0
    assert m["androidcontrol/high/n_episodes"] == 1


def test_low_mode_is_single_turn_with_step_instructions():
    ep = _episode()
    pol = Recorder(
        ['do(action="Launch", app="Gmail")', 'do(action="Tap", element=[850,2050,950,2150])', "oops"]
    )
    res = asyncio.run(run_androidcontrol(pol, [ep, _episode("ep2")], mode="low", concurrency=1))
    assert [c.task.instruction for c in pol.seen[:3]] == ep.step_instructions
    assert all(c.history == () for c in pol.seen)
    m = res.metrics
    assert m["androidcontrol/low/n_steps"] == 6
    assert m["androidcontrol/low/step_success_rate"] == pytest.approx(4 / 6)
    assert m["androidcontrol/low/grounding_accuracy"] == 1.0
    assert m["androidcontrol/low/invalid_rate"] == pytest.approx(2 / 6)


def test_driver_with_scripted_policy_and_bad_input():
    ep = _episode()
    gold = [format_action(g.action) for g in ep.actions]
    res = asyncio.run(run_androidcontrol(ScriptedPolicy(gold), [ep], mode="high"))
    assert res.metrics["androidcontrol/high/episode_success_rate"] == 1.0
    with pytest.raises(ValueError, match="mode"):
        asyncio.run(run_androidcontrol(ScriptedPolicy(gold), [ep], mode="medium"))
    with pytest.raises(ValueError, match="must match"):
        ACEpisode("x", "g", ["a"], ["", ""], ep.actions[:1])


def test_our_expert_trajectories_are_step_data_and_grid_policies_are_judged_in_pixels():
    from mobilerl.agent import OraclePolicy
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.agent.prompt import in_frame, render_response
    from mobilerl.env.sim.tasks import get_task
    from mobilerl.eval.androidcontrol import from_trajectory
    from mobilerl.eval.runner import evaluate_sync
    from mobilerl.models.generation import Generation, SamplingConfig

    [traj] = evaluate_sync(lambda seed: OraclePolicy(), [get_task("world/test/ContactsAddContact/0")],
                           perturb="none", progress=False)
    ep = from_trajectory(traj)
    assert len(ep.actions) == len(traj.steps) >= 3 and ep.goal == traj.instruction
    assert ep.observations[0] == traj.steps[0].xml_compressed and (ep.width, ep.height) == (1080, 2400)
    gold = [format_action(g.action) for g in ep.actions]
    res = asyncio.run(run_androidcontrol(ScriptedPolicy(gold), [ep], mode="high"))
    assert res.metrics["androidcontrol/high/step_success_rate"] == 1.0

    class Grid:  # a backend answering the expert's action on the 0-999 grid, except at step 1 (Back)
        def __init__(self):
            self.prompts = []

        async def generate(self, requests, sampling):
            self.prompts.append(requests[0].messages[1]["content"])
            i = len(self.prompts) - 1
            if i == 1:
                return [Generation("<answer>do(action=\"Back\")</answer>", [1], [-0.1], "stop")]
            _, a = in_frame("", ep.actions[i].action, (ep.width, ep.height), "rel")
            return [Generation(render_response(a), [1], [-0.1], "stop")]

    grid = Grid()
    policy = ModelPolicy(grid, obs_mode="xml", sampling=SamplingConfig(temperature=0), coords="rel",
                         prompt_style="compact")
    res = asyncio.run(run_androidcontrol(policy, [ep], mode="high", concurrency=1, frame="rel"))
    assert [s.judgement.success for s in res.steps] == [i != 1 for i in range(len(ep.actions))]
    _, framed = in_frame("", ep.actions[1].action, (ep.width, ep.height), "rel")
    assert framed.element != ep.actions[1].action.element  # a Tap: grid and pixels differ
    assert render_response(framed) in grid.prompts[2]  # the replaced step, on the grid


def test_a_marks_frame_policy_is_judged_on_the_box_of_the_line_it_names():
    from mobilerl.agent import OraclePolicy
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.agent.prompt import in_frame, render_response
    from mobilerl.env.sim.tasks import get_task
    from mobilerl.eval.androidcontrol import from_trajectory
    from mobilerl.eval.runner import evaluate_sync
    from mobilerl.models.generation import Generation, SamplingConfig

    [traj] = evaluate_sync(lambda seed: OraclePolicy(), [get_task("world/test/ContactsAddContact/0")],
                           perturb="none", progress=False)
    ep = from_trajectory(traj)
    taps = [i for i, g in enumerate(ep.actions) if g.action.name == "Tap"]
    wrong, bad = taps[0], taps[1]

    class Marks:  # answers the expert's line, except at one tap, where it names the line before, and one
        # where it names no line at all
        def __init__(self):
            self.prompts = []

        async def generate(self, requests, sampling):
            self.prompts.append(requests[0].messages[1]["content"])
            i = len(self.prompts) - 1
            _, a = in_frame(ep.observations[i], ep.actions[i].action, None, "marks")
            if i == wrong:
                a = Action("Tap", index=a.index - 1)
            if i == bad:
                a = Action("Tap", index=999)
            return [Generation(render_response(a), [1], [-0.1], "stop")]

    marks = Marks()
    policy = ModelPolicy(marks, obs_mode="xml", sampling=SamplingConfig(temperature=0), coords="marks",
                         prompt_style="compact")
    res = asyncio.run(run_androidcontrol(policy, [ep], mode="high", concurrency=1, frame="marks"))
    assert [s.judgement.success for s in res.steps] == [i not in (wrong, bad) for i in range(len(ep.actions))]
    j = res.steps[bad].judgement  # an index naming no line is an invalid step, not a Tap that missed
    assert j.invalid and not j.type_match and res.steps[wrong].judgement.type_match
    assert "[x1,y1]" not in marks.prompts[0] and ";[0]" in marks.prompts[0]
    _, framed = in_frame(ep.observations[wrong], ep.actions[wrong].action, None, "marks")
    assert render_response(framed) in marks.prompts[wrong + 1]  # the replaced step names the expert's line
