"""Pausing a run being worked here: its checkpoints' wait, recording it paused, and delivering
the requests other processes recorded. The gate itself (a run's pause in memory) is
:class:`~.pause_state.PauseGate`, as a run's cancel in memory is
:class:`~.cancel_state.CancelState`.

A pause asks a run to stop at its next checkpoint without cancelling anything (CONTRACT.md,
"Stopping verbs beyond cancel"). The request is recorded in the store first (the run stays
``running``, with ``pause`` set); the runtime working the run learns of it at once when it is
in this process (:meth:`~.pause_state.PauseGate.request`) and through its watcher otherwise
(:func:`deliver_pause_signals`). Steps in flight run to their end, whatever their policy. The
first checkpoint reached with no step in flight records ``running -> paused`` and every
checkpoint then waits on an event (no polling, no busy wait) until an unpause or a cancel.

A child run is one step of its parent: the parent's pause is relayed to it (and the parent's
unpause), and a parent whose only steps in flight are paused children is at rest, so it pauses
too (see ``children.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio

from .._core.exceptions import InvalidTransitionError
from .._core.outcome import saga_steps
from .._core.policy import OnCancel
from .._core.states import State
from .pause_state import PauseGate
from .spans import run_event

if TYPE_CHECKING:
    from .._journal.store import PauseSignal, Store
    from .run_context import RunContext


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
    its child run; a pause of the parent pauses the child, and then the parent may pause) and
    calls whose approval request awaits a decision (nothing of them has run)."""
    children = run.children
    return all(
        (index in children and children[index].paused) or getattr(flight, "awaiting", False)
        for index, flight in run.flights.items()
    )


def _pausing(run: RunContext) -> bool:
    return run.pause.requested and run.cancel.reason is None and run.poison is None


def _may_enter(run: RunContext) -> bool:
    gate = run.pause
    return not (gate.paused or gate.entering) and at_rest(run)


async def _record_pause(run: RunContext) -> None:
    gate = run.pause
    gate.entering = True
    gate.touch()
    try:
        with anyio.CancelScope(shield=True):
            await _enter_pause(run)
    finally:
        gate.entering = False
        gate.touch()
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
    run_event(run.trace, "haltwise.paused")


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
    # O(runs with a signal) when no run here has a pause requested or a child run in flight
    # (this runs whenever the store changed, the process's own commits included): one stamp
    # for all the runs, not one per run (see PauseGate.clock).
    mark = PauseGate.clock
    watched = (
        [run_id for run_id, run in active.items() if run.pause.requested]
        if PauseGate.requesting
        else []
    )
    parents = [run for run in active.values() if run.children] if PauseGate.following else []
    signals = await store.pause_signals(active.keys(), watched=watched)
    current = True
    for run_id, signal in signals.items():  # a run without a signal has nothing to act on
        held = active.get(run_id)
        if held is not None:
            current = _deliver(held, signal, mark) and current
    for run in parents:
        await relay_to_children(run)
    return current


def _deliver(run: RunContext, signal: PauseSignal | None, mark: int) -> bool:
    """Act on one run's signal, unless this process changed its pause since the stamp
    ``mark`` (then False: the signal is to be read again)."""
    gate = run.pause
    if signal is None:
        return True
    if gate.generation > mark or gate.entering:
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
