"""OpenTelemetry spans of runs and steps, through the SDK's in-memory exporter (CONTRACT.md,
"Telling the world: traces and events"): a cancel is not an error, every span ends, attempts
are linked (also across processes), replayed steps make none, no key or argument value becomes
an attribute, and nothing of OpenTelemetry is imported when it is not installed.

The SDK's provider is set as the global one for each test here and taken away after it (the
API allows one global provider per process; the fixture resets its private state, as the
OpenTelemetry project's own test utilities do), so no other test records spans.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

import haltwise
import toolkit
from span_kit import SECRET_ARG, boom, paying, retrying, timing_out

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


class Opened(SpanProcessor):
    """Counts the spans started and ended: none may stay open."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)


class Spans:
    def __init__(self, exporter: InMemorySpanExporter, opened: Opened) -> None:
        self.exporter = exporter
        self.opened = opened

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    def run(self, run_id: str) -> list[ReadableSpan]:
        return [
            s
            for s in self.named("invoke_workflow")
            if s.attributes and s.attributes["haltwise.run.id"] == run_id
        ]


def _reset_globals() -> None:
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    opened = Opened()
    provider = TracerProvider()
    provider.add_span_processor(opened)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield Spans(exporter, opened)
    finally:
        _reset_globals()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def no_secrets(spans: Spans) -> None:
    for span in spans.all():
        text = json.dumps(
            {**attrs(span), "events": [dict(e.attributes or {}) for e in span.events]}
        )
        assert SECRET_ARG not in text
        for value in toolkit.keys.values():
            for key in value:
                assert key not in text
    assert spans.opened.open == {}


async def cancelled_in(tool_name: str, spans: Spans, store: str, *, force: bool = False) -> Any:
    async with haltwise.Runtime(store) as rt:
        handle = await rt.start(paying, tool_name, task_id="r")
        await toolkit.entered.wait()
        await handle.cancel(reason="user", force=force)
        if not force:
            toolkit.release.set()  # a finish step finishes within its grace
        outcome = await handle.outcome()
    assert outcome.state is haltwise.State.CANCELLED
    return outcome


async def test_a_completed_run_and_its_steps(spans: Spans, sqlite_url: str) -> None:
    toolkit.release.set()
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(paying, "charge_async", task_id="ok")).outcome()
    (run,) = spans.run("ok")
    steps = spans.named("execute_tool")
    assert [s.name for s in steps] == ["execute_tool lookup", "execute_tool charge_async"]
    for step in steps:
        assert step.parent is not None and step.parent.span_id == run.context.span_id
        assert step.status.status_code is StatusCode.UNSET
        assert attrs(step)["haltwise.step.status"] == "committed"
    assert attrs(steps[1]) | {} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "charge_async",
        "haltwise.run.id": "ok",
        "haltwise.step.index": 1,
        "haltwise.step.attempt": 1,
        "haltwise.tool.cancel_policy": "finish",
        "haltwise.tool.effect": "external",
        "haltwise.step.status": "committed",
    }
    assert run.name == "invoke_workflow span_kit:paying"
    assert attrs(run)["haltwise.run.state"] == "completed"
    assert attrs(run)["haltwise.retry"] == "none"
    assert run.status.status_code is StatusCode.UNSET
    no_secrets(spans)


@pytest.mark.parametrize(
    ("tool_name", "force", "status"),
    [
        ("read_async", False, "interrupted"),
        ("charge_async", False, "committed"),
        ("charge_async", True, "unknown"),
        ("write_async", False, "compensated"),
    ],
)
async def test_a_cancel_is_not_an_error(
    spans: Spans, sqlite_url: str, tool_name: str, force: bool, status: str
) -> None:
    outcome = await cancelled_in(tool_name, spans, sqlite_url, force=force)
    (run,) = spans.run("r")
    assert run.status.status_code is StatusCode.UNSET
    assert attrs(run)["haltwise.run.state"] == "cancelled"
    assert attrs(run)["haltwise.cancel.reason"] == "user"
    assert attrs(run)["haltwise.retry"] == outcome.retry.value
    events = [(e.name, dict(e.attributes or {})) for e in run.events]
    assert events[0] == (
        "haltwise.cancel.requested",
        {"haltwise.cancel.reason": "user", "haltwise.cancel.force": force},
    )
    assert events[-1][0] == "haltwise.cancel.settled"
    step = spans.named(f"execute_tool {tool_name}")[0]
    assert attrs(step)["haltwise.step.status"] == status
    assert step.status.status_code is StatusCode.UNSET
    if status == "compensated":
        (undo,) = spans.named("compensate")
        assert undo.name == f"compensate {tool_name}"
        assert undo.parent is not None and undo.parent.span_id == run.context.span_id
        assert [link.context.span_id for link in undo.links] == [step.context.span_id]
    no_secrets(spans)


