"""Real-device backend: a synchronous :class:`~mobilerl.env.base.Env` that drives a phone or AVD over adb.

Every device command goes through one :class:`AdbRunner`, so the same code runs against a device
(:class:`SubprocessAdbRunner`) or recorded outputs (:class:`RecordedAdbRunner`, the tests). Observing is
``uiautomator dump`` + ``screencap``; actions are ``input`` / ``monkey`` commands.

Swipe geometry (AndroidLab's ``and_controller.py``): the finger starts at the element's centre (the
screen's without one) and moves *in* ``direction`` by ``k * (width // 10)`` horizontally, twice that
vertically, k = 1, 2, 10 for short/medium/long, clamped to the screen ("up" reveals what is below).
MobileRL's controller moves 2.5 times as far horizontally (``swipe_horizontal=2.5``). A precise swipe
(``start``/``end``) goes from point to point.

Type types word by word, as android_world's ``adb_utils.type_text`` does (one ``input text`` per word and
per space, Enter per newline). ``clear=True`` (or ``clear_before_type``) first moves to the line's end and
deletes up to 100 characters, as AndroidLab's and MobileRL's controllers do. ``input text``
types ASCII only and cannot type a literal "%s"; non-ASCII text goes through ADBKeyBoard's broadcast when
ADBKeyBoard is the input method. :meth:`AdbEnv.evaluate` returns ``None`` without a ``verifier``.
"""

from __future__ import annotations

import base64
import io
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from PIL import Image

from mobilerl.env.actions import (
    BACK,
    ENTER,
    FINISH,
    HOME,
    LAUNCH,
    LONG_PRESS,
    SWIPE,
    TAP,
    TYPE,
    WAIT,
    Action,
)
from mobilerl.env.base import EnvCrashed, EnvError, EnvTimeout, Observation, StepResult, TaskSpec

# AndroidWorld's apps (and a few system ones) by the names agents use in Launch(app=...).
APP_PACKAGES: dict[str, str] = {
    "Contacts": "com.google.android.contacts",
    "Clock": "com.google.android.deskclock",
    "Settings": "com.android.settings",
    "Markor": "net.gsantner.markor",
    "Simple SMS Messenger": "com.simplemobiletools.smsmessenger",
    "Simple Calendar Pro": "com.simplemobiletools.calendar.pro",
    "Simple Gallery Pro": "com.simplemobiletools.gallery.pro",
    "Simple Draw Pro": "com.simplemobiletools.draw.pro",
    "Audio Recorder": "com.dimowner.audiorecorder",
    "Pro Expense": "com.arduia.expense",
    "Broccoli": "com.flauschcode.broccoli",
    "Retro Music": "code.name.monkey.retromusic",
    "Files": "com.google.android.documentsui",
    "Camera": "com.android.camera2",
    "Chrome": "com.android.chrome",
    "Joplin": "net.cozic.joplin",
    "OpenTracks": "de.dennisguse.opentracks",
    "OsmAnd": "net.osmand",
    "Tasks": "org.tasks",
    "VLC": "org.videolan.vlc",
    "Expense": "com.arduia.expense",
    "Phone": "com.google.android.dialer",
    "Messages": "com.google.android.apps.messaging",
    "Calendar": "com.google.android.calendar",
    "Gmail": "com.google.android.gm",
    "Maps": "com.google.android.apps.maps",
    "YouTube": "com.google.android.youtube",
    "Google Play": "com.android.vending",
    "Photos": "com.google.android.apps.photos",
}

LAUNCHER_PACKAGES: frozenset[str] = frozenset(
    {
        "com.google.android.apps.nexuslauncher",
        "com.android.launcher3",
        "com.android.launcher",
        "com.sec.android.app.launcher",
    }
)

DUMP_PATH = "/sdcard/window_dump.xml"
SWIPE_STEPS = {"short": 1, "medium": 2, "long": 10}  # tenths of the screen width (AndroidLab, MobileRL)
CLEAR_DELETES = 100  # DEL presses that clear a field (AndroidLab, MobileRL)
ADB_KEYBOARD_IME = "com.android.adbkeyboard/.AdbIME"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Characters the device shell (mksh) would interpret; backslash-escaping a harmless one is a no-op.
_SHELL_SPECIAL = set("\\'\"`$&|;<>()[]{}*?!~#^=")
_DEVICE_GONE = (
    "device offline",
    "no devices/emulators found",
    "device not found",
    "device unauthorized",
    "error: closed",
)


