"""``haltwise mcp FILE.py``: the file's tasks as the tools of an MCP server on stdio.

One ``tools/call`` is one haltwise run of the task, with the call's arguments as its keyword
inputs. The run id is the request's ``_meta["haltwise/idempotency-key"]`` when the client gives
one; otherwise it is new. A retried call with a known key and the same arguments is answered
from that run: a final run's outcome at once (a completed run's result; the error result of a
cancelled or failed run, which is never resumed: a client's retry does not undo an operator's
stop); a run not yet final that a dead server left behind is taken over and continued from its
journal, so its committed steps do not run again (a resume refused because of an ``unknown``
step is an error result naming the step). The same key with other arguments (or for another
task) is an error result naming the key (:class:`~haltwise.IdempotencyConflictError`). Each
partial result the run emits is sent as a ``notifications/progress`` (``progress`` = how many
notifications so far, ``message`` = the partial as JSON) when the client asked for progress, as
soon as it is journaled (the run's progress pulse wakes the server; nothing polls); so is each
call that awaits approval, once, when its request is journaled (``message`` naming the step and
the tool: ``[haltwise] step 0 (pay) awaits approval: haltwise approve RUN 0``). The client's
``notifications/cancelled`` cancels the run with reason ``"client"``: its steps settle by their
policies in this process although no response is sent. A completed run answers with its result
(text: the result as JSON; ``structuredContent``: ``{"result": result}``); a cancelled or failed
run with an MCP error result (``isError``) whose text names the state, the reason and the retry
advice. Every answer carries the run's outcome (the ``status --json`` object) in
``_meta["haltwise/outcome"]``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from .._core.exceptions import HaltwiseError, InputError, RunOwnedError
from .._core.outcome import Outcome
from .._core.states import State, StepStatus
from .._runtime import lowlevel
from .._runtime.describe import mcp_annotations, parameters_schema
from .._runtime.runtime import Runtime, TaskHandle
from .._runtime.spans import continued_trace
from .._runtime.spec import Tool, ToolSpec
from ._mcp_tasks import ServedTask, served_tasks

__all__ = ["IDEMPOTENCY_KEY", "OUTCOME_KEY", "serve", "served_tasks"]

#: The ``_meta`` key that carries a call's idempotency key (and so its run id).
IDEMPOTENCY_KEY = "haltwise/idempotency-key"
#: The result ``_meta`` key that carries the run's outcome (the ``status --json`` object).
OUTCOME_KEY = "haltwise/outcome"


def describe_task(served: ServedTask, tools: Sequence[ToolSpec]) -> types.Tool:
    """The MCP declaration of one task: its parameters, its tools' policies as hints and text."""
    hints = [mcp_annotations(tool.policy) for tool in tools]
    annotations = types.ToolAnnotations(
        read_only_hint=all(h["readOnlyHint"] for h in hints),
        destructive_hint=any(h["destructiveHint"] for h in hints),
        idempotent_hint=bool(hints) and all(h["idempotentHint"] for h in hints),
        open_world_hint=any(h["openWorldHint"] for h in hints),
    )
    doc = (served.task.fn.__doc__ or "").strip()
    summary = "; ".join(_policy_summary(tool) for tool in tools) or "none"
    text = (f"{doc}\n\n" if doc else "") + (
        f"Runs as one haltwise run (its tools: {summary}). Cancelling the call cancels the run; "
        f"pass _meta[{IDEMPOTENCY_KEY!r}] to make a retried call answer from the same run."
    )
    # parameters_schema reads only .fn and .name, which a task has as a tool does
    schema = parameters_schema(cast("Tool[..., Any]", served.task))
    return types.Tool(
        name=served.name, description=text, input_schema=schema, annotations=annotations
    )


def _policy_summary(tool: ToolSpec) -> str:
    policy = tool.policy
    cancel = policy.cancel.value if policy.cancel else "undeclared"
    idempotent = ", idempotent" if policy.idempotent else ""
    return f"{tool.name} ({cancel}, {policy.effect.value}{idempotent})"


def outcome_result(outcome: Outcome) -> types.CallToolResult:
    """The ``tools/call`` answer for a final run (see the module docstring)."""
    meta = {OUTCOME_KEY: outcome.to_json()}
    if outcome.state is State.COMPLETED:
        text = json.dumps(outcome.result)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content={"result": outcome.result},
            _meta=meta,
        )
    reason = f", reason {outcome.reason!r}" if outcome.reason else ""
    error = f": {outcome.error.type}: {outcome.error.message}" if outcome.error else ""
    text = f"run {outcome.id!r} {outcome.state.value}{reason}{error}; retry: {outcome.retry.value}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], _meta=meta, is_error=True
    )


