"""Privacy masking: detection quality on the labelled corpus, UI text left alone, both replacement modes,
known values, throughput, and the image side (QR codes, faces on real photos, OCR'd text, UI-dump boxes)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mobilerl.data import privacy as P
from mobilerl.data import privacy_corpus as C
from mobilerl.data import privacy_image as PI
from mobilerl.data.checksums import cn_id_ok


@pytest.fixture(scope="module")
def corpus():
    return C.build_corpus(seed=11, n_per_category=200, n_negatives=1500, sim=True)


def test_corpus_recall_and_false_positives(corpus):
    r = C.evaluate(corpus)
    assert set(r["recall"]) == set(P.CATEGORIES)
    for cat in P.CATEGORIES:
        assert r["n_positives"][cat] == 200
        assert r["recall"][cat] >= 0.99, (cat, r["misses"][cat][:5])
        assert r["recall_exact_category"][cat] >= 0.97, (cat, r["misses"][cat][:5])
    assert r["n_negatives"] > 1500  # templated UI strings + simulator screen lines
    assert r["false_positive_rate"] <= 0.01, r["false_positives"][:10]


@pytest.mark.parametrize("text", [
    "TextView;;Audio Recorder;[221,1095][858,1222]",
    'do(action="Tap", element=[221,1095,858,1222])',
    "16:40", "9:05 PM", "2023-10-15 14:30:00", "15/10/2023", "Oct 15, 2023",
    "$1,234.56", "€ 12,50", "¥1299.00", "Total: $12,345,678.00", "45%", "Battery 87 percent.",
    "Version 13.4.2 (build 230805)", "v2.31.7", "Build number TQ3A.230805.001", "192.168.100.200",
    "1,234 items", "12.5k followers", "Page 3 of 120", "Your verification code is 482913.",
    "My flight UA 1234 lands at 7:45 pm", "card ending in 4242", "ISBN 978-3-16-148410-0",
    "IMEI 358240051111110", "1080x2400", "37.774929, -122.419416", "icon@2x.png", "Order by date",
    "In order to continue, tap Next", "Wifi signal full.", "Track 3 of 12", "Meeting @ 5pm",
    "Sort code settings", "Recording_20231015_143000.m4a", "IMG_20231015_123456.jpg",
])
def test_ui_text_is_left_alone(text):
    assert P.detect(text) == [], [(text[s.start:s.end], s.category, s.rule) for s in P.detect(text)]
    assert P.mask_text(text).text == text


def test_token_mode_spans_and_text():
    text = "Call Emma at +1 415 555 0134 or mail emma.smith@gmail.com; order #123-4567890-1234567 shipped."
    r = P.mask_text(text)
    assert r.text == "Call Emma at [PHONE] or mail [EMAIL]; order #[ORDER_NUMBER] shipped."
    got = [(text[s.start:s.end], s.category) for s in r.spans]
    assert got == [("+1 415 555 0134", P.PHONE), ("emma.smith@gmail.com", P.EMAIL),
                   ("123-4567890-1234567", P.ORDER_NUMBER)]


def test_chinese_and_context_on_previous_xml_line():
    zh = "手机号：13812345678，身份证号：11010519491231002X，快递单号 SF1234567890123"
    cats = [s.category for s in P.detect(zh)]
    assert cats == [P.PHONE, P.NATIONAL_ID, P.TRACKING_NUMBER]
    xml = "TextView;;Passport No.;[84,1100][996,1180]\nTextView;;E12345678;[84,1180][996,1260]"
    spans = P.detect(xml)
    assert [(xml[s.start:s.end], s.category) for s in spans] == [("E12345678", P.PASSPORT)]
    assert P.sensitive_boxes(xml) == [((84, 1180, 996, 1260), P.PASSPORT)]


def test_validators_reject_bad_checksums():
    assert P.detect("4111 1111 1111 1112") == []  # Luhn fails
    assert P.detect("GB82 WEST 1234 5698 7654 33") == []  # mod-97 fails
    assert P.detect("11010519491231002Y") == []
    assert [s.category for s in P.detect("4111 1111 1111 1111")] == [P.BANK_ACCOUNT]
    assert [s.category for s in P.detect("GB82 WEST 1234 5698 7654 32")] == [P.BANK_ACCOUNT]


def test_surrogates_are_consistent_within_an_episode_and_invertible():
    m = P.TextMasker("surrogate", seed="episode-1")
    instr = m("Update the phone number of Liam to +1 (415) 555-0134 and mail liam.chen@gmail.com.")
    xml = m("TextView;;+1 415-555-0134;[48,277][842,362]\nTextView;;Liam.Chen@gmail.com;[48,477][1032,562]")
    action = m("+14155550134")
    fake_phone = action
    assert fake_phone != "+14155550134" and fake_phone.startswith("+1")
    digits = "".join(c for c in fake_phone if c.isdigit())
    for text in (instr, xml):
        assert "415-555-0134" not in text and "liam.chen@gmail.com" not in text.lower()
        assert digits in "".join(c for c in text if c.isdigit())  # the same fake number everywhere
    fake_email = [t for t in instr.split() if "@" in t][0].rstrip(".")
    assert fake_email.endswith(("@example.com", "@example.org", "@example.net"))
    assert fake_email in xml
    assert m.unmask(action) == "+14155550134"
    assert "liam.chen@gmail.com" in m.unmask(instr)
    # another episode gets other fakes; the fake never equals an avoided raw value
    m2 = P.TextMasker("surrogate", seed="episode-2", avoid=["+1 415 555 0199"])
    assert m2("+1 415 555 0134") != action


def test_surrogates_keep_shape():
    m = P.TextMasker("surrogate", seed=3)
    card = m("Card number: 4242 4242 4242 4242")
    assert card.startswith("Card number: 4") and len(card) == len("Card number: 4242 4242 4242 4242")
    assert card != "Card number: 4242 4242 4242 4242"
    cid = m("身份证号：11010519491231002X")
    assert cn_id_ok(cid.split("：")[1])  # a valid-looking ID, not the raw one
    plate = m("车牌号：京A·12345")
    assert plate.startswith("车牌号：") and plate != "车牌号：京A·12345"


def test_known_values_and_name_parts():
    known = {"Ines Tanaka": P.PERSON_NAME, "265 Via Roma, Toronto ON M5V 2T6": P.ADDRESS}
    tok = P.TextMasker("token", known=known)
    assert tok("Create a new contact for Ines Tanaka at 265 Via Roma, Toronto ON M5V 2T6.") == \
        "Create a new contact for [PERSON_NAME] at [ADDRESS]."
    sur = P.TextMasker("surrogate", known=known, name_parts=["Ines Tanaka"], seed=1)
    full = sur("Create a new contact for Ines Tanaka.")
    first, last = sur("Ines"), sur("Tanaka")
    assert full == f"Create a new contact for {first} {last}."
    assert "Ines" not in full and first != "Ines"


# ------------------------------------------------------------------------------------------ images


def _screen() -> Image.Image:
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.tasks.registry import get_task

    env = SimEnv(render=True, perturb="none")
    return env.reset(get_task("world/train/ContactsDeleteContact/0", with_optimal=False)).screenshot


def _qr(payload: str, px: int) -> Image.Image:
    import cv2

    q = cv2.QRCodeEncoder.create().encode(payload)
    return Image.fromarray(cv2.resize(q, (q.shape[1] * px, q.shape[0] * px), interpolation=cv2.INTER_NEAREST)).convert("RGB")


def test_qr_codes_are_all_found_and_destroyed():
    import cv2

    base = _screen().reduce(2)
    rng = random.Random(0)
    payloads = ["https://wa.me/14155550134", "WIFI:T:WPA;S:Home;P:hunter22;;", "https://u.wechat.com/EF3kPz9",
                "BEGIN:VCARD\nFN:Emma Smith\nTEL:+14155550134\nEND:VCARD", "otpauth://totp/a:b?secret=JBSWY3DP"]
    for i, payload in enumerate(payloads):
        img = base.copy()
        px = [3, 4, 5, 6, 8][i]
        q = _qr(payload, px)
        x, y = rng.randrange(0, img.width - q.width), rng.randrange(100, img.height - q.height)
        img.paste(q, (x, y))
        boxes = PI.detect_qr(img)
        m = 4 * px + 3  # the encoder's quiet zone is not part of the code
        assert any(b[0] <= x + m and b[1] <= y + m and b[2] >= x + q.width - m and b[3] >= y + q.height - m
                   for b in boxes), (payload, boxes, (x, y, q.size))
        masked = PI.mask_image(img, faces=False).image
        ok, decoded, _, _ = cv2.QRCodeDetector().detectAndDecodeMulti(np.asarray(masked.convert("L")))
        assert not (ok and any(decoded))


def test_faces_on_real_photos():
    import skimage.data as sd

    astronaut = Image.fromarray(sd.astronaut())
    (box,) = PI.detect_faces(astronaut)
    assert box[0] < 200 < box[2] and box[1] < 110 < box[3]  # Eileen Collins' face
    lfw = sd.lfw_subset()  # 100 face crops, then 100 non-face crops
    base = _screen().reduce(2)
    found = flagged = 0
    for i in list(range(0, 100, 5)) + list(range(100, 200, 5)):
        img = base.copy()
        img.paste(Image.fromarray((lfw[i] * 255).astype(np.uint8)).convert("RGB").resize((60, 60), Image.BICUBIC),
                  (200, 300 + (i % 7) * 80))
        hit = bool(PI.detect_faces(img))
        found += hit and i < 100
        flagged += hit and i >= 100
    assert found >= 19 and flagged <= 1, (found, flagged)
    assert PI.detect_faces(base) == []  # a plain screenshot has no face


def test_face_and_qr_detection_agree_across_threads():
    """The collector masks in a thread pool: each thread has its own OpenCV detectors (one shared cascade
    gave spurious faces under concurrency), and concurrent detection equals serial detection."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import skimage.data as sd

    lfw = sd.lfw_subset()
    base = _screen().reduce(2)
    images = []
    for i in range(0, 200, 10):
        img = base.copy()
        img.paste(Image.fromarray((lfw[i] * 255).astype(np.uint8)).convert("RGB").resize((60, 60), Image.BICUBIC),
                  (200, 300 + (i % 7) * 80))
        images.append(img)
    serial = [(PI.detect_faces(im), PI.detect_qr(im)) for im in images]
    assert any(f for f, _ in serial)
    with ThreadPoolExecutor(4) as ex:
        for _ in range(3):
            assert list(ex.map(lambda im: (PI.detect_faces(im), PI.detect_qr(im)), images)) == serial
    mine = PI._cascade("frontalface_default")
    other: list = []
    t = threading.Thread(target=lambda: other.append(PI._cascade("frontalface_default")))
    t.start()
    t.join()
    assert other[0] is not mine and PI._cascade("frontalface_default") is mine


