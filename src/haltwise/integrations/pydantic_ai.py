"""haltwise inside Pydantic AI (CONTRACT.md, "Framework integrations").

- :func:`tool` turns a ``@haltwise.tool`` into a ``pydantic_ai.Tool`` with the tool's own
  parameters (validated by Pydantic AI as for any function tool) and its
  :attr:`~haltwise.Tool.description`; each call is one step of the current run, keyed by
  ``RunContext.tool_call_id``. The tool's exceptions propagate as Pydantic AI's own tools' do;
  ``haltwise.Cancelled`` is never turned into anything else.
- :class:`JournaledModel` wraps any model (a ``WrapperModel``): each ``request`` is one
  ``interruptible``, ``read`` step whose ``ModelResponse`` is journaled, so a resume replays the
  answers the model already gave instead of asking again. A streamed request
  (``request_stream``: ``run_stream``, ``run_stream_events``, an ``iter`` node's ``stream``) is
  a step from its start: its events reach Pydantic AI as the model sends them, a cancel while it
  streams interrupts it at once, and it is journaled with the complete response; a replay
  streams that response's parts (Pydantic AI's ``CompletedStreamedResponse``) without asking
  the model. ``AgentStream.cancel()`` (``StreamedRunResult.cancel()``) while the model streams
  is a haltwise cancel of the run (reason ``"host"``).
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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ._common import require

require("pydantic_ai", "pydantic_ai", "pydantic-ai")

from pydantic_ai import RunContext, Tool  # noqa: E402
from pydantic_ai.exceptions import RunCancelled  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    FinalResultEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelResponseStreamEvent,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import (  # noqa: E402
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

import haltwise  # noqa: E402

from ._common import (  # noqa: E402
    MODEL_STEP,
    cancel_run_for_host,
    model_request,
    record_usage,
)
from ._conversation import (  # noqa: E402
    SettledCall,
    call_tool,
    current_run_outcome,
    settled_calls,
    unsettled_text,
)
from ._streams import StreamedStep  # noqa: E402

__all__ = ["JournaledModel", "close_dangling", "tool"]

# Pydantic AI's own cancel, wherever it landed (in a step or between two), ends the run
# ``cancelled`` with reason "host" when its RunCancelled (RunTimedOut) reaches the task.
haltwise.register_host_cancel(RunCancelled)


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
        closed = await _closed(messages)

        async def ask() -> Any:
            response = await self.wrapped.request(closed, model_settings, model_request_parameters)
            _record(response)
            return _dump(response)

        return _load(await model_request(ask, name=self.step_name))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """``Model.request_stream`` (same parameters), as a step from its start (see the
        module docstring): the stream is asked for when it is first iterated."""
        closed = await _closed(messages)

        def open_stream() -> Any:
            return self.wrapped.request_stream(
                closed, model_settings, model_request_parameters, run_context
            )

        stream = _JournaledStream(
            model_request_parameters, open_stream, self.step_name, self.wrapped.model_name
        )
        try:
            yield stream
        finally:
            await stream.aclose()


def _record(response: ModelResponse) -> None:
    """Record a model response's usage (its ``RequestUsage``) with the step that asked."""
    usage = response.usage
    record_usage(response.model_name, usage.input_tokens, usage.output_tokens)


class _JournaledStream(StreamedResponse):
    """The streamed response :meth:`JournaledModel.request_stream` gives Pydantic AI.

    Iterated, it runs the model's stream as a :class:`StreamedStep` and passes its events on
    (they already carry the part-end and final-result events of the model's own stream), or,
    replayed, the journaled response's parts. ``get()`` is the response so far, then the
    journaled one.
    """

    def __init__(
        self,
        model_request_parameters: ModelRequestParameters,
        open_stream: Callable[[], Any],
        step_name: str,
        model_name: str,
    ) -> None:
        super().__init__(model_request_parameters)
        self._open_stream = open_stream
        self._step_name = step_name
        self._model_name = model_name
        self._live: StreamedResponse | None = None
        self._response: ModelResponse | None = None
        self._started = datetime.now(UTC)

    def __aiter__(self) -> AsyncIterator[ModelResponseStreamEvent]:
        if self._event_iterator is None:
            self._event_iterator = self._events()
        return self._event_iterator

    async def _events(self) -> AsyncIterator[ModelResponseStreamEvent]:
        request = StreamedStep(self._ask, name=self._step_name)
        async with aclosing(request.events()) as events:
            async for event in events:
                yield self._applied(event)
        self._response = _load(request.value)
        if request.replayed:
            replay = CompletedStreamedResponse(
                self._response,
                model_request_parameters=self.model_request_parameters,
                replay_events=True,
            )
            async for event in replay:
                yield self._applied(event)
        self._finished = True

    async def _ask(self, emit: Callable[[ModelResponseStreamEvent], None]) -> Any:
        async with self._open_stream() as live:
            self._live = live
            async for event in live:
                emit(event)
            response = live.get()
            _record(response)
            return _dump(response)

    def _applied(self, event: ModelResponseStreamEvent) -> ModelResponseStreamEvent:
        if isinstance(event, FinalResultEvent):
            self.final_result_event = event
        self._parts_manager.apply_event(event)
        return event

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        return  # never called: __aiter__ is this class's own
        yield  # pragma: no cover

    async def aclose(self) -> None:
        """Close the events' generator (a step still streaming is stopped and settled)."""
        events = self._event_iterator
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()

    async def close_stream(self) -> None:
        """``AgentStream.cancel()`` while the model streams: inside a task, a cancel of the run
        with reason ``"host"`` (the streaming step is interrupted, the run ends ``cancelled``);
        outside one, the model's stream is cancelled as Pydantic AI's own would be."""
        if self._response is not None:
            return
        if haltwise.current_task_id() is not None:
            await cancel_run_for_host()
        elif self._live is not None:
            await self._live.cancel()

    def get(self) -> ModelResponse:
        """The journaled response once there is one; before, the parts passed on so far."""
        return self._response if self._response is not None else super().get()

    def _source(self) -> ModelResponse | StreamedResponse | None:
        """What says the response's usage, model and provider: the journaled response, else
        the model's live stream."""
        return self._response if self._response is not None else self._live

    @property
    def usage(self) -> RequestUsage:
        source = self._source()
        return source.usage if source is not None else super().usage

    @property
    def model_name(self) -> str:
        source = self._source()
        return (source.model_name if source is not None else None) or self._model_name

    @property
    def provider_name(self) -> str | None:
        source = self._source()
        return source.provider_name if source is not None else None

    @property
    def provider_url(self) -> str | None:
        source = self._source()
        return source.provider_url if source is not None else None

    @property
    def timestamp(self) -> datetime:
        source = self._source()
        return source.timestamp if source is not None else self._started


def _dump(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")


def _load(data: Any) -> ModelResponse:
    (response,) = ModelMessagesTypeAdapter.validate_python(data)
    assert isinstance(response, ModelResponse)
    return response


async def _closed(messages: list[ModelMessage]) -> list[ModelMessage]:
    """The request's history closed from the journal when it needs it (see close_dangling)."""
    if not _needs_closing(messages):
        return messages
    return close_dangling(messages, await current_run_outcome())


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