class TaskServer:
    """The MCP request handlers over one :class:`~haltwise.Runtime` and one file's tasks."""

    def __init__(
        self, runtime: Runtime, served: Sequence[ServedTask], tools: Sequence[ToolSpec]
    ) -> None:
        self.runtime = runtime
        self.tasks = {item.name: item for item in served}
        self.declarations = [describe_task(item, tools) for item in served]

    def server(self) -> Server[Any]:
        """A lowlevel MCP server whose ``tools/list`` and ``tools/call`` are these handlers."""
        return Server(
            "haltwise",
            version=_haltwise_version(),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.declarations)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        served = self.tasks.get(params.name)
        if served is None:
            return _error_text(f"no task {params.name!r} here; tools: {', '.join(self.tasks)}")
        arguments = dict(params.arguments or {})
        try:
            served.task.bind_inputs((), arguments)
            with continued_trace(ctx.meta):  # the client's trace, when its _meta carries one
                handle = await self._start(served, arguments, _run_id(ctx))
        except HaltwiseError as error:  # bad arguments, a resume refused
            return _error_text(str(error))
        try:
            outcome = await self._follow(ctx, handle)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await handle.cancel(reason="client")
            raise
        return outcome_result(outcome)

    async def _start(
        self, served: ServedTask, arguments: dict[str, Any], run_id: str
    ) -> TaskHandle:
        handle = await lowlevel.launch(
            self.runtime,
            served.task,
            (),
            arguments,
            task_id=run_id,
            name=served.run_name,
            source=served.source,
        )
        if self.runtime.is_active(run_id) or (await handle.status()).state.is_final:
            return handle  # a final run answers with its outcome: a retry never undoes a stop
        # The key names a run not yet final that another process left (or works).
        try:
            return await self.runtime.resume(run_id, task=served.task)
        except RunOwnedError:
            return handle  # a live process works it: answer with its outcome

    async def _follow(self, ctx: ServerRequestContext[Any, Any], handle: TaskHandle) -> Outcome:
        """Wait for the run's final state, sending each new partial result, and each step that
        comes to await approval, as progress.

        The journal is read again only when the run may have something new to report (see
        :meth:`_progress`), never on a timer: a run that makes no progress costs nothing.
        """
        sent = _Reported()
        final: list[Outcome] = []
        async with anyio.create_task_group() as group:

            async def wait_final() -> None:
                final.append(await handle.outcome())
                group.cancel_scope.cancel()

            group.start_soon(wait_final)
            async for _ in self._progress(handle.id):
                status = await handle.status()
                with anyio.CancelScope(shield=True):  # counted as sent only once sent
                    await sent.report(ctx, status)
        await sent.report(ctx, final[0])
        return final[0]

    async def _progress(self, run_id: str) -> AsyncIterator[None]:
        """Yield at once, then each time run ``run_id`` may have journaled a partial result:
        for a run worked here, when it does (its progress pulse); for one another process
        works, at each of its changes in the journal's change feed."""
        pulse = lowlevel.progress(self.runtime, run_id)
        if pulse is None:
            yield
            async for _ in self.runtime.changes(run_id=run_id):
                yield
            return
        while True:
            woken = pulse.next()  # taken before the journal is read: nothing is missed
            yield
            await woken.wait()


class _Reported:
    """What one call's progress notifications have reported so far: ``progress`` counts them
    all (it only grows, as MCP asks); partials are reported in order, each step that awaits
    approval once."""

    __slots__ = ("asked", "count", "partials")

    def __init__(self) -> None:
        self.count = 0
        self.partials = 0
        self.asked: set[int] = set()

    async def report(self, ctx: ServerRequestContext[Any, Any], outcome: Outcome) -> None:
        """Send what ``outcome`` (the run as journaled now) holds that was not sent yet."""
        for partial in outcome.partials[self.partials :]:
            await self._send(ctx, json.dumps(partial))
            self.partials += 1
        for step in outcome.steps:
            if step.status is StepStatus.AWAITING and step.index not in self.asked:
                words = f"haltwise approve {outcome.id} {step.index}"
                await self._send(
                    ctx, f"[haltwise] step {step.index} ({step.tool}) awaits approval: {words}"
                )
                self.asked.add(step.index)

    async def _send(self, ctx: ServerRequestContext[Any, Any], message: str) -> None:
        await ctx.session.report_progress(self.count + 1, None, message)
        self.count += 1


def _run_id(ctx: ServerRequestContext[Any, Any]) -> str:
    meta: Any = ctx.meta or {}
    key = meta.get(IDEMPOTENCY_KEY) if isinstance(meta, dict) else None
    if key is None:
        return uuid.uuid4().hex
    if not isinstance(key, str) or not key:
        raise InputError(f"_meta[{IDEMPOTENCY_KEY!r}] must be a non-empty string")
    return key


def _error_text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


async def serve(file: str | os.PathLike[str], *, store: str | None = None) -> None:
    """Serve ``file``'s tasks over MCP on this process's stdin and stdout until stdin closes.

    ``store`` is a store URL (default ``$HALTWISE_STORE``, else the default SQLite file). When
    the client goes away, the runs still active are cancelled with reason ``"client"`` and
    settle by their policies before this returns. Raises :class:`~haltwise.LoadError` or
    :class:`~haltwise.InputError` (before serving anything) if the file cannot be served.
    """
    served, tools = served_tasks(file)
    async with Runtime(store) as runtime, stdio_server() as (read_stream, write_stream):
        server = TaskServer(runtime, served, tools).server()
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _haltwise_version() -> str:
    """The installed haltwise's version, as ``serverInfo.version`` reports it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("haltwise")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
