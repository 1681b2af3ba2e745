"""Time one evaluation of a tiny policy over world/test (n = 1), and the tiny profile's generation settings
against the old ones (issue 6).

    .venv/bin/python scripts/bench_eval.py --eval-max-new-tokens 24 --out bench.json   # all three parts
    .venv/bin/python scripts/bench_eval.py --full sft_reasoning_free                   # the acceptance figure
    python3 scripts/bench_eval.py --ckpt CKPT --dtypes cpu:fp32,cuda:fp32,cuda:bf16    # on a GPU

Parts: the oracle's prompts on every ``--every``-th task; those prompts through the HF backend, old and new
settings, responses forced to ``--answer-tokens``; a real ``evaluate``, projected to all of world/test.
``--full NAME`` times the ``evaluate`` stage's policy ``NAME`` on all of world/test. Without ``--ckpt`` a
random-init checkpoint of the base's shape is built (cached). Figures: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from mobilerl.agent import OraclePolicy, PolicyContext, PolicyOutput, prompt
from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.env.base import TaskSpec
from mobilerl.env.sim.tasks import list_tasks
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend

# The base being pretrained (docs/tiny_base.md): what the tiny profile will ship.
BASE_SHAPE = dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=384)
OLD = {"max_batch": 16, "prompt_style": "full", "max_history": None, "coords": "abs"}


class RecordingOracle:
    """The oracle, answering in the trained response format and keeping every context it is shown."""

    name = "oracle"

    def __init__(self) -> None:
        self.oracle = OraclePolicy()
        self.contexts: list[PolicyContext] = []

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        self.contexts.append(ctx)
        out = await self.oracle.act(ctx)
        return PolicyOutput(prompt.render_response(out.text))


def collect_contexts(tasks: list[TaskSpec], concurrency: int) -> tuple[list[PolicyContext], dict[str, Any]]:
    rec = RecordingOracle()
    t0 = time.perf_counter()
    trajs = evaluate_sync(lambda seed: rec, tasks, concurrency=concurrency, progress=False)
    wall = time.perf_counter() - t0
    steps = sum(len(t.steps) for t in trajs)
    info = {"tasks": len(tasks), "steps": steps, "success": sum(t.success for t in trajs), "wall_s": round(wall, 1),
            "env_plus_oracle_ms_per_step": round(1000 * wall / max(steps, 1), 2)}
    return rec.contexts, info


def build_checkpoint(path: Path, contexts: list[PolicyContext]) -> Path:
    """A random-init tiny model of the base's shape with a tokenizer trained on the collected prompts."""
    if (path / "tiny.json").exists():
        return path
    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import train_tokenizer

    tiny.offline()
    texts = [prompt.system_prompt("xml", r, s) for r in (False, True) for s in prompt.PROMPT_STYLES]
    for c in contexts:
        texts += [m["content"] for m in prompt.messages_for_context(c, mode="xml")[1:]]
    tok = train_tokenizer(texts, vocab_size=4096)
    shape = tiny.TinyShape(**BASE_SHAPE)
    model = tiny.build_model(shape, tok, seed=0)
    tiny.save(model, tiny.build_processor(tok), path, extra={"shape": tiny.shape_dict(shape), "bench": True})
    return path


def world_test() -> list[TaskSpec]:
    """world/test from the `tasks` stage's output when present (listing it here reruns the oracle on every
    task for the optimal step counts: a minute of CPU)."""
    from mobilerl.tasks import load_tasks, task_list_path

    if task_list_path("world", "test").exists():
        return load_tasks("world", "test")
    return list_tasks("world", "test")


def profile_settings() -> dict[str, Any]:
    from mobilerl.models.profiles import load_profile

    g = load_profile("tiny").generation
    return {"max_batch": g.max_batch, "prompt_style": g.prompt_style, "max_history": g.max_history,
            "coords": g.coords, "obs_mode": g.obs_mode, "max_new_tokens": g.max_new_tokens}


async def _generate_all(backend: HFBackend, requests: list[Any], sampling: SamplingConfig) -> list[Any]:
    """Every request as its own concurrent call (as concurrent episodes make them), request ``i`` with seed
    ``i``."""
    return [g for [g] in await asyncio.gather(*(backend.generate([r], dataclasses.replace(sampling, seed=i))
                                                 for i, r in enumerate(requests)))]


