"""Schema-driven fuzzing of the API: every operation of ``/api/openapi.json``, with requests
schemathesis generates from it (valid and invalid), against a real server with runs in its
store. No request may get a 5xx, every error is the contract's JSON, and the journal stays sound.

The event streams are left out (a request on them never ends); their errors are tested in
test_server.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _serve import Served, start_server


@pytest.fixture
def served(tmp_path: Path, store_url: str) -> Iterator[Served]:
    with start_server(tmp_path, store_url) as server:
        yield server


def test_no_generated_request_crashes_the_server_or_the_journal(served: Served) -> None:
    for run_id in ("f1", "f/2"):
        assert served.post("/api/runs", {"task": "quick", "id": run_id}).status == 201
    assert served.post("/api/runs", {"task": "research", "id": "held"}).status == 201
    document = served.get("/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {served.token}"
    answers: list[int] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("events"):
            continue
        fuzz_operation(operation, served, session, answers)
    assert answers, "no request was made"
    assert all(status < 500 for status in answers)
    assert served.get("/api/runs").status == 200
    served.release("think")
    checked = served.hw("check", "--json")
    assert checked.returncode == 0, checked.stdout


def fuzz_operation(
    operation: Any, served: Served, session: requests.Session, answers: list[int]
) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(), known=st.sampled_from(["f1", "f/2", "held", "nope"]))
    def check(case: Any, known: str) -> None:
        if "id" in (case.path_parameters or {}) and known != "nope":
            case.path_parameters["id"] = known
        auth = {"Authorization": f"Bearer {served.token}"}
        response = case.call(base_url=served.base, session=session, headers=auth, timeout=30)
        answers.append(response.status_code)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"code", "message"}
        assert response.status_code < 500, (case.method, case.formatted_path, response.text)

    check()
