"""Pro Expense (modelled on arduia's Pro Expense): expense list, details, add/edit, multi-select delete and
a statistics page with monthly totals per category."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import (
    Button,
    Dialog,
    Field,
    IconButton,
    Page,
    Row,
    Stepper,
    Text,
)

CATEGORIES = ["Food", "Housing", "Transportation", "Entertainment", "Clothes", "Health Care", "Education",
              "Social", "Donations", "Others"]

# category -> (name, min dollars, max dollars)
CATALOG: dict[str, list[tuple[str, int, int]]] = {
    "Food": [("Groceries", 35, 140), ("Lunch at Chipotle", 10, 18), ("Coffee at Blue Bottle", 4, 9),
             ("Dinner with friends", 40, 120), ("Bakery", 6, 20), ("Pizza delivery", 18, 40),
             ("Farmers market", 15, 60), ("Sushi takeout", 22, 55), ("Bagels", 7, 16)],
    "Housing": [("Electricity bill", 60, 140), ("Water bill", 25, 60), ("Internet", 45, 80),
                ("Renter's insurance", 12, 30), ("Hardware store", 15, 90), ("Cleaning supplies", 10, 35)],
    "Transportation": [("Gas station", 30, 70), ("Uber ride", 9, 35), ("Metro card top-up", 20, 50),
                       ("Parking", 5, 25), ("Car wash", 12, 30), ("Train ticket", 15, 80)],
    "Entertainment": [("Movie tickets", 14, 36), ("Concert tickets", 45, 150), ("Streaming subscription", 10, 20),
                      ("Bowling night", 20, 50), ("Video game", 20, 70), ("Museum tickets", 15, 45)],
    "Clothes": [("Running shoes", 80, 160), ("Winter jacket", 90, 250), ("T-shirts", 15, 45), ("Jeans", 40, 90),
                ("Rain boots", 30, 75)],
    "Health Care": [("Pharmacy", 8, 45), ("Dentist copay", 25, 80), ("Gym membership", 30, 60),
                    ("Vitamins", 12, 35), ("Eye exam", 40, 120)],
    "Education": [("Online course", 20, 200), ("Textbooks", 30, 120), ("Language lessons", 40, 100),
                  ("Workshop fee", 25, 90)],
    "Social": [("Birthday gift", 20, 80), ("Drinks after work", 15, 50), ("Wedding gift", 75, 200),
               ("Team lunch", 20, 70)],
    "Donations": [("Charity donation", 10, 100), ("Animal shelter", 15, 50), ("Food bank", 10, 60)],
    "Others": [("Haircut", 20, 50), ("Post office", 5, 20), ("Phone case", 10, 30), ("Dry cleaning", 12, 40)],
}
NOTES = ["", "", "", "paid by card", "split with roommate", "monthly", "reimbursable", "weekly shop", "cash",
         "for the trip", "online order", "with coupon"]


def money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def parse_money(s: str) -> int | None:
    t = s.strip().replace("$", "").replace(",", "").replace(" ", "")
    try:
        v = float(t)
    except ValueError:
        return None
    if v <= 0 or v != v or v > 1e9:
        return None
    return int(round(v * 100))


def fmt_date(d: date) -> str:
    return f"{d:%b} {d.day}, {d.year}"


def long_date(d: date) -> str:
    return f"{d:%B} {d.day}, {d.year}"


@dataclass(eq=False)
class Expense:
    id: int
    name: str
    cents: int
    category: str
    day: date
    note: str = ""

    @property
    def amount(self) -> str:
        return money(self.cents)

    def key(self) -> tuple:
        return (self.name.strip().lower(), self.cents, self.category, self.day, self.note.strip().lower())


class ProExpense(App):
    name = "Pro Expense"
    package = "com.arduia.expense"
    color = (0, 137, 123)
    aliases = ("expenses", "expense", "bluecoins", "arduia pro expense")

    def setup(self) -> None:
        self.next_id = 1
        self.expenses: list[Expense] = []
        today = self.device.now.date()
        per_day: dict[date, set[str]] = {}
        n = self.rng.randrange(17, 23)
        # one rent-free household: a monthly bill in each month keeps statistics interesting
        while len(self.expenses) < n:
            cat = self.rng.choice(CATEGORIES)
            name, lo, hi = self.rng.choice(CATALOG[cat])
            day = today - timedelta(days=self.rng.randrange(0, 75))
            names = per_day.setdefault(day, set())
            if name in names or len(names) >= 3:
                continue
            names.add(name)
            cents = self.rng.randrange(lo * 100, hi * 100)
            self.add(name, cents, cat, day, self.rng.choice(NOTES))

    # -- data helpers (also used by tasks)
    def add(self, name: str, cents: int, category: str, day: date, note: str = "") -> Expense:
        e = Expense(self.next_id, name, cents, category, day, note)
        self.next_id += 1
        self.expenses.append(e)
        return e

    def ordered(self) -> list[Expense]:
        return sorted(self.expenses, key=lambda e: (e.day, e.id), reverse=True)

    def find(self, name: str) -> list[Expense]:
        want = " ".join(name.lower().split())
        return [e for e in self.expenses if " ".join(e.name.lower().split()) == want]

    def month_total(self, year: int, month: int, category: str | None = None) -> int:
        return sum(e.cents for e in self.expenses if e.day.year == year and e.day.month == month
                   and (category is None or e.category == category))


    # -- pages
    def page_main(self, st: PageState) -> Page:
        sel: list[int] = st.args.setdefault("sel", [])
        rows: list = []
        for e in self.ordered():
            if sel:
                def toggle(e=e) -> None:
                    if e.id in sel:
                        sel.remove(e.id)
                    else:
                        sel.append(e.id)
                rows.append(Row(e.name, f"{e.category} · {fmt_date(e.day)}", on_tap=toggle, on_long=toggle,
                                rid="expense_item", selected=e.id in sel, trailing=Text(e.amount, rid="amount")))
            else:
                rows.append(Row(e.name, f"{e.category} · {fmt_date(e.day)}",
                                on_tap=lambda e=e: self.push("details", expense=e),
                                on_long=lambda e=e: sel.append(e.id), rid="expense_item",
                                trailing=Text(e.amount, rid="amount")))
        if not rows:
            rows = [Text("No expenses yet", rid="empty")]
        if sel:
            def delete_selected() -> None:
                ids = set(sel)
                self.expenses = [e for e in self.expenses if e.id not in ids]
                sel.clear()
                self.close_dialog()

            n = len(sel)
            confirm = IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete expenses?", f"{n} selected expense{'s' if n != 1 else ''} will be deleted permanently.",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete_selected, rid="confirm_delete")])), rid="delete")
            return Page(f"{n} selected", body=rows, nav_back=True, actions=[confirm], scroll_rid="expense_list")
        total = sum(e.cents for e in self.expenses)
        return Page("Pro Expense", body=[Text(f"Total expenses: {money(total)}", rid="total", size="small"), *rows],
                    actions=[IconButton("Statistics", lambda: self.push("stats"), rid="statistics")],
                    fab=IconButton("Add expense", lambda: self.push("edit", expense=None), rid="fab"),
                    scroll_rid="expense_list")

    def page_details(self, st: PageState) -> Page:
        e: Expense = st.args["expense"]

        def delete() -> None:
            if e in self.expenses:
                self.expenses.remove(e)
            self.pop()

        body = [Row(e.name, "Name", rid="detail_name"), Row(e.amount, "Amount", rid="detail_amount"),
                Row(e.category, "Category", rid="detail_category"), Row(long_date(e.day), "Date", rid="detail_date"),
                Row(e.note or "—", "Note", rid="detail_note")]
        return Page("Expense details", body=body, nav_back=True, actions=[
            IconButton("Edit", lambda: self.push("edit", expense=e), rid="edit"),
            IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete expense?", f"“{e.name}” ({e.amount}) will be deleted permanently.",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete"),
        ])

    def page_edit(self, st: PageState) -> Page:
        e: Expense | None = st.args.get("expense")
        if "cat" not in st.args:
            if e is not None:
                st.fields.update(name=e.name, amount=f"{e.cents / 100:.2f}", note=e.note)
                st.args.update(cat=e.category, day=e.day)
            else:
                st.args.update(cat="Others", day=self.device.now.date())

        def save() -> None:
            f = st.fields
            name = f.get("name", "").strip()
            cents = parse_money(f.get("amount", ""))
            if not name:
                self.device.toast = "Name is required"
                return
            if cents is None:
                self.device.toast = "Enter a valid amount"
                return
            if e is None:
                self.add(name, cents, st.args["cat"], st.args["day"], f.get("note", "").strip())
            else:
                e.name, e.cents, e.category, e.day = name, cents, st.args["cat"], st.args["day"]
                e.note = f.get("note", "").strip()
            self.device.toast = "Saved"
            self.pop()

        def choose(cat: str) -> None:
            st.args["cat"] = cat
            self.close_dialog()

        def pick_category() -> None:
            st.focus = None
            self.dialog(lambda: Dialog("Select category", body=[
                Row(c, on_tap=lambda c=c: choose(c), rid="category_option", selected=c == st.args["cat"])
                for c in CATEGORIES], buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False)]))

        def shift(days: int) -> None:
            st.args["day"] = st.args["day"] + timedelta(days=days)

        return Page("Edit expense" if e else "Add expense", nav_back=True, body=[
            Field("name", "Expense name", rid="name", label="Name"),
            Field("amount", "0.00", rid="amount_input", label="Amount ($)"),
            Row(st.args["cat"], "Category", on_tap=pick_category, rid="category"),
            Stepper("Date", fmt_date(st.args["day"]), lambda: shift(-1), lambda: shift(1), rid="date_picker"),
            Field("note", "Note (optional)", rid="note", label="Note", multiline=True),
        ], actions=[IconButton("Save", save, rid="save")])

    def page_stats(self, st: PageState) -> Page:
        today = self.device.now.date()
        y, m = st.args.setdefault("ym", (today.year, today.month))

        def shift(k: int) -> None:
            yy, mm = st.args["ym"]
            mm += k
            if mm == 0:
                yy, mm = yy - 1, 12
            elif mm == 13:
                yy, mm = yy + 1, 1
            st.args["ym"] = (yy, mm)

        month_items = [e for e in self.expenses if e.day.year == y and e.day.month == m]
        per: dict[str, list[int]] = {}
        for e in month_items:
            per.setdefault(e.category, []).append(e.cents)
        body: list = [
            Stepper("Month", date(y, m, 1).strftime("%B %Y"), lambda: shift(-1), lambda: shift(1), rid="month_picker"),
            Row(money(sum(e.cents for e in month_items)), f"Total spent · {len(month_items)} expenses",
                rid="month_total"),
            Text("By category", size="header", rid="by_category"),
        ]
        for cat, cents in sorted(per.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
            n = len(cents)
            body.append(Row(cat, f"{n} expense{'s' if n != 1 else ''}", rid="category_total",
                            trailing=Text(money(sum(cents)), rid="amount")))
        if not per:
            body.append(Text("No expenses this month", rid="empty"))
        return Page("Statistics", body=body, nav_back=True)
