"""AndroidLab-like tasks in Broccoli (recipe queries and edits, with sub-goals)."""

from __future__ import annotations

from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_recipes import _app, open_recipe

UNITS = {"cup", "cups", "tbsp", "tsp", "g", "kg", "cloves", "can", "cans", "packet", "bunch", "head", "ball",
         "sheet", "portions", "loaf", "fillets", "leaves"}
NEW_TITLES = ["Grandma's Meatballs", "Spicy Peanut Noodles", "Roasted Veggie Tray", "Sunday Pot Roast",
              "Cucumber Yogurt Dip", "Matcha Smoothie", "Honey Glazed Carrots", "Black Bean Burgers",
              "Coconut Rice", "Peach Cobbler", "Zucchini Fritters", "Teriyaki Tofu", "Corn Chowder",
              "Mango Salsa", "Baked Ziti", "Pumpkin Soup", "Falafel Wraps", "Berry Parfait", "Chili con Carne",
              "Potato Leek Soup"]


def split_ingredient(line: str) -> tuple[str, str]:
    """'1.5 cups all-purpose flour' -> ('1.5 cups', 'all-purpose flour'); '3 eggs' -> ('3', 'eggs')."""
    parts = line.split()
    if len(parts) >= 3 and parts[1] in UNITS:
        return " ".join(parts[:2]), " ".join(parts[2:])
    return parts[0], " ".join(parts[1:])


def _on_details(dev, title: str) -> bool:
    app = _app(dev)
    return dev.foreground == "Broccoli" and app.page.name == "details" and app.page.args["recipe"].title == title


class LabRecipeIngredientQuantity(Template):
    suite = "lab"
    name = "recipe_ingredient_quantity"
    template = "How much {item} do I need for the {title} recipe?"
    difficulty = "easy"
    apps = ("Broccoli",)
    complexity = 1.5
    task_type = "query"

    def sample(self, rng, dev):
        r = rng.choice(_app(dev).recipes)
        line = rng.choice(r.ingredient_list())
        qty, item = split_ingredient(line)
        return {"title": r.title, "item": item, "qty": qty, "line": line}

    def check(self, dev, p):
        return answer_matches(dev.answer, [p["qty"], p["line"]])

    def subgoals(self, p):
        return [("recipe opened", lambda dev: _on_details(dev, p["title"]) or self.check(dev, p)),
                ("quantity reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield from open_recipe(x, p["title"])
        for _ in range(x.MAX_SCROLLS):
            hit = next((e for e in x.s.find_all(rid="ingredient") if split_ingredient(e.text.lstrip("• "))[1]
                        == p["item"]), None)
            if hit is not None:
                yield x.finish(split_ingredient(hit.text.lstrip("• "))[0])
                return
            yield x.swipe("up", "short")


class LabRecipeFavorite(Template):
    suite = "lab"
    name = "recipe_add_favorite"
    template = "Add the {title} recipe to my favorites."
    difficulty = "easy"
    apps = ("Broccoli",)
    complexity = 1.2

    def sample(self, rng, dev):
        app = _app(dev)
        r = rng.choice([r for r in app.recipes if not r.favorite])
        return {"title": r.title, "favs": sum(k.favorite for k in app.recipes)}

    def check(self, dev, p):
        rs = _app(dev).recipes
        hit = _app(dev).find(p["title"])
        return bool(hit) and hit[0].favorite and sum(k.favorite for k in rs) == p["favs"] + 1

    def subgoals(self, p):
        return [("recipe opened", lambda dev: _on_details(dev, p["title"]) or self.check(dev, p)),
                ("recipe marked as favorite", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield from open_recipe(x, p["title"])
        yield x.tap(desc="Add to favorites")
        yield x.finish()


def _digits(s: str) -> str:
    return "".join(ch for ch in s if ch.isdigit())


class LabRecipeCreate(Template):
    suite = "lab"
    name = "recipe_create_basic"
    template = "Create a new recipe called '{title}' that serves {servings} and takes {minutes} minutes to prepare."
    difficulty = "medium"
    apps = ("Broccoli",)
    complexity = 1.5

    def sample(self, rng, dev):
        have = {r.title for r in _app(dev).recipes}
        title = rng.choice([t for t in NEW_TITLES if t not in have])
        return {"title": title, "servings": rng.choice([1, 2, 3, 4, 6, 8]), "minutes": rng.choice(range(10, 95, 5)),
                "n": len(_app(dev).recipes)}

    def _found(self, dev, p):
        hit = _app(dev).find(p["title"])
        return hit[0] if len(hit) == 1 else None

    def check(self, dev, p):
        r = self._found(dev, p)
        return (r is not None and len(_app(dev).recipes) == p["n"] + 1 and _digits(r.servings) == str(p["servings"])
                and _digits(r.prep_time) == str(p["minutes"]))

    def subgoals(self, p):
        return [("recipe created", lambda dev: self._found(dev, p) is not None),
                ("servings set", lambda dev: (r := self._found(dev, p)) is not None
                 and _digits(r.servings) == str(p["servings"])),
                ("preparation time set", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Broccoli")
        yield x.tap(desc="Add recipe")
        yield from x.fill("title_input", p["title"])
        yield from x.fill("servings_input", f"{p['servings']} servings")
        yield from x.fill("preparation_time_input", f"{p['minutes']} mins")
        yield x.tap(desc="Save")
        yield x.finish()
