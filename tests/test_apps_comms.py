"""The comms apps (SMS Messenger, Markor, Files, Audio Recorder) and their task templates."""

from __future__ import annotations

import pytest

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.sim import SimEnv, run_oracle
from mobilerl.env.sim.device import Device, Perturb
from mobilerl.env.sim.screen import Screen
from mobilerl.env.sim.tasks import get_task, templates

APPS = ("SMS Messenger", "Markor", "Files", "Audio Recorder")


def _ours(suite: str) -> list[str]:
    return [t.name for t in templates(suite) if set(t.apps) & set(APPS)]


WORLD = _ours("world")
LAB = _ours("lab")


# ------------------------------------------------------------------------------------------- helpers
def screen(dev: Device) -> Screen:
    return Screen(dev.xml(), dev.current_name)


def tap(dev: Device, long: bool = False, **query) -> None:
    e = screen(dev).find(**query)
    assert e is not None, f"{query} not on screen {screen(dev).title!r}"
    dev.step(Action(A.LONG_PRESS if long else A.TAP, element=e.bounds))


def typ(dev: Device, text: str) -> None:
    dev.step(Action(A.TYPE, text=text))


def fresh(app: str, seed: int = 11) -> Device:
    dev = Device(seed=seed, perturb=Perturb())
    dev.step(Action(A.LAUNCH, app=app))
    return dev


def env_for(task_id: str) -> SimEnv:
    env = SimEnv(perturb="none")
    env.reset(task_id)
    return env


def finish(env: SimEnv, message: str | None = None) -> float | None:
    env.step(Action(A.FINISH, message=message))
    return env.evaluate()


# -------------------------------------------------------------------------------------------- templates
def test_enough_templates():
    assert len(WORLD) >= 19 and len(LAB) >= 7
    world = [t for t in templates("world") if t.name in WORLD]
    assert sum(len(set(t.apps)) > 1 for t in world) >= 3  # multi-app
    assert {t.difficulty for t in world} == {"easy", "medium", "hard"}
    assert {t.task_type for t in templates("lab") if t.name in LAB} == {"operation", "query"}
    for t in templates("lab"):
        if t.name in LAB:
            spec = get_task(f"lab/test/{t.name}/0", with_optimal=False)
            assert 2 <= len(spec.subgoals) <= 4


@pytest.mark.parametrize("suite,name", [("world", n) for n in WORLD] + [("lab", n) for n in LAB])
def test_expert_solves_and_nothing_done_fails(suite, name):
    for i in range(2):
        tid = f"{suite}/test/{name}/{i}"
        r = run_oracle(tid, perturb="default" if i else "heavy")
        assert r.success, (tid, r.error, r.steps)
        env = env_for(tid)
        assert finish(env, "I don't know") == 0.0, f"{tid}: finishing at once passed the verifier"


def test_lab_subgoals_progress():
    env = env_for("lab/test/files_new_folder_move/0")
    assert env.subgoals() == [False, False, False]
    r = run_oracle("lab/test/files_new_folder_move/0", perturb="none")
    env = env_for("lab/test/files_new_folder_move/0")
    for a in r.actions:
        env.step(a)
    assert env.subgoals() == [True, True, True]


def test_wrong_end_states_fail():
    # SMS to the right number with the wrong text, and the right text to the wrong number
    env = env_for("world/test/SmsSendMessage/0")
    p = env.task.params
    env.device.app("SMS Messenger").send(p["number"], "hello")
    assert finish(env) == 0.0
    env = env_for("world/test/SmsSendToContact/0")
    p = env.task.params
    other = next(c for c in env.device.app("Contacts").contacts if c.name != p["name"] and c.phone)
    env.device.app("SMS Messenger").send(other.phone, p["message"])
    assert finish(env) == 0.0
    # a query answered with the older tracking number
    env = env_for("world/test/SmsTrackingNumberQuery/0")
    assert finish(env, env.task.params["old"]) == 0.0
    env = env_for("world/test/SmsTrackingNumberQuery/0")
    assert finish(env, env.task.params["num"]) == 1.0
    # deleting a different conversation
    env = env_for("world/test/SmsDeleteConversation/0")
    sms = env.device.app("SMS Messenger")
    victim = next(t for t in sms.conversations() if sms.display(t) != env.task.params["who"])
    sms.threads.remove(victim)
    assert finish(env) == 0.0
    # deleting one note too many
    env = env_for("world/test/MarkorDeleteNotesMatching/0")
    r = run_oracle("world/test/MarkorDeleteNotesMatching/0", perturb="none")
    for a in r.actions[:-1]:
        env.step(a)
    markor = env.device.app("Markor")
    markor.notes.remove(markor.find("grocery_list.md"))
    assert finish(env) == 0.0
    # moving only some of the files
    env = env_for("world/test/FilesMoveAllOfType/0")
    p = env.task.params
    files = env.device.app("Files")
    files.find(p["names"][0], "Download").folder = p["dst"]
    assert finish(env) == 0.0
    # a recording that is too short
    env = env_for("world/test/AudioRecorderRecordLong/0")
    p = env.task.params
    rec = env.device.app("Audio Recorder")
    from mobilerl.env.sim.apps.recorder import Recording

    rec.recordings.append(Recording(p["name"], p["secs"] - 5, env.device.now))
    assert finish(env) == 0.0
    # the file size of a different file
    env = env_for("world/test/FilesSizeQuery/0")
    assert finish(env, "1 B") == 0.0


