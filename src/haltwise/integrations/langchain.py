"""haltwise inside LangChain / LangGraph (CONTRACT.md, "Framework integrations").

- :func:`tool` turns a ``@haltwise.tool`` into a ``StructuredTool`` (the coroutine is the
  haltwise tool; the arguments schema comes from its signature; the description is
  :attr:`~haltwise.Tool.description`). Each call is one step of the current run keyed by the
  ``ToolCall``'s ``id`` (injected as LangChain's ``InjectedToolCallId``).
- :class:`HaltwiseMiddleware` for ``langchain.agents.create_agent(..., middleware=[...])``:
  every model call is one ``interruptible``, ``read`` step whose ``AIMessage`` is journaled (a
  resume replays it instead of asking the model again; the step's fingerprint is a digest of the
  request: messages, system message, tools offered, tool choice, settings, so a replay whose
  request differs fails with ``NonDeterminismError``); every tool call runs under
  ``haltwise.call_id(tool_call["id"])``, and a tool that is not a haltwise tool becomes a step
  of its own (undeclared policy: it behaves as ``finish``); before each model call, a tool call
  of the conversation that has no ``ToolMessage`` gets one from the journal (a committed call
  its journaled result, any other a text saying what became of it), right after its
  ``AIMessage``.
- A haltwise cancel drains the graph (LangGraph's ``RunControl.request_drain``): from the
  first model or tool call the middleware sees in a graph run until the run ends, a (not
  forced) cancel requests the drain and holds back the cancel of the task's scope
  (:func:`haltwise._runtime.task_api.cooperative_stop`); each tool call in flight settles by
  its policy and returns its ``ToolMessage`` (its journaled result if committed, else a text
  saying what became of it), so LangGraph completes the superstep, writes the thread's
  checkpoint with every call closed, and raises ``GraphDrained`` (registered as a host cancel:
  the run ends ``cancelled`` with the cancel's reason). A model call in flight is interrupted
  and its node raises ``GraphDrained``. A new run continuing the thread, in any process, never
  repeats a committed call.
- LangGraph's own cancel (cancelling the task that runs ``ainvoke``/``astream``) reaches the tool
  calls and the model call in flight: each settles by its policy, each tool call's node saves its
  ``ToolMessage`` (as above) as the task's output in the checkpoint before it ends (LangGraph's
  cut loop would not), and the run is cancelled with reason ``"host"``. A node LangGraph cancels
  because a task of the same superstep failed is no host cancel: the run fails with that failure.
- A failed call the agent went past replays its journaled error on resume; one whose type cannot
  be rebuilt (``haltwise.ReplayedError``) is raised as an ``Exception`` of the same type name and
  text, so LangChain's error handlers write the same text for the model as the first time.

Needs the ``langchain`` extra: ``pip install 'haltwise[langchain]'``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from ._common import require

require("langchain", "langchain.agents", "langchain")

import anyio  # noqa: E402
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
from langchain_core.tools import (  # noqa: E402
    BaseTool,
    InjectedToolCallId,
    StructuredTool,
    ToolException,
)
from langgraph.errors import GraphDrained  # noqa: E402
from langgraph.prebuilt.tool_node import ToolCallRequest  # noqa: E402
from langgraph.runtime import RunControl, Runtime, get_runtime  # noqa: E402
from langgraph.types import Command  # noqa: E402

import haltwise  # noqa: E402

from .._runtime.task_api import (  # noqa: E402
    body_cancelled_by_host,
    cooperative_stop,
    end_cooperative_stop,
    sibling_failed,
)
from ._common import (  # noqa: E402
    MODEL_STEP,
    call_id,
    cancel_run_for_host,
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
from ._langgraph_tasks import save_as_finished, superstep_task_failed  # noqa: E402

__all__ = ["HaltwiseMiddleware", "close_dangling", "tool"]

#: ``StructuredTool.metadata`` key marking a tool made by :func:`tool`
_MARK = "haltwise"
#: the reason a graph drained by a haltwise cancel gives (``GraphDrained.reason``)
DRAIN_REASON = "haltwise-cancel"
#: how long a graph asked to drain may stay busy with no haltwise step in flight before the
#: run's cancel cuts it (it normally drains at once: this only bounds a graph that does not)
DRAIN_MARGIN = 5.0

# A drained graph raises GraphDrained out of ainvoke/astream: a cancel, never a failure.
haltwise.register_host_cancel(GraphDrained)
# A tool's ToolException (LangChain's "tell the model" error) replays as itself on resume.
haltwise.register_replayable_error(ToolException)


def tool(haltwise_tool: haltwise.Tool[..., Any]) -> BaseTool:
    """The haltwise tool as a LangChain ``StructuredTool`` (see the module docstring)."""
    target = haltwise_tool

    async def invoke(tool_call_id: str | None = None, **kwargs: Any) -> Any:
        try:
            return _content(await call_tool(target, tool_call_id, **kwargs))
        except haltwise.ApprovalRefused as refused:
            return str(refused)  # refused or expired: the model reads why, the agent goes on
        except haltwise.ReplayedError as replayed:
            raise _as_journaled(replayed) from None

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

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """The graph run ends: a later cancel of the haltwise run no longer waits for it."""
        _stop_draining(runtime.control)
        return None

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        _drain_on_cancel(request.runtime)
        if _open_calls(request.messages):
            closed = close_dangling(request.messages, await current_run_outcome())
            request = request.override(messages=closed)

        async def ask() -> list[dict[str, Any]]:
            response = await handler(request)
            for message in response.result:
                _record(message, request.model)
            return [message_to_dict(message) for message in response.result]

        try:
            data = await model_request(
                ask, name=self.step_name, request=_request_view(request), model=request.model
            )
        except (haltwise.Cancelled, asyncio.CancelledError) as stop:
            if _draining(request.runtime):
                # the model's answer is not needed: the graph stops at this superstep's start
                raise GraphDrained(DRAIN_REASON) from None
            if _cut_by_host(stop):
                await _host_stop(request.runtime)
            raise
        return ModelResponse(result=messages_from_dict(data))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        runtime = getattr(request.runtime, "runtime", None) or _graph_runtime()
        _drain_on_cancel(runtime)
        ours = request.tool is not None and bool((request.tool.metadata or {}).get(_MARK))
        cid = request.tool_call.get("id") or ""
        try:
            with call_id(cid):
                if ours:
                    return await handler(request)
                return await _foreign_tool_step(request, handler)
        except (haltwise.Cancelled, asyncio.CancelledError) as stop:
            if cid and _draining(runtime):
                # A haltwise cancel stopped the call and the graph drains: the call gets its
                # result (what the journal says became of it) so that the superstep, and the
                # checkpoint LangGraph writes for it, hold it.
                return await _closed_call(cid, request.tool_call["name"])
            if not _cut_by_host(stop):
                raise
            if not cid:
                await _host_stop(runtime)
                raise
        # The host cut the graph run: its loop is gone and will write no checkpoint for this
        # call, so the call's result is saved as this task's writes before the node ends.
        closed = await _closed_call(cid, request.tool_call["name"])
        await save_as_finished(closed, getattr(runtime, "execution_info", None))
        await _host_stop(runtime)
        return closed


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
    """A tool that is not a haltwise tool, as one step (undeclared policy) of its tool's name.

    The step is the tool's own run (its ``ainvoke``), not the rest of the chain: an inner
    middleware's ``interrupt()`` (``HumanInTheLoopMiddleware``'s approval) happens outside any
    step, so it is not journaled as a failure, and a resume with the approval runs the tool as
    the call's one step."""
    if request.tool is None:
        return await handler(request)
    return await handler(request.override(tool=_StepTool.around(request.tool)))


