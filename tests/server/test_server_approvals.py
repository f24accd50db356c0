"""Approvals over HTTP, on both stores (CONTRACT.md, "Someone else decides"): ``GET
/api/approvals`` lists the pending requests, ``POST /api/runs/{id}/approvals/{step}`` decides
one (operator token; 409 when it is not awaiting; an edit validated against the tool's
parameters), and the event stream carries the requests and decisions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from _approvals_kit import AGENT, awaiting, finished
from _serve import Served, events, start_server


@pytest.fixture
def served(tmp_path: Path, store_url: str) -> Iterator[Served]:
    env = {"HALTWISE_READ_TOKEN": "reader-token"}
    with start_server(tmp_path, store_url, env=env, agent=AGENT) as server:
        yield server


def test_approve_edit_refuse_expire_over_http(served: Served) -> None:
    for run_id, task in (("e1", "buy"), ("r1", "buy"), ("x1", "buy_soon")):
        answer = served.post("/api/runs", {"task": task, "id": run_id})
        assert answer.status == 201, answer.body
    pending = {item["run"]: item for item in awaiting(served, "e1", "r1")}
    assert pending["e1"]["step"] == 0 and pending["e1"]["tool"] == "pay"
    assert pending["e1"]["arguments"] == {"amount": 5, "to": "bob"}
    assert pending["e1"]["timeout_at"] is None and pending["e1"]["requested_at"] > 0
    assert served.get("/api/approvals", token="reader-token").status == 200
    path = "/api/runs/e1/approvals/0"
    denied = served.post(path, {"decision": "approve"}, token="reader-token")
    assert (denied.status, denied.error_code) == (403, "forbidden") or denied.status == 403
    misfit = served.post(path, {"decision": "approve", "edit": {"amount": "lots"}})
    assert misfit.status == 422, misfit.body
    assert "amount" in misfit.json()["error"]["message"]
    assert served.post(path, {"decision": "maybe"}).status == 422
    assert served.post("/api/runs/nope/approvals/0", {"decision": "approve"}).status == 404
    answer = served.post(path, {"decision": "approve", "edit": {"amount": 3}, "by": "ops"})
    assert answer.status == 200, answer.body
    step = answer.json()
    assert step["index"] == 0 and step["approval"]["state"] == "edited"
    again = served.post(path, {"decision": "refuse"})
    assert (again.status, again.error_code) == (409, "approval_conflict")
    assert "edited by ops" in again.json()["error"]["message"]
    note = {"decision": "refuse", "by": "ops", "note": "too expensive"}
    assert served.post("/api/runs/r1/approvals/0", note).status == 200
    assert finished(served, "e1")["result"] == "paid 3 to bob"
    refused = finished(served, "r1")
    assert refused["result"] == "refused: [haltwise] refused by ops: too expensive"
    assert refused["steps"][0]["status"] == "refused"
    assert refused["steps"][0]["approval"]["note"] == "too expensive"
    assert finished(served, "x1")["result"].startswith("expired: ")
    late = served.post("/api/runs/x1/approvals/0", {"decision": "approve"})
    assert late.status == 409 and "expired" in late.json()["error"]["message"]
    assert served.get("/api/approvals").json() == {"approvals": []}
    stream = [
        (event["event"], event["data"].get("status"))
        for event in events(served, "/api/runs/e1/events?since=0", {}, 8)
    ]
    assert ("approval", "awaiting") in stream and ("approval", "edited") in stream
    assert (served.root / "effects.log").read_text().split() == ["pay:3:bob"]
