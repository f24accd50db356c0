"""A LangGraph app as a user writes it (``create_agent`` with ``HaltwiseMiddleware``, the thread
checkpointed by ``AsyncSqliteSaver`` on a file), run in its own process by
test_langgraph_thread.py.

``python langgraph_app.py PHASE STORE DIR RUN_ID``, one haltwise run of id RUN_ID on STORE:

- ``book``: "book a room" on thread ``t1``. The scripted model looks the room up (``lookup``,
  interruptible), then charges (``charge``, finish), then answers; it derives each answer from the
  conversation, as a model would, and gives every call a fresh id (as providers do): it charges
  only while the conversation holds no charge result. ``lookup`` and ``charge`` announce
  themselves (``DIR/entered-NAME``) and wait for ``DIR/release-NAME``.
- ``go_on``: the same thread continued (``ainvoke(None)``).
- ``again``: the same thread, the input sent again (a new "book a room").
- ``host``: as ``book``, but the body runs ``ainvoke`` in a task of its own and cancels that task
  (``Task.cancel()``) once ``charge`` is in flight, then releases ``charge`` and goes on after the
  ``CancelledError``: LangGraph's loop is cut, not drained.
- ``sibling``: a model that asks for ``lookup`` and ``explode`` at once; ``explode`` raises, so
  LangGraph cancels the ``lookup`` node (held, never released) and ``ainvoke`` raises the error.
- ``declined`` / ``resume``: no checkpointer; the model charges, the card is declined (``Declined``,
  an error whose type cannot be rebuilt from its text), ``ToolRetryMiddleware`` hands the error to
  the model, which looks the room up (held) and charges again; ``resume`` resumes RUN_ID.
- ``plain``: "book a room" with the tools only (no ``HaltwiseMiddleware``: the model is not
  journaled and gives fresh call ids when asked again), no checkpointer.
- ``timeout``: as ``book``, under an ``asyncio.timeout`` in the body that fires once ``charge``
  is in flight.
- ``approve``: "book a room" on thread ``t1`` with ``HumanInTheLoopMiddleware`` (``per_call``,
  inside ``HaltwiseMiddleware``) asking approval of ``charge``, here a plain LangChain tool; the
  run gets the interrupt, then approves it (``Command(resume=...)``), both in the same run.

Every effect and every model request is a line of ``DIR/ledger.txt``. The outcome is printed as
JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, ToolRetryMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

import haltwise
from haltwise.integrations.langchain import HaltwiseMiddleware, tool

DIR = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(".")
THREAD = {"configurable": {"thread_id": "t1"}}


def ledger(line: str) -> None:
    with open(DIR / "ledger.txt", "a") as out:
        out.write(line + "\n")


async def held(name: str) -> None:
    (DIR / f"entered-{name}").touch()
    with anyio.fail_after(60):
        while not (DIR / f"release-{name}").exists():
            await anyio.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup(item: str) -> str:
    """Look an item up."""
    await held("lookup")
    ledger("lookup")
    return f"{item} costs 5"


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def charge(amount: int) -> str:
    """Charge the card."""
    await held("charge")
    ledger("charge")
    return f"charged {amount}"


class Scripted(GenericFakeChatModel):
    """Answers from the conversation: look up, then charge, then say it is booked."""

    messages: Any = iter(())

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        ledger("model " + " ".join(type(m).__name__ for m in messages))
        results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        asked = sum(isinstance(m, AIMessage) for m in messages)
        call_id = f"call-{os.getpid()}-{asked}"
        if any(text.startswith("charged") for text in results):
            answer = AIMessage(content="booked")
        elif any(text.endswith("costs 5") for text in results):
            answer = AIMessage(
                content="", tool_calls=[{"name": "charge", "args": {"amount": 5}, "id": call_id}]
            )
        else:
            answer = AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"item": "room"}, "id": call_id}]
            )
        return ChatResult(generations=[ChatGeneration(message=answer)])


class Declined(Exception):
    """The card was declined (not rebuilt from its text alone: its constructor takes an amount)."""

    def __init__(self, amount: int) -> None:
        super().__init__(f"card declined for {amount}")


@haltwise.tool(cancel="finish", effect="external")
async def pay(amount: int) -> str:
    """Charge the card, declined the first time."""
    ledger(f"pay {amount}")
    if not (DIR / "declined-once").exists():
        (DIR / "declined-once").touch()
        raise Declined(amount)
    return f"charged {amount}"


@haltwise.tool(cancel="finish", effect="external")
async def explode() -> str:
    """Always fails."""
    ledger("explode")
    raise ValueError("the sibling failed")


class Twice(GenericFakeChatModel):
    """Asks for ``lookup`` and ``explode`` at once."""

    messages: Any = iter(())

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        calls = [
            {"name": "lookup", "args": {"item": "room"}, "id": "call-lookup"},
            {"name": "explode", "args": {}, "id": "call-explode"},
        ]
        return ChatResult(generations=[ChatGeneration(message=AIMessage("", tool_calls=calls))])


class Payer(GenericFakeChatModel):
    """Pays; after a declined payment looks the room up, then pays again; then answers."""

    messages: Any = iter(())

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        ledger("model " + " | ".join(results))
        asked = sum(isinstance(m, AIMessage) for m in messages)
        pay = {"name": "pay", "args": {"amount": 5}, "id": f"call-{asked}"}
        if not results:
            answer = AIMessage(content="", tool_calls=[pay])
        elif len(results) == 1:
            look = {"name": "lookup", "args": {"item": "room"}, "id": f"call-{asked}"}
            answer = AIMessage(content="", tool_calls=[look])
        elif len(results) == 2:
            answer = AIMessage(content="", tool_calls=[pay])
        else:
            answer = AIMessage(content="paid")
        return ChatResult(generations=[ChatGeneration(message=answer)])


async def converse(payload: Any) -> str:
    async with AsyncSqliteSaver.from_conn_string(str(DIR / "graph.db")) as saver:
        agent = create_agent(
            Scripted(),
            tools=[tool(lookup), tool(charge)],
            middleware=[HaltwiseMiddleware()],
            checkpointer=saver,
        )
        state = await agent.ainvoke(payload, THREAD)
    return str(state["messages"][-1].content)


async def plain_charge(amount: int) -> str:
    """Charge the card."""
    ledger("charge")
    return f"charged {amount}"


@haltwise.task
async def approve() -> str:
    """The approval interrupt, then the approval, in one run."""
    async with AsyncSqliteSaver.from_conn_string(str(DIR / "graph.db")) as saver:
        gate = HumanInTheLoopMiddleware(interrupt_on={"charge": True}, interrupt_mode="per_call")
        agent = create_agent(
            Scripted(),
            tools=[
                tool(lookup),
                StructuredTool.from_function(coroutine=plain_charge, name="charge"),
            ],
            middleware=[HaltwiseMiddleware(), gate],
            checkpointer=saver,
        )
        state = await agent.ainvoke({"messages": [HumanMessage("book a room")]}, THREAD)
        assert "__interrupt__" in state, state
        ledger("asked for approval")
        state = await agent.ainvoke(Command(resume={"type": "approve"}), THREAD)
    return str(state["messages"][-1].content)


@haltwise.task
async def host() -> str:
    """The graph run in a task of the body's own, cancelled by the body (``Task.cancel()``)."""
    graph_run = asyncio.create_task(converse({"messages": [HumanMessage("book a room")]}))
    while not (DIR / "entered-charge").exists():
        await asyncio.sleep(0.005)
    graph_run.cancel()
    (DIR / "release-charge").touch()
    try:
        await graph_run
    except asyncio.CancelledError:
        ledger("the graph run was cancelled")
    return "went on"


