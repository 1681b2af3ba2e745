"""The prompt module's coordinate frames (the tiny profile shows screens and answers on the 0-999 grid)."""

import pytest


def test_grid_frame_converts_screen_and_actions_both_ways():
    from mobilerl.agent import prompt as PR
    from mobilerl.env.actions import Action, parse_action

    xml = "Button;clickable;Save;[540,1200][1080,2400]\nTextView;;Title;[0,0][108,240]"
    grid = PR.screen_in_frame(xml, (1080, 2400), "rel")
    assert grid.splitlines() == ["Button;clickable;Save;[500,500][999,999]", "TextView;;Title;[0,0][100,100]"]
    assert PR.screen_in_frame(xml, None, "abs") == xml
    xml_r, act = PR.in_frame(xml, parse_action('do(action="Tap", element=[540,1200][1080,2400])'.replace("][", ",")),
                             (1080, 2400), "rel")
    assert xml_r == grid and act.element == (500, 500, 999, 999)
    back = parse_action(PR.action_to_env('<answer>do(action="Tap", element=[500,500,999,999])</answer>',
                                         (1080, 2400), "rel"))
    assert back.element == (540, 1200, 1079, 2398)
    assert PR.in_frame(xml, Action("Back"), (1080, 2400), "rel")[1] == Action("Back")
    with pytest.raises(ValueError, match="screen size"):
        PR.screen_in_frame(xml, None, "rel")
    with pytest.raises(ValueError, match="coordinate frame"):
        PR.screen_in_frame(xml, (1, 1), "pixels")


def test_marks_frame_numbers_lines_and_resolves_index_actions():
    from mobilerl.agent import prompt as PR
    from mobilerl.env.actions import Action, ActionParseError, parse_action

    xml = ("TextView;;12:30;[44,4][185,31]\nLinearLayout;clickable;;[0,300][1080,500]\n"
           "TextView;;Wi-Fi;[40,320][600,380]\nSwitch;checkable clickable;ON;[900,320][1040,380]")
    marks = PR.screen_in_frame(xml, None, "marks")
    assert marks.splitlines() == ["TextView;;12:30;[0]", "LinearLayout;clickable;;[1]", "TextView;;Wi-Fi;[2]",
                                  "Switch;checkable clickable;ON;[3]"]
    # the expert's box becomes its line; a box on no line's bounds names the smallest line holding its centre
    assert PR.in_frame(xml, Action("Tap", element=(900, 320, 1040, 380)), None, "marks")[1] == Action("Tap", index=3)
    assert PR.in_frame(xml, Action("Tap", element=(100, 330, 120, 350)), None, "marks")[1].index == 2
    assert PR.in_frame(xml, Action("Type", text="x"), None, "marks")[1] == Action("Type", text="x")
    with pytest.raises(ActionParseError, match="no line"):
        PR.in_frame(xml, Action("Tap", element=(0, 2000, 10, 2010)), None, "marks")
    # the model's index goes back to the env as that line's pixel box
    back = parse_action(PR.action_to_env('<answer>do(action="Long Press", index=2)</answer>', (1080, 2400), "marks",
                                         xml))
    assert back == Action("Long Press", element=(40, 320, 600, 380))
    assert PR.action_to_env('do(action="Swipe", direction="up")', (1080, 2400), "marks", xml) == \
        'do(action="Swipe", direction="up", dist="medium")'
    with pytest.raises(ActionParseError, match="names no element"):
        PR.action_to_env('do(action="Tap", index=4)', (1080, 2400), "marks", xml)
    with pytest.raises(ActionParseError, match="names a line"):
        PR.action_to_env('do(action="Tap", element=[40,320,600,380])', (1080, 2400), "marks", xml)
    user = PR.user_prompt("Turn Wi-Fi off", [], marks, mode="xml", coords="marks")
    assert "(Class;flags;label;[index])" in user and "[40,320]" not in user
    full = PR.system_prompt("xml", style="full", coords="marks")
    assert 'do(action="Tap", index=i)' in full and "element=[" not in full
