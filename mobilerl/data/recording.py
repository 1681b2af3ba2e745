"""The recording env: a synchronous env wrapper that captures an episode for masked storage.

Each observation's screenshot goes to a masking thread pool *in memory*; the job masks it (the UI dump's
flagged nodes, faces, QR codes, optionally OCR'd text: :meth:`~mobilerl.data.masking.MaskingOptions.mask`)
and only then encodes and writes the PNG. The env's canaries (the raw personal values the simulator
planted, ``SimEnv.canary_categories``) are read after every call and kept in memory only.
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl.data import privacy as P
from mobilerl.data.masking import MaskingOptions
from mobilerl.env.actions import Action
from mobilerl.env.base import Env, Observation, StepResult, TaskSpec
from mobilerl.env.xml import compress_xml


class EpisodeCapture:
    """One episode as the recording env sees it (lives in memory)."""

    def __init__(self, task: TaskSpec, opts: MaskingOptions, tmp_dir: Path, pool: ThreadPoolExecutor,
                 slots: threading.BoundedSemaphore):
        self.task = task
        self.opts = opts
        self.tmp_dir = tmp_dir
        self.pool = pool
        self.slots = slots  # bounds the screenshots waiting for masking (memory)
        self.waits: list[float] = []  # per frame: seconds the env waited for a masking slot
        self.canaries: dict[str, str] = {}
        self.masker = P.TextMasker(opts.mode, seed=f"{opts.seed}|{task.task_id}")
        self.frames: list[Future] = []
        self.lock = threading.Lock()

    def update_canaries(self, new: Mapping[str, str]) -> None:
        with self.lock:
            fresh = {k: v for k, v in new.items() if k not in self.canaries}
            if not fresh:
                return
            self.canaries.update(fresh)
            self.opts.teach(self.masker, fresh, self.task.params)

    def add(self, obs: Observation) -> None:
        if obs.screenshot is None:
            self.frames.append(_done(None))
            self.waits.append(0.0)
            return
        index = len(self.frames)
        shot = obs.screenshot
        t0 = time.perf_counter()
        self.slots.acquire()
        self.waits.append(time.perf_counter() - t0)
        try:
            fut = self.pool.submit(self._mask_frame, index, shot, obs.xml, (obs.width, obs.height))
        except BaseException:
            self.slots.release()
            raise
        fut.add_done_callback(lambda _f: self.slots.release())
        self.frames.append(fut)

    def _mask_frame(self, index: int, shot: Image.Image, xml: str, size: tuple[int, int]) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            xml_c = compress_xml(xml, width=size[0], height=size[1]) if xml else ""
        except ValueError:
            xml_c = ""
        with self.lock:  # the env thread may be adding canaries to the masker
            self.masker.learn(xml_c)
            boxes = P.sensitive_boxes(xml_c, self.masker)
            if self.opts.ocr:
                res = self.opts.mask(shot, boxes, size, self.masker)
        if not self.opts.ocr:
            res = self.opts.mask(shot, boxes, size)
        path = self.tmp_dir / f"step{index:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        res.image.save(buf, format="PNG", compress_level=self.opts.png_compress)
        path.write_bytes(buf.getvalue())
        return {"file": path.name, "regions": res.counts, "timings": res.timings,
                "mask_s": time.perf_counter() - t0}


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class RecordingEnv:
    """A synchronous env wrapper that captures each episode for masked storage (see the module doc).

    ``inner`` must render screenshots to store images. If it has ``canary_categories()`` (the simulator),
    the canaries are read after reset, after every step and at evaluate.
    """

    def __init__(self, inner: Env, opts: MaskingOptions, tmp_root: Path, pool: ThreadPoolExecutor,
                 slots: threading.BoundedSemaphore | None = None):
        self.inner = inner
        self.opts = opts
        self.tmp_root = tmp_root
        self.pool = pool
        self.slots = slots or threading.BoundedSemaphore(8)
        self.capture: EpisodeCapture | None = None

    def _canaries(self) -> None:
        fn = getattr(self.inner, "canary_categories", None)
        if fn is not None and self.capture is not None:
            self.capture.update_canaries(fn())

    def reset(self, task: TaskSpec | str) -> Observation:
        if not isinstance(task, TaskSpec):
            raise TypeError("RecordingEnv.reset needs a TaskSpec")
        self.capture = EpisodeCapture(task, self.opts, self.tmp_root / f".tmp-{uuid.uuid4().hex}", self.pool, self.slots)
        obs = self.inner.reset(task)
        self._canaries()
        self.capture.add(obs)
        return obs

    def step(self, action: Action) -> StepResult:
        res = self.inner.step(action)
        self._canaries()
        assert self.capture is not None
        self.capture.add(res.observation)
        return res

    def evaluate(self) -> float | None:
        r = self.inner.evaluate()
        self._canaries()
        return r

    def close(self) -> None:
        self.inner.close()

    def take(self) -> EpisodeCapture | None:
        cap, self.capture = self.capture, None
        return cap
