"""haltwise inside Pydantic AI, with Pydantic AI's own offline ``FunctionModel``.

The script answers the n-th request with the n-th response and counts requests; a resume gets a
script holding only the responses the journal does not have, so a model asked again for a
journaled turn would answer the wrong turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from pydantic_ai import Agent, AgentRunResultEvent, CancellationToken
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import fw_kit
import haltwise
from fw_kit import GATED, Kit
from haltwise.integrations.pydantic_ai import JournaledModel, close_dangling, tool

pytestmark = pytest.mark.anyio


class Script:
    """Scripted responses, the requests they answered, and the run's cancellation token."""

    responses: list[ModelResponse] = []
    requests: list[list[ModelMessage]] = []
    hold: fw_kit.Gate | None = None
    answering = fw_kit.Gate()
    token: CancellationToken | None = None
    cancelled: list[RunCancelled] = []
    #: how many requests streamed; text deltas the streamed task saw, and a gate set at the first
    streamed = 0
    seen: list[str] = []
    delta_seen = fw_kit.Gate()

    @classmethod
    def load(cls, responses: Sequence[ModelResponse]) -> None:
        cls.responses, cls.requests = list(responses), []


async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    Script.requests.append(list(messages))
    if Script.hold is not None:
        Script.answering.set()
        await Script.hold.wait(timeout=fw_kit.PATIENCE)
    return Script.responses.pop(0)


async def stream_answer(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """The next scripted response, streamed: a text in two chunks (held after the first while
    ``Script.hold`` is closed), each tool call as one delta."""
    Script.requests.append(list(messages))
    Script.streamed += 1
    response = Script.responses.pop(0)
    for index, part in enumerate(response.parts):
        if isinstance(part, TextPart):
            half = len(part.content) // 2
            yield part.content[:half]
            if Script.hold is not None:
                await Script.hold.wait(timeout=fw_kit.PATIENCE)
            yield part.content[half:]
        elif isinstance(part, ToolCallPart):
            yield {
                index: DeltaToolCall(
                    part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id
                )
            }


@pytest.fixture(autouse=True)
def fresh() -> None:
    fw_kit.reset()
    Script.hold, Script.answering, Script.token, Script.cancelled = None, fw_kit.Gate(), None, []
    Script.seen, Script.delta_seen, Script.streamed = [], fw_kit.Gate(), 0


def make_agent() -> Agent[None, str]:
    model = FunctionModel(answer, stream_function=stream_answer)
    return Agent(JournaledModel(model), tools=[tool(t) for t in fw_kit.ALL_TOOLS])


@haltwise.task
async def shop(prompt: str) -> str:
    try:
        result = await make_agent().run(prompt, cancellation_token=Script.token)
    except RunCancelled as error:
        Script.cancelled.append(error)
        raise
    return result.output


@haltwise.task
async def shop_streamed(prompt: str) -> str:
    """The same agent through ``run_stream``: every model request streams."""
    try:
        async with make_agent().run_stream(prompt, cancellation_token=Script.token) as result:
            async for piece in result.stream_text(delta=True, debounce_by=None):
                Script.seen.append(piece)
                Script.delta_seen.set()
            return await result.get_output()
    except RunCancelled as error:
        Script.cancelled.append(error)
        raise


@haltwise.task
async def shop_events(prompt: str) -> str:
    """The same agent through ``run_stream_events``."""
    async with make_agent().run_stream_events(prompt) as events:
        async for event in events:
            if isinstance(event, AgentRunResultEvent):
                return str(event.result.output)
    raise AssertionError("no result event")


@haltwise.task
async def shop_iter(prompt: str) -> str:
    """The same agent node by node (``iter``), each model request streamed by its node."""
    async with make_agent().iter(prompt) as run:
        async for node in run:
            if Agent.is_model_request_node(node):
                async with node.stream(run.ctx) as stream:
                    async for _ in stream:
                        pass
    assert run.result is not None
    return run.result.output


#: the agent's entry points
ENTRY = {
    "run": shop,
    "run_stream": shop_streamed,
    "run_stream_events": shop_events,
    "iter": shop_iter,
}


def calls(*parts: tuple[str, dict[str, Any], str]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=c) for n, a, c in parts])


def text(value: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(value)])


def turns(policy: str) -> list[ModelResponse]:
    gated, args = GATED[policy]
    return [
        calls(("lookup", {"item": "tea"}, "c1")),
        calls((gated.name, args, "c2")),
        text("bought tea"),
    ]


@pytest.mark.parametrize("entry", sorted(ENTRY))
async def test_a_normal_run_is_one_step_per_request_and_tool_call(
    sqlite_url: str, entry: str
) -> None:
    Script.load(turns("finish"))
    await fw_kit.normal_run(sqlite_url, ENTRY[entry])
    assert len(Script.requests) == 3
    assert Script.streamed == (0 if entry == "run" else 3)
    if entry == "run_stream":
        assert Script.seen == ["bough", "t tea"]  # the text reached the task as it streamed


def test_tool_keeps_the_parameters_and_the_policy_description() -> None:
    definition = tool(fw_kit.charge).tool_def
    assert definition.name == "charge"
    assert definition.parameters_json_schema["required"] == ["amount"]
    assert definition.parameters_json_schema["properties"]["amount"]["type"] == "integer"
    assert definition.description is not None
    assert definition.description.startswith("Charge the card.")


