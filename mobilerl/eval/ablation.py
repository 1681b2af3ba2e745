"""The ablation study's numbers and its report section, from the cells' ``result.json`` files
(:mod:`mobilerl.rl.ablation` writes them; the `ablation` deployment aggregates them into
``experiments/ablation/summary.json``, which the `report` stage reads).

Per variant (MobileRL Table 4c): greedy test success averaged over the seeds, with a 95 % Student-t interval over
the seeds' success rates (mean ± t₀.₉₇₅,ₙ₋₁ · s/√n: the seeds are the independent runs, so the interval holds the
run-to-run spread, not only the evaluation's sampling error; none with one seed), and the mean steps of the
successful episodes. Per round (Figure 4b): on-policy success before SPA, the seeds' mean. SPA's step efficiency
(Figure 6): ``full`` against ``no_spa``, per bucket of the task's optimal steps, among the (task, seed) pairs both
solve, the share where ``full``'s episode is shorter, a tie counting half. The paper's figure compares per
template and also counts pairs where one or neither succeeds; with a tiny policy's few successes, episodes of
the same task and seed are the pairs that exist.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Figure 6's complexity levels (≤ 10 optimal steps, …) put every task of the short pool in level 1: finer buckets
BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("≤ 3", 0, 3), ("4", 4, 4), ("5", 5, 5), ("6", 6, 6), ("7–10", 7, 10), ("> 10", 11, 10**9))
GOAL_POINTS = 2.0  # the goal: full ahead of each ablation by at least this many points


def read_cells(cells: Path) -> list[dict[str, Any]]:
    """Every finished cell's ``result.json`` under ``cells/<variant>/seed<k>/``."""
    return [json.loads(p.read_text()) for p in sorted(cells.glob("*/seed*/result.json"))]


def t_interval(xs: list[float], level: float = 0.95) -> list[float] | None:
    """The Student-t interval of the mean of ``xs`` (None for fewer than two values)."""
    n = len(xs)
    if n < 2:
        return None
    from scipy.stats import t

    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def bucket(optimal_steps: int) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= optimal_steps <= hi)


def win_rate(pairs: Iterable[tuple[int, int]]) -> dict[str, Any]:
    """``pairs``: (steps of full, steps of no_spa) of episodes both solved; a win is full shorter, a tie half."""
    ps = list(pairs)
    wins = sum(a < b for a, b in ps)
    ties = sum(a == b for a, b in ps)
    return {"pairs": len(ps), "wins": wins, "ties": ties, "losses": len(ps) - wins - ties,
            "win_rate": (wins + ties / 2) / len(ps) if ps else None}


def spa_win_rate(full: list[dict], no_spa: list[dict]) -> dict[str, Any]:
    """Figure 6: ``full`` vs ``no_spa`` cells (same seeds paired) by bucket of optimal steps and overall."""
    other = {(c["seed"], e["task_id"]): e for c in no_spa for e in c["episodes"]}
    by: dict[str, list[tuple[int, int]]] = {}
    templates: dict[str, set[str]] = {}
    for c in full:
        for e in c["episodes"]:
            o = other.get((c["seed"], e["task_id"]))
            if o is None or not (e["success"] and o["success"]):
                continue
            b = bucket(e["optimal_steps"])
            by.setdefault(b, []).append((e["steps"], o["steps"]))
            templates.setdefault(b, set()).add(e["template"])
    rows = [{"bucket": name, "templates": len(templates[name]), **win_rate(by[name])}
            for name, _, _ in BUCKETS if name in by]
    everything = [p for v in by.values() for p in v]
    return {"buckets": rows, "all": {"bucket": "all", "templates": len(set().union(*templates.values())),
                                     **win_rate(everything)},
            "seeds": sorted({c["seed"] for c in full} & {c["seed"] for c in no_spa})}


