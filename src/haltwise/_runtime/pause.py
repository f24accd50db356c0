"""Pausing a run being worked here: the gate its checkpoints wait at, and delivering requests.

A pause asks a run to stop at its next checkpoint without cancelling anything (CONTRACT.md,
"Stopping verbs beyond cancel"). The request is recorded in the store first (the run stays
``running``, with ``pause`` set); the runtime working the run learns of it at once when it is
in this process (:meth:`PauseGate.request`) and through its watcher otherwise
(:func:`deliver_pause_signals`). Steps in flight run to their end, whatever their policy. The
first checkpoint reached with no step in flight records ``running -> paused`` and every
checkpoint then waits on an event (no polling, no busy wait) until an unpause or a cancel.

A child run is one step of its parent: the parent's pause is relayed to it (and the parent's
unpause), and a parent whose only steps in flight are paused children is at rest, so it pauses
too (see ``children.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .._core.exceptions import InvalidTransitionError
from .._core.outcome import saga_steps
from .._core.policy import OnCancel
from .._core.states import State

if TYPE_CHECKING:
    from .._core.records import RunRecord
    from .._journal.store import PauseSignal, Store
    from .run_context import RunContext


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
    #: counts what this process learnt or did about the pause: the watcher drops what it read
    #: from the store while this changed (it may be older than what the process knows)
    generation: int = 0
    #: the gate of the parent run whose step this run is (a child run worked in the same
    #: process): woken with this one, so that the parent sees its child pause or go on
    parent: PauseGate | None = None
    #: this run's pause was asked for by its parent's (see :func:`relay_to_children`): the
    #: parent's unpause undoes it
    by_parent: bool = False
    #: the event the next wake sets, made only when someone waits for it (most runs never do)
    _changed: anyio.Event | None = None

    def restore(self, run: RunRecord) -> None:
        """Take the pause as the journal holds it for ``run``, which this process begins to
        work: requested if the run has a pause request, paused if it is recorded ``paused``."""
        self.requested = run.pause
        self.paused = run.state is State.PAUSED

    def follow(self, parent: PauseGate) -> None:
        """This run is a child step of the run whose gate is ``parent``, worked here: each
        :meth:`wake` of this gate wakes ``parent`` too, until :meth:`unfollow`."""
        self.parent = parent

    def unfollow(self) -> None:
        """The child step has ended: stop waking the parent's gate."""
        self.parent = None

    def request(self) -> None:
        """A pause request was recorded: stop at the next checkpoint with nothing in flight."""
        self.requested = True
        self.generation += 1
        self.wake()

    def lift(self) -> None:
        """The pause was undone (an unpause, or a cancel that overrides it): go on. Nothing
        changes for a run with no pause requested nor in effect."""
        if not (self.requested or self.paused):
            return
        self.requested = False
        self.paused = False
        self.generation += 1
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

    def next_change(self) -> anyio.Event:
        """The event the next :meth:`wake` sets (taken before acting, so as to miss none)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed


async def pause_point(run: RunContext) -> None:
    """The pause half of a checkpoint: wait here while the run's pause is in effect.

    Returns at once when no pause is requested or a cancel is pending (the caller's cancel
    checkpoint then raises). The first caller that finds the run at rest (:func:`at_rest`: no
    step in flight but paused child runs) records the run ``paused``; if an unpause or a cancel
    was recorded first, the store refuses that transition and the pause is over (a cancel then
    reaches the run as usual).
    """
    gate = run.pause
    while _pausing(run):
        if not _may_enter(run):
            try:
                await gate.changed()
            except anyio.get_cancelled_exc_class():
                if run.cancel.reason is None:
                    raise
                return  # the cancel reached this wait first: the caller's checkpoint raises it
            continue
        await _record_pause(run)


async def pause_if_at_rest(run: RunContext) -> None:
    """Record the run ``paused`` now if its pause is requested and it is at rest, without
    waiting: what a checkpoint would do, for a run whose code is waiting in a child step."""
    if _pausing(run) and _may_enter(run):
        await _record_pause(run)


async def relay_to_children(run: RunContext) -> None:
    """Make the pause of the run's child runs in flight here follow the run's own.

    A pause of the run pauses each child not already pausing (and, through it, the child's
    own children); when the run's pause is undone (an unpause), the pauses it asked for are
    undone too, not a pause someone asked of the child itself. A cancel is not relayed here:
    the child step's cancel cancels its child.
    """
    wanted = run.pause.requested and run.cancel.reason is None
    for index, child in list(run.children.items()):
        child_id = f"{run.run_id}/{index}"
        if wanted and not child.requested:
            child.by_parent = True
            await run.host.pause(child_id)
        elif not wanted and child.by_parent and run.cancel.reason is None:
            child.by_parent = False
            await run.host.unpause(child_id)


def at_rest(run: RunContext) -> bool:
    """No step of the run is in flight but child runs that are paused (a child step waits for
    its child run; a pause of the parent pauses the child, and then the parent may pause)."""
    children = run.children
    return all(index in children and children[index].paused for index in run.flights)


def _pausing(run: RunContext) -> bool:
    return run.pause.requested and run.cancel.reason is None and run.poison is None


def _may_enter(run: RunContext) -> bool:
    gate = run.pause
    return not (gate.paused or gate.entering) and at_rest(run)


async def _record_pause(run: RunContext) -> None:
    gate = run.pause
    gate.entering = True
    gate.generation += 1
    try:
        with anyio.CancelScope(shield=True):
            await _enter_pause(run)
    finally:
        gate.entering = False
        gate.generation += 1
        gate.wake()


async def _enter_pause(run: RunContext) -> None:
    """Record ``running -> paused``; if the store refuses, go by what it holds now."""
    gate = run.pause
    try:
        await run.store.transition(
            run.run_id,
            State.PAUSED,
            expected={State.RUNNING},
            settle_on_cancel=await settles_on_cancel(run),
            fence=run.fence,
        )
    except InvalidTransitionError:
        now = (await run.store.load(run.run_id)).run
        if now.state is State.PAUSED and now.pause:
            gate.paused = gate.requested
        else:
            gate.lift()  # unpaused or cancelled first (a cancel then reaches the run as usual)
        return
    # An unpause (or a cancel) delivered while the write was in flight has lifted the request
    # already: the run is not paused any more.
    gate.paused = gate.requested


async def settles_on_cancel(run: RunContext) -> bool:
    """Whether a cancel of the run, paused now, has something to settle: a step still in flight
    (a child run paused with it) or a saga to run (``on_cancel="compensate"`` with a committed
    rollback step). If so, the cancel goes ``cancelling`` and the run's owner finishes it; if
    not, it ends the run ``cancelled`` at once (CONTRACT.md, "Stopping verbs beyond cancel")."""
    if run.flights:
        return True
    if run.task.on_cancel is not OnCancel.COMPENSATE:
        return False
    return bool(saga_steps((await run.store.load(run.run_id)).steps))


async def deliver_pause_signals(store: Store, active: Mapping[str, RunContext]) -> bool:
    """Act on pause, unpause and cancel-while-paused requests other processes recorded.

    A run held here with a pause requested in the store is told to pause; one whose request
    was undone (an unpause) goes on; one that a cancel ended while it was paused (``paused ->
    cancelled``, recorded by the canceller) is delivered that cancel, so that its task stops.
    Returns False if a signal was read while this process changed that run's pause (it is
    dropped, being perhaps older than what the process knows: read it again), else True.
    """
    watched = []
    parents = []
    before = {}
    for run_id, run in active.items():  # one pass: this runs at every tick of the watcher
        before[run_id] = run.pause.generation
        if run.pause.requested:
            watched.append(run_id)
        if run.children:
            parents.append(run)
    signals = await store.pause_signals(list(before), watched=watched)
    current = True
    for run_id, signal in signals.items():  # a run without a signal has nothing to act on
        held = active.get(run_id)
        if held is not None:
            current = _deliver(held, signal, before.get(run_id)) and current
    for run in parents:
        await relay_to_children(run)
    return current


def _deliver(run: RunContext, signal: PauseSignal | None, generation: int | None) -> bool:
    """Act on one run's signal, unless this process changed its pause since ``generation``
    (then False: the signal is to be read again)."""
    gate = run.pause
    if signal is None:
        return True
    if gate.generation != generation or gate.entering:
        return False  # read while this process changed it: look next time
    if signal.state is State.CANCELLED:
        run.request_cancel(signal.reason or "user", force=signal.force)
    elif signal.state is State.RUNNING and gate.paused:
        gate.lift()  # unpaused meanwhile (and perhaps asked to pause again since)
        if signal.pause:
            gate.request()
    elif signal.pause and not gate.requested:
        gate.request()
    elif not signal.pause and gate.requested and signal.state is State.RUNNING:
        gate.lift()  # withdrawn before it took effect
    return True
