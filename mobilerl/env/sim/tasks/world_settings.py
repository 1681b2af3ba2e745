"""AndroidWorld-like tasks in Settings (AndroidWorld's ``System*`` family), and one Settings → Clock task."""

from __future__ import annotations

from collections.abc import Iterator

from mobilerl.env.actions import Action
from mobilerl.env.sim import content
from mobilerl.env.sim.tasks.base import Expert, Template, answer_matches
from mobilerl.env.sim.tasks.world_clock import disable_all_alarms, row_subtitle, set_stepper

NAME_SUFFIXES = ("'s Pixel", "'s phone", " Work Phone", " Travel")


def _settings(dev):
    return dev.app("Settings")


def pct(s: str) -> int:
    return int(s.rstrip("%"))


# ------------------------------------------------------------------------------------ expert helpers
def open_internet(x: Expert) -> Iterator[Action]:
    yield x.tap(text="Network & internet", rid="title")
    yield x.tap(text="Internet", rid="title")


def open_bluetooth(x: Expert) -> Iterator[Action]:
    yield x.tap(text="Connected devices", rid="title")
    yield from x.tap_scrolled(text="Connection preferences", rid="title")
    yield x.tap(text="Bluetooth", rid="title")


def set_switch(x: Expert, rid: str, on: bool) -> Iterator[Action]:
    yield from x.scroll_to(rid=rid, cls="Switch")
    if x.el(rid=rid, cls="Switch").checked != on:
        yield x.tap(rid=rid, cls="Switch")


def open_app_info(x: Expert, app: str) -> Iterator[Action]:
    yield x.tap(text="Apps", rid="title")
    yield x.tap(contains="See all", rid="title")
    yield from x.tap_scrolled(text=app, rid="title")


# ------------------------------------------------------------------------------------------ templates
class _Toggle(Template):
    """Turn a switch on or off; setup puts it in the opposite state first."""

    attr = ""
    difficulty = "easy"
    tags = ()
    apps = ("Settings",)
    complexity = 1.0

    def sample(self, rng, dev):
        return {"on_or_off": rng.choice(["on", "off"])}

    def setup(self, dev, p):
        setattr(_settings(dev), self.attr, p["on_or_off"] != "on")

    def check(self, dev, p):
        return getattr(_settings(dev), self.attr) == (p["on_or_off"] == "on")


class SystemWifiTurnOnOff(_Toggle):
    name = "SystemWifiTurnOnOff"
    template = "Turn Wi-Fi {on_or_off}."
    attr = "wifi"
    tags = ("parameterized",)

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_internet(x)
        yield from set_switch(x, "wifi_switch", p["on_or_off"] == "on")
        yield x.finish()


class SystemBluetoothTurnOnOff(_Toggle):
    name = "SystemBluetoothTurnOnOff"
    template = "Turn Bluetooth {on_or_off}."
    attr = "bluetooth"
    tags = ("parameterized",)
    complexity = 1.2

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_bluetooth(x)
        yield from set_switch(x, "bluetooth_switch", p["on_or_off"] == "on")
        yield x.finish()


class SystemDarkTheme(_Toggle):
    name = "SystemDarkTheme"
    template = "Turn {on_or_off} the dark theme of the phone."
    attr = "dark_theme"
    tags = ("parameterized",)

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="Display", rid="title")
        yield from set_switch(x, "dark_theme", p["on_or_off"] == "on")
        yield x.finish()


class SystemBrightnessMaxMin(Template):
    name = "SystemBrightnessMaxMin"
    template = "Turn the screen brightness to the {max_or_min} value."
    difficulty = "easy"
    tags = ("parameterized",)
    apps = ("Settings",)
    complexity = 1.5

    def sample(self, rng, dev):
        return {"max_or_min": rng.choice(["max", "min"])}

    def check(self, dev, p):
        return _settings(dev).brightness == (100 if p["max_or_min"] == "max" else 0)

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="Display", rid="title")
        yield from set_stepper(x, "brightness", "Brightness level", 100 if p["max_or_min"] == "max" else 0, pct)
        yield x.finish()


