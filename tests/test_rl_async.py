"""The asynchronous RL mode (rl.async) and truncated importance sampling (rl.algo.tis_cap): staleness honoured and every
dropped trajectory counted, the admission bound, per-worker weight refresh, resume, the TIS weight and its use in
the update, and the stage run end to end through spawned workers."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import math
import random
import time
from pathlib import Path

import pytest
import torch
from rl_tasks import short_tasks, stage_root
from rl_workers import ThreadWorkers

from mobilerl.agent.policy import PolicyOutput
from mobilerl.env.actions import FINISH, TAP, Action, format_action
from mobilerl.env.base import TaskSpec
from mobilerl.env.fake import BUTTON, CounterEnv
from mobilerl.models.generation import ChatRequest
from mobilerl.rl.async_loop import drop_stale, train_async
from mobilerl.rl.async_workers import Job
from mobilerl.rl.batch import PromptFormat
from mobilerl.rl.checkpoint import load_state, state_key
from mobilerl.rl.config import RLConfig
from mobilerl.rl.loop import train
from mobilerl.rl.loss import policy_loss, tis_weights
from mobilerl.rl.trainer import Trainer
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
TAP_TEXT, FINISH_TEXT = format_action(Action(TAP, element=BUTTON)), format_action(Action(FINISH, message="ok"))


class SlowEnv:
    """The counter app; a reset/step sleeps ``slow`` s on tasks whose id contains "slow", ``fast`` s on others."""

    def __init__(self, fast: float = 0.002, slow: float = 0.15) -> None:
        self.env, self.fast, self.slow, self.latency = CounterEnv(), fast, slow, fast

    async def reset(self, task):
        self.latency = self.slow if "slow" in task.task_id else self.fast
        await asyncio.sleep(self.latency)
        return self.env.reset(task)

    async def step(self, action):
        await asyncio.sleep(self.latency)
        return self.env.step(action)

    async def evaluate(self):
        return self.env.evaluate()

    async def close(self):
        self.env.close()


class Policy:
    """Taps, then finishes after 1-4 steps (drawn from the episode's seed); records its weights version."""

    name = "fake"

    def __init__(self, seed: int, version: str) -> None:
        self.version, self.length = version, random.Random(seed).randint(1, 4)

    async def act(self, ctx):
        await asyncio.sleep(0)
        return PolicyOutput(FINISH_TEXT if ctx.step + 1 >= self.length else TAP_TEXT, logprobs=[-0.7, -0.2],
                            token_ids=[3, 4])


class Engine:
    def __init__(self, i: int, load_s: float = 0.0, log: list | None = None) -> None:
        self.i, self.version, self.load_s, self.log = i, 0, load_s, log if log is not None else []

    def policy(self, seed):
        return Policy(seed, str(self.version))

    async def load(self, version, path):
        t0 = time.perf_counter()
        await asyncio.sleep(self.load_s)
        self.version = version
        self.log.append((self.i, version, t0, time.perf_counter()))


class FakeTrainer(Trainer):
    """The real trainer (sampler, groups, replay, rows) with a sleeping update; records what each round trains."""

    update_s = 0.03

    def __init__(self, cfg):
        super().__init__(cfg, torch.nn.Linear(2, 2), lambda req: [1, 2, 3], 0, PromptFormat())
        self.trained: list[tuple[int, list[str | None]]] = []

    def batch(self, groups, r, ctx=None):
        self.trained.append((r, [t.policy_version for g in groups for t in g.trajectories]))
        return super().batch(groups, r, ctx)

    def update(self, rows):
        time.sleep(self.update_s)
        return {"train/rows": float(len(rows))}


def tasks(n_fast: int = 6, n_slow: int = 2) -> list[TaskSpec]:
    return [TaskSpec(task_id=f"t/train/{kind}{i}/2", suite="t", split="train", template=f"{kind}{i}",
                     instruction="Tap Add twice") for kind, k in (("fast", n_fast), ("slow", n_slow)) for i in range(k)]


def config(k: int | None, rounds: int = 6, **kw) -> RLConfig:
    return RLConfig.model_validate({
        "async": None if k is None else {"max_staleness": k}, "rounds": rounds, "checkpoint_every": 2,
        "fcf": False, "adapr": False,
        "overrides": {"train_batch_size": 4, "samples_per_task": 2, "kl_coef": 0.0}, **kw})


def workers(n: int = 2, slots: int = 3, **engine) -> ThreadWorkers:
    return ThreadWorkers(lambda i: Engine(i, **engine), SlowEnv, workers=n, slots=slots)


# ----------------------------------------------------------------------------------------------- TIS

def test_tis_weights_are_capped_one_on_policy_and_off_without_a_cap():
    old = torch.tensor([[-1.0, -1.0, -1.0, -2.0]])
    behaviour = torch.tensor([[-1.0, -1.5, -3.0, -1.0]])  # on-policy, stale by 0.5, stale by 2.0, newer
    w = tis_weights(old, behaviour, 2.0)
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(0.5), 2.0, math.exp(-1.0)]]))
    assert torch.equal(tis_weights(old, old, 2.0), torch.ones_like(old))
    assert torch.equal(tis_weights(old, behaviour, None), torch.ones_like(old))
    assert torch.isfinite(tis_weights(torch.zeros(1, 1), torch.full((1, 1), -1e4), 2.0)).all()


