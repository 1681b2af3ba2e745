"""The prompt format and the SFT dataset builder (sharegpt multimodal for LLaMA-Factory): one sample per
step, dedupe, split by task, mixing weights, AndroidControl variants — and a 2-step LLaMA-Factory run on a
tiny Qwen2-VL built from config."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from mobilerl.agent import prompt as PR
from mobilerl.data.sft import SftSource, build_sft
from mobilerl.env.actions import Action, parse_action

# ------------------------------------------------------------------------------------------- prompt


def test_prompt_format_is_deterministic_and_complete():
    sys_r = PR.system_prompt("screenshot+xml", reasoning=True)
    for call in ('do(action="Tap", element=[x1,y1,x2,y2])', 'do(action="Long Press"', 'do(action="Type"',
                 'do(action="Swipe"', 'do(action="Launch"', 'do(action="Back")', 'do(action="Home")',
                 'do(action="Wait")', "finish(message="):
        assert call in sys_r
    assert "<think>" in sys_r and "<think>" not in PR.system_prompt("xml", reasoning=False)
    hist = ['<think>open it</think><answer>do(action="Launch", app="Contacts")</answer>',
            '<answer>do(action="Tap", element=[1,2,3,4])</answer>']
    u = PR.user_prompt("Call Bob", hist, "Button;clickable;OK;[1,2][3,4]", app="Contacts", mode="screenshot+xml")
    assert u.splitlines()[:4] == ["Task: Call Bob", "Previous actions:", f"Step 1: {hist[0]}", f"Step 2: {hist[1]}"]
    assert u.count(PR.IMAGE_TOKEN) == 1 and "Current app: Contacts" in u and u.endswith("Button;clickable;OK;[1,2][3,4]")
    assert PR.IMAGE_TOKEN not in PR.user_prompt("t", (), "x", mode="xml")
    assert "Screen elements" not in PR.user_prompt("t", (), "x", mode="screenshot")
    assert "Previous actions: none" in PR.user_prompt("t")
    last = PR.user_prompt("t", hist, max_history=1)  # the window is numbered from 1, under its own header
    assert "Previous actions (the last 1):\nStep 1: <answer>do(action=\"Tap\"" in last and "Launch" not in last
    # a window of the last N does not say how long the episode is: one action repeated on one screen
    # gives the same prompt at step 6 and step 7 (a greedy policy answers it from memory)
    stuck = [hist[0]] + [hist[1]] * 6
    assert PR.user_prompt("t", stuck[:5], "x", max_history=4) == PR.user_prompt("t", stuck[:6], "x", max_history=4)
    assert PR.user_prompt("t", stuck[:4], "x", max_history=4) != PR.user_prompt("t", stuck[:5], "x", max_history=4)
    with pytest.raises(ValueError, match="observation mode"):
        PR.user_prompt("t", mode="video")
    assert PR.build_messages("t") == PR.build_messages("t")  # pure


def test_responses_and_message_forms():
    a = Action("Tap", element=(1, 2, 3, 4))
    assert PR.render_response(a) == '<answer>do(action="Tap", element=[1,2,3,4])</answer>'
    r = PR.render_response(a, "the OK button")
    assert r == '<think>the OK button</think><answer>do(action="Tap", element=[1,2,3,4])</answer>'
    assert parse_action(r) == a and PR.split_response(r) == ("the OK button", 'do(action="Tap", element=[1,2,3,4])')
    msgs = PR.build_messages("t", mode="screenshot+xml")
    hf = PR.to_hf_messages(msgs)
    assert hf[0]["content"] == [{"type": "text", "text": msgs[0]["content"]}]
    assert {"type": "image"} in hf[1]["content"]
    rec = PR.sharegpt_record(msgs, r, ["images/a.png"])
    assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant"] and rec["images"] == ["images/a.png"]
    with pytest.raises(ValueError, match="placeholders"):
        PR.sharegpt_record(msgs, r, [])


def test_messages_for_a_rollout_context():
    from mobilerl.agent.policy import PolicyContext
    from mobilerl.env.base import Observation, TaskSpec

    ctx = PolicyContext(TaskSpec("x/train/T/0", "x", "train", "T", "Do it"), Observation("", "Clock"), "A;;b;[0,0][1,1]",
                        ("<answer>do(action=\"Back\")</answer>",), 1, "e")
    msgs = PR.messages_for_context(ctx, mode="xml")
    assert "Task: Do it" in msgs[1]["content"] and "Step 1: <answer>do(action=\"Back\")</answer>" in msgs[1]["content"]


# ------------------------------------------------------------------------------------------ dataset


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A small masked collection and a converted AndroidControl episode."""
    import sys

    from mobilerl.agent import OraclePolicy
    from mobilerl.data.androidcontrol import convert_to_store, episode_to_example, write_tfrecord
    from mobilerl.data.collect import MaskingOptions, collect_sync
    from mobilerl.env.sim.tasks.registry import get_task

    root = tmp_path_factory.mktemp("stores")
    tasks = [get_task(t, with_optimal=False) for t in
             ("world/train/ContactsEditNumber/0", "world/train/ClockTimerStart/0", "world/train/ContactsAddContact/1",
              "world/train/SmsSendMessage/0")]
    policy = OraclePolicy()
    opts = MaskingOptions(mode="surrogate", image_max_side=600, faces=False)
    collect_sync(lambda s: policy, tasks, root / "collected", masking=opts, concurrency=2, progress=False)
    sys.path.insert(0, str(Path(__file__).parent))
    from test_androidcontrol_convert import _episode

    write_tfrecord(root / "ac.tfrecord.gz", [episode_to_example(_episode())])
    convert_to_store([root / "ac.tfrecord.gz"], root / "androidcontrol", masking=opts, progress=False)
    return root


