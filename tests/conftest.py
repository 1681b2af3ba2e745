"""Suite-wide settings: the order test files start in, so that two xdist workers (`make test`) finish together.

`make test` runs ``pytest -n 2 --dist loadfile --no-loadscope-reorder``: every file runs whole on one worker (the
module-scoped fixtures are built once), and files are handed out in collection order. The DAG test (the vl_smoke
pipeline) is the longest by far (about a quarter of the suite's time), so its file goes first, with that test first
in it (a worker asks for the next file once two tests of its current one are left: the pipeline file's quick tests
keep it from queueing a file behind the DAG run); the other long files follow, the rest keep their order. Without xdist this only
reorders; every test still runs.
"""

from __future__ import annotations

import pytest

# Longest first (seconds on 2 idle cores, measured with --durations): the files that decide the makespan.
LONG_FILES = (
    "test_pipeline.py",
    "test_rl_trainer.py",  # its two kill -9 runs (sync, async)
    "test_rl_ray.py",  # a two-node Ray cluster and two runs on it
)
FIRST_TESTS = ("test_smoke_deployment_end_to_end_and_selective_repro",)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        i, item = pair
        name = item.path.name
        rank = LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)
        return rank, 0 if item.originalname in FIRST_TESTS else 1, i

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]

