"""Simulator behaviour: determinism, navigation, keyboard, scrolling, dialogs, perturbations."""

import pytest

from mobilerl.env.actions import Action, parse_action
from mobilerl.env.base import EnvError
from mobilerl.env.sim import Device, Perturb, SimEnv
from mobilerl.env.sim.screen import Screen
from mobilerl.env.xml import compress_xml

TASK = "world/test/ContactsAddContact/3"


def tap(screen: Screen, **q) -> Action:
    e = screen.find(**q)
    assert e is not None, q
    return Action("Tap", element=e.bounds)


def play(env: SimEnv, actions):
    shots, xmls = [], []
    obs = env.reset(TASK)
    xmls.append(obs.xml)
    shots.append(obs.png())
    for a in actions:
        obs = env.step(a).observation
        xmls.append(obs.xml)
        shots.append(obs.png())
    return xmls, shots


def test_same_seed_same_bytes():
    acts = [Action("Launch", app="Contacts"), Action("Wait"), Action("Swipe", direction="up", dist="long"),
            Action("Back"), Action("Home")]
    a = play(SimEnv(render=True, perturb="heavy"), acts)
    b = play(SimEnv(render=True, perturb="heavy"), acts)
    assert a == b
    # a different task seed gives different content
    env = SimEnv(render=False)
    other = env.reset("world/test/ContactsAddContact/4").xml
    assert other != a[0][0]


def test_xml_has_layout_and_offscreen_nodes_and_compresses():
    env = SimEnv(perturb="none")
    env.reset(TASK)
    xml = env.step(Action("Launch", app="Contacts")).observation.xml
    assert xml.startswith("<?xml") and "<hierarchy" in xml and 'class="android.widget.FrameLayout"' in xml
    for attr in ("checkable=", "long-clickable=", "password=", "resource-id=", "package="):
        assert attr in xml
    full = compress_xml(xml, keep_offscreen=True).splitlines()
    visible = compress_xml(xml).splitlines()
    assert len(full) > len(visible)  # the contact list runs past the screen
    assert len(xml) > 5 * len("\n".join(visible))


def test_typed_control_characters_do_not_break_the_dump():
    """Typed text may hold control characters (a model can write them raw); the dump writes "." for characters
    XML cannot carry (as uiautomator does) instead of emitting XML no parser accepts."""
    env = SimEnv(perturb="none")
    env.reset(TASK)
    s = Screen(env.step(Action("Launch", app="Contacts")).observation.xml)
    s = Screen(env.step(tap(s, desc="Create contact")).observation.xml)
    s = Screen(env.step(tap(s, rid="first_name", cls="EditText")).observation.xml)
    typed = Action("Type", text="555-\x02-\x00<&>")
    obs = env.step(typed).observation
    field = Screen(obs.xml).find(rid="first_name", cls="EditText")
    assert field is not None and field.text == "555-.-.<&>"
    assert "555-.-.<&>" in compress_xml(obs.xml)


def test_navigation_keyboard_and_back_stack():
    env = SimEnv(perturb="none")
    env.reset(TASK)
    obs = env.step(Action("Launch", app="Contacts")).observation
    s = Screen(obs.xml, obs.app)
    assert s.title == "Contacts" and obs.app == "Contacts"
    s = Screen(env.step(tap(s, desc="Create contact")).observation.xml)
    assert s.title == "Create contact"
    s = Screen(env.step(tap(s, rid="first_name", cls="EditText")).observation.xml)
    assert s.focused_field is not None and s.focused_field.rid == "first_name"
    s = Screen(env.step(Action("Type", text="Ada")).observation.xml)
    assert s.find(rid="first_name", cls="EditText").text == "Ada"
    # Back hides the keyboard first, then leaves the page, then the app
    s = Screen(env.step(Action("Back")).observation.xml)
    assert s.focused_field is None and s.title == "Create contact"
    s = Screen(env.step(Action("Back")).observation.xml)
    assert s.title == "Contacts"
    obs = env.step(Action("Back")).observation
    assert obs.app == "Home"
    assert Screen(obs.xml).find(text="Contacts", rid="icon") is not None
    # the launcher icon launches the app
    obs = env.step(tap(Screen(obs.xml), text="Contacts", rid="icon")).observation
    assert obs.app == "Contacts"


