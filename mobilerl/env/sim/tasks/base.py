"""Task templates, their verifiers and their scripted experts.

A :class:`Template` is a parameterised task family (AndroidWorld's notion): it samples parameters from a
seeded RNG, prepares the device's initial state, states the instruction, verifies the end state, and
provides an expert. The expert is a generator that reads the *current screen* through :class:`Expert`
(whose ``s`` is refreshed before every resume) and yields one action at a time::

    def expert(self, p, x):
        yield from x.launch("Contacts")
        yield x.tap(desc="Create new contact")
        yield from x.fill("first_name", p["first"])
        yield x.tap(text="Save")
        yield x.finish()

:class:`OracleAgent` drives it and handles what is not the task's business: it dismisses pop-ups and
waits out loading screens before resuming the script, so every template's expert is robust to the
simulator's perturbations without writing a line about them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.sim.device import POPUP_RID, Device
from mobilerl.env.sim.screen import El, Screen


class ExpertError(RuntimeError):
    """The expert script met a screen it did not expect (a bug in the template or the app)."""


class Expert:
    """Screen-reading helpers for expert scripts. ``s`` is the current :class:`Screen`."""

    MAX_SCROLLS = 25

    def __init__(self, screen: Screen):
        self.s = screen
        self.mem: dict[str, Any] = {}

    # -- single actions (evaluated against the current screen when the script resumes)
    def el(self, **query) -> El:
        e = self.s.find(**query)
        if e is None:
            raise ExpertError(f"no element {query} on screen {self.s.app!r}/{self.s.title!r}")
        return e

    def tap(self, **query) -> Action:
        return Action(A.TAP, element=self.el(**query).bounds)

    def long_press(self, **query) -> Action:
        return Action(A.LONG_PRESS, element=self.el(**query).bounds)

    def type(self, text: str) -> Action:
        return Action(A.TYPE, text=text)

    def swipe(self, direction: str = "up", dist: str = "medium") -> Action:
        return Action(A.SWIPE, direction=direction, dist=dist)

    def back(self) -> Action:
        return Action(A.BACK)

    def home(self) -> Action:
        return Action(A.HOME)

    def wait(self) -> Action:
        return Action(A.WAIT)

    def finish(self, message: str | None = None) -> Action:
        return Action(A.FINISH, message=message)

    # -- short scripts
    def launch(self, app: str) -> Iterator[Action]:
        yield Action(A.LAUNCH, app=app)

    def scroll_to(self, direction: str = "up", **query) -> Iterator[Action]:
        """Swipe until an element matching ``query`` is fully on screen; then the caller taps it."""
        for _ in range(self.MAX_SCROLLS):
            if self.s.find(**query) is not None:
                return
            before = self.s.xml
            yield self.swipe(direction, "medium")
            if self.s.xml == before:  # reached the end without finding it
                break
        if self.s.find(**query) is None:
            raise ExpertError(f"scrolled {direction} to the end without finding {query}")

    def tap_scrolled(self, **query) -> Iterator[Action]:
        yield from self.scroll_to(**query)
        yield self.tap(**query)

    def fill(self, rid: str, value: str) -> Iterator[Action]:
        """Focus the EditText ``rid`` (scrolling to it if needed) and type ``value`` unless it is there."""
        yield from self.scroll_to(rid=rid, cls="EditText")
        e = self.el(rid=rid, cls="EditText")
        if e.text == value:
            return
        if not e.focused:
            yield Action(A.TAP, element=e.bounds)
        yield Action(A.TYPE, text=value)

    def hide_keyboard(self) -> Iterator[Action]:
        if self.s.focused_field is not None:
            yield self.back()


class Template:
    """A parameterised task family. Subclasses set the class attributes and override the methods."""

    suite: ClassVar[str] = "world"  # "world" | "lab"
    name: ClassVar[str] = ""
    template: ClassVar[str] = ""  # instruction with {placeholders}
    difficulty: ClassVar[str] = "easy"  # easy | medium | hard
    tags: ClassVar[tuple[str, ...]] = ()
    apps: ClassVar[tuple[str, ...]] = ()
    complexity: ClassVar[float] = 1.0  # step budget = min(50, 10 × complexity)
    task_type: ClassVar[str] = "operation"  # operation | query

    def sample(self, rng: random.Random, dev: Device) -> dict[str, Any]:
        """Draw parameters. ``dev`` is the freshly seeded device (its content can be read)."""
        return {}

    def setup(self, dev: Device, p: dict[str, Any]) -> None:
        """Put the device into the task's initial state (content the task needs)."""

    def instruction(self, p: dict[str, Any]) -> str:
        return self.template.format(**p)

    def check(self, dev: Device, p: dict[str, Any]) -> bool:
        """The verifier on the end state (``dev.answer`` holds the finish message)."""
        raise NotImplementedError

    def subgoals(self, p: dict[str, Any]) -> list[tuple[str, Callable[[Device], bool]]]:
        """AndroidLab-style sub-goals for Sub-SR; the default is the whole task."""
        return [("task completed", lambda dev: self.check(dev, p))]

    def expert(self, p: dict[str, Any], x: Expert) -> Iterator[Action]:
        raise NotImplementedError


def answer_matches(answer: str | None, expected: str | list[str], numeric: bool = False) -> bool:
    """Lenient answer comparison: case/whitespace/punctuation-insensitive; numbers compared as numbers."""
    if answer is None:
        return False
    wanted = [expected] if isinstance(expected, str) else list(expected)
    got = _norm(answer)
    for w in wanted:
        if numeric:
            try:
                if abs(float(got.replace(",", "")) - float(str(w).replace(",", ""))) < 1e-6:
                    return True
            except ValueError:
                pass
        if _norm(str(w)) == got:
            return True
    return False


def _norm(s: str) -> str:
    s = s.strip().lower().rstrip(".!")
    return " ".join(s.replace("$", "").split())


class OracleAgent:
    """Runs a template's expert script, handling pop-ups and loading screens generically."""

    def __init__(self, template: Template, params: dict[str, Any]):
        self.template = template
        self.params = params
        self.x: Expert | None = None
        self.gen: Iterator[Action] | None = None
        self.done = False

    def act(self, screen: Screen) -> Action:
        if self.done:
            raise ExpertError("the expert already finished")
        if screen.find(rid=POPUP_RID) is not None:
            btn = screen.find(rid="btn_dismiss")
            return Action(A.TAP, element=btn.bounds) if btn else Action(A.BACK)
        if screen.find(rid="progress", cls="ProgressBar") is not None:
            return Action(A.WAIT)
        if self.x is None:
            self.x = Expert(screen)
            self.gen = self.template.expert(self.params, self.x)
        self.x.s = screen
        try:
            action = next(self.gen)  # type: ignore[arg-type]
        except StopIteration:
            raise ExpertError(f"{self.template.name}: the expert script ended without finish()") from None
        except ExpertError:
            raise
        except Exception as e:  # a script bug or an unexpected screen: report it as the expert's failure
            raise ExpertError(f"{self.template.name}: expert failed with {type(e).__name__}: {e}") from e
        if action.name == A.FINISH:
            self.done = True
        return action
