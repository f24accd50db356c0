"""The approvals' HTTP tests' agent and readers (tests/server/test_server_approvals.py and the
dashboard's browser test): a paid tool that needs approval, one with a short timeout."""

from __future__ import annotations

import time
from typing import Any

from _serve import PATIENCE, Served

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


def finished(served: Served, run_id: str) -> dict[str, Any]:
    final = ("completed", "cancelled", "failed")
    return served.wait_for(run_id, "a final state", lambda run: run["state"] in final)


def awaiting(served: Served, *run_ids: str) -> list[dict[str, Any]]:
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
