"""What a task or tool calls: emit, checkpoint, cancel_requested, idempotency_key, shield."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from .._core.exceptions import InputError, NotInTaskError
from .._core.records import dump_json
from .pause import pause_point
from .run_context import CURRENT_RUN, CURRENT_STEP, current_run

__all__ = ["cancel_requested", "checkpoint", "current_run", "emit", "idempotency_key", "shield"]


def emit(value: Any) -> None:
    """Hand out a partial result; it is durable in the journal when this returns.

    The n-th ``emit`` of a run is the same partial result in every attempt: on resume, emits the
    replayed part of the task already made are not recorded again. Raises
    :class:`~haltwise.InputError` (and records nothing) if ``value`` is not JSON-serialisable,
    and :class:`~haltwise.NotInTaskError` outside a task. It blocks the calling thread for the
    commit, which is what makes the promise hold across a crash.
    """
    run = current_run()
    if run is None:
        raise NotInTaskError("haltwise.emit() was called outside a task")
    dump_json(value, "a partial result")
    seq = run.next_partial
    if seq >= run.journaled_partials:
        run.store.append_partial_blocking(run.run_id, seq, value, fence=run.fence)
    run.next_partial = seq + 1


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
        if run.forced:
            scope.cancel()
        run.shield_depth += 1
        run.shield_scopes.append(scope)
        try:
            yield
        finally:
            run.shield_depth -= 1
            run.shield_scopes.remove(scope)
