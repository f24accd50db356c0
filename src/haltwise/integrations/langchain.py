"""haltwise inside LangChain / LangGraph (CONTRACT.md, "Framework integrations").

- :func:`tool` turns a ``@haltwise.tool`` into a ``StructuredTool`` (the coroutine is the
  haltwise tool; the arguments schema comes from its signature; the description is
  :attr:`~haltwise.Tool.description`). Each call is one step of the current run keyed by the
  ``ToolCall``'s ``id`` (injected as LangChain's ``InjectedToolCallId``).
- :class:`HaltwiseMiddleware` for ``langchain.agents.create_agent(..., middleware=[...])``:
  every model call is one ``interruptible``, ``read`` step whose ``AIMessage`` is journaled (a
  resume replays it instead of asking the model again); every tool call runs under
  ``haltwise.call_id(tool_call["id"])``, and a tool that is not a haltwise tool becomes a step
  of its own (undeclared policy: it behaves as ``finish``); before each model call, a tool call
  of the conversation that has no ``ToolMessage`` gets one from the journal (a committed call
  its journaled result, any other a text saying what became of it), right after its
  ``AIMessage``.
- LangGraph's own cancel (cancelling the task that runs ``ainvoke``/``astream``) reaches the tool
  calls and the model call in flight: each settles by its policy, and the run is cancelled with
  reason ``"host"``.

Needs the ``langchain`` extra: ``pip install 'haltwise[langchain]'``.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from ._common import require

require("langchain", "langchain.agents", "langchain")

import pydantic  # noqa: E402
from langchain.agents.middleware import (  # noqa: E402
    AgentMiddleware,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AnyMessage,
    BaseMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool  # noqa: E402
from langgraph.prebuilt.tool_node import ToolCallRequest  # noqa: E402
from langgraph.types import Command  # noqa: E402

import haltwise  # noqa: E402

from ._common import (  # noqa: E402
    MODEL_STEP,
    call_id,
    journaled,
    model_request,
    record_usage,
)
from ._conversation import (  # noqa: E402
    call_tool,
    current_run_outcome,
    settled_calls,
    unsettled_text,
)

__all__ = ["HaltwiseMiddleware", "close_dangling", "tool"]

#: ``StructuredTool.metadata`` key marking a tool made by :func:`tool`
_MARK = "haltwise"


def tool(haltwise_tool: haltwise.Tool[..., Any]) -> BaseTool:
    """The haltwise tool as a LangChain ``StructuredTool`` (see the module docstring)."""
    target = haltwise_tool

    async def invoke(tool_call_id: str | None = None, **kwargs: Any) -> Any:
        return _content(await call_tool(target, tool_call_id, **kwargs))

    return StructuredTool.from_function(
        coroutine=invoke,
        name=target.name,
        description=target.description,
        args_schema=_arguments(target),
        metadata={_MARK: True},
    )


def _arguments(target: haltwise.Tool[..., Any]) -> type[pydantic.BaseModel]:
    """A pydantic model of the tool's keyword arguments, plus the injected tool-call id."""
    hints = typing.get_type_hints(target)
    fields: dict[str, Any] = {
        name: (
            hints.get(name, Any),
            ... if param.default is inspect.Parameter.empty else param.default,
        )
        for name, param in inspect.signature(target).parameters.items()
        if param.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    fields["tool_call_id"] = (Annotated[str, InjectedToolCallId], ...)
    model: type[pydantic.BaseModel] = pydantic.create_model(f"{target.name}_arguments", **fields)
    return model


class HaltwiseMiddleware(AgentMiddleware[Any, Any, Any]):
    """Model and tool calls of a ``create_agent`` agent as steps (see the module docstring).

    ``name`` is the model steps' tool name in the journal (default ``"model"``). Outside a task
    the calls pass through (with the conversation still closed).
    """

    def __init__(self, *, name: str = MODEL_STEP) -> None:
        super().__init__()
        self.step_name = name

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        if _open_calls(request.messages):
            closed = close_dangling(request.messages, await current_run_outcome())
            request = request.override(messages=closed)

        async def ask() -> list[dict[str, Any]]:
            response = await handler(request)
            for message in response.result:
                _record(message, request.model)
            return [message_to_dict(message) for message in response.result]

        data = await model_request(ask, name=self.step_name)
        return ModelResponse(result=messages_from_dict(data))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        ours = request.tool is not None and bool((request.tool.metadata or {}).get(_MARK))
        with call_id(request.tool_call.get("id")):
            if ours:
                return await handler(request)
            return await _foreign_tool_step(request, handler)


def _record(message: Any, model: Any) -> None:
    """Record an AI message's ``usage_metadata`` (input and output tokens) with the model
    request's step; the model's name from the message's metadata, else the model's own."""
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return
    metadata = getattr(message, "response_metadata", None) or {}
    name = metadata.get("model_name") or metadata.get("model") or model
    record_usage(name, usage.get("input_tokens"), usage.get("output_tokens"))


async def _foreign_tool_step(
    request: ToolCallRequest,
    handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
) -> ToolMessage | Command[Any]:
    """A tool that is not a haltwise tool, as one step (undeclared policy) of its tool's name."""

    async def call() -> dict[str, Any]:
        answer = await handler(request)
        if not isinstance(answer, ToolMessage):
            raise haltwise.HaltwiseError(
                f"tool {request.tool_call['name']!r} returned a Command, which haltwise cannot "
                "journal; make it a @haltwise.tool"
            )
        return message_to_dict(answer)

    data = await journaled(call, name=request.tool_call["name"])
    (message,) = messages_from_dict([data])
    assert isinstance(message, ToolMessage)
    return message


def close_dangling(
    messages: Sequence[AnyMessage], *outcomes: haltwise.Outcome | None
) -> list[AnyMessage]:
    """``messages`` with a ``ToolMessage`` right after each ``AIMessage`` for every tool call of
    it that has none: the journaled result of a committed call, else a text saying what became
    of it (read from ``outcomes`` and the in-process record of committed calls)."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    settled = settled_calls(*outcomes)
    fixed: list[AnyMessage] = []
    for message in messages:
        fixed.append(message)
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            cid = call.get("id") or ""
            if cid in answered:
                continue
            done = settled.get(cid)
            content = (
                _content(done.result)
                if done is not None and done.status is haltwise.StepStatus.COMMITTED
                else unsettled_text(done)
            )
            fixed.append(ToolMessage(content=content, tool_call_id=cid, name=call["name"]))
    return fixed


def _open_calls(messages: Sequence[BaseMessage]) -> bool:
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return any(
        call.get("id") not in answered
        for m in messages
        if isinstance(m, AIMessage)
        for call in m.tool_calls
    )


def _content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
