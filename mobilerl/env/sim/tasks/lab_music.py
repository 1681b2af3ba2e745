"""AndroidLab-like tasks in Retro Music (the Pi Music Player family: library queries and playback)."""

from __future__ import annotations

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.music import mmss
from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import row_texts, seek_row, visible_row
from mobilerl.env.sim.tasks.world_music import _app, new_playlist_name, open_playlist, open_tab


def _page(dev, name: str) -> bool:
    return dev.foreground == "Retro Music" and _app(dev).page.name == name


def duration_variants(mmss: str) -> list[str]:
    m, s = (int(v) for v in mmss.split(":"))
    return [mmss, f"{m} minutes {s} seconds", f"{m} minutes and {s} seconds", f"{m} min {s} s",
            f"{m} min {s} sec", f"{m}m {s}s", f"00:{m:02d}:{s:02d}", f"0:{m:02d}:{s:02d}"]


class LabMusicArtistTotalDuration(Template):
    suite = "lab"
    name = "music_artist_total_duration"
    template = "What is the total duration of all of {artist}'s songs?"
    difficulty = "medium"
    apps = ("Retro Music",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        artist, songs = rng.choice(_app(dev).artists())
        return {"artist": artist, "total": mmss(sum(s.duration for s in songs))}

    def check(self, dev, p):
        return answer_matches(dev.answer, duration_variants(p["total"]))

    def subgoals(self, p):
        def artists_tab(dev):
            st = _app(dev).page
            return (dev.foreground == "Retro Music" and (st.name == "artist" or st.args.get("tab") == "Artists")) \
                or self.check(dev, p)

        def artist_open(dev):
            st = _app(dev).page
            return (_page(dev, "artist") and st.args["artist"] == p["artist"]) or self.check(dev, p)

        return [("artist list opened", artists_tab), ("artist opened", artist_open),
                ("total duration reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_tab(x, "Artists")
        row = yield from seek_row(x, "artist_item", lambda r, t: t.get("title") == p["artist"])
        yield Action("Tap", element=row.bounds)
        yield x.finish(x.el(rid="artist_info").text.split(" · ")[-1])


class LabMusicAlbumOfSong(Template):
    suite = "lab"
    name = "music_album_of_song"
    template = "What is the album name of the song {title}?"
    difficulty = "easy"
    apps = ("Retro Music",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        s = rng.choice(_app(dev).songs)
        return {"title": s.title, "album": s.album}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["album"])

    def subgoals(self, p):
        return [("song found", lambda dev: _page(dev, "search") or self.check(dev, p)),
                ("album reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield x.tap(desc="Search")
        yield from x.fill("search_field", p["title"])
        row = visible_row(x, "song_item", lambda r, t: t.get("title") == p["title"])
        yield x.finish(row_texts(x.s, row)["subtitle"].split(" · ", 1)[1])


class LabMusicPlayFirstInPlaylist(Template):
    suite = "lab"
    name = "music_play_first_in_playlist"
    template = "Play the first song in the '{playlist}' playlist."
    difficulty = "easy"
    apps = ("Retro Music",)
    complexity = 1.2

    def sample(self, rng, dev):
        pl = rng.choice(_app(dev).playlists)
        return {"playlist": pl.name, "title": pl.songs[0].title}

    def check(self, dev, p):
        app = _app(dev)
        return app.now is not None and app.now.title == p["title"] and app.playing

    def subgoals(self, p):
        def opened(dev):
            st = _app(dev).page
            return (_page(dev, "playlist") and st.args["playlist"].name == p["playlist"]) or self.check(dev, p)

        return [("playlist opened", opened), ("first song playing", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_playlist(x, p["playlist"])
        first = visible_row(x, "song_item", lambda r, t: True)
        yield Action("Tap", element=first.bounds)
        yield x.finish()


class LabMusicCreatePlaylist(Template):
    suite = "lab"
    name = "music_create_playlist"
    template = "Create a playlist named '{playlist}' for me."
    difficulty = "easy"
    apps = ("Retro Music",)
    complexity = 1.2

    def sample(self, rng, dev):
        return {"playlist": new_playlist_name(rng, dev), "n": len(_app(dev).playlists)}

    def check(self, dev, p):
        app = _app(dev)
        pl = app.playlist(p["playlist"])
        return pl is not None and not pl.songs and len(app.playlists) == p["n"] + 1

    def subgoals(self, p):
        def dialog_open(dev):
            st = _app(dev).page
            return (dev.foreground == "Retro Music" and st.dialog is not None and st.dialog().title == "New playlist") \
                or self.check(dev, p)

        return [("new playlist dialog opened", dialog_open), ("playlist created", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Retro Music")
        yield from open_tab(x, "Playlists")
        yield x.tap(desc="New playlist")
        yield from x.fill("playlist_name", p["playlist"])
        yield x.tap(text="Create")
        yield x.finish()
