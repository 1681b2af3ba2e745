"""The one multi-turn loop: collection, evaluation and RL all produce trajectories through :func:`rollout`.

    obs_0 = reset(task)
    for t in 0 .. task.max_steps - 1:
        r_t = policy.act(task, obs_t, compress(obs_t), history = r_0..r_{t-1})
        a_t = parse_action(r_t)      # ActionParseError -> invalid step: recorded, counts, env NOT stepped
        obs_{t+1}, done, info = step(a_t)
        stop if a_t is Finish or done
    reward = evaluate()              # 1.0 iff finished and verified; None when the verifier is hidden
    success = finished and reward == 1.0

With ``task.expert_prefix`` = p (RL's reverse curriculum), the simulator's expert answers steps 0 … p − 1 (short
of its ``finish``), recorded with ``expert=True`` and no logprobs, and the policy sees them as its own history.
The budget counts every response, invalid ones included (so a policy cannot stall on malformed
output). Env failures (any exception from reset/step/evaluate, :class:`~mobilerl.env.base.EnvError` and
:class:`~mobilerl.env.base.EnvCrashed` above all) and policy failures end the episode with
``Trajectory.fail`` (kind ``env`` / ``policy``, or the kind the policy's error names: ``engine`` when the engine
serving it is unreachable, :class:`~mobilerl.models.generation.EngineUnavailable`) instead of raising; cancellation
propagates. An episode that spends its budget unfinished ends with kind ``budget`` (``parse`` when no response of
it parsed).
CPU work outside the env (XML compression, PNG encoding) runs in a worker thread, so the event loop is
never blocked.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

from mobilerl import sealed
from mobilerl.agent.policy import (
    OraclePolicy,
    Policy,
    PolicyContext,
    PolicyOutput,
    policy_name,
    policy_version,
)
from mobilerl.env import actions as A
from mobilerl.env.actions import ActionParseError, parse_action
from mobilerl.env.base import AsyncEnv, EnvError, Observation, TaskSpec
from mobilerl.env.xml import compress_xml
from mobilerl.trajectory import StepRecord, Trajectory

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def episode_id(task: TaskSpec, trial: int) -> str:
    return f"{task.task_id}#{trial}"


def _compress(obs: Observation) -> str:
    return compress_xml(obs.xml, width=obs.width, height=obs.height)


def _save_png(obs: Observation, path: Path) -> str | None:
    png = obs.png()
    if png is None:
        return None
    return str(sealed.write_bytes(path, png))  # sealed under a registered folder (RL's kept screens)


def _env_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


async def rollout(
    env: AsyncEnv,
    policy: Policy,
    task: TaskSpec,
    *,
    trial: int = 0,
    seed: int | None = None,
    keep_screenshots_dir: Path | str | None = None,
) -> Trajectory:
    """Run one episode of ``policy`` on ``task`` in ``env`` and return its :class:`Trajectory`.

    Args:
        env: an async env (a pool lease, ThreadEnv, ProcessEnv, RemoteEnv, ...); it is not closed here.
        policy: anything with ``async act(PolicyContext) -> PolicyOutput``.
        task: the task; ``task.max_steps`` is the response budget.
        trial: trial index (recorded; part of the episode id the policy sees).
        seed: the policy seed of this episode (recorded only; the caller seeded the policy).
        keep_screenshots_dir: if set, each step's screenshot (when the env renders one) is written to
            ``<dir>/<task id>/trial<trial>/step<NNN>.png`` and its path recorded.
    """
    traj = Trajectory.for_task(
        task, policy=policy_name(policy), policy_version=policy_version(policy), trial=trial, seed=seed
    )
    ep = episode_id(task, trial)
    shots = (
        Path(keep_screenshots_dir) / _UNSAFE.sub("_", task.task_id) / f"trial{trial}"
        if keep_screenshots_dir is not None
        else None
    )
    t_start = time.perf_counter()
    # An env run on the event loop (InlineEnv, also behind a pool lease) gets its XML compressed there too.
    inline = getattr(getattr(env, "worker", env), "inline", False) is True
    history: list[str] = []
    apps: list[str] = []
    expert = OraclePolicy() if task.expert_prefix else None
    previous: Observation | None = None
    last_info: dict = {}
    try:
        obs = await env.reset(task)
        traj.meta["screen_size"] = [obs.width, obs.height]  # recorded data can be shown on the 0-999 grid
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - recorded on the trajectory
        _log_unexpected(e, task, "reset")
        traj.fail("env", _env_error(e))
        traj.wall_time_s = time.perf_counter() - t_start
        return traj

    for t in range(task.max_steps):
        try:
            xml_c = _compress(obs) if inline else await asyncio.to_thread(_compress, obs)
        except ValueError as e:
            traj.fail("env", f"malformed observation at step {t}: {e}")
            break
        shot = await asyncio.to_thread(_save_png, obs, shots / f"step{t:03d}.png") if shots else None
        ctx = PolicyContext(task, obs, xml_c, tuple(history), t, ep, tuple(apps), previous)
        t0 = time.perf_counter()
        by_expert = t < task.expert_prefix
        try:
            out = await (expert.act(ctx) if by_expert else policy.act(ctx))
            if by_expert and out.text.startswith("finish("):  # the expert would end the task: the policy's turn
                by_expert, out = False, await policy.act(ctx)
            if not isinstance(out, PolicyOutput):
                raise TypeError(
                    f"{type(policy).__name__}.act returned {type(out).__name__}, not PolicyOutput"
                )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            # an error may name its kind: EngineUnavailable's "engine" (the engine serving the policy is down)
            kind = "engine" if getattr(e, "error_kind", None) == "engine" else "policy"
            traj.fail(kind, f"{type(e).__name__}: {e}")
            break
        policy_s = time.perf_counter() - t0
        history.append(out.text)
        apps.append(obs.app)
        previous = obs
        rec = StepRecord(
            index=t,
            response=out.text,
            policy_latency_s=policy_s,
            xml_compressed=xml_c,
            app=obs.app,
            screenshot_path=shot,
            logprobs=list(out.logprobs) if out.logprobs is not None else None,
            token_ids=list(out.token_ids) if out.token_ids is not None else None,
            expert=by_expert,
        )
        traj.steps.append(rec)
        if out.invalid is not None:
            rec.invalid = out.invalid
            continue
        try:
            action = parse_action(out.text if out.action_text is None else out.action_text)
            if action.index is not None:  # a Set-of-Mark index the policy did not resolve to a box
                raise ActionParseError(f"index={action.index} needs a policy in the 'marks' frame to name a box")
        except ActionParseError as e:
            rec.invalid = str(e) or "unparseable response"
            continue
        except Exception as e:  # noqa: BLE001 - parse_action raises only ActionParseError; a bug there must
            # cost this step, not the episode (model output is adversarial input)
            rec.invalid = f"unparseable response ({type(e).__name__}: {str(e)[:200]})"
            continue
        rec.action = action.to_dict()
        t0 = time.perf_counter()
        try:
            result = await env.step(action)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            _log_unexpected(e, task, "step")
            rec.latency_s = time.perf_counter() - t0
            traj.fail("env", _env_error(e))
            break
        rec.latency_s = time.perf_counter() - t0
        info = result.info or {}
        last_info = info
        rec.effect = info.get("effect")
        changed = info.get("changed")
        rec.changed = bool(changed) if changed is not None else result.observation.xml != obs.xml
        obs = result.observation
        if action.name == A.FINISH:
            traj.finished = True
            traj.answer = action.message
            break
        if result.done:
            break

    if traj.error is None:
        try:
            traj.final_xml_compressed = _compress(obs) if inline else await asyncio.to_thread(_compress, obs)
        except ValueError:
            traj.final_xml_compressed = None
        try:
            reward = await env.evaluate()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            _log_unexpected(e, task, "evaluate")
            traj.fail("env", _env_error(e))
        else:
            traj.reward = None if reward is None else float(reward)
            traj.success = traj.finished and traj.reward == 1.0
    if traj.error_kind is None and not traj.finished and len(traj.steps) >= task.max_steps:
        traj.error_kind = "parse" if all(st.action is None for st in traj.steps) else "budget"
    subgoals = last_info.get("subgoals")
    if isinstance(subgoals, list | tuple):
        traj.subgoals = [bool(v) for v in subgoals]
    traj.wall_time_s = time.perf_counter() - t_start
    return traj


def _log_unexpected(e: BaseException, task: TaskSpec, call: str) -> None:
    if not isinstance(e, EnvError):
        log.warning("env %s() on %s raised %r (recorded as an env error)", call, task.task_id, e, exc_info=e)
