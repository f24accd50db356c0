"""The rules of a run's requests and transitions, as pure functions of what the journal holds.

Whether a transition may happen now (and what it clears: :func:`check_transition`), what a
cancel request does in each state (:func:`plan_cancel`), what a pause and an unpause write
(:func:`plan_pause`, :func:`plan_unpause`). Both stores build their writes from these
(``_journal/sql``), so each rule has this one home.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .exceptions import InvalidTransitionError
from .states import PAUSABLE_STATES, State, is_allowed

if TYPE_CHECKING:
    from .records import Owner, RunRecord


class RunHead(Protocol):
    """What the rules of a transition read of a run (a :class:`RunRecord` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def pause(self) -> bool: ...

    @property
    def owner(self) -> Owner | None: ...


class CancelHead(Protocol):
    """What the plan of a cancel request reads of a run
    (:func:`haltwise._journal.sql.plan_cancel_write`), and nothing more: runs with the same
    :func:`~haltwise._journal.sql.cancel_plan_key` share one plan."""

    @property
    def state(self) -> State: ...

    @property
    def force(self) -> bool: ...

    @property
    def settle_on_cancel(self) -> bool: ...


def check_transition(
    run_id: str, current: RunHead, target: State, expected: Collection[State]
) -> dict[str, Any]:
    """Raise :class:`InvalidTransitionError` unless ``current -> target`` may happen now;
    return the columns the transition writes besides the caller's (the pause request's rule).

    A run enters ``paused`` only while a pause is requested (an unpause or a cancel recorded
    first wins). The request (and ``settle_on_cancel``) is cleared when the run leaves
    ``paused`` (an unpause, a cancel) and when it ends; a ``pending`` run starting keeps it (it
    pauses at its first checkpoint).
    """
    state = current.state
    if (
        state not in expected
        or not is_allowed(state, target)
        or (target is State.PAUSED and not current.pause)
    ):
        raise InvalidTransitionError(run_id, state.value, target.value)
    if target.is_final or state is State.PAUSED:
        return {"pause": False, "settle_on_cancel": False}
    return {}


@dataclass(frozen=True, slots=True)
class CancelPlan:
    """What a cancel request does to a run in a given state (see :meth:`Store.request_cancel`)."""

    target: State | None  # the state to move to, None to stay
    set_reason: bool
    set_force: bool

    @property
    def release(self) -> bool:
        """A run cancelled before it began, or while paused, has no owner any more (final
        runs are unowned)."""
        return self.target is not None and self.target.is_final

    def fields(self, reason: str) -> dict[str, Any]:
        """The run columns to write; empty when the request changes nothing."""
        fields: dict[str, Any] = {}
        if self.set_reason:
            fields["reason"] = reason
        if self.set_force:
            fields["force"] = True
        if self.target is not None:
            fields["state"] = self.target.value
            fields["pause"] = False  # a cancel overrides a pause request
            fields["settle_on_cancel"] = False
        if self.release:
            fields.update(owner=None, owner_token=None, lease_until=None)
        return fields


def plan_cancel(current: State, current_force: bool, force: bool, *, settles: bool) -> CancelPlan:
    """``pending`` runs, and ``paused`` ones with nothing to settle (``settles`` False: no step in
    flight, no saga to run), end ``cancelled`` at once; a ``paused`` run with something to settle
    goes ``cancelling`` like a running one, for its owner (or the canceller, if nobody works it)
    to settle it and record ``cancelled``."""
    if current is State.PENDING or (current is State.PAUSED and not settles):
        return CancelPlan(State.CANCELLED, set_reason=True, set_force=force)
    if current in (State.RUNNING, State.PAUSED):
        return CancelPlan(State.CANCELLING, set_reason=True, set_force=force)
    if current is State.CANCELLING and force and not current_force:
        return CancelPlan(None, set_reason=False, set_force=True)
    return CancelPlan(None, set_reason=False, set_force=False)


def plan_pause(current: RunRecord, reason: str | None = None) -> dict[str, Any]:
    """The run columns a pause request writes (see :meth:`Store.request_pause`); ``reason``
    (``"budget"``: a run pausing itself for its budget) is the run's reason until the unpause."""
    if current.state in PAUSABLE_STATES and not current.pause:
        return {"pause": True} if reason is None else {"pause": True, "reason": reason}
    return {}


def plan_unpause(current: RunRecord) -> tuple[State | None, dict[str, Any]]:
    """The state an unpause moves the run to (None: stays) and the columns it writes."""
    # A pause's reason ("budget": see plan_pause) goes with it. The runtime sets no other on a
    # run that may be paused (a cancel's is, and a cancelling run is never paused; a resume
    # clears the ended attempt's), so the reason is cleared whoever wrote it: the store keeps
    # no separate pause reason (the transition machine of test_store_contract found a cancel's
    # reason a bare store transition had kept on a resumed run, cleared here).
    cleared = {"reason": None} if current.reason is not None else {}
    if current.state is State.PAUSED:
        # leaving paused clears the request and settle_on_cancel (see check_transition)
        return State.RUNNING, {
            "state": State.RUNNING.value,
            "pause": False,
            "settle_on_cancel": False,
            **cleared,
        }
    if current.pause:
        return None, {"pause": False, **cleared}
    return None, {}
