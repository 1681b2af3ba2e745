"""Data collection with privacy masking before storage (MobileRL Appendix D, D.2).

:func:`collect` runs a policy (the simulator's oracle by default, any :class:`~mobilerl.agent.policy.Policy`)
over a task list through the async :class:`~mobilerl.env.pool.EnvPool` with the one rollout loop
(:func:`~mobilerl.agent.rollout.rollout`), and writes a trajectory store (:mod:`mobilerl.data.store`):
Parquet rows + PNG screenshots. Nothing raw reaches the disk:

1. Every env worker is a :class:`RecordingEnv` around a rendering env. It hands each observation's
   screenshot to a masking thread pool *in memory*; the job masks it (the UI dump's flagged nodes, faces,
   QR codes, optionally OCR'd text — :func:`mobilerl.data.privacy_image.mask_image`) and only then
   encodes and writes the PNG. It also asks the env for its canaries (the raw personal values the
   simulator planted, ``SimEnv.canary_categories``), kept in memory only.
2. When the episode ends, its texts — instruction, every step's compressed XML, response and action,
   the answer, the final screen — go through the episode's :class:`~mobilerl.data.privacy.TextMasker`
   (same surrogates everywhere in the episode). Names and postal addresses, which no regex finds, are
   masked as the known values the simulator reported (``known_categories``).
3. A pre-write check looks for every canary in the masked texts (exactly and, for numbers, by digits); an
   episode that still holds one is not written (counted in ``leaks_blocked``; the stage then fails).
4. Only then is the row appended to the Parquet table.

Canaries and raw actions of each episode stay in memory in :class:`EpisodeSecrets` (returned by
:func:`collect`) so that :func:`replay_check` can replay the *stored* episodes (surrogates put back in
memory) and compare the verifier results, and so that an in-process audit could use them. The separate
``privacy_audit`` stage re-derives canaries from the task seeds instead (nothing is written for it).

:func:`import_human` brings human-annotated episodes (``docs/data_schema.md``: ``episodes.jsonl`` +
images) into a store through the same masking.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from mobilerl.data import privacy as P
from mobilerl.data.privacy_image import FAST_CASCADES, THOROUGH_CASCADES, mask_image
from mobilerl.trajectory import StepRecord, Trajectory
from mobilerl.data.store import IMAGES, StoreWriter, episode_dir, image_path
from mobilerl.env.actions import Action, format_action, parse_action
from mobilerl.env.base import Env, Observation, StepResult, TaskSpec
from mobilerl.env.xml import compress_xml

log = logging.getLogger(__name__)

SURROGATE_REGISTRY = "surrogates.sha256"


# ================================================================================== configuration


@dataclass
class MaskingOptions:
    """How data is masked before storage.

    ``mode``: ``token`` or ``surrogate`` (:class:`~mobilerl.data.privacy.TextMasker`);
    ``known_categories``: canary categories masked as known values (the detectors cover the rest);
    ``faces`` / ``qr`` / ``ocr``: image detectors; ``thorough_faces``: all cascades at 1280 px (slower);
    ``style``: ``fill`` or ``blur``; ``png_compress``: zlib level of the stored PNGs;
    ``image_max_side``: store screenshots downscaled to this longer side (None: as captured). Masking runs
    on the stored size; UI-dump boxes are scaled to it.
    """

    mode: str = "token"
    known_categories: tuple[str, ...] = (P.PERSON_NAME, P.ADDRESS)
    faces: bool = True
    qr: bool = True
    ocr: bool = False
    thorough_faces: bool = False
    style: str = "fill"
    png_compress: int = 3
    image_max_side: int | None = None
    seed: int = 0

    def image_kwargs(self) -> dict[str, Any]:
        return {"faces": self.faces, "qr": self.qr, "ocr": self.ocr, "style": self.style,
                "face_cascades": THOROUGH_CASCADES if self.thorough_faces else FAST_CASCADES,
                "face_max_side": 1280 if self.thorough_faces else 640, "qr_both": self.thorough_faces}

    def mask(self, img: Image.Image, boxes: Any, box_space: tuple[int, int], masker: Any = None) -> Any:
        """Mask a captured screenshot for storage: QR codes are found on the full-size capture, the rest
        on the stored (downscaled) image; returns a :class:`~mobilerl.data.privacy_image.ImageMaskResult`."""
        from mobilerl.data.privacy_image import Region, detect_qr

        small = self.shrink(img)
        kw = self.image_kwargs()
        if small.size == img.size or not self.qr:
            return mask_image(small, boxes=boxes, box_space=box_space, masker=masker, **kw)
        t0 = time.perf_counter()
        sx, sy = small.width / img.width, small.height / img.height
        pre = [Region((int(b[0] * sx), int(b[1] * sy), int(b[2] * sx) + 1, int(b[3] * sy) + 1), "qr")
               for b in detect_qr(img, both=self.thorough_faces)]
        qr_s = time.perf_counter() - t0
        res = mask_image(small, boxes=boxes, box_space=box_space, masker=masker, regions=pre, **{**kw, "qr": False})
        res.timings["qr_s"] = qr_s
        return res

    def shrink(self, img: Image.Image) -> Image.Image:
        """The screenshot as stored: downscaled so its longer side is at most ``image_max_side``."""
        m = self.image_max_side
        if not m or max(img.size) <= m:
            return img
        k = max(img.size) // m  # integer box reduction first (fast), then a bilinear rest
        if k >= 2:
            img = img.reduce(k)
        if max(img.size) > m:
            f = m / max(img.size)
            img = img.resize((max(1, round(img.width * f)), max(1, round(img.height * f))), Image.BILINEAR)
        return img


def fingerprint(value: str) -> str:
    """Hash of a value's letters and digits (lower-cased): how surrogates are registered without storing
    anything that could be mistaken for data."""
    norm = re.sub(r"[^0-9a-z]", "", value.lower())
    return hashlib.sha256(norm.encode()).hexdigest()


def surrogate_fingerprints(masker: P.TextMasker) -> set[str]:
    """Fingerprints of every surrogate ``masker`` produced (phones also by their last 10 digits)."""
    out = set()
    for fake in masker.inverse:
        out.add(fingerprint(fake))
        d = re.sub(r"\D", "", fake)
        if len(d) >= 7:
            out.add(fingerprint(d[-10:]))
    return out


# ================================================================================== canary search


def _canary_patterns(canaries: Iterable[str]) -> list[tuple[str, re.Pattern[str]]]:
    """For numbers (7+ digits) a pattern of their national digits with any separators in between."""
    out = []
    for c in canaries:
        d = re.sub(r"\D", "", c)
        if len(d) < 7 or re.search(r"[A-Za-z]{2}", c):
            continue
        nsn = d
        try:
            import phonenumbers

            num = phonenumbers.parse(c, None if c.strip().startswith("+") else "US")
            if phonenumbers.is_valid_number(num):
                nsn = str(num.national_number)
        except Exception:  # noqa: BLE001 - not a phone number: use all its digits
            pass
        body = r"[\s\-.()/]*".join(nsn)
        out.append((c, re.compile(r"(?<!\d)" + body + r"(?!\d)")))
    return out


def find_canaries(text: str, canaries: Iterable[str], patterns: list[tuple[str, re.Pattern[str]]] | None = None
                  ) -> list[str]:
    """The canaries that occur in ``text``: exactly (case-insensitive) or, for numbers, by their digits."""
    if not text:
        return []
    low = text.lower()
    hits = [c for c in canaries if len(c) >= 4 and c.lower() in low]
    for c, rx in (patterns if patterns is not None else _canary_patterns(canaries)):
        if c not in hits and rx.search(text):
            hits.append(c)
    return hits


# ================================================================================== the recording env


@dataclass
class EpisodeSecrets:
    """What one episode keeps in memory only: canaries, the masker (surrogate inverse) and raw actions."""

    task: TaskSpec
    canaries: dict[str, str] = field(default_factory=dict)
    masker: P.TextMasker | None = None
    raw_actions: list[dict[str, Any] | None] = field(default_factory=list)
    reward: float | None = None


class _Capture:
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
            known = {k: v for k, v in fresh.items() if v in self.opts.known_categories}
            if known:
                self.masker.add_known(known)
                # the task's own people: their first and last names get typed into separate fields
                if P.PERSON_NAME in self.opts.known_categories:
                    params = {str(v) for v in self.task.params.values() if isinstance(v, str)}
                    self.masker.add_name_parts(k for k, v in known.items() if v == P.PERSON_NAME and k in params)
            self.masker.surrogates.add_avoid(fresh)

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
        self.capture: _Capture | None = None

    def _canaries(self) -> None:
        fn = getattr(self.inner, "canary_categories", None)
        if fn is not None and self.capture is not None:
            self.capture.update_canaries(fn())

    def reset(self, task: TaskSpec | str) -> Observation:
        if not isinstance(task, TaskSpec):
            raise TypeError("RecordingEnv.reset needs a TaskSpec")
        self.capture = _Capture(task, self.opts, self.tmp_root / f".tmp-{uuid.uuid4().hex}", self.pool, self.slots)
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

    def take(self) -> _Capture | None:
        cap, self.capture = self.capture, None
        return cap


# ================================================================================== masking a trajectory


def _mask_action(a: dict[str, Any] | None, m: P.TextMasker) -> dict[str, Any] | None:
    if a is None:
        return None
    out = dict(a)
    for key in ("text", "message"):
        if out.get(key):
            out[key] = m(out[key])
    return out


def mask_trajectory(traj: Trajectory, m: P.TextMasker, learn: bool = True) -> Trajectory:
    """A masked copy: instruction, answer, final screen, and per step the XML, response (re-rendered from
    the masked action when it was the canonical form) and action. With ``learn``, every value detected in
    any text of the episode is first made a known value (:meth:`~mobilerl.data.privacy.TextMasker.learn`),
    so it is masked in all of them."""
    if learn:
        for _, text in trajectory_texts(traj):
            m.learn(text)
    d = traj.to_dict()
    d["instruction"] = m(traj.instruction)
    d["answer"] = m(traj.answer) if traj.answer else traj.answer
    d["final_xml_compressed"] = m(traj.final_xml_compressed) if traj.final_xml_compressed else traj.final_xml_compressed
    d["error"] = m(traj.error) if traj.error else traj.error
    steps = []
    for s in traj.steps:
        sd = s.to_dict()
        sd["xml_compressed"] = m(s.xml_compressed)
        sd["action"] = _mask_action(s.action, m)
        if s.action is not None and s.response.strip() == format_action(Action.from_dict(s.action)):
            sd["response"] = format_action(Action.from_dict(sd["action"]))
        else:
            sd["response"] = m(s.response)
        sd["invalid"] = m(s.invalid) if s.invalid else s.invalid
        sd["step_instruction"] = m(s.step_instruction) if s.step_instruction else s.step_instruction
        steps.append(sd)
    d["steps"] = steps
    return Trajectory.from_dict(d)


def trajectory_texts(traj: Trajectory) -> Iterable[tuple[str, str]]:
    """``(field, text)`` of every stored text of an episode (what audits scan)."""
    yield "instruction", traj.instruction
    if traj.answer:
        yield "answer", traj.answer
    if traj.final_xml_compressed:
        yield "final_xml_compressed", traj.final_xml_compressed
    if traj.error:
        yield "error", traj.error
    for s in traj.steps:
        yield f"steps[{s.index}].xml_compressed", s.xml_compressed
        yield f"steps[{s.index}].response", s.response
        if s.step_instruction:
            yield f"steps[{s.index}].step_instruction", s.step_instruction
        if s.invalid:
            yield f"steps[{s.index}].invalid", s.invalid
        if s.action:
            for key in ("text", "message", "app"):
                if s.action.get(key):
                    yield f"steps[{s.index}].action.{key}", str(s.action[key])


# ================================================================================== collection


@dataclass
class CollectResult:
    n_episodes: int = 0
    n_steps: int = 0
    n_success: int = 0
    n_errors: int = 0
    leaks_blocked: int = 0
    leaked_categories: Counter = field(default_factory=Counter)
    mask_counts: Counter = field(default_factory=Counter)
    image_regions: Counter = field(default_factory=Counter)
    image_mask_s: float = 0.0
    wall_s: float = 0.0
    secrets: dict[str, EpisodeSecrets] = field(default_factory=dict)  # episode id -> in memory only

    def summary(self, timings: bool = True) -> dict[str, Any]:
        """Counts and masking statistics; ``timings=False`` leaves out the wall-clock figures (a reproducible
        store's manifest: they stay in the stage's metrics)."""
        out = {
            "episodes": self.n_episodes, "steps": self.n_steps, "success": self.n_success,
            "success_rate": self.n_success / self.n_episodes if self.n_episodes else None,
            "errors": self.n_errors, "leaks_blocked": self.leaks_blocked,
            "leaked_categories": dict(self.leaked_categories), "masked_text_spans": dict(self.mask_counts),
            "masked_image_regions": dict(self.image_regions),
            "image_mask_s_per_step": self.image_mask_s / self.n_steps if self.n_steps else None,
            "wall_s": self.wall_s,
        }
        if not timings:
            del out["image_mask_s_per_step"], out["wall_s"]
        return out


def _sim_env_factory(perturb: str) -> Callable[[], Env]:
    from mobilerl.env.sim.env import SimEnv

    return lambda: SimEnv(render=True, perturb=perturb)


async def collect(
    policy_factory: Callable[[int], Any],
    tasks: Sequence[TaskSpec],
    out_dir: str | os.PathLike,
    *,
    masking: MaskingOptions | None = None,
    n_trials: int = 1,
    concurrency: int = 4,
    env_factory: Callable[[], Env] | None = None,
    perturb: str = "default",
    base_seed: int = 0,
    mask_workers: int = 2,
    progress: bool = True,
    call_timeout: float | None = 120.0,
    source: str = "collected",
    keep_secrets: bool = True,
) -> CollectResult:
    """Collect ``n_trials`` episodes of every task into the store ``out_dir`` (see the module docstring).

    ``policy_factory(seed)`` builds the policy of one episode (the seed is
    :func:`~mobilerl.eval.runner.episode_seed`). Returns counts, masking statistics and (when
    ``keep_secrets``) the in-memory :class:`EpisodeSecrets` per episode id.
    """
    from tqdm.auto import tqdm

    from mobilerl.agent.rollout import rollout
    from mobilerl.env.pool import EnvPool, ThreadEnv
    from mobilerl.eval.runner import episode_seed

    opts = masking or MaskingOptions()
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / IMAGES).mkdir(parents=True)
    make_env = env_factory or _sim_env_factory(perturb)
    episodes = [(t, k) for t in tasks for k in range(n_trials)]
    result = CollectResult()
    registry: set[str] = set()
    size = max(1, min(concurrency, len(episodes) or 1))
    env_pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="mobilerl-collect-env")
    mask_pool = ThreadPoolExecutor(max_workers=max(1, mask_workers), thread_name_prefix="mobilerl-mask")
    writer = StoreWriter(out, manifest={"source": source, "masking": {
        "mode": opts.mode, "known_categories": list(opts.known_categories), "faces": opts.faces, "qr": opts.qr,
        "ocr": opts.ocr, "style": opts.style}})
    bar = tqdm(total=len(episodes), disable=not progress, desc=f"collect {source}", unit="ep", dynamic_ncols=True)
    t_start = time.perf_counter()

    slots = threading.BoundedSemaphore(2 * max(1, mask_workers) + 2)

    def worker() -> ThreadEnv:
        return ThreadEnv(RecordingEnv(make_env(), opts, out / IMAGES, mask_pool, slots), executor=env_pool)

    pool = EnvPool(worker, size=size, call_timeout=call_timeout, start_concurrency=min(size, 8))
    # _finish runs in worker threads (asyncio.to_thread), several at once: the store, the registry and the
    # counters are updated under this lock (unguarded, two threads could interleave row groups in the file).
    finish_lock = threading.Lock()

    async def one(task: TaskSpec, trial: int) -> None:
        seed = episode_seed(base_seed, task.task_id, trial)
        policy = policy_factory(seed)
        async with pool.acquire() as env:
            traj = await rollout(env, policy, task, trial=trial, seed=seed)
            rec: RecordingEnv = env.worker.env  # type: ignore[attr-defined]
            cap = rec.take()
        if cap is None:
            raise RuntimeError(f"no capture for {task.task_id}")
        frames = [await asyncio.wrap_future(f) for f in cap.frames]
        traj.source = source
        await asyncio.to_thread(_finish, traj, cap, frames)

    def _finish(traj: Trajectory, cap: _Capture, frames: list[dict[str, Any] | None]) -> None:
        # screenshots: frame k is the screen of the k-th env observation; invalid steps did not step
        final_dir = out / IMAGES / episode_dir(traj.episode_id)
        if cap.tmp_dir.exists():
            if final_dir.exists():
                shutil.rmtree(final_dir)
            os.replace(cap.tmp_dir, final_dir)
        k = 0
        shots_s = 0.0
        for s in traj.steps:
            fr = frames[k] if k < len(frames) else None
            if fr is not None:
                s.screenshot_path = f"{IMAGES}/{final_dir.name}/{fr['file']}"
            if s.action is not None:  # the env was stepped: the next step sees the next frame
                k += 1
                if k < len(cap.waits):  # the step's env time without waiting for a masking slot
                    s.latency_s = max(0.0, s.latency_s - cap.waits[k])
        regions: Counter = Counter()
        for fr in frames:
            if fr is not None:
                shots_s += fr["mask_s"]
                regions.update(fr["regions"])
        raw_actions = [s.action for s in traj.steps]
        masked = mask_trajectory(traj, cap.masker)
        masked.meta = {**masked.meta, "mask_mode": opts.mode, "masked_spans": dict(cap.masker.counts)}
        # pre-write check: no canary may survive in the stored texts
        pats = _canary_patterns(cap.canaries)
        leaks = Counter()
        for _, text in trajectory_texts(masked):
            for c in find_canaries(text, cap.canaries, pats):
                leaks[cap.canaries[c]] += 1
        with finish_lock:
            result.image_mask_s += shots_s
            result.image_regions.update(regions)
            if leaks:
                result.leaks_blocked += 1
                result.leaked_categories.update(leaks)
                shutil.rmtree(final_dir, ignore_errors=True)
                log.error("episode %s still holds planted values of %s after masking: not stored",
                          masked.episode_id, dict(leaks))
                return
            writer.write(masked)
            registry.update(surrogate_fingerprints(cap.masker))
            result.n_episodes += 1
            result.n_steps += masked.n_steps
            result.n_success += bool(masked.success)
            result.n_errors += masked.error is not None
            result.mask_counts.update(cap.masker.counts)
            if keep_secrets:
                result.secrets[masked.episode_id] = EpisodeSecrets(cap.task, dict(cap.canaries), cap.masker,
                                                                   raw_actions, traj.reward)

    async def guarded(task: TaskSpec, trial: int) -> None:
        try:
            await one(task, trial)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad episode must not end the collection
            log.warning("collect: episode %s#%d failed: %r", task.task_id, trial, e)
            with finish_lock:
                result.n_errors += 1
        finally:
            bar.update(1)

    try:
        async with pool:
            jobs = [asyncio.create_task(guarded(t, k)) for t, k in episodes]
            try:
                await asyncio.gather(*jobs)
            except BaseException:
                for j in jobs:
                    j.cancel()
                await asyncio.gather(*jobs, return_exceptions=True)
                raise
    finally:
        bar.close()
        mask_pool.shutdown(wait=True)
        env_pool.shutdown(wait=False, cancel_futures=True)
        for tmp in (out / IMAGES).glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        result.wall_s = time.perf_counter() - t_start
        writer.manifest["summary"] = result.summary(timings=not writer.reproducible)
        writer.close()
        (out / SURROGATE_REGISTRY).write_text("".join(f"{h}\n" for h in sorted(registry)))
    return result


def collect_sync(*args: Any, **kwargs: Any) -> CollectResult:
    return asyncio.run(collect(*args, **kwargs))


# ================================================================================== replay


def replay_actions(traj: Trajectory, secrets: EpisodeSecrets) -> list[Action]:
    """The actions of a *stored* episode, with masked text put back from memory: surrogates through the
    episode's masker, tokens from the raw actions (the only place they are)."""
    out = []
    for i, s in enumerate(traj.steps):
        if s.action is None:
            continue
        a = dict(s.action)
        for key in ("text", "message"):
            if a.get(key):
                if secrets.masker is not None and secrets.masker.mode == "surrogate":
                    a[key] = secrets.masker.unmask(a[key])
                elif i < len(secrets.raw_actions) and secrets.raw_actions[i] is not None:
                    raw = secrets.raw_actions[i].get(key)  # type: ignore[union-attr]
                    if raw is not None and secrets.masker is not None and secrets.masker(raw) == a[key]:
                        a[key] = raw
        out.append(Action.from_dict(a))
    return out


