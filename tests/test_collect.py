"""Collection with masking before storage: valid stored trajectories, replay, the audit (clean data passes,
a planted leak fails), simulator canaries, human-annotation import."""

from __future__ import annotations

import json
import shutil

import pytest
from PIL import Image, ImageDraw, ImageFont

from mobilerl.agent import OraclePolicy
from mobilerl.data import privacy as P
from mobilerl.data.audit import audit
from mobilerl.data.collect import collect_sync, replay_check
from mobilerl.data.human import import_human
from mobilerl.data.masking import MaskingOptions, find_canaries
from mobilerl.data.store import iter_store, read_store, write_store
from mobilerl.env.actions import Action, parse_action
from mobilerl.env.sim.tasks.registry import get_task

TASKS = ["world/train/ContactsEditNumber/0", "world/train/ContactsAddContact/1", "world/train/ContactsEmailLookup/0",
         "world/train/SmsSendMessage/0", "world/train/SmsTrackingNumberQuery/0"]


def _tasks(ids):
    out = []
    for tid in ids:
        try:
            out.append(get_task(tid, with_optimal=False))
        except KeyError:
            continue
    return out


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = tmp_path_factory.mktemp("collect") / "collected"
    policy = OraclePolicy()
    tasks = _tasks(TASKS)
    res = collect_sync(lambda seed: policy, tasks, root, masking=MaskingOptions(mode="surrogate", image_max_side=1200),
                       concurrency=3, progress=False)
    return root, res, tasks


def test_collected_trajectories_are_valid(collected):
    root, res, tasks = collected
    trajs = read_store(root)
    assert len(trajs) == len(tasks) == res.n_episodes
    assert res.leaks_blocked == 0 and res.n_errors == 0
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["episodes"] == len(tasks) and manifest["masking"]["mode"] == "surrogate"
    for t in trajs:
        assert t.success and t.finished and t.reward == 1.0 and t.source == "collected"
        assert t.n_steps == len(t.steps) > 1 and t.template and t.task_seed is not None
        assert t.meta["mask_mode"] == "surrogate"
        for s in t.steps:
            assert s.action is not None and parse_action(s.response) == Action.from_dict(s.action)
            assert s.xml_compressed and s.policy_latency_s >= 0 and s.latency_s >= 0
            with Image.open(root / s.screenshot_path) as im:
                assert im.size == (540, 1200)
    assert res.summary()["masked_text_spans"][P.PHONE] > 0
    assert res.summary()["masked_image_regions"]["text"] > 0


