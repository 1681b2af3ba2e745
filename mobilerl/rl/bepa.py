"""BEPA: Bi-Level Expert-to-Policy Assimilation (bepa.txt §4), an off-by-default option of the `rl` stage.

A per-task cache E_x holds one successful trajectory of task x::

    LEVEL-1 (§4.1, seeding)  the policy runs x with the expert's step-by-step plan p_x appended to the
                             instruction, a_t ~ π_θ(·|s_t, x, p_x); a success, re-prompted with the plain x,
                             seeds E_x
    LEVEL-2 (§4.2, refresh)  whenever the policy's own group of x holds successes, E_x ← one of them at random
    injection (§4.3, Eq. 3)  a group whose every rollout failed, with E_x set, becomes
                             {τ_x^off} ∪ {τ_x,2 … τ_x,N}: the cached trajectory replaces the first failed one,
                             keeps its success reward, and the group's advantages are computed as usual (Eq. 4)

The replayed trajectory's ratio is taken against the *old policy's* likelihood (the paper's "Trace
Replacement" baseline it builds on: r_t = π_θ / π_θold): its logprobs are recomputed under the trainer's
weights of this round, before the update and under the plain instruction, and replace the behaviour
logprobs it was sampled with (which were a plan-conditioned or an older policy's).

Choices where the paper leaves room: the expert is the simulator's scripted oracle (its plan extractor φ
renders each oracle step as a low-level step instruction, :mod:`mobilerl.data.step_instructions`, runs of
Wait collapsed); seeding is lazy — a task is seeded the first time one of its groups fails whole and it has
no cache entry, with ``rl.bepa.seed_rollouts`` plan-conditioned episodes under the round's weights, and never
again (so seeding costs at most pool × ``rl.bepa.seed_rollouts`` episodes a run); only tasks with a verifier are
seeded (the paper keeps R(τ) = 1 seeds), lab/train tasks enter the cache through judged successes only.
The paper seeds its whole expert set up front with the base policy; lazy seeding with the round's policy
spends rollouts only on tasks the policy cannot yet solve. Metrics and the curriculum see the on-policy groups,
not the injected ones; with AdaPR on, an injected success may enter the replay buffer like any trained one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mobilerl.env.base import TaskSpec
from mobilerl.rl.batch import PromptFormat, collate, micro_batches, rows_logprobs, trajectory_rows
from mobilerl.rl.hooks import Hook, Metrics, RoundContext
from mobilerl.seeding import stable_seed
from mobilerl.trajectory import Trajectory

PLAN_HEADER = "Step-by-step plan:"
_WAIT = "Wait for the screen to load"

# (tasks, episodes per task, base seed) -> the episodes, in (task, trial) order
Rollout = Callable[[Sequence[TaskSpec], int, int], list[Trajectory]]


def oracle_plan(task: TaskSpec) -> list[str]:
    """The plan p_x = φ(τ_x^E) of a simulator task: the scripted oracle's episode (no perturbations) as one
    step instruction per step (``Open Contacts``, ``Tap "Save"``), runs of Wait collapsed; [] when the task is
    not the simulator's or the oracle fails it."""
    from mobilerl.agent.policy import OraclePolicy
    from mobilerl.data.step_instructions import step_instruction
    from mobilerl.env.actions import Action
    from mobilerl.env.sim.tasks.registry import SUITES
    from mobilerl.eval.runner import evaluate_sync

    if task.suite not in SUITES:
        return []
    budget = dataclasses.replace(task, complexity=5.0)  # the expert's budget (50 steps), not the policy's
    [traj] = evaluate_sync(lambda seed: OraclePolicy(), [budget], perturb="none", progress=False, concurrency=1)
    if traj.error is not None or not traj.finished:
        return []
    plan: list[str] = []
    for s in traj.steps:
        text = step_instruction(Action.from_dict(s.action), s.xml_compressed, task.instruction) if s.action else None
        if text is not None and not (text == _WAIT and plan and plan[-1] == _WAIT):
            plan.append(text)
    return plan


