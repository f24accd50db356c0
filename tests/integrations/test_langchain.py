"""haltwise inside LangChain's ``create_agent`` (LangGraph), with LangChain's own fake chat model.

``ScriptedChat`` is ``GenericFakeChatModel`` (answers the n-th request with the n-th message),
counting requests and able to hold one; a resume gets a script holding only the answers the
journal does not have.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult

import fw_kit
import haltwise
from fw_kit import GATED, Kit
from haltwise.integrations.langchain import HaltwiseMiddleware, close_dangling, tool

pytestmark = pytest.mark.anyio


class Script:
    requests: list[list[BaseMessage]] = []
    hold: fw_kit.Gate | None = None
    answering = fw_kit.Gate()
    answers: Iterator[AIMessage] = iter(())
    #: how many requests streamed; the model's text chunks the streamed task saw, and a gate
    #: set at the first
    streamed = 0
    seen: list[str] = []
    delta_seen = fw_kit.Gate()


class ScriptedChat(GenericFakeChatModel):
    """LangChain's fake chat model, counting requests; ``bind_tools`` keeps it as it is."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        Script.requests.append(list(messages))
        if Script.hold is not None:
            Script.answering.set()
            await Script.hold.wait(timeout=fw_kit.PATIENCE)
        return self._generate(messages, stop=stop, **kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The next message streamed: its text word by word (held after the first word while
        ``Script.hold`` is closed), then its tool calls as one chunk."""
        Script.requests.append(list(messages))
        Script.streamed += 1
        message = self._generate(messages).generations[0].message
        assert isinstance(message, AIMessage)
        for index, word in enumerate(re.split(r"(\s)", str(message.content or ""))):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word))
            if index == 0 and Script.hold is not None:
                await Script.hold.wait(timeout=fw_kit.PATIENCE)
        if message.tool_calls:
            chunks = [
                tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
                for i, c in enumerate(message.tool_calls)
            ]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=chunks))


def load(answers: list[AIMessage]) -> None:
    Script.answers, Script.requests = iter(answers), []


@pytest.fixture(autouse=True)
def fresh() -> None:
    fw_kit.reset()
    Script.hold, Script.answering = None, fw_kit.Gate()
    Script.streamed, Script.seen, Script.delta_seen = 0, [], fw_kit.Gate()


def make_agent() -> Any:
    return create_agent(
        ScriptedChat(messages=Script.answers),
        tools=[tool(t) for t in fw_kit.ALL_TOOLS],
        middleware=[HaltwiseMiddleware()],
    )


@haltwise.task
async def shop(prompt: str) -> str:
    state = await make_agent().ainvoke({"messages": [HumanMessage(prompt)]})
    return str(state["messages"][-1].content)


@haltwise.task
async def shop_streamed(prompt: str) -> str:
    """The same agent through ``astream``, the model's tokens streamed (``messages`` mode)."""
    state: dict[str, Any] = {}
    stream = make_agent().astream(
        {"messages": [HumanMessage(prompt)]}, stream_mode=["messages", "values"]
    )
    async for mode, data in stream:
        if mode == "values":
            state = data
        elif isinstance(data[0], AIMessageChunk) and data[0].content:
            Script.seen.append(str(data[0].content))
            Script.delta_seen.set()
    return str(state["messages"][-1].content)


#: the agent's entry points: ainvoke, and astream with the model's tokens streamed
ENTRY = {"ainvoke": shop, "astream": shop_streamed}


@haltwise.task
async def shop_cancelled_by_langgraph(prompt: str) -> str:
    """Runs the graph in a task of its own and cancels that task once charge is in flight."""
    run = asyncio.ensure_future(make_agent().ainvoke({"messages": [HumanMessage(prompt)]}))
    await Kit.entered["charge"].wait(timeout=fw_kit.PATIENCE)
    run.cancel()  # LangGraph's own cancel: the graph's task is cancelled
    state = await run
    return str(state["messages"][-1].content)


def calls(*parts: tuple[str, dict[str, Any], str]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": c} for n, a, c in parts])


def turns(policy: str) -> list[AIMessage]:
    gated, args = GATED[policy]
    return [
        calls(("lookup", {"item": "tea"}, "c1")),
        calls((gated.name, args, "c2")),
        AIMessage(content="bought tea"),
    ]


@pytest.mark.parametrize("entry", sorted(ENTRY))
async def test_a_normal_run_is_one_step_per_model_call_and_tool_call(
    sqlite_url: str, entry: str
) -> None:
    load(turns("finish"))
    await fw_kit.normal_run(sqlite_url, ENTRY[entry])
    assert len(Script.requests) == 3
    assert Script.streamed == (3 if entry == "astream" else 0)
    if entry == "astream":
        assert Script.seen == ["bought", " ", "tea"]  # the tokens reached the task as they came
    last = Script.requests[-1]
    assert [m.content for m in last if isinstance(m, ToolMessage)] == ["tea costs 5", "charged 5"]


def test_tool_is_a_structured_tool_with_the_tools_schema() -> None:
    made = tool(fw_kit.charge)
    assert made.name == "charge"
    assert made.description.startswith("Charge the card.")
    schema = made.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
    assert schema["required"] == ["amount"]
    assert list(schema["properties"]) == ["amount"]  # the call id is injected, not asked for


def last_answer_only() -> None:
    Script.hold = None
    load([AIMessage(content="bought tea")])


@pytest.mark.parametrize("entry", sorted(ENTRY))
@pytest.mark.parametrize("policy", sorted(GATED))
async def test_a_haltwise_cancel_inside_each_policys_tool_then_resume(
    sqlite_url: str, policy: str, entry: str
) -> None:
    load(turns(policy))
    await fw_kit.cancel_in_tool_then_resume(sqlite_url, ENTRY[entry], policy, last_answer_only)
    assert len(Script.requests) == 1  # journaled (streamed) turns were not asked again


async def test_a_cancel_while_the_model_is_answering_lands_at_once(sqlite_url: str) -> None:
    load([AIMessage(content="too late")])
    Script.hold = fw_kit.Gate()
    await fw_kit.cancel_while_answering(sqlite_url, shop, Script.answering, last_answer_only)
    assert len(Script.requests) == 1


async def test_a_cancel_while_the_model_streams_lands_at_once(sqlite_url: str) -> None:
    """The streamed model call is a step from its start: the cancel lands after the model's
    first token reached the task, and the step is interrupted."""
    load([AIMessage(content="too late")])
    Script.hold = fw_kit.Gate()
    await fw_kit.cancel_while_answering(
        sqlite_url, shop_streamed, Script.delta_seen, last_answer_only
    )
    assert Script.seen[0] == "too"
    assert len(Script.requests) == 1


def test_close_dangling_puts_the_result_right_after_its_call() -> None:
    conversation: list[Any] = [
        HumanMessage("buy"),
        calls(("browse", {"item": "tea"}, "z1")),
        HumanMessage("go on"),
    ]
    fixed = close_dangling(conversation)
    assert [type(m).__name__ for m in fixed] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "HumanMessage",
    ]
    assert fixed[2].tool_call_id == "z1"
    assert str(fixed[2].content).startswith("[haltwise] interrupted")


@haltwise.task
async def shop_cancelled_by_langgraph_and_go_on(prompt: str) -> str:
    """The same, and the body catches the graph task's cancel and goes on (the body's own task
    was not cancelled: only the adapter can tell the run was)."""
    run = asyncio.ensure_future(make_agent().ainvoke({"messages": [HumanMessage(prompt)]}))
    await Kit.entered["charge"].wait(timeout=fw_kit.PATIENCE)
    run.cancel()
    try:
        await run
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0)  # the body goes on: the run's cancel lands at its next await
    return "stopped"