def test_ocr_masks_painted_text():
    img = Image.new("RGB", (900, 300), "white")
    d = ImageDraw.Draw(img)
    from PIL import ImageFont

    font = ImageFont.load_default(size=36)
    d.text((20, 40), "Call me at +1 415 555 0134", font=font, fill="black")
    d.text((20, 160), "Meeting room 12", font=font, fill="black")
    res = PI.mask_image(img, faces=False, qr=False, ocr=True)
    assert [r.category for r in res.regions] == [P.PHONE]
    text = "\n".join(t for t, _ in PI.ocr_lines(PI.ocr_words(res.image)))
    assert "Meeting" in text and "555" not in text


def test_ui_dump_boxes_are_filled():
    img = Image.new("RGB", (540, 1200), "white")
    xml = "TextView;;Phone;[48,200][842,270]\nTextView;;+44 7911 123456;[48,277][842,362]"
    boxes = P.sensitive_boxes(xml)
    assert boxes == [((48, 277, 842, 362), P.PHONE)]
    out = PI.mask_image(img, boxes=boxes, box_space=(1080, 2400), faces=False, qr=False).image
    assert out.getpixel((200, 160)) == PI.FILL_COLOR  # scaled into the half-size image
    assert out.getpixel((200, 110)) == (255, 255, 255)


def test_values_seen_with_context_are_masked_everywhere_in_the_episode():
    import json

    from mobilerl.data.masking import mask_trajectory
    from mobilerl.env.actions import Action
    from mobilerl.trajectory import StepRecord, Trajectory

    finish = Action("Finish", message="329717650732")
    traj = Trajectory(task_id="x", instruction="What is the tracking number of my parcel?", answer="329717650732",
                      steps=[StepRecord(0, 'finish(message="329717650732")', action=finish.to_dict(),
                                        xml_compressed="TextView;;Tracking number is 329717650732 (FedEx);[0,0][9,9]")])
    assert P.detect("329717650732") == []  # bare, it is just a number
    out = mask_trajectory(traj, P.TextMasker("token"))
    assert "329717650732" not in json.dumps(out.to_dict())
    assert out.answer == "[TRACKING_NUMBER]" and out.steps[0].response == 'finish(message="[TRACKING_NUMBER]")'
