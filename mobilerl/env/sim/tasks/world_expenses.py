"""AndroidWorld-like tasks in Pro Expense (and the lifestyle group's shared expert helpers).

The helpers read list rows off the current screen (a row's title / subtitle / trailing texts are the
TextViews inside its bounds) and scroll to find rows, so the experts never look at hidden app state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.expenses import CATALOG, CATEGORIES, ProExpense, fmt_date, long_date, money
from mobilerl.env.sim.screen import El, Screen
from mobilerl.env.sim.tasks.base import Expert, ExpertError, Template, answer_matches

# ------------------------------------------------------------------------------------------ expert helpers


def inside(a: tuple, b: tuple) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] <= b[3]


def row_texts(s: Screen, row: El) -> dict[str, str]:
    """rid -> text of the TextViews inside a row (title, subtitle, trailing texts)."""
    out: dict[str, str] = {}
    b = row.bounds
    for e in s.els:
        if e is not row and e.text and e.rid and inside(e.bounds, b):
            out.setdefault(e.rid, e.text)
    return out


def rows(s: Screen, rid: str) -> list[tuple[El, dict[str, str]]]:
    return [(r, row_texts(s, r)) for r in s.find_all(rid=rid)]


def must(items, what: str):
    """The first of ``items``, or an ExpertError naming what is missing from the screen."""
    for it in items:
        return it
    raise ExpertError(f"not on screen: {what}")


def visible_row(x: Expert, rid: str, pred: Callable[[El, dict[str, str]], bool]) -> El:
    return must((r for r, t in rows(x.s, rid) if "title" in t and pred(r, t)), f"row {rid!r}")


def seek_row(x: Expert, rid: str, pred: Callable[[El, dict[str, str]], bool], first: str = "up",
             fallback: bool = True) -> Iterator[Action]:
    """Scroll (first ``first``, then back the other way) until a row satisfying ``pred`` is on screen.

    Use as ``row = yield from seek_row(...)``; returns the row's El.
    """
    dirs = [first, "down" if first == "up" else "up"] if fallback else [first]
    for d in dirs:
        for _ in range(x.MAX_SCROLLS):
            for r, t in rows(x.s, rid):
                if "title" in t and pred(r, t):
                    return r
            before = x.s.xml
            yield x.swipe(d, "medium")
            if x.s.xml == before:
                break
    raise ExpertError(f"no row {rid!r} matching the predicate on {x.s.title!r}")


def scan_rows(x: Expert, rid: str) -> Iterator[Action]:
    """Scroll from the current position to the end of the list; return every row's texts in list order
    (rows seen on overlapping screens are matched by their offset, so repeated rows are kept apart)."""
    found: dict[int, dict[str, str]] = {}
    offset = 0
    prev: list[tuple[int, dict[str, str]]] | None = None
    for _ in range(x.MAX_SCROLLS * 2):
        cur_rows = [(r, t) for r, t in rows(x.s, rid) if "title" in t]
        full_h = max((r.bounds[3] - r.bounds[1] for r, _ in cur_rows), default=0)
        cur = [(r.bounds[1], t) for r, t in cur_rows if r.bounds[3] - r.bounds[1] == full_h]
        if prev is not None:
            def key(t: dict[str, str]) -> tuple:
                return tuple(sorted(t.items()))
            pk = [key(t) for _, t in prev]
            ck = [key(t) for _, t in cur]
            votes: dict[int, int] = {}  # candidate shifts, voted by rows that look the same on both screens
            for (py, _pt), k in zip(prev, pk, strict=True):
                for (cy, _ct), k2 in zip(cur, ck, strict=True):
                    if k2 == k:
                        votes[py - cy] = votes.get(py - cy, 0) + 1
            if not votes:
                raise ExpertError("lost track of the list while scrolling")
            offset += max(votes, key=lambda v: (votes[v], -abs(v)))
        for y, t in cur:
            found.setdefault(y + offset, t)
        prev = cur
        before = x.s.xml
        yield x.swipe("up", "medium")
        if x.s.xml == before:
            break
    return [found[k] for k in sorted(found)]


def money_cents(s: str) -> int:
    return int(round(float(s.replace("$", "").replace(",", "").strip()) * 100))


def parse_day(s: str) -> date:
    return datetime.strptime(s.strip(), "%b %d, %Y").date()


# ------------------------------------------------------------------------------------------- app helpers


def _app(dev) -> ProExpense:
    return dev.app("Pro Expense")


def _dollars(cents: int) -> str:
    return f"{cents / 100:.2f}"


def _new_expense(rng, dev, avoid: set[str], day: date | None = None, note: bool = True) -> dict:
    existing = {e.name.lower() for e in _app(dev).expenses} | {a.lower() for a in avoid}
    while True:
        cat = rng.choice(CATEGORIES)
        name, lo, hi = rng.choice(CATALOG[cat])
        if name.lower() not in existing:
            break
    cents = rng.randrange(lo * 100, hi * 100)
    d = {"name": name, "cents": cents, "amount": _dollars(cents), "category": cat,
         "note": rng.choice(["paid by card", "split with Alex", "reimbursable", "cash", "birthday", "weekend",
                             "for the office", "with coupon", "monthly plan", "gift for mom"]) if note else "",
         "date": (day or dev.now.date()).isoformat()}
    return d


def _matches(e, spec: dict) -> bool:
    return (" ".join(e.name.lower().split()) == spec["name"].lower() and e.cents == spec["cents"]
            and e.category == spec["category"] and e.day.isoformat() == spec["date"]
            and " ".join(e.note.lower().split()) == " ".join(spec["note"].lower().split()))


def _describe(spec: dict, with_date: bool) -> str:
    parts = [f"name '{spec['name']}'", f"amount ${spec['amount']}", f"category {spec['category']}"]
    if with_date:
        parts.append(f"date {long_date(date.fromisoformat(spec['date']))}")
    if spec["note"]:
        parts.append(f"note '{spec['note']}'")
    return ", ".join(parts)


def set_date(x: Expert, target: date, rid: str = "date_picker") -> Iterator[Action]:
    """Press the date Stepper until it shows ``target`` (read back from the screen each time)."""
    yield from x.hide_keyboard()
    yield from x.scroll_to(rid=rid + "_value")
    for _ in range(60):
        shown = parse_day(x.el(rid=rid + "_value").text)
        if shown == target:
            return
        yield x.tap(desc="Decrease date" if shown > target else "Increase date")
    raise ExpertError("date picker did not reach the target")


def add_expense(x: Expert, spec: dict, with_date: bool) -> Iterator[Action]:
    """From the expense list: open the form, fill it in and save."""
    yield x.tap(desc="Add expense")
    yield from x.fill("name", spec["name"])
    yield from x.fill("amount_input", spec["amount"])
    cat_row = x.el(rid="category")
    if row_texts(x.s, cat_row).get("title") != spec["category"]:
        yield x.tap(rid="category")
        yield x.tap(text=spec["category"])
    if spec["note"]:
        yield from x.fill("note", spec["note"])
    if with_date:
        yield from set_date(x, date.fromisoformat(spec["date"]))
    yield x.tap(desc="Save")


# --------------------------------------------------------------------------------------------- templates


class ExpenseAddSingle(Template):
    name = "ExpenseAddSingle"
    template = "Add the following expense in Pro Expense: {desc}."
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("Pro Expense",)
    complexity = 1.8

    def sample(self, rng, dev):
        spec = _new_expense(rng, dev, set())
        return {"expense": spec, "desc": _describe(spec, False), "n": len(_app(dev).expenses)}

    def check(self, dev, p):
        es = _app(dev).expenses
        return len(es) == p["n"] + 1 and sum(_matches(e, p["expense"]) for e in es) == 1

    def subgoals(self, p):
        return [("an expense with the right name exists",
                 lambda dev: any(e.name.lower() == p["expense"]["name"].lower() for e in _app(dev).expenses)),
                ("the expense is saved with all details", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        yield from add_expense(x, p["expense"], with_date=False)
        yield x.finish()


class ExpenseAddMultiple(Template):
    name = "ExpenseAddMultiple"
    template = "Add the following expenses into Pro Expense: {desc}."
    difficulty = "hard"
    tags = ("data_entry", "parameterized", "repetition")
    apps = ("Pro Expense",)
    complexity = 5.0

    def sample(self, rng, dev):
        specs: list[dict] = []
        today = dev.now.date()
        for _ in range(3):
            day = today - timedelta(days=rng.randrange(0, 4))
            specs.append(_new_expense(rng, dev, {s["name"] for s in specs}, day=day))
        return {"expenses": specs, "desc": "; ".join(f"({i}) {_describe(s, True)}" for i, s in enumerate(specs, 1)),
                "n": len(_app(dev).expenses)}

    def check(self, dev, p):
        es = _app(dev).expenses
        return len(es) == p["n"] + len(p["expenses"]) and all(
            sum(_matches(e, s) for e in es) == 1 for s in p["expenses"])

    def subgoals(self, p):
        return [(f"expense {i} added", lambda dev, s=s: any(_matches(e, s) for e in _app(dev).expenses))
                for i, s in enumerate(p["expenses"], 1)] + [("all expenses added", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        for spec in p["expenses"]:
            yield from add_expense(x, spec, with_date=True)
        yield x.finish()


def _unique_named(app: ProExpense) -> list:
    counts: dict[str, int] = {}
    for e in app.expenses:
        counts[e.name.lower()] = counts.get(e.name.lower(), 0) + 1
    return [e for e in app.expenses if counts[e.name.lower()] == 1]


def _row_is(e_spec: dict) -> Callable[[El, dict[str, str]], bool]:
    return lambda r, t: t.get("title") == e_spec["name"] and t.get("amount") == e_spec["money"]


class ExpenseDeleteSingle(Template):
    name = "ExpenseDeleteSingle"
    template = "Delete the expense '{name}' ({money}) from Pro Expense."
    difficulty = "easy"
    tags = ("data_edit", "screen_reading", "parameterized")
    apps = ("Pro Expense",)
    complexity = 1.6

    def sample(self, rng, dev):
        e = rng.choice(_unique_named(_app(dev)))
        return {"name": e.name, "money": e.amount, "id": e.id, "n": len(_app(dev).expenses)}

    def check(self, dev, p):
        es = _app(dev).expenses
        return len(es) == p["n"] - 1 and all(e.id != p["id"] for e in es)

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        row = yield from seek_row(x, "expense_item", _row_is(p))
        yield Action("Tap", element=row.bounds)
        yield x.tap(desc="Delete")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()


def select_rows(x: Expert, rid: str, preds: list[Callable[[El, dict[str, str]], bool]]) -> Iterator[Action]:
    """Enter selection mode with a long press on the first match, then tap the others."""
    selecting = False
    for pred in preds:
        row = yield from seek_row(x, rid, lambda r, t, pred=pred: pred(r, t) and not r.selected)
        yield Action("Long Press" if not selecting else "Tap", element=row.bounds)
        selecting = True


class ExpenseDeleteMultiple(Template):
    name = "ExpenseDeleteMultiple"
    template = "Delete the following expenses from Pro Expense: {desc}."
    difficulty = "medium"
    tags = ("data_edit", "parameterized", "repetition")
    apps = ("Pro Expense",)
    complexity = 2.5

    def sample(self, rng, dev):
        picks = rng.sample(_unique_named(_app(dev)), 3)
        specs = [{"name": e.name, "money": e.amount, "id": e.id} for e in picks]
        return {"targets": specs, "desc": ", ".join(f"'{s['name']}' ({s['money']})" for s in specs),
                "n": len(_app(dev).expenses)}

    def check(self, dev, p):
        es = _app(dev).expenses
        gone = {s["id"] for s in p["targets"]}
        return len(es) == p["n"] - len(gone) and not any(e.id in gone for e in es)

    def subgoals(self, p):
        return [(f"'{s['name']}' deleted", lambda dev, s=s: all(e.id != s["id"] for e in _app(dev).expenses))
                for s in p["targets"]] + [("exactly those expenses deleted", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        yield from select_rows(x, "expense_item", [_row_is(s) for s in p["targets"]])
        yield x.tap(desc="Delete")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()


def _row_key(t: dict[str, str]) -> tuple:
    return (t.get("title"), t.get("subtitle"), t.get("amount"))


class ExpenseDeleteDuplicates(Template):
    name = "ExpenseDeleteDuplicates"
    template = ("Delete all but one of any expenses in Pro Expense that are exact duplicates, ensuring at least "
                "one instance of each unique expense remains.")
    difficulty = "medium"
    tags = ("data_edit", "screen_reading", "repetition")
    apps = ("Pro Expense",)
    complexity = 3.0

    def sample(self, rng, dev):
        app = _app(dev)
        picks = rng.sample(app.expenses, 2)
        copies = [1, rng.choice([1, 2])]
        return {"dups": [{"id": e.id, "copies": c} for e, c in zip(picks, copies, strict=True)],
                "n": len(app.expenses), "names": [e.name for e in picks]}

    def setup(self, dev, p):
        app = _app(dev)
        by_id = {e.id: e for e in app.expenses}
        for d in p["dups"]:
            e = by_id[d["id"]]
            for _ in range(d["copies"]):
                app.add(e.name, e.cents, e.category, e.day, e.note)

    def check(self, dev, p):
        es = _app(dev).expenses
        if len(es) != p["n"]:
            return False
        keys = [e.key() for e in es]
        return len(set(keys)) == len(keys)

    def subgoals(self, p):
        def dup_gone(dev, i):
            es = _app(dev).expenses
            name = p["names"][i].lower()
            return sum(e.name.lower() == name for e in es) >= 1 and len({e.key() for e in es if e.name.lower() == name}) \
                == sum(e.name.lower() == name for e in es)
        return [(f"duplicates of '{p['names'][0]}' removed", lambda dev: dup_gone(dev, 0)),
                (f"duplicates of '{p['names'][1]}' removed", lambda dev: dup_gone(dev, 1)),
                ("every expense kept exactly once", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        listed = yield from scan_rows(x, "expense_item")
        counts: dict[tuple, int] = {}
        for t in listed:
            counts[_row_key(t)] = counts.get(_row_key(t), 0) + 1
        preds = []
        for k, c in counts.items():
            preds.extend([lambda r, t, k=k: _row_key(t) == k] * (c - 1))
        selecting = False
        for pred in preds:
            row = yield from seek_row(x, "expense_item", lambda r, t, pred=pred: pred(r, t) and not r.selected,
                                      first="down")
            yield Action("Long Press" if not selecting else "Tap", element=row.bounds)
            selecting = True
        yield x.tap(desc="Delete")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()


def _months(dev) -> list[tuple[int, int]]:
    t = dev.now.date()
    out = []
    y, m = t.year, t.month
    for _ in range(3):
        out.append((y, m))
        y, m = (y - 1, 12) if m == 1 else (y, m - 1)
    return out


def goto_month(x: Expert, month_label: str) -> Iterator[Action]:
    target = datetime.strptime(month_label, "%B %Y")
    for _ in range(24):
        shown = datetime.strptime(x.el(rid="month_picker_value").text, "%B %Y")
        if shown == target:
            return
        yield x.tap(desc="Decrease month" if shown > target else "Increase month")
    raise ExpertError("month picker did not reach the target")


class ExpenseCategoryMonthTotal(Template):
    name = "ExpenseCategoryMonthTotal"
    template = "How much did I spend on {category} in {month} according to Pro Expense? Answer with the amount only."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Pro Expense",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        app = _app(dev)
        options = [(y, m, c) for (y, m) in _months(dev) for c in CATEGORIES if app.month_total(y, m, c)]
        y, m, c = rng.choice(options)
        return {"category": c, "month": date(y, m, 1).strftime("%B %Y"), "total": _dollars(app.month_total(y, m, c))}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["total"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        yield x.tap(desc="Statistics")
        yield from goto_month(x, p["month"])
        row = visible_row(x, "category_total", lambda r, t: t.get("title") == p["category"])
        yield x.finish(row_texts(x.s, row)["amount"])


class ExpenseDayTotal(Template):
    name = "ExpenseDayTotal"
    template = "How much did I spend in total on {day} according to Pro Expense? Answer with the amount only."
    difficulty = "medium"
    tags = ("information_retrieval", "screen_reading", "math_counting", "parameterized")
    apps = ("Pro Expense",)
    complexity = 1.6
    task_type = "query"

    def sample(self, rng, dev):
        app = _app(dev)
        days: dict[date, list[int]] = {}
        for e in app.expenses:
            days.setdefault(e.day, []).append(e.cents)
        multi = [d for d, v in days.items() if len(v) >= 2] or list(days)
        d = rng.choice(sorted(multi))
        return {"day": long_date(d), "short": fmt_date(d), "total": _dollars(sum(days[d]))}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["total"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        target = parse_day(p["short"])
        seen: dict[tuple, int] = {}
        for _ in range(x.MAX_SCROLLS):
            older = False
            for _r, t in rows(x.s, "expense_item"):
                if "amount" not in t or "subtitle" not in t:
                    continue
                d = parse_day(t["subtitle"].rsplit("·", 1)[-1])
                if d == target:
                    seen[_row_key(t)] = money_cents(t["amount"])
                elif d < target:
                    older = True
            if older:
                break
            before = x.s.xml
            yield x.swipe("up", "medium")
            if x.s.xml == before:
                break
        yield x.finish(money(sum(seen.values())))


class ExpenseDeleteCategoryMonth(Template):
    name = "ExpenseDeleteCategoryMonth"
    template = "Delete all of my {category} expenses from {month} in Pro Expense."
    difficulty = "hard"
    tags = ("data_edit", "screen_reading", "complex_ui_understanding", "parameterized")
    apps = ("Pro Expense",)
    complexity = 2.2

    def sample(self, rng, dev):
        app = _app(dev)
        options = []
        for (y, m) in _months(dev):
            for c in CATEGORIES:
                ids = [e.id for e in app.expenses if e.category == c and (e.day.year, e.day.month) == (y, m)]
                if ids:
                    options.append((len(ids) >= 2, y, m, c, ids))
        multi = [o for o in options if o[0]] or options
        _, y, m, c, ids = rng.choice(multi)
        return {"category": c, "month": date(y, m, 1).strftime("%B %Y"), "ids": ids, "n": len(app.expenses)}

    def check(self, dev, p):
        es = _app(dev).expenses
        gone = set(p["ids"])
        return len(es) == p["n"] - len(gone) and not any(e.id in gone for e in es)

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        month = datetime.strptime(p["month"], "%B %Y")

        def wanted(r, t) -> bool:
            if "subtitle" not in t or not t["subtitle"].startswith(p["category"] + " ·"):
                return False
            d = parse_day(t["subtitle"].rsplit("·", 1)[-1])
            return (d.year, d.month) == (month.year, month.month) and not r.selected

        selecting = False
        for _ in range(x.MAX_SCROLLS * 2):
            hit = next((r for r, t in rows(x.s, "expense_item") if "title" in t and wanted(r, t)), None)
            if hit is not None:
                yield Action("Long Press" if not selecting else "Tap", element=hit.bounds)
                selecting = True
                continue
            last = [parse_day(t["subtitle"].rsplit("·", 1)[-1]) for _, t in rows(x.s, "expense_item")
                    if "subtitle" in t]
            if last and (last[-1].year, last[-1].month) < (month.year, month.month):
                break
            before = x.s.xml
            yield x.swipe("up", "medium")
            if x.s.xml == before:
                break
        yield x.tap(desc="Delete")
        yield x.tap(text="Delete", cls="Button")
        yield x.finish()
