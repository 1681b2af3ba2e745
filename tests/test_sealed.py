"""RL's kept screenshots are sealed at rest: on disk nothing but ciphertext, opened again only with the run's key,
as exactly the pixels the policy saw."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest
from cryptography.fernet import Fernet
from PIL import Image, ImageChops

from mobilerl import sealed
from mobilerl.agent.policy import OraclePolicy
from mobilerl.agent.rollout import rollout
from mobilerl.env.pool import ThreadEnv
from mobilerl.env.sim import SimEnv
from mobilerl.env.sim.tasks.registry import get_task
from mobilerl.eval.render import render_png

TASK = "lab/test/contacts_phone_query/0"  # the expert opens a contact: names and a phone number on screen


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    monkeypatch.setattr(sealed, "_SEALED", {})


def episode(folder):
    return asyncio.run(rollout(ThreadEnv(SimEnv(render=True)), OraclePolicy(), get_task(TASK, with_optimal=False),
                               keep_screenshots_dir=folder))


def test_screens_kept_under_a_sealed_folder_are_ciphertext_and_open_as_the_policy_saw_them(tmp_path):
    root = sealed.seal(tmp_path / "screens", Fernet.generate_key())
    traj, plain = episode(root), episode(tmp_path / "plain")
    assert traj.success and plain.success and len(traj.steps) == len(plain.steps) > 1
    files = [f for f in root.rglob("*") if f.is_file()]
    assert len(files) >= len(traj.steps)
    assert all(f.name.endswith(".png.enc") and f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert not any(b"\x89PNG" in f.read_bytes() for f in files)  # Fernet tokens are base64: no PNG signature
    assert all(s.screenshot_path.endswith(".png.enc") for s in traj.steps)
    for s, p in zip(traj.steps, plain.steps, strict=True):  # the simulator is deterministic: the same screens
        with Image.open(p.screenshot_path) as im:
            assert ImageChops.difference(sealed.open_image(s.screenshot_path), im.convert("RGB")).getbbox() is None
    # the judge's rendering of the trace (image view) reads them as well: the plain episode's picture, not blanks
    blank = copy.deepcopy(traj)
    for s in blank.steps:
        s.screenshot_path = None
    drawn = render_png(traj, tmp_path)
    assert ImageChops.difference(drawn, render_png(plain, tmp_path)).getbbox() is None
    assert ImageChops.difference(drawn, render_png(blank, tmp_path)).getbbox() is not None


def test_a_sealed_screen_is_refused_with_its_name_under_another_key_or_none(tmp_path):
    root = sealed.seal(tmp_path / "screens", Fernet.generate_key())
    path = sealed.write_bytes(root / "step000.png", b"\x89PNG pixels")
    assert path.name == "step000.png.enc" and sealed.read_bytes(path) == b"\x89PNG pixels"
    sealed.seal(root, Fernet.generate_key())  # a run with another rl.state_key
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*another key"):
        sealed.read_bytes(path)
    sealed._SEALED.clear()  # a process that never registered the folder
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*no key"):
        sealed.open_image(path)
    outside = sealed.write_bytes(tmp_path / "other" / "step000.png", b"plain")
    assert outside.name == "step000.png" and outside.read_bytes() == b"plain"
