"""An OpenAI Agents SDK agent under haltwise: cancelled while it pays, then resumed.

The model is the SDK's own offline ``agents.testing.ScriptedModel``, wrapped in haltwise's
``JournaledModel``; the tools are haltwise tools given to the agent with ``function_tool``. The
run is cancelled while ``charge`` (``cancel="finish"``) is in flight: the charge is allowed to
finish and is journaled, the run ends ``cancelled``. The resume gets a model that knows only the
last answer: the journaled answers are replayed, not asked for again, and the card is charged
once.

    python examples/openai_agents_agent.py
"""

from __future__ import annotations

import anyio
from _cancel_and_resume import cancel_and_resume
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

import haltwise
from haltwise.integrations.openai_agents import JournaledModel, function_tool

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


class Script:
    model = ScriptedModel(
        [
            [function_call("price", {"item": "tea"}, call_id="call-price")],
            [function_call("charge", {"amount": 5}, call_id="call-charge")],
            [assistant_message("Bought tea for 5 EUR.")],
        ]
    )


@haltwise.task
async def buy(item: str) -> str:
    agent = Agent(
        name="shopper",
        instructions="Buy what you are asked for.",
        model=JournaledModel(Script.model),
        tools=[function_tool(price), function_tool(charge)],
    )
    result = await Runner.run(agent, f"Buy {item}", run_config=RunConfig(tracing_disabled=True))
    return str(result.final_output)


def last_answer_only() -> None:
    Script.model = ScriptedModel([[assistant_message("Bought tea for 5 EUR.")]])


async def main() -> None:
    # cancelled while the card is being charged
    resumed = await cancel_and_resume(buy, "tea", in_flight=paying, between=last_answer_only)
    print(f"result: {resumed.result!r}; model asked again {len(Script.model.calls)} time(s)")
    assert CHARGES == [5], CHARGES
    print("charged once")


if __name__ == "__main__":
    anyio.run(main)
