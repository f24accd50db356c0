"""The edges of the HTTP API a new user meets first (issue 29): the OpenAPI document validates
and describes what the server answers, odd input is a 400/422 in the contract's JSON (never a
500 and a traceback in the log), the times of a run's steps, the events' data, slow clients.
Against a real ``haltwise serve``; on SQLite and PostgreSQL where the store matters.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from _serve import PATIENCE, Served, events, start_server


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    with start_server(tmp_path, sqlite_url) as server:
        yield server


@pytest.fixture
def served_on(tmp_path: Path, store_url: str) -> Iterator[Served]:
    with start_server(tmp_path, store_url) as server:
        yield server


def finished(served: Served, run_id: str) -> dict[str, Any]:
    final = ("completed", "cancelled", "failed")
    return served.wait_for(run_id, "a final state", lambda run: run["state"] in final)


def no_traceback(served: Served) -> str:
    """Stop the server and return its log, which must hold no traceback."""
    assert served.stop() == 0
    assert served.process.stderr is not None
    log = served.process.stderr.read()
    assert "Traceback" not in log, log
    return log


def shape(document: dict[str, Any], name: str) -> dict[str, Any]:
    """A component schema with the document's components beside it (for its $refs)."""
    return {**document["components"]["schemas"][name], "components": document["components"]}


# -- item 1: the document ----------------------------------------------------------------------


def test_the_openapi_document_validates_and_describes_the_answers(served: Served) -> None:
    document = served.get("/api/openapi.json").json()
    validate(document)  # openapi-spec-validator: no PointerToNowhere, a valid 3.1 document
    paths = document["paths"]
    # answers are shapes, not {"type": "object"}; each given answer fits its documented shape
    assert served.post("/api/runs", {"task": "quick", "id": "o1"}).status == 201
    run = finished(served, "o1")
    jsonschema.validate(run, shape(document, "Run"))
    jsonschema.validate(served.get("/api/runs").json(), shape(document, "RunList"))
    again = served.post("/api/runs", {"task": "quick", "id": "o1"})
    assert again.status == 200 and "200" in paths["/api/runs"]["post"]["responses"]
    final = served.post("/api/runs/o1/cancel", {})
    assert final.status == 200 and "200" in paths["/api/runs/{id}/cancel"]["post"]["responses"]
    jsonschema.validate(final.json(), shape(document, "RunState"))
    for stream in ("/api/events", "/api/runs/{id}/events"):
        named = {p["name"] for p in paths[stream]["get"]["parameters"]}
        assert "Last-Event-ID" in named
    # a 405 names the method that works; a 422 names every problem of the body
    wrong = served.get("/api/runs/o1/cancel")
    assert (wrong.status, wrong.headers.get("allow")) == (405, "POST")
    assert served.request("DELETE", "/api/runs").headers.get("allow") is not None
    unfit = served.post("/api/cancel", {"ids": [1], "force": "yes", "colour": 2})
    assert unfit.status == 422
    message = unfit.json()["error"]["message"]
    assert all(field in message for field in ("ids.0", "force", "colour")), message


# -- items 2, 16: undecodable and odd input ------------------------------------------------------

#: Texts that str.isdigit() takes and int() refuses (² ³) or reads as a digit (U+0661, an
#: Arabic-Indic 1).
ODD_DIGITS = ["%C2%B2", "%C2%B3", "%D9%A1"]


def test_odd_digits_and_undecodable_ids_are_400_never_500(served: Served) -> None:
    assert served.post("/api/runs", {"task": "quick", "id": "d1"}).status == 201
    finished(served, "d1")
    for digits in ODD_DIGITS:
        for query in (f"/api/runs?limit={digits}", f"/api/events?since={digits}"):
            answer = served.get(query)
            assert (answer.status, answer.error_code) == (400, "malformed"), query
    for header in ("²", "³", "\u0661"):
        value = header.encode().decode("latin-1")  # http.client sends latin-1 bytes as they are
        for stream in ("/api/events", "/api/runs/d1/events"):
            answer = served.get(stream, headers={"Last-Event-ID": value})
            assert answer.status == 400, (stream, header)
    for key in ("²", "\u0661"):
        answer = served.post("/api/runs/d1/resume", {"assume_done": {key: 1}})
        assert (answer.status, answer.error_code) == (422, "unfit"), key
    for run_id in ("%ff%fe", "%FF", "%ED%A0%80"):
        for method, action in (("GET", ""), ("GET", "/events"), ("POST", "/cancel")):
            path = f"/api/runs/{run_id}{action}"
            answer = served.request(method, path, {} if method == "POST" else None)
            assert (answer.status, answer.error_code) == (400, "malformed"), path
    assert served.get("/api/runs").status == 200
    no_traceback(served)


# -- item 3: a step's times on the command line too ----------------------------------------------


