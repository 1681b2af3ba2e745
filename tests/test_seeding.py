"""The two seed hashes keep their values: the simulator's tasks and every sampled episode depend on them."""

from __future__ import annotations

import pytest

from mobilerl.seeding import sim_seed, stable_seed


@pytest.mark.parametrize(("parts", "value"), [
    ((0, "device"), 1643631180),
    ((7, "params"), 1842570024),
    (("world", "contacts_add", "test", 3, 0), 1468350949),
    ((12345, "settings-app", "Wi-Fi"), 1221393297),
])
def test_sim_seed_is_the_simulators_crc32(parts, value):
    assert sim_seed(*parts) == value < 2**31


@pytest.mark.parametrize(("parts", "value"), [
    ((0, "ep-1", 0), 248843011303416271),
    ((1234, "world/test/contacts_add/3", 2), 7959383094006810016),
    (("a",), 2340832890917691671),
    ((42, None, 1.5), 7848187114692187701),
])
def test_stable_seed_is_63_bit_blake2b(parts, value):
    assert stable_seed(*parts) == value < 2**63


def test_the_two_hashes_differ():
    # Not to be unified: sim_seed defines the simulator's tasks, stable_seed the sampling seeds.
    assert sim_seed(0, "device") != stable_seed(0, "device")


def test_episode_seed_is_stable_seed_of_its_parts():
    from mobilerl.agent.runner import episode_seed

    for base, task, trial in [(0, "world/test/a/1", 0), (5, "fake/test/a/1", 0), (2024, "lab/test/x/7", 3)]:
        assert episode_seed(base, task, trial) == stable_seed(base, task, trial)
    assert episode_seed(5, "fake/test/a/1", 0) == 890591009685868445