def curve_key(cells: list[dict]) -> str:
    """The verifier's on-policy success: ``rollout/verified_success`` where a judge gave the rewards (E.5)."""
    rows = [r for c in cells for r in c["curve"]]
    return "rollout/verified_success" if rows and all("rollout/verified_success" in r for r in rows) else "rollout/success"


def aggregate(results: list[dict], order: list[str] | None = None) -> dict[str, Any]:
    """``experiments/ablation/summary.json`` from the cells' results. A variant keeps the cells of its most
    recent budget (rounds and evaluation: the fingerprint without the seed), so a rerun at another budget never
    mixes with the old seeds."""
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["variant"], []).append(r)
    names = [v for v in (order or []) if v in by] + sorted(set(by) - set(order or []))
    variants: dict[str, Any] = {}
    kept: dict[str, list[dict]] = {}
    for v in names:
        latest = max(by[v], key=lambda c: c.get("finished_at", 0))
        cells = kept[v] = sorted((c for c in by[v] if _budget(c) == _budget(latest)), key=lambda c: c["seed"])
        rates = [c["eval"]["success_rate"] for c in cells]
        steps = [c["eval"]["steps_success"] for c in cells if c["eval"]["steps_success"] is not None]
        key = curve_key(cells)
        rounds = min(len(c["curve"]) for c in cells)
        variants[v] = {
            "seeds": [c["seed"] for c in cells], "success_rate": sum(rates) / len(rates), "ci95": t_interval(rates),
            "per_seed": {str(c["seed"]): c["eval"]["success_rate"] for c in cells},
            "steps_success": sum(steps) / len(steps) if steps else None,
            "n_tasks": latest["eval"]["n_tasks"], "suite": latest.get("suite", "world"), "rounds": latest["rounds"],
            "overrides": latest["overrides"], "e5": "test_half" in latest["overrides"],
            "reference": latest.get("init"),  # the untrained RL init's path: the reference row, no curve
            "curve_key": key, "curve": [sum(c["curve"][i][key] for c in cells) / len(cells) for i in range(rounds)],
            "minutes_per_cell": sum(c["time"]["total_s"] for c in cells) / len(cells) / 60,
        }
        if key != "rollout/success":  # the judge's verdicts too, beside the verifier's
            variants[v]["curve_judged"] = [sum(c["curve"][i]["rollout/success"] for c in cells) / len(cells)
                                           for i in range(rounds)]
    # the table's order (write_json sorts keys, so the dict alone would come back alphabetical)
    out: dict[str, Any] = {"variants": variants, "order": names, "cells": sum(len(v) for v in kept.values())}
    if "full" in kept and "no_spa" in kept:
        out["spa_win_rate"] = spa_win_rate(kept["full"], kept["no_spa"])
    return out


def ordered(summary: dict | None) -> dict[str, Any]:
    """The summary's variants in the order the study lists them (``order``), the rest after."""
    vs = (summary or {}).get("variants") or {}
    order = [v for v in (summary or {}).get("order", []) if v in vs]
    return {v: vs[v] for v in [*order, *(v for v in vs if v not in order)]}


def _budget(cell: dict) -> tuple:
    return cell["rounds"], cell["eval"]["n_tasks"], json.dumps(cell["overrides"], sort_keys=True)


def metrics(summary: dict) -> dict[str, Any]:
    """``reports/metrics.json``'s ``ablation``: per variant its mean success, 95 % interval, seeds and mean steps
    of successes; ``spa_win_rate`` overall."""
    out: dict[str, Any] = {v: {"success_rate": x["success_rate"], "ci95": x["ci95"], "seeds": x["seeds"],
                               "steps_success": x["steps_success"], "rounds": x["rounds"]}
                           for v, x in summary.get("variants", {}).items()}
    if summary.get("spa_win_rate"):
        out["spa_win_rate"] = summary["spa_win_rate"]["all"]["win_rate"]
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _ci(x: dict) -> str:
    return f"{_pct(x['success_rate'])}" + (f" [{_pct(x['ci95'][0])}, {_pct(x['ci95'][1])}]" if x["ci95"] else "")


