"""AndroidWorld-like tasks in Retro Music."""

from __future__ import annotations

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.music import PLAYLIST_NAMES, RetroMusic
from mobilerl.env.sim.tasks.base import Expert, ExpertError, Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import inside, row_texts, rows, seek_row, visible_row

NEW_PLAYLIST_WORDS = (["Late Night", "Sunday", "Summer", "Winter", "Kitchen", "Study", "Gym", "Roadside", "Cozy",
                       "Weekend", "Morning", "Rainy"],
                      ["Mix", "Vibes", "Jams", "Favorites", "Session", "Selection", "Tunes", "Grooves"])


def _app(dev) -> RetroMusic:
    return dev.app("Retro Music")


def new_playlist_name(rng, dev) -> str:
    have = {p.name.lower() for p in _app(dev).playlists} | {n.lower() for n in PLAYLIST_NAMES}
    while True:
        name = f"{rng.choice(NEW_PLAYLIST_WORDS[0])} {rng.choice(NEW_PLAYLIST_WORDS[1])}"
        if name.lower() not in have:
            return name


def seek_song(x: Expert, title: str, extra=lambda r, t: True) -> Action:
    """Find a song row in an alphabetical song list, scrolling in the right direction first."""
    visible = [t["title"] for _, t in rows(x.s, "song_item") if "title" in t]
    first = "down" if visible and title.lower() < visible[0].lower() else "up"
    row = yield from seek_row(x, "song_item", lambda r, t: t.get("title") == title and extra(r, t), first=first)
    return row


def open_tab(x: Expert, tab: str) -> Action:
    tab_el = x.el(rid=f"tab_{tab.lower()}")
    if not tab_el.selected:
        yield x.tap(rid=f"tab_{tab.lower()}")


def row_menu(x: Expert, row) -> Action:
    """Tap the "More options" button inside a row."""
    btn = next((e for e in x.s.find_all(desc="More options") if inside(e.bounds, row.bounds)), None)
    if btn is None:
        raise ExpertError("row has no menu button")
    return Action("Tap", element=btn.bounds)


def open_playlist(x: Expert, name: str) -> Action:
    yield from open_tab(x, "Playlists")
    row = yield from seek_row(x, "playlist_item", lambda r, t: t.get("title") == name)
    yield Action("Tap", element=row.bounds)


def create_playlist_with(x: Expert, name: str, songs: list[str]) -> Action:
    """Songs tab: select the songs in order (long press, then taps) and add them to a new playlist."""
    for i, title in enumerate(songs):
        row = yield from seek_song(x, title, lambda r, t: not r.selected)
        yield Action("Long Press" if i == 0 else "Tap", element=row.bounds)
    yield x.tap(desc="Add to playlist")
    yield x.tap(text="New playlist")
    yield from x.fill("playlist_name", name)
    yield x.tap(text="Create")


class RetroPlaySong(Template):
    name = "RetroPlaySong"
    template = "Play the song '{title}' by {artist} in Retro Music."
    difficulty = "easy"
    tags = ("parameterized",)
    apps = ("Retro Music",)
    complexity = 1.6

    def sample(self, rng, dev):
        s = rng.choice(_app(dev).songs)
        return {"title": s.title, "artist": s.artist}

    def check(self, dev, p):
        app = _app(dev)
        return app.now is not None and app.now.title == p["title"] and app.now.artist == p["artist"] and app.playing

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        row = yield from seek_song(x, p["title"])
        yield Action("Tap", element=row.bounds)
        yield x.finish()


class RetroCreatePlaylist(Template):
    name = "RetroCreatePlaylist"
    template = 'Create a playlist in Retro Music titled "{playlist}" with the following songs, in order: {songs}.'
    difficulty = "medium"
    tags = ("data_entry", "repetition", "parameterized")
    apps = ("Retro Music",)
    complexity = 3.5

    def sample(self, rng, dev):
        songs = [s.title for s in rng.sample(_app(dev).songs, rng.choice([4, 5]))]
        return {"playlist": new_playlist_name(rng, dev), "titles": songs,
                "songs": ", ".join(f"'{t}'" for t in songs), "n": len(_app(dev).playlists)}

    def check(self, dev, p):
        app = _app(dev)
        pl = app.playlist(p["playlist"])
        return (pl is not None and [s.title for s in pl.songs] == p["titles"]
                and len(app.playlists) == p["n"] + 1)

    def subgoals(self, p):
        return [("playlist created", lambda dev: _app(dev).playlist(p["playlist"]) is not None),
                ("songs added in order", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from create_playlist_with(x, p["playlist"], p["titles"])
        yield x.finish()


class RetroDeletePlaylist(Template):
    name = "RetroDeletePlaylist"
    template = "Delete the playlist '{playlist}' in Retro Music."
    difficulty = "easy"
    tags = ("data_edit", "parameterized")
    apps = ("Retro Music",)
    complexity = 1.2

    def sample(self, rng, dev):
        app = _app(dev)
        return {"playlist": rng.choice(app.playlists).name, "n": len(app.playlists), "songs": len(app.songs)}

    def check(self, dev, p):
        app = _app(dev)
        return app.playlist(p["playlist"]) is None and len(app.playlists) == p["n"] - 1 and len(app.songs) == p["songs"]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_playlist(x, p["playlist"])
        yield x.tap(desc="Delete playlist")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()


class RetroRemoveFromPlaylist(Template):
    name = "RetroRemoveFromPlaylist"
    template = "Remove the song '{title}' from my '{playlist}' playlist in Retro Music."
    difficulty = "medium"
    tags = ("data_edit", "complex_ui_understanding", "parameterized")
    apps = ("Retro Music",)
    complexity = 1.5

    def sample(self, rng, dev):
        pl = rng.choice(_app(dev).playlists)
        s = rng.choice(pl.songs)
        return {"playlist": pl.name, "title": s.title, "rest": [t.title for t in pl.songs if t is not s]}

    def check(self, dev, p):
        pl = _app(dev).playlist(p["playlist"])
        return pl is not None and [s.title for s in pl.songs] == p["rest"]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_playlist(x, p["playlist"])
        row = yield from seek_row(x, "song_item", lambda r, t: t.get("title") == p["title"])
        yield row_menu(x, row)
        yield x.tap(text="Remove from playlist")
        yield x.tap(text="Remove", cls="Button")
        yield x.finish()


class RetroArtistQuery(Template):
    name = "RetroArtistQuery"
    template = "Which artist sings the song '{title}' in my Retro Music library? Answer with the artist's name."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Retro Music",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        s = rng.choice(_app(dev).songs)
        return {"title": s.title, "artist": s.artist}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["artist"])

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield x.tap(desc="Search")
        yield from x.fill("search_field", p["title"])
        row = visible_row(x, "song_item", lambda r, t: t.get("title") == p["title"])
        yield x.finish(row_texts(x.s, row)["subtitle"].split(" · ")[0])


class RetroPlaylistSongCount(Template):
    name = "RetroPlaylistSongCount"
    template = "How many songs are in my '{playlist}' playlist in Retro Music? Answer with a number."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Retro Music",)
    complexity = 1.0
    task_type = "query"

    def sample(self, rng, dev):
        pl = rng.choice(_app(dev).playlists)
        return {"playlist": pl.name, "count": str(len(pl.songs))}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["count"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_tab(x, "Playlists")
        row = yield from seek_row(x, "playlist_item", lambda r, t: t.get("title") == p["playlist"])
        yield x.finish(row_texts(x.s, row)["subtitle"].split()[0])