def test_step_distribution():
    steps = {}
    for name in WORLD:
        steps[name] = run_oracle(f"world/test/{name}/0", perturb="none").steps
    assert min(steps.values()) <= 3 and max(steps.values()) >= 30
    assert sum(s >= 15 for s in steps.values()) >= 3


# ------------------------------------------------------------------------------------------ SMS app
def test_sms_thread_send_and_delete():
    dev = fresh("SMS Messenger")
    sms = dev.app("SMS Messenger")
    n_before = len(sms.conversations())
    top = sms.conversations()[0]
    tap(dev, rid="conversation")
    assert screen(dev).title == sms.display(top)
    tap(dev, rid="thread_type_message")
    typ(dev, "On my way")
    tap(dev, rid="thread_send_message")
    assert sms.sent == [(top.number, "On my way")]
    assert dev.log[-1] == f"sms_sent:{top.number}:On my way"
    assert top.messages[-1].text == "On my way" and not top.messages[-1].incoming
    tap(dev, desc="Delete")
    tap(dev, text="Cancel")
    assert len(sms.conversations()) == n_before
    tap(dev, desc="Delete")
    tap(dev, rid="confirm_delete")
    assert len(sms.conversations()) == n_before - 1 and top not in sms.threads
    assert screen(dev).title == "Messages"


def test_sms_contacts_send_message_opens_thread_and_names_are_live():
    dev = fresh("Contacts")
    contacts = dev.app("Contacts")
    c = contacts.ordered()[0]
    tap(dev, text=c.name)
    tap(dev, desc="Send message")
    assert dev.foreground == "SMS Messenger"
    s = screen(dev)
    assert s.title == c.name and s.find(rid="thread_type_message") is not None
    # a raw-number thread shows the name as soon as the number is saved as a contact
    sms = dev.app("SMS Messenger")
    stranger = next(t for t in sms.conversations() if sms.display(t) == t.number and len(t.key) >= 7)
    from mobilerl.env.sim.apps.contacts import Contact

    contacts.contacts.append(Contact("Zed", "Example", stranger.number))
    assert sms.display(stranger) == "Zed Example"


def test_sms_new_conversation_and_scrolling():
    dev = fresh("SMS Messenger")
    sms = dev.app("SMS Messenger")
    last = sms.conversations()[-1]
    assert screen(dev).find(text=sms.display(last), rid="title") is None  # below the fold
    for _ in range(4):
        dev.step(Action(A.SWIPE, direction="up", dist="long"))
    assert screen(dev).find(text=sms.display(last), rid="title") is not None
    tap(dev, desc="Start a conversation")
    tap(dev, rid="new_conversation_address")
    typ(dev, "+1 415 555-0199")
    tap(dev, rid="new_conversation_message")
    typ(dev, "Hi, is the bike still for sale?")
    tap(dev, rid="new_conversation_send")
    t = sms.thread_for("4155550199")
    assert t is not None and t.messages[-1].text == "Hi, is the bike still for sale?"
    assert screen(dev).title == "+1 415 555-0199"


