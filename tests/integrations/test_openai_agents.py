"""haltwise inside the OpenAI Agents SDK, with the SDK's own offline ``ScriptedModel``.

The agent's model is ``JournaledModel(ScriptedModel(...))`` and its tools are the kit's haltwise
tools through ``function_tool``. A resume gets a *new* scripted model holding only the turns the
journal does not have: had the model been asked again for a journaled turn, the script would
answer the wrong turn (or raise ``UnexpectedModelCall``), and ``calls`` counts every request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.result import RunResultStreaming
from agents.stream_events import RawResponsesStreamEvent
from agents.testing import (
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)

import fw_kit
import haltwise
from fw_kit import GATED, Kit
from haltwise.integrations.openai_agents import (
    JournaledModel,
    close_dangling,
    conversation,
    function_tool,
    run_streamed,
)

pytestmark = pytest.mark.anyio

CONFIG = RunConfig(tracing_disabled=True)


class Script:
    """The scripted model the next run's agent talks to, the streamed results it made, and the
    model's events the streamed task saw (with a gate set at the first text delta)."""

    model = ScriptedModel([])
    streams: list[RunResultStreaming] = []
    seen: list[str] = []
    delta_seen = fw_kit.Gate()


@pytest.fixture(autouse=True)
def fresh() -> None:
    fw_kit.reset()
    Script.streams, Script.seen, Script.delta_seen = [], [], fw_kit.Gate()


def make_agent() -> Agent[Any]:
    return Agent(
        name="shopper",
        instructions="Buy what the user asks for.",
        model=JournaledModel(Script.model),
        tools=[function_tool(tool) for tool in fw_kit.ALL_TOOLS],
    )


@haltwise.task
async def shop(prompt: str) -> Any:
    result = await Runner.run(make_agent(), prompt, run_config=CONFIG)
    return result.final_output


@haltwise.task
async def shop_streamed(prompt: str) -> Any:
    result = run_streamed(make_agent(), prompt, run_config=CONFIG)
    Script.streams.append(result)
    async for event in result.stream_events():
        if isinstance(event, RawResponsesStreamEvent):
            Script.seen.append(event.data.type)
            if event.data.type == "response.output_text.delta":
                Script.delta_seen.set()
    return result.final_output


@haltwise.task
async def carry_on(items: list[Any]) -> Any:
    """A new run on top of a kept conversation."""
    history = [*items, {"role": "user", "content": "go on"}]
    result = run_streamed(make_agent(), history, run_config=CONFIG)
    async for _ in result.stream_events():
        pass
    return result.final_output


def turns(policy: str) -> list[Any]:
    """lookup, then the gated tool of ``policy``, then the answer."""
    gated, args = GATED[policy]
    return [
        [function_call("lookup", {"item": "tea"}, call_id="c1")],
        [function_call(gated.name, args, call_id="c2")],
        [assistant_message("bought tea")],
    ]