class SystemAndroidVersion(Template):
    name = "SystemAndroidVersion"
    template = "What version of Android is this phone running? Answer with the version number only."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Settings",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        return {"version": _settings(dev).android_version}

    def check(self, dev, p):
        return answer_matches(dev.answer, [p["version"], f"Android {p['version']}"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="About phone", rid="title")
        version = yield from row_subtitle(x, "Android version")
        yield x.finish(version)


class SystemDeviceName(Template):
    name = "SystemDeviceName"
    template = "Change the device name of this phone to '{device_name}'."
    difficulty = "medium"
    tags = ("data_edit", "parameterized")
    apps = ("Settings",)
    complexity = 1.5

    def sample(self, rng, dev):
        first = content.person(rng).first
        return {"device_name": first + rng.choice(NAME_SUFFIXES)}

    def check(self, dev, p):
        return _settings(dev).device_name == p["device_name"]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="About phone", rid="title")
        yield x.tap(text="Device name", rid="title")
        yield from x.fill("device_name_input", p["device_name"])
        yield x.tap(text="OK", rid="ok")
        yield x.finish()


class SystemUninstallApp(Template):
    name = "SystemUninstallApp"
    template = "Uninstall the {app} app from this phone."
    difficulty = "medium"
    tags = ("data_edit", "parameterized")
    apps = ("Settings",)
    complexity = 2.2

    def sample(self, rng, dev):
        return {"app": rng.choice(_settings(dev).third_party()).name}

    def check(self, dev, p):
        return _settings(dev).uninstalled == [p["app"]]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_app_info(x, p["app"])
        yield x.tap(text="Uninstall", rid="uninstall")
        yield x.tap(text="OK", rid="confirm_uninstall")
        yield x.finish()


class SystemAppNotificationsOff(Template):
    name = "SystemAppNotificationsOff"
    template = "Turn off all notifications from the {app} app."
    difficulty = "medium"
    tags = ("data_edit", "parameterized")
    apps = ("Settings",)
    complexity = 2.2

    def sample(self, rng, dev):
        apps = [e for e in _settings(dev).third_party() if e.notifications]
        return {"app": rng.choice(apps).name, "muted": [e.name for e in _settings(dev).installed()
                                                         if not e.notifications]}

    def check(self, dev, p):
        s = _settings(dev)
        muted = sorted(e.name for e in s.installed() if not e.notifications)
        return muted == sorted([*p["muted"], p["app"]]) and not s.uninstalled

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_app_info(x, p["app"])
        yield x.tap(text="Notifications", rid="title")
        yield from set_switch(x, "notifications_switch", False)
        yield x.finish()


class SystemWifiOffBluetoothOn(Template):
    name = "SystemWifiOffBluetoothOn"
    template = "Turn off Wi-Fi, then turn on Bluetooth."
    difficulty = "medium"
    tags = ()
    apps = ("Settings",)
    complexity = 1.6

    def sample(self, rng, dev):
        return {"airplane": _settings(dev).airplane}

    def setup(self, dev, p):
        s = _settings(dev)
        s.wifi, s.bluetooth = True, False

    def check(self, dev, p):
        s = _settings(dev)
        return not s.wifi and s.bluetooth and s.airplane == p["airplane"]

    def subgoals(self, p):
        return [("Wi-Fi is off", lambda dev: not _settings(dev).wifi),
                ("Bluetooth is on", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_internet(x)
        yield from set_switch(x, "wifi_switch", False)
        yield x.back()
        yield x.back()
        yield from open_bluetooth(x)
        yield from set_switch(x, "bluetooth_switch", True)
        yield x.finish()


class SystemDndAlarmsOff(Template):
    name = "SystemDndAlarmsOff"
    template = ("I'm going to sleep: turn on Do Not Disturb in Settings and turn off all of my alarms in the "
                "Clock app (keep them, just switch them off).")
    difficulty = "medium"
    tags = ("multi_app",)
    apps = ("Settings", "Clock")
    complexity = 2.0

    def sample(self, rng, dev):
        return {"n_alarms": len(dev.app("Clock").alarms)}

    def setup(self, dev, p):
        _settings(dev).dnd = False

    def check(self, dev, p):
        clock = dev.app("Clock")
        return (_settings(dev).dnd and len(clock.alarms) == p["n_alarms"]
                and not any(a.enabled for a in clock.alarms))

    def subgoals(self, p):
        return [("Do Not Disturb is on", lambda dev: _settings(dev).dnd),
                ("all alarms are off", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="Sound & vibration", rid="title")
        yield from set_switch(x, "dnd_switch", True)
        yield from x.launch("Clock")
        yield from disable_all_alarms(x)
        yield x.finish()
