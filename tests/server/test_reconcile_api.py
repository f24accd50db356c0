"""``POST /api/runs/{id}/reconcile`` (CONTRACT.md, "HTTP API"): a run of the served file whose
paid call was cut by a forced cancel, its tool's reconcile hook asked through the API, the
answer journaled with the step; a resume then charges nothing twice. The agent is
tests/reconcile_agent.py, served as FILE.py; its provider's ledger counts the charges."""

from __future__ import annotations

import time
from pathlib import Path

from _paths import TESTS
from _serve import PATIENCE, start_server


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def ledger(world: Path) -> list[str]:
    path = world / "ledger"
    return path.read_text().splitlines() if path.exists() else []


def test_reconcile_through_the_api_then_resume(tmp_path: Path, store_url: str) -> None:
    world = tmp_path / "world"
    world.mkdir()
    (world / "hold-after").touch()
    agent = (TESTS / "reconcile_agent.py").read_text()
    with start_server(
        tmp_path, store_url, env={"RECONCILE_WORLD": str(world)}, agent=agent
    ) as served:
        answer = served.post("/api/runs", {"task": "order", "input": {"amount": 42}, "id": "o1"})
        assert answer.status == 201, answer.body
        until((world / "charged").exists, "the charge")
        held = served.post("/api/runs/o1/reconcile")  # the server works it: a live owner
        assert held.status == 409, held.body
        assert held.json()["error"]["code"] == "run_owned", held.body
        assert served.post("/api/runs/o1/cancel", {"force": True}).status == 202
        run = served.wait_for("o1", "cancelled", lambda run: run["state"] == "cancelled")
        assert run["steps"][0]["status"] == "unknown"
        assert run["retry"] == "resume", "its hook is not asked yet"
        (world / "hold-after").unlink()

        answer = served.post("/api/runs/o1/reconcile")
        assert answer.status == 200, answer.body
        body = answer.json()
        step = body["steps"][0]
        assert step["status"] == "committed"
        assert {k: step["reconciled"][k] for k in ("by", "answer")} == {
            "by": "hook",
            "answer": "happened",
        }
        shown = served.get("/api/runs/o1").json()
        assert shown["steps"][0]["reconciled"] == step["reconciled"]

        assert served.post("/api/runs/o1/resume", {}).status in (200, 202)
        done = served.wait_for("o1", "completed", lambda run: run["state"] == "completed")
    assert done["result"] == ["receipt-42", "confirmed receipt-42"]
    assert len(ledger(world)) == 1, "the charge happened once"


def test_reconcile_without_the_file_is_404(tmp_path: Path, sqlite_url: str) -> None:
    with start_server(tmp_path, sqlite_url, file=False) as served:
        answer = served.post("/api/runs/nope/reconcile")
    assert answer.status == 404
