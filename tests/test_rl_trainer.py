"""AdaGRPO's trainer on the tiny base: prompts rebuilt as the policy saw them, the rollout/trainer logprob match,
the update, replay against stored logprobs, env failures dropped, and resume after kill -9."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from rl_tasks import short_tasks, stage_root

from mobilerl.agent.model_policy import ModelPolicy
from mobilerl.eval.runner import evaluate_sync
from mobilerl.models.generation import SamplingConfig
from mobilerl.models.hf_backend import HFBackend
from mobilerl.rl.batch import (
    PromptFormat,
    collate,
    micro_batches,
    rows_logprobs,
    step_requests,
    trajectory_rows,
)
from mobilerl.rl.config import RLConfig
from mobilerl.rl.groups import Group, RoundError, judge_rewards, make_groups, round_metrics, score_groups
from mobilerl.rl.loss import policy_loss
from mobilerl.rl.trainer import Trainer
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"
FMT = PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks")


class Recording:
    """A backend wrapper that keeps every request it generates for."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    async def generate(self, requests, sampling):
        self.requests.extend(requests)
        return await self.inner.generate(requests, sampling)


@pytest.fixture(scope="module")
def rollouts():
    backend = HFBackend.from_pretrained(BASE, device="cpu")
    rec = Recording(backend)
    policy = ModelPolicy(rec, obs_mode=FMT.obs_mode, prompt_style=FMT.prompt_style, max_history=FMT.max_history,
                         coords=FMT.coords, reuse_greedy=False,
                         sampling=SamplingConfig(temperature=1.0, max_new_tokens=24, seed=0))
    trajs = evaluate_sync(policy.with_seed, short_tasks(), n_trials=2, progress=False, concurrency=4)
    return backend, rec.requests, trajs


def test_rebuilt_prompts_are_the_policys_prompts(rollouts):
    _, requests, trajs = rollouts
    seen = sorted(json.dumps(r.messages) for r in requests)
    rebuilt = sorted(json.dumps(r.messages) for t in trajs for r in step_requests(t, FMT))
    assert len(rebuilt) == sum(t.n_steps for t in trajs) > 0
    assert rebuilt == seen


def test_recomputed_logprobs_equal_the_rollouts(rollouts):
    backend, _, trajs = rollouts
    rows = [r for t in trajs for r in trajectory_rows(t, 1.0, FMT, backend.prompt_ids)]
    assert rows and all(len(r.response_ids) == len(r.behaviour_logprobs) for r in rows)
    b = collate(rows, backend.pad_id)
    with torch.no_grad():
        logp, _ = rows_logprobs(backend.model, b, 1.0)
    gap = ((logp - b["behaviour_logprobs"]).abs() * b["response_mask"]).max().item()
    assert gap < 1e-4, f"trainer and rollout logprobs differ by {gap}"


def test_identical_sequences_share_one_forward_and_the_gradient_is_unchanged(rollouts):
    backend, _, trajs = rollouts
    rows = [r for t in trajs for r in trajectory_rows(t, 1.0, FMT, backend.prompt_ids)]
    replays = [dataclasses.replace(r, behaviour_logprobs=[lp - 0.3 for lp in r.behaviour_logprobs], advantage=-0.5,
                                   on_policy=False) for r in rows]  # same tokens, an older policy's logprobs
    mixed = rows + replays
    batches = micro_batches(mixed, 4096)
    assert sum(len(mb) for mb in batches) == len(mixed)
    assert sum(collate(mb, 0)["input_ids"].shape[0] for mb in batches) == len({
        (tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows})  # each distinct sequence forwarded once
    model = HFBackend.from_pretrained(BASE, device="cpu").model

    def grads(groups):
        model.zero_grad()
        for g in groups:
            b = collate(g, backend.pad_id)
            logp, _ = rows_logprobs(model, b, 1.0)
            loss, _ = policy_loss(logp, b["behaviour_logprobs"], b["advantages"], b["response_mask"], kl_coef=0.0)
            (loss * b["response_mask"].sum()).backward()  # token-mean x tokens: the batches' sum
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    shared, alone = grads(batches), grads([[r] for r in mixed])
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(shared, alone, strict=True))


