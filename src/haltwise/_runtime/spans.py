"""OpenTelemetry spans of runs and steps (CONTRACT.md, "Telling the world: traces and events").

With the application's tracer provider set (the OpenTelemetry API's global one), each attempt of
a run worked here is a span ``invoke_workflow {task}``, each attempt of a step a child span
``execute_tool {tool}`` (a model request: ``chat {model}``), each compensation a span
``compensate {tool}``, a child of the run span linked to the span of the step it undoes.

What the spans say:

- **A cancel is not an error.** A cancelled run, and an interrupted, compensated, unknown or
  finished-under-cancel step, end with status UNSET (``haltwise.step.status`` says which); only a
  failed run or step, and a step timeout, are ERROR, with ``error.type``.
- **Every span ends**, whatever ends the attempt short of a kill: the run span when the run
  stops being worked here (:func:`end_run`, from the runtime's one place for that), a step span
  when the step settles (:func:`end_step`, from the step executor's two settling writes).
- **Attempts are linked.** A run span links to the span of the run's previous attempt, also
  when that attempt ran in another process: each attempt's span context is kept in the journal
  (``Store.swap_trace``), written only while spans are recorded.
- **No secret and no argument value** becomes an attribute: not the idempotency key, not the
  tool's arguments nor its result.
- **Replayed steps make no span.**

Cost: nothing of OpenTelemetry is imported when it is not installed, and nothing is imported by
``import haltwise``: the API is looked up when the first run is launched. A run whose span is not
recording (no SDK configured, or sampled out) keeps no trace state at all, so its steps pay one
attribute test each.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from .._core.outcome import ErrorInfo, StepRecord, retry_advice
from .._core.states import State, StepStatus

if TYPE_CHECKING:
    from .._core.policy import ToolPolicy

__all__ = [
    "RunTrace",
    "begin_run",
    "begin_step",
    "compensation_span",
    "continued_trace",
    "end_run",
    "end_step",
    "inject_trace",
    "link_earlier",
    "run_current",
    "run_event",
    "step_current",
    "trace_context",
    "use_api",
]

#: The name a model request's step records (the integrations' ``MODEL_STEP``)
_MODEL_STEP: Final = "model"
#: The model a model request asks (``"gpt-4o"``), set by ``tool.model_step`` while its step
#: begins: the span is ``chat {model}`` with ``gen_ai.request.model`` (CONTRACT.md).
REQUESTED_MODEL: ContextVar[str | None] = ContextVar("haltwise_requested_model", default=None)
#: Step statuses whose span is ERROR (with ``error.type``); every other ends UNSET.
_ERROR_STATUSES: Final = frozenset({StepStatus.FAILED})

_api: Any = None  # the opentelemetry.trace module; False once found missing

#: ``use_span`` leaves a span's status and events to haltwise: by default it would record any
#: exception passing through as an event (its text may quote an argument) and set ERROR (a tool
#: refused by an approver, say, is no error of the span's).
_QUIET: Final = {"record_exception": False, "set_status_on_exception": False}

_T = TypeVar("_T")
_P = ParamSpec("_P")
_LOG = logging.getLogger("haltwise.spans")


def _guarded(fn: Callable[_P, _T]) -> Callable[_P, _T | None]:
    """Tracing never changes a run: an exception raised by the OpenTelemetry SDK or a span
    processor (the SDK calls processors without catching) is logged, and the caller goes on
    as if spans were off for that call."""

    @functools.wraps(fn)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _T | None:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            _LOG.warning(
                "haltwise: a span could not be recorded (%s: %s)", type(error).__name__, error
            )
            return None

    return guarded


def _trace() -> Any:
    """The OpenTelemetry trace API, or None when it is not installed (looked up once)."""
    global _api
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
        else:
            _api = trace
    return _api or None


def use_api(api: Any) -> None:
    """Spans use ``api`` (the ``opentelemetry.trace`` module) for the runs launched from now on;
    ``None``: as if OpenTelemetry were not installed (no run span, no step span). What a
    benchmark compares in one process (``bench/_span_worker.py``); an application never needs
    it (the API is looked up by itself)."""
    global _api
    _api = False if api is None else api


@dataclass(slots=True, eq=False)
class RunTrace:
    """A run attempt's span and the spans of its steps in flight (by index); ``settled`` holds
    the statuses this attempt gave its steps, for the retry advice at the end. ``tracer`` and
    ``parent`` (a context whose current span is the run span) are looked up once per attempt:
    its step spans are started from them."""

    span: Any
    tracer: Any
    parent: Any
    steps: dict[int, Any] = field(default_factory=dict)
    step_contexts: dict[int, Any] = field(default_factory=dict)
    settled: dict[int, StepRecord] = field(default_factory=dict)


@_guarded
def begin_run(run_id: str, task: str) -> RunTrace | None:
    """Open the span of an attempt of run ``run_id`` about to be worked here, a child of the
    caller's current span (a run started inside a step, or a child run, nests in it); None when
    it is not recorded."""
    trace = _trace()
    if trace is None:
        return None
    tracer = trace.get_tracer("haltwise")
    span = tracer.start_span(
        f"invoke_workflow {task}",
        attributes={
            "gen_ai.operation.name": "invoke_workflow",
            "haltwise.run.id": run_id,
            "haltwise.task": task,
        },
    )
    if not span.is_recording():
        span.end()
        return None
    return RunTrace(span, tracer, trace.set_span_in_context(span))


def trace_context(run: RunTrace) -> str:
    """The run span's context as a W3C ``traceparent``: what the journal keeps of an attempt."""
    context = run.span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


