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
- The history Pydantic AI keeps is closed when a cancel stops a call: Pydantic AI keeps no
  return for such a call (a new run given the history closes it with a synthesized
  ``interrupted`` return, also a call that *committed*, a ``finish`` call allowed to end: the
  model would make it again). So once the step has settled, the tool puts the call's return
  from the journal into the run's own history (``RunContext.messages``, in the request
  Pydantic AI leaves after the call's response): a committed call's journaled result as a
  ``success`` return, any other call a text saying what became of it (``[haltwise]
  interrupted: ...``). ``all_messages()`` of ``RunCancelled``, the ``capture_run_messages``
  list and a result's messages hold it, serialised and continued in any process.
- A failed call the model saw (``ModelRetry``) replays its ``ModelRetry`` on resume (the core's
  failed-step replay; ``ModelRetry`` is registered here), so it is not called again.
- Each model request's step is fingerprinted by the request (the messages as the model reads
  them, the settings, the tools offered): a replay whose request differs fails the run with
  ``NonDeterminismError``. :class:`JournaledModel` also closes each request's history from the
  current run's journal (:func:`close_dangling`).

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

import anyio

from ._common import require

require("pydantic_ai", "pydantic_ai", "pydantic-ai")

from pydantic_ai import RunContext, Tool  # noqa: E402
from pydantic_ai._appended_messages import append_to_history  # noqa: E402
from pydantic_ai.exceptions import ModelRetry, RunCancelled  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    FinalResultEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelResponseStreamEvent,
    RetryPromptPart,
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
from ._common import call_id as call_id_scope  # noqa: E402
from ._conversation import (  # noqa: E402
    SettledCall,
    calls_in,
    current_run_outcome,
    journaled_call,
    unsettled_text,
)
from ._streams import StreamedStep  # noqa: E402

__all__ = ["JournaledModel", "close_dangling", "tool"]

# Pydantic AI's own cancel, wherever it landed (in a step or between two), ends the run
# ``cancelled`` with reason "host" when its RunCancelled (RunTimedOut) reaches the task.
haltwise.register_host_cancel(RunCancelled)
# A tool's ModelRetry the model saw replays as a ModelRetry on resume (a failed step the task
# went past replays its error): Pydantic AI hands the model the same retry prompt again.
haltwise.register_replayable_error(ModelRetry)


def tool(haltwise_tool: haltwise.Tool[..., Any]) -> Tool[Any]:
    """The haltwise tool as a ``pydantic_ai.Tool`` (see the module docstring)."""
    target = haltwise_tool

    async def invoke(ctx: RunContext[Any], /, **kwargs: Any) -> Any:
        # Pydantic AI's own cancel (or a host's) stops the step by its policy; the core records
        # the run cancelled (reason host) when RunCancelled reaches the task.
        call_id = ctx.tool_call_id
        try:
            with call_id_scope(call_id):
                return await target(**kwargs)
        except haltwise.ApprovalRefused as refused:
            return str(refused)  # refused or expired: the model reads why, the agent goes on
        except (haltwise.Cancelled, anyio.get_cancelled_exc_class()):
            if call_id:
                await _close_in_history(ctx, target.name, call_id)
            raise

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


async def _close_in_history(ctx: RunContext[Any], tool_name: str, call_id: str) -> None:
    """A cancel stopped the call ``call_id``: put its return in the run's own history.

    Pydantic AI keeps no return for a call its cancel stopped (a new run given the history
    closes it as ``interrupted``, also a call that committed: the model would make it again).
    Once the step has settled, its return from the journal goes into the history the run keeps
    (``RunContext.messages``: what ``all_messages()`` of ``RunCancelled``, ``capture_run_messages``
    and a result hold), in the request Pydantic AI leaves after the call's response: the
    journaled result of a committed call, a text saying what became of any other.
    """
    part = _return_of(tool_name, call_id, await journaled_call(call_id))
    history = ctx.messages
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, ModelResponse):
            break
        if isinstance(message, ModelRequest):  # the request being assembled, if it is there
            history[index] = replace(message, parts=[*message.parts, part])
            return
    append_to_history(ctx, ModelRequest(parts=[part]))


