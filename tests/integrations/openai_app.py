"""An OpenAI Agents SDK app as a user writes it, run in its own process by
test_openai_agents_session.py.

``python openai_app.py PHASE STORE DIR [HOW]``:

- ``first``: the agent (the SDK's own ``ScriptedModel``, each answer derived from the request as a
  model would, with a fresh call id for every call) looks tea up, then charges, on a
  ``SQLiteSession`` kept in ``DIR/session.db``; the charge tool announces itself
  (``DIR/entered``) and waits for ``DIR/release``. HOW ``run``: ``Runner.run`` in a task of its
  own, cancelled by another process's ``haltwise cancel``, or by the app's ``Task.cancel()`` of
  that task (a cancel haltwise did not request) when ``DIR/stop`` appears; HOW ``streamed``: the
  adapter's ``run_streamed``, whose ``cancel()`` the app calls when ``DIR/stop`` appears;
  ``to_input_list()`` is saved to ``DIR/items.json`` once the stream has ended.
- ``continue``: a new run on the same session ("go on").
- ``retry``: the agent e-mails; the mail server fails the first call (the model sees the error
  and tries again, and it goes through); then the app fails (``DIR/fail`` exists) or completes.
- ``resume ID``: resume that run.

Every effect is a line of ``DIR/ledger.txt``. The outcome is printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, SQLiteSession
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

import haltwise
from haltwise.integrations.openai_agents import JournaledModel, function_tool, run_streamed

DIR = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(".")
CONFIG = RunConfig(tracing_disabled=True)


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
        raise ConnectionError("the mail server is busy")
    record(f"email {to} {haltwise.idempotency_key()}")
    return f"mailed {to}"


def outputs(call: ModelCall) -> dict[str, list[str]]:
    """Each tool's outputs in the request, by tool name."""
    items = call.input if isinstance(call.input, list) else []
    names = {
        item.get("call_id"): item.get("name")
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call"
    }
    found: dict[str, list[str]] = {}
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            name = names.get(item.get("call_id"), "?")
            found.setdefault(str(name), []).append(str(item.get("output")))
    return found


def _call(name: str, **args: Any) -> list[Any]:
    return [function_call(name, args, call_id=f"call_{uuid.uuid4().hex}")]


def shopper(call: ModelCall) -> list[Any]:
    """A model that acts on what the conversation shows: a charge with no "charged" output
    was not made, so it charges."""
    seen = outputs(call)
    if "lookup" not in seen:
        return _call("lookup", item="tea")
    charged = [text for text in seen.get("charge", []) if text.startswith("charged")]
    if not charged:
        return _call("charge", amount=5)
    return [assistant_message(f"bought tea ({charged[-1]})")]


def mailer(call: ModelCall) -> list[Any]:
    if not any(text.startswith("mailed") for text in outputs(call).get("email", [])):
        return _call("email", to="ann")  # also after an error: the same call, a new id
    return [assistant_message("mailed")]


def agent(responder: Any) -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(responder) for _ in range(20)])
    return Agent(
        name="shopper",
        instructions="Buy what the user asks for.",
        model=JournaledModel(model),
        tools=[function_tool(lookup), function_tool(charge), function_tool(email)],
    )


def session() -> SQLiteSession:
    return SQLiteSession("shop", str(DIR / "session.db"))


async def stop_on_file(result: Any) -> None:
    while not (DIR / "stop").exists():
        await asyncio.sleep(0.005)
    result.cancel()


@haltwise.task
async def shop(how: str) -> Any:
    if how == "run":  # the host's own cancel: Task.cancel() of the task running Runner.run
        run = asyncio.ensure_future(
            Runner.run(agent(shopper), "buy tea", session=session(), run_config=CONFIG)
        )
        stopper = asyncio.create_task(stop_on_file(run))
        try:
            return (await run).final_output
        finally:
            stopper.cancel()
    streamed = run_streamed(agent(shopper), "buy tea", session=session(), run_config=CONFIG)
    stopper = asyncio.create_task(stop_on_file(streamed))
    try:
        async for _ in streamed.stream_events():
            pass
    finally:
        stopper.cancel()
        (DIR / "items.json").write_text(json.dumps(streamed.to_input_list(), default=str))
    return streamed.final_output


@haltwise.task
async def carry_on() -> Any:
    result = await Runner.run(agent(shopper), "go on", session=session(), run_config=CONFIG)
    return result.final_output


@haltwise.task
async def carry_on_items() -> Any:
    items = json.loads((DIR / "items.json").read_text())
    history = [*items, {"role": "user", "content": "go on"}]
    result = await Runner.run(agent(shopper), history, run_config=CONFIG)
    return result.final_output


@haltwise.task
async def mail() -> Any:
    result = await Runner.run(agent(mailer), "send the receipt", run_config=CONFIG)
    if (DIR / "fail").exists():
        raise RuntimeError("the app broke after the agent")
    return result.final_output


async def main() -> None:
    phase, store = sys.argv[1], sys.argv[2]
    async with haltwise.Runtime(store) as runtime:
        if phase == "first":
            handle = await runtime.start(shop, sys.argv[4], task_id="first")
        elif phase == "continue":
            handle = await runtime.start(carry_on, task_id="second")
        elif phase == "continue-items":
            handle = await runtime.start(carry_on_items, task_id="third")
        elif phase == "retry":
            handle = await runtime.start(mail, task_id="mail")
        else:
            handle = await runtime.resume(sys.argv[4])
        outcome = await handle.outcome()
    print(json.dumps(outcome.to_json()))


if __name__ == "__main__":
    asyncio.run(main())