@_guarded
def link_earlier(run: RunTrace, traceparent: str | None) -> None:
    """Link the attempt's span to the span of the run's attempt before it (a ``traceparent``
    kept in the journal), if there was one and it parses."""
    trace = _trace()
    if trace is None or not traceparent:
        return
    try:
        _, trace_id, span_id, flags = traceparent.split("-")
        context = trace.SpanContext(
            int(trace_id, 16),
            int(span_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(int(flags, 16)),
        )
    except ValueError:
        return  # not ours to fail on: a row written by hand, say
    run.span.add_link(context, {"haltwise.link": "earlier_attempt"})


def run_current(run: RunTrace | None) -> Any:
    """A context manager making the run span current (user spans inside nest in it)."""
    if run is None:
        return nullcontext()
    return _trace().use_span(run.span, end_on_exit=False, **_QUIET)


@_guarded
def end_run(
    run: RunTrace,
    state: State | None,
    error: ErrorInfo | None,
    reason: str | None,
    journal: Mapping[int, StepRecord],
) -> None:
    """End the attempt's span: ``state`` is what the attempt recorded (None: it ended without
    a final state of its own: handed over, its store lost), ``reason`` the cancel's, ``journal``
    the steps of earlier attempts; ERROR only for ``failed``."""
    trace = _trace()
    span = run.span
    for index in list(run.steps):  # a step span left open would never end: close it as it is
        end_step(run, index, StepStatus.RUNNING)
    if state is State.CANCELLED:
        span.add_event("haltwise.cancel.settled", {"haltwise.cancel.reason": reason or "user"})
    attributes: dict[str, Any] = {"haltwise.run.state": (state or State.RUNNING).value}
    if reason is not None:
        attributes["haltwise.cancel.reason"] = reason
    if state is not None:
        steps = {**journal, **run.settled}
        attributes["haltwise.retry"] = retry_advice(state, list(steps.values())).value
    span.set_attributes(attributes)
    if state is State.FAILED and error is not None and trace is not None:
        span.set_attribute("error.type", error.type)
        span.set_status(trace.Status(trace.StatusCode.ERROR, error.message[:200]))
    span.end()


@_guarded
def begin_step(
    run: RunTrace,
    run_id: str,
    tool: str,
    policy: ToolPolicy,
    index: int,
    attempt: int,
    call_id: str | None,
) -> None:
    """Open the span of a step's attempt (journaled ``running`` just now)."""
    requested = REQUESTED_MODEL.get()
    model = requested is not None or tool == _MODEL_STEP
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat" if model else "execute_tool",
        "gen_ai.tool.name": tool,
        "haltwise.run.id": run_id,
        "haltwise.step.index": index,
        "haltwise.step.attempt": attempt,
        "haltwise.tool.cancel_policy": policy.cancel.value if policy.cancel else "undeclared",
        "haltwise.tool.effect": policy.effect.value,
    }
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    if requested is not None:
        attributes["gen_ai.request.model"] = requested
    name = f"chat {requested or tool}" if model else f"execute_tool {tool}"
    span = run.tracer.start_span(name, context=run.parent, attributes=attributes)
    run.steps[index] = span
    run.step_contexts[index] = span.get_span_context()
    run.settled[index] = StepRecord(
        index,
        tool,
        policy.cancel.value if policy.cancel else None,
        policy.effect,
        policy.idempotent,
        StepStatus.RUNNING,
        attempt,
    )