def _trainer(backend, algo=None, curriculum=None, **overrides) -> Trainer:
    cfg = RLConfig(overrides={"kl_coef": 0.0, "learning_rate": 1e-3, **overrides}, algo=algo or {},
                   curriculum=curriculum)
    model = HFBackend.from_pretrained(BASE, device="cpu").model  # a fresh copy: the fixture's stays as sampled
    return Trainer(cfg, model, backend.prompt_ids, backend.pad_id, FMT)


def test_update_lowers_the_loss_on_a_fixed_batch(rollouts):
    backend, _, trajs = rollouts
    trainer = _trainer(backend)
    rows = [r for i, t in enumerate(trajs) for r in trajectory_rows(t, 1.0 if i % 2 else -1.0, FMT,
                                                                      backend.prompt_ids)]
    losses = [trainer.update(rows)["loss/policy"] for _ in range(3)]
    assert losses[-1] < losses[0]


def test_replayed_samples_use_their_stored_logprobs(rollouts):
    backend, _, trajs = rollouts
    trainer = _trainer(backend)
    old = Trajectory.from_dict(trajs[0].to_dict())
    for s in old.steps:
        s.logprobs = [lp - 0.5 for lp in s.logprobs]  # as if generated by an older policy
    trainer.buffer.push([old], [1.0], round=0)
    rows, m = trainer.batch([], 1)
    assert m["buffer/replayed"] == 1 and rows
    assert [lp for r in rows for lp in r.behaviour_logprobs] == [lp for s in old.steps for lp in s.logprobs]
    stats = trainer.update(rows)
    assert stats["loss/ratio_mean"] > 1.5  # exp(0.5): the ratio is taken against the stored logprobs


def test_adapr_push_first_replays_the_rounds_best_in_that_round_and_after_it_not(rollouts):
    backend, _, trajs = rollouts
    group = Group("t", [Trajectory.from_dict(t.to_dict()) for t in trajs[:2]], advantages=[1.0, -1.0],
                  keep=[1.0, 1.0])
    for push_first, replayed in ((False, 0.0), (True, 1.0)):
        trainer = _trainer(backend, algo={"adapr_push_first": push_first})
        _, m = trainer.batch([group], 0)
        assert m["buffer/replayed"] == replayed and len(trainer.buffer) == 1


def test_a_reverse_curriculum_starts_the_rounds_tasks_late_and_its_state_resumes(rollouts):
    backend, _, _ = rollouts
    trainer = _trainer(backend, curriculum={"start": 2})
    pool = short_tasks(3, max_steps=8)
    tasks = trainer.sample_tasks(pool, 0)
    assert tasks and all(t.expert_prefix == max(0, t.optimal_steps - 2) for t in tasks)
    trainer.reverse.update(tasks[0].task_id, [1.0, 1.0])
    restored = _trainer(backend, curriculum={"start": 2})
    restored.load_state_dict(trainer.state_dict())
    assert restored.reverse.prefix(tasks[0]) == max(0, tasks[0].optimal_steps - 3)
    assert all(t.expert_prefix == 0 for t in _trainer(backend).sample_tasks(pool, 0))  # off: whole tasks


def test_entropy_bonus_raises_the_policys_entropy(rollouts):
    backend, _, trajs = rollouts
    rows = [r for t in trajs for r in trajectory_rows(t, 0.0, FMT, backend.prompt_ids)]  # no advantage: only the bonus
    for coef, rises in ((0.0, False), (1.0, True)):
        trainer = _trainer(backend, algo={"entropy_coef": coef})
        first = trainer.update(rows)["loss/entropy"]
        then = [trainer.update(rows)["loss/entropy"] for _ in range(2)][-1]
        assert (then > first + 1e-3) == rises, (coef, first, then)


