"""Plain-function tools in daemon threads that can be abandoned.

anyio's worker threads cannot be left behind at exit, and the contract wants an abandoned plain
tool not to keep the process alive, so each call gets its own daemon thread. The result comes
back through two asyncio futures: ``result`` (cancellable: awaiting it is where a cancel lands)
and ``finished`` (set whenever the thread ends, for "wait until it has really stopped").
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ThreadCall:
    result: asyncio.Future[Any]
    finished: asyncio.Future[None]


def start_thread(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ThreadCall:
    """Run ``fn(*args, **kwargs)`` in a new daemon thread, in a copy of the current context."""
    loop = asyncio.get_running_loop()
    call = ThreadCall(result=loop.create_future(), finished=loop.create_future())
    context = contextvars.copy_context()

    def deliver(value: Any, error: BaseException | None) -> None:
        if not call.result.done():  # a cancelled await abandoned it: the late result is dropped
            if error is not None:
                call.result.set_exception(error)
            else:
                call.result.set_result(value)
        if not call.finished.done():
            call.finished.set_result(None)

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the loop is gone: nobody is waiting any more
            pass

    name = f"haltwise-tool-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=target, name=name, daemon=True).start()
    return call
