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
