"""The HTTP API under the values the journal cannot hold (issue 15, items 3 and 6), against a
real ``haltwise serve``: an integer of 5,000 digits, JSON nested 20,000 deep, NaN, a body
that is not UTF-8. Each is a 400 in the contract's JSON, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from _serve import Served, start_server


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    server = start_server(tmp_path, sqlite_url)
    try:
        yield server
    finally:
        server.stop()


BODIES = {
    "5000-digit int": b'{"task": "quick", "input": {"topic": ' + b"7" * 5000 + b"}}",
    "20000 deep": b'{"task": "quick", "input": {"topic": ' + b"[" * 20000 + b"]" * 20000 + b"}}",
    "NaN": b'{"task": "quick", "input": {"topic": NaN}}',
    "not UTF-8": b'{"task": "\xff\xfe"}',
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_a_body_the_journal_cannot_hold_is_a_400(served: Served, body: bytes) -> None:
    for path in ("/api/runs", "/api/runs/x/cancel", "/api/cancel", "/api/runs/x/resume"):
        answer = served.post(path, raw=body)
        assert answer.status == 400, (path, answer.status, answer.json())
        assert answer.error_code == "malformed"
    assert served.get("/api/runs").status == 200