def test_reference_logprobs_are_computed_once_and_kept_with_a_buffered_trajectory(rollouts):
    backend, _, trajs = rollouts
    trainer = _trainer(backend, kl_coef=0.01)
    t = Trajectory.from_dict(trajs[0].to_dict())
    rows = trajectory_rows(t, 1.0, FMT, backend.prompt_ids)
    trainer.reference_logprobs(rows)
    with torch.no_grad():
        direct, _ = rows_logprobs(trainer.ref, collate(rows, backend.pad_id), 1.0)
    got = torch.tensor([lp for r in rows for lp in r.ref_logprobs])
    assert torch.allclose(got, direct[collate(rows, backend.pad_id)["response_mask"] > 0], atol=1e-5)
    t.meta["ref_logprobs"] = [[0.0] * len(r.response_ids) for r in rows]  # stored by an earlier round
    trainer.buffer.push([t], [1.0], round=0)
    restored = _trainer(backend, kl_coef=0.01)
    restored.load_state_dict(trainer.state_dict())
    replay, _ = restored.batch([], 1)
    restored.reference_logprobs(replay)  # nothing left to compute: the stored values stay
    assert [lp for r in replay for lp in r.ref_logprobs] == [0.0] * sum(len(r.response_ids) for r in rows)


def test_env_failures_are_dropped_not_scored_and_all_failed_groups_give_no_loss():
    def traj(task, success, kind=None):
        t = Trajectory(task_id=task, success=success, reward=float(success), steps=[], finished=kind is None)
        if kind in ("env", "policy"):
            t.fail(kind, "EnvCrashed: worker died" if kind == "env" else "PolicyError: no screenshot")
        elif kind is not None:
            t.error_kind = kind
        return t

    groups, dropped = make_groups([traj("a", True), traj("a", False, "env"), traj("a", False),
                                   traj("b", False, "budget"), traj("b", False, "parse")])
    assert dropped == 1 and [len(g.trajectories) for g in groups] == [2, 2]
    assert round_metrics(groups, dropped)["rollout/budget_spent"] == 1.0
    assert round_metrics(groups, dropped)["rollout/parse_failures"] == 1.0
    score_groups(groups, 1.0, 2.0, torch.Generator().manual_seed(0))
    assert groups[0].advantages[0] > 0 > groups[0].advantages[1]
    assert groups[1].keep == [0.0, 0.0] and groups[1].advantages == [0.0, 0.0]
    # a policy that cannot run is a configuration fault: the round stops and says which episode and why
    with pytest.raises(RoundError, match=r"1 of 3 episodes could not run the policy, e.g. b trial 0: policy: "
                                         r"PolicyError: no screenshot"):
        make_groups([traj("a", True), traj("a", False), traj("b", False, "policy")])


def test_a_stored_record_without_an_error_kind_takes_it_from_its_message():
    t = Trajectory.from_dict({"task_id": "a", "error": "policy: RuntimeError: engine down"})
    assert t.error_kind == "policy"
    assert Trajectory.from_dict({"task_id": "a", "error": "env: EnvCrashed"}).error_kind == "env"
    with pytest.raises(ValueError, match="error_kind 'weird'"):
        Trajectory.from_dict({"task_id": "a", "error_kind": "weird"})


