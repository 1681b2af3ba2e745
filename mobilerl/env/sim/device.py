"""The simulated device: launcher, apps with their back stacks, status bar, keyboard, pop-ups.

Semantics (chosen to match AndroidWorld / AndroidLab behaviour closely enough for the agent to transfer):

- ``Tap``/``Long Press`` act on the topmost, deepest view with a handler under the centre of the box.
  A modal dialog swallows taps outside it. Taps during a loading screen do nothing.
- ``Type`` replaces the content of the focused text field (AndroidWorld clears before typing); with no
  focused field it does nothing. Tapping a field focuses it and raises the keyboard, which shrinks the
  page (adjustResize). ``Back`` first hides the keyboard, then closes a dialog, then pops a page, and at
  an app's first page returns to the launcher.
- ``Swipe up`` scrolls content down (the finger moves up); short/medium/long move 500/1000/1500 px.
- ``Launch`` starts the app fresh at its first page (like ``am start`` with a cleared task).
- ``Wait`` lets a loading screen finish; the clock advances every step.
- Perturbations, all drawn from the device seed: a pop-up dialog on launch, a loading screen on launch
  (gone only after ``Wait``), and shuffled list order in apps that honour ``device.perturb.shuffle``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from PIL import Image

from mobilerl.env import actions as A
from mobilerl.env.sim import content, ui
from mobilerl.env.sim.ui import Button, Dialog, IconButton, Node, Page
from mobilerl.seeding import sim_seed

LAUNCHER_PKG = "com.google.android.apps.nexuslauncher"
SYSTEMUI_PKG = "com.android.systemui"
SWIPE_PX = {"short": 500, "medium": 1000, "long": 1500}


@dataclass(frozen=True)
class Perturb:
    """Stochastic perturbations; every draw comes from the device's seeded RNG."""

    popup: float = 0.0  # probability of a pop-up on each app launch
    loading: float = 0.0  # probability of a loading screen on each app launch
    shuffle: bool = False  # shuffle list order in apps that have no natural order

    @classmethod
    def named(cls, name: str) -> Perturb:
        if name in ("none", "off", ""):
            return cls()
        if name in ("default", "on"):
            return cls(popup=0.2, loading=0.15, shuffle=True)
        if name == "heavy":
            return cls(popup=0.5, loading=0.4, shuffle=True)
        raise ValueError(f"unknown perturbation profile {name!r}; expected none, default or heavy")


@dataclass
class PageState:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    scroll: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    focus: str | None = None
    dialog: Any = None  # a zero-argument callable returning ui.Dialog, or None
    max_scroll: int = 0


class App:
    """Base class of simulated apps. Subclasses define ``page_<name>(state) -> Page`` builders."""

    name: ClassVar[str] = ""
    package: ClassVar[str] = ""
    color: ClassVar[tuple[int, int, int]] = (33, 150, 243)
    aliases: ClassVar[tuple[str, ...]] = ()
    root_page: ClassVar[str] = "main"

    def __init__(self, device: Device, rng: random.Random):
        self.device = device
        self.rng = rng
        self.stack: list[PageState] = [PageState(self.root_page)]
        self.planted: dict[str, str] = {}  # raw personal values of this app: value -> category
        with content.recording(self.planted):
            self.setup()

    def canaries(self, materialize: bool = False) -> dict[str, str]:
        """The raw personal values this app holds so far (``value -> category``), for privacy audits.

        The default returns what :mod:`~mobilerl.env.sim.content` generated during :meth:`setup` (and any
        later block recording into ``self.planted``). Override to add values generated otherwise; apps
        that draw content lazily generate it first when ``materialize`` is true (only on a throwaway
        device: it can change what the episode would have drawn later).
        """
        return dict(self.planted)

    # -- to override
    def setup(self) -> None:
        """Create the app's seeded content."""

    def on_swipe(self, direction: str) -> bool:
        """Horizontal swipes (tabs, months); return True when handled."""
        return False

    # -- navigation helpers
    @property
    def page(self) -> PageState:
        return self.stack[-1]

    def push(self, name: str, **args: Any) -> None:
        self.stack.append(PageState(name, args=args))

    def pop(self) -> None:
        """Back within the app: leave a multi-select mode (``page.args["sel"]``) first, then the page."""
        if self.page.args.get("sel"):
            self.page.args["sel"] = []
            return
        if len(self.stack) > 1:
            self.stack.pop()
        else:
            self.device.go_home()

    def replace(self, name: str, **args: Any) -> None:
        self.stack[-1] = PageState(name, args=args)

    def restart(self) -> None:
        self.stack = [PageState(self.root_page)]

    def dialog(self, builder: Any) -> None:
        self.page.dialog = builder

    def close_dialog(self) -> None:
        self.page.dialog = None

    def field(self, key: str, default: str = "") -> str:
        return self.page.fields.get(key, default)

    def build(self) -> Page:
        st = self.page
        return getattr(self, f"page_{st.name}")(st)

    def shuffled(self, items: list) -> list:
        """List order as shown: natural order, or a seeded shuffle under the shuffle perturbation."""
        if self.device.perturb.shuffle:
            items = list(items)
            random.Random(sim_seed(self.device.seed, self.name, "shuffle")).shuffle(items)
        return items