def test_sharegpt_dataset(stores, tmp_path):
    out = tmp_path / "sft"
    stats = build_sft([SftSource("collected", stores / "collected"),
                       SftSource("androidcontrol", stores / "androidcontrol", variant="both")],
                      out, val_fraction=0.3, seed=1)
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["mobilerl_sft_train"] == {"file_name": "train.json", "formatting": "sharegpt",
                                          "columns": {"messages": "messages", "images": "images"},
                                          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                                   "assistant_tag": "assistant", "system_tag": "system"}}
    train = json.loads((out / "train.json").read_text())
    val = json.loads((out / "val.json").read_text())
    assert len(train) == stats["train"] and len(val) == stats["val"] and train and val
    for rec in train + val:
        roles = [m["role"] for m in rec["messages"]]
        assert roles == ["system", "user", "assistant"]
        assert rec["messages"][1]["content"].count("<image>") == len(rec["images"]) == 1
        assert (out / rec["images"][0]).exists() and not Path(rec["images"][0]).is_absolute()
        parse_action(rec["messages"][2]["content"])
        assert rec["messages"][2]["content"].startswith("<answer>")
    c = stats["sources"]["collected"]
    steps = c["steps"]
    assert c["train_high"] + c["val_high"] + c.get("duplicates", 0) == steps
    ac = stats["sources"]["androidcontrol"]
    # one low-level sample per step: 8 recorded step instructions, and one derived for the step that has none
    assert ac["train_low"] + ac.get("val_low", 0) == ac["train_high"] + ac.get("val_high", 0) == 9
    low = [r for r in train + val if r["messages"][1]["content"].startswith("Task: instruction ")]
    assert all("Previous actions: none" in r["messages"][1]["content"] for r in low)
    # splits are by task: no task instruction on both sides
    def tasks(recs):
        return {r["messages"][1]["content"].splitlines()[0] for r in recs if "instruction " not in r["messages"][1]["content"]}
    assert not tasks(train) & tasks(val)


