"""Approvals over HTTP, on both stores (CONTRACT.md, "Someone else decides"): ``GET
/api/approvals`` lists the pending requests, ``POST /api/runs/{id}/approvals/{step}`` decides
one (operator token; 409 when it is not awaiting; an edit validated against the tool's
parameters), and the event stream carries the requests and decisions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _serve import PATIENCE, Served, events, start_server

AGENT = """
from pathlib import Path

import haltwise

HERE = Path(__file__).parent


@haltwise.tool(cancel="finish", effect="external", approval="required")
async def pay(amount: int, to: str) -> str:
    with open(HERE / "effects.log", "a") as log:
        log.write(f"pay:{amount}:{to}\\n")
    return f"paid {amount} to {to}"


@haltwise.tool(cancel="finish", effect="external", approval="required", approval_timeout=0.5)
async def pay_soon(amount: int) -> str:
    return "paid"


@haltwise.task
async def buy(amount: int = 5) -> str:
    try:
        return await pay(amount, "bob")
    except haltwise.ApprovalRefused as refused:
        return f"refused: {refused}"


@haltwise.task
async def buy_soon() -> str:
    try:
        return await pay_soon(7)
    except haltwise.ApprovalExpired as expired:
        return f"expired: {expired}"
"""


@pytest.fixture
def served(tmp_path: Path, store_url: str) -> Iterator[Served]:
    env = {"HALTWISE_READ_TOKEN": "reader-token"}
    with start_server(tmp_path, store_url, env=env, agent=AGENT) as server:
        yield server


def finished(served: Served, run_id: str) -> dict[str, Any]:
    final = ("completed", "cancelled", "failed")
    return served.wait_for(run_id, "a final state", lambda run: run["state"] in final)


def awaiting(served: Served, *run_ids: str) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + PATIENCE
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        answer = served.get("/api/approvals")
        assert answer.status == 200, answer.body
        seen = answer.json()["approvals"]
        if set(run_ids) <= {item["run"] for item in seen}:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{run_ids} never awaited approval: {seen}")


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
