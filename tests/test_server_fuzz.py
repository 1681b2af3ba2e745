"""Property-based fuzz of the env server's API from its own OpenAPI schema (schemathesis + hypothesis).

Every operation, with generated bodies, sessions and actions, against the simulator backend: no 5xx, every
status the schema documents, every response valid against its declared model. Bounded: a fixed number of
examples per operation, derandomised, so a run takes seconds and fails the same way twice.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from mobilerl.env.factory import env_factory
from mobilerl.env.server import ErrorResponse, StepResponse, create_app

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Sessions the fuzz opens are never closed: a short idle timeout frees their workers well within the
# lease wait, so "no free worker" (503, load, not input) cannot happen.
SIM = env_factory("sim")
APP = create_app(SIM, token=TOKEN, size=2, isolate=False, session_ttl=0.2, acquire_timeout=5.0)
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)  # runs APP's lifespan until the process exits
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


@pytest.mark.timeout(120)
@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_env_server_api_fuzz(case):
    case.call_and_validate(headers=AUTH, checks=CHECKS)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(SIM, token=TOKEN, size=1, isolate=False)) as c:
        yield c


def test_an_unknown_or_malformed_task_is_a_400_not_a_500(client: TestClient):
    for task in ("", '"', "world/test/NoSuchTemplate/0", "world/nosplit/ContactsAddContact/0"):
        r = client.post("/reset", json={"task": task}, headers=AUTH)
        assert r.status_code == 400 and "cannot reset to task" in r.json()["detail"], (task, r.text)
    bad_spec = {"task_id": "x", "suite": "nowhere", "split": "test", "template": "T", "instruction": "i"}
    r = client.post("/reset", json={"task": bad_spec}, headers=AUTH)
    assert r.status_code == 400 and "nowhere" in r.json()["detail"]


@pytest.mark.timeout(120)
@given(action=st.text(max_size=80) | st.from_regex(r'do\(action="(Tap|Swipe|Type|Launch)".{0,40}\)', fullmatch=True))
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_any_action_text_on_a_live_session_is_answered_without_a_5xx(client: TestClient, action: str):
    sid = client.post("/reset", json={"task": "world/test/ContactsAddContact/0"}, headers=AUTH).json()["session"]
    r = client.post("/step", json={"session": sid, "action": action}, headers=AUTH)
    assert r.status_code in (200, 400, 422), r.text
    if r.status_code == 200:
        StepResponse.model_validate(r.json())
    else:
        ErrorResponse.model_validate(r.json())
    assert client.post("/close", json={"session": sid}, headers=AUTH).json() == {"closed": True}
