"""haltwise inside the OpenAI Agents SDK (CONTRACT.md, "Framework integrations").

- :func:`function_tool` turns a ``@haltwise.tool`` into an ``agents.FunctionTool``: a strict-mode
  schema from the tool's signature, the cancel policy in the description, and each invocation one
  step of the current run, keyed by ``ToolContext.tool_call_id`` (so parallel calls of one turn
  replay by id, whatever order they start in). An ordinary exception of the tool is a ``failed``
  step and, as the SDK's own ``function_tool`` does, a model-visible error text; haltwise's own
  exceptions (``Cancelled``, ``HaltwiseError``) are never turned into text: they stop the run.
- :class:`JournaledModel` wraps any ``agents.Model``: each model request (``get_response`` or
  ``stream_response``) is one ``interruptible``, ``read`` step whose response is journaled, so a
  resume replays the answers the model already gave instead of asking again. A streamed request
  is a step from its start: its events reach the runner as the model sends them, a cancel while
  it streams interrupts it at once, and it is journaled with the completed response (a replay
  yields that response's ``response.completed`` event alone).
- A haltwise cancel (``haltwise cancel``, a deadline, ``handle.cancel()``) while the SDK runs a
  turn of tool calls is a cooperative stop: each call settles by its policy and returns its
  result to the SDK (a committed call its journaled result, any other a text saying what became
  of it, ``[haltwise] interrupted: ...``), the SDK completes the turn and writes it to the
  ``Session`` (and its run items) as it writes any turn, and the cancel lands at the next model
  request (the task's scope is held meanwhile; a forced cancel is not held). So the session and
  ``to_input_list()`` hold every call with its result, written by the SDK itself.
- The SDK's own cancel (``RunResultStreaming.cancel()``, a ``Task.cancel()`` of the run, a
  timeout) that lands in a tool call or a model request is settled there by the step's policy (a
  ``finish`` call finishes, a ``rollback`` call is compensated) and cancels the run with reason
  ``"host"``: the run ends ``cancelled``, not ``completed``. A streamed run's ``cancel()`` just
  ends ``stream_events()`` in the SDK, with no exception, and an immediate one drops the turn it
  cut: start streamed runs with :func:`run_streamed`, whose stream, once ``cancel()`` ended it,
  waits for the steps to settle, adds the dropped turn (the model's calls, each with its result
  from the journal) to the ``session`` passed to it and to the result's ``to_input_list()``,
  then raises :class:`haltwise.Cancelled` (reason ``"host"``).
- A failed call the model saw (the error text the SDK gives it) replays its error on resume
  (the core's failed-step replay), so the same text reaches the model and the call is not made
  again.
- Each model request's step is fingerprinted by the request (instructions, input, settings,
  tools, handoffs, output schema): a replay whose request differs fails the run with
  ``NonDeterminismError``.
- :func:`conversation` is ``to_input_list()`` completed the same way, for any result.
- :func:`close_dangling` gives every ``function_call`` of a conversation (``to_input_list()``) a
  ``function_call_output`` from the outcome given (the journaled result of a committed call, a
  text saying what happened for an interrupted, compensated or unknown one): the same in every
  process. :class:`JournaledModel` applies it to each request's input with the current run's
  journal, so no request ever carries a call without a result.

Needs the ``openai-agents`` extra: ``pip install 'haltwise[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

import anyio

from ._common import require

require("openai_agents", "agents", "openai-agents")

from agents import Agent, FunctionTool, Model, ModelResponse, Runner, Session  # noqa: E402
from agents.function_schema import function_schema  # noqa: E402
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent  # noqa: E402
from agents.result import RunResult, RunResultStreaming  # noqa: E402
from agents.run import (  # noqa: E402
    AgentRunner,
    get_default_agent_runner,
    set_default_agent_runner,
)
from agents.stream_events import StreamEvent  # noqa: E402
from agents.tool import default_tool_error_function  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import Response, ResponseCompletedEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

import haltwise  # noqa: E402

from .._runtime.task_api import end_turn, steps_settled, turn_begins  # noqa: E402
from ._agents_session import session_for_attempt  # noqa: E402
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

__all__ = ["JournaledModel", "close_dangling", "conversation", "function_tool", "run_streamed"]

_OUTPUT_ITEMS: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])

#: The model turns of the SDK run being driven in this context (set by run_streamed and by
#: Runner.run inside a task): the output items of every response a JournaledModel returned, in
#: order, as JSON.
_TURNS: contextvars.ContextVar[list[list[dict[str, Any]]] | None] = contextvars.ContextVar(
    "haltwise_agents_turns", default=None
)
#: The turns of each live result of run_streamed, by id(result) (dropped with the result).
_TURNS_OF: dict[int, list[list[dict[str, Any]]]] = {}


def function_tool(tool: haltwise.Tool[..., Any]) -> FunctionTool:
    """The haltwise tool as an ``agents.FunctionTool`` (see the module docstring).

    The tool's own signature gives the strict JSON schema (``agents.function_schema``); its
    :attr:`~haltwise.Tool.description` (docstring plus what a cancel does) is the description.
    Arguments that do not fit the schema are answered with a model-visible error text and no
    step is made.
    """
    schema = function_schema(tool, name_override=tool.name, description_override=tool.description)

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        try:
            parsed = schema.params_pydantic_model(**json.loads(arguments or "{}"))
        except (ValueError, TypeError) as error:
            return f"Invalid arguments for tool {tool.name!r}: {error}"
        args, kwargs = schema.to_call_args(parsed)
        call_id = ctx.tool_call_id
        try:
            with call_id_scope(call_id):
                value = await tool(*args, **kwargs)
        except (haltwise.Cancelled, asyncio.CancelledError):
            if not haltwise.cancel_requested():
                raise  # the SDK's own cancel, or a host's: the turn stops with it
            # A haltwise cancel stopped the call (its step has settled by its policy): the SDK
            # gets the call's result from the journal and completes the turn (see JournaledModel).
            return _output_of(await journaled_call(call_id) if call_id else None)
        except haltwise.ReplayedError as error:
            return default_tool_error_function(ctx, error)  # a failed call the model saw
        except haltwise.ApprovalRefused as refused:
            return str(refused)  # refused or expired: the model reads why, the agent goes on
        except haltwise.HaltwiseError:
            raise
        except Exception as error:
            return default_tool_error_function(ctx, error)
        return _as_output(value)

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=invoke,
        strict_json_schema=True,
    )


def _as_output(value: Any) -> Any:
    return value if isinstance(value, str) else json.dumps(value)


def _output_of(call: SettledCall | None) -> Any:
    """A call's output as the model reads it: its journaled result if it committed, else a text
    saying what became of it. The same in every process."""
    if call is not None and call.status is haltwise.StepStatus.COMMITTED:
        return _as_output(call.result)
    return unsettled_text(call)


class JournaledModel(Model):
    """An ``agents.Model`` whose every request is a step of the current run (see the module
    docstring). ``name`` is the step's tool name in the journal (default ``"model"``).

    Outside a task it simply forwards to the wrapped model.
    """

    def __init__(self, model: Model, *, name: str = MODEL_STEP) -> None:
        self.model = model
        self.name = name

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """``Model.get_response`` (same parameters), as a step; its input closed first."""
        end_turn()  # a cancel held back while the SDK completed the last turn lands here
        args, kwargs = await _closed_input(args, kwargs)

        async def ask() -> dict[str, Any]:
            response = await self.model.get_response(*args, **kwargs)
            usage = response.usage
            record_usage(self.model, usage.input_tokens, usage.output_tokens)
            return _dump_response(response)

        data = await model_request(
            ask, name=self.name, request=_request_view(args, kwargs), model=self.model
        )
        _record_turn(data["output"])
        _turn_with_calls(data["output"])
        return _load_response(data)

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        """``Model.stream_response`` (same parameters), as a step from its start.

        The model's events reach the runner as they arrive; the step is journaled with the
        completed response when the stream ends. A replay yields that response's
        ``response.completed`` event alone, without asking the model.
        """
        end_turn()
        args, kwargs = await _closed_input(args, kwargs)

        async def ask(emit: Callable[[TResponseStreamEvent], None]) -> dict[str, Any]:
            completed: Response | None = None
            stream = self.model.stream_response(*args, **kwargs)
            try:
                async for event in stream:
                    emit(event)
                    if isinstance(event, ResponseCompletedEvent):
                        completed = event.response
            finally:
                await _aclose(stream)
            if completed is None:
                raise haltwise.HaltwiseError("the model's stream ended with no completed response")
            usage = completed.usage
            if usage is not None:
                record_usage(completed.model or self.model, usage.input_tokens, usage.output_tokens)
            return completed.model_dump(mode="json")

        request = StreamedStep(
            ask, name=self.name, request=_request_view(args, kwargs), model=self.model
        )
        async with aclosing(request.events()) as events:
            async for event in events:
                yield event
        _record_turn(request.value["output"])
        _turn_with_calls(request.value["output"])
        if request.replayed:
            yield ResponseCompletedEvent(
                type="response.completed",
                response=Response.model_validate(request.value),
                sequence_number=0,
            )

    async def close(self) -> None:
        await self.model.close()


def _turn_with_calls(output: list[dict[str, Any]]) -> None:
    """A response that calls tools begins a turn the SDK completes (runs the calls, writes the
    turn to the session) before a haltwise cancel lands: the calls settle by their policies and
    return their results (see function_tool), and the next request lands the cancel."""
    if any(item.get("type") == "function_call" for item in output):
        turn_begins()


#: Model.get_response's parameters, to read a request's arguments by name
_REQUEST = inspect.signature(Model.get_response)


def _request_view(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a request asks the model, for its fingerprint: the instructions, the input, the
    settings, the tools and handoffs offered, the output wanted, the conversation it continues."""
    asked = _REQUEST.bind(None, *args, **kwargs).arguments
    settings = asked.get("model_settings")
    output = asked.get("output_schema")
    return {
        "instructions": asked.get("system_instructions"),
        "input": asked.get("input"),
        "settings": settings.to_json_dict() if settings is not None else None,
        "tools": [
            [tool.name, getattr(tool, "params_json_schema", None)]
            for tool in asked.get("tools") or ()
        ],
        "handoffs": [handoff.tool_name for handoff in asked.get("handoffs") or ()],
        "output": None if output is None or output.is_plain_text() else output.json_schema(),
        "previous_response_id": asked.get("previous_response_id"),
        "conversation_id": asked.get("conversation_id"),
        "prompt": asked.get("prompt"),
    }


