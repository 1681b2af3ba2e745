"""The in-process simulator environment (the ``sim`` backend) and the oracle runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from mobilerl.env import actions as A
from mobilerl.env.actions import Action
from mobilerl.env.base import EnvError, Observation, StepResult, TaskSpec
from mobilerl.env.sim import content
from mobilerl.env.sim.device import Device, Perturb
from mobilerl.env.sim.screen import Screen
from mobilerl.env.sim.tasks.base import OracleAgent, Template
from mobilerl.env.sim.tasks.registry import get_task, template


class SimEnv:
    """A simulated Android device behind the :class:`mobilerl.env.base.Env` protocol.

    ``render=False`` gives XML-only observations (fast); ``render=True`` adds a 1080×2400 screenshot.
    ``perturb`` is a :class:`Perturb` or a profile name (``none``, ``default``, ``heavy``); the draws come
    from the task's seed, so an episode is reproducible.
    """

    def __init__(self, render: bool = False, seed: int = 0, perturb: Perturb | str = "default"):
        self.render = render
        self.seed = seed
        self.perturb = Perturb.named(perturb) if isinstance(perturb, str) else perturb
        self.device: Device | None = None
        self.task: TaskSpec | None = None
        self.tmpl: Template | None = None
        self._xml = ""
        self.done = False
        self._param_canaries: dict[str, str] | None = None

    # -------------------------------------------------------------------------------- Env protocol
    def reset(self, task: TaskSpec | str) -> Observation:
        try:
            spec = get_task(task, with_optimal=False) if isinstance(task, str) else task
            tmpl = template(spec.suite, spec.template)
        except KeyError as e:  # a task the registry does not know is the caller's error, not the env's
            name = task if isinstance(task, str) else task.task_id
            shown = repr(name) if len(name) <= 200 else f"{name[:200]!r}… ({len(name)} chars)"  # a bounded echo
            raise EnvError(f"cannot reset to task {shown}: {e.args[0] if e.args else e}") from None
        self.task, self.tmpl = spec, tmpl
        self.device = Device(seed=spec.seed, perturb=self.perturb)
        with content.recording(self.device.planted):
            self.tmpl.setup(self.device, spec.params)
        self.done = False
        self._param_canaries = None
        return self._observe()

    def step(self, action: Action) -> StepResult:
        dev = self._dev()
        if self.done:
            raise EnvError("the episode is over; call reset()")
        before = self._xml
        info = dev.step(action)
        obs = self._observe()
        info["changed"] = obs.xml != before
        assert self.task is not None
        self.done = dev.finished or dev.steps >= self.task.max_steps
        if self.done and not dev.finished:
            info["truncated"] = True
        if self.done and self.task.has_verifier:
            # Sub-goal progress travels in the last step's info so it survives pools and the env server.
            info["subgoals"] = self.subgoals()
        return StepResult(obs, self.done, info)

    def evaluate(self) -> float | None:
        """1.0 iff the agent finished and the verifier passes; None for tasks with no exposed verifier."""
        assert self.task is not None
        if not self.task.has_verifier:
            return None
        return hidden_ground_truth(self)

    def close(self) -> None:
        self.device = None

    # ------------------------------------------------------------------------------------- extras
    def subgoals(self) -> list[bool]:
        """Which AndroidLab-style sub-goals hold now (Sub-SR); empty for tasks without a verifier."""
        dev = self._dev()
        assert self.task is not None and self.tmpl is not None
        if not self.task.has_verifier:
            return []
        return [bool(fn(dev)) for _, fn in self.tmpl.subgoals(self.task.params)]

    def canary_categories(self, materialize: bool = False) -> dict[str, str]:
        """``value -> category`` of every raw personal value of this episode so far: the device's content
        (:meth:`Device.canaries`) and the task's parameters (:func:`param_canaries`). In memory only."""
        from mobilerl.env.sim.tasks.registry import param_canaries

        dev = self._dev()
        assert self.task is not None
        if self._param_canaries is None:
            self._param_canaries = param_canaries(self.task)
        out = dict(self._param_canaries)
        out.update(dev.canary_categories(materialize))
        return out

    def canaries(self, materialize: bool = False) -> set[str]:
        """The raw personal values planted in this episode so far (see :meth:`canary_categories`)."""
        return set(self.canary_categories(materialize))

    def screen(self) -> Screen:
        return Screen(self._xml, self._dev().current_name)

    def _dev(self) -> Device:
        if self.device is None:
            raise EnvError("no episode: call reset(task) first")
        return self.device

    def _observe(self) -> Observation:
        dev = self._dev()
        self._xml = dev.xml()
        return Observation(
            xml=self._xml,
            app=dev.current_name,
            width=dev.width,
            height=dev.height,
            screenshot=dev.screenshot() if self.render else None,
            step=dev.steps,
        )


def hidden_ground_truth(env: SimEnv) -> float:
    """The simulator's own check, also for tasks whose verifier is hidden from training code.

    Only the reward-model evaluation may call this for lab ``train`` tasks (to measure the reward model's
    accuracy); training code scores those tasks with the reward model.
    """
    dev = env._dev()
    assert env.task is not None and env.tmpl is not None
    return float(dev.finished and bool(env.tmpl.check(dev, env.task.params)))


@dataclass
class OracleResult:
    task_id: str
    success: bool
    steps: int
    actions: list[Action] = field(default_factory=list)
    error: str | None = None


def run_oracle(task: TaskSpec | str, perturb: Perturb | str = "default", render: bool = False) -> OracleResult:
    """Run the template's expert on one task; success means finished within budget and verified."""
    env = SimEnv(render=render, perturb=perturb)
    obs = env.reset(task)
    assert env.task is not None and env.tmpl is not None
    agent = OracleAgent(env.tmpl, env.task.params)
    actions: list[Action] = []
    error = None
    done = False
    try:
        while not done:
            action = agent.act(Screen(obs.xml, obs.app))
            actions.append(action)
            res = env.step(action)
            obs, done = res.observation, res.done
    except Exception as e:  # noqa: BLE001 — reported per task by check-oracle
        error = f"{type(e).__name__}: {e}"
    ok = error is None and hidden_ground_truth(env) == 1.0
    if error is None and not ok:
        last = actions[-1] if actions else None
        error = "verifier failed" if last is not None and last.name == A.FINISH else "budget exhausted"
    return OracleResult(env.task.task_id, ok, len(actions), actions, error)