async def test_a_normal_run_is_one_step_per_model_request_and_tool_call(sqlite_url: str) -> None:
    Script.model = ScriptedModel(turns("finish"))
    await fw_kit.normal_run(sqlite_url, shop)
    assert len(Script.model.calls) == 3
    # the tool's result reached the model as the tool returned it
    last_input = Script.model.calls[2].input
    outputs = [item for item in last_input if item.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["tea costs 5", "charged 5"]


def test_function_tool_has_a_strict_schema_and_the_policy_in_its_description() -> None:
    tool = function_tool(fw_kit.charge)
    assert tool.name == "charge"
    assert tool.strict_json_schema
    assert tool.params_json_schema["required"] == ["amount"]
    assert tool.params_json_schema["additionalProperties"] is False
    assert tool.description.startswith("Charge the card.")
    assert "cancel" in tool.description.lower()


def last_answer_only() -> None:
    Script.model = ScriptedModel([[assistant_message("bought tea")]])


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("policy", sorted(GATED))
async def test_a_haltwise_cancel_inside_each_policys_tool_then_resume(
    sqlite_url: str, policy: str, streamed: bool
) -> None:
    Script.model = ScriptedModel(turns(policy))
    task = shop_streamed if streamed else shop
    await fw_kit.cancel_in_tool_then_resume(sqlite_url, task, policy, last_answer_only)
    assert len(Script.model.calls) == 1  # journaled (streamed) turns were not asked again


async def test_a_cancel_while_the_model_is_answering_lands_at_once(sqlite_url: str) -> None:
    answering = fw_kit.Gate()
    never = fw_kit.Gate()

    async def slow_answer(call: Any) -> Any:
        answering.set()
        await never.wait(timeout=fw_kit.PATIENCE)
        return [assistant_message("too late")]

    Script.model = ScriptedModel([ModelStep.respond(slow_answer)])
    await fw_kit.cancel_while_answering(sqlite_url, shop, answering, last_answer_only)
    assert len(Script.model.calls) == 1


def test_close_dangling_says_what_became_of_an_unfinished_call() -> None:
    items: list[Any] = [
        {"role": "user", "content": "buy"},
        {"type": "function_call", "call_id": "x1", "name": "browse", "arguments": "{}"},
    ]
    fixed = close_dangling(items)
    assert fixed[-1]["type"] == "function_call_output"
    assert fixed[-1]["call_id"] == "x1"
    assert fixed[-1]["output"].startswith("[haltwise] interrupted")
    assert close_dangling(fixed) == fixed  # nothing left to close


async def test_parallel_tool_calls_cancelled_mid_way(sqlite_url: str) -> None:
    first = [function_call(name, args, call_id=cid) for name, args, cid in fw_kit.PARALLEL_CALLS]
    Script.model = ScriptedModel([first, [assistant_message("bought tea")]])
    await fw_kit.parallel_calls_cancelled(sqlite_url, shop, last_answer_only)
    assert len(Script.model.calls) == 1


async def test_the_sdks_own_cancel_is_a_haltwise_cancel_and_finish_is_honoured(
    sqlite_url: str,
) -> None:
    Script.model = ScriptedModel(turns("finish"))
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(shop_streamed, "buy tea", task_id="own")
        await Kit.entered["charge"].wait(timeout=fw_kit.PATIENCE)
        Script.streams[0].cancel()  # the SDK's own immediate cancel
        Kit.release["charge"].set()
        outcome = await handle.outcome()
    fw_kit.assert_host_cancel_honoured_finish(outcome)


#: what the conversation says of the gated call after the SDK's own cancel, per policy
CONVERSATION_OUTPUT = {
    "finish": "charged 5",
    "interruptible": "[haltwise] interrupted",
    "rollback": "[haltwise] compensated",
}


def outputs_and_calls(items: list[Any]) -> tuple[dict[str, str], list[str]]:
    outputs = {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    return outputs, calls


@pytest.mark.parametrize("policy", sorted(GATED))
async def test_after_the_sdks_cancel_the_conversation_has_every_call_with_its_result(
    sqlite_url: str, policy: str
) -> None:
    """The SDK alone drops the cancelled turn from to_input_list(); run_streamed's result
    holds it, closed from the journal (as conversation() does), and a resume (and a new run on
    top of the conversation) repeats nothing."""
    gated, _ = GATED[policy]
    Script.model = ScriptedModel(turns(policy))
    async with haltwise.Runtime(sqlite_url) as runtime:
        handle = await runtime.start(shop_streamed, "buy tea", task_id="own")
        await Kit.entered[gated.name].wait(timeout=fw_kit.PATIENCE)
        Script.streams[0].cancel()
        if policy == "finish":
            Kit.release[gated.name].set()  # it may finish; the others are stopped first
        outcome = await handle.outcome()
        Kit.release[gated.name].set()
        assert outcome.state is haltwise.State.CANCELLED, outcome
        assert fw_kit.statuses(outcome)[-1] == (gated.name, fw_kit.CANCELLED_STATUS[policy])
        kept = Script.streams[0].to_input_list()
        items = conversation(Script.streams[0], outcome)
        assert kept == items  # closed where the SDK keeps it: nothing left for conversation()
        outputs, calls = outputs_and_calls(items)
        assert calls == ["c1", "c2"]
        assert outputs["c1"] == "tea costs 5"
        assert outputs["c2"].startswith(CONVERSATION_OUTPUT[policy])
        assert items.index(next(i for i in items if i.get("call_id") == "c2")) > items.index(
            next(i for i in items if i.get("call_id") == "c1" and "output" in i)
        )

        last_answer_only()
        resumed = await (await runtime.resume("own")).outcome()
        assert resumed.result == "bought tea", resumed
        assert len(Script.model.calls) == 1  # the journaled streamed turns were replayed
        assert Kit.effects == {"lookup": 1, gated.name: 1}

        last_answer_only()
        again = await (await runtime.start(carry_on, items, task_id="again")).outcome()
    assert again.result == "bought tea", again
    assert Kit.effects == {"lookup": 1, gated.name: 1}  # nothing done a second time
    (sent,) = Script.model.calls
    assert outputs_and_calls(sent.input) == (outputs, calls)


def held_stream(text: str, hold: fw_kit.Gate) -> ModelStep:
    """A streamed answer that stops after its first text delta until ``hold`` opens: the
    scripted model's own events for ``text``, from a scripted model of its own."""

    async def events(call: ModelCall) -> AsyncIterator[Any]:
        inner = ScriptedModel([[assistant_message(text)]])
        stream = inner.stream_response(
            call.system_instructions,
            call.input,
            call.model_settings,
            call.tools,
            call.output_schema,
            call.handoffs,
            call.tracing,
            previous_response_id=call.previous_response_id,
            conversation_id=call.conversation_id,
            prompt=call.prompt,
        )
        async for event in stream:
            yield event
            if event.type == "response.output_text.delta":
                await hold.wait(timeout=fw_kit.PATIENCE)

    return ModelStep.stream(events)


async def test_a_streamed_run_passes_events_as_they_come_and_is_journaled(
    sqlite_url: str,
) -> None:
    Script.model = ScriptedModel(turns("finish"))
    await fw_kit.normal_run(sqlite_url, shop_streamed)
    assert len(Script.model.calls) == 3
    assert Script.seen.count("response.completed") == 3
    assert "response.output_text.delta" in Script.seen


async def test_a_cancel_while_the_model_streams_lands_at_once(sqlite_url: str) -> None:
    """The streamed request is a step from its start: the cancel lands while the model is
    half way through its answer (the task saw a delta), and the step is interrupted."""
    never = fw_kit.Gate()
    Script.model = ScriptedModel([held_stream("too late", never)])
    await fw_kit.cancel_while_answering(
        sqlite_url, shop_streamed, Script.delta_seen, last_answer_only
    )
    assert len(Script.model.calls) == 1