def test_status_json_and_the_api_carry_the_steps_times(served: Served) -> None:
    assert served.post("/api/runs", {"task": "quick", "id": "t1"}).status == 201
    api_steps = finished(served, "t1")["steps"]
    shown = served.hw("status", "t1", "--json")
    assert shown.returncode == 0, shown.stderr
    cli_steps = json.loads(shown.stdout)["steps"]
    assert cli_steps == api_steps
    assert all(step["started_at"] <= step["settled_at"] for step in cli_steps)


# -- item 4: events that carry their data ---------------------------------------------------------


def test_each_event_carries_what_it_is_about(served: Served) -> None:
    assert served.post("/api/runs", {"task": "quick", "id": "e1"}).status == 201
    run = finished(served, "e1")
    seen = list(events(served, "/api/runs/e1/events", {"Last-Event-ID": "0"}, 7))
    partials = [event["data"] for event in seen if event["event"] == "partial"]
    assert [p["value"] for p in partials] == run["partials"]
    assert [p["position"] for p in partials] == [0, 1]
    transitions = [event["data"] for event in seen if event["event"] == "transition"]
    assert [(t["from"], t["to"]) for t in transitions] == [
        (None, "pending"),
        ("pending", "running"),
        ("running", "completed"),
    ]
    assert all("reason" in t for t in transitions)
    steps = [event["data"] for event in seen if event["event"] == "step"]
    assert {(s["step"], s["tool"], s["status"]) for s in steps} >= {
        (0, "search", "running"),
        (0, "search", "committed"),
    }


# -- item 17: a NUL in an id given in a body ------------------------------------------------------


def test_a_nul_in_a_body_id_is_a_422_on_both_stores(served_on: Served) -> None:
    assert served_on.post("/api/runs", {"task": "quick", "id": "n1"}).status == 201
    finished(served_on, "n1")
    for path, body in (
        ("/api/runs", {"task": "quick", "id": "a\x00b"}),
        ("/api/runs/n1/fork", {"from_step": 0, "id": "f\x00", "dry_run": True}),
        ("/api/runs/n1/fork", {"from_step": 0, "id": "f\x00"}),
        ("/api/runs/n1/cancel", {"reason": "r\x00"}),
    ):
        answer = served_on.post(path, body)
        assert (answer.status, answer.error_code) == (422, "unfit"), (path, answer.body)
    assert [run["id"] for run in served_on.get("/api/runs").json()["runs"]] == ["n1"]


# -- item 18: the document and the server agree ---------------------------------------------------


def test_what_the_document_allows_the_server_takes(served: Served) -> None:
    document = served.get("/api/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert served.post("/api/runs", {"task": "quick", "id": "s1"}).status == 201
    finished(served, "s1")
    # 659.0 is an integer in JSON Schema: the fork takes it as step 659 (out of range: the
    # runtime's own refusal, not a type error)
    plan = served.post("/api/runs/s1/fork", {"from_step": 1.0, "dry_run": True})
    assert plan.status == 200, plan.body
    assert plan.json()["from_step"] == 1
    # a cursor the document allows looks like one; a NUL in a reason is documented as refused
    listing = document["paths"]["/api/runs"]["get"]["parameters"]
    cursor = next(p for p in listing if p["name"] == "cursor")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("%%%", cursor["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"reason": "a\x00"}, shape(document, "CancelBody"))
    assert "422" in document["paths"]["/api/runs/{id}/cancel"]["post"]["responses"]
    assert "ActiveState" in schemas


# -- item 19: slow clients -----------------------------------------------------------------------


def test_a_client_that_never_finishes_its_request_is_let_go(served: Served) -> None:
    host, port = served.host.split(":")
    stalled = []
    for head in (
        b"GET /api/runs HTTP/1.1\r\nHost: x\r\n",  # headers never end
        b"POST /api/cancel HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + served.token.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",  # body never ends
    ):
        connection = socket.create_connection((host, int(port)), timeout=PATIENCE)
        connection.sendall(head)
        stalled.append(connection)
    for connection in stalled:
        # the server closes it (a 408, or nothing if the headers never ended), within its
        # read timeout: recv returns the answer and then b"" at the close
        got = b""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            chunk = connection.recv(65536)
            if not chunk:
                break
            got += chunk
        else:
            raise AssertionError("the server still holds the connection")
        assert got == b"" or got.startswith(b"HTTP/1.1 408"), got
        connection.close()
    assert served.get("/api/runs").status == 200


# -- item 20: the session cookie ends ------------------------------------------------------------


def test_the_session_cookie_has_a_max_age(served: Served) -> None:
    login = served.get(f"/?token={served.token}", token=None)
    cookie = login.headers["set-cookie"].lower()
    assert "max-age=" in cookie, cookie
