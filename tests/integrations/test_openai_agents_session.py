"""The OpenAI Agents SDK's own state after a cancel, continued in a new process (issue 27,
items 1 and 5, ``run_streamed``).

The app (``openai_app.py``) runs in its own processes with a ``SQLiteSession`` on a file; the
cancel comes from another process (``haltwise cancel``) or from the SDK's own streamed
``cancel()``; a new process continues the session (and the saved ``to_input_list()``). The model
(the SDK's ``ScriptedModel``, each answer derived from the request) acts on what the
conversation shows, with a fresh call id for every call. Effects are lines of a ledger file.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import haltwise
from _wait import wait_until

APP = Path(__file__).with_name("openai_app.py")
PATIENCE = 60.0


def app(phase: str, store: str, where: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), phase, store, str(where), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def wait_for(path: Path) -> None:
    wait_until(path.exists, f"{path} appearing", timeout=PATIENCE)


def ledger(where: Path, effect: str) -> list[str]:
    path = where / "ledger.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith(effect + " ")]


def haltwise_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args], capture_output=True, text=True, timeout=PATIENCE
    )


def session_items(where: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(where / "session.db") as db:
        rows = db.execute("SELECT message_data FROM agent_messages ORDER BY id").fetchall()
    return [json.loads(data) for (data,) in rows]


def closed_calls(items: list[dict[str, Any]]) -> dict[str, str | None]:
    """Each function call of ``items`` (by tool name, the last one of each) and its output."""
    outputs = {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}
    return {i["name"]: outputs.get(i["call_id"]) for i in items if i.get("type") == "function_call"}


@pytest.mark.parametrize(
    ("how", "stop"), [("run", "haltwise"), ("streamed", "sdk"), ("streamed", "haltwise")]
)
def test_the_session_holds_every_call_with_its_result_after_a_cancel(
    tmp_path: Path, how: str, stop: str
) -> None:
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"
    first = app("first", store, tmp_path, how)
    wait_for(tmp_path / "entered")  # the charge (finish) is in flight
    if stop == "haltwise":
        cancelled = haltwise_cli("cancel", "first", "--store", store)
        assert cancelled.returncode == 0, cancelled.stderr
    else:
        (tmp_path / "stop").touch()  # the app calls the SDK's own cancel()
    (tmp_path / "release").touch()  # the finish call is allowed to end: it commits
    outcome = outcome_of(first)
    assert outcome["state"] == "cancelled"
    assert outcome["reason"] == ("user" if stop == "haltwise" else "host")
    assert [(s["tool"], s["status"]) for s in outcome["steps"]][-1] == ("charge", "committed")

    # Where the SDK keeps the conversation, with no call by the app: every call has its result.
    assert closed_calls(session_items(tmp_path)) == {"lookup": "tea costs 5", "charge": "charged 5"}
    if how == "streamed":
        items = json.loads((tmp_path / "items.json").read_text())
        assert closed_calls(items) == {"lookup": "tea costs 5", "charge": "charged 5"}

    again = outcome_of(app("continue", store, tmp_path))
    assert again["state"] == "completed", again
    assert again["result"] == "bought tea (charged 5)"
    if stop == "sdk":  # the saved to_input_list(), continued without the session
        third = outcome_of(app("continue-items", store, tmp_path))
        assert third["result"] == "bought tea (charged 5)"
    assert len(ledger(tmp_path, "charge")) == 1, "the committed charge is not made again"
    report = haltwise.verify_store(store)
    assert report.ok, report.findings


def test_a_failed_call_the_model_went_past_is_not_called_again_on_resume(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"
    (tmp_path / "fail").touch()
    failed = outcome_of(app("retry", store, tmp_path))
    assert failed["state"] == "failed"
    assert [(s["tool"], s["status"]) for s in failed["steps"]] == [
        ("model", "committed"),
        ("email", "failed"),  # the model saw the error and called again
        ("model", "committed"),
        ("email", "committed"),
        ("model", "committed"),
    ]
    (tmp_path / "fail").unlink()
    resumed = outcome_of(app("resume", store, tmp_path, "mail"))
    assert resumed["state"] == "completed", resumed
    assert len(ledger(tmp_path, "email")) == 1, "one e-mail, not two"
    report = haltwise.verify_store(store)
    assert report.ok, report.findings


@pytest.mark.anyio
async def test_a_wait_for_timeout_around_runner_run_cancels_the_run(sqlite_url: str) -> None:
    """Item 7: a host's timeout around ``Runner.run`` ends the run ``cancelled`` / ``timeout``
    (it was ``failed`` with ``TimeoutError``); a model request in flight is interrupted."""
    import asyncio

    from agents import Agent, RunConfig, Runner
    from agents.testing import ModelCall, ModelStep, ScriptedModel

    from haltwise.integrations.openai_agents import JournaledModel

    async def never(call: ModelCall) -> list[Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    @haltwise.task
    async def bounded() -> Any:
        agent = Agent(name="slow", model=JournaledModel(ScriptedModel([ModelStep.respond(never)])))
        run = Runner.run(agent, "hi", run_config=RunConfig(tracing_disabled=True))
        return (await asyncio.wait_for(run, timeout=0.05)).final_output

    async with haltwise.Runtime(sqlite_url) as runtime:
        outcome = await (await runtime.start(bounded, task_id="bounded")).outcome()
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert outcome.reason == "timeout"
    assert all(step.status.value == "interrupted" for step in outcome.steps)
