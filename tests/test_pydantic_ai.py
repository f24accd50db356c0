"""haltwise inside Pydantic AI, with Pydantic AI's own offline ``FunctionModel``.

The script answers the n-th request with the n-th response and counts requests; a resume gets a
script holding only the responses the journal does not have, so a model asked again for a
journaled turn would answer the wrong turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic_ai import Agent, CancellationToken
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

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

    @classmethod
    def load(cls, responses: Sequence[ModelResponse]) -> None:
        cls.responses, cls.requests = list(responses), []


async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    Script.requests.append(list(messages))
    if Script.hold is not None:
        Script.answering.set()
        await Script.hold.wait(timeout=fw_kit.PATIENCE)
    return Script.responses.pop(0)


@pytest.fixture(autouse=True)
def fresh() -> None:
    fw_kit.reset()
    Script.hold, Script.answering, Script.token, Script.cancelled = None, fw_kit.Gate(), None, []


def make_agent() -> Agent[None, str]:
    return Agent(JournaledModel(FunctionModel(answer)), tools=[tool(t) for t in fw_kit.ALL_TOOLS])


@haltwise.task
async def shop(prompt: str) -> str:
    try:
        result = await make_agent().run(prompt, cancellation_token=Script.token)
    except RunCancelled as error:
        Script.cancelled.append(error)
        raise
    return result.output


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


async def test_a_normal_run_is_one_step_per_request_and_tool_call(sqlite_url: str) -> None:
    Script.load(turns("finish"))
    await fw_kit.normal_run(sqlite_url, shop)
    assert len(Script.requests) == 3


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


@pytest.mark.parametrize("policy", sorted(GATED))
async def test_a_haltwise_cancel_inside_each_policys_tool_then_resume(
    sqlite_url: str, policy: str
) -> None:
    Script.load(turns(policy))
    await fw_kit.cancel_in_tool_then_resume(sqlite_url, shop, policy, last_answer_only)
    assert len(Script.requests) == 1  # journaled turns were not asked again


async def test_a_cancel_while_the_model_is_answering_lands_at_once(sqlite_url: str) -> None:
    Script.load([text("too late")])
    Script.hold = fw_kit.Gate()
    await fw_kit.cancel_while_answering(sqlite_url, shop, Script.answering, last_answer_only)
    assert len(Script.requests) == 1


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