def test_hidden_verifier_episodes_take_the_judges_verdict_and_lab_share_splits_the_round():
    class Judge:  # P(completed) alternating high / low
        def score(self, trajs):
            return [0.9 if i % 2 == 0 else 0.2 for i in range(len(trajs))]

    lab = [Trajectory(task_id=f"lab/train/T/{i}", has_verifier=False, steps=[], finished=True) for i in range(3)]
    world = Trajectory(task_id="world/train/T/0", success=False, reward=0.0, steps=[], finished=True)
    broken = Trajectory(task_id="lab/train/T/9", has_verifier=False, error="policy: boom", steps=[])
    assert judge_rewards([*lab, world, broken], Judge()) == 3
    assert [t.success for t in lab] == [True, False, True] and [t.reward for t in lab] == [1.0, 0.0, 1.0]
    assert world.reward == 0.0 and not broken.success and lab[0].meta["judge_p"] == 0.9

    with pytest.raises(ValueError, match="rl.reward_model"):
        RLConfig(lab_share=0.2)
    cfg = RLConfig(lab_share=0.25, reward_model="data/reward/model", overrides={"train_batch_size": 8, "kl_coef": 0.0})
    trainer = Trainer(cfg, torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    base = short_tasks(1)[0]
    pool = [dataclasses.replace(base, task_id=f"{s}/train/T/{i}", suite=s, has_verifier=s == "world")
            for s in ("world", "lab") for i in range(10)]
    chosen = trainer.sample_tasks(pool, 0)
    assert sum(t.suite == "world" for t in chosen) == 6 and sum(t.suite == "lab" for t in chosen) == 2


RUN = """
import json, sys
from pathlib import Path
from mobilerl.rl.config import RLConfig
from mobilerl.rl.run import run
cfg = RLConfig.model_validate(json.loads(sys.argv[1]))
run(cfg, Path(sys.argv[2]), progress=False)
"""


def _stage_root(tmp: Path) -> Path:
    """A repo root with task lists: four short world/train tasks, and a test task of each of their templates
    needing 3, 4, 5 and 6 optimal steps."""
    return stage_root(tmp, short_tasks(4), [3, 4, 5, 6])


# world/train tasks the tiny base solves now and then at T = 1 (a count it can guess, a song it can play): a run
# from it trains, so the kill -9 tests compare trained weights
SOLVABLE = ("world/train/GalleryCameraFolderCount/5", "world/train/GalleryCameraFolderCount/8",
            "world/train/RetroPlaySong/2")


def _solvable_root(tmp: Path) -> Path:
    from mobilerl.env.sim.tasks.registry import get_task

    tasks = [dataclasses.replace(get_task(t), complexity=0.5) for t in SOLVABLE]  # 5 steps an episode
    return stage_root(tmp, tasks)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("loop", ["sync", "async"])
def test_kill_9_then_rerun_resumes_and_ends_with_the_uninterrupted_weights(tmp_path, loop):
    """A run that trains is killed after a checkpoint, leaves nothing readable behind, and resumes to the weights
    of the uninterrupted run (the asynchronous loop at max_staleness 0, whose rounds are deterministic)."""
    from safetensors.torch import load_file

    from mobilerl.data.audit import audit_files, sim_canaries

    def cfg(name: str) -> str:
        return json.dumps({"init": str(BASE), "out": f"out_{name}", "work": f"work_{name}", "rounds": 2,
                           "checkpoint_every": 1, "rollout_processes": 1, "max_batch": 1, "fcf": False,
                           "state_key": str(tmp_path / "keys" / "rl.key"),
                           **({"async": {"max_staleness": 0}} if loop == "async" else {}),
                           "overrides": {"train_batch_size": 3, "samples_per_task": 2, "max_new_tokens": 48,
                                         "learning_rate": 1e-3}})

    root = _solvable_root(tmp_path)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, "-c", RUN, cfg("a"), str(root)], check=True, env=env, timeout=900)
    proc = subprocess.Popen([sys.executable, "-c", RUN, cfg("b"), str(root)], env=env)
    curve = root / "work_b" / "curve.jsonl"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if curve.exists() and len(curve.read_text().splitlines()) >= 1:  # round 0 checkpointed
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"rollout workers outlived the killed run: {alive}"
    assert not (root / "out_b").exists()
    # what the killed run left: its buffer holds the episodes' screens (contacts, files, ...), sealed at rest
    work = root / "work_b"
    state = load_state_of(work, tmp_path / "keys" / "rl.key")
    assert state["buffer"]["entries"], "the killed run had no success in its buffer: nothing was at risk"
    for f in ("state.pt", "state.enc"):
        assert (work / f).stat().st_mode & 0o777 == 0o600
    canaries = {v: c for t in SOLVABLE for v, c in sim_canaries(t)}
    assert canaries and not audit_files(work, canaries).findings
    subprocess.run([sys.executable, "-c", RUN, cfg("b"), str(root)], check=True, env=env, timeout=900)
    a, b = load_file(root / "out_a" / "model.safetensors"), load_file(root / "out_b" / "model.safetensors")
    init = load_file(BASE / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], init[k]) for k in a), "the run did not train"
    rounds = [json.loads(x)["round"] for x in curve.read_text().splitlines()]
    assert rounds == [0, 1]
    assert not (work / "state.pt").exists() and not (work / "state.enc").exists()  # gone with the run