def step_current(run: RunTrace | None, index: int) -> Any:
    """A context manager making the step's span current while its body runs."""
    if run is None or index not in run.steps:
        return nullcontext()
    return _trace().use_span(run.steps[index], end_on_exit=False, **_QUIET)


@_guarded
def end_step(run: RunTrace, index: int, status: StepStatus, error: ErrorInfo | None = None) -> None:
    """End the span of step ``index``'s attempt as it settled ``status`` (no span: nothing)."""
    span = run.steps.pop(index, None)
    if span is None:
        return
    span.set_attribute("haltwise.step.status", status.value)
    if status in _ERROR_STATUSES:
        trace = _trace()
        span.set_attribute("error.type", error.type if error is not None else "Error")
        message = error.message[:200] if error is not None else None
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))
    known = run.settled.get(index)
    if known is not None:
        run.settled[index] = dataclasses.replace(known, status=status)
    span.end()


@contextmanager
def compensation_span(
    run: RunTrace | None, run_id: str, tool: str, index: int | None
) -> Iterator[Any]:
    """The span of a compensation: a child of the run span, linked to the step it undoes."""
    if run is None:
        yield None
        return
    trace = _trace()
    links = []
    undone = run.step_contexts.get(index) if index is not None else None
    if undone is not None:
        links.append(trace.Link(undone, {"haltwise.link": "compensates"}))
    attributes: dict[str, Any] = {"haltwise.run.id": run_id, "gen_ai.tool.name": tool}
    if index is not None:
        attributes["haltwise.step.index"] = index
    span = _guarded(run.tracer.start_span)(
        f"compensate {tool}",
        context=run.parent,
        links=links,
        attributes=attributes,
    )
    if span is None:
        yield None
        return
    try:
        with trace.use_span(span, end_on_exit=False, **_QUIET):
            yield span
    finally:
        _guarded(span.end)()


@_guarded
def run_event(run: RunTrace | None, name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """A span event on the attempt's run span (``haltwise.cancel.requested``, ...)."""
    if run is not None:
        run.span.add_event(name, dict(attributes or {}))


@_guarded
def inject_trace(carrier: dict[str, Any]) -> None:
    """Put the current trace context in ``carrier`` (``traceparent``, ``tracestate``: the
    application's propagator), as ``remote_tools`` does in a call's ``_meta``; nothing when no
    span is current or OpenTelemetry is not installed."""
    if _trace() is None or not _trace().get_current_span().get_span_context().is_valid:
        return
    from opentelemetry.propagate import inject

    inject(carrier)


@contextmanager
def continued_trace(carrier: Any) -> Iterator[None]:
    """Inside, the trace context ``carrier`` holds (a request's ``_meta``) is the current one,
    so that a run started there continues the caller's trace (``haltwise mcp``)."""
    if _trace() is None or not isinstance(carrier, Mapping) or "traceparent" not in carrier:
        yield
        return
    from opentelemetry import context
    from opentelemetry.propagate import extract

    token = context.attach(extract(dict(carrier)))
    try:
        yield
    finally:
        context.detach(token)
