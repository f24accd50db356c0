"""An OpenAI Agents SDK agent under haltwise: cancelled while it pays, then resumed.

The model is the SDK's own offline ``agents.testing.ScriptedModel``, wrapped in haltwise's
``JournaledModel``; the tools are haltwise tools given to the agent with ``function_tool``. The
run is cancelled while ``charge`` (``cancel="finish"``) is in flight: the charge is allowed to
finish and is journaled, the run ends ``cancelled``. The resume gets a model that knows only the
last answer: the journaled answers are replayed, not asked for again, and the card is charged
once.

Then the same purchase streamed (``run_streamed``) and stopped with the SDK's own ``cancel()``
while the card is charged: the run ends ``cancelled`` (reason ``host``), the charge finishes, and
``conversation(result, outcome)`` gives back the turn the SDK's ``to_input_list()`` drops on such
a cancel, each call with its journaled result.

    python examples/openai_agents_agent.py
"""

from __future__ import annotations

import tempfile

import anyio
from _cancel_and_resume import cancel_and_resume, show
from agents import Agent, RunConfig, Runner
from agents.result import RunResultStreaming
from agents.testing import ScriptedModel, assistant_message, function_call

import haltwise
from haltwise.integrations.openai_agents import (
    JournaledModel,
    conversation,
    function_tool,
    run_streamed,
)

CHARGES: list[int] = []
paying = anyio.Event()


@haltwise.tool(cancel="interruptible", effect="read")
async def price(item: str) -> int:
    """The price of an item, in euros."""
    return 5


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=10)
async def charge(amount: int) -> str:
    """Charge the customer's card."""
    paying.set()
    await anyio.sleep(0.2)  # the payment provider takes its time
    CHARGES.append(amount)
    return f"charged {amount} EUR"


CONFIG = RunConfig(tracing_disabled=True)
TURNS = [
    [function_call("price", {"item": "tea"}, call_id="call-price")],
    [function_call("charge", {"amount": 5}, call_id="call-charge")],
    [assistant_message("Bought tea for 5 EUR.")],
]


class Script:
    model = ScriptedModel(TURNS)

    streams: list[RunResultStreaming] = []


def shopper() -> Agent[None]:
    return Agent(
        name="shopper",
        instructions="Buy what you are asked for.",
        model=JournaledModel(Script.model),
        tools=[function_tool(price), function_tool(charge)],
    )


@haltwise.task
async def buy(item: str) -> str:
    result = await Runner.run(shopper(), f"Buy {item}", run_config=CONFIG)
    return str(result.final_output)


@haltwise.task
async def buy_streamed(item: str) -> str:
    result = run_streamed(shopper(), f"Buy {item}", run_config=CONFIG)
    Script.streams.append(result)
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


def last_answer_only() -> None:
    Script.model = ScriptedModel([[assistant_message("Bought tea for 5 EUR.")]])


async def main() -> None:
    # cancelled while the card is being charged
    resumed = await cancel_and_resume(buy, "tea", in_flight=paying, between=last_answer_only)
    print(f"result: {resumed.result!r}; model asked again {len(Script.model.calls)} time(s)")
    assert CHARGES == [5], CHARGES
    print("charged once")
    await the_sdks_own_cancel()


async def the_sdks_own_cancel() -> None:
    """``run_streamed`` stopped by the SDK's ``cancel()`` while charging; the conversation."""
    global paying
    Script.model, CHARGES[:], paying = ScriptedModel(TURNS), [], anyio.Event()
    async with haltwise.Runtime(f"sqlite:///{tempfile.mkdtemp()}/haltwise.db") as runtime:
        handle = await runtime.start(buy_streamed, "tea")
        await paying.wait()
        Script.streams[0].cancel()  # the SDK's own cancel
        outcome = await handle.outcome()
    show(outcome)
    sdk_kept = [i.get("call_id") for i in Script.streams[0].to_input_list() if "call_id" in i]
    print(f"to_input_list() keeps the calls {sdk_kept}")
    for item in conversation(Script.streams[0], outcome):
        if item.get("type") == "function_call_output":
            print(f"  {item['call_id']}: {item['output']}")
    assert CHARGES == [5], CHARGES


if __name__ == "__main__":
    anyio.run(main)
