"""SIGINT and SIGTERM for a foreground run: one handler for the whole command, never removed.

``haltwise run`` and ``resume`` install :data:`RELAY` before they load anything, so a signal is
never a ``KeyboardInterrupt`` (exit 130, or death by SIGINT): one that arrives while the task is
loading or starting is queued and acted on once the run is followed, and one that arrives after
the run ended (a second Ctrl-C 20 ms after the first) is absorbed; the exit code stays the run's.
(An event loop's own signal handling would not do: removing it restores Python's default, which
raises ``KeyboardInterrupt``.)

The handler runs in the main thread between two bytecodes, so it can act even while the task's
own code keeps the event loop busy (a CPU-bound stretch with no await): when a second signal
arrives and the loop has not yet taken the first, the cancel is forced there and then, by
raising :class:`~haltwise.Cancelled` into the code that holds the loop, provided that code is
the user's (never inside haltwise, the event loop or a driver, where it could leave a lock
held). The run then ends ``cancelled``, as when a task raises ``Cancelled`` itself.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sysconfig
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType

import anyio

from .._core.exceptions import Cancelled

__all__ = ["RELAY", "SIGNAL_REASONS", "SignalRelay"]

#: The cancel reason each signal stands for.
SIGNAL_REASONS = {signal.SIGINT: "user", signal.SIGTERM: "shutdown"}


def _library_dirs() -> tuple[str, ...]:
    """Where code lives into which a forced cancel must never be raised."""
    import anyio as anyio_package

    import haltwise

    places = {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        str(Path(haltwise.__file__).parent),
        str(Path(anyio_package.__file__).parent),
        str(Path(asyncio.__file__).parent),
    }
    for optional in ("psycopg", "psycopg_pool", "rich", "click"):
        try:
            module = __import__(optional)
        except ImportError:
            continue
        places.add(str(Path(module.__file__ or "").parent))
    return tuple(os.path.join(place, "") for place in places if place)


class SignalRelay:
    """Queues SIGINT/SIGTERM for the run being followed (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: collections.deque[int] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: anyio.Event | None = None
        self._installed = False
        self._library: tuple[str, ...] = ()
        #: signals received, and how many of them the event loop has taken
        self.received = 0
        self.taken = 0

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on, in this process (main thread only)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._library = _library_dirs()
        for signum in SIGNAL_REASONS:
            signal.signal(signum, self._on_signal)
        self._installed = True

    def ignore_from_now(self) -> None:
        """Ignore SIGINT/SIGTERM for the rest of the process (the command is done).

        Python's finalisation puts back the default handlers it had replaced, so a second
        Ctrl-C arriving while the interpreter shuts down would kill the process by SIGINT
        (the run's exit code lost); an ignored signal it leaves ignored.
        """
        if self._installed:
            for signum in SIGNAL_REASONS:
                signal.signal(signum, signal.SIG_IGN)

    async def signals(self) -> AsyncIterator[int]:
        """The signals received (queued ones first), as the loop takes them; endless."""
        self._loop = asyncio.get_running_loop()
        try:
            while True:
                while self._queue:
                    self.taken += 1
                    yield self._queue.popleft()
                self._wake = anyio.Event()
                if not self._queue:
                    await self._wake.wait()
        finally:
            self._loop = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        self._queue.append(signum)
        loop, wake = self._loop, self._wake
        if loop is None:
            return  # not following a run yet (loading, starting) or any more: queued
        try:
            if wake is not None:
                loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop is closed: the run is over
            return
        if self.received - self.taken >= 2 and self._in_user_code(frame):
            # The loop has not taken the previous signal: the task's own code holds it. Force
            # the cancel where that code stands (the loop takes the queued signals later).
            self._queue.clear()
            self.taken = self.received
            raise Cancelled(SIGNAL_REASONS.get(signal.Signals(signum), "user"))

    def _in_user_code(self, frame: FrameType | None) -> bool:
        return frame is not None and not frame.f_code.co_filename.startswith(self._library)


#: The one relay of this process.
RELAY = SignalRelay()
