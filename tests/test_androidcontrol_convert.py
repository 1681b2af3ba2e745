"""AndroidControl → trajectories: fixtures built in AndroidControl's published format (GZIP TFRecord of
tf.train.Example, android_env accessibility-forest protos, JSON actions), converted with the right boxes
and action types (Table 8), high- and low-level variants, masked stores."""

from __future__ import annotations

import io
import json
from functools import lru_cache

import pytest
from PIL import Image

from mobilerl.data import androidcontrol as AC
from mobilerl.data.store import read_store
from mobilerl.env import actions as A
from mobilerl.env.actions import Action, format_action
from mobilerl.env.xml import compress_xml

W, H = 1080, 2400


@lru_cache(maxsize=64)
def _png(color=(240, 240, 240)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (W, H), color).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _node(uid, cls, box, *, text="", desc="", children=(), clickable=False, editable=False, pkg="com.example.app",
          long_clickable=False, scrollable=False):
    x1, y1, x2, y2 = box
    return {"unique_id": uid, "class_name": cls, "package_name": pkg, "text": text, "content_description": desc,
            "bounds_in_screen": {"left": x1, "top": y1, "right": x2, "bottom": y2}, "child_ids": list(children),
            "is_clickable": clickable, "is_focusable": clickable or editable, "is_editable": editable,
            "is_long_clickable": long_clickable, "is_scrollable": scrollable, "is_enabled": True,
            "is_visible_to_user": True}


def _forest(extra_text="Inbox"):
    """An app window (a list in a frame, a button inside a row) and a status-bar system window."""
    app = [
        _node(0, "android.widget.FrameLayout", (0, 0, W, H), children=[1, 5]),
        _node(1, "androidx.recyclerview.widget.RecyclerView", (0, 200, W, 2000), children=[2, 4], scrollable=True),
        _node(2, "android.widget.LinearLayout", (0, 200, W, 400), children=[3], clickable=True, long_clickable=True),
        _node(3, "android.widget.TextView", (40, 220, 600, 380), text=extra_text),
        _node(4, "android.widget.LinearLayout", (0, 400, W, 600), clickable=True, text="Reply to +1 415 555 0134"),
        _node(5, "android.widget.EditText", (40, 2100, 1040, 2300), editable=True, text="", desc="Search"),
    ]
    status = [_node(0, "android.widget.FrameLayout", (0, 0, W, 80), pkg="com.android.systemui", children=[1]),
              _node(1, "android.widget.TextView", (20, 10, 200, 70), text="9:41", pkg="com.android.systemui")]
    return {"windows": [{"id": 7, "layer": 2, "window_type": 3, "tree": {"nodes": status}},
                        {"id": 3, "layer": 1, "window_type": 1, "tree": {"nodes": app}}]}


def _episode():
    actions = [{"action_type": "open_app", "app_name": "Mail"},
               {"action_type": "click", "x": 300, "y": 300},  # inside the row and its text: the text wins
               {"action_type": "long_press", "x": 900, "y": 500},
               {"action_type": "scroll", "direction": "down"},
               {"action_type": "input_text", "text": "See you at 5"},
               {"action_type": "navigate_back"}, {"action_type": "wait"}, {"action_type": "navigate_home"}]
    n = len(actions)
    return {"episode_id": 4242, "goal": "Reply to the latest mail in the Mail app",
            "screenshots": [_png((200 + i, 200, 200)) for i in range(n + 1)],
            "accessibility_trees": [AC.encode_forest(_forest()) for _ in range(n + 1)],
            "screenshot_widths": [W] * (n + 1), "screenshot_heights": [H] * (n + 1),
            "actions": [json.dumps(a) for a in actions],
            "step_instructions": [f"instruction {i}" for i in range(n)]}


def test_wire_format_round_trip(tmp_path):
    ep = _episode()
    path = tmp_path / "android_control-00000-of-00001"
    AC.write_tfrecord(path, [AC.episode_to_example(ep)])
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # GZIP, as published
    (rec,) = list(AC.read_tfrecord(path, verify=True))
    back = AC.episode_from_example(rec)
    assert back["episode_id"] == 4242 and back["goal"] == ep["goal"]
    assert back["screenshots"] == ep["screenshots"] and back["actions"] == ep["actions"]
    assert back["screenshot_widths"] == [W] * 9 and back["step_instructions"] == ep["step_instructions"]
    forest = AC.parse_forest(back["accessibility_trees"][0])
    assert AC.parse_forest(AC.encode_forest(forest)) == forest
    app = next(w for w in forest["windows"] if w["id"] == 3)
    assert app["tree"]["nodes"][1]["child_ids"] == [2, 4] and app["tree"]["nodes"][5]["is_editable"]
    assert app["tree"]["nodes"][3]["bounds_in_screen"] == {"left": 40, "top": 220, "right": 600, "bottom": 380}


def test_forest_to_uiautomator_xml():
    xml = AC.forest_to_xml(AC.encode_forest(_forest()))
    assert xml.startswith("<?xml") and "<hierarchy" in xml
    # windows by layer (the app below the status bar), nodes nested through child_ids
    assert xml.index('package="com.example.app"') < xml.index('package="com.android.systemui"')
    assert 'class="android.widget.TextView"' in xml and 'bounds="[40,220][600,380]"' in xml
    assert 'resource-id=""' in xml and 'long-clickable="true"' in xml
    lines = compress_xml(xml, width=W, height=H).splitlines()
    assert "TextView;;Inbox;[40,220][600,380]" in lines
    assert "RecyclerView;scrollable;;[0,200][1080,2000]" in lines
    assert any(line.startswith("EditText;focusable;Search;") for line in lines)
    assert "TextView;;9:41;[20,10][200,70]" in lines


