"""DistRL's option of the rl stage (distrl.txt §5.2-5.3, A.4): Retrace weights, DPER priorities and draws, the
replayed rows' corrected advantages in the trainer, and the buffer's resume state."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from mobilerl.env.sim.tasks import list_tasks
from mobilerl.eval.runner import evaluate_sync
from mobilerl.rl.distrl import (
    PrioritizedReplay,
    priorities,
    replay_probabilities,
    retrace_traces,
    retrace_weights,
    step_log_ratios,
    step_stats,
)
from mobilerl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "models" / "tiny-base"


# ------------------------------------------------------------------------------------------- Retrace


def test_retrace_on_policy_is_lambda_to_the_steps_after():
    for lam in (1.0, 0.9, 0.5):
        w = retrace_weights(torch.zeros(5, dtype=torch.float64), lam)
        assert torch.allclose(w, torch.tensor([lam**4, lam**3, lam**2, lam, 1.0], dtype=torch.float64))
    assert retrace_weights(torch.zeros(0), 0.9).numel() == 0


def test_retrace_traces_are_truncated_and_weights_are_their_products():
    gen = torch.Generator().manual_seed(0)
    for lam in (1.0, 0.8):
        for _ in range(50):
            s = int(torch.randint(1, 8, (1,), generator=gen))
            log_rho = torch.randn(s, generator=gen, dtype=torch.float64) * 2
            c = retrace_traces(log_rho, lam)
            assert (c <= lam + 1e-12).all() and (c >= 0).all()
            assert torch.allclose(c, lam * torch.clamp(torch.exp(log_rho), max=1.0))
            w = retrace_weights(log_rho, lam)
            for t in range(s):  # w_t = Π_{i=t+1}^{S-1} c_i ≤ λ^(S-1-t)
                assert w[t] == pytest.approx(float(torch.prod(c[t + 1:])))
                assert w[t] <= lam ** (s - 1 - t) + 1e-12
    # a step whose probability rose (ρ > 1) counts as on-policy: the trace is cut at λ, never above
    assert retrace_weights(torch.tensor([0.0, 3.0, 3.0]), 1.0).tolist() == [1.0, 1.0, 1.0]
    # an action the current policy no longer takes (ρ → 0) cuts every earlier step's trace
    assert retrace_weights(torch.tensor([0.0, -50.0, 0.0]), 1.0)[0] < 1e-20
    with pytest.raises(ValueError, match="λ"):
        retrace_traces(torch.zeros(2), 1.5)


def test_step_ratios_and_stats_are_per_action():
    cur = [[-0.1, -0.2], [-1.0]]
    beh = [[-0.1, -0.1], [-2.0]]
    assert step_log_ratios(cur, beh).tolist() == pytest.approx([-0.1, 1.0])
    rho, nll = step_stats(cur, beh)
    assert rho == pytest.approx((np.exp(-0.1) + 1.0) / 2) and nll == pytest.approx((0.3 + 1.0) / 2)


# ------------------------------------------------------------------------------------------------ DPER


def test_priorities_order_by_advantage_ratio_and_entropy():
    base = {"abs_adv": [1.0, 1.0], "rho_mean": [0.5, 0.5], "nll_mean": [2.0, 2.0]}
    for key, hi, lo in (("abs_adv", 2.0, 0.5), ("rho_mean", 1.0, 0.2), ("nll_mean", 4.0, 1.0)):
        args = {k: list(v) for k, v in base.items()}
        args[key] = [hi, lo]
        p = priorities(np.array(args["abs_adv"]), np.array(args["rho_mean"]), np.array(args["nll_mean"]))
        assert p[0] > p[1], key  # larger |A|, less policy discrepancy (ρ̄ nearer 1), more entropy: first
    p = priorities(np.array([2.0, 1.0]), np.array([1.0, 0.0]), np.array([4.0, 0.0]), (1.0, 0.3, 0.3))
    assert p.tolist() == pytest.approx([1.0 + 0.3 + 0.3, 0.5])  # each term scaled to [0, 1]
    assert replay_probabilities(np.array([1.0, 4.0]), 0.0).tolist() == [0.5, 0.5]
    assert replay_probabilities(np.array([1.0, 4.0]), 1.0).tolist() == pytest.approx([0.2, 0.8])
    assert replay_probabilities(np.array([1.0, 4.0]), 0.5).tolist() == pytest.approx([1 / 3, 2 / 3])


def test_buffer_is_circular_and_draws_by_priority():
    buf: PrioritizedReplay[str] = PrioritizedReplay(capacity=3, weights=(1.0, 0.0, 0.0), alpha=1.0)
    for i, a in enumerate([1.0, 2.0, 3.0, 4.0]):
        buf.push(f"t{i}", a, 1.0, 1.0, round=i)
    assert [e.trajectory for e in buf.entries] == ["t3", "t1", "t2"]  # t3 overwrote the oldest
    rng = np.random.default_rng(0)
    draws = [buf.entries[buf.sample(1, rng)[0]].trajectory for _ in range(6000)]
    freq = {t: draws.count(t) / len(draws) for t in ("t1", "t2", "t3")}
    assert freq == pytest.approx({"t1": 2 / 9, "t2": 3 / 9, "t3": 4 / 9}, abs=0.02)  # P ∝ |A| (α = 1)
    got = buf.sample(3, rng)
    assert sorted(got) == [0, 1, 2]  # without replacement
    assert buf.sample(5, rng, exclude=lambda t: t == "t2") and all(
        buf.entries[i].trajectory != "t2" for i in buf.sample(5, rng, exclude=lambda t: t == "t2"))
    buf.refresh(0, 0.25, 7.0)
    assert (buf.entries[0].rho_mean, buf.entries[0].nll_mean) == (0.25, 7.0)
    restored: PrioritizedReplay[str] = PrioritizedReplay(capacity=3, weights=(1.0, 0.0, 0.0), alpha=1.0)
    restored.load_state_dict(buf.state_dict())
    assert restored.state_dict() == buf.state_dict() and restored.next == buf.next == 1
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert restored.sample(2, a) == buf.sample(2, b)


# ---------------------------------------------------------------------------------------- in the trainer


@pytest.fixture(scope="module")
def sampled():
    from mobilerl.agent.model_policy import ModelPolicy
    from mobilerl.models.generation import SamplingConfig
    from mobilerl.models.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(BASE, device="cpu")
    policy = ModelPolicy(backend, obs_mode="xml", prompt_style="compact", max_history=4, coords="marks",
                         reuse_greedy=False, sampling=SamplingConfig(temperature=1.0, max_new_tokens=24, seed=0))
    tasks = [dataclasses.replace(t, complexity=0.3) for t in list_tasks("world", "train", n=1)[:2]]
    trajs = evaluate_sync(policy.with_seed, tasks, n_trials=2, progress=False, concurrency=4)
    return backend, trajs


def _trainer(backend, **cfg):
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.rl.batch import PromptFormat
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.trainer import Trainer

    c = RLConfig(overrides={"kl_coef": 0.0, "samples_per_task": 2, "train_batch_size": 2}, **cfg)
    model = HFBackend.from_pretrained(BASE, device="cpu").model
    return Trainer(c, model, backend.prompt_ids, backend.pad_id,
                   PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks"))


def _older(traj: Trajectory, shifts: list[float]) -> Trajectory:
    """``traj`` as if sampled by another policy: step t's behaviour logprobs moved by ``shifts[t]`` a token."""
    old = Trajectory.from_dict(traj.to_dict())
    for s, d in zip((s for s in old.steps if s.token_ids), itertools.cycle(shifts), strict=False):
        s.logprobs = [lp + d for lp in s.logprobs]
    return old


