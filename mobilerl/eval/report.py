"""The evaluation report: Markdown tables, plots and the DVC metrics JSON, from the evaluation summaries.

Pure functions of the loaded inputs: ``summary`` (one summary per policy × suite, each with its MLflow run
id), ``offline`` (the checkpoints' offline step accuracy) and ``sampled`` (the pass@k sampling study), so the
report is testable without running an evaluation. Every table row names the MLflow run its numbers came from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field

from mobilerl.config import ROOT, StageConfig
from mobilerl.eval import ablation as abl

BASELINES = ("oracle", "random")


class ReportConfig(StageConfig):
    """The report's heading and pass@k columns."""

    title: str = Field("MobileRL — evaluation report", description="Report heading.")
    k_values: list[int] = Field([1, 2, 4, 8], description="pass@k columns.")


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _run(s: dict) -> str:
    rid = s.get("mlflow_run_id", "")
    return f"`{rid[:8]}`" if rid else "–"


def _order(policies: list[str]) -> list[str]:
    rest = [p for p in policies if p not in BASELINES]
    return [p for p in BASELINES if p in policies][:1] + rest + [p for p in BASELINES if p in policies][1:]


def _suites(summary: dict) -> list[str]:
    found = {s for p in summary.values() for s in p}
    return [s for s in ("world", "lab") if s in found] + sorted(found - {"world", "lab"})


def offline_modes(x: dict) -> dict[str, dict]:
    """A checkpoint's offline metrics (``androidcontrol/<mode>/<metric>``) by mode: ``{mode: {metric: v}}``."""
    out: dict[str, dict] = {}
    for k, v in x.items():
        parts = k.split("/")
        if len(parts) == 3 and parts[0] == "androidcontrol":
            out.setdefault(parts[1], {})[parts[2]] = v
    return out