class SelectionMixin:
    """For apps whose first page has an app-level multi-select mode (``self.selected``): Back leaves the
    mode before leaving the page, and a relaunch starts with nothing selected. Put it before ``App``."""

    selected: set

    def restart(self) -> None:
        super().restart()  # type: ignore[misc]
        self.selected.clear()

    def pop(self) -> None:
        if self.page.name == self.root_page and self.selected:  # type: ignore[attr-defined]
            self.selected.clear()
            return
        super().pop()  # type: ignore[misc]


_POPUPS = (
    ("Rate {app}", "Enjoying {app}? Tap Rate to tell us what you think.", "Not now", "Rate"),
    ("Allow {app} to send you notifications?", "", "Don't allow", "Allow"),
    ("What's new in {app}", "Bug fixes and performance improvements.", "Got it", None),
)
POPUP_RID = "perturbation_dialog"


class Device:
    """One simulated phone. All state lives here; :class:`mobilerl.env.sim.env.SimEnv` wraps it."""

    width = ui.SCREEN_W
    height = ui.SCREEN_H

    def __init__(self, seed: int = 0, perturb: Perturb | None = None, apps: list[type[App]] | None = None):
        from mobilerl.env.sim.apps import APP_CLASSES

        self.seed = seed
        self.perturb = perturb or Perturb()
        self.rng = random.Random(sim_seed(seed, "device"))
        self.now = datetime(2023, 10, 15, 9, 0) + timedelta(minutes=self.rng.randrange(0, 600))
        self.battery = self.rng.randrange(35, 100)
        self.apps: dict[str, App] = {}
        for cls in apps or APP_CLASSES:
            self.apps[cls.name] = cls(self, random.Random(sim_seed(seed, cls.name)))
        self.foreground: str | None = None  # None = launcher
        self.overlay: Dialog | None = None
        self.loading = False
        self.launcher_page = 0
        self.toast: str | None = None
        self.finished = False
        self.answer: str | None = None
        self.steps = 0
        self.log: list[str] = []  # app-level events, for verifiers ("sms_sent:…", "call:…")
        self.planted: dict[str, str] = {}  # personal values planted by task setup (value -> category)
        self._tree: Node | None = None

    # ------------------------------------------------------------------------------------ canaries
    def canary_categories(self, materialize: bool = False) -> dict[str, str]:
        """Every raw personal value planted in this device so far, ``value -> category`` (see
        :meth:`App.canaries`). In memory only: a collector hands these to the privacy audit."""
        out: dict[str, str] = {}
        for app in self.apps.values():
            for value, cat in app.canaries(materialize).items():
                out.setdefault(value, cat)
        for value, cat in self.planted.items():
            out.setdefault(value, cat)
        return out

    def canaries(self, materialize: bool = False) -> set[str]:
        """The raw personal values (names, phone numbers, e-mails, addresses, order and tracking numbers)
        planted in this device so far."""
        return set(self.canary_categories(materialize))

    # ------------------------------------------------------------------------------------ app access
    def app(self, name: str) -> App:
        key = self.resolve_app(name)
        if key is None:
            raise KeyError(f"no app named {name!r}")
        return self.apps[key]

    def resolve_app(self, name: str) -> str | None:
        want = name.strip().lower()
        for key, app in self.apps.items():
            if want == key.lower() or want in (a.lower() for a in app.aliases) or want == app.package:
                return key
        return None

    @property
    def current(self) -> App | None:
        return self.apps[self.foreground] if self.foreground else None

    @property
    def current_name(self) -> str:
        return self.foreground or "Home"

    def go_home(self) -> None:
        self._tree = None
        self.foreground = None
        self.loading = False
        self.overlay = None

    def launch(self, name: str) -> bool:
        key = self.resolve_app(name)
        if key is None:
            return False
        self._tree = None
        self.foreground = key
        self.apps[key].restart()
        self.overlay = None
        self.loading = self.rng.random() < self.perturb.loading
        if self.rng.random() < self.perturb.popup:
            title, msg, dismiss, accept = _POPUPS[self.rng.randrange(len(_POPUPS))]
            buttons = [Button(dismiss, self._close_overlay, rid="btn_dismiss", primary=False)]
            if accept:
                buttons.append(Button(accept, self._close_overlay, rid="btn_accept"))
            self.overlay = Dialog(title.format(app=key), msg.format(app=key), buttons=buttons, rid=POPUP_RID)
        return True

    def _close_overlay(self) -> None:
        self.overlay = None

    @property
    def keyboard(self) -> bool:
        app = self.current
        return bool(app and app.page.focus and not self.loading)

    # ----------------------------------------------------------------------------------------- step
    def step(self, action: A.Action) -> dict[str, Any]:
        """Apply one action. Returns info: ``{"effect": str}`` describing what happened."""
        self.steps += 1
        self.now += timedelta(seconds=3 if action.name == A.WAIT else 5)
        self.toast = None
        effect = self._apply(action)
        self._tree = None
        return {"effect": effect}

    def _apply(self, a: A.Action) -> str:
        name = a.name
        if name == A.FINISH:
            self.finished = True
            self.answer = a.message
            return "finish"
        if name == A.HOME:
            self.go_home()
            return "home"
        if name == A.LAUNCH:
            return "launch" if self.launch(a.app or "") else "unknown_app"
        if name == A.WAIT:
            if self.loading:
                self.loading = False
                return "loaded"
            return "wait"
        if name == A.BACK:
            return self._back()
        if self.loading and self.foreground and self.overlay is None:
            return "ignored_loading"
        if name in (A.TAP, A.LONG_PRESS):
            x, y = a.center  # type: ignore[misc]
            node = ui.hit(self.tree(), x, y, long=name == A.LONG_PRESS)
            if node is None:
                return "no_target"
            handler = node.on_long if name == A.LONG_PRESS else node.on_tap
            handler()  # type: ignore[misc]
            return "tap"
        if name == A.TYPE:
            app = self.current
            if app is None or app.page.focus is None or self.overlay is not None:
                return "no_focus"
            app.page.fields[app.page.focus] = a.text or ""
            return "type"
        if name == A.SWIPE:
            return self._swipe(a.direction or "up", a.dist or "medium")
        return "noop"

    def _back(self) -> str:
        if self.overlay is not None:
            self.overlay = None
            return "dismiss"
        app = self.current
        if app is None:
            return "noop"
        if self.loading:
            self.go_home()
            return "home"
        st = app.page
        if st.focus is not None:
            st.focus = None
            return "hide_keyboard"
        if st.dialog is not None:
            d = st.dialog()
            st.dialog = None
            if d.on_dismiss:
                d.on_dismiss()
            return "dismiss"
        app.pop()
        return "back"

    def _swipe(self, direction: str, dist: str) -> str:
        app = self.current
        if app is None:
            if direction in ("left", "right"):
                return "noop"
            return "noop"
        if self.overlay is not None:
            return "blocked"
        if direction in ("left", "right"):
            return "swipe" if app.on_swipe(direction) else "noop"
        st = app.page
        delta = SWIPE_PX[dist] * (1 if direction == "up" else -1)
        if st.max_scroll == 0:
            self.tree()  # lay out once to learn the scroll range
        new = max(0, min(st.max_scroll, st.scroll + delta))
        changed = new != st.scroll
        st.scroll = new
        return "scroll" if changed else "scroll_end"

    # ------------------------------------------------------------------------------------ rendering
    def tree(self) -> Node:
        if self._tree is None:
            self._tree = self._build_tree()
        return self._tree

    def xml(self) -> str:
        return ui.to_xml(self.tree())

    def screenshot(self) -> Image.Image:
        from mobilerl.env.sim.render import render

        return render(self)

    def _status_bar(self, pkg: str) -> Node:
        bar = Node("android.widget.FrameLayout", bounds=(0, 0, ui.SCREEN_W, ui.STATUS_H), package=SYSTEMUI_PKG,
                   rid="status_bar", style="statusbar")
        bar.children.append(Node("android.widget.TextView", text=self.now.strftime("%H:%M"), rid="clock",
                                 bounds=(48, 10, 200, 74), package=SYSTEMUI_PKG, style="status_text"))
        bar.children.append(Node("android.widget.ImageView", desc="Wifi signal full.", rid="wifi",
                                 bounds=(860, 14, 916, 70), package=SYSTEMUI_PKG, style="status_icon"))
        bar.children.append(Node("android.widget.ImageView", desc=f"Battery {self.battery} percent.",
                                 rid="battery", bounds=(930, 14, 1032, 70), package=SYSTEMUI_PKG,
                                 style="status_icon"))
        return bar

    def _build_tree(self) -> Node:
        app = self.current
        pkg = app.package if app else LAUNCHER_PKG
        root = Node("android.widget.FrameLayout", bounds=(0, 0, ui.SCREEN_W, ui.SCREEN_H), package=pkg)
        decor = Node("android.widget.LinearLayout", bounds=(0, 0, ui.SCREEN_W, ui.SCREEN_H), package=pkg)
        root.children.append(decor)
        decor.children.append(self._status_bar(pkg))
        content = Node("android.widget.FrameLayout", rid="content", bounds=(0, ui.STATUS_H, ui.SCREEN_W, ui.SCREEN_H),
                       package=pkg)
        decor.children.append(content)
        if app is None:
            self._launcher(content)
        elif self.loading:
            content.children.append(Node("android.widget.ProgressBar", desc="Loading", rid="progress",
                                         bounds=(440, 1100, 640, 1300), package=pkg, style="progress"))
            content.children.append(Node("android.widget.TextView", text="Loading…", rid="loading_text",
                                         bounds=(340, 1320, 740, 1400), package=pkg, style="text_body"))
        else:
            page = app.build()
            self._page(content, app, page, pkg)
            if page.dialog is None and app.page.dialog is not None:
                page.dialog = app.page.dialog()
            if page.dialog is not None:
                root.children.append(self._dialog(page.dialog, pkg, app))
        if self.overlay is not None:
            root.children.append(self._dialog(self.overlay, pkg, None))
        return root

    def _launcher(self, content: Node) -> None:
        pkg = LAUNCHER_PKG
        ws = Node("android.widget.FrameLayout", rid="workspace", bounds=(0, ui.STATUS_H, ui.SCREEN_W, ui.SCREEN_H),
                  package=pkg, scrollable=False)
        content.children.append(ws)
        ws.children.append(Node("android.widget.TextView", text=self.now.strftime("%A, %B %-d"), rid="date",
                                bounds=(60, 160, 1020, 260), package=pkg, style="text_header"))
        ws.children.append(Node("android.widget.EditText", text="Search apps", rid="search_box",
                                bounds=(60, 2200, 1020, 2320), package=pkg, style="edit_hint"))
        names = sorted(self.apps)
        cols, top, tile_h = 4, 380, 300
        cw = ui.SCREEN_W // cols
        for i, key in enumerate(names):
            r, c = divmod(i, cols)
            b = (c * cw + 10, top + r * tile_h, (c + 1) * cw - 10, top + (r + 1) * tile_h - 20)
            ws.children.append(Node("android.widget.TextView", text=key, desc=key, rid="icon", bounds=b,
                                    package=pkg, clickable=True, long_clickable=True, focusable=True,
                                    on_tap=lambda k=key: self.launch(k), style="app_icon"))

    def _page(self, content: Node, app: App, page: Page, pkg: str) -> None:
        st = app.page
        lay = ui.Layout(pkg, st.fields, st.focus, lambda k, st=st: setattr(st, "focus", k))
        bottom = ui.SCREEN_H - (ui.KEYBOARD_H if st.focus else 0)
        y = ui.STATUS_H
        bar = lay.node("android.view.ViewGroup", (0, y, ui.SCREEN_W, y + ui.TOOLBAR_H), rid="toolbar",
                       style="toolbar")
        x_title = 48
        if page.nav_back:
            bar.children.append(lay.icon(IconButton("Navigate up", app.pop), (16, y + 24, 136, y + 144), "icon_back"))
            x_title = 160
        right = ui.SCREEN_W - 16
        icons = []
        for ib in reversed(page.actions):
            icons.append(lay.icon(ib, (right - 120, y + 24, right, y + 144), "icon_toolbar"))
            right -= 130
        bar.children.append(lay.node("android.widget.TextView", (x_title, y + 30, right - 10, y + 138),
                                     text=page.title, style="toolbar_title"))
        bar.children.extend(reversed(icons))
        content.children.append(bar)
        y += ui.TOOLBAR_H
        if page.tabs:
            tabs = lay.widget(ui.Buttons(page.tabs, rid="tabs"), 0, y, ui.SCREEN_W)
            tabs.cls = "android.widget.HorizontalScrollView"
            content.children.append(tabs)
            y = tabs.bounds[3]
        if page.bottom:
            bottom -= ui.BOTTOM_BAR_H
        scroller = lay.node("androidx.recyclerview.widget.RecyclerView", (0, y, ui.SCREEN_W, bottom),
                            rid=page.scroll_rid, style="list")
        content.children.append(scroller)
        height = lay.column(scroller, page.body, y, bottom, st.scroll)
        st.max_scroll = max(0, height - (bottom - y))
        if st.max_scroll > 0:
            scroller.scrollable = True
            scroller.focusable = True
        if st.scroll > st.max_scroll:  # content shrank (item deleted): re-layout at the new end
            st.scroll = st.max_scroll
            scroller.children.clear()
            lay.column(scroller, page.body, y, bottom, st.scroll)
        if page.bottom:
            row = lay.widget(ui.Buttons(page.bottom, rid="bottom_bar"), 0, bottom, ui.SCREEN_W)
            content.children.append(row)
        if page.fab is not None:
            fb = bottom - (ui.BOTTOM_BAR_H if page.bottom else 0)
            content.children.append(lay.icon(page.fab, (864, fb - 240, 1032, fb - 72), "fab"))

    def _dialog(self, d: Dialog, pkg: str, app: App | None) -> Node:
        scrim = Node("android.widget.FrameLayout", bounds=(0, 0, ui.SCREEN_W, ui.SCREEN_H), package=pkg,
                     style="scrim")
        st = app.page if app else None
        lay = ui.Layout(pkg, st.fields if st else {}, st.focus if st else None,
                        (lambda k, st=st: setattr(st, "focus", k)) if st else (lambda k: None))
        inner_h = 150 + (130 if d.message else 0) + sum(ui._h(w) for w in d.body) + (170 if d.buttons else 0)
        top = max(ui.STATUS_H + 40, (ui.SCREEN_H - inner_h) // 2 - (300 if st and st.focus else 0))
        box = lay.node("android.widget.LinearLayout", (60, top, ui.SCREEN_W - 60, top + inner_h), rid=d.rid,
                       style="modal")
        box.children.append(lay.node("android.widget.TextView", (108, top + 40, ui.SCREEN_W - 108, top + 140),
                                     text=d.title, rid="alertTitle", style="text_title"))
        y = top + 150
        if d.message:
            box.children.append(lay.node("android.widget.TextView", (108, y, ui.SCREEN_W - 108, y + 120),
                                         text=d.message, rid="message", style="text_small"))
            y += 130
        for w in d.body:
            n = lay.widget(w, 60, y, ui.SCREEN_W - 60)
            box.children.append(n)
            y = n.bounds[3]
        if d.buttons:
            row = lay.widget(ui.Buttons(d.buttons, rid="buttonPanel"), 60, y, ui.SCREEN_W - 60)
            box.children.append(row)
        scrim.children.append(box)
        return scrim