@haltwise.task
async def timeout() -> str:
    """The graph run in the body's own task under ``asyncio.timeout``, which fires (rescheduled
    to now) once ``charge`` is in flight; ``charge`` is then released."""

    async def expire(limit: asyncio.Timeout) -> None:
        while not (DIR / "entered-charge").exists():
            await asyncio.sleep(0.005)
        limit.reschedule(asyncio.get_running_loop().time())
        (DIR / "release-charge").touch()

    async with asyncio.timeout(None) as limit:
        watch = asyncio.create_task(expire(limit))
        answer = await converse({"messages": [HumanMessage("book a room")]})
    await watch
    return answer


@haltwise.task
async def sibling() -> str:
    async with AsyncSqliteSaver.from_conn_string(str(DIR / "graph.db")) as saver:
        agent = create_agent(
            Twice(),
            tools=[tool(lookup), tool(explode)],
            middleware=[HaltwiseMiddleware()],
            checkpointer=saver,
        )
        state = await agent.ainvoke({"messages": [HumanMessage("look")]}, THREAD)
    return str(state["messages"][-1].content)


@haltwise.task
async def declined() -> str:
    agent = create_agent(
        Payer(),
        tools=[tool(lookup), tool(pay)],
        middleware=[HaltwiseMiddleware(), ToolRetryMiddleware(max_retries=0)],
    )
    state = await agent.ainvoke({"messages": [HumanMessage("pay for the room")]})
    return str(state["messages"][-1].content)


@haltwise.task
async def plain() -> str:
    """The tools only (no middleware: the model is not journaled), no checkpointer."""
    agent = create_agent(Scripted(), tools=[tool(lookup), tool(charge)])
    state = await agent.ainvoke({"messages": [HumanMessage("book a room")]})
    return str(state["messages"][-1].content)


@haltwise.task
async def book() -> str:
    return await converse({"messages": [HumanMessage("book a room")]})


@haltwise.task
async def go_on() -> str:
    return await converse(None)


@haltwise.task
async def again() -> str:
    return await converse({"messages": [HumanMessage("book a room")]})


async def main(phase: str, store: str, run_id: str) -> None:
    tasks = {
        "book": book,
        "go_on": go_on,
        "again": again,
        "approve": approve,
        "host": host,
        "sibling": sibling,
        "timeout": timeout,
        "plain": plain,
        "declined": declined,
    }
    async with haltwise.Runtime(store) as runtime:
        if phase == "resume":
            handle = await runtime.resume(run_id)
        else:
            handle = await runtime.start(tasks[phase], task_id=run_id)
        outcome = await handle.outcome()
    print(json.dumps(outcome.to_json()))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[4])
