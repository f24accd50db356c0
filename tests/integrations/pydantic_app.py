"""A Pydantic AI app as a user writes it, run in its own process by test_pydantic_ai_history.py.

``python pydantic_app.py PHASE STORE DIR [HOW]``:

- ``first``: the agent (a ``FunctionModel`` that decides from the messages, as a model would,
  with a fresh call id for every call) looks tea up, then charges; the charge tool announces
  itself (``DIR/entered``) and waits for ``DIR/release``. A cancel comes from elsewhere: another
  process's ``haltwise cancel`` (HOW ``capture``: the app saves the ``capture_run_messages``
  list) or Pydantic AI's own ``CancellationToken``, cancelled when ``DIR/token`` appears (HOW
  ``token``: the app saves ``RunCancelled.all_messages()``). The history is saved with
  ``ModelMessagesTypeAdapter`` to ``DIR/history.json``.
- ``continue``: a new run continues the saved history ("go on").
- ``retry``: the agent e-mails; the mail server refuses the first call (``ModelRetry``), the model
  tries again and it goes through; then the run fails (``DIR/fail`` exists) or completes.

Every effect is a line of ``DIR/ledger.txt``. The outcome is printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

from pydantic_ai import Agent, CancellationToken, ModelRetry, capture_run_messages
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import haltwise
from haltwise.integrations.pydantic_ai import JournaledModel, tool

DIR = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(".")


def record(line: str) -> None:
    with (DIR / "ledger.txt").open("a") as ledger:
        ledger.write(line + "\n")


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup(item: str) -> str:
    """Look an item up."""
    return f"{item} costs 5"


@haltwise.tool(cancel="finish", effect="external", grace=20)
def charge(amount: int) -> str:
    """Charge the card."""
    (DIR / "entered").touch()
    wait_for(DIR / "release")
    record(f"charge {amount} {haltwise.idempotency_key()}")
    return f"charged {amount}"


@haltwise.tool(cancel="finish", effect="external")
def email(to: str) -> str:
    """Send the receipt."""
    busy = DIR / "busy"
    if not busy.exists():
        busy.touch()  # the server is busy once, then takes the mail
        raise ModelRetry("the mail server is busy: try again")
    record(f"email {to} {haltwise.idempotency_key()}")
    return f"mailed {to}"


def _returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    return {
        part.tool_name: part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def _call(name: str, **args: object) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call_{uuid.uuid4().hex}")])


def shopper(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that acts on what the conversation shows: a charge whose return is not a success
    was not made, so it charges."""
    returns = _returns(messages)
    if "lookup" not in returns:
        return _call("lookup", item="tea")
    charged = returns.get("charge")
    if charged is None or charged.outcome != "success":
        return _call("charge", amount=5)
    return ModelResponse(parts=[TextPart(f"bought tea ({charged.content})")])


def mailer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    mailed = _returns(messages).get("email")
    if mailed is None or mailed.outcome != "success":
        return _call("email", to="ann")  # also after a retry prompt: the same call, a new id
    return ModelResponse(parts=[TextPart("mailed")])


def agent(model: FunctionModel) -> Agent[None, str]:
    return Agent(JournaledModel(model), tools=[tool(lookup), tool(charge), tool(email)])


def save(messages: list[ModelMessage]) -> None:
    (DIR / "history.json").write_bytes(ModelMessagesTypeAdapter.dump_json(messages))


async def cancel_on_token(token: CancellationToken) -> None:
    while not (DIR / "token").exists():
        await asyncio.sleep(0.005)
    token.cancel()
    (DIR / "token-cancelled").touch()  # the test lets the charge end only after this


@haltwise.task
async def shop(how: str) -> str:
    token = CancellationToken()
    watcher = asyncio.create_task(cancel_on_token(token)) if how == "token" else None
    try:
        with capture_run_messages() as captured:
            try:
                result = await agent(FunctionModel(shopper)).run(
                    "buy tea", cancellation_token=token
                )
            except RunCancelled as cancelled:
                if how == "token":
                    save(cancelled.all_messages())
                raise
            finally:
                if how == "capture":
                    save(captured)
        save(result.all_messages())
        return result.output
    finally:
        if watcher is not None:
            watcher.cancel()


@haltwise.task
async def carry_on() -> str:
    history = ModelMessagesTypeAdapter.validate_json((DIR / "history.json").read_bytes())
    result = await agent(FunctionModel(shopper)).run("go on", message_history=history)
    return result.output


@haltwise.task
async def mail() -> str:
    result = await agent(FunctionModel(mailer)).run("send the receipt")
    if (DIR / "fail").exists():
        raise RuntimeError("the app broke after the agent")
    return result.output


async def main() -> None:
    phase, store = sys.argv[1], sys.argv[2]
    async with haltwise.Runtime(store) as runtime:
        if phase == "first":
            handle = await runtime.start(shop, sys.argv[4], task_id="first")
        elif phase == "continue":
            handle = await runtime.start(carry_on, task_id="second")
        elif phase == "retry":
            handle = await runtime.start(mail, task_id="mail")
        else:
            handle = await runtime.resume(sys.argv[4])
        outcome = await handle.outcome()
    print(json.dumps(outcome.to_json()))


if __name__ == "__main__":
    asyncio.run(main())
