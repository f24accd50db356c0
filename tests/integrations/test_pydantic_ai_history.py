"""Pydantic AI's own state after a cancel, continued in a new process (issue 27, items 2, 5, 6).

The app (``pydantic_app.py``) runs in its own processes: it saves the history the Pydantic AI
way (``ModelMessagesTypeAdapter``), the cancel comes from another process (``haltwise cancel``)
or from Pydantic AI's own ``CancellationToken``, and a new process continues the history. The
model acts on what the conversation shows (a charge without a successful return was not made),
with a fresh call id for every call, as providers give. Effects are lines of a ledger file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import haltwise
from _wait import wait_until
from haltwise.integrations.pydantic_ai import JournaledModel

pytestmark = pytest.mark.anyio

APP = Path(__file__).with_name("pydantic_app.py")
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
        [sys.executable, "-m", "haltwise", *args],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )


def check_clean(store: str) -> None:
    report = haltwise.verify_store(store)
    assert report.ok, report.findings


@pytest.mark.parametrize("how", ["capture", "token"])
def test_a_history_saved_after_a_cancel_never_repeats_a_committed_call_in_a_new_process(
    tmp_path: Path, how: str
) -> None:
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"
    first = app("first", store, tmp_path, how)
    wait_for(tmp_path / "entered")  # the charge (finish) is in flight
    if how == "capture":
        cancelled = haltwise_cli("cancel", "first", "--store", store)
        assert cancelled.returncode == 0, cancelled.stderr
    else:
        (tmp_path / "token").touch()  # Pydantic AI's own cancel, in the app's process
        # (the charge must not end before the token is cancelled: the agent would go on)
        wait_for(tmp_path / "token-cancelled")
    (tmp_path / "release").touch()  # the finish call is allowed to end: it commits
    outcome = outcome_of(first)
    assert outcome["state"] == "cancelled"
    assert outcome["reason"] == ("user" if how == "capture" else "host")
    assert [(s["tool"], s["status"]) for s in outcome["steps"]][-1] == ("charge", "committed")
    assert len(ledger(tmp_path, "charge")) == 1

    again = outcome_of(app("continue", store, tmp_path))
    assert again["state"] == "completed", again
    assert again["result"] == "bought tea (charged 5)"
    assert len(ledger(tmp_path, "charge")) == 1, "the committed charge is not made again"
    check_clean(store)


def test_a_model_retry_the_model_went_past_is_not_called_again_on_resume(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"
    (tmp_path / "fail").touch()
    failed = outcome_of(app("retry", store, tmp_path))
    assert failed["state"] == "failed"
    assert [(s["tool"], s["status"]) for s in failed["steps"]] == [
        ("model", "committed"),
        ("email", "failed"),  # ModelRetry: the model saw it and called again
        ("model", "committed"),
        ("email", "committed"),
        ("model", "committed"),
    ]
    (tmp_path / "fail").unlink()
    resumed = outcome_of(app("resume", store, tmp_path, "mail"))
    assert resumed["state"] == "completed", resumed
    assert len(ledger(tmp_path, "email")) == 1, "one e-mail, not two"
    check_clean(store)


async def test_a_replayed_request_that_differs_fails_the_run_naming_the_step(
    sqlite_url: str,
) -> None:
    """Item 6: a journaled answer is never handed to another request."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    prompts = ["buy tea"]

    @haltwise.task
    async def ask() -> str:
        result = await Agent(JournaledModel(TestModel(custom_output_text="ok"))).run(prompts[0])
        if prompts[0] == "buy tea":
            raise RuntimeError("stop here")
        return result.output

    async with haltwise.Runtime(sqlite_url) as runtime:
        failed = await (await runtime.start(ask, task_id="d1")).outcome()
        assert failed.error is not None and failed.error.type == "RuntimeError"
        resumed = await (await runtime.resume("d1")).outcome()  # the same request: replayed
        assert resumed.error is not None and resumed.error.type == "RuntimeError"
        prompts[0] = "buy coffee"
        diverged = await (await runtime.resume("d1")).outcome()
    assert diverged.state is haltwise.State.FAILED
    assert diverged.error is not None
    assert diverged.error.type == "NonDeterminismError"
    assert "step 0 (model)" in diverged.error.message


async def test_pydantic_ais_timeout_ends_the_run_cancelled_with_reason_timeout(
    sqlite_url: str,
) -> None:
    """Item 7: a framework's ``timeout=`` is a host timeout: ``cancelled`` / ``timeout``."""
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def never(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    @haltwise.task
    async def slow() -> str:
        result = await Agent(JournaledModel(FunctionModel(never))).run("hi", timeout=0.05)
        return result.output

    async with haltwise.Runtime(sqlite_url) as runtime:
        outcome = await (await runtime.start(slow, task_id="slow")).outcome()
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert outcome.reason == "timeout"
    assert all(step.status.value == "interrupted" for step in outcome.steps)


async def test_tools_without_the_journaled_model_replay_by_arguments_on_resume(
    sqlite_url: str,
) -> None:
    """Item 4: the model is not journaled and gives every call a fresh id, as providers do; on
    resume each committed call is matched by its tool and arguments, not run again."""
    import uuid

    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from haltwise.integrations.pydantic_ai import tool

    charges: list[str] = []

    @haltwise.tool(cancel="finish", effect="external")
    async def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(haltwise.idempotency_key())
        return f"charged {amount}"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [
            part
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if len(done) < 2:
            amount = 5 if not done else 7
            call = ToolCallPart("charge", {"amount": amount}, tool_call_id=uuid.uuid4().hex)
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("done")])

    broken = [True]

    @haltwise.task
    async def pay() -> str:
        result = await Agent(FunctionModel(model), tools=[tool(charge)]).run("pay")
        if broken[0]:
            raise RuntimeError("the app broke after the agent")
        return result.output

    async with haltwise.Runtime(sqlite_url) as runtime:
        failed = await (await runtime.start(pay, task_id="fresh")).outcome()
        assert failed.state is haltwise.State.FAILED
        broken[0] = False
        resumed = await (await runtime.resume("fresh")).outcome()
    assert resumed.state is haltwise.State.COMPLETED, resumed
    assert len(charges) == 2, "each charge made once, with one idempotency key"
    assert len(set(charges)) == 2
