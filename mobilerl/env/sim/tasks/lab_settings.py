"""AndroidLab-style tasks in Settings (network, display, sound, battery, time, apps), with sub-goals."""

from __future__ import annotations

from mobilerl.env.sim.tasks.base import Template
from mobilerl.env.sim.tasks.world_clock import row_subtitle, set_stepper
from mobilerl.env.sim.tasks.world_settings import open_app_info, open_bluetooth, pct, set_switch

NEW_DEVICE_NAMES = ("my AVD", "Pixel of Sam", "Office phone", "Kitchen Pixel", "Travel buddy", "Test device 2")


def _norm(s: str) -> str:
    return " ".join(s.strip().lower().split())


def _settings(dev):
    return dev.app("Settings")


def _in(dev, page: str) -> bool:
    """The Settings app is in front showing ``page`` (somewhere on its back stack)."""
    return dev.foreground == "Settings" and any(ps.name == page for ps in _settings(dev).stack)


def yes_no(answer: str | None) -> bool | None:
    """Reads a yes/no (on/off) answer; None when it says neither clearly (e.g. "I do not know")."""
    if answer is None:
        return None
    words = set(_norm(answer).replace(",", " ").replace(".", " ").replace("!", " ").split())
    if "yes" in words and "no" not in words:
        return True
    if "no" in words and "yes" not in words:
        return False
    pos = bool(words & {"on", "open", "opened", "enabled", "active"})
    neg = bool(words & {"off", "closed", "disabled", "inactive"})
    negated = bool(words & {"not", "isn't", "isnt", "wasn't"})
    if pos and not neg:
        return not negated
    if neg and not pos and not negated:
        return False
    return None


class LabSettingsAlarmVolumeMax(Template):
    suite = "lab"
    name = "LabSettingsAlarmVolumeMax"
    template = "Set my alarm volume to max"
    difficulty = "easy"
    tags = ()
    apps = ("Settings",)
    complexity = 1.5

    def sample(self, rng, dev):
        return {"others": {k: v for k, v in _settings(dev).volume.items() if k != "alarm"},
                "start": _settings(dev).volume["alarm"]}

    def check(self, dev, p):
        vol = _settings(dev).volume
        return vol["alarm"] == 100 and all(vol[k] == v for k, v in p["others"].items())

    def subgoals(self, p):
        return [("open Sound & vibration", lambda dev: _in(dev, "sound") or self.check(dev, p)),
                ("alarm volume raised", lambda dev: _settings(dev).volume["alarm"] > p["start"]),
                ("alarm volume at max", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="Sound & vibration", rid="title")
        yield from set_stepper(x, "alarm_volume", "Alarm volume", 100, pct)
        yield x.finish()


class LabSettingsBluetoothName(Template):
    suite = "lab"
    name = "LabSettingsBluetoothName"
    template = 'change my bluetooth device name to "{device_name}"'
    difficulty = "medium"
    tags = ("data_edit",)
    apps = ("Settings",)
    complexity = 1.5

    def sample(self, rng, dev):
        return {"device_name": rng.choice(NEW_DEVICE_NAMES)}

    def check(self, dev, p):
        return _settings(dev).device_name == p["device_name"]

    def subgoals(self, p):
        return [("open the Bluetooth settings", lambda dev: _in(dev, "bluetooth") or self.check(dev, p)),
                ("device name changed", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_bluetooth(x)
        yield x.tap(text="Device name", rid="title")
        yield from x.fill("device_name_input", p["device_name"])
        yield x.tap(text="Rename", rid="ok")
        yield x.finish()


class LabSettingsAirplaneQuery(Template):
    suite = "lab"
    name = "LabSettingsAirplaneQuery"
    template = "Does my airplane mode open or not"
    difficulty = "easy"
    tags = ("information_retrieval",)
    apps = ("Settings",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        return {"on": rng.random() < 0.5}

    def setup(self, dev, p):
        _settings(dev).airplane = p["on"]

    def check(self, dev, p):
        return yes_no(dev.answer) is p["on"] and _settings(dev).airplane == p["on"]

    def subgoals(self, p):
        return [("open Network & internet", lambda dev: _in(dev, "network") or self.check(dev, p)),
                ("answer whether airplane mode is on", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield x.tap(text="Network & internet", rid="title")
        on = x.el(rid="airplane_mode", cls="Switch").checked
        yield x.finish("Yes, airplane mode is on" if on else "No, airplane mode is off")


class LabSettingsTimeZoneQuery(Template):
    suite = "lab"
    name = "LabSettingsTimeZoneQuery"
    template = "What is my time zone"
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading")
    apps = ("Settings",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        return {"zone": _settings(dev).timezone}

    def check(self, dev, p):
        if dev.answer is None:
            return False
        offset, name = p["zone"].split(" ", 1)
        got = _norm(dev.answer)
        return offset.lower() in got or name.lower() in got

    def subgoals(self, p):
        return [("open System > Date & time", lambda dev: _in(dev, "datetime") or self.check(dev, p)),
                ("answer with the time zone", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from x.tap_scrolled(text="System", rid="title")
        yield x.tap(text="Date & time", rid="title")
        zone = yield from row_subtitle(x, "Time zone")
        yield x.finish(zone)


class LabSettingsBatteryPercentage(Template):
    suite = "lab"
    name = "LabSettingsBatteryPercentage"
    template = "Show battery percentage in status bar"
    difficulty = "easy"
    tags = ()
    apps = ("Settings",)
    complexity = 1.0

    def setup(self, dev, p):
        _settings(dev).battery_pct = False

    def sample(self, rng, dev):
        return {"saver": _settings(dev).battery_saver}

    def check(self, dev, p):
        s = _settings(dev)
        return s.battery_pct and s.battery_saver == p["saver"]

    def subgoals(self, p):
        return [("open Battery settings", lambda dev: _in(dev, "battery") or self.check(dev, p)),
                ("battery percentage shown", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield x.tap(text="Battery", rid="title")
        yield from set_switch(x, "battery_percentage", True)
        yield x.finish()


class LabSettingsDisableNotifications(Template):
    suite = "lab"
    name = "LabSettingsDisableNotifications"
    template = "Disable {app_s} APP notifications"
    difficulty = "medium"
    tags = ("data_edit",)
    apps = ("Settings",)
    complexity = 2.2

    def sample(self, rng, dev):
        apps = [e for e in _settings(dev).installed() if e.notifications and e.simulated and e.name != "Settings"]
        app = rng.choice(apps).name
        return {"app": app, "app_s": app + ("'" if app.endswith("s") else "'s"),
                "muted": [e.name for e in _settings(dev).installed() if not e.notifications]}

    def check(self, dev, p):
        muted = sorted(e.name for e in _settings(dev).installed() if not e.notifications)
        return muted == sorted([*p["muted"], p["app"]])

    def subgoals(self, p):
        return [("open the app's App info", lambda dev: _in(dev, "appinfo") or self.check(dev, p)),
                ("notifications disabled", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Settings")
        yield from open_app_info(x, p["app"])
        yield x.tap(text="Notifications", rid="title")
        yield from set_switch(x, "notifications_switch", False)
        yield x.finish()
