"""What a policy does, as images in its MLflow run: RL rounds' episodes and evaluation failures.

Every ``rl.log_episodes_every`` rounds, :func:`round_images` picks the round's best success (its fewest steps) and
a failure of the same task (else the round's first failure when nothing succeeded); the `rl` stage logs them as
``episodes/success`` and ``episodes/failure``, the round as the step. An evaluated checkpoint's run gets
:func:`failure_images`: the first failure of each template (``failures/<template>``). Each is drawn as the judge
sees a trace (:func:`mobilerl.eval.render.render_png`: every screen with its action, then the final screen).

Personal data is masked before anything is drawn, as for every stored trace (:mod:`mobilerl.data.masking`): the
texts by the episode's text masker, which knows the values the simulator planted for the task, and each screenshot
by the collection's image masking over the screen's sensitive boxes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl import sealed
from mobilerl.data import privacy as P
from mobilerl.data.masking import MaskingOptions, mask_trajectory
from mobilerl.trajectory import Trajectory


def pick(trajs: Iterable[Trajectory]) -> dict[str, Trajectory]:
    """``{"success": …, "failure": …}``: the best success (fewest steps) and a failure of its task; with no success,
    the first failure alone; env-failed episodes are never picked (they show the env, not the policy)."""
    done = [t for t in trajs if t.error_kind != "env"]
    wins = sorted((t for t in done if t.success), key=lambda t: (len(t.steps), t.task_id, t.trial))
    if wins:
        best = wins[0]
        fail = next((t for t in done if t.task_id == best.task_id and not t.success), None)
        return {"success": best} | ({"failure": fail} if fail is not None else {})
    fail = next((t for t in done if not t.success), None)
    return {"failure": fail} if fail is not None else {}


def masked_copy(traj: Trajectory, folder: Path, opts: MaskingOptions | None = None) -> Trajectory:
    """``traj`` with its texts masked and its screenshots masked into ``folder`` (the copy names them there)."""
    opts = opts or MaskingOptions()
    masker = P.TextMasker(opts.mode, seed=f"{opts.seed}|{traj.task_id}")
    opts.teach(masker, *_planted(traj.task_id))
    for text in [traj.instruction, *(s.xml_compressed for s in traj.steps)]:
        masker.learn(text)
    boxes = [P.sensitive_boxes(s.xml_compressed, masker) for s in traj.steps]
    out = mask_trajectory(traj, masker, learn=False)
    size = tuple(traj.meta.get("screen_size") or ())
    for k, (step, raw) in enumerate(zip(out.steps, traj.steps, strict=True)):
        if not raw.screenshot_path or not Path(raw.screenshot_path).is_file():
            step.screenshot_path = None
            continue
        shot = sealed.open_image(raw.screenshot_path)
        res = opts.mask(shot, boxes[k], size or shot.size, masker)
        step.screenshot_path = f"step{k:03d}.png"
        res.image.save(folder / step.screenshot_path)
    return out


def _planted(task_id: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The personal values the simulator planted for ``task_id`` and the task's parameters (none for another
    backend's task)."""
    from mobilerl.data.audit import sim_canaries
    from mobilerl.env.sim.tasks.registry import get_task

    try:
        return dict(sim_canaries(task_id)), get_task(task_id, with_optimal=False).params
    except (KeyError, ValueError):
        return {}, {}


def drawn(traj: Trajectory, opts: MaskingOptions | None = None) -> Image.Image:
    """``traj`` masked (:func:`masked_copy`) and drawn; the masked screens live only while it is drawn."""
    from mobilerl.eval.render import render_png

    with tempfile.TemporaryDirectory(prefix="mobilerl-episode-") as tmp:
        return render_png(masked_copy(traj, Path(tmp), opts), store_root=tmp)


def round_images(trajs: Iterable[Trajectory], opts: MaskingOptions | None = None) -> dict[str, Image.Image]:
    """The round's picked episodes (:func:`pick`), drawn, by MLflow image key."""
    return {f"episodes/{role}": drawn(traj, opts) for role, traj in pick(trajs).items()}


def failure_images(trajs: Iterable[Trajectory], templates: int) -> dict[str, Image.Image]:
    """The first failure of each template (at most ``templates`` of them), drawn, by MLflow image key; env-failed
    episodes are not the policy's."""
    first: dict[str, Trajectory] = {}
    for t in trajs:
        name = t.template or t.task_id.rsplit("/", 1)[0]
        if not t.success and t.error_kind != "env" and name not in first and len(first) < templates:
            first[name] = t
    return {f"failures/{name}": drawn(t) for name, t in first.items()}
