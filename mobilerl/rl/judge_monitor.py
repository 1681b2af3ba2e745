"""The reward-hacking monitor: is the judge's reward still the task's? (MobileRL App. E.5; ``rl.judge_monitor``)

RL with a judge as the reward can learn what the judge accepts instead of the task (E.5 here: the judge's pass
rate rose from 39 to 75 % while the verifier's stayed under 2 %). After each round's update a sampled
``share`` of the episodes the judge rewarded is checked by a verifier the training path never reads:

- a task whose verifier is hidden (lab/train): its actions replayed in a fresh simulator from the task's
  start, then the simulator's own check (:func:`~mobilerl.env.sim.env.hidden_ground_truth`; the simulator
  is deterministic given the task and the actions, :func:`mobilerl.data.collect.replay_check`);
- a task with a verifier that ``rl.judge_all`` judged anyway: the verifier's verdict kept aside in
  ``meta["verified"]``.

Per round it logs ``reward/judge_precision`` and ``reward/judge_recall`` (the judge's pass against the
verifier's) and ``reward/judge_minus_verifier`` (the judge's pass rate minus the verifier's, on the audited
episodes). The alarm pools the last ``window`` rounds: once they hold ``min_audited`` episodes and the gap is
above ``max_gap``, it warns (``reward/judge_alarm`` 1) and with ``stop`` raises :class:`JudgeAlarm` (the
run's last checkpoint stands). The check runs after the update and writes nothing onto the episodes: its
verdicts never reach the loss.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mobilerl.env.base import TaskSpec
from mobilerl.rl.hooks import Hook, Metrics, RoundContext
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


class JudgeMonitorConfig(BaseModel):
    """``rl.judge_monitor``: the audit of the judge's rewards while RL runs (active when rl.reward_model is set)."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(0.25, ge=0, le=1, description="Share of a round's judged episodes also verified (0: off).")
    window: int = Field(5, ge=1, description="Rounds of audited episodes the alarm pools.")
    max_gap: float = Field(0.15, ge=0, le=1, description=(
        "The alarm fires when the judge's pass rate exceeds the verifier's by more than this on the window."))
    min_audited: int = Field(16, ge=1, description="Audited episodes the window needs before the alarm can fire.")
    stop: bool = Field(False, description="Stop the run on an alarm (JudgeAlarm) instead of only warning.")


class JudgeAlarm(RuntimeError):
    """The judge's rewards came loose from the task (``rl.judge_monitor.stop``)."""


def replay_verdict(traj: Trajectory, task: TaskSpec | str, perturb: str = "default") -> bool:
    """The simulator's own check after replaying ``traj``'s actions from ``task``'s start (its hidden verifier
    included)."""
    from mobilerl.env.actions import Action
    from mobilerl.env.sim.env import SimEnv, hidden_ground_truth

    env = SimEnv(render=False, perturb=perturb)
    try:
        env.reset(task)
        for s in traj.steps:
            if s.action is not None and env.step(Action.from_dict(s.action)).done:
                break
        return hidden_ground_truth(env) == 1.0
    finally:
        env.close()


def audit_counts(judge: Sequence[bool], truth: Sequence[bool]) -> dict[str, int]:
    """``{tp, fp, fn, tn}`` of the judge's verdicts against the verifier's (positive: a pass)."""
    pairs = list(zip(judge, truth, strict=True))
    return {"tp": sum(j and t for j, t in pairs), "fp": sum(j and not t for j, t in pairs),
            "fn": sum(t and not j for j, t in pairs), "tn": sum(not j and not t for j, t in pairs)}


def audit_metrics(c: dict[str, int]) -> Metrics:
    """``n``, the two pass rates and their gap, and precision / recall where defined (no judged or no verified
    pass leaves them out)."""
    n = sum(c.values())
    if n == 0:
        return {}
    judge, truth = (c["tp"] + c["fp"]) / n, (c["tp"] + c["fn"]) / n
    m = {"n": float(n), "judge_pass": judge, "verifier_pass": truth, "judge_minus_verifier": judge - truth}
    if c["tp"] + c["fp"]:
        m["judge_precision"] = c["tp"] / (c["tp"] + c["fp"])
    if c["tp"] + c["fn"]:
        m["judge_recall"] = c["tp"] / (c["tp"] + c["fn"])
    return m


class JudgeMonitor(Hook):
    """The monitor as a hook of the round's last point (see the module docstring)."""

    name = "judge_monitor"

    def __init__(self, cfg: JudgeMonitorConfig, seed: int = 0,
                 verify: Callable[[Trajectory, TaskSpec | str], bool] = replay_verdict) -> None:
        self.cfg = cfg
        self.seed = seed
        self.verify = verify
        self.rounds: list[dict[str, int]] = []  # the last `window` rounds' counts

    def update_done(self, ctx: RoundContext) -> Metrics:
        judged = [t for g in ctx.groups for t in g.trajectories if "judge_p" in t.meta]
        if not judged:
            return {}
        k = min(len(judged), max(1, round(self.cfg.share * len(judged))))
        audited = random.Random(stable_seed(self.seed, "judge_monitor", ctx.r)).sample(judged, k)
        specs = {t.task_id: t for t in ctx.pool}
        truth = [bool(t.meta["verified"]) if t.has_verifier else self.verify(t, specs.get(t.task_id, t.task_id))
                 for t in audited]
        counts = audit_counts([bool(t.success) for t in audited], truth)
        self.rounds = [*self.rounds, counts][-self.cfg.window:]
        pooled = {key: sum(c[key] for c in self.rounds) for key in counts}
        window = audit_metrics(pooled)
        alarm = window["n"] >= self.cfg.min_audited and window["judge_minus_verifier"] > self.cfg.max_gap
        m = {"reward/audited" if key == "n" else f"reward/{key}": v for key, v in audit_metrics(counts).items()}
        m |= {"reward/judge_minus_verifier_window": window["judge_minus_verifier"], "reward/judge_alarm": float(alarm)}
        if alarm:
            msg = (f"rl round {ctx.r}: the judge passes {window['judge_pass']:.0%} of the last {len(self.rounds)} "
                   f"rounds' {window['n']:.0f} audited episodes, the verifier {window['verifier_pass']:.0%} (gap > "
                   f"rl.judge_monitor.max_gap {self.cfg.max_gap}): the policy may be learning what the judge accepts")
            if self.cfg.stop:
                raise JudgeAlarm(msg + "; stopped (rl.judge_monitor.stop), the last checkpoint stands")
            log.warning(msg)
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": [dict(c) for c in self.rounds]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = [dict(c) for c in state.get("rounds", [])]
