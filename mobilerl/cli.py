"""The ``mobilerl`` command line."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False, help="MobileRL: online agentic RL for mobile GUI agents.")
env_app = typer.Typer(no_args_is_help=True, help="Environments: the simulator, task suites, env server, benchmarks.")
app.add_typer(env_app, name="env")
console = Console(stderr=True)

Suite = Annotated[str, typer.Option(help="Task suite: world (AndroidWorld-like) or lab (AndroidLab-like).")]
Split = Annotated[str, typer.Option(help="Split: test (fixed variations) or train.")]


def _tasks(suite: str, split: str, n: int | None, with_optimal: bool):
    from mobilerl.env.sim.tasks import list_tasks

    try:
        return list_tasks(suite, split, n=n, with_optimal=with_optimal)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0])) from None


@env_app.command("tasks")
def tasks_cmd(
    suite: Suite = "world",
    split: Split = "test",
    n: Annotated[int | None, typer.Option(help="Instances per template (default: the split's own count).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one list) instead of a table.")] = False,
    optimal: Annotated[bool, typer.Option(help="Compute optimal steps by running the oracle.")] = True,
) -> None:
    """List the tasks of a suite split with their metadata."""
    tasks = _tasks(suite, split, n, optimal)
    if as_json:
        json.dump([t.to_dict() for t in tasks], sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
        return
    table = Table(title=f"{suite}/{split}: {len(tasks)} tasks")
    for col in ("task_id", "difficulty", "optimal", "budget", "type", "apps", "instruction"):
        table.add_column(col)
    for t in tasks:
        table.add_row(t.task_id, t.difficulty, str(t.optimal_steps), str(t.max_steps), t.task_type,
                      ",".join(t.apps), t.instruction)
    Console().print(table)


@env_app.command("check-oracle")
def check_oracle(
    suite: Suite = "world",
    split: Split = "test",
    perturb: Annotated[str, typer.Option(help="Perturbation profile: none, default, heavy.")] = "default",
    n: Annotated[int | None, typer.Option(help="Instances per template (default: the split's own count).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Run the oracle expert over a suite split and print its success rate (exit 1 below 100%)."""
    from tqdm import tqdm

    from mobilerl.env.sim import run_oracle

    tasks = _tasks(suite, split, n, with_optimal=False)
    per_template: dict[str, list[bool]] = defaultdict(list)
    failures = []
    steps = 0
    for t in tqdm(tasks, desc=f"oracle {suite}/{split}", unit="task", disable=as_json or not sys.stderr.isatty()):
        r = run_oracle(t, perturb=perturb)
        per_template[t.template].append(r.success)
        steps += r.steps
        if not r.success:
            failures.append({"task_id": t.task_id, "error": r.error, "steps": r.steps})
    ok = sum(sum(v) for v in per_template.values())
    rate = ok / max(1, len(tasks))
    summary = {"suite": suite, "split": split, "perturb": perturb, "tasks": len(tasks), "successes": ok,
               "success_rate": rate, "steps": steps, "failures": failures}
    if as_json:
        print(json.dumps(summary, indent=1))
    else:
        for f in failures[:20]:
            console.print(f"[red]FAIL[/red] {f['task_id']}: {f['error']}")
        print(f"oracle success on {suite}/{split} (perturb={perturb}): {rate:.1%} ({ok}/{len(tasks)}), "
              f"{len(per_template)} templates, {steps} steps")
    if ok != len(tasks):
        raise typer.Exit(1)


@env_app.command("stats")
def stats(suite: Suite = "world", split: Split = "test") -> None:
    """Distribution of difficulty, optimal steps, apps and tags of a suite split."""
    tasks = _tasks(suite, split, None, with_optimal=True)
    steps = sorted(t.optimal_steps for t in tasks)
    apps = Counter(a for t in tasks for a in t.apps)
    print(json.dumps({
        "tasks": len(tasks),
        "templates": len({t.template for t in tasks}),
        "apps": len(apps),
        "difficulty": Counter(t.difficulty for t in tasks),
        "task_type": Counter(t.task_type for t in tasks),
        "optimal_steps": {"min": steps[0], "median": steps[len(steps) // 2], "max": steps[-1],
                          "le10": sum(s <= 10 for s in steps), "11-20": sum(10 < s <= 20 for s in steps),
                          "21-30": sum(20 < s <= 30 for s in steps), "gt30": sum(s > 30 for s in steps)},
        "multi_app": sum(len(t.apps) > 1 for t in tasks),
        "per_app": dict(apps.most_common()),
    }, indent=1))


@env_app.command("serve")
def serve_cmd(
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    token: Annotated[str | None, typer.Option(help="Bearer token (default: $MOBILERL_ENV_TOKEN or a new one).")] = None,
    backend: Annotated[str, typer.Option(help="Env backend behind the server.")] = "sim",
    size: Annotated[int, typer.Option(help="Number of env workers.")] = 4,
    isolate: Annotated[bool, typer.Option(help="Run each env in its own worker process (crash-safe).")] = True,
    render: Annotated[bool, typer.Option(help="Observations carry screenshots (screenshot observation modes).")] = False,
) -> None:
    """Serve reset/step/evaluate/close for an env backend over HTTP (token required)."""
    from mobilerl.env.server import serve

    serve(host=host, port=port, token=token or os.environ.get("MOBILERL_ENV_TOKEN"), backend=backend, size=size,
          isolate=isolate, render=render)


@env_app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_cmd(ctx: typer.Context) -> None:
    """Benchmarks: simulator steps/s (XML, screenshots) and env-pool throughput vs ideal and sequential."""
    from mobilerl.env.bench import main

    main(list(ctx.args))


if __name__ == "__main__":
    app()