class AdbRunner(Protocol):
    """Runs one adb command (arguments after ``adb [-s serial]``) and returns its stdout."""

    def run(self, args: list[str]) -> bytes: ...


class SubprocessAdbRunner:
    """Runs adb as a subprocess. A vanished device raises :class:`EnvCrashed`, a hung command :class:`EnvTimeout`."""

    def __init__(self, serial: str | None = None, adb: str = "adb", timeout: float = 30.0):
        self.serial = serial
        self.adb = adb
        self.timeout = timeout

    def run(self, args: list[str]) -> bytes:
        cmd = [self.adb, *(["-s", self.serial] if self.serial else []), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=self.timeout, check=False)
        except FileNotFoundError as e:
            raise EnvError(
                f"adb executable not found ({self.adb!r}); install platform-tools or pass adb="
            ) from e
        except subprocess.TimeoutExpired as e:
            raise EnvTimeout(f"adb {' '.join(args)} did not finish within {self.timeout}s") from e
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
            msg = f"adb {' '.join(args)} failed (exit {proc.returncode}): {err}"
            if any(s in err for s in _DEVICE_GONE):
                raise EnvCrashed(msg)
            raise EnvError(msg)
        return proc.stdout


class RecordedAdbRunner:
    """Replays recorded stdout per command line (``" ".join(args)``) and records every call made.

    Commands without a recording return ``default`` (``b""``, what input commands print), or raise
    :class:`EnvError` when ``default`` is ``None``.
    """

    def __init__(self, responses: Mapping[str, bytes | str], default: bytes | None = b""):
        self.responses = {k: v.encode() if isinstance(v, str) else v for k, v in responses.items()}
        self.default = default
        self.calls: list[list[str]] = []

    def run(self, args: list[str]) -> bytes:
        self.calls.append(list(args))
        key = " ".join(args)
        if key in self.responses:
            return self.responses[key]
        if self.default is None:
            raise EnvError(f"no recorded response for `adb {key}`")
        return self.default


# -- pure helpers (tested directly) ---------------------------------------------------------------------


def escape_input_text(text: str) -> str:
    """Escape one line of ASCII text for ``adb shell input text``: spaces -> %s, metacharacters backslashed."""
    out = []
    for ch in text:
        if ch == " ":
            out.append("%s")
        elif ch == "\t":
            out.append("%s%s")
        elif ch in _SHELL_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def parse_wm_size(output: str) -> tuple[int, int]:
    """``wm size`` output -> (width, height); an ``Override size`` wins over the physical size."""
    sizes = dict(re.findall(r"(Physical|Override) size:\s*(\d+x\d+)", output))
    size = sizes.get("Override") or sizes.get("Physical")
    if size is None:
        raise EnvError(f"cannot parse screen size from `wm size` output: {output.strip()[:200]!r}")
    w, h = size.split("x")
    return int(w), int(h)


_FOCUS_RE = re.compile(r"mCurrentFocus=Window\{\S+ \S+ ([\w.]+)/")
_FOCUSED_APP_RE = re.compile(r"mFocusedApp=\S*\{\S+ \S+ ([\w.]+)/")


def parse_focused_package(output: str) -> str | None:
    """The foreground package from ``dumpsys window`` (mCurrentFocus, else mFocusedApp); None if unknown."""
    m = _FOCUS_RE.search(output) or _FOCUSED_APP_RE.search(output)
    return m.group(1) if m else None


def extract_hierarchy(output: str) -> str:
    """The ``<?xml …><hierarchy>…</hierarchy>`` document inside uiautomator output."""
    start = output.find("<?xml")
    if start < 0:
        start = output.find("<hierarchy")
    end = output.rfind("</hierarchy>")
    if start < 0 or end < 0:
        raise EnvError(f"uiautomator dump returned no hierarchy: {output.strip()[:200]!r}")
    return output[start : end + len("</hierarchy>")]