class _StepTool(BaseTool):
    """``inner``, each ``ainvoke`` one step of its name (see :func:`_foreign_tool_step`)."""

    inner: BaseTool

    @classmethod
    def around(cls, inner: BaseTool) -> _StepTool:
        return cls(
            name=inner.name,
            description=inner.description,
            args_schema=inner.args_schema,
            inner=inner,
        )

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("haltwise runs a LangChain tool asynchronously only")

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        inner = self.inner

        async def call() -> dict[str, Any]:
            answer = await inner.ainvoke(input, config, **kwargs)
            if not isinstance(answer, ToolMessage):
                raise haltwise.HaltwiseError(
                    f"tool {inner.name!r} returned a {type(answer).__name__}, which haltwise "
                    "cannot journal; make it a @haltwise.tool"
                )
            return message_to_dict(answer)

        try:
            data = await journaled(call, name=inner.name)
        except haltwise.ReplayedError as replayed:
            raise _as_journaled(replayed) from None
        (message,) = messages_from_dict([data])
        return message


def _as_journaled(replayed: haltwise.ReplayedError) -> Exception:
    """The error a failed call raised the first time, as LangChain's error handling sees it, for
    a call that replays its journaled error on resume (``haltwise.ReplayedError``: the error's own
    type could not be rebuilt in this process).

    An ``Exception`` whose type has the journaled type's name and whose text is the error's
    text: ``ToolNode(handle_tool_errors=...)``, ``ToolRetryMiddleware``, ``ToolErrorMiddleware``
    and the usual handlers write the tool's error from ``repr``, the type's name and ``str``,
    so the model is handed the same text as the first time, and the next model request matches
    the journal's. A handler that selects errors by their class (``isinstance``) cannot match
    it (declare such a type with :func:`haltwise.register_replayable_error`)."""
    kind: type[Exception] = type(replayed.type, (Exception,), {"__module__": "haltwise.replayed"})
    return kind(str(replayed))