def test_the_dataset_does_not_depend_on_the_order_episodes_were_stored(stores, tmp_path):
    from mobilerl.data.store import StoreWriter, iter_store

    trajs = list(iter_store(stores / "collected", order="file"))
    assert len(trajs) >= 3
    src = stores / "collected"
    backwards = tmp_path / "backwards"
    shutil.copytree(src, backwards)  # the screenshots the records point at
    # a store in completion order (reproducible=False: concurrent episodes finish in any order)
    with StoreWriter(backwards, batch=2, reproducible=False) as w:
        for t in reversed(trajs):
            w.write(t)
    assert [t.task_id for t in iter_store(backwards, order="file")] == [t.task_id for t in reversed(trajs)]
    ids = [t.task_id for t in iter_store(backwards)]
    assert ids == sorted(ids) == [t.task_id for t in iter_store(src)]
    a = build_sft([SftSource("collected", src)], tmp_path / "a", val_fraction=0.3, seed=1)
    b = build_sft([SftSource("collected", backwards)], tmp_path / "b", val_fraction=0.3, seed=1)
    assert a == b
    for f in ("train.json", "val.json"):
        assert (tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()
    with pytest.raises(ValueError, match="order"):
        next(iter_store(src, order="random"))


def test_dedupe_and_mixing_weights(stores, tmp_path):
    one = build_sft([SftSource("collected", stores / "collected")], tmp_path / "a", val_fraction=0.0)
    twice = build_sft([SftSource("collected", stores / "collected"), SftSource("again", stores / "collected")],
                      tmp_path / "b", val_fraction=0.0)
    assert twice["train"] == one["train"]  # the second copy is all duplicates
    assert twice["sources"]["again"]["duplicates"] == one["sources"]["collected"]["steps"]
    double = build_sft([SftSource("collected", stores / "collected", weight=2.0)], tmp_path / "c", val_fraction=0.0)
    assert double["train"] == 2 * one["train"]
    none = build_sft([SftSource("collected", stores / "collected", weight=0.0),
                      SftSource("androidcontrol", stores / "androidcontrol", weight=0.5)], tmp_path / "d", val_fraction=0.0)
    assert 0 < none["train"] <= 9
    xml_only = build_sft([SftSource("collected", stores / "collected")], tmp_path / "e", val_fraction=0.0, mode="xml")
    rec = json.loads((tmp_path / "e" / "train.json").read_text())[0]
    assert rec["images"] == [] and "<image>" not in rec["messages"][1]["content"] and xml_only["images"] == 0


def test_action_weights_resample_by_the_answers_action_type(stores, tmp_path):
    def answers(d):
        return Counter(r["messages"][-1]["content"].split("(")[0] for r in json.loads((d / "train.json").read_text()))

    src = [SftSource("collected", stores / "collected")]
    base = build_sft(src, tmp_path / "a", val_fraction=0.0)
    more = build_sft(src, tmp_path / "b", val_fraction=0.0, action_weights={"Finish": 3.0, "Wait": 0.0})
    a, b = answers(tmp_path / "a"), answers(tmp_path / "b")
    n_finish, n_wait = base["sources"]["collected"]["action/Finish"], base["sources"]["collected"].get("action/Wait", 0)
    assert n_finish > 0 and b["<answer>finish"] == 3 * a["<answer>finish"] == 3 * n_finish
    assert more["train"] == base["train"] + 2 * n_finish - n_wait
    assert more["action_weights"] == {"Finish": 3.0, "Wait": 0.0}
    with pytest.raises(ValueError, match="unknown action name"):
        build_sft(src, tmp_path / "c", action_weights={"finish": 2.0})


def test_prompt_style_and_format_are_recorded(stores, tmp_path):
    stats = build_sft([SftSource("collected", stores / "collected")], tmp_path / "c", val_fraction=0.0, mode="xml",
                      style="compact", max_history=2)
    rec = json.loads((tmp_path / "c" / "train.json").read_text())[0]
    assert rec["messages"][0]["content"] == PR.system_prompt("xml", style="compact")
    assert (stats["mode"], stats["prompt_style"], stats["max_history"], stats["reasoning"]) == ("xml", "compact", 2, False)
    assert json.loads((tmp_path / "c" / "stats.json").read_text())["prompt_style"] == "compact"
    with pytest.raises(ValueError, match="prompt style"):
        build_sft([SftSource("collected", stores / "collected")], tmp_path / "d", style="tiny")


def test_marks_frame_dataset_names_lines_and_keeps_low_level_instructions(stores, tmp_path):
    src = [SftSource("collected", stores / "collected", variant="both")]
    stats = build_sft(src, tmp_path / "m", val_fraction=0.0, mode="xml", style="compact", coords="marks")
    rel = build_sft(src, tmp_path / "r", val_fraction=0.0, mode="xml", style="compact", coords="rel")
    assert stats["coords"] == "marks"
    s, r = stats["sources"]["collected"], rel["sources"]["collected"]
    assert (s["train_high"], s["train_low"]) == (r["train_high"], r["train_low"])  # no step lost to the frame
    recs = json.loads((tmp_path / "m" / "train.json").read_text())
    n_taps = 0
    for rec in recs:
        user, answer = rec["messages"][1]["content"], parse_action(rec["messages"][2]["content"])
        assert "(Class;flags;label;[index])" in user and "][" not in user.split("Screen elements", 1)[1]
        assert "element=" not in user and "element=" not in rec["messages"][2]["content"]
        if answer.name == "Tap":
            n_taps += 1
            lines = user.split("):\n", 1)[1].splitlines()
            assert lines[answer.index].endswith(f"[{answer.index}]")
    assert n_taps > 5
    assert json.loads((tmp_path / "m" / "stats.json").read_text())["coords"] == "marks"


@pytest.mark.timeout(600)
def test_llamafactory_trains_two_steps_on_the_dataset(stores, tmp_path, capsys):
    """The dataset loads in LLaMA-Factory (template qwen2_vl) and a 2-step SFT run succeeds on a tiny
    Qwen2-VL built from config with a tokenizer trained on the fly."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_checkpoint

    from mobilerl.models.profiles import load_profile
    from mobilerl.sft import llamafactory as LF

    data = tmp_path / "sft"
    build_sft([SftSource("collected", stores / "collected")], data, val_fraction=0.0)
    ckpt = tiny_checkpoint.build(tmp_path / "tiny")
    out = tmp_path / "run"
    args = LF.train_args(load_profile("tiny"), dataset="mobilerl_sft_train", dataset_dir=data, output_dir=out,
                         model_path=ckpt, overrides={"max_steps": 2, "per_device_train_batch_size": 2,
                                                     "packing": False, "cutoff_len": 2048, "num_train_epochs": 1,
                                                     "max_samples": 16})
    res = LF.run(args, timeout_s=540)
    assert [s for s, _ in res.losses] == [1, 2], res
    assert "sft: step 2/2, loss " in capsys.readouterr().out  # the watched run's last progress line
    assert all(loss == loss and loss > 0 for _, loss in res.losses)
    shutil.rmtree(out, ignore_errors=True)


def test_a_watched_training_prints_its_progress_once_per_interval_and_its_end(tmp_path, capsys):
    import subprocess
    import sys

    from mobilerl.sft.llamafactory import watch

    log = tmp_path / "trainer_log.jsonl"
    child = (f"import json, time\nfor i in range(1, 21):\n"
             f"    open({str(log)!r}, 'a').write(json.dumps({{'current_steps': i, 'total_steps': 20, 'loss': 2.0 / i, "
             f"'elapsed_time': '0:00:0%d' % (i // 4), 'remaining_time': '0:00:05'}}) + '\\n')\n    time.sleep(0.05)\n")
    watch(subprocess.Popen([sys.executable, "-c", child]), log, every_s=0.4, poll_s=0.05)
    lines = capsys.readouterr().out.splitlines()
    assert 2 <= len(lines) <= 6 and lines[-1] == "sft: step 20/20, loss 0.1000, 0:00:05 elapsed, ETA 0:00:05"
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(subprocess.TimeoutExpired):
        watch(slow, log, timeout_s=0.3, poll_s=0.05)
    slow.kill()
