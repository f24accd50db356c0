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


def cancel_during_the_charge(store: str, where: Path, how: str, stop: str) -> None:
    """The app's run ``first``, cancelled while its charge (finish) is in flight: by ``haltwise
    cancel`` from another process, or by the app itself (the SDK's streamed ``cancel()``, or
    ``Task.cancel()`` of the task running ``Runner.run``); the charge then ends and commits."""
    first = app("first", store, where, how)
    wait_for(where / "entered")  # the charge (finish) is in flight
    if stop == "haltwise":
        cancelled = haltwise_cli("cancel", "first", "--store", store)
        assert cancelled.returncode == 0, cancelled.stderr
    else:
        (where / "stop").touch()  # the app: the SDK's own cancel(), or Task.cancel() of Runner.run
    (where / "release").touch()  # the finish call is allowed to end: it commits
    outcome = outcome_of(first)
    assert outcome["state"] == "cancelled"
    assert outcome["reason"] == ("user" if stop == "haltwise" else "host")
    assert [(s["tool"], s["status"]) for s in outcome["steps"]][-1] == ("charge", "committed")


def resume_on_the_session(store: str, where: Path) -> None:
    """``haltwise resume first``: it completes, and the session holds the run once."""
    (where / "stop").unlink(missing_ok=True)
    resumed = outcome_of(app("resume", store, where, "first"))
    assert resumed["state"] == "completed", resumed
    assert resumed["result"] == "bought tea (charged 5)"
    assert len(ledger(where, "charge")) == 1, "the committed charge is not made again"
    items = session_items(where)
    assert [i["content"] for i in items if i.get("role") == "user"] == ["buy tea"]
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    answered = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert len(calls) == 2, items
    assert calls == answered, "each call once, with one result"
    assert closed_calls(items) == {"lookup": "tea costs 5", "charge": "charged 5"}
    assert items[-1].get("role") == "assistant", "the run's answer ends the session"


@pytest.mark.parametrize(
    ("how", "stop"),
    [("run", "haltwise"), ("run", "sdk"), ("streamed", "sdk"), ("streamed", "haltwise")],
)
def test_the_session_holds_every_call_with_its_result_after_a_cancel(
    tmp_path: Path, how: str, stop: str
) -> None:
    """After the cancel, the session (and a streamed run's saved ``to_input_list()``) holds every
    call with its result. A ``Runner.run`` is then resumed (``haltwise resume``): it reads the
    session as it began (the journaled answers replay: no NonDeterminismError), charges nothing
    again, and leaves the session holding the run once. A new run on the session (and on the
    saved list) sees the charge made."""
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"
    cancel_during_the_charge(store, tmp_path, how, stop)

    # Where the SDK keeps the conversation, with no call by the app: every call has its result.
    assert closed_calls(session_items(tmp_path)) == {"lookup": "tea costs 5", "charge": "charged 5"}
    if how == "streamed":
        items = json.loads((tmp_path / "items.json").read_text())
        assert closed_calls(items) == {"lookup": "tea costs 5", "charge": "charged 5"}
    else:
        resume_on_the_session(store, tmp_path)

    again = outcome_of(app("continue", store, tmp_path))
    assert again["state"] == "completed", again
    assert again["result"] == "bought tea (charged 5)"
    if how == "streamed" and stop == "sdk":  # the saved to_input_list(), without the session
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


@haltwise.tool(cancel="interruptible", effect="read")
async def look(item: str) -> str:
    """Look an item up."""
    return f"{item} costs 5"


@pytest.mark.anyio
async def test_a_run_that_ends_on_a_tool_turn_lets_a_cancel_land_at_the_next_await(
    sqlite_url: str,
) -> None:
    """``tool_use_behavior="stop_on_first_tool"`` ends the SDK's run after a tool turn, with no
    model request to end the turn's hold: a cancel made after ``Runner.run`` returned still lands
    at the task's next bare await (it lingered to the end of the task body)."""
    import asyncio

    from agents import Agent, RunConfig, Runner
    from agents.testing import ModelCall, ModelStep, ScriptedModel, function_call

    from haltwise.integrations.openai_agents import JournaledModel, function_tool

    def calls_look(call: ModelCall) -> list[Any]:
        return [function_call("look", {"item": "tea"}, call_id="call_1")]

    ran = asyncio.Event()

    @haltwise.task
    async def first_tool_only() -> Any:
        agent = Agent(
            name="looker",
            model=JournaledModel(ScriptedModel([ModelStep.respond(calls_look)])),
            tools=[function_tool(look)],
            tool_use_behavior="stop_on_first_tool",
        )
        result = await Runner.run(agent, "hi", run_config=RunConfig(tracing_disabled=True))
        ran.set()
        await asyncio.sleep(PATIENCE)  # a bare await of the task's own code: the cancel lands
        return result.final_output

    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(first_tool_only, task_id="first-tool")
        await ran.wait()
        await handle.cancel()
        outcome = await handle.outcome()
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert [(s.tool, s.status.value) for s in outcome.steps] == [
        ("model", "committed"),
        ("look", "committed"),
    ]