def _current_stats(trainer, backend, traj: Trajectory, advantage: float):
    """``traj``'s off-policy rows, each step's token logprobs under the trainer's policy (one forward a step), and
    each step's log ρ against its behaviour logprobs."""
    from mobilerl.rl.batch import collate, rows_logprobs, trajectory_rows

    plain = trajectory_rows(traj, advantage, trainer.fmt, backend.prompt_ids, on_policy=False)
    with torch.no_grad():
        cur = [rows_logprobs(trainer.model, collate([r], backend.pad_id), 1.0)[0][0, : len(r.response_ids)].tolist()
               for r in plain]
    log_rho = torch.tensor([sum(c) - sum(r.behaviour_logprobs) for c, r in zip(cur, plain, strict=True)],
                           dtype=torch.float64)
    return plain, cur, log_rho


def test_a_replayed_rows_loss_uses_its_retrace_weights(sampled):
    from mobilerl.rl.batch import collate, rows_logprobs
    from mobilerl.rl.loss import policy_loss

    backend, trajs = sampled
    traj = max(trajs, key=lambda t: sum(1 for s in t.steps if s.token_ids))
    n_steps = sum(1 for s in traj.steps if s.token_ids)
    assert n_steps >= 2
    # the behaviour policy liked some steps' actions more than the current one does (ρ < 1), others less
    old = _older(traj, [0.3, -0.2, 0.1])
    trainer = _trainer(backend, distrl={"lambda": 0.9, "replay_share": 1.0}, adapr=False)
    trainer.hooks.get("distrl").buffer.push(old, 1.5, 1.0, 1.0, round=0)
    rows, m = trainer.batch([], 1)
    assert m["distrl/replayed"] == 1 and len(rows) == n_steps and not any(r.on_policy for r in rows)
    # the expected weights, from the current policy's logprobs of each step on its own
    plain, cur, log_rho = _current_stats(trainer, backend, old, 1.5)
    c = 0.9 * torch.exp(log_rho.clamp(max=0.0))
    expect = [1.5 * float(torch.prod(c[t + 1:])) for t in range(n_steps)]
    assert [r.advantage for r in rows] == pytest.approx(expect, rel=1e-4)
    assert rows[-1].advantage == pytest.approx(1.5) and rows[0].advantage < 1.5 * 0.9 ** (n_steps - 1) + 1e-6
    assert m["distrl/retrace_weight_mean"] == pytest.approx(np.mean(expect) / 1.5, rel=1e-4)
    # the surrogate the update minimises is the one of those weighted advantages
    b = collate(rows, backend.pad_id)
    scaled = collate([dataclasses.replace(r, advantage=e) for r, e in zip(plain, expect, strict=True)],
                     backend.pad_id)
    with torch.no_grad():
        logp, _ = rows_logprobs(trainer.model, b, 1.0)
        got, _ = policy_loss(logp, b["behaviour_logprobs"], b["advantages"], b["response_mask"], kl_coef=0.0)
        want, _ = policy_loss(logp, scaled["behaviour_logprobs"], scaled["advantages"], scaled["response_mask"],
                              kl_coef=0.0)
    assert float(got) == pytest.approx(float(want), rel=1e-4)
    # the entry's priority terms now describe the current policy
    e = trainer.hooks.get("distrl").buffer.entries[0]
    assert e.rho_mean == pytest.approx(float(torch.exp(log_rho.clamp(max=0.0)).mean()), rel=1e-4)
    assert e.nll_mean == pytest.approx(float(np.mean([-sum(x) for x in cur])), rel=1e-4)


