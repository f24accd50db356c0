"""One tool call inside a task: journal it, run it under its cancel policy, settle it.

The order is what makes a crash safe: the step's start is durable before the tool body runs,
and its settlement (with the result) is durable before the task sees the result. A replayed
step (``committed`` in the journal) returns its journaled result without running.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import TYPE_CHECKING, Any

import anyio

from .._core.exceptions import (
    Cancelled,
    NonDeterminismError,
    StoreError,
    UnknownStepError,
)
from .._core.outcome import ErrorInfo, StepRecord
from .._core.policy import CancelPolicy
from .._core.records import JSONText, dump_json
from .._core.states import StepStatus
from .._journal.store import StepStart
from .pause import pause_point
from .run_context import CURRENT_STEP, RunContext, StepCancelHook, StepContext, current_run
from .threads import ThreadCall, start_thread

if TYPE_CHECKING:
    from .tool import Tool

_RUN_AGAIN = object()
_YIELD_INTERVAL = 0.001
#: results of these types read back from JSON as the very same value: no need to re-parse
_SAME_AFTER_JSON = frozenset({int, str, bool, float, type(None)})


async def call_tool(tool: Tool[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What ``await some_tool(...)`` does (see :class:`~haltwise.Tool`)."""
    run = current_run()
    if run is None or CURRENT_STEP.get() is not None:
        # Outside a task, or a tool calling a tool: the inner call is part of the outer step.
        if tool.is_async:
            return await tool.fn(*args, **kwargs)
        return tool.fn(*args, **kwargs)
    if run.probe is not None:
        await run.probe("before", run.peek_step())
    # A schedule point between steps, for other runs, the watcher and in-process cancel
    # requests. Needed only where a step may not yield by itself: a replayed step, or the
    # SQLite store's fast path (one run active). At most one per _YIELD_INTERVAL: a run that
    # yields at every step spends ~5% of a trivial step on it.
    now = time.monotonic()
    if now >= run.next_yield and (run.runtime.active_runs <= 1 or run.peek_step() in run.journal):
        run.next_yield = now + _YIELD_INTERVAL
        await anyio.lowlevel.checkpoint()
    if run.pause.requested:
        await pause_point(run)
    run.raise_if_cancelled()
    index = run.allocate_step()
    journaled = run.journal.get(index)
    replayed = _RUN_AGAIN if journaled is None else _replay(run, journaled, tool)
    if replayed is _RUN_AGAIN:
        key = journaled.idempotency_key if journaled is not None else run.new_key(index)
        result = await _execute(run, tool, index, key, args, kwargs)
    else:
        result = replayed
    if run.probe is not None:
        await run.probe("after", index)
    if run.pause.requested:
        await pause_point(run)
    run.raise_if_cancelled()
    return result


def _replay(run: RunContext, journaled: StepRecord, tool: Tool[..., Any]) -> Any:
    if journaled.tool != tool.name:
        run.poison = NonDeterminismError(run.run_id, journaled.index, journaled.tool, tool.name)
        raise run.poison
    status = journaled.status
    if status is StepStatus.COMMITTED:
        return journaled.result
    if status is StepStatus.UNKNOWN and not (journaled.idempotent or journaled.index in run.rerun):
        raise UnknownStepError(run.run_id, journaled.index, journaled.tool)
    return _RUN_AGAIN


