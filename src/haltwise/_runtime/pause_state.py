"""A run's pause in memory: :class:`PauseGate`, the request and the event its checkpoints wait on.

It knows neither the run nor the journal (as :class:`~.cancel_state.CancelState` for a cancel):
what reads and writes the journal for a pause is :mod:`.pause`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import anyio
import anyio.lowlevel

from .._core.states import State

if TYPE_CHECKING:
    from .._core.records import RunRecord


@dataclass(eq=False)
class PauseGate:
    """The pause request of one run worked in this process, and the event its waiters watch.

    ``requested``: a pause was requested and not undone. ``paused``: the run is recorded
    ``paused`` (by one of its checkpoints, or it was found so when this process took it over).
    Set from the event-loop thread only.
    """

    requested: bool = False
    paused: bool = False
    #: a checkpoint is recording ``paused`` right now (the others wait for it)
    entering: bool = False
    #: when this process last learnt or did something about the pause (a stamp of
    #: :attr:`clock`): the watcher drops what it read from the store for a run whose gate
    #: changed while it read (it may be older than what the process knows)
    generation: int = 0
    #: the gate of the parent run whose step this run is (a child run worked in the same
    #: process): woken with this one, so that the parent sees its child pause or go on
    parent: PauseGate | None = None
    #: this run's pause was asked for by its parent's (see :func:`.pause.relay_to_children`): the
    #: parent's unpause undoes it
    by_parent: bool = False
    #: the event the next wake sets, made only when someone waits for it (most runs never do)
    _changed: Edge | None = None

    #: process-wide: the stamp of the last change of any gate (:meth:`touch`), so that the
    #: watcher notes one number before it reads, not one per run it holds
    clock: ClassVar[int] = 0
    #: process-wide: how many gates have a pause requested (an upper bound: a gate dropped
    #: with its request still set stays counted), so that the watcher looks for such runs
    #: among those it holds only if there may be any
    requesting: ClassVar[int] = 0
    #: process-wide: how many gates follow a parent's (child runs in flight as a step of a
    #: run worked here), so that the watcher looks for parents only if there may be any
    following: ClassVar[int] = 0

    def touch(self) -> None:
        """Stamp a change of this gate's pause (see :attr:`generation`)."""
        PauseGate.clock += 1
        self.generation = PauseGate.clock

    def restore(self, run: RunRecord) -> None:
        """Take the pause as the journal holds it for ``run``, which this process begins to
        work: requested if the run has a pause request, paused if it is recorded ``paused``."""
        PauseGate.requesting += run.pause - self.requested
        self.requested = run.pause
        self.paused = run.state is State.PAUSED

    def follow(self, parent: PauseGate) -> None:
        """This run is a child step of the run whose gate is ``parent``, worked here: each
        :meth:`wake` of this gate wakes ``parent`` too, until :meth:`unfollow`."""
        PauseGate.following += self.parent is None
        self.parent = parent

    def unfollow(self) -> None:
        """The child step has ended: stop waking the parent's gate."""
        PauseGate.following -= self.parent is not None
        self.parent = None

    def request(self) -> None:
        """A pause request was recorded: stop at the next checkpoint with nothing in flight."""
        PauseGate.requesting += not self.requested
        self.requested = True
        self.touch()
        self.wake()

    def lift(self) -> None:
        """The pause was undone (an unpause, or a cancel that overrides it): go on. Nothing
        changes for a run with no pause requested nor in effect."""
        if not (self.requested or self.paused):
            return
        PauseGate.requesting -= self.requested
        self.requested = False
        self.paused = False
        self.touch()
        self.wake()

    def wake(self) -> None:
        """Let every waiting checkpoint look again (a step ended, a request changed)."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        if self.parent is not None:
            self.parent.wake()

    async def changed(self) -> None:
        """Wait until :meth:`wake` is called next."""
        await self.next_change().wait()

    def next_change(self) -> Edge:
        """The event the next :meth:`wake` sets (taken before acting, so as to miss none)."""
        if self._changed is None:
            self._changed = Edge()
        return self._changed


class Edge:
    """A one-shot event of the running (asyncio) event loop: :meth:`set` wakes every
    :meth:`wait`, those waiting and those to come. What a gate hands out: a run awaiting
    approval holds one for as long as it waits (10,000 such runs: ~100 bytes each, where an
    ``anyio.Event`` is ~760, most of it its ``asyncio.Event``'s deque)."""

    __slots__ = ("_done", "_futures")

    def __init__(self) -> None:
        self._done = False
        self._futures: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._done

    def set(self) -> None:
        """Set the event: wake every waiter (from the event loop's thread)."""
        if self._done:
            return
        self._done = True
        futures, self._futures = self._futures, None
        for future in futures or ():
            if not future.done():
                future.set_result(None)

    async def wait(self) -> None:
        """Return once the event is set (a checkpoint even if it is set already)."""
        if self._done:
            await anyio.lowlevel.checkpoint()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._futures is None:
            self._futures = [future]
        else:
            self._futures.append(future)
        try:
            await future
        finally:
            if self._futures is not None and future in self._futures:
                self._futures.remove(future)