async def _closed_input(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The request's arguments with its ``input`` (the second parameter) closed from the current
    run's journal (:func:`close_dangling`), when it has a call without an output."""
    if "input" in kwargs:
        items = kwargs["input"]
    elif len(args) > 1:
        items = args[1]
    else:
        return args, kwargs
    if isinstance(items, str) or not _dangling(items):
        return args, kwargs
    closed = close_dangling(items, await current_run_outcome())
    if "input" in kwargs:
        return args, {**kwargs, "input": closed}
    return (args[0], closed, *args[2:]), kwargs


async def _aclose(stream: AsyncIterator[Any]) -> None:
    """Close a model's event stream that stopped early (an async generator, usually)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "output": _OUTPUT_ITEMS.dump_python(response.output, mode="json"),
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        },
        "response_id": response.response_id,
    }


def _load_response(data: Mapping[str, Any]) -> ModelResponse:
    return ModelResponse(
        output=_OUTPUT_ITEMS.validate_python(data["output"]),
        usage=Usage(**data["usage"]),
        response_id=data["response_id"],
    )


class _SessionKeepingRunner(AgentRunner):
    """The SDK's runner behind ``Runner.run``, installed by this module around the one it found
    (``agents.run.set_default_agent_runner``): inside a task, a run that a cancel stops still
    leaves its ``session`` holding every call with its result, and its turn of tool calls holds
    a cancel back no longer than the run itself. Outside a task it is the runner it wraps.

    A cancel haltwise did not request (``asyncio.wait_for`` or ``Task.cancel()`` around
    ``Runner.run``) cuts the SDK's turn: it raises out of the turn before the SDK writes it to
    the session, so the model's calls (a ``finish`` charge that committed, too) would be missing
    from it and a new run on the session would make them again. When a cancel (the host's or
    haltwise's) ends the run, the runner waits for the run's steps to settle by their policies,
    then writes to the session the model turns of this run it lacks, each call closed from the
    journal (:func:`close_dangling`), shielded from the cancel it then re-raises: the same text
    in every process. A run the SDK completed, or whose turn it wrote itself (haltwise's
    cooperative stop), adds nothing. When the run returns (``tool_use_behavior=
    "stop_on_first_tool"`` ends it with no model request after a tool turn), the turn's hold
    ends too: a cancel held back meanwhile lands at the task's next await.

    A run given a ``session`` journals the session's length as a step of its own
    (``"session"``) when it begins; resumed, it reads the session as it was then and does not
    write again what its earlier attempt wrote (:func:`._agents_session.session_for_attempt`).
    """

    def __init__(self, inner: AgentRunner) -> None:
        super().__init__()
        self.inner = inner

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        if haltwise.current_task_id() is None:
            return await self.inner.run(starting_agent, input, **kwargs)
        if kwargs.get("session") is not None:
            kwargs["session"] = await session_for_attempt(kwargs["session"])
        turns = list[list[dict[str, Any]]]()
        token = _TURNS.set(turns)
        try:
            return await self.inner.run(starting_agent, input, **kwargs)
        except (asyncio.CancelledError, haltwise.Cancelled):
            with anyio.CancelScope(shield=True):  # the cancel must not cut the write
                await steps_settled()
                await _write_dropped_turns(kwargs.get("session"), turns)
            raise
        finally:
            _TURNS.reset(token)
            end_turn()

    def run_streamed(
        self, starting_agent: Agent[Any], input: Any, **kwargs: Any
    ) -> RunResultStreaming:
        return self.inner.run_streamed(starting_agent, input, **kwargs)  # see run_streamed


async def _write_dropped_turns(session: Session | None, turns: list[list[dict[str, Any]]]) -> None:
    """Add to ``session`` the model turns of ``turns`` it lacks, with every call closed from the
    current run's journal (see :class:`_SessionKeepingRunner`)."""
    if session is None or not any(_calls(turn) for turn in turns):
        return
    kept = await session.get_items()
    await _add_to_session(session, kept, _completed(kept, turns, await current_run_outcome()))


def _calls(turn: list[dict[str, Any]]) -> set[Any]:
    """The call ids of a model turn's function calls."""
    return {item.get("call_id") for item in turn if item.get("type") == "function_call"}


if not isinstance(get_default_agent_runner(), _SessionKeepingRunner):
    set_default_agent_runner(_SessionKeepingRunner(get_default_agent_runner()))


def run_streamed(
    agent: Agent[Any], input: str | list[TResponseInputItem], **kwargs: Any
) -> RunResultStreaming:
    """``Runner.run_streamed(agent, input, **kwargs)``, whose own ``cancel()`` cancels the run.

    Inside a task, when the stream ends because ``cancel()`` was called (either mode), the run is
    cancelled with reason ``"host"`` and ``stream_events()`` raises :class:`haltwise.Cancelled`
    instead of ending quietly; the steps in flight were settled by their policies. Outside a task
    it behaves exactly as the SDK's.
    """
    # The SDK's run loop task is created here and copies this context: the model's responses
    # in it are recorded for conversation(result).
    context, turns = contextvars.copy_context(), list[list[dict[str, Any]]]()
    context.run(_TURNS.set, turns)
    result = context.run(lambda: Runner.run_streamed(agent, input, **kwargs))
    _TURNS_OF[id(result)] = turns
    weakref.finalize(result, _TURNS_OF.pop, id(result), None)
    sdk_cancel, sdk_stream = result.cancel, result.stream_events
    asked: list[str] = []

    def cancel(mode: Any = "immediate") -> None:
        asked.append(mode)
        sdk_cancel(mode)

    sdk_input_list = result.to_input_list
    closed: list[list[TResponseInputItem]] = []

    async def stream_events() -> AsyncIterator[StreamEvent]:
        async for event in sdk_stream():
            yield event
        if asked:
            await cancel_run_for_host()
            with anyio.CancelScope(shield=True):  # the run's cancel must not cut the writes
                await steps_settled()
                kept = sdk_input_list()
                items = _completed(kept, turns, await current_run_outcome())
                closed.append(items)
                await _add_to_session(kwargs.get("session"), kept, items)
            await haltwise.checkpoint()

    def to_input_list(*args: Any, **kwargs: Any) -> list[TResponseInputItem]:
        return list(closed[-1]) if closed else sdk_input_list(*args, **kwargs)

    result.cancel = cancel  # type: ignore[method-assign]
    result.stream_events = stream_events  # type: ignore[method-assign]
    result.to_input_list = to_input_list  # type: ignore[method-assign]
    return result


async def _add_to_session(
    session: Session | None, kept: list[TResponseInputItem], items: list[TResponseInputItem]
) -> None:
    """Write to ``session`` the items of ``items`` that the SDK's own list ``kept`` lacks (the
    turn an immediate ``cancel()`` dropped, and the outputs of its calls), in order."""
    if session is None:
        return
    had = {id(item) for item in kept}
    missing = [item for item in items if id(item) not in had]
    if missing:
        await session.add_items(missing)


def _record_turn(output: list[dict[str, Any]]) -> None:
    """Note a model response's output items for the streamed run of this context, if any."""
    turns = _TURNS.get()
    if turns is not None:
        turns.append(output)


def conversation(
    result: RunResultStreaming, outcome: haltwise.Outcome | None = None
) -> list[TResponseInputItem]:
    """The run's conversation with every model turn and every call's result:
    ``result.to_input_list()``, completed.

    After an immediate ``cancel()`` the SDK's ``to_input_list()`` holds nothing of the turn it
    cancelled: neither the model's calls nor their results, also of a call that committed (a
    ``finish`` charge allowed to end), so a model given that list would make the charge again.
    For a result of :func:`run_streamed`, every model response of the run that the list lacks
    (a response with calls none of which the list has) is added in order, as the model gave it
    (its output items as JSON, ``None`` fields left out); then :func:`close_dangling` gives each
    call without a result one: the journaled result of a committed call, a text saying so for
    an interrupted, compensated or unknown one. ``outcome`` is the run's outcome (from
    ``handle.outcome()``), which says what became of calls this process did not see commit;
    without it such calls read as interrupted. For a result not made by :func:`run_streamed`
    it is ``close_dangling(result.to_input_list(), outcome)``.
    """
    return _completed(result.to_input_list(), _TURNS_OF.get(id(result), []), outcome)


def _completed(
    kept: list[TResponseInputItem],
    turns: list[list[dict[str, Any]]],
    outcome: haltwise.Outcome | None,
) -> list[TResponseInputItem]:
    """``kept`` with the model turns it lacks (those of ``turns``, the run's responses, with
    calls none of which it has), then every call closed from ``outcome`` (see conversation)."""
    items: list[Any] = list(kept)
    present = {_field(item, "call_id") for item in items if _field(item, "type") == "function_call"}
    for turn in turns:
        calls = _calls(turn)
        if calls and not calls & present:
            items.extend({k: v for k, v in item.items() if v is not None} for item in turn)
            present |= calls
    closed: list[TResponseInputItem] = close_dangling(items, outcome)
    return closed


def close_dangling(
    items: str | list[TResponseInputItem], outcome: haltwise.Outcome | None = None
) -> Any:
    """``items`` with a ``function_call_output`` after every ``function_call`` that has none.

    The output of a call is, from ``outcome`` (the run's outcome, when given) or from what this
    process saw settle: the journaled result of a committed call (as the tool would have
    returned it to the model), otherwise a text saying the call was interrupted, compensated or
    of unknown effect because the run was cancelled. A string input is returned unchanged.
    """
    if isinstance(items, str) or not _dangling(items):
        return items  # the common case: nothing to look up
    answered = {
        _field(item, "call_id") for item in items if _field(item, "type") == "function_call_output"
    }
    settled = calls_in(outcome)
    fixed: list[Any] = []
    for item in items:
        fixed.append(item)
        if _field(item, "type") != "function_call" or _field(item, "call_id") in answered:
            continue
        cid = str(_field(item, "call_id"))
        output = _output_of(settled.get(cid))
        fixed.append({"type": "function_call_output", "call_id": cid, "output": output})
    return fixed


def _dangling(items: list[Any]) -> bool:
    """Whether a ``function_call`` of ``items`` has no ``function_call_output``."""
    answered = {
        _field(item, "call_id") for item in items if _field(item, "type") == "function_call_output"
    }
    return any(
        _field(item, "type") == "function_call" and _field(item, "call_id") not in answered
        for item in items
    )


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)
