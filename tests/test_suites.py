"""Task suites: sizes, splits, verifiers, oracle success (issue acceptance criteria)."""

from dataclasses import replace
from statistics import median

import pytest

from mobilerl.env.actions import Action
from mobilerl.env.sim import SimEnv, hidden_ground_truth, run_oracle
from mobilerl.env.sim.apps import APP_CLASSES
from mobilerl.env.sim.screen import Screen
from mobilerl.env.sim.tasks import ExpertError, OracleAgent, get_task, list_tasks, templates


@pytest.fixture(scope="module")
def world_test():
    return list_tasks("world", "test")


@pytest.fixture(scope="module")
def lab_test():
    return list_tasks("lab", "test")


def test_world_size(world_test):
    tmpls = templates("world")
    assert len(tmpls) >= 60
    assert len({a for t in tmpls for a in t.apps}) >= 12
    assert len(APP_CLASSES) >= 12
    per_template = {}
    for t in world_test:
        per_template[t.template] = per_template.get(t.template, 0) + 1
    assert set(per_template.values()) == {20}


def test_lab_size(lab_test):
    assert len(lab_test) >= 100
    assert len({a for t in lab_test for a in t.apps}) >= 8
    assert {t.task_type for t in lab_test} == {"operation", "query"}
    assert all(t.subgoals for t in lab_test)
    train = list_tasks("lab", "train", with_optimal=False)
    assert len(train) >= 500
    assert not any(t.has_verifier for t in train)


def test_world_distribution_like_androidworld(world_test):
    n = len(world_test)
    easy = sum(t.difficulty == "easy" for t in world_test) / n
    assert 0.35 <= easy <= 0.65, easy
    assert sum(t.difficulty == "hard" for t in world_test) / n >= 0.1
    steps = [t.optimal_steps for t in world_test]
    assert 4 <= median(steps) <= 12
    assert max(steps) >= 30
    assert sum(s > 20 for s in steps) >= 40  # a heavy tail of long tasks
    assert any(len(t.apps) > 1 for t in world_test)
    assert any(t.task_type == "query" for t in world_test)
    for t in world_test:
        assert t.max_steps == min(50, round(10 * t.complexity))
        assert t.optimal_steps <= t.max_steps, t.task_id


@pytest.mark.parametrize("suite", ["world", "lab"])
def test_oracle_solves_every_test_task(suite, world_test, lab_test):
    tasks = world_test if suite == "world" else lab_test
    failures = [(t.task_id, r.error) for t in tasks for r in [run_oracle(t, perturb="default")] if not r.success]
    assert failures == []


def _run_expert(env: SimEnv, template, params, limit: int) -> None:
    obs = env.device and env._observe()
    agent = OracleAgent(template, params)
    for _ in range(limit):
        try:
            action = agent.act(Screen(obs.xml, obs.app))
        except ExpertError:
            env.step(Action("Finish"))
            return
        res = env.step(action)
        obs = res.observation
        if res.done:
            return


@pytest.mark.parametrize("suite", ["world", "lab"])
def test_wrong_end_states_fail_every_verifier(suite):
    """Doing nothing fails; so does solving a *different* instance of the same template in this device."""
    for tmpl in templates(suite):
        task = get_task(f"{suite}/test/{tmpl.name}/0", with_optimal=False)
        env = SimEnv(perturb="none")
        env.reset(task)
        env.step(Action("Finish", message="I do not know"))
        assert env.evaluate() == 0.0, f"{tmpl.name}: finishing at once passes the verifier"
        for i in range(1, 20):
            other = get_task(f"{suite}/test/{tmpl.name}/{i}", with_optimal=False)
            if tmpl.instruction(other.params) != task.instruction:
                break
        else:
            continue  # no parameters to vary
        env.reset(replace(task, params=other.params, instruction=other.instruction))
        _run_expert(env, tmpl, other.params, task.max_steps)
        env.task = task  # judge the end state against the original task
        assert hidden_ground_truth(env) == 0.0, f"{tmpl.name}: another instance's end state passes"


def test_train_and_test_are_disjoint():
    for suite in ("world", "lab"):
        for tmpl in templates(suite):
            test = [get_task(f"{suite}/test/{tmpl.name}/{i}", with_optimal=False) for i in range(5)]
            train = [get_task(f"{suite}/train/{tmpl.name}/{i}", with_optimal=False) for i in range(10)]
            test_keys = {(t.instruction, t.seed) for t in test}
            assert not test_keys & {(t.instruction, t.seed) for t in train}, tmpl.name
            assert not {t.seed for t in test} & {t.seed for t in train}


def test_lab_train_verifier_is_hidden_but_ground_truth_exists():
    task = list_tasks("lab", "train", n=1, with_optimal=False)[0]
    env = SimEnv(perturb="none")
    env.reset(task)
    env.step(Action("Finish"))
    assert env.evaluate() is None
    assert env.subgoals() == []
    assert hidden_ground_truth(env) == 0.0
    r = run_oracle(task, perturb="none")
    assert r.success  # the hidden check still scores the oracle


def test_task_ids_round_trip():
    t = get_task("world/test/ContactsAddContact/7")
    assert get_task(t.task_id) == t
    for bad in ("world/test/ContactsAddContact", "world/dev/ContactsAddContact/1", "x/test/A/1",
                # int() reads each of these as 7 (or -1): one instance must have one id
                "world/test/ContactsAddContact/٧", "world/test/ContactsAddContact/0_7",
                "world/test/ContactsAddContact/ 7 ", "world/test/ContactsAddContact/07",
                "world/test/ContactsAddContact/+7", "world/test/ContactsAddContact/-1"):
        with pytest.raises(KeyError):
            get_task(bad)
