"""The cancel state of one run (``_runtime/cancel_state.py``) against anyio's cancel scopes."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from haltwise._runtime.cancel_state import CancelState, outside_any_task

pytestmark = pytest.mark.anyio


async def test_leaving_a_cancelled_task_scope_drops_its_pending_redelivery() -> None:
    """A cancel of the task function's scope leaves anyio's re-delivery of it pending for the
    next turn of the loop; a task that left the scope meanwhile (woken by the cancel, as 10,000
    runs of a bulk cancel are) has it dropped by ``leave_task_scope``: it would reach nothing."""
    state = CancelState()
    entered = anyio.Event()
    left: list[tuple[anyio.CancelScope, object]] = []

    async def body() -> None:
        with anyio.CancelScope() as scope:
            state.enter_task_scope(scope)
            entered.set()
            await anyio.sleep_forever()
        left.append((scope, getattr(scope, "_cancel_handle", None)))
        state.leave_task_scope()

    task = asyncio.ensure_future(body())
    await entered.wait()
    await outside_any_task(lambda: state.record("user", force=False))
    await task
    [(scope, pending)] = left
    assert scope.cancelled_caught
    assert isinstance(pending, asyncio.Handle)  # anyio's re-delivery, scheduled by the cancel
    assert pending.cancelled()
    assert getattr(scope, "_cancel_handle", None) is None
    assert state.task_scope is None
