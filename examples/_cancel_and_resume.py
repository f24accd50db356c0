"""What the framework examples share: cancel a run mid-way, show it, resume it, show it."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import anyio

import haltwise


def show(outcome: haltwise.Outcome) -> None:
    """One line: the state, why, the retry advice, and every step with its status."""
    steps = ", ".join(f"{s.tool}:{s.status.value}" for s in outcome.steps)
    print(f"{outcome.state.value} (reason {outcome.reason}, retry {outcome.retry.value}): {steps}")


async def cancel_and_resume(
    task: haltwise.Task[..., Any],
    argument: Any,
    *,
    in_flight: anyio.Event,
    between: Callable[[], None] = lambda: None,
) -> haltwise.Outcome:
    """Start ``task(argument)`` in a scratch store, cancel it once ``in_flight`` is set, show
    the cancelled run, call ``between()``, resume it and return (and show) its outcome."""
    store = f"sqlite:///{tempfile.mkdtemp()}/haltwise.db"
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(task, argument)
        await in_flight.wait()
        await handle.cancel(reason="user")
        show(await handle.outcome())
        between()
        resumed = await (await runtime.resume(handle.id)).outcome()
    show(resumed)
    return resumed