def plan_instruction(instruction: str, plan: Sequence[str]) -> str:
    """The plan-conditioned task text (x, p_x): the instruction, then the numbered plan."""
    return "\n".join([instruction.strip(), PLAN_HEADER, *(f"{i + 1}. {p}" for i, p in enumerate(plan))])


def replace_first_failure(trajectories: Sequence[Trajectory], cached: Trajectory | None) -> list[Trajectory] | None:
    """Eq. 3: the group {τ_off, τ_2 … τ_N} when every trajectory failed and a cached one exists, else None
    (the group stays as sampled)."""
    if cached is None or not trajectories or any(t.success for t in trajectories):
        return None
    return [cached, *trajectories[1:]]


def reprompted(traj: Trajectory, instruction: str, origin: str) -> Trajectory:
    """A copy of ``traj`` under the plain ``instruction`` (the plan dropped: the update rebuilds every prompt
    from ``traj.instruction``), marked with its cache origin; reference logprobs of the old prompts dropped."""
    out = Trajectory.from_dict(traj.to_dict())
    out.instruction = instruction
    out.meta = {k: v for k, v in out.meta.items() if k != "ref_logprobs"}
    out.meta["bepa"] = origin
    return out


@torch.no_grad()
def old_policy_logprobs(traj: Trajectory, model: Any, fmt: PromptFormat, prompt_ids: Callable[[Any], list[int]],
                        pad_id: int, temperature: float, max_tokens: int) -> Trajectory:
    """A copy of ``traj`` whose steps' logprobs are π_θold's (``model``, before this round's update) of their
    sampled tokens under the prompts the update rebuilds (the plain instruction): the ratio's denominator."""
    out = Trajectory.from_dict(traj.to_dict())
    rows = trajectory_rows(out, 0.0, fmt, prompt_ids)
    device = next(model.parameters()).device
    for mb in micro_batches(rows, max_tokens):
        lp, _ = rows_logprobs(model, collate(mb, pad_id, device), temperature)
        for row, v in zip(mb, lp.tolist(), strict=True):
            row.behaviour_logprobs = v[: len(row.response_ids)]
    steps = [s for s in out.steps if s.token_ids and s.logprobs is not None]  # trajectory_rows' steps, in order
    for s, row in zip(steps, rows, strict=True):
        s.logprobs = row.behaviour_logprobs
    return out


def relogprob(trainer: Any) -> Callable[[Trajectory], Trajectory]:
    """:func:`old_policy_logprobs` under ``trainer``'s policy and prompt format (a :class:`~mobilerl.rl.trainer.Trainer`)."""
    return functools.partial(old_policy_logprobs, model=trainer.model, fmt=trainer.fmt, prompt_ids=trainer.prompt_ids,
                             pad_id=trainer.pad_id, temperature=trainer.settings.temperature,
                             max_tokens=trainer.cfg.micro_batch_tokens)


