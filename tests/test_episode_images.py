"""The RL run's episode images: which episodes are drawn, and that nothing personal is drawn."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PIL import Image, ImageChops

from mobilerl.agent.policy import OraclePolicy
from mobilerl.data import privacy as P
from mobilerl.data.audit import sim_canaries
from mobilerl.data.masking import trajectory_texts
from mobilerl.env.sim.tasks.registry import get_task
from mobilerl.eval.episode_images import masked_copy, pick, round_images
from mobilerl.eval.runner import evaluate_sync
from mobilerl.trajectory import Trajectory

TASK = "lab/test/contacts_phone_query/0"  # the expert opens a contact: names and a phone number on screen


@pytest.fixture(scope="module")
def episode(tmp_path_factory) -> Trajectory:
    shots = tmp_path_factory.mktemp("screens")
    [traj] = evaluate_sync(OraclePolicy, [get_task(TASK)], obs_mode="screenshot+xml", keep_screenshots_dir=shots,
                           progress=False)
    assert traj.success and all(s.screenshot_path and Path(s.screenshot_path).is_file() for s in traj.steps)
    return traj


def _t(task: str, trial: int, success: bool, steps: int, error_kind: str | None = None) -> Trajectory:
    t = Trajectory(task_id=task, instruction="x", trial=trial, success=success)
    t.steps = [None] * steps  # type: ignore[list-item]  # only counted
    if error_kind:
        t.fail(error_kind, "down")  # type: ignore[arg-type]
    return t


def test_the_best_success_and_a_failure_of_its_task_are_picked():
    trajs = [_t("a", 0, False, 3), _t("b", 0, True, 5), _t("b", 1, False, 9), _t("a", 1, True, 4),
             _t("a", 2, False, 2), _t("b", 2, True, 2, "env")]
    picked = pick(trajs)
    assert (picked["success"].task_id, picked["success"].trial) == ("a", 1)  # 4 steps; the env-failed one is out
    assert (picked["failure"].task_id, picked["failure"].trial) == ("a", 0)
    assert {k: (v.task_id, v.trial) for k, v in pick([_t("c", 0, False, 1), _t("c", 1, False, 1)]).items()} == {
        "failure": ("c", 0)}
    assert pick([_t("d", 0, False, 1, "env")]) == {}


def test_a_drawn_episode_is_masked_texts_and_screens(episode, tmp_path):
    planted = dict(sim_canaries(TASK))
    assert planted
    shown = [v for v in planted if any(v in s.xml_compressed for s in episode.steps)]
    assert shown, "the episode's screens show none of the planted values: nothing is at risk"
    out = masked_copy(episode, tmp_path)
    for field, text in trajectory_texts(out):
        assert not [v for v in shown if v in text], field
    boxed = 0
    for raw, masked in zip(episode.steps, out.steps, strict=True):
        boxes = P.sensitive_boxes(raw.xml_compressed, P.TextMasker(known=planted))
        a = Image.open(raw.screenshot_path).convert("RGB")
        b = Image.open(tmp_path / masked.screenshot_path).convert("RGB")
        assert a.size == b.size
        for box, _ in boxes:  # every sensitive box is painted over
            assert ImageChops.difference(a.crop(box), b.crop(box)).getbbox() is not None, box
            boxed += 1
    assert boxed > 0
    failed = dataclasses.replace(episode, trial=1, success=False, reward=0.0)
    images = round_images([failed, episode])
    assert sorted(images) == ["episodes/failure", "episodes/success"]
    assert all(img.width > 3 * 270 for img in images.values())  # a panel a step, side by side


def test_an_evaluation_draws_the_first_failure_of_each_template(episode):
    from mobilerl.eval.episode_images import failure_images

    failed = [dataclasses.replace(episode, trial=k, success=False, reward=0.0) for k in range(3)]
    other = dataclasses.replace(failed[0], template="other_template", task_id="lab/test/other_template/0")
    images = failure_images([episode, *failed, other], templates=5)
    assert sorted(images) == ["failures/contacts_phone_query", "failures/other_template"]
    assert len(failure_images([episode, *failed, other], templates=1)) == 1 and not failure_images([episode], 5)
