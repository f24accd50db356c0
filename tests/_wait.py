"""The tests' one "wait until" helper: poll a condition with a deadline, never a bare sleep.

A test waits on an event where there is one (a gate of ``toolkit``, ``Runtime.changes()``, a
line a child process prints); where the only way to see a thing is to look again (a state in
the journal, a file another process writes), it polls here: short intervals, a deadline, and
on the deadline a failure that says what was awaited and what was last seen. Speed is never
asserted (that is bench/'s), so the deadline is generous.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio

import haltwise

#: how long a test waits for something that takes milliseconds when all is well
PATIENCE = 30.0


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    *,
    timeout: float = PATIENCE,
    interval: float = 0.002,
) -> None:
    """Return once ``condition()`` (a plain or an async function) is true; fail after
    ``timeout`` seconds saying ``what`` was awaited."""
    with anyio.move_on_after(timeout):
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            await anyio.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


async def until_state(
    rt: haltwise.Runtime, run_id: str, state: haltwise.State, timeout: float = PATIENCE
) -> haltwise.Outcome:
    """Wait until the journal has run ``run_id`` in ``state``; return its outcome then. Past
    the deadline, fail saying which state the run was in instead."""
    seen: list[haltwise.Outcome] = []

    async def reached() -> bool:
        seen[:] = [await rt.status(run_id)]
        return seen[0].state is state

    try:
        await until(reached, f"run {run_id} {state.value}", timeout=timeout)
    except AssertionError:
        last = f"{seen[0].state.value} ({seen[0].reason})" if seen else "unread"
        raise AssertionError(
            f"run {run_id} not {state.value} after {timeout:g} s: {last}"
        ) from None
    return seen[0]