def _return_of(tool_name: str, call_id: str, call: SettledCall | None) -> ToolReturnPart:
    """The return a stopped call gets: its journaled result, or a text saying what it became."""
    if call is not None and call.status is haltwise.StepStatus.COMMITTED:
        return ToolReturnPart(tool_name, call.result, tool_call_id=call_id)
    return ToolReturnPart(
        tool_name, unsettled_text(call), tool_call_id=call_id, outcome="interrupted"
    )


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

        asked = _request_view(closed, model_settings, model_request_parameters)
        return _load(
            await model_request(ask, name=self.step_name, request=asked, model=self.model_name)
        )

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
            model_request_parameters,
            open_stream,
            self.step_name,
            self.wrapped.model_name,
            _request_view(closed, model_settings, model_request_parameters),
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
        asked: Any,
    ) -> None:
        super().__init__(model_request_parameters)
        self._asked = asked
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
        request = StreamedStep(
            self._ask, name=self._step_name, request=self._asked, model=self.model_name
        )
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


#: what a message of the history is to the model (its timestamps, run ids, usage are not)
_MESSAGE_KEYS = ("kind", "instructions", "parts")
#: what a part of a message is to the model
_PART_KEYS = ("part_kind", "content", "tool_name", "args", "tool_call_id", "outcome")


def _request_view(
    messages: Sequence[ModelMessage],
    settings: ModelSettings | None,
    parameters: ModelRequestParameters,
) -> Any:
    """What a request asks the model, for its fingerprint: the messages as the model reads them
    (no timestamps, run ids or usage, which differ between attempts), the settings, and the
    request parameters (the tools offered, the output wanted)."""
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return {
        "messages": [
            {
                **{key: message.get(key) for key in _MESSAGE_KEYS if key != "parts"},
                "parts": [
                    {key: part[key] for key in _PART_KEYS if part.get(key) is not None}
                    for part in message.get("parts", ())
                ],
            }
            for message in dumped
        ],
        "settings": dict(settings or {}),
        "parameters": parameters,
    }


def _dump(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")


def _load(data: Any) -> ModelResponse:
    (response,) = ModelMessagesTypeAdapter.validate_python(data)
    assert isinstance(response, ModelResponse)
    return response


async def _closed(messages: list[ModelMessage]) -> list[ModelMessage]:
    """The request's history closed from the current run's journal when it needs it (see
    close_dangling)."""
    if not _needs_closing(messages):
        return messages
    return close_dangling(messages, await current_run_outcome())


def close_dangling(
    messages: Sequence[ModelMessage], *outcomes: haltwise.Outcome | None
) -> list[ModelMessage]:
    """``messages`` with every tool call closed from the runs' journals (``outcomes``).

    A synthesized ``interrupted`` return of a call that one of ``outcomes`` journaled becomes
    the return that call earned: a ``success`` return of its journaled result if it committed,
    else a text saying what became of it. Calls of the last response that have no return get
    one, in the request Pydantic AI left after it (``state='interrupted'``), else in a request of
    their own. Only the outcomes say what became of a call: the same history and outcomes give
    the same messages in every process. (A history saved after a cancel needs none of this: the
    tools of :func:`tool` put each stopped call's return in it.)
    """
    settled = calls_in(*outcomes)
    fixed = [_rewrite(message, settled) for message in messages]
    open_calls = _unanswered(fixed)
    if open_calls:
        returns = [_return(call, settled.get(call.tool_call_id)) for call in open_calls]
        last = fixed[-1]
        if isinstance(last, ModelRequest) and last.state == "interrupted":
            fixed[-1] = replace(last, parts=[*last.parts, *returns])
        else:
            fixed.append(ModelRequest(parts=returns))
    return fixed


def _needs_closing(messages: Sequence[ModelMessage]) -> bool:
    return bool(_unanswered(messages)) or any(
        isinstance(part, ToolReturnPart) and part.outcome == "interrupted"
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def _unanswered(messages: Sequence[ModelMessage]) -> list[ToolCallPart]:
    """The tool calls of the history's last response that no request after it answers."""
    for index in range(len(messages) - 1, -1, -1):
        response = messages[index]
        if isinstance(response, ModelResponse):
            break
    else:
        return []
    answered = {
        part.tool_call_id
        for message in messages[index + 1 :]
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    }
    return [
        part
        for part in response.parts
        if isinstance(part, ToolCallPart) and part.tool_call_id not in answered
    ]


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
