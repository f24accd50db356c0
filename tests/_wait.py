"""The tests' one "wait until" helper: poll a condition with a deadline, never a bare sleep.

A test waits on an event where there is one (a gate of ``toolkit``, ``Runtime.changes()``, a
line a child process prints); where the only way to see a thing is to look again (a state in
the journal, a file another process writes), it polls here: short intervals, a deadline, and
on the deadline a failure that says what was awaited and what was last seen. Speed is never
asserted (that is bench/'s), so the deadline is generous.
"""

from __future__ import annotations

import inspect
import subprocess
import time
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


def wait_until(
    condition: Callable[[], bool],
    what: str = "the condition",
    *,
    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
    timeout: float = PATIENCE,
    interval: float = 0.01,
) -> None:
    """:func:`until` for a test that waits outside an event loop (on another process): return
    once ``condition()`` is true. Fails at the deadline, or at once if ``process`` (the one
    expected to make it true) has exited, with what it printed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process ended first: {process.communicate()}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)
