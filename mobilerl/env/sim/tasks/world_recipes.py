"""AndroidWorld-like tasks in Broccoli (recipes)."""

from __future__ import annotations

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.recipes import CATALOG, Broccoli, Recipe, from_catalog
from mobilerl.env.sim.tasks.base import Expert, Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import _app as _expenses
from mobilerl.env.sim.tasks.world_expenses import add_expense, row_texts, scan_rows, seek_row


def _app(dev) -> Broccoli:
    return dev.app("Broccoli")


def _norm(s: str) -> str:
    return " ".join(s.lower().replace(",", " , ").split()).strip(" .")


def _lines(s: str) -> list[str]:
    return [_norm(x) for x in s.replace(",", "\n").split("\n") if x.strip()]


def _new_recipes(rng, dev, k: int) -> list[dict]:
    have = {r.title.lower() for r in _app(dev).recipes}
    pool = [c for c in CATALOG if c[0].lower() not in have]
    out = []
    for entry in rng.sample(pool, k):
        r = from_catalog(entry)
        out.append({"title": r.title, "description": r.description, "servings": r.servings, "prep_time": r.prep_time,
                    "ingredients": ", ".join(r.ingredient_list()), "directions": " ".join(r.direction_list())})
    return out


FIELD_RIDS = {"title": "title_input", "description": "description_input", "servings": "servings_input",
              "prep_time": "preparation_time_input", "ingredients": "ingredients_input",
              "directions": "directions_input"}
LABELS = {"title": "title", "description": "description", "servings": "servings", "prep_time": "preparation time",
          "ingredients": "ingredients", "directions": "directions"}


def _matches(r: Recipe, spec: dict, fields: tuple[str, ...]) -> bool:
    for f in fields:
        got = getattr(r, f)
        if f == "ingredients":
            if _lines(got) != _lines(spec[f]):
                return False
        elif _norm(got) != _norm(spec[f]):
            return False
    return True


def _describe(spec: dict, fields: tuple[str, ...]) -> str:
    """'Title: X. Servings: 4 servings. …' (each value ends with exactly one period)."""
    return " ".join(f"{LABELS[f].capitalize()}: {spec[f].rstrip('.')}." for f in fields)


def add_recipe(x: Expert, spec: dict, fields: tuple[str, ...]) -> None:
    yield x.tap(desc="Add recipe")
    for f in fields:
        yield from x.fill(FIELD_RIDS[f], spec[f])
    yield x.tap(desc="Save")


def open_recipe(x: Expert, title: str) -> None:
    row = yield from seek_row(x, "recipe_item", lambda r, t: t.get("title") == title)
    yield Action("Tap", element=row.bounds)


ALL_FIELDS = ("title", "description", "servings", "prep_time", "ingredients", "directions")
MULTI_FIELDS = ("title", "servings", "prep_time", "directions")