def test_tis_weight_scales_each_tokens_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = tis_weights(logp.detach(), logp.detach() - torch.tensor([[0.0, 0.3, 5.0]]), 2.0)
    loss_w, m = policy_loss(logp, logp.detach(), torch.tensor([1.5]), torch.ones(1, 3), kl_coef=0.0, tis_weight=w)
    (g_w,) = torch.autograd.grad(loss_w, logp)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.5]), torch.ones(1, 3), kl_coef=0.0)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(g_w, g * w) and m["tis_mean"] == pytest.approx(w.mean().item())
    assert w[0, 2] == pytest.approx(2.0) and w.requires_grad is False


def test_update_takes_the_ratio_against_pi_old_and_weights_by_the_truncated_gap():
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.rl.batch import Row, collate, rows_logprobs

    backend = HFBackend.from_pretrained(BASE, device="cpu")
    prompt = backend.prompt_ids(ChatRequest([{"role": "user", "content": "Tap the Add button."}]))
    row = Row(prompt, [11, 12, 13, 14], [0.0] * 4, advantage=1.0)
    with torch.no_grad():
        current = rows_logprobs(backend.model, collate([row], backend.pad_id), 1.0)[0][0].tolist()

    def stats(shift: float, cap: float | None) -> dict[str, float]:
        cfg = RLConfig(algo={"tis_cap": cap}, overrides={"kl_coef": 0.0, "learning_rate": 1e-9})
        model = copy.deepcopy(backend.model)  # a fresh copy per case: an update steps its weights
        trainer = Trainer(cfg, model, backend.prompt_ids, backend.pad_id, PromptFormat())
        stale = dataclasses.replace(row, behaviour_logprobs=[lp - shift for lp in current], on_policy=False)
        return trainer.update([stale])

    plain = stats(0.5, None)  # today's ratio: against the behaviour logprobs, exp(0.5)
    assert plain["loss/ratio_mean"] == pytest.approx(math.exp(0.5), rel=1e-4) and "loss/tis_mean" not in plain
    tis = stats(0.5, 2.0)  # ratio against π_old (= π_θ at the first epoch), weight exp(0.5) < 2
    assert tis["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert tis["loss/tis_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert tis["loss/policy"] == pytest.approx(-math.exp(0.5), rel=1e-4)  # −w·A, A = 1
    capped = stats(1.0, 2.0)
    assert capped["loss/tis_mean"] == pytest.approx(2.0) and capped["loss/tis_capped_frac"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ staleness

def test_drop_stale_keeps_within_k_and_reports_ages():
    ts = [Trajectory(task_id="a", policy_version=v) for v in ("5", "4", "3", None)]
    kept, ages = drop_stale(ts, 5, 1)
    assert [t.policy_version for t in kept] == ["5", "4", None] and ages == [0, 1, 0]
    with pytest.raises(ValueError, match="policy_version 'sim'"):
        drop_stale([Trajectory(task_id="a", policy_version="sim")], 5, 1)


def test_fresh_rows_of_an_older_version_are_off_policy():
    trainer = FakeTrainer(config(1))
    with workers() as w:
        trajs, _ = w.run(tasks(2, 0), 2, base_seed=0)
    for t, v in zip(trajs, ["3", "2", "3", "2"], strict=True):
        t.policy_version = v
    from mobilerl.rl.groups import make_groups, score_groups

    groups, _ = make_groups(trajs)
    score_groups(groups, None, None, torch.Generator())
    for g in groups:
        g.keep = [1.0] * len(g.trajectories)
    rows, _ = trainer.batch(groups, 3)
    flags = {r.on_policy for r in rows}
    assert flags == {True, False}
    assert sum(r.on_policy for r in rows) == sum(t.n_steps for t in trajs if t.policy_version == "3")


def test_async_with_a_slow_env_honours_max_staleness_and_counts_every_drop(tmp_path, caplog):
    cfg = config(1, rounds=6)
    trainer = FakeTrainer(cfg)
    with caplog.at_level(logging.WARNING, logger="mobilerl.rl.async_loop"), workers() as w:
        curve = train_async(trainer, w, tasks(), tmp_path, progress=False)
    assert [c["round"] for c in curve] == list(range(6))
    for r, versions in trainer.trained:  # nothing older than k = 1 version reached an update
        assert all(v is None or r - int(v) <= 1 for v in versions), (r, versions)
    g, n = 4, 2
    for c in curve:  # every episode a round took is trained, dropped as stale, or an env failure: none vanish
        assert c["rollout/episodes"] + c["async/dropped_stale"] + c["rollout/env_failures"] == g * n
        assert c["async/staleness_max"] <= 1
        assert c["async/episodes_in_flight"] + n * c["async/groups_waiting"] <= (1 + 1) * g * n  # admission
    dropped = sum(c["async/dropped_stale"] for c in curve)
    assert dropped > 0, "slow episodes (0.15 s a step) outlive a 0.03 s update: some must be stale"
    assert sum(int(m.split("dropped ")[1].split()[0]) for m in caplog.messages if "dropped" in m) == dropped
    assert not list(tmp_path.glob("policy.v*.safetensors"))  # the versioned weights are gone with the run


def test_async_keeps_stale_trajectories_within_k_and_the_sync_default_is_unchanged(tmp_path, capsys, caplog):
    cfg = config(2, rounds=5)
    trainer = FakeTrainer(cfg)
    with workers() as w:
        curve = train_async(trainer, w, tasks(), tmp_path / "a")
    ages = [r - int(v) for r, vs in trainer.trained for v in vs]
    assert max(ages) <= 2 and max(ages) >= 1  # the pipeline runs ahead of the trainer, within k
    assert all(c["async/episodes_in_flight"] <= 3 * 4 * 2 for c in curve)

    sync = FakeTrainer(config(None, rounds=3))  # no rl.async: train()'s rounds, every episode of the round's version
    def broken(images, r):
        raise OSError("artifact store full")

    with workers() as w, caplog.at_level(logging.WARNING, logger="mobilerl.rl.loop"):
        train(sync, w, tasks(), tmp_path / "s", log_images=broken)
    assert all(v == str(r) for r, vs in sync.trained for v in vs)
    assert [m for m in caplog.messages if "episode images failed" in m]  # the run went on (rounds 0 and 2 drew)
    # a watched run (make run, a deployment's log) gets a line a round from either loop, with its ETA
    lines = [x for x in capsys.readouterr().out.splitlines() if " round " in x]
    assert [x.split(":")[0] for x in lines] == [f"adagrpo-async round {r}/5" for r in range(1, 6)] + [
        f"adagrpo round {r}/3" for r in range(1, 4)], lines
    assert all("rollout/success " in x and " s, ETA " in x for x in lines) and lines[-1].endswith("ETA 0.0 min")
    assert RLConfig().async_ is None and RLConfig().algo.tis_cap is None


def test_each_worker_loads_a_new_version_by_itself_and_episodes_in_flight_go_on(tmp_path):
    loads: list = []
    with ThreadWorkers(lambda i: Engine(i, load_s=0.2, log=loads), SlowEnv, workers=2, slots=2) as w:
        w.jobs.put(Job(0, tasks(0, 1)[0], 0, 7))  # a slow episode (0.15 s a call), in flight at the publish
        time.sleep(0.1)
        t0 = time.perf_counter()
        w.publish(1, tmp_path / "unused")
        assert time.perf_counter() - t0 < 0.05  # publishing waits for no worker
        for t in tasks(6, 0):
            w.jobs.put(Job(0, t, 0, 1))
        got = [w.results.get(timeout=10) for _ in range(9)]  # 7 episodes and 2 loads
    episodes = {item[2].task_id: item[2] for item in got if item[0] == "episode"}
    slow = episodes.pop("t/train/slow0/2")
    assert slow.policy_version == "0" and slow.error is None  # not interrupted, recorded with its start version
    assert {t.policy_version for t in episodes.values()} == {"1"}  # started after the publish: the new weights
    assert sorted((i, v) for i, v, _, _ in loads) == [(0, 1), (1, 1)]  # one load per worker and version


def test_a_load_whose_file_the_trainer_deleted_meanwhile_loads_the_newest_version(tmp_path):
    class FileEngine(Engine):  # reads the file as the HF backend does: gone means FileNotFoundError
        async def load(self, version, path):
            if version == 1:
                w.publish(4, tmp_path / "v4")  # the trainer moved on while this load was queued; v1 is deleted
            Path(path).read_bytes()
            await super().load(version, path)

    (tmp_path / "v4").write_bytes(b"w")
    loads: list = []
    with ThreadWorkers(lambda i: FileEngine(i, log=loads), SlowEnv, workers=1, slots=1) as w:
        w.publish(1, tmp_path / "v1")
        w.jobs.put(Job(0, tasks(1, 0)[0], 0, 1))
        got = [w.results.get(timeout=10) for _ in range(2)]
    assert [v for _, v, _, _ in loads] == [4]
    assert {x[0] for x in got} == {"load", "episode"}
    assert next(x[2] for x in got if x[0] == "episode").policy_version == "4"


def test_a_resumed_async_run_continues_from_its_checkpoint_at_its_untrained_draws(tmp_path):
    cfg = config(1, rounds=2)
    first = FakeTrainer(cfg)
    with workers() as w:
        train_async(first, w, tasks(), tmp_path, progress=False)
    point = json.loads((tmp_path / "async.json").read_text())
    trained = {(d, t) for d, t in point["trained"]}
    assert (tmp_path / "state.pt").exists() and all(d >= point["draws"] for d, _ in trained)
    with (tmp_path / "curve.jsonl").open("a") as f:  # a round the killed run logged after its checkpoint
        f.write(json.dumps({"round": 2, "rollout/success": 0.0}) + "\n")
    resumed = FakeTrainer(config(1, rounds=4))
    resumed.load_state_dict(load_state(tmp_path, state_key(RLConfig().state_key)))
    seen: list[int] = []
    original = resumed.sample_tasks
    resumed.sample_tasks = lambda pool, d: (seen.append(d), original(pool, d))[1]
    issued: set[tuple[int, str]] = set()
    with workers() as w:
        put = w.jobs.put
        w.jobs.put = lambda job, *a, **k: (issued.add((job.draw, job.task.task_id)), put(job, *a, **k))[1]
        curve = train_async(resumed, w, tasks(), tmp_path, progress=False)
    assert [c["round"] for c in curve] == [0, 1, 2, 3] and "rollout/episodes" in curve[2]
    assert not issued & trained  # a group the killed run trained is not rolled out again
    assert min(seen) == point["draws"]  # the oldest draw with a group the killed run had not trained
    assert [r for r, _ in resumed.trained] == [2, 3]
    assert all(int(v) >= 2 for _, vs in resumed.trained for v in vs)  # the workers began at the checkpoint


def test_config_names_bad_async_keys():
    with pytest.raises(ValueError, match="async.max_staleness"):
        RLConfig.model_validate({"async": {"max_staleness": -1}})
    with pytest.raises(ValueError, match="tis_cap"):
        RLConfig(algo={"tis_cap": 0.5})
    assert RLConfig.model_validate({"async": {"max_staleness": 1}}).async_.max_staleness == 1


def test_a_dead_worker_fails_the_run_instead_of_hanging(tmp_path):
    class Broken(Engine):
        async def load(self, version, path):
            raise RuntimeError("weights unreadable")

    cfg = config(0, rounds=3)
    with ThreadWorkers(lambda i: Broken(i), SlowEnv, workers=1, slots=2) as w, \
            pytest.raises(RuntimeError, match="rollout"):
        train_async(FakeTrainer(cfg), w, tasks(), tmp_path, progress=False)


# ------------------------------------------------------------------------------ the stage, end to end

RUN = """
import json, sys
from pathlib import Path
from mobilerl.rl.config import RLConfig
from mobilerl.rl.run import run
cfg = RLConfig.model_validate(json.loads(sys.argv[1]))
summary, curve = run(cfg, Path(sys.argv[2]), progress=False)
print(json.dumps(curve))
"""


@pytest.mark.slow
def test_the_stage_runs_async_through_spawned_workers_with_the_tiny_model(tmp_path):
    import subprocess
    import sys

    stage_root(tmp_path, short_tasks(3))
    cfg = {"init": str(BASE), "out": "out", "work": "work", "rounds": 3, "checkpoint_every": 2,
           "rollout_processes": 2, "rollout_concurrency": 2, "max_batch": 2, "algo": {"tis_cap": 2.0},
           "async": {"max_staleness": 1},
           "overrides": {"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 12, "learning_rate": 1e-3}}
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(cfg), str(tmp_path)], check=True, timeout=900,
                         capture_output=True, text=True)
    curve = json.loads(out.stdout.strip().splitlines()[-1])
    assert [c["round"] for c in curve] == [0, 1, 2]
    assert all(c["async/staleness_max"] <= 1 for c in curve)
    assert all(c["rollout/episodes"] + c["async/dropped_stale"] + c["rollout/env_failures"] == 4 for c in curve)
    assert sum(c["async/worker_loads"] for c in curve) >= 2  # each process loaded a published version
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert not list((tmp_path / "work").glob("policy.v*"))
    assert "Traceback" not in out.stderr, out.stderr[-3000:]  # the workers, stopped at the end, exit quietly


@pytest.mark.slow
def test_a_workers_refreshed_weights_are_the_trainers_of_that_version(tmp_path):
    """max_staleness 0: every row is on-policy, so the trainer's recomputed logprobs must equal the worker's
    sampling logprobs after each in-place load (the gap), and the TIS weight must be 1."""
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.env.pool import InlineEnv
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.rl.async_workers import ModelEngine

    fmt = PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks")

    def engine(i: int) -> ModelEngine:
        backend = HFBackend.from_pretrained(BASE, device="cpu", max_batch=1)
        return ModelEngine(ModelPolicy(backend, obs_mode=fmt.obs_mode, prompt_style=fmt.prompt_style,
                                       max_history=fmt.max_history, coords=fmt.coords, reuse_greedy=False,
                                       sampling=SamplingConfig(temperature=1.0, max_new_tokens=12, seed=0)))

    class Judge:  # the tiny base solves nothing: half the episodes are called successes, so groups have signal
        def score(self, trajs):
            return [0.9 if i % 2 == 0 else 0.1 for i in range(len(trajs))]

    cfg = RLConfig.model_validate({
        "async": {"max_staleness": 0}, "algo": {"tis_cap": 2.0}, "rounds": 3, "fcf": False, "adapr": False,
        "lab_share": 1.0, "reward_model": "the Judge below",  # the pool's tasks hide their verifier
        "overrides": {"train_batch_size": 2, "samples_per_task": 2, "kl_coef": 0.0, "learning_rate": 1e-3,
                      "max_new_tokens": 12}})
    backend = HFBackend.from_pretrained(BASE, device="cpu", fast_prefill=False, prefix_cache_tokens=0)
    trainer = Trainer(cfg, backend.model, backend.prompt_ids, backend.pad_id, fmt)
    pool = [dataclasses.replace(t, has_verifier=False) for t in short_tasks(3)]
    with ThreadWorkers(engine, lambda: InlineEnv(SimEnv(render=False)), workers=2, slots=2) as w:
        curve = train_async(trainer, w, pool, tmp_path, progress=False, judge=Judge())
    assert all(c["train/rows"] > 0 for c in curve) and sum(c["async/worker_loads"] for c in curve) >= 2
    assert all(c["reward/verifier_pass"] == 0.0 for c in curve)  # the monitor's replay: the base solves nothing
    assert all(c["loss/logprob_gap_max"] < 1e-3 for c in curve), [c["loss/logprob_gap_max"] for c in curve]
    assert all(c["loss/tis_mean"] == pytest.approx(1.0, abs=1e-3) for c in curve)


# ------------------------------------------------------------------------ reruns, peer options in the async loop

class FailingPolicy(Policy):
    """A policy whose engine is gone: its first call fails as an engine failure (error kind ``engine``)."""

    async def act(self, ctx):
        from mobilerl.models.generation import EngineUnavailable

        raise EngineUnavailable("POST http://engine/v1/chat/completions failed after 2 attempts")


def test_an_episode_cut_short_by_its_engine_runs_again_and_one_that_keeps_failing_is_dropped_counted(tmp_path):
    calls: dict[int, int] = {}  # attempts of each episode (its seed), over every worker's engine

    class FlakyEngine(Engine):
        def policy(self, seed):
            calls[seed] = calls.get(seed, 0) + 1
            down = seed % 7 == 0 or (seed % 3 == 0 and calls[seed] == 1)  # every attempt, or the first only
            return (FailingPolicy if down else Policy)(seed, str(self.version))

    trainer = FakeTrainer(config(1, rounds=4))
    with ThreadWorkers(lambda i: FlakyEngine(i), SlowEnv, workers=2, slots=3, reruns=1) as w:
        curve = train_async(trainer, w, tasks(), tmp_path, progress=False)
    for c in curve:  # every episode is trained, stale, or a counted failure
        assert (c["rollout/episodes"] + c["async/dropped_stale"] + c["rollout/env_failures"]
                + c["rollout/engine_failures"]) == 4 * 2
    assert sum(c["rollout/engine_failures"] for c in curve) >= 1  # seed % 7: both attempts failed
    assert sum(c["async/reruns"] for c in curve) > sum(c["rollout/engine_failures"] for c in curve)
    assert max(calls.values()) == 2  # one rerun at most (rl.async.reruns = 1)


def test_judge_all_and_distrl_run_in_the_async_loop(tmp_path):
    from mobilerl.models.hf_backend import HFBackend

    class Judge:
        def score(self, trajs):
            return [0.9 if i % 2 == 0 else 0.1 for i in range(len(trajs))]

    backend = HFBackend.from_pretrained(BASE, device="cpu", fast_prefill=False, prefix_cache_tokens=0)

    class TinyTrainer(FakeTrainer):  # the tiny model: DistRL's Retrace needs the current policy's logprobs
        def __init__(self, cfg):
            Trainer.__init__(self, cfg, backend.model, backend.prompt_ids, backend.pad_id, PromptFormat())
            self.trained = []

    cfg = config(1, rounds=4, judge_all=True, reward_model="the Judge", distrl={"replay_share": 1.0})
    trainer = TinyTrainer(cfg)
    with workers() as w:
        curve = train_async(trainer, w, tasks(), tmp_path, progress=False, judge=Judge())
    assert all(c["reward/judged"] == c["rollout/episodes"] and "rollout/verified_success" in c for c in curve)
    assert all(c["reward/audited"] >= 1 and "reward/judge_minus_verifier" in c for c in curve)  # the monitor
    assert curve[-1]["distrl/buffer_size"] > 0 and sum(c["distrl/replayed"] for c in curve) > 0
    assert all(0 < c["distrl/retrace_weight_mean"] <= 1 for c in curve[1:])  # stale fresh rows are traced too


def test_async_with_an_option_its_loop_lacks_is_a_config_error():
    import pytest

    from mobilerl.rl.config import RLConfig

    with pytest.raises(ValueError, match="rl.async is not combined with rl.dart"):
        RLConfig.model_validate({"async": {"max_staleness": 1}, "dart": {}})
    assert RLConfig.model_validate({"async": {"max_staleness": 1}}).async_ is not None


def test_bench_async_script_runs_both_modes():
    """scripts/bench_async.py's simulated mode as users run it (a tiny budget): both loops finish their rounds, the
    asynchronous one within its staleness bound, nothing dropped (figures are not asserted, only their shape)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_async.py"
    args = ["--envs", "8", "--engines", "2", "--latency", "0.05", "--tasks", "4", "--n", "2", "--rounds", "2",
            "--rounds-sync", "1", "--train", "0.1", "--staleness", "1", "--json"]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, check=True)
    sync, async_ = json.loads(out.stdout)["modes"]
    assert (sync["mode"], sync["rounds"], async_["mode"], async_["rounds"]) == ("sync", 1, "async k=1", 2)
    assert 0 < sync["env_util"] <= 1 and 0 < async_["env_util"] <= 1 and async_["env_steps_per_s"] > 0
    assert async_["dropped_stale"] == 0 and 0 <= async_["staleness_mean"] <= 1
