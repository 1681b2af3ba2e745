"""rl.recipe paper | authors (mobilerl/rl/recipe.py): every switch of rl.algo changes what it says it changes."""

import math

import pytest
import torch

from mobilerl.rl.adapr import PositiveReplay
from mobilerl.rl.config import RLConfig
from mobilerl.rl.fcf import FailureCurriculum
from mobilerl.rl.groups import Group, score_groups
from mobilerl.rl.loss import group_advantages, kl_k3, policy_loss, prune_negatives, whiten
from mobilerl.rl.recipe import RECIPES
from mobilerl.trajectory import StepRecord, Trajectory


def test_the_recipes_fill_every_switch_and_a_given_key_wins():
    paper, authors = RLConfig().algo, RLConfig(recipe="authors").algo
    assert paper.model_dump() == RECIPES["paper"] and authors.model_dump() == RECIPES["authors"]
    assert {k for k in RECIPES["paper"] if RECIPES["paper"][k] == RECIPES["authors"][k]} == set()  # all differ
    mixed = RLConfig(recipe="authors", algo={"spa_alpha": 1.0}).algo
    assert mixed.spa_alpha == 1.0 and mixed.dual_clip == 3.0
    with pytest.raises(ValueError, match="algo.nope"):
        RLConfig(algo={"nope": 1})
    with pytest.raises(ValueError, match="recipe"):
        RLConfig(recipe="mine")


def test_step_row_statistics_differ_from_trajectory_statistics_on_unequal_lengths():
    r = torch.tensor([1.0, 0.0, 0.0])
    steps = torch.tensor([2.0, 8.0, 2.0])
    per_traj, per_row = group_advantages(r, 3), group_advantages(r, 3, weights=steps)
    assert not torch.allclose(per_traj, per_row)
    # the rows' mean: 2 of 12 rows succeeded; each trajectory counted as many times as it has steps
    mean = 2 / 12
    std = math.sqrt((2 * (1 - mean) ** 2 + 10 * mean**2) / 11)
    assert per_row[0].item() == pytest.approx((1 - mean) / (std + 1e-6), rel=1e-5)
    assert torch.allclose(group_advantages(torch.tensor([1.0, 0.0]), 2, weights=torch.ones(2)),
                          group_advantages(torch.tensor([1.0, 0.0]), 2))  # one row each: the same


def test_row_pruning_counts_the_negatives_rows():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rows = torch.tensor([2.0, 5.0, 5.0, 1.0])  # a short success, long failures
    by_traj = prune_negatives(rewards, 4, 2.0, torch.Generator().manual_seed(0))
    by_rows = prune_negatives(rewards, 4, 2.0, torch.Generator().manual_seed(0), rows=rows)
    assert by_traj.sum() == 3  # the success and 2 negatives
    kept_rows = float((by_rows[1:] * rows[1:]).sum())
    assert by_rows[0] == 1 and kept_rows <= 4 and by_rows.sum() < by_traj.sum()  # ≤ 2 × 2 negative rows


def test_per_source_whitening_gives_each_source_zero_mean_and_unit_std_over_its_rows():
    def traj(task, suite, success, n):
        return Trajectory(task_id=task, suite=suite, success=success, reward=float(success), finished=True,
                          steps=[StepRecord(index=i, response="wait()") for i in range(n)])

    groups = [Group("w", [traj("w", "world", True, 2), traj("w", "world", False, 4), traj("w", "world", False, 3)]),
              Group("l", [traj("l", "lab", True, 1), traj("l", "lab", False, 1)])]
    score_groups(groups, None, None, torch.Generator().manual_seed(0))
    before = [list(g.advantages) for g in groups]
    score_groups(groups, None, None, torch.Generator().manual_seed(0), per_source=True)
    assert [g.advantages for g in groups] != before
    for g in groups:
        a = torch.tensor(g.advantages)
        w = torch.tensor([float(t.n_steps) for t in g.trajectories])
        mean = (w * a).sum() / w.sum()
        assert abs(float(mean)) < 1e-5  # one group per source here: the source's rows
        assert float(((w * (a - mean) ** 2).sum() / (w.sum() - 1)).sqrt()) == pytest.approx(1.0, abs=1e-4)
    assert whiten(torch.tensor([3.0]), torch.tensor([1.0])).tolist() == [3.0]  # one row: unchanged


