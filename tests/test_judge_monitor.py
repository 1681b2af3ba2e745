"""The reward-hacking monitor (mobilerl/rl/judge_monitor.py): judged episodes audited by the simulator's hidden
check after the update, the judge's precision / recall / gap per round, the alarm that warns or stops."""

from __future__ import annotations

import copy
import logging

import pytest

from mobilerl.agent.policy import OraclePolicy, RandomPolicy
from mobilerl.env.sim.tasks.registry import get_task
from mobilerl.eval.runner import evaluate_sync
from mobilerl.rl.groups import judge_rewards, make_groups
from mobilerl.rl.hooks import RoundContext
from mobilerl.rl.judge_monitor import (
    JudgeAlarm,
    JudgeMonitor,
    JudgeMonitorConfig,
    audit_counts,
    audit_metrics,
)

TEMPLATES = ("LabSettingsDisableNotifications", "LabClockCountdownNoStart", "LabCalendarAddNote")


@pytest.fixture(scope="module")
def episodes():
    """Lab/train episodes (their verifier hidden): the oracle's, which pass the hidden check, and the random
    policy's, which do not."""
    tasks = [get_task(f"lab/train/{t}/0", with_optimal=False) for t in TEMPLATES]
    assert not any(t.has_verifier for t in tasks)
    good = evaluate_sync(lambda s: OraclePolicy(), tasks, progress=False, concurrency=1)
    bad = evaluate_sync(lambda s: RandomPolicy(s), tasks, progress=False, concurrency=1)
    assert all(t.reward is None and t.error is None for t in good + bad)  # nothing scored them yet
    return tasks, good, bad


class Judge:
    def __init__(self, p):
        self.p = p

    def score(self, trajs):
        return [self.p(t) for t in trajs]


def judged(episodes, p):
    tasks, good, bad = episodes
    trajs = copy.deepcopy(good + bad)
    judge_rewards(trajs, Judge(p))
    groups, _ = make_groups(trajs)
    return RoundContext(r=0, trainer=None, pool=tasks, groups=groups), trajs


def test_a_judge_that_passes_everything_is_caught_by_the_hidden_check_and_the_episodes_are_untouched(episodes, caplog):
    ctx, trajs = judged(episodes, lambda t: 0.9)
    before = [t.to_dict() for t in trajs]
    monitor = JudgeMonitor(JudgeMonitorConfig(share=1.0, min_audited=6))
    with caplog.at_level(logging.WARNING, logger="mobilerl.rl.judge_monitor"):
        m = monitor.update_done(ctx)
    assert m["reward/audited"] == 6 and m["reward/judge_pass"] == 1.0 and m["reward/verifier_pass"] == 0.5
    assert m["reward/judge_precision"] == 0.5 and m["reward/judge_recall"] == 1.0
    assert m["reward/judge_minus_verifier"] == 0.5 and m["reward/judge_alarm"] == 1.0
    assert "may be learning what the judge accepts" in caplog.text
    assert [t.to_dict() for t in trajs] == before  # the verifier's verdict is written nowhere the loss reads
    with pytest.raises(JudgeAlarm, match="rl.judge_monitor.max_gap 0.15"):
        JudgeMonitor(JudgeMonitorConfig(share=1.0, min_audited=6, stop=True)).update_done(ctx)


def test_an_honest_judge_raises_no_alarm_and_the_window_needs_enough_episodes(episodes):
    ctx, _ = judged(episodes, lambda t: 0.9 if t.policy == "oracle" else 0.1)
    m = JudgeMonitor(JudgeMonitorConfig(share=1.0, min_audited=6)).update_done(ctx)
    assert m["reward/judge_precision"] == 1.0 and m["reward/judge_recall"] == 1.0
    assert m["reward/judge_minus_verifier"] == 0.0 and m["reward/judge_alarm"] == 0.0

    liar, _ = judged(episodes, lambda t: 0.9)
    monitor = JudgeMonitor(JudgeMonitorConfig(share=0.5, min_audited=4, window=2))
    first = monitor.update_done(liar)
    assert first["reward/audited"] == 3 and first["reward/judge_alarm"] == 0.0  # 3 of 6 audited: under min_audited
    liar.r = 1
    second = monitor.update_done(liar)
    assert second["reward/judge_alarm"] == 1.0  # the window of two rounds pools 6
    resumed = JudgeMonitor(JudgeMonitorConfig(share=0.5, min_audited=4, window=2))
    resumed.load_state_dict(copy.deepcopy(monitor.state_dict()))
    assert resumed.rounds == monitor.rounds and len(resumed.rounds) == 2


def test_judge_all_episodes_are_audited_by_their_kept_verdict_and_metrics_leave_out_what_is_undefined():
    c = audit_counts([True, True, False, False], [True, False, False, False])
    assert c == {"tp": 1, "fp": 1, "fn": 0, "tn": 2}
    m = audit_metrics(audit_counts([False, False], [False, False]))
    assert m["judge_minus_verifier"] == 0.0 and "judge_precision" not in m and "judge_recall" not in m
    assert audit_metrics(audit_counts([], [])) == {}

    from mobilerl.trajectory import Trajectory

    world = [Trajectory(task_id=f"world/train/T/{i}", success=i == 0, reward=float(i == 0), steps=[], finished=True)
             for i in range(4)]
    judge_rewards(world, Judge(lambda t: 0.9), everyone=True)  # the verifier's verdicts kept in meta["verified"]

    def no_replay(t, task):
        raise AssertionError("a task with a verifier is not replayed")

    groups, _ = make_groups(world)
    m = JudgeMonitor(JudgeMonitorConfig(share=1.0), verify=no_replay).update_done(
        RoundContext(r=0, trainer=None, groups=groups))
    assert m["reward/verifier_pass"] == 0.25 and m["reward/judge_precision"] == 0.25
