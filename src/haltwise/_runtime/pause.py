"""Pausing a run being worked here: the gate its checkpoints wait at, and delivering requests.

A pause asks a run to stop at its next checkpoint without cancelling anything (CONTRACT.md,
"Stopping verbs beyond cancel"). The request is recorded in the store first (the run stays
``running``, with ``pause`` set); the runtime working the run learns of it at once when it is
in this process (:meth:`PauseGate.request`) and through its watcher otherwise
(:func:`deliver_pause_signals`). Steps in flight run to their end, whatever their policy. The
first checkpoint reached with no step in flight records ``running -> paused`` and every
checkpoint then waits on an event (no polling, no busy wait) until an unpause or a cancel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .._core.exceptions import InvalidTransitionError
from .._core.outcome import saga_steps
from .._core.policy import OnCancel
from .._core.states import State

if TYPE_CHECKING:
    from .._journal.store import Store
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
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def request(self) -> None:
        """A pause request was recorded: stop at the next checkpoint with nothing in flight."""
        self.requested = True
        self.generation += 1
        self.wake()

    def lift(self) -> None:
        """The pause was undone (an unpause, or a cancel that overrides it): go on."""
        self.requested = False
        self.paused = False
        self.generation += 1
        self.wake()

    def wake(self) -> None:
        """Let every waiting checkpoint look again (a step ended, a request changed)."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def changed(self) -> None:
        """Wait until :meth:`wake` is called next."""
        await self._changed.wait()


async def pause_point(run: RunContext) -> None:
    """The pause half of a checkpoint: wait here while the run's pause is in effect.

    Returns at once when no pause is requested or a cancel is pending (the caller's cancel
    checkpoint then raises). The first caller that finds no step in flight records the run
    ``paused``; if an unpause or a cancel was recorded first, the store refuses that transition
    and the pause is over (a cancel then reaches the run as usual).
    """
    gate = run.pause
    while gate.requested and run.cancel.reason is None and run.poison is None:
        if gate.paused or gate.entering or run.flights:
            try:
                await gate.changed()
            except anyio.get_cancelled_exc_class():
                if run.cancel.reason is None:
                    raise
                return  # the cancel reached this wait first: the caller's checkpoint raises it
            continue
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


async def deliver_pause_signals(store: Store, active: Mapping[str, RunContext]) -> None:
    """Act on pause, unpause and cancel-while-paused requests other processes recorded.

    A run held here with a pause requested in the store is told to pause; one whose request
    was undone (an unpause) goes on; one that a cancel ended while it was paused (``paused ->
    cancelled``, recorded by the canceller) is delivered that cancel, so that its task stops.
    """
    watched = [run_id for run_id, run in active.items() if run.pause.requested]
    before = {run_id: run.pause.generation for run_id, run in active.items()}
    signals = await store.pause_signals(list(active), watched=watched)
    for run_id, run in list(active.items()):
        signal = signals.get(run_id)
        gate = run.pause
        if signal is None or gate.generation != before.get(run_id) or gate.entering:
            continue  # nothing to say, or read while this process changed it: look next time
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