def last_answer_only() -> None:
    Script.hold = None
    Script.load([text("bought tea")])


@pytest.mark.parametrize("entry", sorted(ENTRY))
@pytest.mark.parametrize("policy", sorted(GATED))
async def test_a_haltwise_cancel_inside_each_policys_tool_then_resume(
    sqlite_url: str, policy: str, entry: str
) -> None:
    Script.load(turns(policy))
    await fw_kit.cancel_in_tool_then_resume(sqlite_url, ENTRY[entry], policy, last_answer_only)
    assert len(Script.requests) == 1  # journaled (streamed) turns were not asked again


async def test_a_cancel_while_the_model_is_answering_lands_at_once(sqlite_url: str) -> None:
    Script.load([text("too late")])
    Script.hold = fw_kit.Gate()
    await fw_kit.cancel_while_answering(sqlite_url, shop, Script.answering, last_answer_only)
    assert len(Script.requests) == 1


async def test_a_cancel_while_the_model_streams_lands_at_once(sqlite_url: str) -> None:
    """The streamed request is a step from its start: the cancel lands while the model is half
    way through its text (the task saw the first half), and the step is interrupted."""
    Script.load([text("too late")])
    Script.hold = fw_kit.Gate()
    await fw_kit.cancel_while_answering(
        sqlite_url, shop_streamed, Script.delta_seen, last_answer_only
    )
    assert Script.seen[0] == "too "
    assert len(Script.requests) == 1


async def test_a_cancellation_token_while_the_model_streams_is_a_haltwise_cancel(
    sqlite_url: str,
) -> None:
    Script.load([text("too late")])
    Script.hold = fw_kit.Gate()
    Script.token = CancellationToken()
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(shop_streamed, "buy tea")
        await Script.delta_seen.wait(timeout=fw_kit.PATIENCE)
        Script.token.cancel()  # Pydantic AI's own cancel, while the model streams
        outcome = await handle.outcome()
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert outcome.reason == "host"
    assert fw_kit.statuses(outcome) == [("model", "interrupted")]
    assert len(Script.cancelled) == 1


@haltwise.task
async def stop_the_stream(prompt: str) -> str:
    """``run_stream``, stopped with Pydantic AI's own ``cancel()`` at the first delta."""
    async with make_agent().run_stream(prompt) as result:
        async for _ in result.stream_text(delta=True, debounce_by=None):
            await result.cancel()
        return await result.get_output()


async def test_the_streams_own_cancel_is_a_haltwise_cancel(sqlite_url: str) -> None:
    Script.load([text("too late")])
    Script.hold = fw_kit.Gate()  # the model holds after its first chunk; only a cancel stops it
    async with haltwise.Runtime(sqlite_url) as runtime:
        outcome = await (await runtime.start(stop_the_stream, "buy tea")).outcome()
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert outcome.reason == "host"
    assert fw_kit.statuses(outcome) == [("model", "interrupted")]


def test_close_dangling_answers_a_last_response_from_the_outcome() -> None:
    history: list[ModelMessage] = [calls(("browse", {"item": "tea"}, "z1"))]
    fixed = close_dangling(history)
    last = fixed[-1]
    assert isinstance(last, ModelRequest)
    (part,) = last.parts
    assert isinstance(part, ToolReturnPart)
    assert part.tool_call_id == "z1"
    assert part.outcome == "interrupted"
    assert str(part.content).startswith("[haltwise] interrupted")


async def test_parallel_tool_calls_cancelled_mid_way(sqlite_url: str) -> None:
    Script.load([calls(*fw_kit.PARALLEL_CALLS), text("bought tea")])
    await fw_kit.parallel_calls_cancelled(sqlite_url, shop, last_answer_only)
    assert len(Script.requests) == 1


async def test_own_cancel_is_a_haltwise_cancel_and_a_reused_history_does_not_charge_twice(
    sqlite_url: str,
) -> None:
    Script.load(turns("finish"))
    Script.token = CancellationToken()
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(shop, "buy tea", task_id="own")
        await Kit.entered["charge"].wait(timeout=fw_kit.PATIENCE)
        Script.token.cancel()  # Pydantic AI's own cancel
        Kit.release["charge"].set()
        outcome = await handle.outcome()
        fw_kit.assert_host_cancel_honoured_finish(outcome)
        assert outcome.cancel_error is not None
        assert outcome.cancel_error.type == "RunCancelled"

        # The history Pydantic AI kept, reused by a new agent run in a new haltwise run:
        (error,) = Script.cancelled
        history = error.all_messages()
        Script.load([text("bought tea")])
        Script.token = None

        @haltwise.task
        async def carry_on() -> str:
            agent = make_agent()
            return (await agent.run("go on", message_history=history)).output

        again = await (await runtime.start(carry_on, task_id="again")).outcome()
    assert again.result == "bought tea"
    assert Kit.effects == {"lookup": 1, "charge": 1}  # not charged twice
    (sent,) = Script.requests
    returns = {
        part.tool_call_id: part
        for message in sent
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    assert returns["c2"].outcome == "success"
    assert returns["c2"].content == "charged 5"