def _request_view(request: ModelRequest[Any]) -> dict[str, Any]:
    """What the model is asked, for the request's fingerprint: each message's kind, content,
    tool calls and call id (not the ids LangGraph gives messages afresh in every run), the
    system message, the tools offered, the tool choice and the model settings."""

    def seen(message: BaseMessage) -> dict[str, Any]:
        view: dict[str, Any] = {"type": message.type, "content": message.content}
        if isinstance(message, AIMessage) and message.tool_calls:
            view["calls"] = [(c.get("id"), c["name"], c["args"]) for c in message.tool_calls]
        if isinstance(message, ToolMessage):
            view["call"] = message.tool_call_id
        return view

    system = request.system_message
    return {
        "messages": [seen(m) for m in request.messages],
        "system": None if system is None else system.content,
        "tools": sorted(
            t.name if isinstance(t, BaseTool) else str(t.get("name")) for t in request.tools
        ),
        "tool_choice": request.tool_choice,
        "settings": request.model_settings,
    }


def _graph_runtime() -> Runtime[Any] | None:
    try:
        return get_runtime()
    except RuntimeError:  # not inside a graph run
        return None


def _drain_on_cancel(runtime: Runtime[Any] | None) -> None:
    """From now on a cancel of the current haltwise run drains the graph run ``runtime``
    belongs to (once per graph run): LangGraph finishes the superstep in flight, writes its
    checkpoint and raises ``GraphDrained``, and the run's cancel waits for that (see
    :func:`haltwise._runtime.task_api.cooperative_stop`)."""
    control = getattr(runtime, "control", None)
    if control is not None:
        cooperative_stop(
            id(control), lambda: control.request_drain(DRAIN_REASON), margin=DRAIN_MARGIN
        )


def _stop_draining(control: RunControl | None) -> None:
    if control is not None:
        end_cooperative_stop(id(control))


def _cut_by_host(stop: BaseException) -> bool:
    """Whether LangGraph cancelled the node running this code because its graph run was
    cancelled (``Task.cancel()`` of the task running ``ainvoke``/``astream``, also one the task's
    body made and goes on after), not because haltwise asked (a haltwise cancel) nor because a
    task of the same superstep failed (LangGraph then cancels the others and raises the failure
    from ``ainvoke``: the run fails with it, as it would without haltwise; the step the cancel
    reached is then not counted as a host's cancel of the run)."""
    if not isinstance(stop, asyncio.CancelledError) or haltwise.cancel_requested():
        return False
    if superstep_task_failed():
        sibling_failed()
        return False
    return True


async def _host_stop(runtime: Runtime[Any] | None) -> None:
    """The host cut the graph run (:func:`_cut_by_host`): the graph run no longer holds the
    cancel of the task's scope back (its loop is gone), and the run is cancelled with reason
    ``host``, unless the host is cancelling the task function's own task (an
    ``asyncio.timeout`` or ``wait_for`` around ``ainvoke`` in the task function): that cancel,
    leaving the task function, ends the run (reason ``host``, or ``timeout`` for a timeout)."""
    _stop_draining(getattr(runtime, "control", None))
    if not body_cancelled_by_host():  # else the cancel leaving the task function ends the run
        await cancel_run_for_host()


def _draining(runtime: Runtime[Any] | None) -> bool:
    """Whether the graph run is draining because of a haltwise cancel."""
    control = getattr(runtime, "control", None)
    return control is not None and control.drain_reason == DRAIN_REASON


async def _closed_call(cid: str, name: str) -> ToolMessage:
    """The ``ToolMessage`` of a call a cancel stopped: its journaled result if it committed,
    else a text saying what became of it (the same text in every process)."""
    with anyio.CancelScope(shield=True):
        outcome = await current_run_outcome()
    done = settled_calls(outcome).get(cid)
    content = (
        _content(done.result)
        if done is not None and done.status is haltwise.StepStatus.COMMITTED
        else unsettled_text(done)
    )
    return ToolMessage(content=content, tool_call_id=cid, name=name)


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
