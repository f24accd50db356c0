"""Budgets in every framework, with each framework's own offline scripted model (CONTRACT.md,
"Budgets"): each model request's tokens are recorded from the framework's own usage (priced when
the budget names the model), each tool call counts as it begins, and each limit reached mid-run
stops the run before its next step: cancelled, or paused and raised, nothing repeated.

The agent is asked to look up three items, then answers: model, lookup, model, lookup, model,
lookup, model. Every scripted model request reports 100 input and 20 output tokens, except Pydantic
AI's ``FunctionModel``, which estimates its own (read back from the journal here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

import fw_kit
import haltwise
from fw_kit import Kit
from haltwise import State
from haltwise._core.budget import Spent

pytestmark = pytest.mark.anyio

ITEMS = ("tea", "milk", "jam")
MODEL = "scripted-model"
#: US dollars per million input and output tokens: a request of 100 + 20 tokens costs 0.12
PRICES = {MODEL: (1000.0, 1000.0)}


class Asked:
    """How many requests each framework's scripted model answered."""

    count = 0


@pytest.fixture(autouse=True)
def fresh() -> None:
    fw_kit.reset()
    Asked.count = 0


# -- OpenAI Agents: the SDK's ScriptedModel --------------------------------------------------


def _openai_agent() -> Any:
    from agents import Agent, Usage
    from agents.testing import ScriptedModel, assistant_message, function_call

    from haltwise.integrations.openai_agents import JournaledModel, function_tool

    turns: list[Any] = [
        [function_call("lookup", {"item": item}, call_id=f"c{i}")] for i, item in enumerate(ITEMS)
    ]
    usage = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
    script = ScriptedModel([*turns, [assistant_message("bought all")]], default_usage=usage)
    script.model = MODEL  # type: ignore[attr-defined]  # as the SDK's OpenAI models name theirs
    counted = _Counted(script)
    return Agent(
        name="shopper",
        instructions="Look everything up.",
        model=JournaledModel(counted),  # type: ignore[arg-type]
        tools=[function_tool(fw_kit.lookup)],
    )


