"""AndroidLab-like tasks in Pro Expense (the Bluecoins family: queries and bookkeeping operations)."""

from __future__ import annotations

from datetime import timedelta

from mobilerl.env.actions import Action
from mobilerl.env.sim.apps.expenses import fmt_date, long_date
from mobilerl.env.sim.tasks.base import Template, answer_matches
from mobilerl.env.sim.tasks.world_expenses import (
    _app,
    _describe,
    _matches,
    _new_expense,
    add_expense,
    row_texts,
    seek_row,
)


def _on_details(dev, eid: int) -> bool:
    app = _app(dev)
    return dev.foreground == "Pro Expense" and any(
        st.name in ("details", "edit") and getattr(st.args.get("expense"), "id", None) == eid for st in app.stack)


def _row(p):
    return lambda r, t: t.get("amount") == p["money"] and t.get("subtitle", "").endswith(p["short"])


class LabExpenseReasonQuery(Template):
    suite = "lab"
    name = "expense_reason_query"
    template = "What was the reason behind the {money} I spent on {day}?"
    difficulty = "easy"
    apps = ("Pro Expense",)
    complexity = 1.5
    task_type = "query"

    def sample(self, rng, dev):
        es = _app(dev).expenses
        keys = [(e.cents, e.day) for e in es]
        e = rng.choice([e for e in es if e.note and keys.count((e.cents, e.day)) == 1])
        return {"money": e.amount, "day": long_date(e.day), "short": fmt_date(e.day), "note": e.note, "id": e.id}

    def check(self, dev, p):
        return answer_matches(dev.answer, p["note"])

    def subgoals(self, p):
        return [("expense opened", lambda dev: _on_details(dev, p["id"]) or self.check(dev, p)),
                ("reason reported", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        row = yield from seek_row(x, "expense_item", _row(p))
        yield Action("Tap", element=row.bounds)
        yield x.finish(row_texts(x.s, x.el(rid="detail_note"))["title"])


class LabExpenseLogDated(Template):
    suite = "lab"
    name = "expense_log_dated"
    template = "For {day}, record an expenditure of ${amount} called '{name}' in {category}, marked as '{note}'."
    difficulty = "medium"
    apps = ("Pro Expense",)
    complexity = 2.2

    def sample(self, rng, dev):
        day = dev.now.date() - timedelta(days=rng.randrange(1, 6))
        spec = _new_expense(rng, dev, set(), day=day)
        return {"expense": spec, "day": long_date(day), "amount": spec["amount"], "name": spec["name"],
                "category": spec["category"], "note": spec["note"], "n": len(_app(dev).expenses),
                "desc": _describe(spec, True)}

    def check(self, dev, p):
        es = _app(dev).expenses
        return len(es) == p["n"] + 1 and sum(_matches(e, p["expense"]) for e in es) == 1

    def subgoals(self, p):
        s = p["expense"]

        def named(dev):
            return [e for e in _app(dev).expenses if e.name.lower() == s["name"].lower()]

        return [("expense created", lambda dev: bool(named(dev))),
                ("amount and category right", lambda dev: any(e.cents == s["cents"] and e.category == s["category"]
                                                              for e in named(dev))),
                ("dated and noted correctly", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        yield from add_expense(x, p["expense"], with_date=True)
        yield x.finish()


class LabExpenseAdjustAmount(Template):
    suite = "lab"
    name = "expense_adjust_amount"
    template = "Adjust the expense '{name}' on {day} to ${amount}."
    difficulty = "medium"
    apps = ("Pro Expense",)
    complexity = 1.6

    def sample(self, rng, dev):
        es = _app(dev).expenses
        keys = [(e.name, e.day) for e in es]
        e = rng.choice([e for e in es if keys.count((e.name, e.day)) == 1])
        cents = rng.randrange(500, 20000)
        while cents == e.cents:
            cents += 100
        return {"name": e.name, "day": long_date(e.day), "short": fmt_date(e.day), "amount": f"{cents / 100:.2f}",
                "cents": cents, "id": e.id, "n": len(es), "total": sum(k.cents for k in es) - e.cents + cents}

    def check(self, dev, p):
        es = _app(dev).expenses
        e = next((k for k in es if k.id == p["id"]), None)
        return (e is not None and e.cents == p["cents"] and len(es) == p["n"]
                and sum(k.cents for k in es) == p["total"] and e.name == p["name"] and long_date(e.day) == p["day"])

    def subgoals(self, p):
        return [("expense opened", lambda dev: _on_details(dev, p["id"]) or self.check(dev, p)),
                ("amount updated", lambda dev: self.check(dev, p))]

    def expert(self, p, x):
        yield from x.launch("Pro Expense")
        row = yield from seek_row(x, "expense_item",
                                  lambda r, t: t.get("title") == p["name"] and t.get("subtitle", "").endswith(p["short"]))
        yield Action("Tap", element=row.bounds)
        yield x.tap(desc="Edit")
        yield from x.fill("amount_input", p["amount"])
        yield x.tap(desc="Save")
        yield x.finish()

