"""What a task or tool calls: emit, checkpoint, cancel_requested, idempotency_key, shield."""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio

from .._core.exceptions import InputError, NotInTaskError
from .._core.outcome import Outcome
from .._core.records import JSONText, PartialKey, dump_json
from .cancel_state import NATIVE_CANCEL
from .pause import pause_point
from .run_context import CURRENT_RUN, CURRENT_STEP, SHIELDED, RunContext, current_run

__all__ = [
    "aemit",
    "cancel_current_run",
    "cancel_requested",
    "checkpoint",
    "cooperative_stop",
    "current_run",
    "emit",
    "end_cooperative_stop",
    "end_turn",
    "idempotency_key",
    "journaled_outcome",
    "remote_call",
    "shield",
    "steps_settled",
    "turn_begins",
]

T = TypeVar("T")

#: How long a remote cancel may take to be sent under a forced cancel (CONTRACT.md, "A cancel
#: reaches remote work").
FORCED_REMOTE_CANCEL = 1.0
#: the runs whose framework turn holds back the cancel of the task's scope (see turn_begins)
_TURNS: weakref.WeakSet[RunContext] = weakref.WeakSet()
#: the cooperative stops of each run, by key, and how each is released (see cooperative_stop)
_STOPS: weakref.WeakKeyDictionary[RunContext, dict[object, Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def emit(value: Any) -> None:
    """Hand out a partial result; it is durable in the journal when this returns.

    A partial result belongs to whoever emitted it: a step (when emitted inside a tool) or the
    task's own code; the n-th partial result of each is the same in every attempt. So on
    resume a replayed step emits nothing again (its partial results stay where they are), and
    the task's code does not repeat the ones it already made. Raises
    :class:`~haltwise.InputError` (and records nothing) if ``value`` is not JSON-serialisable,
    and :class:`~haltwise.NotInTaskError` outside a task. It blocks the calling thread for the
    commit, which is what makes the promise hold across a crash; :func:`aemit` does not.
    """
    due = _next_partial(value, "emit")
    if due is not None:
        run, seq, text, origin = due
        run.store.append_partial_blocking(run.run_id, seq, text, fence=run.fence, origin=origin)
        run.progress.pulse()


async def aemit(value: Any) -> None:
    """:func:`emit` without blocking the event loop: durable when it returns.

    The write is group-committed with the other writes ready at the same time (other runs'
    steps, concurrent steps of this run). Same numbering and errors as :func:`emit`.
    """
    due = _next_partial(value, "aemit")
    if due is not None:
        run, seq, text, origin = due
        await run.store.append_partial(run.run_id, seq, text, fence=run.fence, origin=origin)
        run.progress.pulse()


def _next_partial(value: Any, name: str) -> tuple[RunContext, int, JSONText, PartialKey] | None:
    """Check and number a partial result; None if the journal holds it already (a replay)."""
    run = current_run()
    if run is None:
        raise NotInTaskError(f"haltwise.{name}() was called outside a task")
    text = JSONText(dump_json(value, "a partial result"))
    step = CURRENT_STEP.get()
    origin = step.next_origin() if step is not None and step.run is run else run.next_task_origin()
    seq = run.next_partial_seq(origin)
    return None if seq is None else (run, seq, text, origin)


async def checkpoint() -> None:
    """Act on a pending cancel or pause request: raise :class:`~haltwise.Cancelled` if a cancel
    is due; wait here while the run is paused (see :meth:`haltwise.Runtime.pause`).

    Level-triggered, as in Trio: once a cancel was requested, every later checkpoint raises
    again, except inside :func:`shield`. Raises :class:`~haltwise.NotInTaskError` outside a
    task (there is no run whose cancel it could act on).
    """
    run = current_run()
    if run is None:
        raise NotInTaskError("haltwise.checkpoint() was called outside a task")
    await pause_point(run)
    run.raise_if_cancelled()
    await anyio.lowlevel.checkpoint()


async def cancel_current_run(reason: str = "host", *, force: bool = False) -> bool:
    """Record a cancel request for the run whose code (or tool) calls this, and deliver it.

    For an integration whose framework stopped the agent without raising anything into the task
    (the OpenAI Agents SDK's streamed ``cancel()`` just ends the stream): the run is recorded
    ``cancelling`` at once, its steps in flight settle by their policies, and it ends
    ``cancelled`` with ``reason`` (``"host"`` by default) instead of ``completed`` with whatever
    the framework returns. The request is as :meth:`Runtime.cancel`'s (``force`` too), and the
    task's code is then cancelled at its next await outside a shield, as by any cancel.

    Returns True if the request was recorded now; False, doing nothing, outside a task or when a
    cancel of the run is already requested. Shielded: it completes although the caller is being
    cancelled.
    """
    run = current_run()
    if run is None or cancel_requested():
        return False
    with anyio.CancelScope(shield=True):
        await run.host.cancel(run.run_id, reason=reason, force=force)
    return True


def cancel_requested() -> bool:
    """Whether a cancel has been requested for the current run (and is not shielded).

    A plain-function tool in a worker thread polls this to stop early: it then raises
    :class:`~haltwise.Cancelled` (the step becomes ``interrupted``) or returns (the step is
    committed). A tool that polls is waited for after a cancel, within its grace; one that never
    polls is abandoned at once if it is interruptible. False outside a task.
    """
    step = CURRENT_STEP.get()
    if step is not None:
        step.polled = True
        return step.run.cancel_pending
    run = current_run()
    return run is not None and run.cancel_pending


def idempotency_key() -> str:
    """A key for the current step: the same in every attempt and resume, unique to this step.

    Hand it to the external API so that a repeated call is recognised as the same one. Raises
    :class:`~haltwise.NotInTaskError` outside a tool call.
    """
    step = CURRENT_STEP.get()
    if step is None:
        raise NotInTaskError("haltwise.idempotency_key() was called outside a tool call")
    return step.idempotency_key


@asynccontextmanager
async def shield(seconds: float) -> AsyncIterator[None]:
    """Hold off a cancel for at most ``seconds`` so that cleanup can call tools.

    Inside the block checkpoints do not raise and steps run as if no cancel was requested. When
    ``seconds`` run out, whatever is still running in the block is interrupted (its step
    settled by its policy) and the block is left; the cancel is then delivered at the next
    checkpoint. A forced cancel goes through a shield. Outside a task it only bounds the time.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise InputError(f"shield(seconds) needs a number of seconds >= 0, not {seconds!r}")
    run = CURRENT_RUN.get()
    with anyio.move_on_after(seconds, shield=True) as scope:
        if run is None:
            yield
            return
        token = SHIELDED.set(True)
        try:
            with run.cancel.shielding(scope):  # a forced cancel cancels it (at once if forced)
                yield
        finally:
            SHIELDED.reset(token)


async def journaled_outcome() -> Outcome | None:
    """The current run's outcome as journaled now (inside a task; ``None`` outside one), for a
    face that must read the run it is part of (an integration closing dangling calls)."""
    run = current_run()
    if run is None:
        return None
    return (await run.store.load(run.run_id)).outcome()


async def remote_call(
    call: Callable[[], Awaitable[T]], flush: Callable[[], Awaitable[Any]], *, grace: float
) -> T:
    """``await call()``, a request to a remote service whose client sends the remote cancel
    when ``call`` is cancelled (the MCP SDK sends ``notifications/cancelled``), so that a cancel
    of the run reaches the remote work (CONTRACT.md, "A cancel reaches remote work").

    The cancel of a run is level-triggered: cancelling the task's scope would also cancel the
    client's own tasks (a transport's writer), and the remote cancel would never leave. So while
    ``call`` runs, a cancel request cancels ``call`` alone and holds back the cancel of the
    task's scope; once ``call`` has ended cancelled, ``flush()`` (a round trip on the same
    connection: the remote cancel went before it) runs shielded, bounded by ``grace`` seconds,
    or by 1 s under a forced cancel; only then is the run's cancel let through, and the step
    settles as any cancelled step. Outside a step of a run it is ``await call()``.
    """
    run = current_run()
    step = CURRENT_STEP.get()
    if run is None or step is None or step.run is not run or SHIELDED.get():
        return await call()
    cancel = run.cancel
    scope = anyio.CancelScope()
    bound = anyio.CancelScope(shield=True)

    def stop() -> None:
        scope.cancel()
        limit = FORCED_REMOTE_CANCEL if cancel.forced else grace
        bound.deadline = min(bound.deadline, anyio.current_time() + limit)

    if cancel.requested:
        return await call()  # the task's scope is cancelled already: the call never starts
    cancel.hold_for(stop, through_force=True)
    try:
        try:
            with scope:
                return await call()
        except NATIVE_CANCEL:
            await _flush_within(bound, flush)  # a cancel of this task (a host's, a gather's)
            raise
        await _flush_within(bound, flush)
    finally:
        cancel.release_for(stop)
    await anyio.lowlevel.checkpoint()  # the run's cancel lands here
    run.raise_if_cancelled()
    raise AssertionError("a remote call was cancelled with no cancel of its run")


async def _flush_within(bound: anyio.CancelScope, flush: Callable[[], Awaitable[Any]]) -> None:
    if math.isinf(bound.deadline):
        bound.deadline = anyio.current_time() + FORCED_REMOTE_CANCEL
    with bound:
        try:
            await flush()
        except Exception:  # a broken connection: the cancel could not be sent
            pass


def turn_begins() -> None:
    """A framework's turn of tool calls begins in the current run: until :func:`end_turn`, a
    (not forced) cancel request settles the turn's steps by their policies but does not cancel
    the task function's own scope, so the framework completes the turn and writes it where it
    keeps the conversation (the OpenAI Agents SDK's session) before the cancel lands.

    For an integration whose model wrapper sees a response with tool calls; its next model
    request calls :func:`end_turn`, then lands the cancel at its checkpoint. Nothing outside a
    task, or while the run's turn is already held.
    """
    run = current_run()
    if run is None or run in _TURNS:
        return
    _TURNS.add(run)
    run.cancel.hold_task_scope(+1)


def end_turn() -> None:
    """The current run's framework turn (see :func:`turn_begins`) has ended: a cancel held back
    meanwhile cancels the task's scope now (it lands at the task's next await)."""
    run = current_run()
    if run is None or run not in _TURNS:
        return
    _TURNS.discard(run)
    run.cancel.hold_task_scope(-1)


async def steps_settled() -> None:
    """Wait until no step of the current run is in flight (each settled by its policy); at once
    outside a task. For an integration that closes the framework's state from the journal once
    a cancel stopped the framework (the OpenAI Agents SDK's streamed ``cancel()``)."""
    run = current_run()
    if run is not None:
        await run.all_settled()


def cooperative_stop(key: object, stop: Callable[[], None], *, margin: float) -> None:
    """Let a framework's run inside the current task stop by itself when the run is cancelled,
    so that it writes its own state first (LangGraph's drain at the next superstep boundary).

    From now on a cancel request calls ``stop`` (at once if one was made already) and holds back
    the cancel of the task's scope, which would cut the framework's loop before it wrote its
    state; the steps in flight settle by their policies as usual. The hold ends with
    :func:`end_cooperative_stop` (the framework's run ended), under a forced cancel, or, after
    a cancel request, once no step of the run has been in flight for ``margin`` seconds (a
    framework that does not stop by itself is cut then). ``key`` names the framework's run
    (held with the haltwise run, so kept alive until that ends): a second call with the same
    key does nothing. Nothing outside a task, or inside :func:`shield`.
    """
    run = current_run()
    if run is None or SHIELDED.get():
        return  # inside haltwise.shield a cancel does not stop the work
    held = _STOPS.setdefault(run, {})
    if key in held:
        return
    cancel = run.cancel
    loop = asyncio.get_running_loop()
    timer: list[asyncio.TimerHandle] = []
    idle = [False]

    def release() -> None:
        for handle in timer:
            handle.cancel()
        cancel.release_for(stopping)

    def check() -> None:
        timer.clear()
        if idle[0] and not run.flights:
            release()  # idle for a whole margin
            return
        idle[0] = not run.flights
        timer.append(loop.call_later(margin, check))

    def stopping() -> None:
        stop()
        if not timer:
            timer.append(loop.call_later(margin, check))

    held[key] = release
    cancel.hold_for(stopping)


def body_cancelled_by_host() -> bool:
    """Whether the current run's task function's own task is being cancelled by its host (an
    ``asyncio.timeout``, ``wait_for`` or ``Task.cancel()`` around the task function: a cancel
    haltwise did not request). The run then ends by the rules for a host's cancel or timeout
    leaving the task function (reason ``"host"`` or ``"timeout"``), and a framework that sees
    the cancel reach its own work must not cancel the run itself. False outside a task."""
    run = current_run()
    body = run.body_task if run is not None else None
    return (
        body is not None
        and run is not None
        and run.cancel.reason is None
        and (body.cancelling() > 0)
    )


def sibling_failed() -> None:
    """The cancellation that has just reached a step of the current run was the framework
    stopping that call because another call it ran beside it failed (LangGraph cancels the other
    tasks of a superstep and raises the failure): not a host's cancel of the run, which then
    ends by that failure as it would without haltwise. No-op outside a task."""
    run = current_run()
    if run is not None:
        run.cancel.unmark_host()


def end_cooperative_stop(key: object) -> None:
    """The framework's run ``key`` of :func:`cooperative_stop` has ended: a cancel of the
    haltwise run no longer waits for it."""
    run = current_run()
    release = _STOPS.get(run, {}).pop(key, None) if run is not None else None
    if release is not None:
        release()
