"""The adb backend against recorded device outputs: exact command lines per action, output parsing."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from mobilerl.env.actions import Action
from mobilerl.env.adb import (
    APP_PACKAGES,
    AdbEnv,
    RecordedAdbRunner,
    SubprocessAdbRunner,
    escape_input_text,
    extract_hierarchy,
    parse_focused_package,
    parse_wm_size,
    swipe_points,
)
from mobilerl.env.base import EnvCrashed, EnvError, EnvTimeout

FIXTURES = Path(__file__).parent / "fixtures" / "adb"
FOCUS_CMD = "shell dumpsys window | grep -E 'mCurrentFocus|mFocusedApp'"
OBSERVE = [
    ["shell", "uiautomator", "dump", "/sdcard/window_dump.xml"],
    ["exec-out", "cat", "/sdcard/window_dump.xml"],
    ["exec-out", "screencap", "-p"],
    ["shell", "dumpsys window | grep -E 'mCurrentFocus|mFocusedApp'"],
]


def recorded(**overrides: bytes | str) -> dict[str, bytes | str]:
    responses: dict[str, bytes | str] = {
        "shell wm size": (FIXTURES / "wm_size.txt").read_text(),
        "shell uiautomator dump /sdcard/window_dump.xml": (FIXTURES / "uiautomator_dump.txt").read_text(),
        "exec-out cat /sdcard/window_dump.xml": (FIXTURES / "window_dump.xml").read_bytes(),
        "exec-out screencap -p": (FIXTURES / "screencap.png").read_bytes(),
        FOCUS_CMD: (FIXTURES / "dumpsys_window.txt").read_text(),
        "shell monkey -p com.google.android.contacts -c android.intent.category.LAUNCHER 1": (
            "  bash arg: -p\n  bash arg: com.google.android.contacts\n  bash arg: -c\n"
            "  bash arg: android.intent.category.LAUNCHER\n  bash arg: 1\nargs: [-p, com.google.android.contacts, "
            "-c, android.intent.category.LAUNCHER, 1]\nEvents injected: 1\n## Network stats: elapsed time=41ms\n"
        ),
        "shell monkey -p com.arduia.expense -c android.intent.category.LAUNCHER 1": (
            "  bash arg: -p\n  bash arg: com.arduia.expense\n** No activities found to run, monkey aborted.\n"
        ),
    }
    responses.update(overrides)
    return responses


def make_env(**kw) -> tuple[AdbEnv, RecordedAdbRunner, list[float]]:
    runner = RecordedAdbRunner(recorded(**kw.pop("overrides", {})))
    sleeps: list[float] = []
    env = AdbEnv(runner, sleep=sleeps.append, **kw)
    return env, runner, sleeps


def actions_only(calls: list[list[str]]) -> list[list[str]]:
    """The commands that act on the device (observation and size queries left out)."""
    return [c for c in calls if c not in OBSERVE and c != ["shell", "wm", "size"]]


def test_reset_goes_home_and_observes_recorded_device():
    env, runner, sleeps = make_env()
    obs = env.reset("world/test/ContactsAddContact/3")
    assert runner.calls == [["shell", "input", "keyevent", "KEYCODE_HOME"], ["shell", "wm", "size"], *OBSERVE]
    assert obs.xml.startswith("<?xml") and obs.xml.endswith("</hierarchy>")
    assert 'text="Alice Nguyen"' in obs.xml and "UI hierchary" not in obs.xml
    assert (obs.width, obs.height) == (1080, 2400)
    assert obs.app == "Contacts" and obs.step == 0
    assert obs.screenshot is not None and obs.screenshot.size == (54, 120) and obs.screenshot.mode == "RGB"
    assert sleeps == [1.0]  # settle time
    env.step(Action("Back"))
    assert runner.calls.count(["shell", "wm", "size"]) == 1  # cached


def test_tap_and_long_press_hit_the_element_centre():
    env, runner, _ = make_env()
    env.reset("t")
    fab = (833, 1901, 1017, 2085)  # "Create contact" in the recorded dump
    env.step(Action("Tap", element=fab))
    env.step(Action("Long Press", element=(0, 298, 1080, 456)))
    assert actions_only(runner.calls)[1:] == [
        ["shell", "input", "tap", "925", "1993"],
        ["shell", "input", "swipe", "540", "377", "540", "377", "1000"],
    ]


@pytest.mark.parametrize(
    ("direction", "dist", "element", "expected"),
    [
        # From the screen centre (540, 1200); unit = 1080 // 10 = 108; vertical moves are doubled.
        # utils_mobile/and_controller.py (THUDM/Android-Lab) swipes long by 10 units: 1200 - 2160 = -960 and
        # 540 - 1080 = -540 there, clamped to the screen here.
        ("up", "short", None, ["540", "1200", "540", "984"]),
        ("up", "medium", None, ["540", "1200", "540", "768"]),
        ("up", "long", None, ["540", "1200", "540", "0"]),
        ("down", "medium", None, ["540", "1200", "540", "1632"]),
        ("left", "short", None, ["540", "1200", "432", "1200"]),
        ("left", "long", None, ["540", "1200", "0", "1200"]),
        ("right", "medium", None, ["540", "1200", "756", "1200"]),
        # From an element's centre (the contact list, centre (540, 1223)).
        ("up", "medium", (0, 298, 1080, 2148), ["540", "1223", "540", "791"]),
        # Clamped to the screen: from (925, 1993) a long down swipe would end at y=2641.
        ("down", "long", (833, 1901, 1017, 2085), ["925", "1993", "925", "2399"]),
        ("right", "long", (833, 1901, 1017, 2085), ["925", "1993", "1079", "1993"]),
    ],
)
def test_swipe_geometry(direction, dist, element, expected):
    env, runner, _ = make_env()
    env.reset("t")
    env.step(Action("Swipe", direction=direction, dist=dist, element=element))
    assert actions_only(runner.calls)[-1] == ["shell", "input", "swipe", *expected, "400"]


def test_swipe_points_default_distance_is_medium():
    assert swipe_points(Action("Swipe", direction="up"), 1080, 2400) == ((540, 1200), (540, 768))


def test_mobilerl_horizontal_swipes_and_precise_swipes():
    # android_lab/utils_mobile/and_controller.py (THUDM/MobileRL), 1080 wide, from (540, 1200): left short
    # ends at x = 540 - 108 * 2.5 = 270.0, right medium at 540 + 216 * 2.5 = 1080.0; vertical as AndroidLab.
    assert swipe_points(Action("Swipe", direction="left", dist="short"), 1080, 2400, 2.5) == ((540, 1200), (270, 1200))
    assert swipe_points(Action("Swipe", direction="right"), 1080, 2400, 2.5)[1] == (1079, 1200)
    assert swipe_points(Action("Swipe", direction="up"), 1080, 2400, 2.5)[1] == (540, 768)
    env, runner, _ = make_env(swipe_horizontal=2.5)
    env.reset("t")
    env.step(Action("Swipe", start=(300, 2000), end=(300, 500)))  # swipe_precise: point to point, 400 ms
    env.step(Action("Swipe", direction="left", dist="short"))
    assert actions_only(runner.calls)[1:] == [
        ["shell", "input", "swipe", "300", "2000", "300", "500", "400"],
        ["shell", "input", "swipe", "540", "1200", "270", "1200", "400"],
    ]


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("hello", "hello"),
        ("hello world", "hello%sworld"),
        ("Alice O'Brien", "Alice%sO\\'Brien"),
        ('say "hi" & run; (now)', 'say%s\\"hi\\"%s\\&%srun\\;%s\\(now\\)'),
        ("$HOME `id` a|b <x> *?", "\\$HOME%s\\`id\\`%sa\\|b%s\\<x\\>%s\\*\\?"),
        ("back\\slash #tag ~user", "back\\\\slash%s\\#tag%s\\~user"),
        ("+1 (555) 010-9999", "+1%s\\(555\\)%s010-9999"),
        ("a@b.com", "a@b.com"),
    ],
)
def test_input_text_escaping(text, escaped):
    assert escape_input_text(text) == escaped


def test_type_commands_word_by_word_newlines_and_non_ascii():
    # android_world/env/adb_utils.py type_text: one input_text per word and per space, Enter per newline.
    env, runner, _ = make_env()
    env.reset("t")
    env.step(Action("Type", text="Buy milk & eggs\nCall  Bob"))
    assert actions_only(runner.calls)[1:] == [
        ["shell", "input", "text", w]
        if w != "\n"
        else ["shell", "input", "keyevent", "KEYCODE_ENTER"]
        for w in ["Buy", "%s", "milk", "%s", "\\&", "%s", "eggs", "\n", "Call", "%s", "%s", "Bob"]
    ]
    n = len(runner.calls)
    result = env.step(Action("Type", text="café"))  # ADBKeyBoard is not the input method: a clear error
    assert "ADBKeyBoard" in result.info["error"] and "ime set" in result.info["error"]
    assert [c for c in runner.calls[n:] if c[:2] in (["shell", "input"], ["shell", "am"])] == []

    b64 = base64.b64encode("café".encode()).decode()
    broadcast = ["shell", "am", "broadcast", "-a", "ADB_INPUT_B64", "--es", "msg", b64]
    ime = {"shell settings get secure default_input_method": "com.android.adbkeyboard/.AdbIME\n"}
    for kw in ({"adb_keyboard": True}, {"overrides": ime}):
        env, runner, _ = make_env(**kw)
        env.reset("t")
        assert env.step(Action("Type", text="café")).info == {}
        assert actions_only(runner.calls)[-1] == broadcast


def test_type_clears_the_field_when_asked_and_enter_is_a_key():
    # and_controller.py (THUDM/MobileRL, THUDM/Android-Lab) clears with 100 DEL key presses before typing.
    clear = [["shell", "input", "keyevent", "KEYCODE_MOVE_END"], ["shell", "input", "keyevent", *["KEYCODE_DEL"] * 100]]
    env, runner, _ = make_env()
    env.reset("t")
    env.step(Action("Type", text="Paris", clear=True))
    env.step(Action("Enter"))
    env.step(Action("Type", text="x"))
    assert actions_only(runner.calls)[1:] == [
        *clear,
        ["shell", "input", "text", "Paris"],
        ["shell", "input", "keyevent", "KEYCODE_ENTER"],
        ["shell", "input", "text", "x"],
    ]
    env, runner, _ = make_env(clear_before_type=True)
    env.reset("t")
    env.step(Action("Type", text="x"))
    assert actions_only(runner.calls)[1:] == [*clear, ["shell", "input", "text", "x"]]


def test_launch_keys_wait_and_finish():
    env, runner, sleeps = make_env(wait_s=3.0)
    env.reset("t")
    assert env.step(Action("Launch", app="Contacts")).info == {}
    assert (
        env.step(Action("Launch", app="pro expense")).info["error"].endswith("is not installed on the device")
    )
    unknown = env.step(Action("Launch", app="Snapchat"))
    assert "unknown app 'Snapchat'" in unknown.info["error"]
    env.step(Action("Back"))
    env.step(Action("Home"))
    sleeps.clear()
    env.step(Action("Wait"))
    assert sleeps == [3.0, 1.0]  # the wait itself, then settle
    n = len(runner.calls)
    result = env.step(Action("Finish", message="done"))
    assert result.done and result.info == {"message": "done"}
    assert actions_only(runner.calls[n:]) == []  # Finish touches nothing
    assert actions_only(runner.calls)[1:] == [
        [
            "shell",
            "monkey",
            "-p",
            "com.google.android.contacts",
            "-c",
            "android.intent.category.LAUNCHER",
            "1",
        ],
        ["shell", "monkey", "-p", "com.arduia.expense", "-c", "android.intent.category.LAUNCHER", "1"],
        ["shell", "input", "keyevent", "KEYCODE_BACK"],
        ["shell", "input", "keyevent", "KEYCODE_HOME"],
    ]
    assert result.observation.step == 7


def test_app_package_map_and_package_passthrough():
    env, _, _ = make_env()
    assert APP_PACKAGES["Simple SMS Messenger"] == "com.simplemobiletools.smsmessenger"
    assert APP_PACKAGES["Retro Music"] == "code.name.monkey.retromusic"
    assert env.package_for("simple calendar pro") == "com.simplemobiletools.calendar.pro"
    assert env.package_for("org.example.app") == "org.example.app"
    assert env.package_for("Not An App") is None
    assert env.app_name("com.arduia.expense") == "Pro Expense"
    assert env.app_name("com.google.android.apps.nexuslauncher") == "Home"
    assert env.app_name("org.unknown") == "org.unknown"


def test_evaluate_needs_a_verifier():
    env, _, _ = make_env()
    env.reset("world/test/ContactsAddContact/3")
    assert env.evaluate() is None
    seen = []
    env = AdbEnv(
        RecordedAdbRunner(recorded()), sleep=lambda s: None, verifier=lambda e, t: seen.append(t) or 1.0
    )
    env.reset("world/test/ContactsAddContact/3")
    assert env.evaluate() == 1.0 and seen == ["world/test/ContactsAddContact/3"]
    with pytest.raises(EnvError, match="before reset"):
        AdbEnv(RecordedAdbRunner(recorded())).step(Action("Back"))


def test_parsers():
    assert parse_wm_size("Physical size: 1080x2400\n") == (1080, 2400)
    assert parse_wm_size("Physical size: 1440x3120\nOverride size: 1080x2340\n") == (1080, 2340)
    with pytest.raises(EnvError, match="cannot parse screen size"):
        parse_wm_size("error: closed")
    assert (
        parse_focused_package((FIXTURES / "dumpsys_window.txt").read_text()) == "com.google.android.contacts"
    )
    launcher = (FIXTURES / "dumpsys_window_launcher.txt").read_text()  # mCurrentFocus=null
    assert parse_focused_package(launcher) == "com.google.android.apps.nexuslauncher"
    assert parse_focused_package("") is None
    with pytest.raises(EnvError, match="no hierarchy"):
        extract_hierarchy("ERROR: null root node returned by UiTestAutomationBridge.")
    assert extract_hierarchy("junk<?xml version='1.0' ?><hierarchy/></hierarchy>\nUI hierchary dumped") == (
        "<?xml version='1.0' ?><hierarchy/></hierarchy>"
    )


def test_launcher_observation_and_dump_failure():
    env, _, _ = make_env(
        overrides={FOCUS_CMD: (FIXTURES / "dumpsys_window_launcher.txt").read_text()}, screenshot=False
    )
    obs = env.reset("t")
    assert obs.app == "Home" and obs.screenshot is None

    env, runner, sleeps = make_env(
        overrides={"shell uiautomator dump /sdcard/window_dump.xml": "ERROR: could not get idle state.\n"}
    )
    with pytest.raises(EnvError, match="uiautomator dump failed: ERROR: could not get idle state"):
        env.reset("t")
    assert (
        runner.calls.count(["shell", "uiautomator", "dump", "/sdcard/window_dump.xml"]) == 2
    )  # retried once

    env, _, _ = make_env(overrides={"exec-out screencap -p": b"\x00\x00 not a png"})
    with pytest.raises(EnvError, match="did not return a PNG"):
        env.reset("t")


def test_recorded_runner_strict_mode():
    runner = RecordedAdbRunner({}, default=None)
    with pytest.raises(EnvError, match="no recorded response for `adb shell wm size`"):
        runner.run(["shell", "wm", "size"])


@pytest.fixture
def fake_adb(tmp_path: Path) -> Path:
    script = tmp_path / "adb"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"wm size"*) echo "Physical size: 1080x2400" ;;\n'
        '  *offline*) echo "error: device offline" >&2; exit 1 ;;\n'
        "  *slow*) exec sleep 5 ;;\n"
        '  *) echo "unknown command: $*" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_subprocess_runner_errors(fake_adb: Path):
    runner = SubprocessAdbRunner(serial="emulator-5554", adb=str(fake_adb), timeout=0.5)
    assert runner.run(["shell", "wm", "size"]) == b"Physical size: 1080x2400\n"
    with pytest.raises(EnvCrashed, match="device offline"):
        runner.run(["shell", "offline"])
    with pytest.raises(EnvTimeout, match="within 0.5s"):
        runner.run(["shell", "slow"])
    with pytest.raises(EnvError, match="exit 2.*unknown command: -s emulator-5554 shell bogus"):
        runner.run(["shell", "bogus"])
    with pytest.raises(EnvError, match="adb executable not found"):
        SubprocessAdbRunner(adb=os.path.join(str(fake_adb.parent), "missing-adb")).run(["devices"])
