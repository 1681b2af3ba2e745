"""Broccoli (com.flauschcode.broccoli): a recipe manager — list, favorites, search, long recipe details,
add/edit and delete."""

from __future__ import annotations

from dataclasses import dataclass, field

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import Button, Dialog, Field, IconButton, Page, Row, Text

# title, description, servings, minutes, ingredients, directions
CATALOG: list[tuple[str, str, int, int, list[str], list[str]]] = [
    ("Classic Pancakes", "Fluffy weekend pancakes with maple syrup.", 4, 20,
     ["1.5 cups all-purpose flour", "2 tbsp sugar", "2 tsp baking powder", "1.25 cups milk", "1 egg",
      "3 tbsp melted butter"],
     ["Whisk the flour, sugar and baking powder in a bowl.", "Beat in the milk, egg and melted butter.",
      "Cook ladlefuls on a hot greased pan until bubbles form, then flip.", "Serve warm with maple syrup."]),
    ("Chicken Alfredo Pasta", "Creamy fettuccine with pan-seared chicken.", 4, 35,
     ["400 g fettuccine", "2 chicken breasts", "1 cup heavy cream", "1 cup grated parmesan", "3 cloves garlic",
      "2 tbsp butter"],
     ["Boil the fettuccine in salted water until al dente.", "Sear the seasoned chicken until cooked, then slice.",
      "Melt the butter with the garlic and stir in the cream and parmesan.",
      "Toss the pasta and chicken in the sauce and serve."]),
    ("Greek Salad", "Crisp vegetables with feta and olives.", 2, 15,
     ["2 tomatoes", "1 cucumber", "0.5 red onion", "100 g feta cheese", "12 kalamata olives", "3 tbsp olive oil"],
     ["Chop the tomatoes, cucumber and onion into chunks.", "Add the olives and crumble the feta on top.",
      "Dress with olive oil and a pinch of oregano."]),
    ("Beef Tacos", "Weeknight tacos with seasoned ground beef.", 4, 25,
     ["500 g ground beef", "8 corn tortillas", "1 packet taco seasoning", "1 cup shredded lettuce",
      "1 cup grated cheddar", "0.5 cup salsa"],
     ["Brown the beef in a skillet and drain the fat.", "Stir in the taco seasoning with a splash of water.",
      "Warm the tortillas and fill them with beef, lettuce, cheese and salsa."]),
    ("Vegetable Stir Fry", "Quick stir fry with crunchy vegetables and soy glaze.", 3, 20,
     ["1 red bell pepper", "1 head broccoli", "2 carrots", "200 g snap peas", "3 tbsp soy sauce",
      "1 tbsp sesame oil"],
     ["Slice all the vegetables thinly.", "Stir fry them in sesame oil over high heat for 5 minutes.",
      "Add the soy sauce and toss until glossy.", "Serve over steamed rice."]),
    ("Banana Bread", "Moist loaf made with overripe bananas.", 8, 70,
     ["3 ripe bananas", "0.33 cup melted butter", "0.75 cup sugar", "1 egg", "1 tsp baking soda",
      "1.5 cups all-purpose flour"],
     ["Preheat the oven to 175 C and grease a loaf pan.", "Mash the bananas and mix in the butter, sugar and egg.",
      "Fold in the baking soda and flour.", "Bake for 60 minutes until a skewer comes out clean."]),
    ("Tomato Basil Soup", "Velvety soup with roasted tomatoes.", 4, 45,
     ["1 kg tomatoes", "1 onion", "2 cloves garlic", "2 cups vegetable stock", "1 bunch basil",
      "0.5 cup cream"],
     ["Roast the halved tomatoes with the onion and garlic for 30 minutes.",
      "Blend them with the stock and basil until smooth.", "Simmer for 10 minutes and stir in the cream."]),
    ("Shakshuka", "Eggs poached in a spiced tomato and pepper sauce.", 2, 30,
     ["4 eggs", "1 can crushed tomatoes", "1 red bell pepper", "1 onion", "1 tsp cumin", "1 tsp paprika"],
     ["Saute the onion and pepper until soft.", "Add the spices and tomatoes and simmer for 10 minutes.",
      "Make wells in the sauce and crack in the eggs.", "Cover and cook until the whites are set."]),
    ("Guacamole", "Fresh and chunky avocado dip.", 4, 10,
     ["3 avocados", "1 lime", "0.5 red onion", "1 jalapeno", "2 tbsp cilantro", "1 tsp salt"],
     ["Mash the avocados with the lime juice and salt.", "Fold in the diced onion, jalapeno and cilantro."]),
    ("Mushroom Risotto", "Creamy arborio rice with mushrooms and parmesan.", 4, 50,
     ["1.5 cups arborio rice", "300 g mushrooms", "1 shallot", "5 cups chicken stock", "0.5 cup white wine",
      "0.5 cup grated parmesan"],
     ["Saute the shallot and mushrooms in butter.", "Toast the rice for two minutes, then add the wine.",
      "Add the warm stock one ladle at a time, stirring until absorbed.", "Finish with parmesan and serve."]),
    ("Overnight Oats", "No-cook breakfast jars with berries.", 2, 5,
     ["1 cup rolled oats", "1 cup milk", "0.5 cup greek yogurt", "1 tbsp chia seeds", "1 tbsp honey",
      "0.5 cup blueberries"],
     ["Stir the oats, milk, yogurt, chia and honey together.", "Divide into jars and refrigerate overnight.",
      "Top with blueberries before serving."]),
    ("Lemon Garlic Salmon", "Oven-baked salmon fillets with lemon butter.", 2, 25,
     ["2 salmon fillets", "2 tbsp butter", "3 cloves garlic", "1 lemon", "1 tbsp fresh dill"],
     ["Preheat the oven to 200 C.", "Place the salmon on a tray and top with garlic butter and lemon slices.",
      "Bake for 12 to 15 minutes and sprinkle with dill."]),
    ("Chickpea Curry", "Hearty vegan curry with coconut milk.", 4, 40,
     ["2 cans chickpeas", "1 can coconut milk", "1 onion", "2 tbsp curry paste", "2 cups spinach",
      "1 tbsp grated ginger"],
     ["Fry the onion and ginger until golden.", "Stir in the curry paste and cook for a minute.",
      "Add the chickpeas and coconut milk and simmer for 20 minutes.", "Wilt in the spinach and serve."]),
    ("Caprese Sandwich", "Mozzarella, tomato and basil on ciabatta.", 2, 10,
     ["1 ciabatta loaf", "1 ball fresh mozzarella", "2 tomatoes", "8 basil leaves", "1 tbsp balsamic glaze"],
     ["Slice the ciabatta lengthwise.", "Layer the mozzarella, tomato and basil.",
      "Drizzle with balsamic glaze and close the sandwich."]),
    ("Chocolate Chip Cookies", "Chewy cookies with crisp edges.", 24, 30,
     ["2.25 cups all-purpose flour", "1 cup butter", "0.75 cup brown sugar", "0.75 cup white sugar", "2 eggs",
      "2 cups chocolate chips"],
     ["Cream the butter and sugars until fluffy.", "Beat in the eggs, then mix in the flour.",
      "Fold in the chocolate chips and scoop onto trays.", "Bake at 190 C for 10 minutes."]),
    ("Miso Ramen", "Rich miso broth with noodles and soft eggs.", 2, 35,
     ["2 portions ramen noodles", "3 tbsp white miso", "4 cups chicken stock", "2 soft boiled eggs",
      "2 green onions", "1 sheet nori"],
     ["Bring the stock to a simmer and whisk in the miso.", "Cook the noodles separately and drain.",
      "Pour the broth over the noodles and top with egg, green onion and nori."]),
    ("Stuffed Bell Peppers", "Peppers filled with rice, beef and tomato.", 4, 60,
     ["4 bell peppers", "300 g ground beef", "1 cup cooked rice", "1 cup tomato sauce", "1 cup grated mozzarella"],
     ["Cut the tops off the peppers and remove the seeds.", "Mix the beef, rice and half the tomato sauce.",
      "Stuff the peppers, top with sauce and cheese.", "Bake covered for 40 minutes at 190 C."]),
    ("French Onion Soup", "Caramelized onion soup under melted gruyere.", 4, 75,
     ["5 onions", "3 tbsp butter", "6 cups beef stock", "1 baguette", "1.5 cups grated gruyere"],
     ["Cook the sliced onions in butter slowly for 45 minutes until deep brown.",
      "Add the stock and simmer for 20 minutes.", "Ladle into bowls, top with toasted baguette and gruyere.",
      "Broil until bubbling."]),
    ("Quinoa Buddha Bowl", "Colorful bowl with roasted vegetables and tahini.", 2, 35,
     ["1 cup quinoa", "1 sweet potato", "1 can chickpeas", "2 cups kale", "3 tbsp tahini", "1 lemon"],
     ["Cook the quinoa.", "Roast the cubed sweet potato and chickpeas for 25 minutes.",
      "Massage the kale with lemon juice.", "Assemble the bowls and drizzle with tahini."]),
    ("Apple Crumble", "Warm spiced apples under a buttery oat topping.", 6, 55,
     ["6 apples", "1 tsp cinnamon", "0.5 cup brown sugar", "1 cup rolled oats", "0.5 cup butter",
      "0.5 cup all-purpose flour"],
     ["Slice the apples and toss them with cinnamon and half the sugar.",
      "Rub the butter into the oats, flour and remaining sugar.", "Scatter the topping over the apples.",
      "Bake at 180 C for 40 minutes."]),
    ("Pad Thai", "Stir-fried rice noodles with tamarind and peanuts.", 3, 30,
     ["250 g rice noodles", "200 g shrimp", "2 eggs", "3 tbsp tamarind paste", "2 tbsp fish sauce",
      "0.25 cup crushed peanuts"],
     ["Soak the noodles in hot water until pliable.", "Stir fry the shrimp, then push aside and scramble the eggs.",
      "Add the noodles, tamarind and fish sauce and toss.", "Serve topped with peanuts and lime."]),
    ("Spinach Omelette", "Light omelette with spinach and goat cheese.", 1, 10,
     ["3 eggs", "1 cup spinach", "30 g goat cheese", "1 tsp butter"],
     ["Whisk the eggs with a pinch of salt.", "Wilt the spinach in butter, then pour in the eggs.",
      "Add the goat cheese, fold and serve."]),
    ("Lentil Soup", "Simple red lentil soup with cumin.", 6, 40,
     ["2 cups red lentils", "1 onion", "2 carrots", "1 tsp cumin", "8 cups vegetable stock", "1 lemon"],
     ["Saute the onion and carrots until soft.", "Add the lentils, cumin and stock.",
      "Simmer for 25 minutes and blend partially.", "Finish with lemon juice."]),
    ("Garlic Butter Shrimp", "Shrimp in a garlicky lemon butter sauce.", 3, 15,
     ["500 g shrimp", "4 tbsp butter", "5 cloves garlic", "1 lemon", "2 tbsp parsley"],
     ["Melt the butter and cook the garlic for 30 seconds.", "Add the shrimp and cook for 2 minutes per side.",
      "Squeeze over the lemon and sprinkle with parsley."]),
    ("Blueberry Muffins", "Bakery-style muffins with a sugar crust.", 12, 35,
     ["2 cups all-purpose flour", "0.75 cup sugar", "2 tsp baking powder", "0.5 cup milk", "2 eggs",
      "1.5 cups blueberries"],
     ["Mix the dry ingredients in a bowl.", "Whisk the milk and eggs and stir into the dry mix.",
      "Fold in the blueberries and fill a muffin tin.", "Bake at 200 C for 20 minutes."]),
    ("Margherita Pizza", "Thin crust pizza with tomato, mozzarella and basil.", 2, 40,
     ["1 pizza dough", "0.5 cup tomato sauce", "150 g fresh mozzarella", "6 basil leaves", "1 tbsp olive oil"],
     ["Preheat the oven as hot as it goes.", "Stretch the dough and spread the sauce.",
      "Top with mozzarella and bake for 10 minutes.", "Finish with basil and olive oil."]),
]


