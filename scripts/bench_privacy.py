"""Benchmark of the privacy masking: text recall / false positives / throughput, image masking timings,
QR codes and faces.

    python scripts/bench_privacy.py [--quick] [--json out.json]

Text: the labelled corpus of :mod:`mobilerl.data.privacy_corpus` (realistic values across locales in
realistic contexts; hard negatives from simulator screens, a real device dump and templated UI strings):
per-category recall (gold span fully masked; and with the right category), false-positive rate over the
negatives, and masking throughput on (a) collected-like text — instructions, compressed XML and action
strings of oracle episodes — and (b) the corpus itself (a personal value every ~40 bytes: worst case).

Images (simulator screenshots, 1080×2400 and the stored 540×1200): time per screenshot of the default
masking (UI-dump boxes + fast face cascade + QR), with the thorough face cascades, and with OCR.
QR: codes of varied payloads and sizes pasted at random places (detected = a returned box covers the
code; masked = the masked image no longer decodes). Faces: scikit-image's sample photos (astronaut,
camera) and its LFW subset (100 face crops and 100 non-face crops pasted into screenshots at 120 px),
plus false detections on plain simulator screenshots.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mobilerl.data import privacy as P  # noqa: E402
from mobilerl.data import privacy_corpus as C  # noqa: E402
from mobilerl.data import privacy_image as PI  # noqa: E402
from mobilerl.data.masking import MaskingOptions  # noqa: E402
from mobilerl.data.privacy_phone import phone_value_ok  # noqa: E402


def _sim_episodes(n_tasks: int, render: bool):
    """(texts, screenshots) of oracle episodes on world train tasks."""
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.screen import Screen
    from mobilerl.env.sim.tasks.base import OracleAgent
    from mobilerl.env.sim.tasks.registry import list_tasks
    from mobilerl.env.xml import compress_xml

    tasks = list_tasks("world", "train", n=1, with_optimal=False)
    rng = random.Random(0)
    rng.shuffle(tasks)
    texts, shots = [], []
    for task in tasks[:n_tasks]:
        env = SimEnv(render=render, perturb="none")
        obs = env.reset(task)
        agent = OracleAgent(env.tmpl, task.params)  # type: ignore[arg-type]
        texts.append(task.instruction)
        for _ in range(task.max_steps):
            texts.append(compress_xml(obs.xml, width=obs.width, height=obs.height))
            if render and len(shots) < 400:
                shots.append((obs.screenshot, compress_xml(obs.xml, width=obs.width, height=obs.height)))
            a = agent.act(Screen(obs.xml, obs.app, obs.width, obs.height))
            texts.append(str(a))
            res = env.step(a)
            obs = res.observation
            if res.done:
                break
    return texts, shots


def _throughput(texts: list[str], min_s: float = 2.0) -> float:
    total = sum(len(t.encode()) for t in texts)
    phone_value_ok.cache_clear()
    t0 = time.perf_counter()
    n = 0
    while True:
        m = P.TextMasker("token")
        for t in texts:
            m.mask(t)
        n += 1
        if time.perf_counter() - t0 >= min_s:
            break
    return total * n / (time.perf_counter() - t0) / 1e6


def bench_text(quick: bool) -> dict:
    corpus = C.build_corpus(0, n_per_category=150 if quick else 300, n_negatives=1000 if quick else 2000)
    r = C.evaluate(corpus)
    sim_texts, _ = _sim_episodes(15 if quick else 40, render=False)
    out = {
        "recall": r["recall"], "recall_exact_category": r["recall_exact_category"],
        "n_positives": r["n_positives"], "n_negatives": r["n_negatives"],
        "false_positive_rate": r["false_positive_rate"],
        "false_positives": [t for t, _ in r["false_positives"][:10]],
        "misses": {c: [m[2] for m in v[:5]] for c, v in r["misses"].items() if v},
        "mb_per_s_collected_text": _throughput(sim_texts),
        "collected_text_mb": sum(len(t.encode()) for t in sim_texts) / 1e6,
        "mb_per_s_pii_dense_corpus": _throughput([s.text for s in corpus]),
    }
    return out


def _qr_image(payload: str, module_px: int) -> Image.Image:
    import cv2

    q = cv2.QRCodeEncoder.create().encode(payload)
    q = cv2.resize(q, (q.shape[1] * module_px, q.shape[0] * module_px), interpolation=cv2.INTER_NEAREST)
    return Image.fromarray(q).convert("RGB")


def _decodes(img: Image.Image) -> bool:
    import cv2

    det = cv2.QRCodeDetector()
    ok, decoded, _, _ = det.detectAndDecodeMulti(np.asarray(img.convert("L")))
    return bool(ok) and any(decoded)


def bench_images(quick: bool) -> dict:
    _, shots = _sim_episodes(4 if quick else 10, render=True)
    rng = random.Random(1)
    out: dict = {}
    # --- timings
    sample = shots[: (6 if quick else 20)]
    for label, scale in (("1080x2400", 1), ("540x1200", 2)):
        for name, kw in (("default", {}),
                         ("thorough_faces", {"face_cascades": PI.THOROUGH_CASCADES, "face_max_side": 1280,
                                             "qr_both": True}),
                         ("with_ocr", {"ocr": True})):
            if name == "with_ocr" and quick:
                sample_ = sample[:3]
            else:
                sample_ = sample
            times = []
            for img, xml_c in sample_:
                im = img.reduce(scale) if scale > 1 else img
                t0 = time.perf_counter()
                PI.mask_image(im, boxes=P.sensitive_boxes(xml_c), box_space=(1080, 2400), **kw)
                times.append(time.perf_counter() - t0)
            out[f"mask_s/{label}/{name}"] = float(np.mean(times))
    # --- QR codes
    payloads = ["https://wa.me/14155550134", "WIFI:T:WPA;S:HomeNet;P:s3cr3t-pass;;", "https://u.wechat.com/EF3kPz9",
                "BEGIN:VCARD\nFN:Emma Smith\nTEL:+14155550134\nEND:VCARD", "alipays://platformapi/startapp?c=8kl2",
                "https://pay.example.com/i/2023-10-15/0042", "otpauth://totp/acme:emma?secret=JBSWY3DPEHPK3PXP"]
    n_qr = 20 if quick else 60
    found = masked = 0
    for i in range(n_qr):
        img, _ = shots[i % len(shots)]
        img = img.copy()
        px = rng.choice([4, 6, 8, 10])
        q = _qr_image(payloads[i % len(payloads)], px)
        x, y = rng.randrange(0, 1080 - q.width), rng.randrange(200, 2400 - q.height)
        img.paste(q, (x, y))
        boxes = PI.detect_qr(img)  # on the capture, as the collector does, before downscaling for storage
        m = 4 * px + 3  # the encoder's quiet zone (4 modules) is not part of the code
        qbox = (x, y, x + q.width, y + q.height)
        hit = any(b[0] <= qbox[0] + m and b[1] <= qbox[1] + m and b[2] >= qbox[2] - m and b[3] >= qbox[3] - m
                  for b in boxes)
        found += hit
        res = MaskingOptions(faces=False, image_max_side=1200).mask(img, [], (1080, 2400))
        masked += not _decodes(res.image) and not _decodes(res.image.resize((1080, 2400)))
    out["qr"] = {"n": n_qr, "detected": found / n_qr, "undecodable_after_masking": masked / n_qr}
    # --- faces
    import skimage.data as sd

    photos = {"astronaut": sd.astronaut(), "camera": sd.camera()}
    out["faces_photos"] = {}
    for name, arr in photos.items():
        im = Image.fromarray(arr).convert("RGB")
        out["faces_photos"][name] = {"default": len(PI.detect_faces(im)),
                                     "thorough": len(PI.detect_faces(im, max_side=1280, cascades=PI.THOROUGH_CASCADES))}
    lfw = sd.lfw_subset()
    res_f = {"default": [0, 0], "thorough": [0, 0]}  # [faces found, non-faces flagged]
    for i in range(200):
        crop = Image.fromarray((lfw[i] * 255).astype(np.uint8)).convert("RGB").resize((120, 120), Image.BICUBIC)
        img, _ = shots[i % len(shots)]
        img = img.copy()
        img.paste(crop, (rng.randrange(40, 900), rng.randrange(300, 2200)))
        stored = img.reduce(2)
        for mode, kw in (("default", {}), ("thorough", {"max_side": 1280, "cascades": PI.THOROUGH_CASCADES})):
            hit = bool(PI.detect_faces(stored, **kw))
            res_f[mode][0 if i < 100 else 1] += hit
    out["faces_lfw_120px"] = {m: {"faces_detected": v[0] / 100, "non_faces_flagged": v[1] / 100} for m, v in res_f.items()}
    plain = [bool(PI.detect_faces(img.reduce(2))) for img, _ in shots]
    out["faces_false_on_plain_screenshots"] = sum(plain) / max(1, len(plain))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller samples")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    text = bench_text(args.quick)
    print("== text masking ==")
    print(f"{'category':18s} {'n':>5s} {'recall':>8s} {'exact-cat':>9s}")
    for c in P.CATEGORIES:
        print(f"{c:18s} {text['n_positives'].get(c, 0):5d} {text['recall'].get(c, 0):8.4f} "
              f"{text['recall_exact_category'].get(c, 0):9.4f}")
    print(f"false positives: {text['false_positive_rate']:.4%} of {text['n_negatives']} hard negatives")
    for fp in text["false_positives"]:
        print(f"  FP: {fp[:100]!r}")
    for c, ms in text["misses"].items():
        for m in ms:
            print(f"  miss {c}: {m[:100]!r}")
    print(f"throughput: {text['mb_per_s_collected_text']:.2f} MB/s on collected-like text "
          f"({text['collected_text_mb']:.2f} MB), {text['mb_per_s_pii_dense_corpus']:.2f} MB/s on the PII-dense corpus")
    img = bench_images(args.quick)
    print("== image masking (seconds per screenshot) ==")
    for k, v in img.items():
        if k.startswith("mask_s/"):
            print(f"  {k[7:]:32s} {v:.3f}")
    q = img["qr"]
    print(f"QR codes: {q['detected']:.0%} detected, {q['undecodable_after_masking']:.0%} undecodable after masking (n={q['n']})")
    print(f"faces on photos (boxes): {img['faces_photos']}")
    print(f"faces, LFW crops at 120 px in screenshots: {img['faces_lfw_120px']}")
    print(f"face detections on plain simulator screenshots: {img['faces_false_on_plain_screenshots']:.1%}")
    print(f"({time.perf_counter() - t0:.0f}s)")
    if args.json:
        args.json.write_text(json.dumps({"text": text, "images": img}, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