def load_state_of(work: Path, key_file: Path) -> dict:
    from mobilerl.rl.checkpoint import load_state, state_key

    return load_state(work, state_key(key_file))


def test_config_names_a_bad_override_and_the_pool_keeps_short_templates(tmp_path):
    from mobilerl.rl.run import training_pool

    with pytest.raises(ValueError, match="rl.overrides: unknown key.*bogus"):
        RLConfig(overrides={"bogus": 1}).settings()
    with pytest.raises(ValueError, match="learning_rate"):
        RLConfig(overrides={"learning_rate": -1.0}).settings()
    root = _stage_root(tmp_path)
    assert len(training_pool(RLConfig(), root)) == 4
    assert [t.task_id for t in training_pool(RLConfig(templates_max_steps=4), root)] == [
        t.task_id for t in short_tasks(2)]
    with pytest.raises(ValueError, match="no world/train task"):
        training_pool(RLConfig(templates_max_steps=2), root)


def test_the_resume_state_at_rest_is_sealed_private_and_loads_no_code(tmp_path):
    from cryptography.fernet import Fernet

    from mobilerl.rl.checkpoint import load_state, save_state, state_key

    planted = "call Jane Roe at +1 415 555 0123 or jane.roe@example.com, 12 Elm St"
    traj = Trajectory(task_id="world/train/T/0", instruction=planted, success=True, reward=1.0, finished=True)
    trainer = Trainer(RLConfig(overrides={"kl_coef": 0.0}), torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    trainer.buffer.push([traj], [1.0], 0)
    key = state_key(tmp_path / "keys" / "k")
    assert (tmp_path / "keys" / "k").stat().st_mode & 0o777 == 0o600
    work = tmp_path / "work"
    work.mkdir()
    save_state(trainer.state_dict(), work, key)
    for f in ("state.pt", "state.enc"):
        assert (work / f).stat().st_mode & 0o777 == 0o600
        raw = (work / f).read_bytes()
        assert all(s.encode() not in raw for s in ("Jane Roe", "555 0123", "jane.roe", "Elm St")), f
    from mobilerl.data.audit import audit_files

    canaries = {"Jane Roe": "name", "+1 415 555 0123": "phone", "jane.roe@example.com": "email"}
    assert not audit_files(work, canaries).findings
    (work / "leak.pt").write_bytes(json.dumps(traj.to_dict()).encode())  # what an unsealed state would hold
    assert {f.category for f in audit_files(work, canaries).findings} >= {"name", "phone", "email"}
    (work / "leak.pt").unlink()
    restored = Trainer(RLConfig(overrides={"kl_coef": 0.0}), torch.nn.Linear(2, 2), lambda req: [], 0, FMT)
    restored.load_state_dict(load_state(work, key))
    assert restored.buffer.entries[0].trajectory.instruction == planted  # the exact text the policy saw
    assert all(torch.equal(a, b) for a, b in zip(restored.model.state_dict().values(),
                                                 trainer.model.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match=r"state\.enc: cannot be opened with rl\.state_key"):
        load_state(work, Fernet.generate_key())

    class Payload:  # what a planted state.pt would carry: code that runs when unpickled
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save({"round": 1, "model": Payload(), "optimizer": {}}, work / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt: not a resume state"):
        load_state(work, key)
    assert not (tmp_path / "pwned").exists()
