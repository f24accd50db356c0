"""The HTTP API under the values the journal cannot hold (issue 15, items 3 and 6), against a
real ``haltwise serve``: an integer of 5,000 digits, JSON nested 20,000 deep, NaN, a body
that is not UTF-8. Each is a 400 in the contract's JSON, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from _serve import AGENT, PATIENCE, Served, start_server
from haltwise.server._app import _ACTIONS


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    with start_server(tmp_path, sqlite_url) as server:
        yield server


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


@pytest.fixture
def served_on(tmp_path: Path, store_url: str) -> Iterator[Served]:
    with start_server(tmp_path, store_url) as server:
        yield server


#: Every endpoint that takes a run id in its path (CONTRACT.md, "HTTP API and dashboard"): the
#: two reads, and every action the server routes (so that a new one is checked too).
PATH_ENDPOINTS = [
    ("GET", ""),
    ("GET", "/events"),
    *(("POST", f"/{action}") for action in sorted(_ACTIONS)),
]


def test_a_nul_in_a_path_id_is_an_unknown_run_on_both_stores(served_on: Served) -> None:
    """A NUL byte reached PostgreSQL as a 503 ("text fields cannot contain NUL") before."""
    for method, action in PATH_ENDPOINTS:
        for run_id in ("%00", "a%00b"):
            answer = served_on.request(
                method, f"/api/runs/{run_id}{action}", {} if method == "POST" else None
            )
            assert answer.status == 404, (method, action, answer.status, answer.body)
            assert answer.error_code == "unknown_run"
    assert served_on.get("/api/runs").status == 200


BREAKABLE = (
    AGENT
    + """

import haltwise._runtime.runtime as _runtime

_watch = _runtime.Runtime._watch


async def _breakable_watch(self):
    # The fault: a task of the runtime's own fails once the test makes the file.
    async with anyio.create_task_group() as group:
        group.start_soon(_watch, self)
        while not (HERE / "break-runtime").exists():
            await anyio.sleep(0.01)
        raise RuntimeError("injected fault in the runtime's watcher")


_runtime.Runtime._watch = _breakable_watch
"""
)


def test_a_server_whose_runtime_fails_says_so_on_one_line_and_stops(
    tmp_path: Path, sqlite_url: str
) -> None:
    # Issue 28: the runtime's block ended under a server (one of its tasks failed): it cancelled
    # its runs with reason shutdown, said nothing, and its API went on answering.
    served = start_server(tmp_path, sqlite_url, agent=BREAKABLE)
    try:
        answer = served.post("/api/runs", {"task": "pay", "input": {"amount": 3}})
        assert answer.status in (200, 201, 202), answer.json()
        (tmp_path / "break-runtime").touch()
        out, err = served.process.communicate(timeout=PATIENCE)
    finally:
        served.stop()
    assert served.process.returncode == 2, (out, err)  # a HaltwiseError, as every store error
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "haltwise: serving on" not in line]
    assert lines[0] == "haltwise: serve stopping: its runtime stopped working runs", err
    assert "runtime failed" in lines[-1] and "injected fault" in lines[-1], err
