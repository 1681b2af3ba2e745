"""The simulated apps. Every module here defining :class:`~mobilerl.env.sim.device.App` subclasses is
picked up automatically; ``APP_CLASSES`` is sorted by app name so devices are deterministic."""

from __future__ import annotations

import importlib
import pkgutil

from mobilerl.env.sim.device import App


def _discover() -> list[type[App]]:
    found: dict[str, type[App]] = {}
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        module = importlib.import_module(f"{__name__}.{mod}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, App) and obj is not App and obj.name:
                if obj.__module__ == module.__name__:
                    if obj.name in found:
                        raise ValueError(f"app {obj.name!r} defined twice")
                    found[obj.name] = obj
    return [found[k] for k in sorted(found)]


APP_CLASSES: list[type[App]] = _discover()