def minutes(m: int) -> str:
    return f"{m} mins"


@dataclass(eq=False)
class Recipe:
    title: str
    description: str = ""
    servings: str = ""
    prep_time: str = ""
    ingredients: str = ""  # one per line
    directions: str = ""  # one step per line
    favorite: bool = False
    id: int = 0
    extra: dict = field(default_factory=dict)

    def ingredient_list(self) -> list[str]:
        return [s.strip() for s in self.ingredients.replace(",", "\n").split("\n") if s.strip()]

    def direction_list(self) -> list[str]:
        return [s.strip() for s in self.directions.split("\n") if s.strip()]

    def key(self) -> tuple:
        return (self.title.strip().lower(), self.description.strip().lower(), self.servings, self.prep_time,
                self.ingredients, self.directions)


def from_catalog(entry) -> Recipe:
    title, desc, serv, mins, ingr, dirs = entry
    return Recipe(title, desc, f"{serv} servings", minutes(mins), "\n".join(ingr), "\n".join(dirs))


class Broccoli(App):
    name = "Broccoli"
    package = "com.flauschcode.broccoli"
    color = (76, 140, 74)
    aliases = ("recipes", "broccoli", "broccoli recipes")

    def setup(self) -> None:
        self.next_id = 1
        self.recipes: list[Recipe] = []
        for entry in self.rng.sample(CATALOG, self.rng.randrange(13, 18)):
            self.add(from_catalog(entry))
        for r in self.rng.sample(self.recipes, 2):
            r.favorite = True

    def add(self, r: Recipe) -> Recipe:
        r.id = self.next_id
        self.next_id += 1
        self.recipes.append(r)
        return r

    def find(self, title: str) -> list[Recipe]:
        want = " ".join(title.lower().split())
        return [r for r in self.recipes if " ".join(r.title.lower().split()) == want]

    def ordered(self) -> list[Recipe]:
        return self.shuffled(self.recipes)

    # -- pages
    def _rows(self, recipes: list[Recipe]) -> list:
        return [Row(r.title, r.description or f"{r.servings} · {r.prep_time}".strip(" ·"),
                    on_tap=lambda r=r: self.push("details", recipe=r), rid="recipe_item",
                    icon=r.title) for r in recipes]

    def page_main(self, st: PageState) -> Page:
        tab = st.args.get("tab", "Recipes")
        items = self.ordered() if tab == "Recipes" else [r for r in self.ordered() if r.favorite]
        body = self._rows(items) or [Text("No favorites yet" if tab == "Favorites" else "No recipes yet",
                                          rid="empty")]
        tabs = [Button(t, lambda t=t: st.args.__setitem__("tab", t), rid=f"tab_{t.lower()}", primary=t != tab)
                for t in ("Recipes", "Favorites")]
        return Page("Broccoli" if tab == "Recipes" else "Favorites", body=body, tabs=tabs,
                    actions=[IconButton("Search", lambda: self.push("search"), rid="search")],
                    fab=IconButton("Add recipe", lambda: self.push("edit", recipe=None), rid="fab"),
                    scroll_rid="recipe_list")

    def on_swipe(self, direction: str) -> bool:
        st = self.page
        if st.name != "main":
            return False
        st.args["tab"] = "Favorites" if direction == "left" else "Recipes"
        st.scroll = 0
        return True

    def page_search(self, st: PageState) -> Page:
        q = st.fields.get("query", "").strip().lower()
        hits = [r for r in self.ordered() if q and (q in r.title.lower() or q in r.ingredients.lower())]
        body: list = [Field("query", "Search recipes", rid="search_field"), *self._rows(hits)]
        if q and not hits:
            body.append(Text("No recipes found", rid="empty"))
        return Page("Search", nav_back=True, body=body)

    def page_details(self, st: PageState) -> Page:
        r: Recipe = st.args["recipe"]

        def delete() -> None:
            if r in self.recipes:
                self.recipes.remove(r)
            self.device.toast = "Recipe deleted"
            self.pop()

        def fav() -> None:
            r.favorite = not r.favorite

        body: list = [Text(r.title, size="title", rid="recipe_title")]
        if r.description:
            body.append(Text(r.description, rid="recipe_description"))
        if r.servings:
            body.append(Row(r.servings, "Servings", rid="servings"))
        if r.prep_time:
            body.append(Row(r.prep_time, "Preparation time", rid="preparation_time"))
        body.append(Text("Ingredients", size="header", rid="ingredients_header"))
        body.extend(Text(f"• {s}", rid="ingredient") for s in r.ingredient_list())
        body.append(Text("Directions", size="header", rid="directions_header"))
        body.extend(Text(f"{i}. {s}", rid="direction") for i, s in enumerate(r.direction_list(), 1))
        return Page(r.title, body=body, nav_back=True, scroll_rid="recipe_details", actions=[
            IconButton("Remove from favorites" if r.favorite else "Add to favorites", fav, rid="favorite"),
            IconButton("Edit", lambda: self.push("edit", recipe=r), rid="edit"),
            IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete recipe?", f"Do you really want to delete “{r.title}”?",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete"),
        ])

    def page_edit(self, st: PageState) -> Page:
        r: Recipe | None = st.args.get("recipe")
        if not st.args.get("init"):
            st.args["init"] = True
            if r is not None:
                st.fields.update(title=r.title, description=r.description, servings=r.servings,
                                 prep_time=r.prep_time, ingredients=r.ingredients, directions=r.directions)

        def save() -> None:
            f = st.fields
            title = f.get("title", "").strip()
            if not title:
                self.device.toast = "Title must not be empty"
                return
            target = r or Recipe(title)
            target.title = title
            target.description = f.get("description", "").strip()
            target.servings = f.get("servings", "").strip()
            target.prep_time = f.get("prep_time", "").strip()
            target.ingredients = f.get("ingredients", "").strip()
            target.directions = f.get("directions", "").strip()
            if r is None:
                self.add(target)
            self.device.toast = "Recipe saved"
            self.pop()

        return Page("Edit recipe" if r else "New recipe", nav_back=True, body=[
            Field("title", "Title", rid="title_input", label="Title"),
            Field("description", "Description", rid="description_input", label="Description"),
            Field("servings", "e.g. 4 servings", rid="servings_input", label="Servings"),
            Field("prep_time", "e.g. 30 mins", rid="preparation_time_input", label="Preparation time"),
            Field("ingredients", "One ingredient per line", rid="ingredients_input", label="Ingredients",
                  multiline=True),
            Field("directions", "One step per line", rid="directions_input", label="Directions", multiline=True),
        ], actions=[IconButton("Save", save, rid="save")])
