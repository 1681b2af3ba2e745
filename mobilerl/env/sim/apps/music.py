"""Retro Music (code.name.monkey.retromusic): a local music player with Songs / Albums / Artists / Playlists
tabs, a now-playing bar and player page, multi-select, and playlist management."""

from __future__ import annotations

from dataclasses import dataclass, field

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import Button, Buttons, Checkbox, Dialog, Field, Grid, IconButton, Page, Row, Text

# artist -> [(album, year, [titles])]
CATALOG: dict[str, list[tuple[str, int, list[str]]]] = {
    "Velvet Harbor": [("Low Tide Lights", 2019, ["Salt in the Air", "Harbor Lights", "Paper Boats", "Undertow"]),
                      ("Northern Static", 2022, ["Radio Silence", "Cold Front", "Wires and Wool", "Quiet Engines"])],
    "Mara Ellison": [("Glasshouse", 2018, ["Glasshouse", "Amber Hours", "Second Guess", "Lanterns"]),
                     ("Soft Machinery", 2021, ["Copper Sky", "Borrowed Time", "Slow Bloom"])],
    "The Midnight Orchard": [("Orchard Sessions", 2017, ["Crabapple Road", "Fireflies in June", "Hollow Oak",
                                                        "Windfall"]),
                             ("Late Harvest", 2020, ["Late Harvest", "Cider Moon", "Frostbite Waltz"])],
    "Kofi Mensah Trio": [("Accra Nights", 2016, ["Midnight in Osu", "Coastline Groove", "Palm Wine Blues"]),
                         ("Blue Kente", 2023, ["Blue Kente", "Harmattan Wind", "Market Day", "Golden Stool"])],
    "Neon Cartography": [("Grid City", 2020, ["Grid City", "Overpass", "Night Bus", "Signal Loss"]),
                         ("Atlas Error", 2022, ["Atlas Error", "Terminal Bloom", "Parallax"])],
    "Lucia Ferraro": [("Sotto Voce", 2019, ["Sotto Voce", "Via dei Fiori", "Lemon Trees", "Notturno"])],
    "Static Pilots": [("Altitude", 2018, ["Altitude", "Cabin Pressure", "Jet Stream", "Holding Pattern"]),
                      ("Runway Lights", 2021, ["Runway Lights", "Tailwind", "Red-Eye"])],
    "Hana Mori": [("Paper Lanterns", 2020, ["Kyoto Rain", "Cherry Blossom Static", "Tatami Dreams",
                                            "Last Train Home"])],
    "Dust & Marrow": [("Dry County", 2015, ["Dry County", "Gravel and Grace", "Whiskey Creek", "Rattlesnake Hymn"]),
                      ("Boneyard Psalms", 2019, ["Boneyard", "Long Way Down", "Tumbleweed Heart"])],
    "Aurora Kline": [("Polar", 2021, ["Polaris", "Snowblind", "Northern Lights", "Ice Palace"]),
                     ("Meltwater", 2023, ["Meltwater", "Thaw", "Spring Again"])],
    "Brass Monsoon": [("Horns Up", 2017, ["Horns Up", "Second Line", "Bayou Strut", "Mardi Gras Morning"])],
    "Elias Novak": [("Quiet Rooms", 2022, ["Quiet Rooms", "Piano for Two", "Empty Hallway", "Morning Coffee"])],
}
PLAYLIST_NAMES = ["Road Trip", "Morning Run", "Chill Evening", "Focus", "Dinner Party", "Rainy Day", "Workout",
                  "Sunday Brunch"]


def mmss(sec: int) -> str:
    return f"{sec // 60}:{sec % 60:02d}"


@dataclass(eq=False)
class Song:
    title: str
    artist: str
    album: str
    year: int
    track: int
    duration: int  # seconds

    @property
    def path(self) -> str:
        return f"/storage/emulated/0/Music/{self.artist}/{self.album}/{self.track:02d} {self.title}.mp3"


@dataclass(eq=False)
class Playlist:
    name: str
    songs: list[Song] = field(default_factory=list)


