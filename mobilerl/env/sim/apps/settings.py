"""Settings (modelled on AOSP / Pixel Settings, com.android.settings).

A long top-level list; Network & internet (Internet → Wi-Fi switch and networks, Airplane mode, Private
DNS), Connected devices (saved Bluetooth devices, Connection preferences → Bluetooth with the device
name), Apps (recent apps, a long "All apps" list, per-app App info with notifications, storage and
Uninstall behind a confirmation), Battery, Storage, Sound & vibration (volume steppers, Do Not Disturb),
Display (brightness stepper, dark theme, auto-rotate, screen timeout), System (languages, date & time)
and About phone (device name edit dialog, model, Android version, build number), plus settings search.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import (
    Button,
    Buttons,
    Dialog,
    Field,
    IconButton,
    Page,
    Row,
    Spacer,
    Stepper,
    Switch,
    Text,
    virtualize,
)
from mobilerl.seeding import sim_seed

THIRD_PARTY = (
    ("Airbnb", "com.airbnb.android"), ("Audible", "com.audible.application"), ("Booking.com", "com.booking"),
    ("Discord", "com.discord"), ("Dropbox", "com.dropbox.android"), ("Duolingo", "com.duolingo"),
    ("Evernote", "com.evernote"), ("Headspace", "com.getsomeheadspace.android"),
    ("Instagram", "com.instagram.android"), ("Kindle", "com.amazon.kindle"), ("Lyft", "me.lyft.android"),
    ("Netflix", "com.netflix.mediaclient"), ("Pinterest", "com.pinterest"), ("Reddit", "com.reddit.frontpage"),
    ("Shazam", "com.shazam.android"), ("Signal", "org.thoughtcrime.securesms"), ("Skype", "com.skype.raider"),
    ("Slack", "com.Slack"), ("Snapchat", "com.snapchat.android"), ("Spotify", "com.spotify.music"),
    ("Strava", "com.strava"), ("Telegram", "org.telegram.messenger"), ("TikTok", "com.zhiliaoapp.musically"),
    ("Todoist", "com.todoist"), ("Twitch", "tv.twitch.android.app"), ("Uber", "com.ubercab"),
    ("Waze", "com.waze"), ("WhatsApp", "com.whatsapp"), ("Yelp", "com.yelp.android"),
    ("Zoom", "us.zoom.videomeetings"),
)
SYSTEM_EXTRA = (("Android System WebView", "com.google.android.webview"), ("Gboard", "com.google.android.inputmethod.latin"),
                ("Google Play services", "com.google.android.gms"), ("Google Play Store", "com.android.vending"),
                ("Carrier Services", "com.google.android.ims"))
MODELS = ("Pixel 5", "Pixel 6", "Pixel 6a", "Pixel 7", "Pixel 7 Pro", "Pixel 8")
ANDROID = (("12", "SQ3A.220705.004", "July 5, 2022"), ("13", "TQ3A.230805.001", "August 5, 2023"),
           ("14", "UP1A.231005.007", "October 5, 2023"))
SSIDS = ("Home-5G", "NETGEAR42", "Starbucks WiFi", "xfinitywifi", "TP-Link_3F2A", "Linksys00817", "CoffeeLab Guest",
         "Library-Public", "eduroam", "Airport_Free_WiFi", "Office-Staff", "DIRECT-7B-HP Printer")
BT_DEVICES = (("Pixel Buds Pro", "Headphones"), ("JBL Flip 5", "Speaker"), ("Car Audio", "Car"),
              ("Galaxy Watch5", "Watch"), ("Bose QC45", "Headphones"), ("Logitech K380", "Keyboard"),
              ("Sony WH-1000XM4", "Headphones"), ("Echo Dot", "Speaker"))
TIMEZONES = ("GMT-07:00 Pacific Daylight Time", "GMT-04:00 Eastern Daylight Time", "GMT-05:00 Central Daylight Time",
             "GMT+01:00 British Summer Time", "GMT+02:00 Central European Summer Time", "GMT+08:00 China Standard Time",
             "GMT+09:00 Japan Standard Time", "GMT+05:30 India Standard Time")
LANGUAGES = ("English (United States)", "English (United Kingdom)", "Deutsch (Deutschland)", "Français (France)",
             "Español (España)", "中文 (中国)", "日本語 (日本)")
CARRIERS = ("T-Mobile", "Verizon", "AT&T", "Vodafone", "Orange", "O2")
TIMEOUTS = ("15 seconds", "30 seconds", "1 minute", "2 minutes", "5 minutes", "10 minutes", "30 minutes")
BROWSERS = ("Chrome", "Firefox", "Samsung Internet")
RINGTONES = ("Your New Adventure", "Flutterby", "Copycat", "Crackle", "Spaceship", "Zen Too")
VOLUMES = (("media", "Media volume"), ("call", "Call volume"), ("ring", "Ring & notification volume"),
           ("alarm", "Alarm volume"))




@dataclass
class AppEntry:
    name: str
    package: str
    version: str
    size_mb: float
    data_mb: float
    cache_mb: float
    system: bool = False
    notifications: bool = True
    simulated: bool = False

    @property
    def total_mb(self) -> float:
        return round(self.size_mb + self.data_mb + self.cache_mb, 1)


@dataclass
class Network:
    ssid: str
    secured: bool
    saved: bool
    signal: int  # 1..4
    password: str = ""


def _entry(rng, name: str, package: str, system: bool, simulated: bool = False) -> AppEntry:
    return AppEntry(name, package, f"{rng.randrange(1, 40)}.{rng.randrange(0, 20)}.{rng.randrange(0, 100)}",
                    round(rng.uniform(8, 380), 1), round(rng.uniform(0.5, 600), 1), round(rng.uniform(0.1, 120), 1),
                    system=system, notifications=rng.random() < 0.85, simulated=simulated)


class Settings(App):
    name = "Settings"
    package = "com.android.settings"
    color = (26, 115, 232)
    aliases = ("settings", "system settings", "android settings")

    def setup(self) -> None:
        rng = self.rng
        self.model = rng.choice(MODELS)
        self.android_version, self.build_number, self.patch = rng.choice(ANDROID)
        self.device_name = self.model
        self.phone_number = f"+1 {rng.choice(['415', '650', '206', '512'])} {rng.randrange(201, 999)}-{rng.randrange(0, 10000):04d}"
        self.carrier = rng.choice(CARRIERS)
        self.ip = f"192.168.{rng.randrange(0, 3)}.{rng.randrange(2, 250)}"
        self.wifi_mac = ":".join(f"{rng.randrange(256):02x}" for _ in range(6))
        self.bt_address = ":".join(f"{rng.randrange(256):02x}" for _ in range(6))
        # network
        picks = rng.sample(SSIDS, rng.randrange(5, 9))
        self.networks = [Network(s, rng.random() < 0.7, False, rng.randrange(1, 5)) for s in picks]
        for n in self.networks[:2]:
            n.saved, n.secured = True, True
        self.wifi = rng.random() < 0.6
        self.connected: str | None = self.networks[0].ssid
        self.airplane = rng.random() < 0.2
        self.data_saver = rng.random() < 0.2
        self.hotspot = False
        self.private_dns = rng.choice(["Automatic", "Automatic", "Off"])
        # connected devices
        self.bluetooth = rng.random() < 0.5
        self.bt_devices = rng.sample(BT_DEVICES, rng.randrange(2, 5))
        self.nfc = rng.random() < 0.5
        # display
        self.brightness = rng.randrange(2, 9) * 10
        self.adaptive_brightness = rng.random() < 0.5
        self.dark_theme = rng.random() < 0.4
        self.night_light = rng.random() < 0.2
        self.auto_rotate = rng.random() < 0.5
        self.screen_timeout = rng.choice(TIMEOUTS[:5])
        # sound
        self.volume = {k: rng.randrange(2, 9) * 10 for k, _ in VOLUMES}
        self.dnd = rng.random() < 0.3
        self.vibrate_calls = rng.random() < 0.6
        self.ringtone = rng.choice(RINGTONES)
        # battery, location, system
        self.battery_saver = rng.random() < 0.25
        self.adaptive_battery = True
        self.battery_pct = rng.random() < 0.4
        self.location = rng.random() < 0.7
        self.timezone = rng.choice(TIMEZONES)
        self.auto_time = True
        self.auto_zone = rng.random() < 0.6
        self.use_24h = rng.random() < 0.3
        self.language = rng.choice(LANGUAGES[:5])
        self.default_browser = "Chrome"
        # storage (GB)
        self.storage_total = rng.choice([128, 256])
        self.storage = {"Images": round(rng.uniform(1, 14), 1), "Videos": round(rng.uniform(0.5, 22), 1),
                        "Audio": round(rng.uniform(0.1, 4), 1), "Documents & other": round(rng.uniform(0.2, 6), 1),
                        "Trash": round(rng.uniform(0, 1.2), 1), "System": round(rng.uniform(11, 15), 1)}
        # apps: third-party ones are seeded here, the simulated apps are merged in lazily
        chosen = sorted(rng.sample(range(len(THIRD_PARTY)), rng.randrange(14, 21)))
        self._third = [_entry(rng, *THIRD_PARTY[i], system=False) for i in chosen]
        self._system = [_entry(rng, n, p, system=True) for n, p in SYSTEM_EXTRA]
        self._simulated: dict[str, AppEntry] = {}
        self.uninstalled: list[str] = []
        self.recent = [e.name for e in rng.sample(self._third, 3)]

    # ------------------------------------------------------------------------------ state for tasks
    def _sim_entry(self, name: str) -> AppEntry:
        e = self._simulated.get(name)
        if e is None:
            app = self.device.apps[name]
            e = _entry(random.Random(sim_seed(self.device.seed, "settings-app", name)), name, app.package,
                       system=True, simulated=True)
            e.notifications = True
            self._simulated[name] = e
        return e

    def installed(self) -> list[AppEntry]:
        """Every installed app (simulated apps included), alphabetically, as in "All apps"."""
        out: dict[str, AppEntry] = {}
        for name in self.device.apps:
            out[name.lower()] = self._sim_entry(name)
        for e in self._system + self._third:
            if e.name not in self.uninstalled:
                out.setdefault(e.name.lower(), e)
        return sorted(out.values(), key=lambda e: e.name.lower())

    def third_party(self) -> list[AppEntry]:
        """Seeded, uninstallable apps that no simulated app shadows."""
        sim = {n.lower() for n in self.device.apps}
        return [e for e in self._third if e.name.lower() not in sim and e.name not in self.uninstalled]

    def app_entry(self, name: str) -> AppEntry | None:
        return next((e for e in self.installed() if e.name == name), None)

    @property
    def apps_storage_gb(self) -> float:
        return round(sum(e.total_mb for e in self.installed()) / 1024, 1)

    @property
    def storage_used_gb(self) -> float:
        return round(self.apps_storage_gb + sum(self.storage.values()), 1)

    # ------------------------------------------------------------------------------------- helpers
    def _flip(self, attr: str) -> None:
        setattr(self, attr, not getattr(self, attr))
        self.device.log.append(f"setting:{attr}={getattr(self, attr)}")

    def _choice_dialog(self, title: str, options, current: str, apply, rid: str = "option") -> None:
        def pick(o: str) -> None:
            self.close_dialog()
            apply(o)

        self.dialog(lambda: Dialog(title, body=[
            Row(o, on_tap=lambda o=o: pick(o), rid=rid, selected=o == current) for o in options],
            buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False)]))

    def _rename_dialog(self, title: str, ok_text: str) -> None:
        st = self.page
        st.fields["device_name"] = self.device_name
        st.focus = "device_name"

        def ok() -> None:
            name = st.fields.get("device_name", "").strip()
            if not name:
                self.device.toast = "Device name can't be empty"
                return
            self.device_name = name
            self.device.log.append(f"device_name:{name}")
            st.focus = None
            st.fields.pop("device_name", None)
            self.close_dialog()

        def cancel() -> None:
            st.focus = None
            st.fields.pop("device_name", None)
            self.close_dialog()

        self.dialog(lambda: Dialog(title, body=[Field("device_name", "Device name", rid="device_name_input")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button(ok_text, ok, rid="ok")], on_dismiss=cancel))

    def _stub(self, title: str, *lines: tuple[str, str]) -> None:
        self.push("stub", title=title, lines=lines)

    # --------------------------------------------------------------------------------------- pages
    def _top(self) -> list[tuple[str, str, object]]:
        free = round(self.storage_total - self.storage_used_gb, 1)
        pct = round(100 * self.storage_used_gb / self.storage_total)
        loc = f"On - {3 + len(self._third) // 4} apps have access to location" if self.location else "Off"
        stub = self._stub
        return [
            ("Network & internet", "Wi-Fi, mobile, data usage, and hotspot", lambda: self.push("network")),
            ("Connected devices", "Bluetooth, pairing", lambda: self.push("connected")),
            ("Apps", "Assistant, recent apps, default apps", lambda: self.push("apps")),
            ("Notifications", "Notification history, conversations", lambda: self.push("notifications")),
            ("Battery", f"{self.device.battery}%", lambda: self.push("battery")),
            ("Storage", f"{pct}% used - {free} GB free", lambda: self.push("storage")),
            ("Sound & vibration", "Volume, haptics, Do Not Disturb", lambda: self.push("sound")),
            ("Display", "Dark theme, font size, brightness", lambda: self.push("display")),
            ("Wallpaper & style", "Colors, themed icons, app grid",
             lambda: stub("Wallpaper & style", ("Wallpaper", "Change wallpaper"), ("Themed icons", "Off"))),
            ("Accessibility", "Display, interaction, audio",
             lambda: stub("Accessibility", ("TalkBack", "Off"), ("Select to Speak", "Off"),
                          ("Color and motion", ""), ("Caption preferences", "Off"))),
            ("Security & privacy", "App security, device lock, permissions",
             lambda: stub("Security & privacy", ("App security", "No issues found"), ("Device unlock", "PIN"),
                          ("Privacy", "Permissions, account activity, personal data"))),
            ("Location", loc, lambda: self.push("location")),
            ("Safety & emergency", "Emergency SOS, medical info, alerts",
             lambda: stub("Safety & emergency", ("Emergency SOS", "Off"), ("Medical information", ""),
                          ("Earthquake alerts", "On"))),
            ("Passwords & accounts", "Saved passwords, autofill, synced accounts",
             lambda: stub("Passwords & accounts", ("Passwords", "12 saved passwords"),
                          ("Autofill service", "Google"))),
            ("Digital Wellbeing & parental controls", "Screen time, app timers, bedtime schedules",
             lambda: stub("Digital Wellbeing", ("Dashboard", "Today"), ("Bedtime mode", "Off"),
                          ("Focus mode", "Off"))),
            ("Google", "Services & preferences",
             lambda: stub("Google", ("Backup", "On"), ("Devices & sharing", ""), ("Autofill", "")) ),
            ("System", "Languages, gestures, time, backup", lambda: self.push("system")),
            ("About phone", self.device_name, lambda: self.push("about")),
            ("Tips & support", "Help articles, phone & chat",
             lambda: stub("Tips & support", ("Help", "Browse articles"), ("Contact us", "Phone & chat"))),
        ]

    def page_main(self, st: PageState) -> Page:
        rows = [Row(t, s, on_tap=f, rid="dashboard_tile") for t, s, f in self._top()]
        return Page("Settings", body=rows, scroll_rid="settings_list",
                    actions=[IconButton("Search settings", lambda: self.push("search"), rid="search")])

    def _search_index(self) -> list[tuple[str, str, object]]:
        return [
            ("Wi-Fi", "Network & internet > Internet", lambda: self.push("internet")),
            ("Internet", "Network & internet", lambda: self.push("internet")),
            ("Airplane mode", "Network & internet", lambda: self.push("network")),
            ("Private DNS", "Network & internet", lambda: self.push("network")),
            ("Bluetooth", "Connected devices > Connection preferences", lambda: self.push("bluetooth")),
            ("Device name", "About phone", lambda: self.push("about")),
            ("Brightness level", "Display", lambda: self.push("display")),
            ("Dark theme", "Display", lambda: self.push("display")),
            ("Auto-rotate screen", "Display", lambda: self.push("display")),
            ("Screen timeout", "Display", lambda: self.push("display")),
            ("Do Not Disturb", "Sound & vibration", lambda: self.push("sound")),
            ("Alarm volume", "Sound & vibration", lambda: self.push("sound")),
            ("Media volume", "Sound & vibration", lambda: self.push("sound")),
            ("Battery percentage", "Battery", lambda: self.push("battery")),
            ("Battery Saver", "Battery", lambda: self.push("battery")),
            ("Android version", "About phone", lambda: self.push("about")),
            ("Time zone", "System > Date & time", lambda: self.push("datetime")),
            ("Languages", "System", lambda: self.push("languages")),
            ("All apps", "Apps", lambda: self.push("allapps")),
            ("Storage", "Storage", lambda: self.push("storage")),
            ("Location", "Location", lambda: self.push("location")),
        ]

    def page_search(self, st: PageState) -> Page:
        if not st.fields and st.focus is None and "opened" not in st.args:
            st.args["opened"] = True
            st.focus = "query"
        q = st.fields.get("query", "").strip().lower()
        hits = [Row(t, s, on_tap=f, rid="search_result") for t, s, f in self._search_index() if q and q in t.lower()]
        if q and not hits:
            hits = [Text(f"No results for \"{st.fields['query']}\"", rid="empty")]
        return Page("Search", nav_back=True, body=[Field("query", "Search settings", rid="search_src_text"), *hits])

    def page_stub(self, st: PageState) -> Page:
        return Page(st.args["title"], nav_back=True,
                    body=[Row(t, s, rid="preference") for t, s in st.args["lines"]])

    # -- network
    def page_network(self, st: PageState) -> Page:
        internet = (self.connected or "Not connected") if self.wifi and not self.airplane else (
            "Airplane mode" if self.airplane else "Wi-Fi is off")

        def dns() -> None:
            def apply(o: str) -> None:
                if o == "Private DNS provider hostname":
                    self.push_dns_host()
                else:
                    self.private_dns = o

            self._choice_dialog("Private DNS", ["Off", "Automatic", "Private DNS provider hostname"],
                                self.private_dns if self.private_dns in ("Off", "Automatic")
                                else "Private DNS provider hostname", apply, rid="dns_option")

        body = [
            Row("Internet", internet, on_tap=lambda: self.push("internet"), rid="internet"),
            Row("Calls & SMS", self.carrier, on_tap=lambda: self._stub(
                "Calls & SMS", ("Calls", self.carrier), ("SMS", self.carrier)), rid="calls"),
            Row("SIMs", self.carrier, on_tap=lambda: self._stub(
                "SIMs", (self.carrier, "Active"), ("Roaming", "Off"), ("Mobile data", "On")), rid="sims"),
            Switch("Airplane mode", self.airplane, lambda: self._flip("airplane"), rid="airplane_mode"),
            Row("Hotspot & tethering", "Off", on_tap=lambda: self._stub(
                "Hotspot & tethering", ("Wi-Fi hotspot", "Off"), ("USB tethering", "Off")), rid="hotspot"),
            Switch("Data Saver", self.data_saver, lambda: self._flip("data_saver"), rid="data_saver"),
            Row("VPN", "None", on_tap=lambda: self._stub("VPN", ("No VPNs added", "")), rid="vpn"),
            Row("Private DNS", self.private_dns, on_tap=dns, rid="private_dns"),
        ]
        return Page("Network & internet", body=body, nav_back=True)

    def push_dns_host(self) -> None:
        st = self.page
        st.fields["dns_host"] = self.private_dns if self.private_dns not in ("Off", "Automatic") else ""
        st.focus = "dns_host"

        def save() -> None:
            host = st.fields.get("dns_host", "").strip()
            if not host:
                self.device.toast = "Enter a hostname"
                return
            self.private_dns = host
            st.focus = None
            st.fields.pop("dns_host", None)
            self.close_dialog()

        self.dialog(lambda: Dialog("Private DNS provider hostname",
                                   body=[Field("dns_host", "Enter hostname of DNS provider", rid="dns_host")],
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                            Button("Save", save, rid="save")]))

    def page_internet(self, st: PageState) -> Page:
        body: list = [Switch("Wi-Fi", self.wifi, lambda: self._flip("wifi"), rid="wifi_switch")]
        if self.wifi:
            nets = sorted(self.networks, key=lambda n: (n.ssid != self.connected, -n.signal))
            first, rest = nets[:1], self.shuffled(nets[1:])
            for n in first + rest:
                sub = "Connected" if n.ssid == self.connected else ("Saved" if n.saved else (
                    "Secured" if n.secured else "Open"))
                body.append(Row(n.ssid, sub, on_tap=lambda n=n: self._tap_network(n), rid="wifi_network",
                                icon=f"Wi-Fi signal {n.signal} bars"))
            body.append(Row("Add network", on_tap=lambda: self._stub("Add network", ("Network name", ""),
                                                                     ("Security", "None")), rid="add_network"))
        else:
            body.append(Text("To see available networks, turn Wi-Fi on.", size="small", rid="wifi_off_hint"))
        body += [
            Row(self.carrier, "Mobile data · 5G", rid="mobile_network"),
            Row("Network preferences", "Wi-Fi turns back on automatically", rid="network_prefs",
                on_tap=lambda: self._stub("Network preferences", ("Turn on Wi-Fi automatically", "On"),
                                          ("Notify for public networks", "Off"))),
            Row("Saved networks", f"{sum(n.saved for n in self.networks)} networks", rid="saved_networks",
                on_tap=lambda: self._stub("Saved networks", *((n.ssid, "") for n in self.networks if n.saved))),
        ]
        return Page("Internet", body=body, nav_back=True)

    def _tap_network(self, n: Network) -> None:
        if n.ssid == self.connected:
            self.dialog(lambda: Dialog(n.ssid, f"Connected · signal {n.signal}/4", buttons=[
                Button("Forget", lambda: self._forget(n), rid="forget", primary=False),
                Button("Done", self.close_dialog, rid="done")]))
            return
        if n.saved or not n.secured:
            self.connected = n.ssid
            n.saved = True
            self.device.log.append(f"wifi_connect:{n.ssid}")
            return
        st = self.page
        st.fields["wifi_password"] = ""
        st.focus = "wifi_password"

        def connect() -> None:
            pw = st.fields.get("wifi_password", "")
            if len(pw) < 8:
                self.device.toast = "Password must be at least 8 characters"
                return
            n.saved, n.password = True, pw
            self.connected = n.ssid
            self.device.log.append(f"wifi_connect:{n.ssid}")
            st.focus = None
            st.fields.pop("wifi_password", None)
            self.close_dialog()

        self.dialog(lambda: Dialog(n.ssid, body=[Field("wifi_password", "Password", rid="password", password=True)],
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                            Button("Connect", connect, rid="connect")]))

    def _forget(self, n: Network) -> None:
        n.saved = False
        self.connected = None
        self.close_dialog()

    # -- connected devices
    def page_connected(self, st: PageState) -> Page:
        body: list = [Row("Pair new device", on_tap=lambda: self.push("pair"), rid="pair_new", icon="Add")]
        body.append(Text("Saved devices", size="header"))
        for name, kind in self.shuffled(self.bt_devices):
            body.append(Row(name, kind if self.bluetooth else f"{kind} · Bluetooth off", rid="saved_device",
                            on_tap=lambda n=name, k=kind: self._stub(n, ("Device type", k),
                                                                     ("Bluetooth address", self.bt_address))))
        body.append(Row("Connection preferences", "Bluetooth, NFC", on_tap=lambda: self.push("connprefs"),
                        rid="connection_preferences"))
        return Page("Connected devices", body=body, nav_back=True)

    def page_pair(self, st: PageState) -> Page:
        if not self.bluetooth:
            return Page("Pair new device", nav_back=True,
                        body=[Text("Bluetooth will turn on to pair", size="small"),
                              Button("Turn on", lambda: self._flip("bluetooth"), rid="turn_on")])
        return Page("Pair new device", nav_back=True, body=[
            Row("Device name", self.device_name, rid="device_name"),
            Text("Available devices", size="header"),
            Text("Searching…", size="small", rid="searching")])

    def page_connprefs(self, st: PageState) -> Page:
        return Page("Connection preferences", nav_back=True, body=[
            Row("Bluetooth", "On" if self.bluetooth else "Off", on_tap=lambda: self.push("bluetooth"),
                rid="bluetooth"),
            Switch("NFC", self.nfc, lambda: self._flip("nfc"), rid="nfc", subtitle="Use NFC"),
            Row("Cast", "", on_tap=lambda: self._stub("Cast", ("No nearby devices were found", "")), rid="cast"),
            Row("Printing", "1 print service on", on_tap=lambda: self._stub(
                "Printing", ("Default Print Service", "On")), rid="printing"),
            Row("Nearby Share", "On", on_tap=lambda: self._stub("Nearby Share", ("Device visibility", "Contacts")),
                rid="nearby_share"),
            Row("Android Auto", "Use apps on your car screen", on_tap=lambda: self._stub(
                "Android Auto", ("Previously connected cars", "None")), rid="android_auto"),
        ])

    def page_bluetooth(self, st: PageState) -> Page:
        body: list = [Switch("Use Bluetooth", self.bluetooth, lambda: self._flip("bluetooth"), rid="bluetooth_switch"),
                      Row("Device name", self.device_name,
                          on_tap=lambda: self._rename_dialog("Rename this device", "Rename"), rid="bt_device_name")]
        if self.bluetooth:
            body.append(Row("Pair new device", on_tap=lambda: self.push("pair"), rid="pair_new", icon="Add"))
            body.append(Text(f'Visible as "{self.device_name}" to other devices while Bluetooth '
                             "settings is open.", size="small", rid="bt_visible"))
        else:
            body.append(Text("When Bluetooth is turned on, your device can communicate with other nearby "
                             "Bluetooth devices.", size="small", rid="bt_off_hint"))
        return Page("Bluetooth", body=body, nav_back=True)

    # -- apps
    def page_apps(self, st: PageState) -> Page:
        body: list = [Text("Recently opened apps", size="header")]
        for i, name in enumerate(self.recent):
            e = self.app_entry(name)
            if e is not None:
                body.append(Row(e.name, f"{(i + 1) * 7} min. ago", on_tap=lambda e=e: self.push("appinfo", app=e),
                                rid="recent_app", icon=e.name))
        n = len(self.installed())
        body += [
            Row(f"See all {n} apps", on_tap=lambda: self.push("allapps"), rid="see_all"),
            Row("Default apps", "Chrome, Phone, and Messages", on_tap=lambda: self.push("defaultapps"),
                rid="default_apps"),
            Row("Screen time", "Today: 2 hr, 14 min", on_tap=lambda: self._stub(
                "Screen time", ("Today", "2 hr, 14 min")), rid="screen_time"),
            Row("Unused apps", "0 unused apps", on_tap=lambda: self._stub("Unused apps", ("No unused apps", "")),
                rid="unused_apps"),
            Row("Special app access", "2 apps can use unrestricted data", rid="special_access",
                on_tap=lambda: self._stub("Special app access", ("All files access", ""),
                                          ("Display over other apps", ""))),
        ]
        return Page("Apps", body=body, nav_back=True)

    def page_allapps(self, st: PageState) -> Page:
        rows = [Row(e.name, f"{e.total_mb} MB", on_tap=lambda e=e: self.push("appinfo", app=e), rid="app_row",
                    icon=e.name) for e in self.installed()]
        return Page("All apps", body=virtualize(rows, st.scroll), nav_back=True, scroll_rid="apps_list")

    def page_appinfo(self, st: PageState) -> Page:
        e: AppEntry = st.args["app"]

        def open_app() -> None:
            if e.simulated and e.name in self.device.apps:
                self.device.launch(e.name)
            else:
                self.device.toast = f"Opening {e.name}…"

        def uninstall() -> None:
            if e.name not in self.uninstalled:
                self.uninstalled.append(e.name)
                self.device.log.append(f"uninstall:{e.package}")
            self.close_dialog()
            self.device.toast = f"Uninstalled {e.name}"
            self.pop()

        def force_stop() -> None:
            self.dialog(lambda: Dialog("Force stop?", "If you force stop an app, it may misbehave.", buttons=[
                Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                Button("OK", self.close_dialog, rid="ok")]))

        if e.system:
            second = Button("Disable", None, rid="disable", primary=False)
        else:
            second = Button("Uninstall", lambda: self.dialog(lambda: Dialog(
                e.name, "Do you want to uninstall this app?",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("OK", uninstall, rid="confirm_uninstall")])), rid="uninstall", primary=False)
        body: list = [
            Text(e.name, size="title", rid="app_name"),
            Text(f"version {e.version}", size="small", rid="app_version"),
            Buttons([Button("Open", open_app, rid="open", primary=False), second,
                     Button("Force stop", force_stop, rid="force_stop", primary=False)], rid="app_buttons"),
            Row("Notifications", "On" if e.notifications else "Off", on_tap=lambda: self.push("appnotif", app=e),
                rid="notification_settings"),
            Row("Permissions", "No permissions requested" if e.system else "Camera, Location, and Notifications",
                on_tap=lambda: self._stub("App permissions", ("Allowed", "Notifications"), ("Not allowed", "")),
                rid="permissions"),
            Row("Storage & cache", f"{e.total_mb} MB used in internal storage",
                on_tap=lambda: self.push("appstorage", app=e), rid="storage_settings"),
            Row("Mobile data & Wi-Fi", f"{round(e.cache_mb * 1.7, 1)} MB used since Sep 16", rid="data_settings",
                on_tap=lambda: self._stub("Mobile data & Wi-Fi", ("Background data", "On"))),
            Row("Screen time", "Less than 1 minute today", rid="time_spent"),
            Row("App battery usage", "0% use since last full charge", rid="battery_usage"),
            Row("Open by default", "Allow app to open supported links", rid="open_by_default"),
        ]
        return Page("App info", body=body, nav_back=True)

    def page_appnotif(self, st: PageState) -> Page:
        e: AppEntry = st.args["app"]

        def flip() -> None:
            e.notifications = not e.notifications
            self.device.log.append(f"notifications:{e.name}={e.notifications}")

        body: list = [Switch(f"All {e.name} notifications", e.notifications, flip, rid="notifications_switch")]
        if e.notifications:
            body += [Text("Other", size="header"), Row("General", "Alerting", rid="channel"),
                     Row("Miscellaneous", "Silent", rid="channel")]
        else:
            body.append(Text("At your request, Android is blocking this app's notifications from appearing on "
                             "this device", size="small", rid="blocked_hint"))
        return Page("Notifications", body=body, nav_back=True)

    def page_appstorage(self, st: PageState) -> Page:
        e: AppEntry = st.args["app"]

        def clear_cache() -> None:
            e.cache_mb = 0.0

        def clear_data() -> None:
            def go() -> None:
                e.data_mb, e.cache_mb = 0.0, 0.0
                self.close_dialog()

            self.dialog(lambda: Dialog("Delete app data?", "All of this app's data will be deleted permanently.",
                                       buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                                                Button("OK", go, rid="ok")]))

        return Page("Storage", nav_back=True, body=[
            Row("App size", f"{e.size_mb} MB", rid="app_size"),
            Row("User data", f"{e.data_mb} MB", rid="user_data"),
            Row("Cache", f"{e.cache_mb} MB", rid="cache_size"),
            Row("Total", f"{e.total_mb} MB", rid="total_size"),
            Buttons([Button("Clear storage", clear_data, rid="clear_storage", primary=False),
                     Button("Clear cache", clear_cache, rid="clear_cache", primary=False)]),
        ])

    def page_defaultapps(self, st: PageState) -> Page:
        def browser() -> None:
            self._choice_dialog("Browser app", BROWSERS, self.default_browser,
                                lambda o: setattr(self, "default_browser", o), rid="browser_option")

        return Page("Default apps", nav_back=True, body=[
            Row("Browser app", self.default_browser, on_tap=browser, rid="browser_app"),
            Row("Caller ID & spam app", "Phone", rid="caller_id"),
            Row("Home app", "Pixel Launcher", rid="home_app"),
            Row("Phone app", "Phone", rid="phone_app"),
            Row("SMS app", "Messages", rid="sms_app"),
        ])

    # -- notifications, battery, storage, sound, display, location
    def page_notifications(self, st: PageState) -> Page:
        return Page("Notifications", nav_back=True, body=[
            Row("App notifications", "Control notifications from individual apps",
                on_tap=lambda: self.push("allapps"), rid="app_notifications"),
            Row("Notification history", "Show recent and snoozed notifications", rid="notification_history"),
            Row("Conversations", "No priority conversations", rid="conversations"),
            Switch("Do Not Disturb", self.dnd, lambda: self._flip("dnd"), rid="dnd_switch",
                   subtitle="On" if self.dnd else "Off"),
        ])

    def page_battery(self, st: PageState) -> Page:
        hours = max(1, self.device.battery * 30 // 100)
        return Page("Battery", nav_back=True, body=[
            Text(f"{self.device.battery}%", size="title", rid="battery_level"),
            Text(f"About {hours} hr left", size="small", rid="battery_estimate"),
            Row("Battery usage", "View usage for past 24 hours", rid="battery_usage",
                on_tap=lambda: self._stub("Battery usage", ("Screen", "34%"), ("Android System", "12%"))),
            Switch("Battery Saver", self.battery_saver, lambda: self._flip("battery_saver"), rid="battery_saver"),
            Switch("Adaptive Battery", self.adaptive_battery, lambda: self._flip("adaptive_battery"),
                   rid="adaptive_battery", subtitle="Extend battery life based on your phone usage"),
            Switch("Battery percentage", self.battery_pct, lambda: self._flip("battery_pct"),
                   rid="battery_percentage", subtitle="Show battery percentage in status bar"),
        ])

    def page_storage(self, st: PageState) -> Page:
        used = self.storage_used_gb
        rows: list = [Text(f"{used} GB used", size="title", rid="storage_used"),
                      Text(f"of {self.storage_total} GB", size="small", rid="storage_total"),
                      Row("Apps", f"{self.apps_storage_gb} GB", on_tap=lambda: self.push("allapps"),
                          rid="storage_apps")]
        rows += [Row(k, f"{v} GB", rid="storage_" + k.split()[0].lower()) for k, v in self.storage.items()]
        return Page("Storage", body=rows, nav_back=True)

    def page_sound(self, st: PageState) -> Page:
        def bump(key: str, delta: int) -> None:
            self.volume[key] = max(0, min(100, self.volume[key] + delta))

        body: list = [Stepper(label, f"{self.volume[key]}%", lambda k=key: bump(k, -10), lambda k=key: bump(k, 10),
                              rid=f"{key}_volume") for key, label in VOLUMES]
        body += [
            Switch("Do Not Disturb", self.dnd, lambda: self._flip("dnd"), rid="dnd_switch",
                   subtitle="On" if self.dnd else "Off"),
            Switch("Vibrate for calls", self.vibrate_calls, lambda: self._flip("vibrate_calls"), rid="vibrate_calls"),
            Row("Phone ringtone", self.ringtone, rid="ringtone", on_tap=lambda: self._choice_dialog(
                "Phone ringtone", RINGTONES, self.ringtone, lambda o: setattr(self, "ringtone", o),
                rid="ringtone_option")),
            Row("Live Caption", "Automatically caption media", rid="live_caption"),
            Row("Default notification sound", "Pixie Dust", rid="notification_sound"),
            Row("Default alarm sound", "Cesium", rid="alarm_sound"),
        ]
        return Page("Sound & vibration", body=body, nav_back=True)

    def page_display(self, st: PageState) -> Page:
        def bump(delta: int) -> None:
            self.brightness = max(0, min(100, self.brightness + delta))
            self.device.log.append(f"brightness:{self.brightness}")

        return Page("Display", nav_back=True, body=[
            Stepper("Brightness level", f"{self.brightness}%", lambda: bump(-10), lambda: bump(10), rid="brightness"),
            Switch("Adaptive brightness", self.adaptive_brightness, lambda: self._flip("adaptive_brightness"),
                   rid="adaptive_brightness"),
            Switch("Dark theme", self.dark_theme, lambda: self._flip("dark_theme"), rid="dark_theme",
                   subtitle="Will turn on automatically at sunset" if not self.dark_theme else "On"),
            Switch("Night Light", self.night_light, lambda: self._flip("night_light"), rid="night_light"),
            Row("Screen timeout", f"After {self.screen_timeout} of inactivity", rid="screen_timeout",
                on_tap=lambda: self._choice_dialog("Screen timeout", TIMEOUTS, self.screen_timeout,
                                                   lambda o: setattr(self, "screen_timeout", o),
                                                   rid="timeout_option")),
            Switch("Auto-rotate screen", self.auto_rotate, lambda: self._flip("auto_rotate"), rid="auto_rotate"),
            Row("Font size", "Default", rid="font_size"),
            Row("Display size", "Default", rid="display_size"),
            Row("Screen saver", "Clock", rid="screen_saver"),
        ])

    def page_location(self, st: PageState) -> Page:
        return Page("Location", nav_back=True, body=[
            Switch("Use location", self.location, lambda: self._flip("location"), rid="location_switch"),
            Row("App location permissions", f"{3 + len(self._third) // 4} of {len(self._third)} apps have access",
                rid="location_permissions"),
            Row("Location services", "", rid="location_services"),
        ])

    # -- system, about
    def page_system(self, st: PageState) -> Page:
        return Page("System", nav_back=True, body=[
            Row("Languages", self.language, on_tap=lambda: self.push("languages"), rid="languages"),
            Row("Keyboard", "Gboard", rid="keyboard"),
            Row("Gestures", "", on_tap=lambda: self._stub("Gestures", ("Quick tap", "Off"),
                                                          ("System navigation", "Gesture navigation")), rid="gestures"),
            Row("Date & time", self.timezone, on_tap=lambda: self.push("datetime"), rid="date_time"),
            Row("Backup", "On", rid="backup"),
            Row("System update", f"Updated to Android {self.android_version}", rid="system_update"),
            Row("Reset options", "", rid="reset_options"),
        ])

    def page_languages(self, st: PageState) -> Page:
        return Page("Languages", nav_back=True, body=[
            Row("System languages", self.language, rid="system_languages", on_tap=lambda: self._choice_dialog(
                "System languages", LANGUAGES, self.language, lambda o: setattr(self, "language", o),
                rid="language_option")),
            Row("App languages", "Choose the language for each app", rid="app_languages"),
            Row("Text-to-speech output", "Preferred engine: Speech Services by Google", rid="tts"),
        ])

    def page_datetime(self, st: PageState) -> Page:
        def zone() -> None:
            if self.auto_zone:
                self.device.toast = 'Turn off "Set time zone automatically" first'
                return
            self._choice_dialog("Time zone", TIMEZONES, self.timezone, lambda o: setattr(self, "timezone", o),
                                rid="timezone_option")

        return Page("Date & time", nav_back=True, body=[
            Switch("Set time automatically", self.auto_time, lambda: self._flip("auto_time"), rid="auto_time"),
            Row("Date", self.device.now.strftime("%B %-d, %Y"), rid="date"),
            Row("Time", self.device.now.strftime("%H:%M" if self.use_24h else "%-I:%M %p"), rid="time"),
            Switch("Set time zone automatically", self.auto_zone, lambda: self._flip("auto_zone"), rid="auto_zone"),
            Row("Time zone", self.timezone, on_tap=zone, rid="time_zone"),
            Switch("Use 24-hour format", self.use_24h, lambda: self._flip("use_24h"), rid="use_24h"),
        ])

    def page_about(self, st: PageState) -> Page:
        return Page("About phone", nav_back=True, body=[
            Row("Device name", self.device_name, on_tap=lambda: self._rename_dialog("Device name", "OK"),
                rid="device_name"),
            Row("Phone number (sim slot 1)", self.phone_number, rid="phone_number"),
            Row("Emergency information", "", rid="emergency_info"),
            Row("Legal information", "", rid="legal"),
            Row("SIM status", self.carrier, rid="sim_status"),
            Row("Model", self.model, rid="model"),
            Row("IMEI", "Tap to view", rid="imei"),
            Row("Android version", self.android_version, on_tap=lambda: self.push("androidver"),
                rid="android_version"),
            Row("IP address", self.ip, rid="ip_address"),
            Row("Wi-Fi MAC address", self.wifi_mac, rid="wifi_mac"),
            Row("Bluetooth address", self.bt_address, rid="bt_address"),
            Row("Up time", "52:18:04", rid="up_time"),
            Row("Build number", self.build_number, rid="build_number"),
            Spacer(60),
        ])

    def page_androidver(self, st: PageState) -> Page:
        return Page("Android version", nav_back=True, body=[
            Row("Android version", self.android_version, rid="firmware_version"),
            Row("Android security update", self.patch, rid="security_patch"),
            Row("Google Play system update", "September 1, 2023", rid="module_version"),
            Row("Baseband version", "g5300g-230811-230919-B-10852419", rid="baseband"),
            Row("Kernel version", "5.10.157-android13-4", rid="kernel"),
            Row("Build number", self.build_number, rid="build"),
        ])