@pytest.mark.parametrize("body", ["propagates", "goes on"])
async def test_langgraphs_own_cancel_is_a_haltwise_cancel_and_finish_is_honoured(
    sqlite_url: str, body: str
) -> None:
    load(turns("finish"))
    task = (
        shop_cancelled_by_langgraph
        if body == "propagates"
        else (shop_cancelled_by_langgraph_and_go_on)
    )
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(task, "buy tea", task_id="own")
        await Kit.entered["charge"].wait(timeout=fw_kit.PATIENCE)
        Kit.release["charge"].set()
        outcome = await handle.outcome()
    fw_kit.assert_host_cancel_honoured_finish(outcome)


async def test_parallel_tool_calls_cancelled_mid_way(sqlite_url: str) -> None:
    load([calls(*fw_kit.PARALLEL_CALLS), AIMessage(content="bought tea")])
    await fw_kit.parallel_calls_cancelled(sqlite_url, shop, last_answer_only)
    assert len(Script.requests) == 1


#: the prompt ``shop_what`` sends (a test changes it between the attempts of a run)
PROMPT = ["buy tea"]


@haltwise.task
async def shop_what() -> str:
    state = await make_agent().ainvoke({"messages": [HumanMessage(PROMPT[0])]})
    return str(state["messages"][-1].content)


async def test_a_replayed_model_request_that_differs_fails_the_run(sqlite_url: str) -> None:
    """A model request is fingerprinted (issue 27, item 6): on resume, a request that is not the
    journaled one fails the run with NonDeterminismError instead of getting its answer."""
    load(turns("interruptible"))
    PROMPT[0] = "buy tea"
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(shop_what, task_id="fp")
        await Kit.entered["browse"].wait(timeout=fw_kit.PATIENCE)
        await handle.cancel(reason="user")
        assert (await handle.outcome()).state is haltwise.State.CANCELLED
        PROMPT[0] = "buy coffee"  # the first request is not the journaled one any more
        load([AIMessage(content="bought coffee")])
        resumed = await (await runtime.resume("fp")).outcome()
    assert resumed.state is haltwise.State.FAILED, resumed
    assert resumed.error is not None
    assert resumed.error.type == "NonDeterminismError"
    assert "model" in resumed.error.message