def bench_generation(backend: HFBackend, contexts: list[PolicyContext], settings: dict[str, Any], answer_tokens: int,
                     budget_steps: dict[str, int]) -> dict[str, Any]:
    """All ``contexts`` as concurrent single requests (as concurrent episodes make them), fixed answer length."""
    backend._batcher.max_batch = settings["max_batch"]
    policy = ModelPolicy(backend, obs_mode="xml", prompt_style=settings["prompt_style"],
                         max_history=settings["max_history"], coords=settings["coords"])
    requests = [policy.request(c) for c in contexts]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=answer_tokens, seed=0)
    asyncio.run(_generate_all(backend, requests[: settings["max_batch"]], sampling))  # warm-up
    b0, i0 = backend.stats.batches, backend.stats.items
    t0, c0 = time.perf_counter(), time.process_time()
    gens = asyncio.run(_generate_all(backend, requests, sampling))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    aps = len(gens) / wall
    out = {
        **settings,
        "requests": len(gens),
        "generate_calls": backend.stats.batches - b0,
        "mean_batch": round((backend.stats.items - i0) / max(backend.stats.batches - b0, 1), 1),
        "prompt_tokens_mean": round(statistics.mean(g.prompt_tokens for g in gens), 1),
        "prompt_tokens_max": max(g.prompt_tokens for g in gens),
        "new_tokens_mean": round(statistics.mean(len(g.token_ids) for g in gens), 1),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "actions_per_s": round(aps, 2),
        "actions_per_cpu_s": round(len(gens) / cpu, 2),
    }
    for k, steps in budget_steps.items():
        out[f"projected_{k}_s"] = round(steps / aps, 0)
        out[f"projected_{k}_cpu_s"] = round(steps * cpu / len(gens), 0)  # this process alone on one core
    return out


def model_concurrency() -> int:
    from mobilerl.config import load_params
    from mobilerl.eval.config import EvaluateConfig

    return load_params("evaluate", EvaluateConfig).model_concurrency


def peak_rss_mb(who: int) -> float:
    """Peak resident memory (MB) of this process (``RUSAGE_SELF``) or of its largest finished child."""
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux: KiB


