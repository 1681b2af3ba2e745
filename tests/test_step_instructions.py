"""Low-level step instructions derived from an expert step's action and screen (AndroidControl-Low style),
and the low-level SFT samples built from them for stores that record none."""

from __future__ import annotations

import json

from mobilerl.agent.policy import parse_compressed
from mobilerl.data.step_instructions import element_name, step_instruction
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, parse_action

SCREEN = "\n".join([
    "TextView;;Recordings;[0,0][999,60]",
    "LinearLayout;clickable;;[0,100][999,200]",
    "TextView;;Bird song;[20,110][600,150]",
    "ImageButton;clickable;More options;[900,110][990,190]",
    "TextView;;Rain;[20,210][600,250]",
    "ImageButton;clickable;More options;[900,210][990,290]",
    "Switch;clickable checkable checked;Wi-Fi;[0,300][999,360]",
])


def test_a_tap_is_named_by_its_label_and_a_repeated_label_by_the_row_it_sits_in():
    assert step_instruction(Action(A.TAP, element=(0, 300, 999, 360)), SCREEN) == 'Tap "Wi-Fi"'
    # an unlabelled container: the first labelled line inside it
    assert step_instruction(Action(A.TAP, element=(0, 100, 999, 200)), SCREEN) == 'Tap "Bird song"'
    # "More options" twice on screen: qualified by the uniquely labelled line above each
    assert step_instruction(Action(A.TAP, element=(900, 210, 990, 290)), SCREEN) == 'Tap "More options" of "Rain"'
    assert step_instruction(Action(A.LONG_PRESS, element=(900, 110, 990, 190)), SCREEN) == (
        'Long-press "More options" of "Bird song"')
    # a row the task mentions (within the few lines above) wins over the nearest one
    lines = parse_compressed(SCREEN)
    assert element_name(lines, (900, 210, 990, 290), "Share the bird song clip") == '"More options" of "Bird song"'
    # nothing names a box that is on no line and inside none: no instruction (no sample) rather than "tap that"
    assert step_instruction(Action(A.TAP, element=(5, 900, 50, 950)), SCREEN) is None


def test_every_other_action_has_its_instruction():
    cases = {
        Action(A.TYPE, text='Say "hi"'): "Type \"Say 'hi'\"",
        Action(A.SWIPE, direction="up", dist="medium"): "Swipe up",
        Action(A.LAUNCH, app="Clock"): "Open Clock",
        Action(A.BACK): "Go back",
        Action(A.HOME): "Go to the home screen",
        Action(A.WAIT): "Wait for the screen to load",
        Action(A.FINISH, message="13"): 'Answer "13"',
        Action(A.FINISH): "Stop: the task is done",
    }
    for action, want in cases.items():
        assert step_instruction(action, SCREEN) == want


def test_a_store_without_step_instructions_gets_low_level_samples(tmp_path):
    from mobilerl.agent import OraclePolicy
    from mobilerl.data.collect import MaskingOptions, collect_sync
    from mobilerl.data.sft import SftSource, build_sft
    from mobilerl.env.sim.tasks.registry import get_task

    tasks = [get_task("world/train/SystemWifiTurnOnOff/0", with_optimal=False)]
    policy = OraclePolicy()
    collect_sync(lambda s: policy, tasks, tmp_path / "c", masking=MaskingOptions(mode="surrogate", faces=False),
                 concurrency=1, progress=False)
    high = build_sft([SftSource("collected", tmp_path / "c")], tmp_path / "high", val_fraction=0.0, seed=0,
                     mode="xml", coords="rel")
    both = build_sft([SftSource("collected", tmp_path / "c", variant="both")], tmp_path / "both", val_fraction=0.0,
                     seed=0, mode="xml", coords="rel")
    st = both["sources"]["collected"]
    assert high["sources"]["collected"]["train_high"] == st["train_high"] > 0
    assert st["train_low"] == st["train_high"]  # every oracle step here has a named target
    recs = json.loads((tmp_path / "both" / "train.json").read_text())
    low = [r for r in recs if "Previous actions: none" in r["messages"][1]["content"]
           and not r["messages"][1]["content"].startswith(f"Task: {tasks[0].instruction}")]
    assert len(low) == st["train_low"]
    for r in low:
        task = r["messages"][1]["content"].splitlines()[0].removeprefix("Task: ")
        action = parse_action(r["messages"][2]["content"])
        if action.name == A.TAP:  # the instruction names the element the answer taps, on this screen
            lines = parse_compressed(r["messages"][1]["content"])
            assert task == f"Tap {element_name(lines, action.element)}"
        elif action.name == A.LAUNCH:
            assert task == f"Open {action.app}"