def test_asymmetric_clip_and_dual_clip_bound_the_ratio():
    logp = torch.zeros(1, 1, requires_grad=True)
    behaviour = torch.full((1, 1), -math.log(2.0))  # ratio 2
    mask = torch.ones(1, 1)
    loss, m = policy_loss(logp, behaviour, torch.tensor([1.0]), mask, clip_eps=0.2, kl_coef=0.0)
    loss.backward()
    assert logp.grad.abs().item() == 0 and m["clip_frac"] == 1.0  # clipped at 1.2: no gradient
    logp.grad = None
    loss, _ = policy_loss(logp, behaviour, torch.tensor([1.0]), mask, clip_eps=0.5, clip_high=1.2, kl_coef=0.0)
    loss.backward()
    assert logp.grad.abs().item() > 0  # 2 < 1 + 1.2: the authors' wide clip lets it through
    # a negative advantage at ratio e^3 ≈ 20: the surrogate's loss is 20·|A|; the dual clip bounds it at c·|A|
    logp.grad = None
    far = torch.full((1, 1), -3.0)
    plain, _ = policy_loss(logp, far, torch.tensor([-1.0]), mask, clip_eps=0.2, kl_coef=0.0)
    dual, m = policy_loss(logp, far, torch.tensor([-1.0]), mask, clip_eps=0.2, kl_coef=0.0, dual_clip=3.0)
    assert plain.item() == pytest.approx(math.exp(3.0), rel=1e-5) and dual.item() == pytest.approx(3.0)
    assert m["dual_clip_frac"] == 1.0
    dual.backward()
    assert logp.grad.abs().item() == 0


def test_entropy_bonus_enters_the_loss_with_its_gradient_and_the_kl_is_clamped():
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[..., 0]
    ent = -(logp.exp() * logp)  # a stand-in (B, T) with a graph
    mask = torch.ones(1, 2)
    a, _ = policy_loss(logp, logp.detach(), torch.tensor([0.0]), mask, kl_coef=0.0)
    b, _ = policy_loss(logp, logp.detach(), torch.tensor([0.0]), mask, kl_coef=0.0, entropy=ent, entropy_coef=0.5)
    assert b.item() == pytest.approx(a.item() - 0.5 * ent.mean().item())
    b.backward()
    assert logits.grad.abs().sum() > 0
    assert kl_k3(torch.tensor([-20.0]), torch.tensor([0.0])).item() == 10.0  # k3 would be e^20


def test_adapr_replays_an_entry_in_exactly_n_rounds_drawn_before_or_after_the_push():
    def rounds_drawn(push_first: bool) -> list[int]:
        buf, seen = PositiveReplay(capacity=16, kappa=0.25, gamma=1.0), []
        for r in range(8):
            new = (["x"], [1.0]) if r == 0 else ([], [])
            if push_first:
                buf.push(*new, round=r)
            if "x" in [t for t, _ in buf.sample(8)]:
                seen.append(r)
            if not push_first:
                buf.push(*new, round=r)
        return seen

    assert rounds_drawn(push_first=False) == [1, 2, 3, 4]  # ages 1..N, N = 1/κ = 4
    assert rounds_drawn(push_first=True) == [0, 1, 2, 3]  # ages 0..N-1


def test_adapr_eviction_with_recency_keeps_newer_entries():
    def kept(recency: float) -> list[str]:
        buf = PositiveReplay(capacity=2, kappa=0.5, gamma=1.0, recency=recency)
        buf.push(["old", "z"], [3.0, 0.0], round=0)
        buf.push(["new-a", "new-b", "y", "z"], [1.0, 2.0, 0.0, 0.0], round=1)  # 3 entries for 2 places
        return sorted(t for t, _ in buf.sample(10))

    assert kept(0.0) == ["new-b", "old"]  # by advantage
    assert kept(1.0) == ["new-a", "new-b"]  # by recency


def test_fcf_authors_rule_counts_rows_and_drops_after_three():
    c = FailureCurriculum(rule="authors")
    c.update("a", [0, 0], rows=2)
    assert c.weight("a") == pytest.approx(math.exp(-2))  # from the first failure
    c.update("a", [0], rows=2)
    assert c.removed("a") and c.weight("a") == 0.0  # f = 4 > 3
    c.update("b", [0], rows=1), c.update("b", [1, 0], rows=3)
    assert c.weight("b") == 1.0
    paper = FailureCurriculum()
    paper.update("a", [0, 0], rows=2)
    assert paper.weight("a") == 1.0  # within patience