# ---------------------------------------------------------------------------------------- Markor app
def test_markor_create_edit_rename_delete():
    dev = fresh("Markor")
    markor = dev.app("Markor")
    n = len(markor.notes)
    tap(dev, desc="Create a new file or folder")
    typ(dev, "agenda")  # the name field has focus
    tap(dev, text="OK", cls="Button")
    typ(dev, "first line")  # the editor opens focused; Markor saves as you type
    note = markor.find("agenda.md", "")
    assert note is not None and note.content == "first line" and len(markor.notes) == n + 1
    dev.step(Action(A.BACK))  # keyboard
    dev.step(Action(A.BACK))  # editor
    assert screen(dev).title == "Markor"
    tap(dev, long=True, text="agenda.md")
    assert screen(dev).title == "1 selected"
    tap(dev, desc="Rename")
    typ(dev, "agenda_v2.md")
    tap(dev, text="OK", cls="Button")
    assert markor.find("agenda_v2.md", "") is note and markor.find("agenda.md") is None
    tap(dev, long=True, text="agenda_v2.md")
    tap(dev, desc="Delete")
    tap(dev, rid="confirm_delete")
    assert note not in markor.notes and len(markor.notes) == n


def test_markor_folders_and_preview():
    dev = fresh("Markor")
    markor = dev.app("Markor")
    tap(dev, desc="Create a new file or folder")
    typ(dev, "Receipts")
    tap(dev, text="Folder", cls="Button")
    assert "Receipts" in markor.folders
    tap(dev, text="Receipts", rid="title")
    assert screen(dev).title == "Receipts" and screen(dev).has(text="This folder is empty")
    dev.step(Action(A.BACK))
    for _ in range(3):
        dev.step(Action(A.SWIPE, direction="up", dist="long"))
    tap(dev, text="todo.md")
    tap(dev, desc="Preview")
    assert screen(dev).has(text="# To do")


# ----------------------------------------------------------------------------------------- Files app
def test_files_select_delete_move_info():
    dev = fresh("Files")
    files = dev.app("Files")
    tap(dev, text="Download", rid="title")
    first, second = files.in_folder("Download")[:2]
    total = len(files.files)
    tap(dev, long=True, text=first.name)
    tap(dev, text=second.name)  # selection mode: taps toggle
    assert screen(dev).title == "2 selected"
    tap(dev, desc="Move to")
    tap(dev, text="Documents", rid="title")
    tap(dev, text="Move", cls="Button")
    assert first.folder == second.folder == "Documents" and len(files.files) == total
    third = files.in_folder("Download")[0]
    tap(dev, long=True, text=third.name)
    tap(dev, desc="Get info")
    assert screen(dev).find(rid="info_size").text.startswith("Size: ")
    tap(dev, text="Close")
    tap(dev, desc="Delete")
    tap(dev, rid="confirm_delete")
    assert third not in files.files and len(files.files) == total - 1
    tap(dev, text="Internal storage", cls="Button")  # breadcrumb
    assert screen(dev).title == "Internal storage"


# --------------------------------------------------------------------------------- Audio Recorder app
def test_recorder_duration_follows_the_clock():
    dev = fresh("Audio Recorder")
    rec = dev.app("Audio Recorder")
    n = len(rec.recordings)
    tap(dev, desc="Start recording")
    for _ in range(4):
        dev.step(Action(A.WAIT))  # 3 s each
    assert screen(dev).find(rid="txt_progress").text == "00:12"
    tap(dev, text="Stop")
    assert len(rec.recordings) == n + 1
    new = max(rec.recordings, key=lambda r: r.created)
    assert new.duration == 17 and screen(dev).has(text="Save recording")
    tap(dev, rid="input_name")
    typ(dev, "Kitchen sounds.m4a")
    tap(dev, text="Save", cls="Button")
    assert new.name == "Kitchen sounds" and rec.find("Kitchen sounds") is new
    # discarding drops the clip
    tap(dev, desc="Start recording")
    tap(dev, text="Stop")
    tap(dev, text="Discard")
    assert len(rec.recordings) == n + 1


def test_deterministic_content():
    a, b = Device(seed=42), Device(seed=42)
    for app in APPS:
        a.launch(app)
        b.launch(app)
        assert a.xml() == b.xml()


def test_deleting_a_contact_whose_page_is_stacked_twice_removes_it_once():
    dev = fresh("Contacts")
    contacts = dev.app("Contacts")
    c = contacts.ordered()[0]
    n = len(contacts.contacts)
    contacts.push("details", contact=c)
    contacts.push("details", contact=c)  # the same details page twice on the stack
    for _ in range(2):
        tap(dev, rid="delete")
        tap(dev, rid="confirm_delete")  # the second time: already gone, no crash
    assert len(contacts.contacts) == n - 1 and c not in contacts.contacts
