"""A run worked in the foreground of ``haltwise run`` / ``resume``: signals and the live view.

SIGINT (Ctrl-C) cancels the run with reason ``"user"``, SIGTERM with reason ``"shutdown"``; a
second signal of either kind forces the cancel (``finish`` steps are not waited for, no
compensation runs). The signal handlers are installed by :func:`signals_as_cancels` before the
run starts, so a signal that arrives while it is starting is queued, not lost, and never turns
into a ``KeyboardInterrupt``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from ._outcome import Outcome
from ._render import LiveView, Screen
from ._runtime import Runtime

__all__ = ["SIGNAL_REASONS", "Foreground", "signals_as_cancels"]

#: The cancel reason each signal stands for.
SIGNAL_REASONS = {signal.SIGINT: "user", signal.SIGTERM: "shutdown"}
#: How often the live view reads the journal (seconds).
_REFRESH = 0.1


class Foreground:
    """Relays signals to one run of ``runtime`` and waits for its outcome.

    Create it with :func:`signals_as_cancels`; call :meth:`follow` once the run has started.
    """

    def __init__(self, runtime: Runtime, received: AsyncIterator[int], *, quiet: bool) -> None:
        self._runtime = runtime
        self._received = received
        self._quiet = quiet
        self._run_id: str | None = None
        self._count = 0

    async def follow(self, run_id: str, screen: Screen) -> Outcome:
        """Wait until run ``run_id`` (worked by this runtime) is final; show it live meanwhile."""
        self._run_id = run_id
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._relay)
            with screen.live() as view:
                if screen.interactive:
                    tasks.start_soon(self._refresh, run_id, view)
                outcome = await self._runtime.outcome(run_id)
            tasks.cancel_scope.cancel()
        return outcome

    async def _relay(self) -> None:
        async for signum in self._received:
            await self._on_signal(signum)

    async def _on_signal(self, signum: int) -> None:
        assert self._run_id is not None
        self._count += 1
        force = self._count > 1
        reason = SIGNAL_REASONS.get(signal.Signals(signum), "user")
        await self._runtime.cancel(self._run_id, reason=reason, force=force)
        if not self._quiet:
            _tell(
                "cancel forced: stopping now"
                if force
                else f"cancelling ({reason}); send the signal again to force"
            )

    async def _refresh(self, run_id: str, view: LiveView) -> None:
        while True:
            view.show(await self._runtime.store.load(run_id))
            await anyio.sleep(_REFRESH)


@asynccontextmanager
async def signals_as_cancels(runtime: Runtime, *, quiet: bool) -> AsyncIterator[Foreground]:
    """Turn SIGINT/SIGTERM into cancels of the run the yielded :class:`Foreground` follows.

    Signals received before :meth:`Foreground.follow` names the run are queued and acted on then.
    ``quiet`` suppresses the one-line notes on stderr (for ``--json``).
    """
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        yield Foreground(runtime, received, quiet=quiet)


def _tell(text: str) -> None:
    print(f"haltwise: {text}", file=sys.stderr, flush=True)
