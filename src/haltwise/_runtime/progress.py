"""A notice, in this process, that a run worked here has made progress (a partial result).

For code that follows a run in the process that works it (the ``haltwise mcp`` server sends
each partial result as an MCP progress notification): it waits on the notice instead of reading
the journal again and again. The notice says only "look again"; what changed is read from the
journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import final

__all__ = ["Pulse"]


@final
class Pulse:
    """An edge-triggered notice that may be given from any thread.

    :meth:`next` returns an event that is set by the first :meth:`pulse` after the call (take it
    *before* reading what the notice is about, so that nothing given meanwhile is missed); each
    pulse wakes every event handed out before it, and none after. A pulse given while nobody
    took an event does nothing.
    """

    __slots__ = ("_event", "_loop", "_thread")

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def next(self) -> asyncio.Event:
        """The event the next pulse sets (from the event loop's thread only)."""
        if self._event is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
            self._event = asyncio.Event()
        return self._event

    def pulse(self) -> None:
        """Wake the events handed out so far (from any thread)."""
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._thread:
            self._fire()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()