def test_with_bepa_on_too_the_drawn_entry_is_refreshed_from_its_own_rows(sampled):
    """BEPA's injected success is off-policy (an older policy sampled it) and comes after DPER's draw: the drawn
    entry's ρ̄ and H̄ must still come from the drawn trajectory's rows."""
    from mobilerl.rl.groups import Group, score_groups

    backend, trajs = sampled
    traj = max(trajs, key=lambda t: sum(1 for s in t.steps if s.token_ids))
    old = _older(traj, [0.3, -0.2, 0.1])
    trainer = _trainer(backend, distrl={"replay_share": 1.0}, bepa={}, adapr=False)
    distrl = trainer.hooks.get("distrl")
    distrl.buffer.push(old, 1.5, 1.0, 1.0, round=0)
    injected = _older(trajs[-1], [-1.0])  # its logprobs far from the current policy's
    injected.success, injected.reward, injected.policy_version = True, 1.0, "0"
    failed = Trajectory.from_dict(trajs[0].to_dict())
    failed.success, failed.reward, failed.policy_version = False, 0.0, "3"
    group = Group(injected.task_id, [injected, failed])
    score_groups([group], 1.0, None, torch.Generator().manual_seed(0))
    rows, m = trainer.batch([group], 3)
    assert m["distrl/replayed"] == 1 and sum(not r.on_policy for r in rows) > sum(1 for s in old.steps if s.token_ids)
    plain, cur, log_rho = _current_stats(trainer, backend, old, 1.5)
    e = distrl.buffer.entries[0]
    assert e.trajectory is old
    assert e.rho_mean == pytest.approx(float(torch.exp(log_rho.clamp(max=0.0)).mean()), rel=1e-4)
    assert e.nll_mean == pytest.approx(float(np.mean([-sum(x) for x in cur])), rel=1e-4)


def test_fresh_signal_enters_adapr_replays_are_not_drawn_twice_and_the_buffer_resumes(sampled):
    from mobilerl.rl.groups import make_groups, score_groups

    backend, trajs = sampled
    trainer = _trainer(backend, distrl={"replay_share": 1.0})
    trajs = [Trajectory.from_dict(t.to_dict()) for t in trajs]
    trajs[0].success, trajs[0].reward = True, 1.0  # group 0 has a signal, group 1 (all failed) none
    groups, _ = make_groups(trajs)
    score_groups(groups, 1.0, None, torch.Generator().manual_seed(0))
    trainer.batch(groups, 0)
    assert [e.trajectory.task_id for e in trainer.hooks.get("distrl").buffer.entries] == [trajs[0].task_id] * 2
    assert all(e.rho_mean == 1.0 and e.advantage != 0 for e in trainer.hooks.get("distrl").buffer.entries)
    # AdaPR holds the success too: DPER draws only the other one
    assert len(trainer.buffer) == 1
    _, m = trainer.batch([], 1)
    assert m["buffer/replayed"] == 1 and m["distrl/replayed"] == 1 and m["train/trajectories"] == 2
    drawn = trainer.hooks.get("distrl").drawn[0][1]
    assert drawn.trial != trainer.buffer.entries[0].trajectory.trial
    restored = _trainer(backend, distrl={"replay_share": 1.0})
    restored.load_state_dict(trainer.state_dict())
    assert restored.hooks.get("distrl").buffer.state_dict(lambda t: t.to_dict()) == trainer.hooks.get("distrl").buffer.state_dict(
        lambda t: t.to_dict())
    rows_a, _ = trainer.batch([], 2)
    rows_b, _ = restored.batch([], 2)
    assert [r.response_ids for r in rows_a] == [r.response_ids for r in rows_b] and rows_a
    assert [r.advantage for r in rows_a] == pytest.approx([r.advantage for r in rows_b])