class RecipeAddSingle(Template):
    name = "RecipeAddSingle"
    template = "Add the following recipe into the Broccoli app. {desc}"
    difficulty = "easy"
    tags = ("data_entry", "parameterized")
    apps = ("Broccoli",)
    complexity = 2.2

    def sample(self, rng, dev):
        spec = _new_recipes(rng, dev, 1)[0]
        return {"recipe": spec, "desc": _describe(spec, ALL_FIELDS), "n": len(_app(dev).recipes)}

    def check(self, dev, p):
        rs = _app(dev).recipes
        return len(rs) == p["n"] + 1 and sum(_matches(r, p["recipe"], ALL_FIELDS) for r in rs) == 1

    def subgoals(self, p):
        return [("recipe created", lambda dev: bool(_app(dev).find(p["recipe"]["title"]))),
                ("all fields filled in correctly", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield from add_recipe(x, p["recipe"], ALL_FIELDS)
        yield x.finish()


class RecipeAddMultiple(Template):
    name = "RecipeAddMultiple"
    template = "Add the following recipes into the Broccoli app. {desc}"
    difficulty = "hard"
    tags = ("data_entry", "parameterized", "repetition")
    apps = ("Broccoli",)
    complexity = 5.0

    def sample(self, rng, dev):
        specs = _new_recipes(rng, dev, 3)
        return {"recipes": specs, "n": len(_app(dev).recipes),
                "desc": " ".join(f"Recipe {i}) {_describe(s, MULTI_FIELDS)}" for i, s in enumerate(specs, 1))}

    def check(self, dev, p):
        rs = _app(dev).recipes
        return len(rs) == p["n"] + len(p["recipes"]) and all(
            sum(_matches(r, s, MULTI_FIELDS) for r in rs) == 1 for s in p["recipes"])

    def subgoals(self, p):
        return [(f"recipe '{s['title']}' added",
                 lambda dev, s=s: any(_matches(r, s, MULTI_FIELDS) for r in _app(dev).recipes))
                for s in p["recipes"]] + [("all recipes added", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        for spec in p["recipes"]:
            yield from add_recipe(x, spec, MULTI_FIELDS)
        yield x.finish()


class RecipeDeleteDuplicates(Template):
    name = "RecipeDeleteDuplicates"
    template = ("Delete all but one of any recipes in the Broccoli app that are exact duplicates, ensuring at least "
                "one instance of each unique recipe remains.")
    difficulty = "medium"
    tags = ("data_edit", "screen_reading", "repetition")
    apps = ("Broccoli",)
    complexity = 3.0

    def sample(self, rng, dev):
        app = _app(dev)
        picks = rng.sample(app.recipes, 2)
        return {"dups": [{"title": r.title, "copies": c} for r, c in zip(picks, [1, rng.choice([1, 2])], strict=True)],
                "n": len(app.recipes)}

    def setup(self, dev, p):
        app = _app(dev)
        for d in p["dups"]:
            r = app.find(d["title"])[0]
            for _ in range(d["copies"]):
                app.add(Recipe(r.title, r.description, r.servings, r.prep_time, r.ingredients, r.directions))

    def check(self, dev, p):
        rs = _app(dev).recipes
        keys = [r.key() for r in rs]
        return len(rs) == p["n"] and len(set(keys)) == len(keys)

    def subgoals(self, p):
        return [(f"one '{d['title']}' left", lambda dev, d=d: len(_app(dev).find(d["title"])) == 1)
                for d in p["dups"]] + [("every recipe kept exactly once", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        listed = yield from scan_rows(x, "recipe_item")
        counts: dict[tuple, int] = {}
        for t in listed:
            k = (t.get("title"), t.get("subtitle"))
            counts[k] = counts.get(k, 0) + 1
        for (title, sub), c in counts.items():
            for _ in range(c - 1):
                row = yield from seek_row(x, "recipe_item",
                                          lambda r, t, a=title, b=sub: (t.get("title"), t.get("subtitle")) == (a, b),
                                          first="down")
                yield Action("Tap", element=row.bounds)
                yield x.tap(desc="Delete")
                yield x.tap(text="Delete", cls="Button")
        yield x.finish()


class RecipeServings(Template):
    name = "RecipeServings"
    template = "How many servings does the recipe '{title}' in Broccoli make? Answer with a number."
    difficulty = "easy"
    tags = ("information_retrieval", "screen_reading", "parameterized")
    apps = ("Broccoli",)
    complexity = 1.2
    task_type = "query"

    def sample(self, rng, dev):
        r = rng.choice(_app(dev).recipes)
        return {"title": r.title, "servings": r.servings.split()[0]}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["servings"], numeric=True)

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield from open_recipe(x, p["title"])
        servings = row_texts(x.s, x.el(rid="servings"))["title"]
        yield x.finish(servings.split()[0])


class RecipeDeleteMultiple(Template):
    name = "RecipeDeleteMultiple"
    template = "Delete the following recipes from the Broccoli app: {titles}."
    difficulty = "medium"
    tags = ("data_edit", "parameterized", "repetition")
    apps = ("Broccoli",)
    complexity = 2.0

    def sample(self, rng, dev):
        app = _app(dev)
        titles = [r.title for r in rng.sample(app.recipes, 3)]
        return {"targets": titles, "titles": ", ".join(f"'{t}'" for t in titles), "n": len(app.recipes)}

    def check(self, dev, p):
        app = _app(dev)
        return len(app.recipes) == p["n"] - len(p["targets"]) and not any(app.find(t) for t in p["targets"])

    def subgoals(self, p):
        return [(f"'{t}' deleted", lambda dev, t=t: not _app(dev).find(t)) for t in p["targets"]] + [
            ("only those recipes deleted", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        for t in p["targets"]:
            yield from open_recipe(x, t)
            yield x.tap(desc="Delete")
            yield x.tap(text="Delete", cls="Button")
        yield x.finish()


def read_ingredients(x: Expert) -> list[str]:
    """On a recipe's details page: scroll until the directions header shows, collecting ingredient lines."""
    out: list[str] = []
    for _ in range(x.MAX_SCROLLS):
        for e in x.s.find_all(rid="ingredient"):
            line = e.text.lstrip("• ").strip()
            if line not in out:
                out.append(line)
        if x.s.find(rid="directions_header") is not None:
            return out
        yield x.swipe("up", "short")
    return out


class ExpenseAddFromRecipe(Template):
    name = "ExpenseAddFromRecipe"
    template = ("I spent ${amount} on groceries for the recipe '{title}' in Broccoli. Add this to Pro Expense as an "
                "expense named '{expense}' in the Food category, with the recipe's ingredients in the note, "
                "separated by commas.")
    difficulty = "hard"
    tags = ("multi_app", "transcription", "memorization", "data_entry", "parameterized")
    apps = ("Broccoli", "Pro Expense")
    complexity = 2.8

    def sample(self, rng, dev):
        r = rng.choice(_app(dev).recipes)
        cents = rng.randrange(1200, 6500)
        return {"title": r.title, "expense": f"{r.title} groceries", "amount": f"{cents / 100:.2f}", "cents": cents,
                "ingredients": r.ingredient_list(), "date": dev.now.date().isoformat(),
                "n": len(_expenses(dev).expenses)}

    def _ok(self, e, p) -> bool:
        return (_norm(e.name) == _norm(p["expense"]) and e.cents == p["cents"] and e.category == "Food"
                and e.day.isoformat() == p["date"] and _lines(e.note) == [_norm(i) for i in p["ingredients"]])

    def check(self, dev, p):
        es = _expenses(dev).expenses
        return len(es) == p["n"] + 1 and sum(self._ok(e, p) for e in es) == 1

    def subgoals(self, p):
        return [("expense created", lambda dev: any(_norm(e.name) == _norm(p["expense"])
                                                    for e in _expenses(dev).expenses)),
                ("expense has the amount, category and ingredient note", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield from open_recipe(x, p["title"])
        ingredients = yield from read_ingredients(x)
        spec = {"name": p["expense"], "amount": p["amount"], "category": "Food", "note": ", ".join(ingredients)}
        yield from x.launch("Pro Expense")
        yield from add_expense(x, spec, with_date=False)
        yield x.finish()
