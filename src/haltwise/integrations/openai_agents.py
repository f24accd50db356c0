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
- The SDK's own cancel (``RunResultStreaming.cancel()``, a ``Task.cancel()`` of the run, a
  timeout) that lands in a tool call or a model request is settled there by the step's policy (a
  ``finish`` call finishes, a ``rollback`` call is compensated) and cancels the run with reason
  ``"host"``: the run ends ``cancelled``, not ``completed``. A streamed run's ``cancel()`` just
  ends ``stream_events()`` in the SDK, with no exception, so a task that returns right after the
  stream would complete: start streamed runs with :func:`run_streamed`, whose stream raises
  :class:`haltwise.Cancelled` (reason ``"host"``) when it ends because of ``cancel()``.
- :func:`conversation` is the conversation of a :func:`run_streamed` result, completed: after
  an immediate ``cancel()`` the SDK's ``to_input_list()`` lacks the cancelled turn (the model's
  calls and their results); this adds the turn's calls back from what the model answered, each
  with its result.
- :func:`close_dangling` gives every ``function_call`` of a conversation (``to_input_list()``) a
  ``function_call_output``: the journaled result for a committed call, a text saying what
  happened for an interrupted, compensated or unknown one. :class:`JournaledModel` applies it to
  each request's input, so no request ever carries a call without a result.

Needs the ``openai-agents`` extra: ``pip install 'haltwise[openai-agents]'``.
"""

from __future__ import annotations

import contextvars
import json
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from ._common import require

require("openai_agents", "agents", "openai-agents")

from agents import Agent, FunctionTool, Model, ModelResponse, Runner  # noqa: E402
from agents.function_schema import function_schema  # noqa: E402
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent  # noqa: E402
from agents.result import RunResultStreaming  # noqa: E402
from agents.stream_events import StreamEvent  # noqa: E402
from agents.tool import default_tool_error_function  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import Response, ResponseCompletedEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

import haltwise  # noqa: E402

from ._common import (  # noqa: E402
    MODEL_STEP,
    cancel_run_for_host,
    model_request,
    record_usage,
)
from ._conversation import (  # noqa: E402
    call_tool,
    settled_calls,
    unsettled_text,
)
from ._streams import StreamedStep  # noqa: E402

__all__ = ["JournaledModel", "close_dangling", "conversation", "function_tool", "run_streamed"]

_OUTPUT_ITEMS: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])

#: The model turns of the streamed run being driven in this context (set by run_streamed): the
#: output items of every response a JournaledModel returned, in order, as JSON.
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
        try:
            value = await call_tool(tool, ctx.tool_call_id, *args, **kwargs)
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
        args, kwargs = _closed_input(args, kwargs)

        async def ask() -> dict[str, Any]:
            response = await self.model.get_response(*args, **kwargs)
            usage = response.usage
            record_usage(self.model, usage.input_tokens, usage.output_tokens)
            return _dump_response(response)

        data = await self._journaled(ask)
        _record_turn(data["output"])
        return _load_response(data)

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        """``Model.stream_response`` (same parameters), as a step from its start.

        The model's events reach the runner as they arrive; the step is journaled with the
        completed response when the stream ends. A replay yields that response's
        ``response.completed`` event alone, without asking the model.
        """
        args, kwargs = _closed_input(args, kwargs)

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

        request = StreamedStep(ask, name=self.name)
        async with aclosing(request.events()) as events:
            async for event in events:
                yield event
        if request.replayed:
            yield ResponseCompletedEvent(
                type="response.completed",
                response=Response.model_validate(request.value),
                sequence_number=0,
            )
        _record_turn(request.value["output"])

    async def _journaled(self, ask: Any) -> Any:
        return await model_request(ask, name=self.name)

    async def close(self) -> None:
        await self.model.close()


def _closed_input(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The request's arguments with its ``input`` (the second parameter) passed through
    :func:`close_dangling`."""
    if "input" in kwargs:
        return args, {**kwargs, "input": close_dangling(kwargs["input"])}
    if len(args) > 1:
        return (args[0], close_dangling(args[1]), *args[2:]), kwargs
    return args, kwargs


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

    async def stream_events() -> AsyncIterator[StreamEvent]:
        async for event in sdk_stream():
            yield event
        if asked:
            await cancel_run_for_host()
            await haltwise.checkpoint()

    result.cancel = cancel  # type: ignore[method-assign]
    result.stream_events = stream_events  # type: ignore[method-assign]
    return result


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
    items: list[Any] = list(result.to_input_list())
    present = {_field(item, "call_id") for item in items if _field(item, "type") == "function_call"}
    for turn in _TURNS_OF.get(id(result), []):
        calls = {item.get("call_id") for item in turn if item.get("type") == "function_call"}
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
    if isinstance(items, str):
        return items
    answered = {
        _field(item, "call_id") for item in items if _field(item, "type") == "function_call_output"
    }
    calls = {_field(item, "call_id") for item in items if _field(item, "type") == "function_call"}
    if calls <= answered:
        return items  # the common case: nothing to look up
    settled = settled_calls(outcome)
    fixed: list[Any] = []
    for item in items:
        fixed.append(item)
        if _field(item, "type") != "function_call" or _field(item, "call_id") in answered:
            continue
        cid = str(_field(item, "call_id"))
        step = settled.get(cid)
        output = (
            _as_output(step.result)
            if step is not None and step.status is haltwise.StepStatus.COMMITTED
            else unsettled_text(step)
        )
        fixed.append({"type": "function_call_output", "call_id": cid, "output": output})
    return fixed


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)
