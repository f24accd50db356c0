"""A LangChain ``create_agent`` agent under haltwise: cancelled while it searches, then resumed.

The model is LangChain's own offline fake chat model (``GenericFakeChatModel``); the tools are
haltwise tools given to the agent with ``tool``, and ``HaltwiseMiddleware`` makes every model
call a journaled step. The run is cancelled while ``search`` (``cancel="interruptible"``) is in
flight: the search is interrupted at once, the run ends ``cancelled``. The resume replays the
journaled model call (the fake model is not asked again for it), searches again, and sends the
e-mail (``cancel="finish"``) once.

    python examples/langchain_agent.py
"""

from __future__ import annotations

from typing import Any

import anyio
from _cancel_and_resume import cancel_and_resume
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

import haltwise
from haltwise.integrations.langchain import HaltwiseMiddleware, tool

SENT: list[str] = []
searching = anyio.Event()


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> str:
    """Search the web."""
    searching.set()
    await anyio.sleep(0.2)  # the search engine is slow
    return f"3 articles about {query}"


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def send_email(body: str) -> str:
    """Send an e-mail to the user."""
    SENT.append(body)
    return "sent"


class ScriptedChat(GenericFakeChatModel):
    """The fake chat model, which needs no tool binding."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


class Script:
    answers = iter(
        [
            call("search", {"query": "auroras"}, "c-search"),
            call("send_email", {"body": "3 articles about auroras"}, "c-mail"),
            AIMessage(content="I e-mailed you the articles."),
        ]
    )


@haltwise.task
async def research(topic: str) -> str:
    agent = create_agent(
        ScriptedChat(messages=Script.answers),
        tools=[tool(search), tool(send_email)],
        middleware=[HaltwiseMiddleware()],
    )
    state = await agent.ainvoke({"messages": [HumanMessage(f"Research {topic}")]})
    return str(state["messages"][-1].content)


async def main() -> None:
    # cancelled while the search runs; the first answer is journaled, so the resumed agent's
    # model only has the other two
    resumed = await cancel_and_resume(research, "auroras", in_flight=searching)
    print(f"result: {resumed.result!r}")
    assert SENT == ["3 articles about auroras"], SENT
    print("e-mail sent once")


if __name__ == "__main__":
    anyio.run(main)
