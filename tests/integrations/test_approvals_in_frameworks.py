"""A haltwise tool that needs approval, inside each framework, each with its own offline
scripted model: the call waits inside the framework's tool call; a refusal reaches the model as
the call's result (``[haltwise] refused by ops: too expensive``), the agent goes on, and the
conversation the framework keeps holds that result. An approved call runs once."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import haltwise
from _wait import until
from haltwise.integrations import langchain as hw_langchain
from haltwise.integrations import openai_agents as hw_openai
from haltwise.integrations import pydantic_ai as hw_pydantic

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]

REFUSAL = "[haltwise] refused by ops: too expensive"
LEDGER: list[int] = []


@haltwise.tool(cancel="finish", effect="external", approval="required")
async def pay(amount: int) -> str:
    """Pay the amount."""
    LEDGER.append(amount)
    return f"paid {amount}"


# -- Pydantic AI --------------------------------------------------------------------------------


def pydantic_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [
        part
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": 500}, tool_call_id="c1")])
    return ModelResponse(parts=[TextPart(f"the tool said: {returns[-1].content}")])


@haltwise.task
async def pydantic_shop() -> dict[str, Any]:
    agent = PydanticAgent(
        hw_pydantic.JournaledModel(FunctionModel(pydantic_answer)), tools=[hw_pydantic.tool(pay)]
    )
    result = await agent.run("buy")
    kept = [
        part.content
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    return {"output": result.output, "kept": kept}


# -- LangChain ----------------------------------------------------------------------------------


class Chat(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@haltwise.task
async def langchain_shop() -> dict[str, Any]:
    answers = iter(
        [
            AIMessage("", tool_calls=[{"name": "pay", "args": {"amount": 500}, "id": "c1"}]),
            AIMessage("going on without paying"),
        ]
    )
    agent = create_agent(
        Chat(messages=answers),
        tools=[hw_langchain.tool(pay)],
        middleware=[hw_langchain.HaltwiseMiddleware()],
    )
    state = await agent.ainvoke({"messages": [HumanMessage("buy")]})
    kept = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"output": str(state["messages"][-1].content), "kept": kept}


# -- OpenAI Agents -------------------------------------------------------------------------------

OPENAI_MODEL: list[ScriptedModel] = []


@haltwise.task
async def openai_shop() -> dict[str, Any]:
    agent = Agent(
        name="shopper",
        instructions="Buy.",
        model=hw_openai.JournaledModel(OPENAI_MODEL[-1]),
        tools=[hw_openai.function_tool(pay)],
    )
    result = await Runner.run(agent, "buy", run_config=RunConfig(tracing_disabled=True))
    kept = [
        str(item.get("output"))
        for item in result.to_input_list()
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    return {"output": result.final_output, "kept": kept}


TASKS = {"pydantic_ai": pydantic_shop, "langchain": langchain_shop, "openai_agents": openai_shop}


@pytest.mark.parametrize("framework", sorted(TASKS))
@pytest.mark.parametrize("decision", ["refuse", "approve"])
async def test_a_decision_reaches_the_model_as_the_calls_result(
    sqlite_url: str, framework: str, decision: str
) -> None:
    LEDGER.clear()
    OPENAI_MODEL.append(
        ScriptedModel(
            [
                [function_call("pay", {"amount": 500}, call_id="c1")],
                [assistant_message("going on without paying")],
            ]
        )
    )
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(TASKS[framework], task_id="f1")

        async def asked() -> bool:
            return bool(await rt.approvals())

        await until(asked, "the tool call awaiting approval")
        [request] = await rt.approvals()
        assert (request.tool, request.arguments) == ("pay", {"amount": 500})
        assert LEDGER == []
        await rt.decide(
            "f1", request.index, approve=decision == "approve", by="ops", note="too expensive"
        )
        outcome = await handle.outcome()
    assert outcome.state is haltwise.State.COMPLETED, outcome.error
    expected = REFUSAL if decision == "refuse" else "paid 500"
    assert outcome.result["kept"] == [expected], "the framework's conversation holds it"
    assert ([] if decision == "refuse" else [500]) == LEDGER
    if framework == "pydantic_ai":
        assert expected in outcome.result["output"], "the model saw it"