def _change(overrides: dict) -> str:
    return ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in overrides.items()) or "AdaGRPO as the `rl` stage"


def goal(summary: dict) -> list[str]:
    """The issue's goal, read off the table: full ahead of every ablation (`no_*`) by ≥ 2 points with disjoint
    intervals, and a peer option ahead of full."""
    vs = summary["variants"]
    if "full" not in vs:
        return []
    full = vs["full"]
    ablations = [v for v in vs if v.startswith("no_")]
    peers = [v for v in vs if v != "full" and not v.startswith("no_") and not vs[v]["e5"] and not vs[v].get("reference")]

    def clear(v: str) -> bool:
        x = vs[v]
        return (full["success_rate"] - x["success_rate"] >= GOAL_POINTS / 100 and full["ci95"] is not None
                and x["ci95"] is not None and full["ci95"][0] > x["ci95"][1])

    lines = []
    if ablations:
        held = [v for v in ablations if clear(v)]
        lines.append(f"Full AdaGRPO ahead of an ablation by ≥ {GOAL_POINTS:.0f} points with disjoint intervals: "
                     f"{len(held)} of {len(ablations)} ({', '.join(held) or 'none'}).")
    if peers:
        ahead = [v for v in peers if vs[v]["success_rate"] > full["success_rate"]]
        lines.append(f"Peer options ahead of full (mean): {', '.join(ahead) or 'none'} of {', '.join(peers)}.")
    return lines


def section(summary: dict | None, figures: dict[str, str]) -> list[str]:
    """The report's ablation section: Table 4c, the Figure 4b curves, the Figure 6 win rate and the E.5 pair
    (``figures``: kind -> file name in ``reports/figures``); a note when no cell has finished yet."""
    lines = ["## AdaGRPO ablations (deployment `mobilerl/ablation`)", ""]
    vs = ordered(summary)
    if not vs:
        return [*lines, "No ablation results yet: `prefect deployment run mobilerl/ablation` (or `python -m "
                "pipelines.ablation`) runs them into `experiments/ablation/`, then this report (docs/rl.md, "
                "\"Ablations\").", ""]
    main = {v: x for v, x in vs.items() if not x["e5"]}
    if main:
        x0 = next((x for x in main.values() if not x.get("reference")), next(iter(main.values())))
        lines += [f"Each variant × seed trains {x0['rounds']} rounds with the `rl` stage's code and its overrides, "
                  f"then runs greedy on {x0['n_tasks']} {x0['suite']}/test tasks of the pool's templates (Table "
                  "4c); `init` is the RL init on the same tasks, untrained. Success in %, mean over seeds with its "
                  "95 % Student-t interval over the seeds; Δ in points against full.", "",
                  "| variant | changes | seeds | success [95 % CI] | Δ vs full | steps on successes | rounds |",
                  "|---|---|---|---|---|---|---|"]
        full = vs.get("full")
        for v, x in main.items():
            delta = "–" if full is None or v == "full" else f"{100 * (x['success_rate'] - full['success_rate']):+.1f}"
            steps = "–" if x["steps_success"] is None else f"{x['steps_success']:.2f}"
            change = f"no RL: the init `{x['reference']}`" if x.get("reference") else _change(x["overrides"])
            lines.append(f"| {v} | {change} | {len(x['seeds'])} | {_ci(x)} | {delta} | {steps} | {x['rounds']} |")
        met = goal(summary)
        lines += ["", *met, ""] if met else [""]
    if figures.get("curves"):
        lines += ["On-policy success per round (binary, before SPA; replays excluded), mean over seeds (Figure 4b):",
                  "", f"![ablation curves](figures/{figures['curves']})", ""]
    w = (summary or {}).get("spa_win_rate")
    if w:
        lines += [f"SPA's step efficiency (Figure 6): full vs no_spa, seeds {w['seeds']} paired; per bucket of optimal "
                  "steps, among the (task, seed) pairs both solve, the share where full's episode is shorter (a tie "
                  "counts half).", "", "| optimal steps | templates | pairs | wins / ties / losses | win rate |",
                  "|---|---|---|---|---|"]
        for r in [*w["buckets"], w["all"]]:
            lines.append(f"| {r['bucket']} | {r['templates']} | {r['pairs']} | {r['wins']} / {r['ties']} / "
                         f"{r['losses']} | {_pct(r['win_rate'])} |")
        lines.append("")
        if figures.get("win_rate"):
            lines += [f"![SPA win rate](figures/{figures['win_rate']})", ""]
    e5 = {v: x for v, x in vs.items() if x["e5"]}
    if e5:
        lines += ["Reward-model RL (Appendix E.5): trained on one half of the test split, with the verifier or the "
                  "reward model as the reward; both evaluated greedy with the verifier on the other half.", "",
                  "| variant | seeds | held-out tasks | success [95 % CI] | on-policy verified success, last round |",
                  "|---|---|---|---|---|"]
        for v, x in e5.items():
            lines.append(f"| {v} | {len(x['seeds'])} | {x['n_tasks']} {x['suite']}/test | {_ci(x)} | "
                         f"{_pct(x['curve'][-1] if x['curve'] else None)} |")
        lines.append("")
        if figures.get("e5"):
            lines += [f"![E.5 curves](figures/{figures['e5']})", ""]
    return lines


