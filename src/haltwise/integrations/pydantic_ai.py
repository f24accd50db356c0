"""haltwise inside Pydantic AI (CONTRACT.md, "Framework integrations").

- :func:`tool` turns a ``@haltwise.tool`` into a ``pydantic_ai.Tool`` with the tool's own
  parameters (validated by Pydantic AI as for any function tool) and its
  :attr:`~haltwise.Tool.description`; each call is one step of the current run, keyed by
  ``RunContext.tool_call_id``. The tool's exceptions propagate as Pydantic AI's own tools' do;
  ``haltwise.Cancelled`` is never turned into anything else.
- :class:`JournaledModel` wraps any model (a ``WrapperModel``): each ``request`` is one
  ``interruptible``, ``read`` step whose ``ModelResponse`` is journaled, so a resume replays the
  answers the model already gave instead of asking again. (Streamed requests, ``run_stream``,
  are passed through unjournaled.)
- Pydantic AI's own cancel (``CancellationToken.cancel()``, ``AgentRun.cancel()``,
  ``RunContext.cancel()``, ``timeout=``) cancels the asyncio task driving the run. Where that
  lands in a model request or a tool call, the step settles by its policy (haltwise's host-cancel
  settlement); the ``RunCancelled`` (``RunTimedOut``) Pydantic AI then raises ends the run
  ``cancelled`` with reason ``"host"`` (kept as its ``cancel_error``), never ``failed``, also
  when the cancel landed between two steps (importing this module registers ``RunCancelled`` as
  a host-cancel error with the runtime).
- A history reused after a cancel: Pydantic AI closes each call that has no return with a
  synthesized ``outcome='interrupted'`` return, also a call that *committed* after the cancel (a
  ``finish`` call allowed to end) -- a new run would then call it again and charge twice.
  :class:`JournaledModel` rewrites every request's history with :func:`close_dangling`: a
  committed call gets its journaled result as a ``success`` return, an interrupted, compensated
  or unknown one a return saying so.

Needs the ``pydantic-ai`` extra: ``pip install 'haltwise[pydantic-ai]'`` (``pydantic-ai-slim``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ._common import require

require("pydantic_ai", "pydantic_ai", "pydantic-ai")

from pydantic_ai import RunContext, Tool  # noqa: E402
from pydantic_ai.exceptions import RunCancelled  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters  # noqa: E402
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402

import haltwise  # noqa: E402

from .._runtime.ending import HOST_CANCEL_ERRORS  # noqa: E402
from ._common import MODEL_STEP, model_request  # noqa: E402
from ._conversation import (  # noqa: E402
    SettledCall,
    call_tool,
    current_run_outcome,
    settled_calls,
    unsettled_text,
)

__all__ = ["JournaledModel", "close_dangling", "tool"]

# Pydantic AI's own cancel, wherever it landed (in a step or between two), ends the run
# ``cancelled`` with reason "host" when its RunCancelled (RunTimedOut) reaches the task.
if RunCancelled not in HOST_CANCEL_ERRORS:
    HOST_CANCEL_ERRORS.append(RunCancelled)


def tool(haltwise_tool: haltwise.Tool[..., Any]) -> Tool[Any]:
    """The haltwise tool as a ``pydantic_ai.Tool`` (see the module docstring)."""
    target = haltwise_tool

    async def invoke(ctx: RunContext[Any], /, **kwargs: Any) -> Any:
        # Pydantic AI's own cancel (or a host's) stops the step by its policy; the core records
        # the run cancelled (reason host) when RunCancelled reaches the task.
        return await call_tool(target, ctx.tool_call_id, **kwargs)

    signature = inspect.signature(target)
    context = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_ONLY, annotation=RunContext[Any]
    )
    invoke.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[context, *signature.parameters.values()]
    )
    invoke.__annotations__ = {"ctx": RunContext[Any], **typing.get_type_hints(target)}
    invoke.__name__ = invoke.__qualname__ = target.name
    invoke.__doc__ = target.__doc__
    return Tool(invoke, takes_ctx=True, name=target.name, description=target.description)


class JournaledModel(WrapperModel):
    """A Pydantic AI model whose every request is a step of the current run (see the module
    docstring). ``name`` is the step's tool name in the journal (default ``"model"``).

    Outside a task it forwards to the wrapped model (with the history still closed).
    """

    def __init__(self, wrapped: Model | str, *, name: str = MODEL_STEP) -> None:
        super().__init__(wrapped)
        self.step_name = name

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        closed = (
            close_dangling(messages, await current_run_outcome())
            if _needs_closing(messages)
            else messages
        )

        async def ask() -> Any:
            response = await self.wrapped.request(closed, model_settings, model_request_parameters)
            return ModelMessagesTypeAdapter.dump_python([response], mode="json")

        data = await model_request(ask, name=self.step_name)
        (response,) = ModelMessagesTypeAdapter.validate_python(data)
        assert isinstance(response, ModelResponse)
        return response


def close_dangling(
    messages: Sequence[ModelMessage], *outcomes: haltwise.Outcome | None
) -> list[ModelMessage]:
    """``messages`` with every tool call closed from the journal (see the module docstring).

    A synthesized ``interrupted`` return of a call that committed becomes a ``success`` return of
    its journaled result (any other such return says what became of the call); calls of a last
    response that have no return get one, in a request of their own. What a call became is read
    from ``outcomes`` (runs' outcomes) and the in-process record of committed calls.
    """
    settled = settled_calls(*outcomes)
    fixed = [_rewrite(message, settled) for message in messages]
    open_calls = _unanswered(fixed)
    if open_calls:
        fixed.append(
            ModelRequest(parts=[_return(p, settled.get(p.tool_call_id)) for p in open_calls])
        )
    return fixed


def _needs_closing(messages: Sequence[ModelMessage]) -> bool:
    return bool(_unanswered(messages)) or any(
        isinstance(part, ToolReturnPart) and part.outcome == "interrupted"
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def _unanswered(messages: Sequence[ModelMessage]) -> list[ToolCallPart]:
    """The tool calls of the history's last message, if it is a response (nobody answered)."""
    if not messages or not isinstance(messages[-1], ModelResponse):
        return []
    return [part for part in messages[-1].parts if isinstance(part, ToolCallPart)]


def _rewrite(message: ModelMessage, settled: dict[str, SettledCall]) -> ModelMessage:
    if not isinstance(message, ModelRequest):
        return message
    parts = [
        _committed_return(part, settled[part.tool_call_id])
        if isinstance(part, ToolReturnPart)
        and part.outcome == "interrupted"
        and part.tool_call_id in settled
        else part
        for part in message.parts
    ]
    return replace(message, parts=parts)


def _committed_return(part: ToolReturnPart, call: SettledCall) -> ToolReturnPart:
    if call.status is not haltwise.StepStatus.COMMITTED:
        return replace(part, content=unsettled_text(call))
    return replace(part, content=call.result, outcome="success")


def _return(call: ToolCallPart, settled: SettledCall | None) -> ToolReturnPart:
    if settled is not None and settled.status is haltwise.StepStatus.COMMITTED:
        return ToolReturnPart(call.tool_name, settled.result, tool_call_id=call.tool_call_id)
    return ToolReturnPart(
        call.tool_name,
        unsettled_text(settled),
        tool_call_id=call.tool_call_id,
        outcome="interrupted",
    )