def replay_check(store: str | os.PathLike, secrets: Mapping[str, EpisodeSecrets], perturb: str = "default",
                 env_factory: Callable[[], Env] | None = None) -> dict[str, Any]:
    """Replay every stored episode (read back from ``store``) in a fresh env and compare the verifier
    result with the stored one. Returns counts and the ids that differ."""
    from mobilerl.data.store import iter_store

    make_env = env_factory or (lambda: __import__("mobilerl.env.sim.env", fromlist=["SimEnv"]).SimEnv(
        render=False, perturb=perturb))
    n = same = 0
    differ: list[str] = []
    skipped = 0
    for traj in iter_store(store):
        sec = secrets.get(traj.episode_id)
        if sec is None or traj.error is not None or not traj.has_verifier:
            skipped += 1
            continue
        env = make_env()
        env.reset(sec.task)
        reward = None
        try:
            for a in replay_actions(traj, sec):
                res = env.step(a)
                if res.done:
                    break
            reward = env.evaluate()
        finally:
            env.close()
        n += 1
        if (reward is None and traj.reward is None) or (reward is not None and traj.reward is not None
                                                        and abs(reward - traj.reward) < 1e-9):
            same += 1
        else:
            differ.append(traj.episode_id)
    return {"replayed": n, "same_result": same, "differ": differ, "skipped": skipped}