def _args_json(tool: Tool[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if tool.policy.effective_cancel is not CancelPolicy.ROLLBACK:
        return None
    return dump_json(
        {"args": list(args), "kwargs": kwargs},
        f"the arguments of rollback tool {tool.name!r} (kept to compensate after a crash)",
    )


async def _execute(
    run: RunContext,
    tool: Tool[..., Any],
    index: int,
    key: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    policy = tool.policy
    start = StepStart(
        index=index,
        tool=tool.name,
        cancel=policy.cancel.value if policy.cancel else None,
        effect=policy.effect,
        idempotent=policy.idempotent,
        idempotency_key=key,
        args=_args_json(tool, args, kwargs),
        cleanup=run.delivered or run.forced,
    )
    # The store completes this write even if a cancel arrives meanwhile (no scope needed).
    _, stored_cancel = await run.store.start_step(run.run_id, start, fence=run.fence)
    if stored_cancel is not None:
        run.request_cancel(stored_cancel[0], force=stored_cancel[1])
    if run.cancel_pending or run.forced:
        # The cancel came first: the body never ran.
        await settle(run, index, StepStatus.INTERRUPTED)
        run.raise_if_cancelled()
    flight = _Flight(run, tool, StepContext(run, index, key), args, kwargs)
    return await flight.run()


async def settle(
    run: RunContext,
    index: int,
    status: StepStatus,
    *,
    result: Any = None,
    error: ErrorInfo | None = None,
    durable: bool = True,
) -> None:
    """Journal how a step ended; the store completes it even if a cancel arrives meanwhile.

    ``durable=False`` lets the store commit it with the next write (see ``may_defer_settle``).
    """
    await run.store.settle_step(
        run.run_id, index, status, result=result, error=error, fence=run.fence, durable=durable
    )


class _Flight:
    """A tool body in flight, and how it reacts to a cancel according to its policy."""

    __slots__ = ("args", "ctx", "kwargs", "policy", "scope", "step", "thread", "tool")

    def __init__(
        self,
        run: RunContext,
        tool: Tool[..., Any],
        step: StepContext,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.ctx = run
        self.tool = tool
        self.step = step
        self.args = args
        self.kwargs = kwargs
        self.policy = tool.policy.effective_cancel
        self.scope = anyio.CancelScope()
        self.thread: ThreadCall | None = None

    def on_cancel(self) -> None:
        """A (not forced) cancel arrived while the body runs: apply the tool's policy."""
        grace_deadline = anyio.current_time() + self.tool.policy.grace
        if self.policy is CancelPolicy.FINISH or (self.thread is not None and self.step.polled):
            # finish: shielded for at most grace. A plain tool that polls cancel_requested()
            # cooperates: give it the same bound to return or raise Cancelled.
            self.scope.deadline = min(self.scope.deadline, grace_deadline)
        else:
            self.scope.cancel()

    async def run(self) -> Any:
        token = CURRENT_STEP.set(self.step)
        self.ctx.active_step = StepCancelHook(self.on_cancel)
        try:
            try:
                if self.ctx.probe is not None:
                    await self.ctx.probe("during", self.step.index)
                with self.scope:
                    value = await self._invoke()
                if not self.scope.cancelled_caught:
                    # Outside the body's scope: a cancel arriving now finds the body done,
                    # and the step commits (the cancel is delivered after it).
                    return await self._commit(value)
            except Cancelled:
                if self.ctx.cancel_reason is None:
                    raise
            except StoreError:
                raise  # the journal failed, not the tool: the step stays as last journaled
            except anyio.get_cancelled_exc_class():
                # Cancelled from outside the step: a forced cancel, or a shield's time ran out.
                self.ctx.active_step = None
                await self._settle_cancelled()
                raise
            except Exception as error:
                await settle(
                    self.ctx, self.step.index, StepStatus.FAILED, error=ErrorInfo.of(error)
                )
                raise
        finally:
            self.ctx.active_step = None
            CURRENT_STEP.reset(token)
            if self.ctx.pause.requested:
                self.ctx.pause.wake()  # a checkpoint waiting for this step may pause the run now
        # Reached when the step's own scope was cancelled, or the tool raised Cancelled.
        await self._settle_cancelled()
        self.ctx.delivered = True
        raise Cancelled(self.ctx.cancel_reason or "user", task_id=self.ctx.run_id)

    async def _invoke(self) -> Any:
        if self.tool.is_async:
            return await self.tool.fn(*self.args, **self.kwargs)
        self.thread = start_thread(self.tool.fn, self.args, self.kwargs)
        return await self.thread.result

    async def _commit(self, value: Any) -> Any:
        index = self.step.index
        # An unserialisable result raises InputError: run() settles the step failed.
        text = JSONText(dump_json(value, f"the result of step {index} ({self.tool.name})"))
        durable = not self.tool.policy.may_defer_settle
        await settle(self.ctx, index, StepStatus.COMMITTED, result=text, durable=durable)
        # Hand the task the journaled form, so that a replay sees exactly the same value.
        return value if type(value) in _SAME_AFTER_JSON else json.loads(text)

    async def _settle_cancelled(self) -> None:
        status = await self._cancelled_status()
        await settle(self.ctx, self.step.index, status)

    async def _cancelled_status(self) -> StepStatus:
        if self.policy is CancelPolicy.INTERRUPTIBLE:
            return StepStatus.INTERRUPTED
        if self.policy is CancelPolicy.FINISH or self.ctx.forced:
            return StepStatus.UNKNOWN
        if not await self._stopped():
            return StepStatus.UNKNOWN
        compensated = await compensate(self.ctx, self.tool, self.args, self.kwargs)
        return StepStatus.COMPENSATED if compensated else StepStatus.UNKNOWN

    async def _stopped(self) -> bool:
        """Wait (shielded, within grace) until a plain rollback tool's thread has ended."""
        if self.thread is None:
            return True
        with anyio.move_on_after(self.tool.policy.grace, shield=True):
            await asyncio.shield(self.thread.finished)
            return True
        return False


async def compensate(
    run: RunContext, tool: Tool[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Run the tool's compensation, shielded, within its grace; True if it completed.

    A forced cancel still cuts it short (it is registered like a shield), and then it counts as
    not completed: the step becomes ``unknown``.
    """
    undo = tool.policy.compensate
    if undo is None or run.forced:
        return False
    with anyio.move_on_after(tool.policy.grace, shield=True) as scope:
        run.shield_scopes.append(scope)
        try:
            if inspect.iscoroutinefunction(undo):
                await undo(*args, **kwargs)
            else:
                await start_thread(undo, args, kwargs).result
            return True
        except Exception:
            return False
        finally:
            run.shield_scopes.remove(scope)
    return False
