"""What a task or tool calls: emit, checkpoint, cancel_requested, idempotency_key, shield."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from .._core.exceptions import InputError, NotInTaskError
from .._core.outcome import Outcome
from .._core.records import JSONText, PartialKey, dump_json
from .pause import pause_point
from .run_context import CURRENT_RUN, CURRENT_STEP, SHIELDED, RunContext, current_run

__all__ = [
    "aemit",
    "cancel_current_run",
    "cancel_requested",
    "checkpoint",
    "current_run",
    "emit",
    "idempotency_key",
    "journaled_outcome",
    "shield",
]


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
