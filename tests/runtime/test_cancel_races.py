"""A haltwise cancel meeting a framework's own cancellation handling, without any framework.

Pydantic AI cancels the task that drives its run with ``Task.cancel()``, counts those cancels,
and at its edge ``uncancel()``s exactly that many: if the task is still cancelling, an external
cancel raced in and the ``CancelledError`` is re-raised as it is (its own, which does not carry
anyio's message). Its ``raise_if_cancelling()`` re-asserts a cancellation a step absorbed with a
fresh ``CancelledError``. Either way the error that reaches the run's cancel scope is not the
one the scope sent, so the scope does not take it back: it escaped the run into the Runtime,
cancelling the caller's ``async with`` block (found with Pydantic AI in session 5). Here the
patterns themselves: the run must end ``cancelled``, nothing escape, another run complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import State
from haltwise._journal.check import check_store
from toolkit import Gate

pytestmark = pytest.mark.anyio

#: the runtime the tasks below ask for a cancel (set by the test)
RUNTIME: list[haltwise.Runtime] = []
waiting = Gate()
other_may_end = Gate()


class RunCancelled(Exception):
    """What the framework raises at its edge for a cancel of its own."""


@haltwise.task(name="races:absorbs_then_reasserts")
async def absorbs_then_reasserts() -> str:
    """A step absorbs the cancel, then the framework re-asserts it with a fresh error."""
    try:
        waiting.set()
        await asyncio.Event().wait()  # only a cancel ends this
    except asyncio.CancelledError:
        pass  # absorbed (as an awaited child task that swallowed its cancel would)
    raise asyncio.CancelledError("re-asserting a cancellation absorbed by a completed step")


@haltwise.task(name="races:own_cancel_edge")
async def own_cancel_edge() -> str:
    """The framework cancels its own task; a haltwise cancel is asked meanwhile (from a step's
    cleanup, say); the framework's teardown absorbs that one, and its edge, finding the task
    still cancelling after taking back its own cancel, re-raises its own error as external."""
    me = asyncio.current_task()
    assert me is not None
    issued = 0

    async def token() -> None:  # the framework's cancellation token, fired from elsewhere
        nonlocal issued
        issued += 1
        me.cancel()
        await RUNTIME[0].cancel(haltwise.current_task_id(), reason="host")

    asyncio.get_running_loop().create_task(token())
    try:
        await asyncio.Event().wait()  # the model request the token interrupts
    except asyncio.CancelledError as own:
        try:
            await asyncio.Event().wait()  # teardown (draining tool tasks): haltwise's cancel
        except asyncio.CancelledError:
            pass
        for _ in range(issued):
            me.uncancel()
        if me.cancelling():
            raise own  # "an external cancellation raced in: it wins"
        raise RunCancelled() from None
    return "not cancelled"


@haltwise.task(name="races:host_and_haltwise_at_once")
async def host_and_haltwise_at_once() -> str:
    """A host's ``Task.cancel()`` and a haltwise cancel in the same loop iteration."""
    me = asyncio.current_task()
    assert me is not None

    async def both() -> None:
        me.cancel()
        await RUNTIME[0].cancel(haltwise.current_task_id())

    asyncio.get_running_loop().create_task(both())
    await asyncio.Event().wait()
    return "not cancelled"


@haltwise.task(name="races:other")
async def other() -> str:
    await other_may_end.wait(timeout=60)
    return "done"


async def _cancel_when_waiting(runtime: haltwise.Runtime, run_id: str) -> None:
    await waiting.wait(timeout=60)
    await runtime.cancel(run_id)


async def _nothing(runtime: haltwise.Runtime, run_id: str) -> None:
    """The task cancels itself."""


#: task, how the test cancels it, the reasons the run may end with: the host's cancel and
#: haltwise's land in one loop iteration only where recording the request does not yield (the
#: SQLite fast path); on PostgreSQL the host's may land first, and the run is the host's
CASES: dict[str, tuple[Any, Callable[[haltwise.Runtime, str], Awaitable[None]], set[str]]] = {
    "absorbed_then_reasserted": (absorbs_then_reasserts, _cancel_when_waiting, {"user"}),
    "own_cancel_edge": (own_cancel_edge, _nothing, {"host"}),
    "host_and_haltwise_at_once": (host_and_haltwise_at_once, _nothing, {"user", "host"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_cancel_error_a_framework_raises_never_escapes_the_run(
    store_url: str, case: str
) -> None:
    global waiting, other_may_end
    waiting, other_may_end = Gate(), Gate()
    task, cancel, reasons = CASES[case]
    with anyio.fail_after(60):
        async with haltwise.Runtime(store_url) as runtime:
            RUNTIME[:] = [runtime]
            bystander = await runtime.start(other, task_id="other")
            handle = await runtime.start(task, task_id="racing")
            await cancel(runtime, "racing")
            outcome = await handle.outcome()  # before the fix: CancelledError, from the group
            assert outcome.state is State.CANCELLED, outcome
            assert outcome.reason in reasons, outcome
            assert outcome.error is None
            other_may_end.set()
            assert (await bystander.outcome()).state is State.COMPLETED
            again = await runtime.start(other, task_id="after")  # the Runtime is still usable
            assert (await again.outcome()).result == "done"
        assert (await check_store(store_url)).ok