def offline_table(offline: dict) -> list[str]:
    """Offline step accuracy of the checkpoints (``data/eval/offline.json``; empty: no section)."""
    if not offline:
        return []
    suite = next(iter(offline.values())).get("suite", "")
    lines = [f"## Offline step accuracy (AndroidControl-style) — expert episodes of {suite}", "",
             "Each step of an expert rollout. High: the goal, with the expert's history (a wrong answer is replaced "
             "by the expert's action). Low: the step's own instruction (derived from the expert's action and screen, "
             "e.g. `Tap \"Wi-Fi\"`), no history. Table 8 rules: point in the predicted box, Type F1 > 0.5, swipe "
             "direction, app name. Grounding misses, of the Tap / Long Press steps answered with the right action "
             "type: *wrong element* — the predicted box is another element of the screen (the wrong element was chosen "
             "or looked up); *off element* — it is no element's box (the answer points at nothing shown).", "",
             "| policy | mode | episodes | steps | type acc | grounding acc | miss: wrong element | miss: off element "
             "| step SR | episode SR | invalid % | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in _order(list(offline)):
        for mode, x in sorted(offline_modes(offline[p]).items()):
            lines.append(f"| {p} | {mode} | {x.get('n_episodes')} | {x.get('n_steps')} | "
                         f"{_pct(x.get('type_accuracy'))} | {_pct(x.get('grounding_accuracy_all'))} | "
                         f"{_pct(x.get('grounding_wrong_element'))} | {_pct(x.get('grounding_off_element'))} | "
                         f"{_pct(x.get('step_success_rate'))} | {_pct(x.get('episode_success_rate'))} | "
                         f"{_pct(x.get('invalid_rate'))} | {_run(offline[p])} |")
    return lines + [""]


def sampled_tables(sampled: dict, cfg: ReportConfig) -> list[str]:
    """pass@k of the sampling study (``data/eval/sampled.json``: ``{policy: {suite: summary}}``), overall and by
    complexity level; empty: no section."""
    lines: list[str] = []
    for s in _suites(sampled):
        rows = [(p, sampled[p][s]) for p in _order(list(sampled)) if s in sampled[p]]
        ks = [k for k in cfg.k_values if any(x.get(f"eval/pass@{k}") is not None for _, x in rows)]
        n, temp = rows[0][1].get("n_trials"), rows[0][1].get("temperature")
        lines += [f"## pass@k with sampling — {s}", "",
                  f"Each task sampled {n} times at temperature {temp} (`evaluate.pass_k`), on {rows[0][1].get('n_tasks')} "
                  f"test tasks spread over the templates; unbiased estimator 1 − C(n−c, k) / C(n, k), averaged over "
                  f"tasks. Levels by optimal steps as above.", "",
                  "| policy | level | tasks | " + " | ".join(f"pass@{k}" for k in ks) + " | run |",
                  "|" + "---|" * (len(ks) + 4)]
        for p, x in rows:
            overall = {"n_tasks": x.get("eval/n_tasks"), **{f"pass@{k}": x.get(f"eval/pass@{k}") for k in ks}}
            lines += _pass_k_rows(p, x, ks, (("all", overall),))
        lines.append("")
    return lines


def _pass_k_rows(policy: str, x: dict, ks: list[int], first: tuple[tuple[str, dict], ...] = ()) -> list[str]:
    """Table rows ``| policy | level | tasks | pass@k… | run |`` of one summary: the ``first`` groups, then its
    complexity levels."""
    return [f"| {policy} | {level} | {g.get('n_tasks')} | " + " | ".join(_pct(g.get(f"pass@{k}")) for k in ks)
            + f" | {_run(x)} |" for level, g in [*first, *sorted(x["eval/by_complexity"].items())]]


def render_markdown(summary: dict, cfg: ReportConfig, figures: list[str], offline: dict | None = None,
                    sampled: dict | None = None) -> str:
    policies = _order(list(summary))
    suites = _suites(summary)
    lines = [f"# {cfg.title}", ""]
    lines += ["Generated by the `report` stage from `data/eval/summary.json`; every row names the MLflow run",
              "(experiment `mobilerl`) its numbers come from. Success rates in %, 95% Wilson interval in brackets.",
              ""]
    # Table 1: policy × benchmark
    lines += ["## Success rate by benchmark", ""]
    if "world_all" in suites:
        lines += ["world_all: every world/test task, greedy (`evaluate.world_all`); world: the spread subset.", ""]
    head = ["policy"] + [f"{s} SR" for s in suites] + (["lab Sub-SR"] if "lab" in suites else []) + ["runs"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in policies:
        row = [p]
        for s in suites:
            x = summary[p].get(s)
            lost = (x or {}).get("eval/n_env_failed") or 0  # left out of the rate (summaries before it: 0)
            row.append("–" if x is None else
                       f"{_pct(x['eval/success_rate'])} [{_pct(x['eval/success_ci_low'])}, "
                       f"{_pct(x['eval/success_ci_high'])}]" + (f" ({lost} lost to env failures)" if lost else ""))
        if "lab" in suites:
            row.append(_pct(summary[p].get("lab", {}).get("lab/sub_sr")))
        row.append(", ".join(f"{s}: {_run(summary[p][s])}" for s in suites if s in summary[p]))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    # pass@k by complexity level, per suite
    for s in suites:
        lines += [f"## pass@k by complexity level — {s}", "",
                  "Levels by optimal steps: 1 (≤10), 2 (11–20), 3 (21–30), 4 (>30). pass@k needs k trials of "
                  "every task (`evaluate.n_trials`, sampled at a temperature above 0): \"–\" where there were fewer.",
                  ""]
        head = ["policy", "level", "tasks"] + [f"pass@{k}" for k in cfg.k_values] + ["run"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for p in policies:
            x = summary[p].get(s)
            if x is None:
                continue
            lines += _pass_k_rows(p, x, cfg.k_values)
        lines.append("")
    # difficulty and buckets
    for s in suites:
        lines += [f"## Success by difficulty and bucket — {s}", ""]
        cols = ["easy", "medium", "hard", "S1", "S2", "S3", "D1", "D2", "D3"]
        lines += ["| policy | " + " | ".join(cols) + " | run |", "|" + "---|" * (len(cols) + 2)]
        for p in policies:
            x = summary[p].get(s)
            if x is None:
                continue
            groups = {**x["eval/by_difficulty"], **x["eval/by_semantic"], **x["eval/by_combined"]}
            lines.append(f"| {p} | " + " | ".join(_pct(groups.get(c, {}).get("success_rate")) for c in cols)
                         + f" | {_run(x)} |")
        lines.append("")
    # efficiency and AndroidLab metrics
    lines += ["## Step efficiency (AndroidLab metrics)", "",
              "RRR: optimal steps / steps taken on successes; ROR: share of steps that changed the screen.", "",
              "| policy | suite | mean steps | steps on successes | excess steps | RRR | ROR | invalid steps % | run |",
              "|---|---|---|---|---|---|---|---|---|"]
    for p in policies:
        for s in suites:
            x = summary[p].get(s)
            if x is None:
                continue

            def f(v: Any) -> str:
                return "–" if v is None else f"{v:.2f}"

            lines.append(f"| {p} | {s} | {f(x.get('eval/mean_steps'))} | {f(x.get('lab/mean_steps_success'))} | "
                         f"{f(x.get('lab/mean_excess_steps_success'))} | {f(x.get('lab/rrr'))} | "
                         f"{f(x.get('lab/ror'))} | {_pct(x.get('eval/invalid_step_rate'))} | {_run(x)} |")
    lines.append("")
    # failures
    kinds = sorted({k.split("/", 1)[1] for p in summary.values() for x in p.values() for k in x
                    if k.startswith("failures/")})
    lines += ["## Failure taxonomy (failed episodes by primary cause)", "",
              "| policy | suite | " + " | ".join(kinds) + " | run |", "|" + "---|" * (len(kinds) + 3)]
    for p in policies:
        for s in suites:
            x = summary[p].get(s)
            if x is not None:
                lines.append(f"| {p} | {s} | " + " | ".join(str(x.get(f"failures/{k}", 0)) for k in kinds)
                             + f" | {_run(x)} |")
    lines.append("")
    lines += sampled_tables(sampled or {}, cfg)
    lines += offline_table(offline or {})
    if figures:
        lines += ["## Figures", ""] + [f"![{Path(f).stem}](figures/{Path(f).name})" for f in figures] + [""]
    return "\n".join(lines)


def metrics_json(summary: dict, cfg: ReportConfig, offline: dict | None = None, sampled: dict | None = None) -> dict:
    out: dict = {}
    for p, x in (offline or {}).items():
        out.setdefault(p, {})["offline"] = offline_modes(x) | {"mlflow_run_id": x["mlflow_run_id"]}
    for p, suites in (sampled or {}).items():
        for s, x in suites.items():
            out.setdefault(p, {}).setdefault("sampled", {})[s] = {
                "n_trials": x.get("n_trials"), "temperature": x.get("temperature"), "n_tasks": x.get("eval/n_tasks"),
                **{f"pass@{k}": x.get(f"eval/pass@{k}") for k in cfg.k_values},
                "mlflow_run_id": x.get("mlflow_run_id", "")}
    for p, suites in summary.items():
        for s, x in suites.items():
            m = {"n": x.get("eval/n_trajectories"), "success_rate": x["eval/success_rate"],
                 "success_ci_low": x["eval/success_ci_low"], "success_ci_high": x["eval/success_ci_high"], "n_env_failed": x.get("eval/n_env_failed", 0),
                 "mlflow_run_id": x.get("mlflow_run_id", "")}
            for k in cfg.k_values:
                m[f"pass@{k}"] = x.get(f"eval/pass@{k}")
            for key in ("sub_sr", "rrr", "ror"):
                m[key] = x.get(f"lab/{key}")
            out.setdefault(p, {})[s] = m
    return out


def plot(summary: dict, cfg: ReportConfig, outdir: Path) -> list[str]:
    os.environ.setdefault("MPLCONFIGDIR", str(ROOT / ".cache" / "matplotlib"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    files = []
    policies = _order(list(summary))
    for s in _suites(summary):
        fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
        levels = sorted({lv for p in policies for lv in summary[p].get(s, {}).get("eval/by_complexity", {})})
        width = 0.8 / max(1, len(policies))
        for i, p in enumerate(policies):
            groups = summary[p].get(s, {}).get("eval/by_complexity", {})
            ax.bar([j + i * width for j in range(len(levels))],
                   [100 * (groups.get(lv, {}).get("pass@1") or 0) for lv in levels], width, label=p)
        ax.set_xticks([j + width * (len(policies) - 1) / 2 for j in range(len(levels))])
        ax.set_xticklabels([f"level {lv}" for lv in levels])
        ax.set_ylabel("pass@1 (%)")
        ax.set_ylim(0, 105)
        files.append(_save(fig, ax, f"{s}: success by complexity level", outdir / f"{s}_by_complexity.png"))
    return files


def _save(fig: Any, ax: Any, title: str, path: Path) -> str:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})  # fixed metadata so the same numbers give the same bytes
    plt.close(fig)
    return str(path)


def plot_sampled(sampled: dict, cfg: ReportConfig, outdir: Path) -> list[str]:
    """pass@k against k for each sampled policy, one figure a suite."""
    import matplotlib.pyplot as plt

    files = []
    for s in _suites(sampled):
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
        for p in _order(list(sampled)):
            x = sampled[p].get(s)
            if x is None:
                continue
            ks = [k for k in cfg.k_values if x.get(f"eval/pass@{k}") is not None]
            ax.plot(ks, [100 * x[f"eval/pass@{k}"] for k in ks], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg.k_values, [str(k) for k in cfg.k_values])
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k (%)")
        ax.set_ylim(bottom=0)
        files.append(_save(fig, ax, f"{s}: pass@k with sampling", outdir / f"{s}_pass_at_k.png"))
    return files


def build_report(summary: dict, cfg: ReportConfig, figures_dir: Path, offline: dict | None = None,
                 sampled: dict | None = None, rl_curve: list[dict] | None = None,
                 rl_templates: dict[str, dict[str, Any]] | None = None, reward: dict | None = None,
                 reward_examples: list[str] | None = None, ablation: dict | None = None) -> tuple[str, dict]:
    """The report's figures (written into ``figures_dir``), its Markdown and its metrics JSON; with the `rl`
    stage's curve, its section (:func:`rl_section`, before = the RL init ``RL_BEFORE``); the ablation study's
    section (:mod:`mobilerl.eval.ablation`, from ``experiments/ablation/summary.json``; a note while it has no
    results); with the reward model's held-out metrics, its section (:func:`reward_section`)."""

    figures = plot(summary, cfg, figures_dir) + plot_sampled(sampled or {}, cfg, figures_dir)
    md = render_markdown(summary, cfg, figures, offline, sampled)
    metrics = metrics_json(summary, cfg, offline, sampled)
    if rl_curve:
        fig = plot_rl_curve(rl_curve, figures_dir)
        lines = rl_section(rl_curve, rl_templates or {}, RL_BEFORE, RL_AFTER, fig and Path(fig).name)
        md = md.rstrip("\n") + "\n\n" + "\n".join(lines)
        metrics["rl"] = rl_summary(rl_curve)
    md = md.rstrip("\n") + "\n\n" + "\n".join(abl.section(ablation, abl.plot(ablation, figures_dir)))
    if ablation and ablation.get("variants"):
        metrics["ablation"] = abl.metrics(ablation)
    if reward:
        diagram = plot_reliability(reward.get("calibration"), figures_dir)
        md = md.rstrip("\n") + "\n\n" + "\n".join(reward_section(reward, reward_examples or [],
                                                                   diagram and Path(diagram).name))
        metrics["reward_model"] = {k: reward[k] for k in ("accuracy", "precision", "recall", "f1", "n")}
        metrics["reward_model"]["by_source"] = {k: {"n": v["n"], "accuracy": v["accuracy"]}
                                                for k, v in sorted(reward.get("by_source", {}).items())}
        if "calibration" in reward:
            metrics["reward_model"] |= {"threshold": reward["threshold"], "ece": reward["calibration"]["ece"]}
    return md, metrics


def plot_reliability(calibration: dict | None, outdir: Path) -> str | None:
    """``reward_reliability.png``: the judge's held-out success share against its mean score, per score bin."""
    if not calibration or not calibration.get("bins"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = calibration["bins"]
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.plot([0, 1], [0, 1], ls="--", color="grey", label="calibrated")
    ax.plot([b["mean_score"] for b in bins], [b["success_rate"] for b in bins], marker="o",
            label=f"judge (ECE {calibration['ece']:.3f})")
    for b in bins:
        ax.annotate(str(b["n"]), (b["mean_score"], b["success_rate"]), fontsize=7, xytext=(3, -9),
                    textcoords="offset points")
    ax.set_xlabel("P(completed), bin mean")
    ax.set_ylabel("completed (held-out share)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return _save(fig, ax, "Reward model reliability", outdir / "reward_reliability.png")


def reward_section(m: dict, examples: list[str], diagram: str | None = None) -> list[str]:
    """The reward model on held-out traces (the `reward_model` stage's metrics): the judge beside its baselines,
    per source policy, its reliability ``diagram`` (a figure file name), and a few rendered traces it judged
    right and wrong (``examples``: figure file names)."""

    def row(name: str, r: dict) -> str:
        c = r["confusion"]
        return (f"| {name} | {r['n']} | {r['accuracy']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} | "
                f"{r['f1']:.3f} | {c['tp']} / {c['fp']} / {c['tn']} / {c['fn']} |")

    lines = ["## Reward model (held-out lab/test traces)", "",
             "| judge | traces | accuracy | precision | recall | F1 | TP / FP / TN / FN |", "|---|---|---|---|---|---|---|",
             row("trained judge", m), *(row(f"baseline: {k.replace('_', ' ')}", v)
                                        for k, v in sorted(m.get("baselines", {}).items()))]
    if "zero_shot" in m:
        lines.append(row("zero-shot judge", m["zero_shot"]))
    if m.get("by_source"):
        lines += ["", "Per source policy (trained judge):", "", "| policy | traces | accuracy | precision | recall | "
                  "F1 | TP / FP / TN / FN |", "|---|---|---|---|---|---|---|",
                  *(row(k, v) for k, v in sorted(m["by_source"].items()))]
    if diagram:
        lines += ["", f"Calibration: threshold {m['threshold']:.3f} (chosen on the training traces), expected "
                      f"calibration error {m['calibration']['ece']:.3f} on the held-out ones.", "",
                  f"![reward model reliability](figures/{diagram})"]
    if examples:
        lines += ["", "Rendered traces (`right_*`: judged correctly, `wrong_*`: not):", ""]
        lines += [f"![{Path(e).stem}](figures/{e})" for e in examples]
    return [*lines, ""]


RL_BEFORE, RL_AFTER = "sft_reasoning_free", "adagrpo"  # the `rl` stage's init and its policy


def template_table(trajs: dict[str, list], before: str, after: str) -> dict[str, dict[str, Any]]:
    """Per template of world/test: tasks solved and mean steps of the successes, for two policies' trajectories
    (``trajs[policy]``, :class:`~mobilerl.trajectory.Trajectory` lists)."""
    out: dict[str, dict[str, Any]] = {}
    for policy in (before, after):
        for t in trajs.get(policy, []):
            row = out.setdefault(t.template, {}).setdefault(policy, {"n": 0, "solved": 0, "steps": []})
            row["n"] += 1
            if t.success:
                row["solved"] += 1
                row["steps"].append(t.n_steps)
    return out


def rl_summary(curve: list[dict]) -> dict[str, float]:
    """Rounds and the mean on-policy success of the first and the last 5 rounds (the learning target's figures)."""
    first, last = curve[:5], curve[-5:]
    return {"rounds": len(curve), "success_first5": sum(c["rollout/success"] for c in first) / len(first),
            "success_last5": sum(c["rollout/success"] for c in last) / len(last)}


def rl_section(curve: list[dict], templates: dict[str, dict[str, Any]], before: str, after: str,
               figure: str | None) -> list[str]:
    """The RL stage: its training curve (on-policy success before SPA, moving average over 10 rounds), and per
    template the tasks solved and the mean steps of successes before and after RL (templates either solved)."""
    if not curve:
        return []
    s = rl_summary(curve)
    lines = ["## AdaGRPO (the `rl` stage)", "",
             f"{s['rounds']} rounds; on-policy success (binary, before SPA) {_pct(s['success_first5'])} % over "
             f"the first 5 rounds, {_pct(s['success_last5'])} % over the last 5.", ""]
    if figure:
        lines += [f"![training curve](figures/{figure})", ""]

    def cell(r: dict | None) -> str:
        if not r:
            return "–"
        steps = f"{sum(r['steps']) / len(r['steps']):.1f}" if r["steps"] else "–"
        return f"{r['solved']}/{r['n']} ({steps})"

    rows = [(k, v) for k, v in sorted(templates.items())
            if any(v.get(p, {}).get("solved") for p in (before, after))]
    if rows:
        lines += ["Per template (world/test, greedy): tasks solved and, in brackets, mean steps of the successes.",
                  "", f"| template | {before} | {after} |", "|---|---|---|"]
        lines += [f"| {k} | {cell(v.get(before))} | {cell(v.get(after))} |" for k, v in rows]
        lines.append("")
    return lines


def plot_rl_curve(curve: list[dict], outdir: Path) -> str | None:
    """``rl_curve.png``: per-round on-policy success and its 10-round moving average."""
    if not curve:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r = [c["round"] for c in curve]
    s = np.array([c["rollout/success"] for c in curve]) * 100
    w = min(10, len(s))
    ma = np.convolve(s, np.ones(w) / w, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(r, s, alpha=0.35, label="per round")
    ax.plot(r[w - 1:], ma, label=f"{w}-round mean")
    ax.set_xlabel("round")
    ax.set_ylabel("on-policy success (%)")
    ax.legend()
    return _save(fig, ax, "AdaGRPO training curve", outdir / "rl_curve.png")