# ================================================================================== human annotations


def _parse_human_action(a: Any) -> Action:
    if isinstance(a, str):
        return parse_action(a)
    if isinstance(a, dict):
        return Action.from_dict(a)
    raise ValueError(f"action must be a call string or an object, got {type(a).__name__}")


def import_human(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    masking: MaskingOptions | None = None,
    progress: bool = True,
    source: str = "human",
) -> CollectResult:
    """Import human-annotated episodes (``<src>/episodes.jsonl`` + images; ``docs/data_schema.md``) into
    the store ``out_dir``, masking texts and screenshots on the way (no canaries: detectors only)."""
    from tqdm.auto import tqdm

    opts = masking or MaskingOptions()
    src = Path(src_dir)
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / IMAGES).mkdir(parents=True)
    result = CollectResult()
    registry: set[str] = set()
    lines = (src / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    t0 = time.perf_counter()
    with StoreWriter(out, manifest={"source": source, "masking": {"mode": opts.mode, "faces": opts.faces,
                                                                  "qr": opts.qr, "ocr": opts.ocr}}) as writer:
        for lineno, line in enumerate(tqdm(lines, disable=not progress, desc=f"import {source}", unit="ep"), 1):
            if not line.strip():
                continue
            try:
                ep = json.loads(line)
                traj, masker, shots_s, regions = _import_episode(ep, src, out, opts, source)
            except (ValueError, KeyError, TypeError, OSError) as e:
                raise ValueError(f"{src / 'episodes.jsonl'}:{lineno}: {e}") from None
            writer.write(traj)
            registry.update(surrogate_fingerprints(masker))
            result.n_episodes += 1
            result.n_steps += traj.n_steps
            result.n_success += bool(traj.success)
            result.mask_counts.update(masker.counts)
            result.image_regions.update(regions)
            result.image_mask_s += shots_s
        result.wall_s = time.perf_counter() - t0
        writer.manifest["summary"] = result.summary(timings=not writer.reproducible)
    (out / SURROGATE_REGISTRY).write_text("".join(f"{h}\n" for h in sorted(registry)))
    return result


def _import_episode(ep: dict[str, Any], src: Path, out: Path, opts: MaskingOptions, source: str
                    ) -> tuple[Trajectory, P.TextMasker, float, Counter]:
    eid = str(ep["episode_id"])
    task_id = f"{source}/{ep.get('split', 'train')}/{eid}"
    masker = P.TextMasker(opts.mode, seed=f"{opts.seed}|{task_id}")
    steps_in = ep["steps"]
    if not isinstance(steps_in, list) or not steps_in:
        raise ValueError(f"episode {eid!r}: 'steps' must be a non-empty list")
    traj = Trajectory(task_id=task_id, suite=source, split=str(ep.get("split", "train")), template=str(ep.get("app", "")),
                      instruction=str(ep["instruction"]), apps=[str(ep["app"])] if ep.get("app") else [],
                      policy=str(ep.get("annotator", "human")), source=source,
                      meta={"origin_episode_id": eid})
    regions: Counter = Counter()
    shots_s = 0.0
    for i, st in enumerate(steps_in):
        action = _parse_human_action(st["action"])
        w, h = int(st.get("width", 1080)), int(st.get("height", 2400))
        xml_c = st.get("xml_compressed")
        if not xml_c and st.get("xml"):
            xml_c = compress_xml(st["xml"], width=w, height=h)
        xml_c = xml_c or ""
        think = st.get("think")
        resp = format_action(action) if not think else f"<think>{think}</think><answer>{format_action(action)}</answer>"
        rec = StepRecord(index=i, response=resp, action=action.to_dict(), xml_compressed=xml_c,
                         app=str(st.get("app", ep.get("app", ""))), step_instruction=st.get("step_instruction"))
        if st.get("screenshot"):
            t0 = time.perf_counter()
            with Image.open(src / st["screenshot"]) as im:
                im.load()
                res = opts.mask(im.convert("RGB"), P.sensitive_boxes(xml_c, masker), (w, h), masker)
            rel = image_path(f"{task_id}#0", i)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            res.image.save(out / rel, format="PNG", compress_level=opts.png_compress)
            rec.screenshot_path = rel
            regions.update(res.counts)
            shots_s += time.perf_counter() - t0
        traj.steps.append(rec)
    last = traj.steps[-1].action or {}
    traj.finished = last.get("name") == "Finish"
    traj.answer = last.get("message")
    ok = ep.get("success")
    traj.reward = None if ok is None else float(bool(ok))
    traj.success = bool(ok) and traj.finished
    traj.has_verifier = ok is not None
    return mask_trajectory(traj, masker), masker, shots_s, regions
