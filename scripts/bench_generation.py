"""Generation benchmarks: HF backend tokens/s and actions/s at several batch sizes on real step prompts, and
the wall time of evaluating a ModelPolicy on a sample of a simulator suite (extrapolated to the whole split).

    python scripts/bench_generation.py models/tiny-base --batches 1 16 --eval-per-template 2

Prompts are the prompt module's chats for the first screen of ``--suite/--split`` tasks (mode ``--obs-mode``).
An untrained model rarely emits the end-of-turn token, so its responses run to ``--max-new-tokens``: the
figures are per generated token / per response, and the evaluation time is an upper bound for a trained
model (which stops after ~20 tokens and finishes episodes early).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from mobilerl.agent import PolicyContext
from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.agent.rollout import episode_id
from mobilerl.env.sim import SimEnv
from mobilerl.env.sim.tasks import list_tasks
from mobilerl.env.xml import compress_xml
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend


def step_requests(policy: ModelPolicy, tasks, render: bool):
    env = SimEnv(render=render)
    out = []
    for t in tasks:
        obs = env.reset(t)
        ctx = PolicyContext(t, obs, compress_xml(obs.xml, width=obs.width, height=obs.height), (), 0, episode_id(t, 0))
        out.append(policy.request(ctx))
    return out


def bench_batches(backend: HFBackend, requests, batches, sampling: SamplingConfig, rounds: int) -> list[dict]:
    rows = []
    for b in batches:
        reqs = (requests * (b // len(requests) + 1))[:b]

        async def once(reqs=reqs):
            # b independent callers, as b concurrent episodes would be: the micro-batcher batches them
            return [g for gs in await asyncio.gather(*(backend.generate([r], sampling) for r in reqs)) for g in gs]

        asyncio.run(once())  # warm-up
        before = backend.stats.batches
        t0 = time.perf_counter()
        gens = []
        for _ in range(rounds):
            gens += asyncio.run(once())
        wall = time.perf_counter() - t0
        toks = sum(len(g.token_ids) for g in gens)
        rows.append({
            "batch": b,
            "responses": len(gens),
            "generate_calls": backend.stats.batches - before,
            "prompt_tokens_mean": statistics.mean(g.prompt_tokens for g in gens),
            "new_tokens_mean": toks / len(gens),
            "wall_s": round(wall, 2),
            "tokens_per_s": round(toks / wall, 1),
            "actions_per_s": round(len(gens) / wall, 2),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model directory (tiny checkpoint or transformers model)")
    ap.add_argument("--suite", default="world")
    ap.add_argument("--split", default="test")
    ap.add_argument("--obs-mode", default="xml", choices=("xml", "screenshot", "screenshot+xml"))
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per batch size")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--eval-per-template", type=int, default=0, help="tasks per template to evaluate (0: skip)")
    ap.add_argument("--eval-max-tasks", type=int, default=None,
                    help="evaluate only this many of those tasks, evenly spaced over the templates")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)

    backend = HFBackend.from_pretrained(args.model, max_batch=args.max_batch)
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    policy = ModelPolicy(backend, obs_mode=args.obs_mode, sampling=sampling, name=backend.name)
    all_tasks = list_tasks(args.suite, args.split)
    render = args.obs_mode != "xml"
    report: dict = {"model": str(args.model), "obs_mode": args.obs_mode, "max_new_tokens": args.max_new_tokens}
    if args.batches:
        firsts = list({t.template: t for t in all_tasks}.values())[:16]
        report["batches"] = bench_batches(backend, step_requests(policy, firsts, render), args.batches, sampling,
                                          args.rounds)
    if args.eval_per_template:
        seen: dict[str, int] = {}
        sample = []
        for t in all_tasks:
            if seen.get(t.template, 0) < args.eval_per_template:
                seen[t.template] = seen.get(t.template, 0) + 1
                sample.append(t)
        if args.eval_max_tasks and args.eval_max_tasks < len(sample):
            stride = len(sample) / args.eval_max_tasks
            sample = [sample[int(i * stride)] for i in range(args.eval_max_tasks)]
        import functools

        env_factory = functools.partial(SimEnv, render=render)
        b0, i0 = backend.stats.batches, backend.stats.items
        t0 = time.perf_counter()
        trajs = evaluate_sync(policy.with_seed, sample, n_trials=1, concurrency=args.concurrency,
                              env_factory=env_factory, progress=False)
        wall = time.perf_counter() - t0
        steps = sum(len(t.steps) for t in trajs)
        calls, items = backend.stats.batches - b0, backend.stats.items - i0
        report["eval"] = {
            "tasks": len(sample),
            "episodes": len(trajs),
            "steps": steps,
            "invalid_share": round(sum(not s.valid for t in trajs for s in t.steps) / max(steps, 1), 3),
            "success": sum(t.success for t in trajs),
            "errors": sum(t.error is not None for t in trajs),
            "wall_s": round(wall, 1),
            "steps_per_s": round(steps / wall, 2),
            "generate_calls": calls,
            "mean_batch": round(items / max(calls, 1), 2),
            "max_steps_sum": sum(t.max_steps for t in sample),
            "extrapolated_all_tasks_s": round(wall * len(all_tasks) / len(sample), 0),
            "extrapolated_by_step_budget_s": round(wall * sum(t.max_steps for t in all_tasks)
                                                   / sum(t.max_steps for t in sample), 0),
            "all_tasks": len(all_tasks),
        }
        print(json.dumps(report["eval"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
