"""AdaGRPO's pure pieces: SPA, FCF, AdaPR and the loss (MobileRL §2.2)."""

import json
import math

import numpy as np
import pytest
import torch

from mobilerl.rl.adapr import PositiveReplay
from mobilerl.rl.fcf import FailureCurriculum
from mobilerl.rl.loss import aggregate, group_advantages, kl_k3, policy_loss, prune_negatives
from mobilerl.rl.spa import shortest_path_rewards


def test_spa_shortens_longer_successes_and_leaves_failures():
    r = shortest_path_rewards([1, 0, 1, 1], [4, 2, 8, 4], alpha=1.0)
    assert r == [1.0, 0.0, pytest.approx(0.5), 1.0]
    assert shortest_path_rewards([1, 1], [4, 8], alpha=0.5)[1] == pytest.approx(0.75)
    assert shortest_path_rewards([0, 0], [3, 9]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="lengths"):
        shortest_path_rewards([1], [1, 2])


def test_fcf_cooldown_then_removal_and_reset():
    c = FailureCurriculum(patience=2, cooldown=3)
    c.update("a", [0, 0])
    assert c.weight("a") == 1.0
    c.update("a", [0])
    assert c.weight("a") == pytest.approx(math.exp(-2))
    c.update("b", [0]), c.update("b", [0]), c.update("b", [1, 0])
    assert c.weight("b") == 1.0 and not c.removed("b")
    for _ in range(3):
        c.update("a", [0])
    assert c.removed("a") and c.weight("a") == 0.0
    c.update("a", [1])  # removed for good
    assert c.removed("a")
    state = json.loads(json.dumps(c.state_dict()))
    d = FailureCurriculum()
    d.load_state_dict(state)
    assert d.removed("a") and d.weight("b") == 1.0
    rng = np.random.default_rng(0)
    assert "a" not in d.sample(["a", "b", "c"], 2, rng)
    assert d.counts(["a", "b", "c"]) == {"active": 2, "cooldown": 0, "removed": 1}


def test_adapr_top_kappa_positive_age_and_capacity():
    buf = PositiveReplay(capacity=3, kappa=0.25, gamma=0.5)
    assert buf.push(list("abcdefgh"), [2, -1, 0.5, 3, -2, 0, 0, 0.1], round=0) == 2  # top 2 of 8
    assert [t for t, _ in buf.sample(8)] == ["d", "a"]
    assert buf.push(list("ijkl"), [-1, -1, 0, 0], round=1) == 0  # no positive advantage enters
    buf.push(list("mnop"), [5, 0, 0, 0], round=2)
    buf.push(list("qrst"), [0.2, 0, 0, 0], round=3)
    assert len(buf) == 3 and [t for t, _ in buf.sample(100)] == ["m", "d", "a"]  # capacity drops 'q' (lowest)
    buf.push([], [], round=5)  # round-0 entries are 5 > 1/kappa rounds old
    assert [t for t, _ in buf.sample(100)] == ["m"]
    assert len(buf.sample(1)) == 0  # at most floor(gamma * m)


def test_group_advantages_by_reshape():
    a = group_advantages(torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]), n=4)
    assert a[:4].sum().abs() < 1e-5 and a[0] > 0 and torch.all(a[4:] == 0)


def test_prune_negatives_mutes_all_zero_groups_and_caps_negatives():
    r = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    keep = prune_negatives(r, n=6, ratio=2.0, generator=torch.Generator().manual_seed(0))
    assert keep[0] == 1 and keep[1:6].sum() == 2 and keep[6:].sum() == 0
    assert prune_negatives(r, n=6, ratio=None)[:6].sum() == 6


def test_policy_loss_clips_and_all_failed_group_gives_zero_gradient():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, requires_grad=True)
    old = logp.detach() + 0.5 * torch.randn(4, 5)
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards, n=2)
    mask = torch.ones(4, 5) * prune_negatives(rewards, n=2).unsqueeze(1)
    loss, m = policy_loss(logp, old, adv, mask, ref_logp=old, kl_coef=0.1)
    loss.backward()
    assert torch.all(logp.grad[:2] == 0) and logp.grad[2:].abs().sum() > 0
    assert 0 < m["clip_frac"] < 1 and m["approx_kl"] > 0


def test_policy_loss_on_policy_equals_reinforce_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, m = policy_loss(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2), kl_coef=0.0)
    loss.backward()
    assert loss.item() == pytest.approx(-2.0) and m["clip_frac"] == 0.0
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))


def test_kl_and_aggregation():
    assert kl_k3(torch.zeros(2, 2), torch.zeros(2, 2)).abs().max() == 0
    assert kl_k3(torch.zeros(1, 1), torch.full((1, 1), -1.0)).item() > 0
    x, mask = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(7 / 4)
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)
    assert aggregate(x, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    assert aggregate(x, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 6)