def swipe_points(
    action: Action, width: int, height: int, horizontal: float = 1.0
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Start and end points of a Swipe action (see the module docstring for the geometry)."""

    def clamp(x: int, y: int) -> tuple[int, int]:
        return min(max(x, 0), width - 1), min(max(y, 0), height - 1)

    if action.start is not None and action.end is not None:
        return clamp(*action.start), clamp(*action.end)
    if action.direction is None:
        raise EnvError("Swipe needs a direction")
    x, y = action.center if action.center is not None else (width // 2, height // 2)
    unit = width // 10 * SWIPE_STEPS[action.dist or "medium"]
    side = round(unit * horizontal)
    dx, dy = {"up": (0, -2 * unit), "down": (0, 2 * unit), "left": (-side, 0), "right": (side, 0)}[action.direction]
    return (x, y), clamp(x + dx, y + dy)


def input_words(text: str) -> list[str]:
    """``input text`` arguments that type ``text`` word by word (``%s`` per space); ``"\n"`` means Enter."""
    out: list[str] = []
    for i, line in enumerate(text.split("\n")):
        if i:
            out.append("\n")
        words = line.split(" ")
        for j, word in enumerate(words):
            if word:
                out.append(escape_input_text(word))
            if j < len(words) - 1:
                out.append("%s")
    return out


# -- the env --------------------------------------------------------------------------------------------


class AdbEnv:
    """Synchronous Env over adb (one device). Wrap it in ThreadEnv/ProcessEnv for the async pool.

    Args:
        runner: where commands go (default: ``SubprocessAdbRunner(serial)``).
        screenshot: also capture a screenshot per observation (``exec-out screencap -p``).
        verifier: ``verifier(env, task) -> float | None`` used by :meth:`evaluate`.
        task_setup: ``task_setup(env, task)`` run by :meth:`reset` after going home (seed app data, …).
        settle_s: pause after each action before observing; wait_s: what ``Wait`` sleeps.
        swipe_horizontal: horizontal swipe length relative to AndroidLab's (2.5: MobileRL's controller).
        clear_before_type: clear the field before every Type, as AndroidLab's controller does.
        adb_keyboard: type non-ASCII text through ADBKeyBoard's broadcast: True always, False never, None
            when ADBKeyBoard is the device's input method.
        sleep: the sleep function (tests pass a no-op).
    """

    def __init__(
        self,
        runner: AdbRunner | None = None,
        *,
        serial: str | None = None,
        screenshot: bool = True,
        verifier: Callable[[AdbEnv, TaskSpec | str], float | None] | None = None,
        task_setup: Callable[[AdbEnv, TaskSpec | str], None] | None = None,
        app_packages: Mapping[str, str] | None = None,
        settle_s: float = 1.0,
        wait_s: float = 3.0,
        long_press_ms: int = 1000,
        swipe_ms: int = 400,
        swipe_horizontal: float = 1.0,
        clear_before_type: bool = False,
        adb_keyboard: bool | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.runner: AdbRunner = runner if runner is not None else SubprocessAdbRunner(serial)
        self.screenshot = screenshot
        self.verifier = verifier
        self.task_setup = task_setup
        self.app_packages = dict(APP_PACKAGES if app_packages is None else app_packages)
        self._by_lower = {k.lower(): v for k, v in self.app_packages.items()}
        self._names = {v: k for k, v in reversed(list(self.app_packages.items()))}
        self.settle_s = settle_s
        self.wait_s = wait_s
        self.long_press_ms = long_press_ms
        self.swipe_ms = swipe_ms
        self.swipe_horizontal = swipe_horizontal
        self.clear_before_type = clear_before_type
        self.adb_keyboard = adb_keyboard
        self.sleep = sleep
        self.task: TaskSpec | str | None = None
        self.steps = 0
        self._size: tuple[int, int] | None = None

    # -- device queries --

    def shell(self, *args: str) -> str:
        return self.runner.run(["shell", *args]).decode("utf-8", "replace")

    @property
    def screen_size(self) -> tuple[int, int]:
        if self._size is None:
            self._size = parse_wm_size(self.shell("wm", "size"))
        return self._size

    def dump_xml(self) -> str:
        for attempt in range(2):
            out = self.shell("uiautomator", "dump", DUMP_PATH)
            if "ERROR" not in out:
                break
            if attempt == 0:
                self.sleep(0.5)  # "could not get idle state" while animating: retry once
        else:
            raise EnvError(f"uiautomator dump failed: {out.strip()[:200]}")
        return extract_hierarchy(self.runner.run(["exec-out", "cat", DUMP_PATH]).decode("utf-8", "replace"))

    def capture(self) -> Image.Image:
        data = self.runner.run(["exec-out", "screencap", "-p"])
        if not data.startswith(_PNG_MAGIC):
            raise EnvError(f"screencap did not return a PNG (got {data[:16]!r})")
        return Image.open(io.BytesIO(data)).convert("RGB")

    def foreground_package(self) -> str | None:
        return parse_focused_package(self.shell("dumpsys window | grep -E 'mCurrentFocus|mFocusedApp'"))

    def app_name(self, package: str | None) -> str:
        if package is None:
            return ""
        if package in LAUNCHER_PACKAGES:
            return "Home"
        return self._names.get(package, package)

    def observe(self) -> Observation:
        width, height = self.screen_size
        xml = self.dump_xml()
        shot = self.capture() if self.screenshot else None
        return Observation(
            xml=xml,
            app=self.app_name(self.foreground_package()),
            width=width,
            height=height,
            screenshot=shot,
            step=self.steps,
        )

    # -- Env --

    def reset(self, task: TaskSpec | str) -> Observation:
        self.task = task
        self.steps = 0
        self.shell("input", "keyevent", "KEYCODE_HOME")
        if self.task_setup is not None:
            self.task_setup(self, task)
        self.sleep(self.settle_s)
        return self.observe()

    def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise EnvError("step() before reset()")
        self.steps += 1
        if action.name == FINISH:
            return StepResult(self.observe(), done=True, info={"message": action.message})
        info = self.execute(action)
        self.sleep(self.settle_s)
        return StepResult(self.observe(), done=False, info=info)

    def evaluate(self) -> float | None:
        if self.verifier is None or self.task is None:
            return None
        return self.verifier(self, self.task)

    def close(self) -> None:
        self.task = None

    # -- actions --

    def execute(self, action: Action) -> dict:
        """Perform one non-Finish action on the device; returns step info (``error`` if it could not run)."""
        name = action.name
        if name in (TAP, LONG_PRESS):
            if action.center is None:
                return {"error": f"{name} needs an element"}
            x, y = action.center
            if name == TAP:
                self.shell("input", "tap", str(x), str(y))
            else:
                self.shell("input", "swipe", str(x), str(y), str(x), str(y), str(self.long_press_ms))
        elif name == SWIPE:
            (x1, y1), (x2, y2) = swipe_points(action, *self.screen_size, self.swipe_horizontal)
            self.shell("input", "swipe", str(x1), str(y1), str(x2), str(y2), str(self.swipe_ms))
        elif name == TYPE:
            return self.type_text(action.text or "", clear=action.clear)
        elif name == LAUNCH:
            return self.launch(action.app or "")
        elif name == BACK:
            self.shell("input", "keyevent", "KEYCODE_BACK")
        elif name == HOME:
            self.shell("input", "keyevent", "KEYCODE_HOME")
        elif name == ENTER:
            self.shell("input", "keyevent", "KEYCODE_ENTER")
        elif name == WAIT:
            self.sleep(self.wait_s)
        else:
            raise EnvError(f"AdbEnv cannot execute {name!r}")
        return {}

    def type_text(self, text: str, clear: bool = False) -> dict:
        if not text.isascii() and not self.uses_adb_keyboard():
            return {
                "error": "non-ASCII text cannot be typed with `input text`: install ADBKeyBoard and make it the "
                f"input method (`adb shell ime set {ADB_KEYBOARD_IME}`), or pass adb_keyboard=True"
            }
        if clear or self.clear_before_type:
            self.shell("input", "keyevent", "KEYCODE_MOVE_END")
            self.shell("input", "keyevent", *["KEYCODE_DEL"] * CLEAR_DELETES)
        if not text.isascii():
            b64 = base64.b64encode(text.encode("utf-8")).decode("ascii")
            self.shell("am", "broadcast", "-a", "ADB_INPUT_B64", "--es", "msg", b64)
            return {}
        for word in input_words(text):
            if word == "\n":
                self.shell("input", "keyevent", "KEYCODE_ENTER")
            else:
                self.shell("input", "text", word)
        return {}

    def uses_adb_keyboard(self) -> bool:
        if self.adb_keyboard is not None:
            return self.adb_keyboard
        return self.shell("settings", "get", "secure", "default_input_method").strip() == ADB_KEYBOARD_IME

    def package_for(self, app: str) -> str | None:
        if app in self.app_packages:
            return self.app_packages[app]
        if app.lower() in self._by_lower:
            return self._by_lower[app.lower()]
        if re.fullmatch(r"[A-Za-z][\w]*(\.[A-Za-z][\w]*)+", app):
            return app  # already a package name
        return None

    def launch(self, app: str) -> dict:
        package = self.package_for(app)
        if package is None:
            return {"error": f"unknown app {app!r}; known apps: {', '.join(sorted(self.app_packages))}"}
        out = self.shell("monkey", "-p", package, "-c", "android.intent.category.LAUNCHER", "1")
        if "No activities found" in out or "monkey aborted" in out:
            return {"error": f"app {app!r} ({package}) is not installed on the device"}
        return {}
