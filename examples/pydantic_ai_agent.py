"""A Pydantic AI agent under haltwise: cancelled while it reserves a room, then resumed.

The model is Pydantic AI's own offline ``FunctionModel``, wrapped in haltwise's
``JournaledModel``; the tools are haltwise tools given to the agent with ``tool``. The run is
cancelled while ``reserve`` (``cancel="rollback"``) is in flight: the reservation is interrupted
and compensated (cancelled at the hotel), the run ends ``cancelled``. The resume replays the
journaled model answers (the function model is not asked again for them), reserves again, and
ends with exactly one reservation standing.

    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import anyio
from _cancel_and_resume import cancel_and_resume
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import haltwise
from haltwise.integrations.pydantic_ai import JournaledModel, tool

ROOMS: list[str] = []
reserving = anyio.Event()


@haltwise.tool(cancel="interruptible", effect="read")
async def find_hotel(city: str) -> str:
    """The best hotel in a city."""
    return f"Hotel Central, {city}"


def cancel_reservation(hotel: str) -> None:
    ROOMS.remove(hotel)


@haltwise.tool(cancel="rollback", effect="write", compensate=cancel_reservation, grace=10)
async def reserve(hotel: str) -> str:
    """Reserve a room."""
    ROOMS.append(hotel)
    reserving.set()
    await anyio.sleep(0.2)  # the hotel's system confirms slowly
    return f"reserved at {hotel}"


ANSWERS = [
    ModelResponse(parts=[ToolCallPart("find_hotel", {"city": "Lyon"}, tool_call_id="c-find")]),
    ModelResponse(
        parts=[ToolCallPart("reserve", {"hotel": "Hotel Central, Lyon"}, tool_call_id="c-res")]
    ),
    ModelResponse(parts=[TextPart("Your room at Hotel Central is booked.")]),
]
asked: list[int] = []


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    asked.append(len(messages))
    return ANSWERS.pop(0)


@haltwise.task
async def book(city: str) -> str:
    agent = Agent(JournaledModel(FunctionModel(answer)), tools=[tool(find_hotel), tool(reserve)])
    return (await agent.run(f"Book a room in {city}")).output


def rooms_held() -> None:
    print(f"rooms held after the cancel: {ROOMS}")
    asked.clear()


async def main() -> None:
    # cancelled while the room is being reserved
    resumed = await cancel_and_resume(book, "Lyon", in_flight=reserving, between=rooms_held)
    print(f"result: {resumed.result!r}; model asked again {len(asked)} time(s)")
    assert ROOMS == ["Hotel Central, Lyon"], ROOMS
    print("one reservation standing")


if __name__ == "__main__":
    anyio.run(main)