def full_world_test(name: str, backend: dict[str, Any] | None = None, every: int = 1,
                    processes: int | None = None, concurrency: int | None = None,
                    env_threads: bool = False, reuse: bool = True, responses: Path | None = None
                    ) -> dict[str, Any]:
    """The ``evaluate`` stage's policy ``name`` over all of world/test (every ``every``-th task), n = 1: wall
    time and what it did. ``backend``: backend settings over the profile's (e.g. ``dtype``); ``processes``:
    worker processes instead of ``evaluate.model_processes`` (1: this process), ``concurrency``: episodes in
    flight (per process) instead of the stage's; ``env_threads``: the simulator in threads, as before it ran on
    the event loop (``evaluate(inline_env=False)``); ``reuse``: ``evaluate.reuse_greedy`` (False: every step
    generated); ``responses``: write each episode's responses there (JSON lines), to compare two runs."""
    from mobilerl.config import load_params
    from mobilerl.eval.checkpoints import checkpoint_policy, run_checkpoint
    from mobilerl.eval.config import EvaluateConfig

    cfg = load_params("evaluate", EvaluateConfig).model_copy(update={"reuse_greedy": reuse})
    if name not in cfg.checkpoints:
        raise SystemExit(f"--full: {name!r} is not under evaluate.checkpoints in params.yaml")
    n_proc = processes or cfg.model_processes
    tasks = world_test()[::every]
    if n_proc > 1:
        per_process = concurrency or max(1, cfg.model_concurrency // n_proc)
        t0 = time.perf_counter()
        trajs = run_checkpoint(name, tasks, cfg, processes=n_proc, concurrency=per_process, backend_overrides=backend,
                               inline_env=not env_threads)
        wall = time.perf_counter() - t0
        steps = sum(len(t.steps) for t in trajs)
        success = sum(t.success for t in trajs)
        save_responses(trajs, responses)
        return {"policy": name, "processes": n_proc, "reuse_greedy": reuse, "backend": backend or {}, "env_threads": env_threads,
                "tasks": len(tasks), "success": success,
                "episodes": len(trajs), "steps": steps, "success_rate": round(success / len(trajs), 4),
                "errors": sum(t.error is not None for t in trajs),
                "concurrency_per_process": per_process, "temperature": cfg.temperature,
                "wall_s": round(wall, 1), "steps_per_s": round(steps / wall, 2),
                "worker_peak_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN)}
    policy = checkpoint_policy(name, cfg.checkpoints[name], cfg, backend_overrides=backend)
    conc = concurrency or cfg.model_concurrency
    t0, c0 = time.perf_counter(), time.process_time()
    trajs = evaluate_sync(policy.with_seed, tasks, concurrency=conc, perturb=cfg.perturb, obs_mode=policy.obs_mode,
                          base_seed=cfg.seed, progress=True, inline_env=not env_threads)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    save_responses(trajs, responses)
    steps = sum(len(t.steps) for t in trajs)
    stats = policy.backend.stats
    new_tokens = sorted(len(s.logprobs or []) for t in trajs for s in t.steps)
    success = sum(t.success for t in trajs)
    return {"policy": name, "reuse_greedy": reuse,
            "dtype": str(policy.backend.model.dtype).removeprefix("torch."), "tasks": len(tasks),
            "success": success, "episodes": len(trajs), "steps": steps,
            "model_calls": stats.items, "success_rate": round(success / len(trajs), 4),
            "errors": sum(t.error is not None for t in trajs), "concurrency": conc, "processes": 1,
            "temperature": cfg.temperature, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "steps_per_s": round(steps / wall, 2), "peak_rss_mb": peak_rss_mb(resource.RUSAGE_SELF),
            "generate_calls": stats.batches,
            "mean_batch": round(stats.items / max(stats.batches, 1), 1), "generate_busy_s": round(stats.busy_s, 1),
            "new_tokens_mean": round(statistics.mean(new_tokens), 1) if new_tokens else 0,
            "new_tokens_p99": new_tokens[int(0.99 * (len(new_tokens) - 1))] if new_tokens else 0,
            "new_tokens_max": new_tokens[-1] if new_tokens else 0}


def save_responses(trajs: list, path: Path | None) -> None:
    """Each episode's task id, success and responses, one JSON line an episode, sorted by task id."""
    if path is not None:
        rows = sorted((t.task_id, t.trial, t.success, [s.response for s in t.steps]) for t in trajs)
        path.write_text("".join(json.dumps(dict(zip(("task_id", "trial", "success", "responses"), r, strict=True)))
                                + "\n" for r in rows))


def compare_dtypes(ckpt: Path, contexts: list[PolicyContext], dtypes: list[str], settings: dict[str, Any],
                   answer_tokens: int, budget_steps: dict[str, int]) -> dict[str, Any]:
    """The same contexts through the backend in each dtype: speed (forced answer length, as
    :func:`bench_generation`) and, greedy with a natural end, how many answers equal the first dtype's.
    A dtype may name its device, ``cuda:bf16`` (default ``cpu``): the GPU check compares ``cpu:fp32`` with
    ``cuda:fp32`` and ``cuda:bf16``."""
    out: dict[str, Any] = {}
    answers: dict[str, list[str]] = {}
    tokens: dict[str, list[tuple[list[int], list[float]]]] = {}
    for d in dtypes:
        device, _, dtype = d.rpartition(":")
        backend = HFBackend.from_pretrained(ckpt, device=device or "cpu", dtype=dtype, max_batch=settings["max_batch"])
        out[d] = bench_generation(backend, contexts, settings, answer_tokens, budget_steps)
        policy = ModelPolicy(backend, obs_mode="xml", prompt_style=settings["prompt_style"],
                             max_history=settings["max_history"], coords=settings["coords"])
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=64)
        gens = asyncio.run(_generate_all(backend, [policy.request(c) for c in contexts], greedy))
        answers[d] = [g.text for g in gens]
        tokens[d] = [(list(g.token_ids), list(g.logprobs or [])) for g in gens]
        print(f"generation {d}:", json.dumps(out[d]), flush=True)
    ref = dtypes[0]
    for d in dtypes[1:]:
        out[f"speedup_{d}_over_{ref}"] = round(out[d]["actions_per_s"] / out[ref]["actions_per_s"], 2)
        out[f"speedup_{d}_over_{ref}_cpu"] = round(out[d]["actions_per_cpu_s"] / out[ref]["actions_per_cpu_s"], 2)
        out[f"same_greedy_answer_{d}"] = round(
            sum(a == b for a, b in zip(answers[ref], answers[d], strict=True)) / max(len(contexts), 1), 4)
        # the same greedy tokens: how far apart are their logprobs (what RL's ratios would see)
        gaps = [abs(x - y) for (ta, la), (tb, lb) in zip(tokens[ref], tokens[d], strict=True) if ta == tb
                for x, y in zip(la, lb, strict=False)]
        if gaps:
            out[f"logprob_gap_{d}"] = {"max": round(max(gaps), 5), "mean": round(statistics.mean(gaps), 6),
                                       "tokens": len(gaps)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", type=Path, default=None, help="tiny checkpoint (default: build a random-init one)")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/mobilerl-bench-tiny"))
    ap.add_argument("--every", type=int, default=10, help="every N-th world/test task (10: 170 tasks)")
    ap.add_argument("--requests", type=int, default=256, help="contexts timed per setting")
    ap.add_argument("--answer-tokens", type=int, default=24, help="forced response length in the generation part")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="evaluation episodes in flight (default: evaluate.model_concurrency of params.yaml)")
    ap.add_argument("--max-history", type=int, default=-1,
                    help="override the profile's max_history in the new settings (-1: the profile's)")
    ap.add_argument("--eval-max-new-tokens", type=int, default=None,
                    help="response cap in the evaluation part (default: the profile's; an untrained model always "
                         "reaches it, so e.g. 24 gives a trained model's answer length at the full step budget)")
    ap.add_argument("--skip-old", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--skip-plain", action="store_true", help="skip the run without the lean text prefill")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--dtype", default=None, help="with --full: inference dtype instead of the profile's")
    ap.add_argument("--backend", metavar="KEY=VALUE", action="append", default=[],
                    help="with --full: a backend setting over the profile's (repeatable; the value is read as JSON, "
                         "e.g. --backend speculate_tokens=0 --backend prefix_cache_tokens=0)")
    ap.add_argument("--env-threads", action="store_true",
                    help="with --full: run the simulator's calls in threads (evaluate(inline_env=False)), not inline")
    ap.add_argument("--full-every", type=int, default=1, help="with --full: every N-th world/test task")
    ap.add_argument("--no-reuse", action="store_true",
                    help="with --full: generate every step (evaluate.reuse_greedy off), the baseline of the reuse")
    ap.add_argument("--responses", type=Path, default=None,
                    help="with --full: write every episode's responses here (JSON lines) to compare two runs")
    ap.add_argument("--processes", type=int, default=None,
                    help="with --full: worker processes (default: evaluate.model_processes; 1: this process)")
    ap.add_argument("--dtypes", default=None,
                    help="compare inference dtypes (e.g. fp32,bf16; cpu:fp32,cuda:bf16 across devices) on the sampled contexts: speed and greedy "
                         "agreement with the first; nothing else but the context collection")
    ap.add_argument("--full", metavar="NAME", default=None,
                    help="time checkpoint policy NAME of params.yaml's evaluate section over all of world/test "
                         "(n = 1), as the evaluate stage runs it; nothing else")
    args = ap.parse_args(argv)
    if args.full:
        over: dict[str, Any] = {}
        if args.dtype:
            over["dtype"] = args.dtype
        for kv in args.backend:
            key, sep, value = kv.partition("=")
            if not sep:
                raise SystemExit(f"--backend {kv!r}: expected KEY=VALUE")
            try:
                over[key] = json.loads(value)
            except json.JSONDecodeError:
                over[key] = value
        res = full_world_test(args.full, over, args.full_every, args.processes, args.concurrency, args.env_threads,
                              reuse=not args.no_reuse, responses=args.responses)
        print("full world/test:", json.dumps(res), flush=True)
        if args.out:
            args.out.write_text(json.dumps(res, indent=1) + "\n")
        return

    import torch

    report: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    all_tasks = world_test()
    subset = all_tasks[:: args.every]
    budget = {"optimal": sum(t.optimal_steps or 0 for t in all_tasks), "budget": sum(t.max_steps for t in all_tasks)}
    report["world_test"] = {"tasks": len(all_tasks), "optimal_steps": budget["optimal"], "step_budget": budget["budget"]}
    print(json.dumps(report), flush=True)

    contexts, info = collect_contexts(subset, concurrency=16)
    report["contexts"] = info
    print("contexts:", json.dumps(info), flush=True)
    ckpt = args.ckpt or build_checkpoint(args.build_dir, contexts)
    new = profile_settings()
    if args.max_history >= 0:
        new["max_history"] = args.max_history
    sample = random.Random(0).sample(contexts, min(args.requests, len(contexts)))
    if args.dtypes:
        report["dtypes"] = compare_dtypes(ckpt, sample, args.dtypes.split(","), {k: new[k] for k in OLD},
                                          args.answer_tokens, budget)
        print("dtypes:", json.dumps({k: v for k, v in report["dtypes"].items() if not isinstance(v, dict)}))
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        return
    backend = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=new["max_batch"])

    rows = {}
    for name, settings in (("old", OLD), ("new", {k: new[k] for k in OLD})):
        if name == "old" and args.skip_old:
            continue
        rows[name] = bench_generation(backend, sample, settings, args.answer_tokens, budget)
        print(f"generation {name}:", json.dumps(rows[name]), flush=True)
    if not args.skip_plain:  # the same settings without the lean text prefill (TextPrefill)
        plain = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=new["max_batch"], fast_prefill=False)
        rows["new_transformers_prefill"] = bench_generation(plain, sample, {k: new[k] for k in OLD},
                                                            args.answer_tokens, budget)
        print("generation new, transformers prefill:", json.dumps(rows["new_transformers_prefill"]), flush=True)
        report["speedup_text_prefill"] = round(
            rows["new"]["actions_per_s"] / rows["new_transformers_prefill"]["actions_per_s"], 2)
        report["speedup_text_prefill_cpu"] = round(
            rows["new"]["actions_per_cpu_s"] / rows["new_transformers_prefill"]["actions_per_cpu_s"], 2)
        print("speedup of the lean text prefill (actions/s, wall / CPU):", report["speedup_text_prefill"],
              report["speedup_text_prefill_cpu"], flush=True)
    report["generation"] = rows
    if "old" in rows:
        report["speedup_new_over_old"] = round(rows["new"]["actions_per_s"] / rows["old"]["actions_per_s"], 2)
        print("speedup new/old (actions/s):", report["speedup_new_over_old"], flush=True)

    if not args.skip_eval:
        backend._batcher.max_batch = new["max_batch"]
        cap = args.eval_max_new_tokens or new["max_new_tokens"]
        policy = ModelPolicy(backend, obs_mode=new["obs_mode"], prompt_style=new["prompt_style"],
                             max_history=new["max_history"], coords=new["coords"], name="tiny-random",
                             sampling=SamplingConfig(temperature=1.0, max_new_tokens=cap))
        concurrency = args.concurrency or model_concurrency()
        b0, i0, busy0 = backend.stats.batches, backend.stats.items, backend.stats.busy_s
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = evaluate_sync(policy.with_seed, subset, concurrency=concurrency, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        steps = sum(len(t.steps) for t in trajs)
        sub_budget = sum(t.max_steps for t in subset)
        calls = backend.stats.batches - b0
        report["eval"] = {
            "tasks": len(subset), "concurrency": concurrency, "max_new_tokens": cap, "max_history": new["max_history"],
            "steps": steps, "step_budget": sub_budget,
            "new_tokens_mean": round(statistics.mean(len(s.logprobs or []) for t in trajs for s in t.steps), 1),
            "invalid_share": round(sum(not s.valid for t in trajs for s in t.steps) / max(steps, 1), 3),
            "errors": sum(t.error is not None for t in trajs),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "steps_per_s": round(steps / wall, 2),
            "steps_per_cpu_s": round(steps / cpu, 2),
            "generate_calls": calls, "mean_batch": round((backend.stats.items - i0) / max(calls, 1), 1),
            "generate_busy_s": round(backend.stats.busy_s - busy0, 1),
            "projected_world_test_s": round(wall * budget["budget"] / sub_budget, 0),
            "projected_world_test_cpu_s": round(cpu * budget["budget"] / sub_budget, 0),
        }
        print("eval:", json.dumps(report["eval"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