class RetroMusic(App):
    name = "Retro Music"
    package = "code.name.monkey.retromusic"
    color = (48, 63, 159)
    aliases = ("music", "retro music", "retro")

    def setup(self) -> None:
        self.songs: list[Song] = []
        artists = self.rng.sample(sorted(CATALOG), self.rng.randrange(5, 8))
        for artist in artists:
            albums = CATALOG[artist]
            chosen = albums if len(albums) == 1 or self.rng.random() < 0.2 else [self.rng.choice(albums)]
            for album, year, titles in chosen:
                for i, t in enumerate(titles, 1):
                    self.songs.append(Song(t, artist, album, year, i, self.rng.randrange(150, 390)))
        self.playlists: list[Playlist] = []
        for name in self.rng.sample(PLAYLIST_NAMES, self.rng.randrange(2, 4)):
            self.playlists.append(Playlist(name, self.rng.sample(self.songs, self.rng.randrange(3, 8))))
        self.now: Song | None = None
        self.playing = False
        self.queue: list[Song] = []
        self.history: list[str] = []

    # -- queries
    def song(self, title: str) -> Song | None:
        want = title.strip().lower()
        return next((s for s in self.songs if s.title.lower() == want), None)

    def playlist(self, name: str) -> Playlist | None:
        want = " ".join(name.lower().split())
        return next((p for p in self.playlists if " ".join(p.name.lower().split()) == want), None)

    def sorted_songs(self) -> list[Song]:
        return sorted(self.songs, key=lambda s: s.title.lower())

    def albums(self) -> list[tuple[str, str, list[Song]]]:
        out: dict[str, tuple[str, str, list[Song]]] = {}
        for s in self.songs:
            out.setdefault(s.album, (s.album, s.artist, []))[2].append(s)
        return sorted(out.values(), key=lambda a: a[0].lower())

    def artists(self) -> list[tuple[str, list[Song]]]:
        out: dict[str, list[Song]] = {}
        for s in self.songs:
            out.setdefault(s.artist, []).append(s)
        return sorted(out.items(), key=lambda a: a[0].lower())

    # -- playback
    def play(self, s: Song, queue: list[Song] | None = None) -> None:
        self.now = s
        self.playing = True
        self.queue = list(queue) if queue else [s]
        self.history.append(s.title)
        self.device.log.append(f"play:{s.title}")

    def skip(self, k: int) -> None:
        if self.now is None:
            return
        q = self.queue if self.now in self.queue else [self.now]
        i = (q.index(self.now) + k) % len(q)
        self.play(q[i], q)

    def toggle(self) -> None:
        if self.now is not None:
            self.playing = not self.playing


    # -- shared widgets
    def _song_rows(self, st: PageState, songs: list[Song], playlist: Playlist | None = None,
                   menus: bool = True) -> list:
        sel: list[Song] | None = st.args.get("sel") if st.name == "main" else None
        rows = []
        for s in songs:
            sub = f"{s.artist} · {s.album}"
            if sel:
                def toggle(s=s) -> None:
                    if s in sel:
                        sel.remove(s)
                    else:
                        sel.append(s)
                rows.append(Row(s.title, sub, on_tap=toggle, on_long=toggle, rid="song_item", selected=s in sel,
                                trailing=Checkbox("", s in sel, toggle, rid="select")))
                continue
            on_long = (lambda s=s: sel.append(s)) if sel is not None else None
            menu = IconButton("More options", lambda s=s: self._song_menu(s, playlist), rid="menu") if menus else None
            rows.append(Row(s.title, sub, on_tap=lambda s=s, q=songs: self.play(s, q), on_long=on_long,
                            rid="song_item", trailing=menu))
        return rows

    def _song_menu(self, s: Song, playlist: Playlist | None) -> None:
        def act(fn) -> None:
            self.close_dialog()
            fn()

        items = [Row("Play", on_tap=lambda: act(lambda: self.play(s)), rid="menu_item"),
                 Row("Play next", on_tap=lambda: act(lambda: self._play_next(s)), rid="menu_item"),
                 Row("Add to playlist", on_tap=lambda: self._add_dialog([s]), rid="menu_item"),
                 Row("Go to album", on_tap=lambda: act(lambda: self.push("album", album=s.album)), rid="menu_item"),
                 Row("Details", on_tap=lambda: self._details(s), rid="menu_item")]
        if playlist is not None:
            items.append(Row("Remove from playlist", on_tap=lambda: self._remove_dialog(s, playlist),
                             rid="menu_item"))
        self.dialog(lambda: Dialog(s.title, body=items, rid="song_menu"))

    def _play_next(self, s: Song) -> None:
        if self.now is None:
            self.play(s)
            return
        q = [x for x in self.queue if x is not s]
        i = q.index(self.now) if self.now in q else 0
        q.insert(i + 1, s)
        self.queue = q
        self.device.toast = "Added to the queue"

    def _play_next_all(self, sel: list[Song]) -> None:
        for s in reversed(sel):
            self._play_next(s)
        sel.clear()

    def _details(self, s: Song) -> None:
        self.dialog(lambda: Dialog("Song details", body=[
            Row(s.title, "Title", rid="detail_title"), Row(s.artist, "Artist", rid="detail_artist"),
            Row(s.album, "Album", rid="detail_album"), Row(str(s.track), "Track number", rid="detail_track"),
            Row(mmss(s.duration), "Length", rid="detail_length"), Row(str(s.year), "Year", rid="detail_year"),
            Row(s.path, "File path", rid="detail_path")],
            buttons=[Button("OK", self.close_dialog, rid="ok")]))

    def _remove_dialog(self, s: Song, p: Playlist) -> None:
        def remove() -> None:
            if s in p.songs:
                p.songs.remove(s)
            self.close_dialog()

        self.dialog(lambda: Dialog("Remove from playlist?", f"Remove “{s.title}” from {p.name}?", buttons=[
            Button("Cancel", self.close_dialog, rid="cancel", primary=False),
            Button("Remove", remove, rid="confirm_remove")]))

    def _add_dialog(self, songs: list[Song]) -> None:
        songs = list(songs)
        st = self.page

        def add_to(p: Playlist) -> None:
            added = [s for s in songs if s not in p.songs]
            p.songs.extend(added)
            self.device.toast = f"Added {len(added)} song(s) to {p.name}"
            self.close_dialog()
            if st.args.get("sel"):
                st.args["sel"] = []

        rows = [Row("New playlist", on_tap=lambda: self._new_dialog(songs), rid="new_playlist", icon="New playlist")]
        rows.extend(Row(p.name, f"{len(p.songs)} songs", on_tap=lambda p=p: add_to(p), rid="playlist_option")
                    for p in self.playlists)
        self.dialog(lambda: Dialog("Add to playlist", body=rows,
                                   buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False)]))

    def _new_dialog(self, songs: list[Song]) -> None:
        st = self.page
        st.fields.pop("playlist_name", None)

        def create() -> None:
            name = st.fields.get("playlist_name", "").strip()
            if not name:
                self.device.toast = "Playlist name can't be empty"
                return
            if self.playlist(name) is not None:
                self.device.toast = "A playlist with that name already exists"
                return
            self.playlists.append(Playlist(name, list(songs)))
            self.device.toast = f"Created playlist {name}"
            st.fields.pop("playlist_name", None)
            st.focus = None
            self.close_dialog()
            if st.args.get("sel"):
                st.args["sel"] = []

        def cancel() -> None:
            st.focus = None
            self.close_dialog()

        self.dialog(lambda: Dialog("New playlist", body=[Field("playlist_name", "Playlist name",
                                                               rid="playlist_name")],
                                   buttons=[Button("Cancel", cancel, rid="cancel", primary=False),
                                            Button("Create", create, rid="create")], on_dismiss=cancel))

    def _mini(self) -> list:
        """The now-playing bar (kept at the top of the list: see the lifestyle report on Page.bottom)."""
        if self.now is None:
            return []
        return [Row(self.now.title, f"{self.now.artist} · {'Playing' if self.playing else 'Paused'}",
                    on_tap=lambda: self.push("player"), rid="mini_player", icon=f"Album art: {self.now.album}",
                    trailing=IconButton("Pause" if self.playing else "Play", self.toggle, rid="mini_play_pause"))]

    # -- pages
    TABS = ("Songs", "Albums", "Artists", "Playlists")

    def on_swipe(self, direction: str) -> bool:
        st = self.page
        if st.name == "player":
            self.skip(1 if direction == "left" else -1)
            return True
        if st.name != "main" or st.args.get("sel"):
            return False
        i = self.TABS.index(st.args.get("tab", "Songs")) + (1 if direction == "left" else -1)
        if 0 <= i < len(self.TABS):
            st.args["tab"] = self.TABS[i]
            st.scroll = 0
            return True
        return False

    def page_main(self, st: PageState) -> Page:
        tab = st.args.setdefault("tab", "Songs")
        sel: list[Song] = st.args.setdefault("sel", [])
        if sel:
            n = len(sel)
            return Page(f"{n} selected", nav_back=True, body=self._song_rows(st, self.sorted_songs(), menus=False),
                        actions=[IconButton("Add to playlist", lambda: self._add_dialog(sel), rid="add_to_playlist"),
                                 IconButton("Play next", lambda: self._play_next_all(sel), rid="play_next")],
                        scroll_rid="recycler_view")

        def go(t: str) -> None:
            st.args["tab"] = t
            st.scroll = 0

        tabs = [Button(t, lambda t=t: go(t), rid=f"tab_{t.lower()}", primary=t != tab) for t in self.TABS]
        actions = [IconButton("Search", lambda: self.push("search"), rid="action_search")]
        body: list
        if tab == "Songs":
            songs = self.sorted_songs()
            # the long library list has no per-row menu button (long press selects; keeps the dump small)
            body = [Text(f"{len(songs)} songs", size="small", rid="song_count"),
                    *self._song_rows(st, songs, menus=False)]
        elif tab == "Albums":
            body = [Grid([Row(a, artist, on_tap=lambda a=a: self.push("album", album=a), rid="album_tile", desc=a)
                          for a, artist, _ in self.albums()], cols=2, tile_h=420, rid="album_grid")]
        elif tab == "Artists":
            body = []
            for artist, songs in self.artists():
                n_alb = len({s.album for s in songs})
                body.append(Row(artist, f"{n_alb} album{'s' if n_alb != 1 else ''} · {len(songs)} songs",
                                on_tap=lambda a=artist: self.push("artist", artist=a), rid="artist_item",
                                icon=artist))
        else:
            actions.append(IconButton("New playlist", lambda: self._new_dialog([]), rid="action_new_playlist"))
            body = [Row(p.name, f"{len(p.songs)} songs", on_tap=lambda p=p: self.push("playlist", playlist=p),
                        rid="playlist_item", icon=p.name) for p in self.playlists]
            if not body:
                body = [Text("No playlists", rid="empty")]
        return Page("Retro Music", body=self._mini() + body, tabs=tabs, actions=actions,
                    scroll_rid="recycler_view")

    def page_search(self, st: PageState) -> Page:
        q = st.fields.get("query", "").strip().lower()
        hits = [s for s in self.sorted_songs() if q and (q in s.title.lower() or q in s.artist.lower()
                                                         or q in s.album.lower())]
        body: list = [Field("query", "Search songs, artists, albums", rid="search_field"),
                      *self._mini(), *self._song_rows(st, hits)]
        if q and not hits:
            body.append(Text("No results", rid="empty"))
        return Page("Search", nav_back=True, body=body)

    def page_album(self, st: PageState) -> Page:
        name = st.args["album"]
        songs = sorted((s for s in self.songs if s.album == name), key=lambda s: s.track)
        artist = songs[0].artist if songs else ""
        year = songs[0].year if songs else ""
        total = sum(s.duration for s in songs)
        return Page(name, nav_back=True, body=[
            *self._mini(), Text(f"{artist} · {year} · {len(songs)} songs · {mmss(total)}", size="small",
                                rid="album_info"), *self._song_rows(st, songs)])

    def page_artist(self, st: PageState) -> Page:
        name = st.args["artist"]
        songs = sorted((s for s in self.songs if s.artist == name), key=lambda s: (s.year, s.album, s.track))
        total = sum(s.duration for s in songs)
        return Page(name, nav_back=True, body=[*self._mini(), Text(f"{len(songs)} songs · {mmss(total)}", size="small",
                                                                   rid="artist_info"), *self._song_rows(st, songs)])

    def page_playlist(self, st: PageState) -> Page:
        p: Playlist = st.args["playlist"]

        def delete() -> None:
            if p in self.playlists:
                self.playlists.remove(p)
            self.close_dialog()
            self.pop()

        total = sum(s.duration for s in p.songs)
        body: list = [*self._mini(), Text(f"{len(p.songs)} songs · {mmss(total)}", size="small", rid="playlist_info")]
        body.extend(self._song_rows(st, list(p.songs), playlist=p) or [Text("This playlist is empty", rid="empty")])
        return Page(p.name, nav_back=True, body=body, actions=[
            IconButton("Play all", lambda: p.songs and self.play(p.songs[0], p.songs), rid="play_all"),
            IconButton("Delete playlist", lambda: self.dialog(lambda: Dialog(
                "Delete playlist?", f"Delete the playlist “{p.name}”? The songs stay in your library.",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete_playlist"),
        ])

    def page_player(self, st: PageState) -> Page:
        s = self.now
        if s is None:
            return Page("Now playing", nav_back=True, body=[Text("Nothing is playing", rid="empty")])
        body = [Grid([Row("", desc=f"Album art: {s.album}", rid="album_art")], cols=1, tile_h=900, rid="art"),
                Text(s.title, size="title", rid="player_title"),
                Text(f"{s.artist} · {s.album}", rid="player_artist"),
                Text(f"0:00 / {mmss(s.duration)}", size="small", rid="player_time"),
                Buttons([Button("Previous", lambda: self.skip(-1), rid="previous"),
                         Button("Pause" if self.playing else "Play", self.toggle, rid="play_pause"),
                         Button("Next", lambda: self.skip(1), rid="next")], rid="player_controls")]
        return Page("Now playing", nav_back=True, body=body, actions=[
            IconButton("Add to playlist", lambda: self._add_dialog([s]), rid="player_add_to_playlist"),
            IconButton("Song details", lambda: self._details(s), rid="player_details")])