def test_a_collection_is_byte_reproducible(collected, tmp_path):
    """Collecting the same tasks again (concurrently, so in another finishing order) writes the same bytes:
    the wall-clock fields are not stored and the table is stored in task order. A DVC stage re-run on the
    same code then leaves its output, and the stages after it, as they were."""
    import hashlib

    root, res, tasks = collected
    again = tmp_path / "again"
    policy = OraclePolicy()
    collect_sync(lambda seed: policy, list(reversed(tasks)), again,
                 masking=MaskingOptions(mode="surrogate", image_max_side=1200), concurrency=2, progress=False)

    def digests(d):
        return {str(p.relative_to(d)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
                if p.is_file()}

    assert digests(root) == digests(again)
    trajs = list(iter_store(root, order="file"))
    assert [t.episode_id for t in trajs] == [t.episode_id for t in read_store(root)]  # stored in task order
    assert all(t.wall_time_s == 0 and all(s.latency_s == s.policy_latency_s == 0 for s in t.steps) for t in trajs)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["reproducible"] is True and "wall_s" not in manifest["summary"]
    assert res.summary()["wall_s"] > 0  # the stage's metrics keep the timings


def test_a_store_can_keep_timings_and_finishing_order(tmp_path):
    trajs = read_store(_small_store(tmp_path / "src"))
    for i, t in enumerate(trajs):
        t.wall_time_s = 1.5 + i
        t.steps[0].latency_s = 0.25
    trajs = list(reversed(trajs))
    write_store(tmp_path / "timed", trajs, reproducible=False)
    back = list(iter_store(tmp_path / "timed", order="file"))
    assert [t.episode_id for t in back] == [t.episode_id for t in trajs]
    assert [t.wall_time_s for t in back] == [t.wall_time_s for t in trajs] and back[0].steps[0].latency_s == 0.25
    assert json.loads((tmp_path / "timed" / "manifest.json").read_text())["reproducible"] is False


def _small_store(root):
    policy = OraclePolicy()
    collect_sync(lambda seed: policy, _tasks(TASKS[:2]), root, masking=MaskingOptions(mode="surrogate"),
                 concurrency=2, progress=False)
    return root


def test_replay_reproduces_the_verifier_result(collected):
    root, res, tasks = collected
    rep = replay_check(root, res.secrets)
    assert rep == {"replayed": len(tasks), "same_result": len(tasks), "differ": [], "skipped": 0}


def test_surrogates_stay_consistent_in_an_episode(collected):
    root, res, _ = collected
    t = next(t for t in read_store(root) if t.template == "ContactsEditNumber")
    typed = next(s.action["text"] for s in t.steps if s.action["name"] == "Type" and "+" in s.action["text"])
    digits = "".join(c for c in typed if c.isdigit())
    assert digits in "".join(c for c in t.instruction if c.isdigit())
    raw = res.secrets[t.episode_id].task.instruction
    assert raw != t.instruction
    name = raw.split(" of ", 1)[1].split(" to ", 1)[0]
    assert name not in t.instruction  # the contact's name is a surrogate too
    assert t.instruction.split(" of ", 1)[1].split(" to ", 1)[0] in "\n".join(s.xml_compressed for s in t.steps)


def test_names_typed_part_by_part_match_the_instruction(collected):
    root, res, _ = collected
    t = next(t for t in read_store(root) if t.template == "ContactsAddContact")
    raw = res.secrets[t.episode_id].task.params
    typed = [s.action["text"] for s in t.steps if s.action["name"] == "Type"]
    assert raw["first"] not in typed and raw["last"] not in typed
    assert f"for {typed[0]} {typed[1]}." in t.instruction  # the fake first and last name, as in the task


def test_no_planted_value_is_stored_and_the_audit_passes(collected):
    root, res, _ = collected
    for t in read_store(root):
        canaries = res.secrets[t.episode_id].canaries
        assert canaries
        blob = json.dumps(t.to_dict(), ensure_ascii=False)
        assert find_canaries(blob, canaries) == []
    report = audit([root], ocr=True, ocr_max_images=6)
    assert report.passed, [f for f in report.findings][:5]
    st = report.stores[root.name]
    assert st["canaries"] > 0 and st["images_ocr"] == 6 and st["surrogates_seen"] > 0


def test_audit_fails_on_a_planted_leak(collected, tmp_path):
    root, res, _ = collected
    leak = tmp_path / "leaky"
    shutil.copytree(root, leak)
    trajs = read_store(root)
    t = next(t for t in trajs if t.template == "ContactsEditNumber")
    raw = res.secrets[t.episode_id].task
    phone = raw.params["phone"]
    t.steps[1].xml_compressed += f"\nTextView;;{phone};[48,900][842,960]"
    write_store(leak, trajs)
    report = audit([leak], ocr=False)
    assert not report.passed
    checks = {(f.check, f.category) for f in report.findings}
    assert ("canary", P.PHONE) in checks and ("detector", P.PHONE) in checks
    assert all(phone not in json.dumps(f.__dict__) for f in report.findings)  # the report holds no raw value
    # a leak painted into a stored screenshot is found by OCR
    one = read_store(root)[0]
    one.steps = one.steps[:1]
    write_store(leak, [one])
    img_path = leak / one.steps[0].screenshot_path
    with Image.open(img_path) as im:
        im = im.convert("RGB")
    draw = ImageDraw.Draw(im)
    draw.rectangle((20, 580, 520, 660), fill="white")
    draw.text((30, 600), f"Call {phone}", font=ImageFont.load_default(size=30), fill="black")
    im.save(img_path)
    report = audit([leak], ocr=True, ocr_max_images=None, canaries_for=lambda tr: {phone: P.PHONE})
    assert {(f.where, f.check) for f in report.findings} == {(f"image:{one.steps[0].screenshot_path}", "detector"),
                                                            (f"image:{one.steps[0].screenshot_path}", "canary")}


def test_token_mode_and_replay(tmp_path):
    policy = OraclePolicy()
    tasks = _tasks(TASKS[:2])
    res = collect_sync(lambda seed: policy, tasks, tmp_path / "tok",
                       masking=MaskingOptions(mode="token", faces=False, qr=False, image_max_side=600),
                       concurrency=2, progress=False)
    trajs = read_store(tmp_path / "tok")
    assert "[PHONE]" in trajs[0].instruction or "[PHONE]" in trajs[1].instruction
    assert all("[PERSON_NAME]" in t.instruction for t in trajs)
    assert replay_check(tmp_path / "tok", res.secrets)["same_result"] == len(tasks)


def test_simulator_reports_its_canaries():
    from mobilerl.env.sim.env import SimEnv

    env = SimEnv(perturb="none")
    task = get_task("world/train/ContactsAddContact/0", with_optimal=False)
    env.reset(task)
    cats = env.canary_categories()
    contacts = env.device.app("Contacts").contacts
    assert {c.phone for c in contacts} <= set(cats) and {c.name for c in contacts} <= set(cats)
    assert cats[task.params["phone"]] == P.PHONE and cats[task.params["name"]] == P.PERSON_NAME
    before = len(env.canaries())
    sms = env.device.app("SMS Messenger")
    assert sms._threads is None  # drawn lazily: not forced by asking for canaries
    after = env.canary_categories(materialize=True)
    assert len(after) > before and {P.TRACKING_NUMBER, P.ADDRESS} & set(after.values())


def test_import_human_annotations(tmp_path):
    """A human export with raw PII (screens, XML, typed text) comes out masked; boxes are kept."""
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.screen import Screen
    from mobilerl.env.sim.tasks.base import OracleAgent

    src = tmp_path / "export"
    (src / "images").mkdir(parents=True)
    task = get_task("world/train/ContactsEditNumber/0", with_optimal=False)
    env = SimEnv(render=True, perturb="none")
    obs = env.reset(task)
    agent = OracleAgent(env.tmpl, task.params)
    steps = []
    for i in range(task.max_steps):
        a = agent.act(Screen(obs.xml, obs.app))
        obs.screenshot.reduce(2).save(src / "images" / f"{i}.png")
        steps.append({"screenshot": f"images/{i}.png", "xml": obs.xml, "action": str(a), "app": obs.app,
                      "width": 1080, "height": 2400})
        if a.name == "Finish":
            break
        obs = env.step(a).observation
    (src / "episodes.jsonl").write_text(json.dumps({"episode_id": "h1", "instruction": task.instruction,
                                                    "app": "Contacts", "success": True, "steps": steps}) + "\n")
    res = import_human(src, tmp_path / "human", masking=MaskingOptions(mode="token", image_max_side=1200),
                       progress=False)
    (t,) = read_store(tmp_path / "human")
    assert res.n_episodes == 1 and t.source == "human" and t.success and t.n_steps == len(steps)
    assert task.params["phone"] not in json.dumps(t.to_dict()) and "[PHONE]" in t.instruction
    assert [s.action["element"] for s in t.steps] == [parse_action(s["action"]).to_dict()["element"] for s in steps]
    assert audit([tmp_path / "human"], ocr=False).passed


def test_collection_renders_as_the_observation_mode_says(tmp_path):
    # The default (screenshot+xml) stores screenshots (test_collected_trajectories_are_valid); an XML mode none.
    policy = OraclePolicy()
    res = collect_sync(lambda seed: policy, _tasks(TASKS[:1]), tmp_path / "xml", obs_mode="xml", concurrency=1,
                       progress=False, keep_secrets=False)
    assert res.n_episodes == 1 and res.n_errors == 0
    [traj] = read_store(tmp_path / "xml")
    assert traj.success and all(s.screenshot_path is None for s in traj.steps)