def test_scrolling_reveals_offscreen_items_and_stops_at_end():
    env = SimEnv(perturb="none")
    env.reset(TASK)
    obs = env.step(Action("Launch", app="Contacts")).observation
    names = [c.name for c in env.device.app("Contacts").ordered()]
    s = Screen(obs.xml)
    assert s.find(text=names[-1]) is None
    last = None
    for _ in range(10):
        res = env.step(Action("Swipe", direction="up", dist="long"))
        if res.info["effect"] == "scroll_end":
            break
        last = res.observation
    assert Screen(last.xml).find(text=names[-1]) is not None
    assert Screen(last.xml).find(text=names[0]) is None


def test_type_without_focus_and_tap_on_nothing_are_harmless():
    env = SimEnv(perturb="none")
    env.reset(TASK)
    before = env.step(Action("Launch", app="Contacts")).observation.xml
    res = env.step(Action("Type", text="hello"))
    assert res.info["effect"] == "no_focus" and not res.info["changed"]
    res = env.step(parse_action('do(action="Tap", element=[0,0,2,2])'))
    assert res.info["effect"] == "no_target"
    assert Screen(res.observation.xml).title == Screen(before).title == "Contacts"


def test_dialog_is_modal_and_delete_works():
    env = SimEnv(perturb="none")
    env.reset(TASK)
    s = Screen(env.step(Action("Launch", app="Contacts")).observation.xml)
    first = env.device.app("Contacts").ordered()[0].name
    s = Screen(env.step(tap(s, text=first)).observation.xml)
    s = Screen(env.step(tap(s, desc="Delete")).observation.xml)
    assert s.find(text="Delete contact?") is not None
    # a tap outside the dialog does nothing
    res = env.step(Action("Tap", element=(0, 300, 10, 310)))
    assert res.info["effect"] == "no_target"
    s = Screen(env.step(tap(Screen(res.observation.xml), text="Delete", cls="Button")).observation.xml)
    assert env.device.app("Contacts").find(first) is None and s.title == "Contacts"


def test_perturbations_popup_and_loading():
    seen_popup = seen_loading = False
    for seed in range(40):
        dev = Device(seed=seed, perturb=Perturb.named("heavy"))
        dev.step(Action("Launch", app="Contacts"))
        s = Screen(dev.xml())
        if s.find(rid="perturbation_dialog"):
            seen_popup = True
            # taps under the pop-up are swallowed
            assert dev.step(Action("Tap", element=(900, 2200, 1000, 2300)))["effect"] in ("no_target", "tap")
        if s.find(rid="progress"):
            seen_loading = True
            dev.overlay = None
            assert dev.step(Action("Tap", element=(900, 2200, 1000, 2300)))["effect"] == "ignored_loading"
            assert dev.step(Action("Wait"))["effect"] == "loaded"
    assert seen_popup and seen_loading
    # shuffled list order under the shuffle perturbation, natural order without
    plain = Device(seed=1).apps["Contacts"].shuffled(list(range(20)))
    assert plain == list(range(20))
    assert Device(seed=1, perturb=Perturb(shuffle=True)).apps["Contacts"].shuffled(list(range(20))) != plain


def test_env_api_errors_and_budget():
    env = SimEnv()
    with pytest.raises(EnvError):
        env.step(Action("Back"))
    with pytest.raises(EnvError, match="cannot reset to task 'world/test/NoSuchTemplate/0'"):
        env.reset("world/test/NoSuchTemplate/0")  # an unknown task is a failed env call, not a KeyError
    obs = env.reset(TASK)
    assert obs.screenshot is None and obs.app == "Home"
    budget = env.task.max_steps
    done = False
    for _ in range(budget):
        res = env.step(Action("Wait"))
        done = res.done
    assert done and res.info.get("truncated")
    assert env.evaluate() == 0.0
    with pytest.raises(EnvError):
        env.step(Action("Wait"))


def test_screenshot_full_resolution():
    env = SimEnv(render=True, perturb="none")
    obs = env.reset(TASK)
    assert obs.screenshot.size == (1080, 2400)
    obs2 = env.step(Action("Launch", app="Contacts")).observation
    assert obs2.screenshot.tobytes() != obs.screenshot.tobytes()
    assert obs2.png()[:8] == b"\x89PNG\r\n\x1a\n"