async def test_failures_and_step_timeouts_are_errors(spans: Spans, sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        failed = await (await rt.start(boom, task_id="boom")).outcome()
        timed = await (await rt.start(timing_out, task_id="slow")).outcome()
    assert failed.state is haltwise.State.FAILED and timed.result == "timed out"
    (run,) = spans.run("boom")
    assert run.status.status_code is StatusCode.ERROR
    assert attrs(run)["error.type"] == "ValueError"
    (step,) = spans.named("execute_tool too_slow")
    assert step.status.status_code is StatusCode.ERROR
    assert attrs(step)["error.type"] == "StepTimeoutError"
    assert attrs(step)["haltwise.step.status"] == "failed"
    (slow,) = spans.run("slow")
    assert slow.status.status_code is StatusCode.UNSET  # the task caught it and completed


async def test_each_retry_is_its_own_span(spans: Spans, sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(retrying, task_id="retry")).outcome()
    tries = spans.named("execute_tool flaky")
    assert [attrs(s)["haltwise.step.attempt"] for s in tries] == [1, 2]
    assert [attrs(s)["haltwise.step.status"] for s in tries] == ["failed", "committed"]
    assert tries[0].status.status_code is StatusCode.ERROR


async def test_a_resumed_attempt_links_to_the_earlier_one_and_replays_make_no_span(
    spans: Spans, sqlite_url: str
) -> None:
    await cancelled_in("read_async", spans, sqlite_url)
    (first,) = spans.run("r")
    spans.exporter.clear()
    toolkit.release.set()
    async with haltwise.Runtime(sqlite_url) as rt:
        outcome = await (await rt.resume("r")).outcome()
    assert outcome.state is haltwise.State.COMPLETED
    (second,) = spans.run("r")
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    # step 0 (lookup) was committed in the first attempt: replayed, no span
    assert [s.name for s in spans.named("execute_tool")] == ["execute_tool read_async"]
    assert spans.opened.open == {}


async def test_a_host_cancel_and_a_pause_end_their_spans(spans: Spans, sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(paying, "read_async", task_id="paused")
        await toolkit.entered.wait()
        await rt.pause("paused")
        toolkit.release.set()
        await toolkit.wait_for_state(rt, "paused", haltwise.State.PAUSED)
        await rt.cancel("paused")
        await handle.outcome()
    (paused,) = spans.run("paused")
    assert "haltwise.paused" in [e.name for e in paused.events]

    toolkit.reset()

    async def body() -> None:
        async with haltwise.Runtime(sqlite_url) as rt:
            handle = await rt.start(paying, "read_async", task_id="hosted")
            await toolkit.entered.wait()
            task.cancel()
            await handle.outcome()

    task = asyncio.ensure_future(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert spans.opened.open == {}
    (hosted,) = spans.run("hosted")
    assert attrs(hosted)["haltwise.run.state"] in ("cancelled", "running")


async def test_runtime_exit_ends_every_span(spans: Spans, sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        await rt.start(paying, "read_async", task_id="left")
        await toolkit.entered.wait()
    assert spans.opened.open == {}
    (run,) = spans.run("left")
    assert attrs(run)["haltwise.run.state"] in ("cancelled", "running")


def test_a_resume_in_another_process_links_to_this_process_span(
    spans: Spans, sqlite_url: str, tmp_path: Path
) -> None:
    anyio.run(cancelled_in, "read_async", spans, sqlite_url)
    (first,) = spans.run("r")
    script = tmp_path / "resume_traced.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            import haltwise
            sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
            import span_kit, toolkit
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            toolkit.release.set()
            async def main():
                async with haltwise.Runtime({sqlite_url!r}) as rt:
                    return await (await rt.resume("r")).outcome()
            import anyio
            outcome = anyio.run(main)
            runs = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke")]
            print(json.dumps({{"state": outcome.state.value,
                "links": [l.context.span_id for s in runs for l in s.links]}}))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"state": "completed", "links": [first.context.span_id]}


def test_without_opentelemetry_nothing_of_it_is_imported(sqlite_url: str, tmp_path: Path) -> None:
    python = venv_without_opentelemetry(tmp_path / "venv")
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        assert importlib.util.find_spec("opentelemetry") is None  # not installed here
        import haltwise

        @haltwise.tool(cancel="interruptible", effect="read")
        async def hello() -> str:
            return "hi"

        @haltwise.task(name="plain:greet")
        async def greet() -> str:
            return await hello()

        outcome = haltwise.run(greet, store={sqlite_url!r})
        assert outcome.state is haltwise.State.COMPLETED, outcome
        loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
        assert not loaded, loaded
        print("ok")
        """
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def venv_without_opentelemetry(where: Path) -> str:
    """A new venv holding everything this one has (linked, not copied: a second) except the
    OpenTelemetry distributions; answers its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    (theirs,) = where.glob("lib/python*/site-packages")
    for entry in ours.iterdir():
        if not entry.name.lower().startswith("opentelemetry"):
            (theirs / entry.name).symlink_to(entry)
    return str(where / "bin" / "python")


async def test_a_trace_continues_through_meta_as_remote_tools_and_haltwise_mcp_pass_it(
    spans: Spans, sqlite_url: str
) -> None:
    """``remote_tools`` puts the calling step's trace context in the request's ``_meta``
    (``inject_trace``), and ``haltwise mcp`` starts the run inside the context it finds there
    (``continued_trace``): the remote run's span is a child of the calling step's span."""
    from haltwise._runtime.spans import continued_trace, inject_trace

    carried: dict[str, Any] = {}

    @haltwise.tool(cancel="interruptible", effect="read")
    async def call_remote() -> None:
        inject_trace(carried)

    @haltwise.task(name="test_spans:caller")
    async def caller() -> None:
        await call_remote()

    toolkit.release.set()
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(caller, task_id="caller")).outcome()
        meta = {"haltwise/idempotency-key": "k", **carried}
        with continued_trace(meta):
            await (await rt.start(paying, "read_async", task_id="remote")).outcome()
    (step,) = spans.named("execute_tool call_remote")
    assert carried["traceparent"].split("-")[2] == f"{step.context.span_id:016x}"
    (remote,) = spans.run("remote")
    assert remote.parent is not None and remote.parent.span_id == step.context.span_id
    assert remote.context.trace_id == step.context.trace_id
    with continued_trace({"no": "trace"}):  # no traceparent: a new trace, no error
        pass


class Raising(SpanProcessor):
    """A span processor that fails (the SDK calls processors without catching)."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if span.name.startswith("execute_tool"):
            raise RuntimeError("a processor failed at a step's start")

    def on_end(self, span: ReadableSpan) -> None:
        if span.name.startswith("invoke_workflow"):
            raise RuntimeError("a processor failed at a run's end")


async def test_a_failing_span_processor_never_changes_a_run(
    spans: Spans, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(Raising())
    toolkit.release.set()
    async with haltwise.Runtime(sqlite_url) as rt:
        outcome = await (await rt.start(paying, "write_async", task_id="robust")).outcome()
        handle = await rt.start(paying, "write_async", task_id="robust-cancelled")
        status = await rt.status("robust-cancelled")
        await handle.cancel()
        cancelled = await handle.outcome()
    assert outcome.state is haltwise.State.COMPLETED
    assert [s.status.value for s in outcome.steps] == ["committed", "committed"]
    assert cancelled.state is haltwise.State.CANCELLED
    assert all(s.status.value != "running" for s in cancelled.steps), status
    assert "a span could not be recorded" in caplog.text


@haltwise.tool(cancel="finish", effect="external", idempotent=True, approval="required")
async def pay(amount: int) -> int:
    return amount


@haltwise.task(name="test_spans:asks")
async def asks() -> int:
    return await pay(5)


@haltwise.task(name="test_spans:spends", budget=haltwise.Budget(tool_calls=1))
async def spends() -> None:
    await lookup_once("a")
    await lookup_once("b")  # the second tool call never begins: the budget is spent


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup_once(key: str) -> str:
    return key


async def test_approvals_and_budget_exhaustion_are_events_of_the_run_span(
    spans: Spans, sqlite_url: str
) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(asks, task_id="asks")
        while not await rt.approvals("asks"):
            await anyio.sleep(0.01)
        await rt.decide("asks", 0, approve=True, by="ops")
        assert (await handle.outcome()).result == 5
        spent = await (await rt.start(spends, task_id="spends")).outcome()
    assert (spent.state, spent.reason) == (haltwise.State.CANCELLED, "budget")
    (asked,) = spans.run("asks")
    events = {e.name: dict(e.attributes or {}) for e in asked.events}
    assert events["haltwise.approval.requested"]["haltwise.step.index"] == 0
    assert events["haltwise.approval.decided"]["haltwise.approval.state"] == "approved"
    (budget,) = spans.run("spends")
    assert "haltwise.budget.exhausted" in [e.name for e in budget.events]


@haltwise.task(name="spans:ask")
async def ask_model(streamed: bool) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from haltwise.integrations.pydantic_ai import JournaledModel

    agent = Agent(JournaledModel(TestModel(custom_output_text="hi", model_name="tiny-1")))
    if streamed:
        async with agent.run_stream("hello") as result:
            return await result.get_output()
    return (await agent.run("hello")).output


@pytest.mark.parametrize("streamed", [False, True], ids=["request", "stream"])
async def test_a_model_request_is_a_chat_span_named_by_its_model(
    spans: Spans, sqlite_url: str, streamed: bool
) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        outcome = await (await rt.start(ask_model, streamed, task_id="ask")).outcome()
    assert outcome.state is haltwise.State.COMPLETED, outcome
    (chat,) = spans.named("chat ")
    assert chat.name == "chat tiny-1"
    assert attrs(chat)["gen_ai.operation.name"] == "chat"
    assert attrs(chat)["gen_ai.request.model"] == "tiny-1"
    (run,) = spans.run("ask")
    assert chat.parent is not None and chat.parent.span_id == run.context.span_id
    assert not spans.named("execute_tool")