def plot(summary: dict | None, outdir: Path) -> dict[str, str]:
    """The section's figures: ``ablation_curves.png`` (Figure 4b), ``ablation_spa_win_rate.png`` (Figure 6),
    ``ablation_e5.png`` (Figure 15); returns kind -> file name."""
    vs = ordered(summary)
    if not vs:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    for kind, group in (("curves", {v: x for v, x in vs.items() if not x["e5"] and x["curve"]}),
                        ("e5", {v: x for v, x in vs.items() if x["e5"]})):
        if not group:
            continue
        fig, ax = plt.subplots(figsize=(7, 3.8), dpi=100)
        for v, x in group.items():
            line = ax.plot(range(len(x["curve"])), [100 * s for s in x["curve"]], label=f"{v} (n={len(x['seeds'])})")
            if "curve_judged" in x:
                ax.plot(range(len(x["curve_judged"])), [100 * s for s in x["curve_judged"]], ls="--",
                        color=line[0].get_color(), label=f"{v}: judge's verdict")
        ax.set_xlabel("RL round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("on-policy success (%)" if kind == "curves" else "on-policy success, training half (%)")
        ax.set_ylim(bottom=0)
        name = "ablation_curves.png" if kind == "curves" else "ablation_e5.png"
        _save(fig, ax, "AdaGRPO ablations: on-policy success" if kind == "curves" else "E.5: verifier vs reward model",
              outdir / name)
        out[kind] = name
    w = summary.get("spa_win_rate") if summary else None
    if w and w["all"]["pairs"]:
        rows = [r for r in [*w["buckets"], w["all"]] if r["win_rate"] is not None]
        fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
        ax.bar([r["bucket"] for r in rows], [100 * r["win_rate"] for r in rows], label="full (SPA) vs no_spa")
        for i, r in enumerate(rows):
            ax.text(i, 100 * r["win_rate"] + 1, f"n={r['pairs']}", ha="center", fontsize=8)
        ax.axhline(50, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("optimal steps")
        ax.set_ylabel("win rate (%)")
        ax.set_ylim(0, 105)
        _save(fig, ax, "SPA win rate: shorter successful episode", outdir / "ablation_spa_win_rate.png")
        out["win_rate"] = "ablation_spa_win_rate.png"
    return out


def _save(fig: Any, ax: Any, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