def test_forest_text_with_control_characters_still_gives_a_readable_dump():
    """A recorded text may hold characters XML 1.0 cannot carry; the dump writes them as '.' (as uiautomator's
    dumper does) instead of producing XML no parser accepts."""
    xml = AC.forest_to_xml(AC.encode_forest(_forest(extra_text="Inbox\x02 \x1b[0m\ufffe")))
    assert "TextView;;Inbox. .[0m.;[40,220][600,380]" in compress_xml(xml, width=W, height=H).splitlines()


def test_convert_episode_boxes_types_and_variants():
    traj, shots = AC.convert_episode(_episode(), split="train")
    names = [s.action_name for s in traj.steps]
    assert names == [A.LAUNCH, A.TAP, A.LONG_PRESS, A.SWIPE, A.TYPE, A.BACK, A.WAIT, A.HOME, A.FINISH]
    acts = [Action.from_dict(s.action) for s in traj.steps]
    assert acts[0].app == "Mail"
    assert acts[1].element == (40, 220, 600, 380)  # the smallest box holding the point
    assert acts[2].element == (0, 400, 1080, 600)
    assert acts[3].direction == "up"  # AndroidControl scrolls content down = our finger swipes up
    assert acts[4].text == "See you at 5"
    assert traj.meta["points"] == {"1": [300, 300], "2": [900, 500]}
    # high level: the goal; low level: each step's instruction (the finish step has none)
    assert traj.instruction == "Reply to the latest mail in the Mail app" and traj.task_id == "androidcontrol/train/4242"
    assert [s.step_instruction for s in traj.steps] == [f"instruction {i}" for i in range(8)] + [None]
    assert all(s.response == format_action(a) for s, a in zip(traj.steps, acts, strict=True))
    assert len(shots) == 9 and traj.finished
    no_finish, _ = AC.convert_episode(_episode(), add_finish=False)
    assert no_finish.n_steps == 8


def test_point_outside_every_box_and_bad_episode():
    ep = _episode()
    ep["actions"][1] = json.dumps({"action_type": "click", "x": 5, "y": 2390})
    ep["accessibility_trees"] = [AC.encode_forest({"windows": []})] * 9
    traj, _ = AC.convert_episode(ep)
    assert Action.from_dict(traj.steps[1].action).element == (5, 2390, 6, 2391)
    bad = _episode()
    bad["screenshots"] = bad["screenshots"][:3]
    with pytest.raises(ValueError, match="8 actions but 3 screenshots"):
        AC.convert_episode(bad)


def _to_ac(a: Action) -> dict:
    """Our action in AndroidControl's JSON (the inverse of Table 8's mapping)."""
    inverse = {"up": "down", "down": "up", "left": "right", "right": "left"}
    if a.name in (A.TAP, A.LONG_PRESS):
        return {"action_type": "click" if a.name == A.TAP else "long_press", "x": a.center[0], "y": a.center[1]}
    if a.name == A.TYPE:
        return {"action_type": "input_text", "text": a.text}
    if a.name == A.LAUNCH:
        return {"action_type": "open_app", "app_name": a.app}
    if a.name == A.SWIPE:
        return {"action_type": "scroll", "direction": inverse[a.direction]}
    return {"action_type": {A.BACK: "navigate_back", A.WAIT: "wait", A.HOME: "navigate_home"}[a.name]}


def test_simulator_episode_round_trip(tmp_path):
    """A simulator episode exported in AndroidControl's format converts back to the oracle's own actions."""
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.screen import Screen
    from mobilerl.env.sim.tasks.base import OracleAgent
    from mobilerl.env.sim.tasks.registry import get_task

    env = SimEnv(render=True, perturb="none")
    task = get_task("world/train/ContactsEditNumber/0", with_optimal=False)
    obs = env.reset(task)
    agent = OracleAgent(env.tmpl, task.params)
    shots, trees, acts, gt = [], [], [], []
    while True:
        a = agent.act(Screen(obs.xml, obs.app))
        shots.append(obs.png())
        trees.append(AC.forest_from_xml(obs.xml))
        if a.name == A.FINISH:
            break
        d = _to_ac(a)
        acts.append(json.dumps(d))
        gt.append(a)
        obs = env.step(a).observation
    ep = {"episode_id": 1, "goal": task.instruction, "screenshots": shots, "accessibility_trees": trees,
          "screenshot_widths": [W] * len(shots), "screenshot_heights": [H] * len(shots), "actions": acts,
          "step_instructions": [f"step {i}" for i in range(len(acts))]}
    path = tmp_path / "ac.tfrecord.gz"
    AC.write_tfrecord(path, [AC.episode_to_example(ep)])
    (ep2,) = list(AC.iter_episodes([path]))
    traj, _ = AC.convert_episode(ep2)
    for s, a in zip(traj.steps, gt, strict=False):
        got = Action.from_dict(s.action)
        assert got.name == a.name
        if a.element is not None:
            assert got.element == a.element  # the oracle tapped exactly an element's box
        if a.name == A.SWIPE:
            assert got.direction == a.direction
    # the masked store: the raw phone number of the instruction and the screens is gone
    from mobilerl.data.masking import MaskingOptions

    res = AC.convert_to_store([path], tmp_path / "store", masking=MaskingOptions(image_max_side=1200), progress=False)
    (stored,) = read_store(tmp_path / "store")
    assert res.n_episodes == 1 and stored.source == "androidcontrol" and stored.n_steps == len(acts) + 1
    assert task.params["phone"] not in json.dumps(stored.to_dict())
    assert "[PHONE]" in stored.instruction
    with Image.open(tmp_path / "store" / stored.steps[0].screenshot_path) as im:
        assert im.size == (W // 2, H // 2)