class _Counted:
    """A model that counts the requests it forwards (any attribute is the wrapped model's)."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        Asked.count += 1
        return await self._model.get_response(*args, **kwargs)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        Asked.count += 1
        async for event in self._model.stream_response(*args, **kwargs):
            yield event


async def _openai(streamed: bool) -> Any:
    from agents import RunConfig, Runner

    from haltwise.integrations.openai_agents import run_streamed

    config = RunConfig(tracing_disabled=True)
    if streamed:
        result = run_streamed(_openai_agent(), "shop", run_config=config)
        async for _ in result.stream_events():
            pass
        return result.final_output
    return (await Runner.run(_openai_agent(), "shop", run_config=config)).final_output


# -- Pydantic AI: FunctionModel ------------------------------------------------------------------


def _pydantic_agent() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    from haltwise.integrations.pydantic_ai import JournaledModel, tool

    def response(messages: list[ModelMessage]) -> ModelResponse:
        Asked.count += 1
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < len(ITEMS):
            return ModelResponse(parts=[ToolCallPart("lookup", {"item": ITEMS[turn]}, f"c{turn}")])
        return ModelResponse(parts=[TextPart("bought all")])

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return response(messages)

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        for part in response(messages).parts:
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                args = part.args_as_json_str()
                yield {0: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

    model = FunctionModel(answer, stream_function=stream, model_name=MODEL)
    return Agent(JournaledModel(model), tools=[tool(fw_kit.lookup)])


async def _pydantic(streamed: bool) -> Any:
    agent = _pydantic_agent()
    if streamed:
        async with agent.run_stream("shop") as result:
            return await result.get_output()
    return (await agent.run("shop")).output


# -- LangChain: GenericFakeChatModel --------------------------------------------------------------


def _langchain_agent() -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from haltwise.integrations.langchain import HaltwiseMiddleware, tool

    usage = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
    metadata = {"model_name": MODEL}

    def message(**fields: Any) -> AIMessage:
        return AIMessage(usage_metadata=usage, response_metadata=metadata, **fields)  # type: ignore[arg-type]

    answers = [
        message(content="", tool_calls=[{"name": "lookup", "args": {"item": item}, "id": f"c{i}"}])
        for i, item in enumerate(ITEMS)
    ]

    class Chat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            Asked.count += 1
            return await super()._agenerate(*args, **kwargs)

    chat = Chat(messages=iter([*answers, message(content="bought all")]))
    return create_agent(chat, tools=[tool(fw_kit.lookup)], middleware=[HaltwiseMiddleware()])


async def _langchain(streamed: bool) -> Any:
    from langchain_core.messages import HumanMessage

    state = await _langchain_agent().ainvoke({"messages": [HumanMessage("shop")]})
    return state["messages"][-1].content


FRAMEWORKS: dict[str, Callable[[bool], Any]] = {
    "openai_agents": _openai,
    "pydantic_ai": _pydantic,
    "langchain": _langchain,
}


@haltwise.task(name="budgets:shop")
async def shop(framework: str, streamed: bool = False) -> Any:
    return await FRAMEWORKS[framework](streamed)


def model_steps(outcome: haltwise.Outcome) -> list[haltwise.StepRecord]:
    return [step for step in outcome.steps if step.tool == "model"]


def check_spend(outcome: haltwise.Outcome, *, requests: int, calls: int) -> dict[str, Any]:
    """The spend in ``status --json`` is the sum of the journaled usages: ``requests`` model
    steps, each with its tokens (and no tool call), and ``calls`` tool calls."""
    spent = outcome.to_json()["budget"]["spent"]
    assert spent == Spent.of(outcome.steps).to_json()
    models = model_steps(outcome)
    assert len(models) == requests
    assert all(step.tokens and step.calls == 0 for step in models)
    assert spent["tokens"] == sum(step.tokens or 0 for step in models)
    assert spent["tool_calls"] == calls
    return dict(spent)


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_tool_calls_limit_cancels_before_the_next_call(
    sqlite_url: str, framework: str
) -> None:
    budget = haltwise.Budget(tool_calls=2)
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(shop, framework, task_id="calls", budget=budget)
        outcome = await handle.outcome()
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    # the third model request answered (a model request is no tool call); its lookup never began
    assert fw_kit.statuses(outcome) == [
        ("model", "committed"),
        ("lookup", "committed"),
        ("model", "committed"),
        ("lookup", "committed"),
        ("model", "committed"),
    ]
    assert Kit.effects == {"lookup": 2}
    check_spend(outcome, requests=3, calls=2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_tokens_limit_pauses_then_raised_it_completes_nothing_repeated(
    sqlite_url: str, framework: str
) -> None:
    budget = haltwise.Budget(tokens=1, on_exhaust="pause")
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(shop, framework, task_id="tokens", budget=budget)
        with anyio.fail_after(fw_kit.PATIENCE):
            while not rt.is_paused("tokens"):
                await rt.store.wait_for_change(0.05)
        paused = await rt.status("tokens")
        assert (paused.state, paused.reason) == (State.PAUSED, "budget")
        assert fw_kit.statuses(paused) == [("model", "committed")]  # no tool call began
        check_spend(paused, requests=1, calls=0)
        await rt.unpause("tokens", budget=haltwise.Budget(tokens=1_000_000))
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == "bought all"
    assert Asked.count == 4  # every model request asked once
    assert Kit.effects == {"lookup": 3}
    check_spend(outcome, requests=4, calls=3)


@pytest.mark.parametrize(
    ("framework", "streamed"),
    [("openai_agents", True), ("pydantic_ai", True), ("langchain", False)],
)
async def test_usd_limit_priced_by_model_cancels(
    sqlite_url: str, framework: str, streamed: bool
) -> None:
    budget = haltwise.Budget(usd=0.0001, prices=PRICES)
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(shop, framework, streamed, task_id="usd", budget=budget)
        outcome = await handle.outcome()
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert fw_kit.statuses(outcome)[:1] == [("model", "committed")]
    assert [tool for tool, _ in fw_kit.statuses(outcome)] == ["model"]
    assert Kit.effects == {}
    spent = check_spend(outcome, requests=1, calls=0)
    (step,) = model_steps(outcome)
    assert step.usd is not None and step.usd > 0
    assert spent["usd"] == pytest.approx(step.usd)
    if framework != "pydantic_ai":  # the others report 100 + 20 tokens: 0.12 at these prices
        assert spent == {"usd": pytest.approx(0.12), "tokens": 120, "tool_calls": 0}


@haltwise.task(name="budgets:shop_in_session")
async def shop_in_session(path: str) -> Any:
    from agents import RunConfig, Runner, SQLiteSession

    session = SQLiteSession("shopper", path)
    config = RunConfig(tracing_disabled=True)
    result = await Runner.run(_openai_agent(), "shop", run_config=config, session=session)
    return result.final_output


async def test_the_adapters_own_steps_are_no_tool_calls_of_the_budget(
    sqlite_url: str, tmp_path: Any
) -> None:
    # OpenAI Agents with a session: the adapter journals the session's length as a step of its
    # own; the agent's three lookups are the run's only tool calls, so a budget of three is enough
    budget = haltwise.Budget(tool_calls=len(ITEMS))
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(
            shop_in_session, str(tmp_path / "session.db"), task_id="session", budget=budget
        )
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED, outcome
    assert Kit.effects == {"lookup": len(ITEMS)}
    assert [step.tool for step in outcome.steps if step.tool not in ("model", "lookup")] == [
        "session"
    ]
    check_spend(outcome, requests=len(ITEMS) + 1, calls=len(ITEMS))
