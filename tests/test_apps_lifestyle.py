"""Lifestyle apps (Pro Expense, Broccoli, Retro Music, Camera + Simple Gallery) and their task templates."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from mobilerl.env.actions import Action
from mobilerl.env.sim import Device, SimEnv, hidden_ground_truth, run_oracle
from mobilerl.env.sim.apps.expenses import fmt_date
from mobilerl.env.sim.screen import Screen
from mobilerl.env.sim.tasks import ExpertError, OracleAgent, get_task, templates

MODULES = {
    "expenses": ("world_expenses", "lab_expenses"),
    "recipes": ("world_recipes", "lab_recipes"),
    "music": ("world_music", "lab_music"),
    "gallery": ("world_gallery", "lab_gallery"),
}


def _templates(group: str) -> list:
    mods = MODULES[group]
    return [t for suite in ("world", "lab") for t in templates(suite)
            if t.__class__.__module__.rsplit(".", 1)[-1] in mods]


def _screen(env: SimEnv) -> Screen:
    return env.screen()


def _tap(env: SimEnv, **query):
    e = _screen(env).find(**query)
    assert e is not None, query
    return env.step(Action("Tap", element=e.bounds))


def _launch(app: str, task: str = "world/test/ExpenseAddMultiple/0") -> SimEnv:  # a 50-step budget
    env = SimEnv(perturb="none")
    env.reset(task)
    env.step(Action("Launch", app=app))
    return env


# ------------------------------------------------------------------------------------------- templates
def test_inventory_and_distribution():
    world = [t for g in MODULES for t in _templates(g) if t.suite == "world"]
    lab = [t for g in MODULES for t in _templates(g) if t.suite == "lab"]
    assert len(world) >= 19 and len(lab) >= 8
    assert sum(len(t.apps) > 1 for t in world) >= 2
    share = {d: sum(t.difficulty == d for t in world) / len(world) for d in ("easy", "medium", "hard")}
    assert 0.4 <= share["easy"] <= 0.6 and 0.2 <= share["medium"] <= 0.4 and 0.1 <= share["hard"] <= 0.3
    assert {t.task_type for t in lab} == {"operation", "query"}
    for t in lab:
        p = get_task(f"lab/test/{t.name}/0", with_optimal=False).params
        assert 2 <= len(t.subgoals(p)) <= 4, t.name


@pytest.mark.parametrize("group", sorted(MODULES))
def test_experts_solve_their_templates(group):
    for t in _templates(group):
        for i in (0, 1):
            task = get_task(f"{t.suite}/test/{t.name}/{i}", with_optimal=False)
            for pert in ("default", "heavy"):
                r = run_oracle(task, perturb=pert)
                assert r.success, (task.task_id, pert, r.error)
                assert r.steps <= task.max_steps
            if t.name in ("ExpenseAddMultiple", "RecipeAddMultiple"):
                assert 30 <= run_oracle(task, perturb="none").steps <= 44


def _run_expert(env: SimEnv, tmpl, params, limit: int) -> None:
    obs = env._observe()
    agent = OracleAgent(tmpl, params)
    for _ in range(limit):
        try:
            action = agent.act(Screen(obs.xml, obs.app))
        except ExpertError:
            env.step(Action("Finish"))
            return
        res = env.step(action)
        obs = res.observation
        if res.done:
            return


@pytest.mark.parametrize("group", sorted(MODULES))
def test_wrong_end_states_fail(group):
    for t in _templates(group):
        task = get_task(f"{t.suite}/test/{t.name}/0", with_optimal=False)
        env = SimEnv(perturb="none")
        env.reset(task)
        env.step(Action("Finish", message="42"))
        assert hidden_ground_truth(env) == 0.0, f"{t.name}: doing nothing passes"
        subs = [fn(env.device) for _, fn in t.subgoals(task.params)]
        assert not subs[-1], f"{t.name}: last sub-goal holds with nothing done"
        # solving another instance of the template on this device must not pass
        other = next((get_task(f"{t.suite}/test/{t.name}/{i}", with_optimal=False) for i in range(1, 20)
                      if t.instruction(get_task(f"{t.suite}/test/{t.name}/{i}", with_optimal=False).params)
                      != task.instruction), None)
        if other is None:
            continue
        env.reset(replace(task, params=other.params, instruction=other.instruction))
        _run_expert(env, t, other.params, task.max_steps)
        env.task = task
        assert hidden_ground_truth(env) == 0.0, f"{t.name}: another instance's end state passes"


def test_query_answers_must_be_right():
    for name in ("ExpenseCategoryMonthTotal", "ExpenseDayTotal", "RecipeServings", "RetroArtistQuery",
                 "RetroPlaylistSongCount", "GalleryPhotoResolution", "GalleryCameraFolderCount"):
        task = get_task(f"world/test/{name}/0", with_optimal=False)
        r = run_oracle(task, perturb="none")
        right = r.actions[-1].message
        assert r.success and right
        env = SimEnv(perturb="none")
        env.reset(task)
        env.step(Action("Finish", message=right + "1"))
        assert hidden_ground_truth(env) == 0.0, name


# ------------------------------------------------------------------------------------------ Pro Expense
def test_expense_select_delete_and_statistics():
    env = _launch("Pro Expense")
    app = env.device.app("Pro Expense")
    n = len(app.expenses)
    rows = _screen(env).find_all(rid="expense_item")
    env.step(Action("Long Press", element=rows[0].bounds))
    env.step(Action("Tap", element=_screen(env).find_all(rid="expense_item")[1].bounds))
    assert _screen(env).title == "2 selected"
    _tap(env, desc="Delete")
    _tap(env, text="Delete", cls="Button")
    assert len(app.expenses) == n - 2 and _screen(env).title == "Pro Expense"
    # statistics: this month's total equals the sum of this month's expenses
    _tap(env, desc="Statistics")
    now = env.device.now
    want = sum(e.cents for e in app.expenses if (e.day.year, e.day.month) == (now.year, now.month))
    total = next(e.text for e in _screen(env).els if e.text.startswith("$"))
    assert round(float(total.strip("$").replace(",", "")) * 100) == want


def test_expense_form_date_stepper_and_validation():
    env = _launch("Pro Expense")
    app = env.device.app("Pro Expense")
    n = len(app.expenses)
    _tap(env, desc="Add expense")
    _tap(env, desc="Save")  # empty form is refused
    assert len(app.expenses) == n and _screen(env).title == "Add expense"
    _tap(env, rid="name")
    env.step(Action("Type", text="Bike repair"))
    _tap(env, rid="amount_input")
    env.step(Action("Type", text="$1,234.5"))
    env.step(Action("Back"))
    _tap(env, desc="Decrease date")
    _tap(env, desc="Decrease date")
    _tap(env, desc="Save")
    e = app.expenses[-1]
    assert (e.name, e.cents, e.category) == ("Bike repair", 123450, "Others")
    assert (env.device.now.date() - e.day).days == 2


def test_expense_list_scrolls_to_offscreen_rows():
    env = _launch("Pro Expense")
    app = env.device.app("Pro Expense")
    oldest = app.ordered()[-1]
    label = f"{oldest.category} · {fmt_date(oldest.day)}"
    assert label not in _screen(env).texts()
    for _ in range(6):
        env.step(Action("Swipe", direction="up", dist="long"))
    assert label in _screen(env).texts()
    assert env.step(Action("Swipe", direction="up")).info["effect"] == "scroll_end"


# --------------------------------------------------------------------------------------------- Broccoli
def test_recipe_favorite_tab_search_and_delete():
    env = _launch("Broccoli")
    app = env.device.app("Broccoli")
    target = next(r for r in app.recipes if not r.favorite)
    _tap(env, desc="Search")
    _tap(env, rid="search_field")
    env.step(Action("Type", text=target.title.split()[0].lower()))
    _tap(env, text=target.title)
    assert _screen(env).find(rid="recipe_title").text == target.title
    _tap(env, desc="Add to favorites")
    assert target.favorite
    env.step(Action("Launch", app="Broccoli"))
    _tap(env, rid="tab_favorites")
    assert _screen(env).has(text=target.title)
    _tap(env, text=target.title)
    _tap(env, desc="Delete")
    _tap(env, text="Cancel")
    assert target in app.recipes
    _tap(env, desc="Delete")
    _tap(env, text="Delete", cls="Button")
    assert target not in app.recipes


def test_recipe_details_scroll_to_directions():
    env = _launch("Broccoli")
    app = env.device.app("Broccoli")
    r = max(app.recipes, key=lambda r: len(r.ingredients) + len(r.directions))
    app.push("details", recipe=r)
    env.step(Action("Wait"))
    for _ in range(5):
        env.step(Action("Swipe", direction="up", dist="long"))
    last = r.direction_list()[-1]
    assert any(t.endswith(last) for t in _screen(env).texts())


# ------------------------------------------------------------------------------------------ Retro Music
def test_music_play_pause_and_tabs():
    env = _launch("Retro Music")
    app = env.device.app("Retro Music")
    first = _screen(env).find(rid="song_item")
    env.step(Action("Tap", element=first.bounds))
    assert app.now is not None and app.playing
    _tap(env, desc="Pause")
    assert not app.playing
    env.step(Action("Swipe", direction="left"))
    assert _screen(env).find(rid="tab_albums").selected
    _tap(env, rid="tab_playlists")
    assert _screen(env).has(rid="playlist_item")


def test_music_selection_add_to_new_playlist_and_remove():
    env = _launch("Retro Music")
    app = env.device.app("Retro Music")
    rows = _screen(env).find_all(rid="song_item")
    env.step(Action("Long Press", element=rows[2].bounds))
    env.step(Action("Tap", element=_screen(env).find_all(rid="song_item")[0].bounds))
    _tap(env, desc="Add to playlist")
    _tap(env, text="New playlist")
    _tap(env, rid="playlist_name")
    env.step(Action("Type", text="Test Mix"))
    _tap(env, text="Create")
    pl = app.playlist("Test Mix")
    songs = app.sorted_songs()
    assert pl is not None and pl.songs == [songs[2], songs[0]]
    _tap(env, rid="tab_playlists")
    _tap(env, text="Test Mix")
    row = _screen(env).find_all(rid="song_item")[0]
    menu = next(e for e in _screen(env).find_all(desc="More options") if e.bounds[1] >= row.bounds[1]
                and e.bounds[3] <= row.bounds[3])
    env.step(Action("Tap", element=menu.bounds))
    _tap(env, text="Remove from playlist")
    _tap(env, text="Remove", cls="Button")
    assert pl.songs == [songs[0]]


# --------------------------------------------------------------------------------------- Camera/Gallery
def test_camera_captures_land_in_gallery():
    env = _launch("Camera")
    gallery = env.device.app("Gallery")
    n = len(gallery.media)
    _tap(env, text="Take photo")
    photo = gallery.media[-1]
    assert re.fullmatch(r"IMG_\d{8}_\d{6}\.jpg", photo.name) and len(gallery.media) == n + 1
    assert photo.name == f"IMG_{photo.taken:%Y%m%d_%H%M%S}.jpg"
    _tap(env, rid="mode_video")
    _tap(env, text="Record video")
    env.step(Action("Wait"))
    _tap(env, text="Stop recording")
    video = gallery.media[-1]
    assert video.video and video.name.startswith("VID_") and video.duration >= 5
    env.step(Action("Launch", app="Gallery"))
    _tap(env, desc="Camera", rid="folder_tile")
    tiles = [e.desc for e in _screen(env).find_all(rid="medium_thumbnail")]
    assert tiles[:2] == [video.name, photo.name]  # newest first


def test_gallery_properties_and_delete_confirmation():
    env = _launch("Gallery")
    g = env.device.app("Gallery")
    _tap(env, desc="Screenshots", rid="folder_tile")
    m = g.in_folder("Screenshots")[0]
    _tap(env, desc=m.name)
    _tap(env, desc="Properties")
    assert _screen(env).has(text="1080 x 2400")
    _tap(env, text="OK")
    _tap(env, text="Delete", cls="Button")
    _tap(env, text="Cancel")
    assert g.get(m.name) is not None
    _tap(env, text="Delete", cls="Button")
    _tap(env, text="Delete", rid="confirm_delete")
    assert g.get(m.name) is None and _screen(env).title == "Screenshots"


def test_content_is_deterministic():
    a, b = Device(seed=11), Device(seed=11)
    for name in ("Pro Expense", "Broccoli", "Retro Music", "Gallery"):
        a.launch(name)
        b.launch(name)
        a._tree = b._tree = None
        assert a.xml() == b.xml()
