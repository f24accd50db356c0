"""``haltwise.run``: one task run to its end from synchronous code (a script's entry point)."""

from __future__ import annotations

from typing import Any

import anyio

from .._core.outcome import Outcome
from .runtime import Runtime
from .tool import Task

__all__ = ["run"]


def run(
    task: Task[..., Any],
    /,
    *args: Any,
    task_id: str | None = None,
    deadline: float | None = None,
    store: str | None = None,
    **kwargs: Any,
) -> Outcome:
    """Run ``task(*args, **kwargs)`` to a final state and return its outcome (blocking).

    A convenience over :class:`Runtime` for scripts: it opens the store (``store`` URL, else
    ``$HALTWISE_STORE``, else the default SQLite file), starts the run, waits for its outcome and
    closes the store. A failed run is returned as an outcome, not raised.
    """

    async def main() -> Outcome:
        async with Runtime(store) as runtime:
            handle = await runtime.start(task, *args, task_id=task_id, deadline=deadline, **kwargs)
            return await handle.outcome()

    return anyio.run(main)
