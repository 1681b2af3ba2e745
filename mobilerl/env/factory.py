"""The one way to build synchronous environments: a backend, the observation mode the policy reads, the
perturbation and what the backend itself needs.

    make_env = env_factory("sim", obs_mode=profile.generation.obs_mode, perturb="default")   # picklable
    env = make_env()          # a SimEnv that renders screenshots iff the mode shows them

``render`` is not a separate knob: an env renders exactly when :func:`renders` says the observation mode needs
screenshots (``screenshot``, ``screenshot+xml``); an XML-only mode skips the simulator's drawing.
The pool over such envs is :class:`~mobilerl.env.pool.EnvPool` with its defaults.

The ``androidworld`` backend is AndroidWorld's own env servers (``androidworld``: an
:class:`~mobilerl.env.androidworld.AndroidWorldConfig`): its factory leases each server to one env at a time and
has a ``capacity`` (the servers) that caps the pool; its screenshot is its only observation, so an XML mode gets
the screen size without the pixels.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from mobilerl.env.base import Env

if TYPE_CHECKING:
    from mobilerl.env.androidworld import AndroidWorldConfig

BACKENDS = ("sim", "fake", "adb", "androidworld")
OBS_MODES = ("xml", "screenshot", "screenshot+xml")  # = mobilerl.agent.prompt.OBSERVATION_MODES
SCREENSHOT_MODES = frozenset({"screenshot", "screenshot+xml"})


def renders(obs_mode: str) -> bool:
    """Whether observations of ``obs_mode`` need screenshots (``ValueError`` on an unknown mode)."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"unknown observation mode {obs_mode!r}; expected one of {', '.join(OBS_MODES)}")
    return obs_mode in SCREENSHOT_MODES


def _check(backend: str, obs_mode: str, androidworld: AndroidWorldConfig | None = None) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown env backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if (backend == "androidworld") != (androidworld is not None):
        raise ValueError("the androidworld config (its server URLs) is needed by, and only by, env backend "
                         f"androidworld (backend {backend!r})")
    if androidworld is not None and not androidworld.urls:
        raise ValueError("androidworld.urls: empty; the androidworld backend needs its servers' URLs")
    return renders(obs_mode)


def make_env(backend: str = "sim", *, obs_mode: str = "xml", perturb: str = "default", seed: int = 0,
             androidworld: AndroidWorldConfig | None = None) -> Env:
    """One synchronous env of ``backend``.

    Args:
        backend: ``sim`` (the built-in simulator), ``fake`` (a counter env for tests), ``adb`` (a device or
            emulator; ``$ANDROID_SERIAL`` picks it, as the AVD worker image sets it), ``androidworld``
            (AndroidWorld's env server: the first of ``androidworld.urls``).
        obs_mode: the policy's observation mode (a model profile's ``generation.obs_mode``); screenshot modes
            make the env render.
        perturb: the simulator's perturbation profile (``none`` / ``default`` / ``heavy``; sim only).
        seed: the simulator's seed (sim only).
        androidworld: the AndroidWorld servers (androidworld only).
    """
    render = _check(backend, obs_mode, androidworld)
    if backend == "androidworld":
        return env_factory(backend, obs_mode=obs_mode, androidworld=androidworld)()
    if backend == "sim":
        from mobilerl.env.sim.env import SimEnv  # lazy: the simulator is heavy and optional for callers

        return SimEnv(render=render, seed=seed, perturb=perturb)
    if backend == "fake":
        from mobilerl.env.fake import CounterEnv

        return CounterEnv()
    from mobilerl.env.adb import AdbEnv

    return AdbEnv(serial=os.environ.get("ANDROID_SERIAL"), screenshot=render)


def env_factory(backend: str = "sim", *, obs_mode: str = "xml", perturb: str = "default",
                seed: int = 0, androidworld: AndroidWorldConfig | None = None) -> Callable[[], Env]:
    """:func:`make_env` as a zero-argument callable (a ``functools.partial``: it pickles into worker processes);
    the backend and mode are checked now, not in the first worker. For ``androidworld`` it is an
    :class:`~mobilerl.env.androidworld.AndroidWorldServers` (each server one env at a time, ``capacity``)."""
    render = _check(backend, obs_mode, androidworld)
    if backend == "androidworld":
        from mobilerl.env.androidworld import AndroidWorldServers

        assert androidworld is not None
        return AndroidWorldServers(androidworld, screenshot=render)
    return functools.partial(make_env, backend, obs_mode=obs_mode, perturb=perturb, seed=seed)