@dataclasses.dataclass
class BEPA(Hook):
    """The per-task cache E_x, which tasks were seeded, and the oracle plans (recomputed, not saved); its hook
    point is "groups scored" (each of dynamic sampling's further draws too)."""

    name = "bepa"
    gauges = frozenset({"bepa/cache_tasks"})
    seed_rollouts: int = 4
    seed: int = 0
    cache: dict[str, Trajectory] = dataclasses.field(default_factory=dict)
    seeded: set[str] = dataclasses.field(default_factory=set)
    plans: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def plan(self, task: TaskSpec) -> list[str]:
        if task.task_id not in self.plans:
            self.plans[task.task_id] = oracle_plan(task)
        return self.plans[task.task_id]

    def refresh(self, groups: Sequence[Any], r: int) -> int:
        """LEVEL-2: E_x ← a random success of each group that has one (𝒰 = random sampling, the paper's
        default); returns how many entries changed."""
        rng = np.random.default_rng(stable_seed(self.seed, "bepa-refresh", r))
        n = 0
        for g in groups:
            wins = [t for t in g.trajectories if t.success]
            if wins:
                pick = wins[int(rng.integers(len(wins)))]
                self.cache[g.task_id] = reprompted(pick, pick.instruction, "own")
                n += 1
        return n

    def seed_cache(self, tasks: Sequence[TaskSpec], rollout: Rollout, r: int) -> dict[str, float]:
        """LEVEL-1 for ``tasks`` (each at most once a run): ``seed_rollouts`` plan-conditioned episodes each;
        a random success, re-prompted with the plain instruction, becomes E_x."""
        todo = [t for t in tasks if t.task_id not in self.seeded and t.has_verifier]
        self.seeded |= {t.task_id for t in todo}
        plain = {t.task_id: t.instruction for t in todo}
        guided = [dataclasses.replace(t, instruction=plan_instruction(t.instruction, p))
                  for t in todo if (p := self.plan(t))]
        trajs = rollout(guided, self.seed_rollouts, stable_seed(self.seed, "bepa-seed", r)) if guided else []
        rng = np.random.default_rng(stable_seed(self.seed, "bepa-seed-pick", r))
        wins = 0
        for t in guided:
            ok = [x for x in trajs if x.task_id == t.task_id and x.success and x.error is None]
            wins += len(ok)
            if ok:
                self.cache[t.task_id] = reprompted(ok[int(rng.integers(len(ok)))], plain[t.task_id], "seed")
        return {"bepa/seeded": float(len(todo)), "bepa/seed_episodes": float(len(trajs)),
                "bepa/seed_successes": float(wins)}

    def assimilate(self, groups: Sequence[Any], tasks: Sequence[TaskSpec], r: int, rollout: Rollout,
                   relogprob: Callable[[Trajectory], Trajectory]) -> tuple[list[Any], dict[str, float]]:
        """One round: refresh E from the groups' successes, seed the cache of all-failed groups' tasks that
        have none, then replace the first trajectory of each all-failed group with E_x (its logprobs from
        ``relogprob``: the old policy's). Returns the groups to train on (new objects where replaced; the
        given ``groups`` are left as sampled) and ``bepa/*`` metrics."""
        refreshed = self.refresh(groups, r)
        by_id = {t.task_id: t for t in tasks}
        failed = [g for g in groups if g.trajectories and not any(t.success for t in g.trajectories)]
        need = [by_id[g.task_id] for g in failed if g.task_id not in self.cache and g.task_id in by_id]
        m = self.seed_cache(need, rollout, r) if need else {}
        out, replaced = [], 0
        for g in groups:
            new = replace_first_failure(g.trajectories, self.cache.get(g.task_id))
            if new is None:
                out.append(g)
                continue
            new[0] = relogprob(self.cache[g.task_id])
            out.append(dataclasses.replace(g, trajectories=new, rewards=[], advantages=[], keep=[]))
            replaced += 1
        return out, {"bepa/replaced": float(replaced), "bepa/refreshed": float(refreshed),
                     "bepa/cache_tasks": float(len(self.cache)), "bepa/seeded": 0.0, "bepa/seed_episodes": 0.0,
                     "bepa/seed_successes": 0.0, **m}

    def groups_collected(self, ctx: RoundContext, groups: list[Any]) -> tuple[list[Any], Metrics]:
        if ctx.rollout is None:
            raise ValueError("rl.bepa needs the synchronous loop's rollouts (its seeding runs episodes)")
        return self.assimilate(groups, ctx.pool, ctx.r, ctx.rollout, relogprob(ctx.trainer))  # any draw's tasks

    def state_dict(self) -> dict[str, Any]:
        return {"cache": {k: t.to_dict() for k, t in self.cache.items()}, "seeded": sorted(self.seeded)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache = {k: Trajectory.from_dict(d) for k, d in state.get("cache", {}).items()}
        self.seeded = set(state.get("seeded", []))
