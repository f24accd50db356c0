"""The SQL both stores run, written once, and the pure plans that decide what a write changes.

:class:`Statements` renders every statement the two stores share from a :class:`Dialect` (the
tables' prefix and the parameter placeholder); the stores differ only in how they execute them
(SQLite on its writer, synchronously; PostgreSQL on a pooled async connection, with row locks and
``NOTIFY``) and in the few statements one dialect does in its own way (a step's start and
settlement in one round trip, claiming pending runs with ``SKIP LOCKED``).

The plans (:func:`plan_create`, :func:`plan_transition`, :func:`plan_cancel_write`) take the run
as read inside the write's transaction and say which columns to write and which events to record,
or raise; they touch no database, so the rules they enforce (the transition table, the fence,
what a cancel request does in each state) are decided in exactly one place for both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.exceptions import LostOwnershipError
from .._core.records import RunRecord, dump_json
from .._core.rules import (
    CancelHead,
    RunHead,
    check_transition,
    plan_cancel,
    plan_pause,
    plan_unpause,
)
from .._core.states import State
from .rows import EVENT_NOTE, PARTIAL_COLUMNS, RUN_COLUMNS, STEP_COLUMNS, STEP_COPY_COLUMNS
from .schema import EARLY_CANCEL_LIVE, Dialect
from .store import NewRun, PauseSignal

__all__ = [
    "Plan",
    "RunWrite",
    "Statements",
    "cancel_plan",
    "check_fence",
    "lost",
    "pause_plan",
    "pause_signals_of",
    "plan_cancel_write",
    "plan_create",
    "plan_create_cancelled",
    "plan_pause_write",
    "plan_transition",
    "plan_unpause_write",
    "transition_plan_key",
    "unpause_plan",
]


@dataclass(frozen=True, slots=True)
class RunWrite:
    """What one write does to a run: the columns to set and the transitions to record."""

    #: column -> value; ``updated_at`` included
    fields: dict[str, Any]
    #: ``(source, target, reason)`` of each transition, in order
    events: tuple[tuple[State | None, State, str | None], ...]
    at: float


#: a request's plan: the run as read in the write's transaction and the time -> the write
Plan = Callable[[RunRecord, float], RunWrite | None]


def lost(run_id: str) -> LostOwnershipError:
    return LostOwnershipError(f"run {run_id!r} is no longer held by this process", task_id=run_id)


def check_fence(run_id: str, owner_token: str | None, fence: str | None) -> None:
    """Raise :class:`LostOwnershipError` if ``fence`` is given and does not hold the run.

    Every write that sets a run's owner sets ``owner`` and ``owner_token`` together (create,
    claim, release, transition), so the token of the owner read with the run is the fence.
    """
    if fence is not None and owner_token != fence:
        raise lost(run_id)


def plan_create(run: NewRun, now: float) -> RunWrite:
    """A new run's events: its creation as ``pending`` (a fork's says what it was forked from),
    then its start if created ``running``."""
    events: list[tuple[State | None, State, str | None]] = [(None, State.PENDING, run.note)]
    if run.state is not State.PENDING:
        events.append((State.PENDING, run.state, None))
    return RunWrite(fields={}, events=tuple(events), at=now)


def early_cancel_live(expires_at: float, now: float) -> bool:
    """Whether a cancel remembered before its run existed, until ``expires_at``, applies to the
    run created at ``now`` (:meth:`Store.remember_cancel`); the statements say the same in SQL
    (``schema.EARLY_CANCEL_LIVE``)."""
    return expires_at > now


def plan_create_cancelled(reason: str, now: float) -> RunWrite:
    """A run created while a cancel pressed before it existed was remembered: its creation as
    ``pending``, then ``pending -> cancelled`` with that cancel's reason (nothing runs)."""
    events = ((None, State.PENDING, None), (State.PENDING, State.CANCELLED, reason))
    return RunWrite(fields={"reason": reason}, events=events, at=now)


def plan_transition(
    current: RunHead,
    target: State,
    expected: Collection[State],
    fields: dict[str, Any],
    *,
    fence: str | None,
    now: float,
) -> RunWrite:
    """A compare-and-set transition of ``current`` (see :meth:`Store.transition`)."""
    check_fence(current.id, current.owner.token if current.owner else None, fence)
    implied = check_transition(current.id, current, target, expected)
    reason = fields.get("reason", current.reason)
    note = fields.get(EVENT_NOTE)
    if note is not None:  # said by the event alone, not kept as the run's reason
        fields = {name: value for name, value in fields.items() if name != EVENT_NOTE}
        reason = note
    return RunWrite(
        fields={**fields, **implied, "updated_at": now},
        events=((current.state, target, reason),),
        at=now,
    )


def transition_plan_key(
    current: RunHead,
    target: State,
    expected: Collection[State],
    fields: dict[str, Any],
    fence: str | None,
) -> tuple[Any, ...]:
    """All that :func:`plan_transition` reads, but the run's id (which only what it raises
    names): transitions with the same key get the same write (a group of final transitions
    plans each key once). A field read there is added here too."""
    owner = current.owner
    return (
        target,
        frozenset(expected),
        fence,
        tuple(fields.items()),
        current.state,
        current.reason,
        current.pause,
        owner.token if owner else None,
    )


def cancel_plan_key(current: CancelHead) -> tuple[State, bool, bool]:
    """All that :func:`plan_cancel_write` reads of a run: runs with the same key get the same
    write (a bulk request plans each key once). A field read there is added here too."""
    return (current.state, current.force, current.settle_on_cancel)


def plan_cancel_write(current: CancelHead, reason: str, force: bool, now: float) -> RunWrite | None:
    """A cancel request on ``current`` (see :meth:`Store.request_cancel`); None: no change.
    It reads only what :class:`CancelHead` has (a bulk request plans runs alike once)."""
    plan = plan_cancel(current.state, current.force, force, settles=current.settle_on_cancel)
    fields = plan.fields(reason)
    if not fields:
        return None
    events = () if plan.target is None else ((current.state, plan.target, reason),)
    return RunWrite(fields={**fields, "updated_at": now}, events=events, at=now)


def cancel_plan(reason: str, force: bool, fence: str | None) -> Plan:
    """The plan of :meth:`Store.request_cancel`: :func:`plan_cancel_write`, after the fence."""

    def plan(current: RunRecord, now: float) -> RunWrite | None:
        check_fence(current.id, current.owner.token if current.owner else None, fence)
        return plan_cancel_write(current, reason, force, now)

    return plan


def plan_pause_write(current: RunRecord, now: float, reason: str | None = None) -> RunWrite | None:
    """A pause request on ``current`` (see :meth:`Store.request_pause`); None: no change.

    No event: the request is not a transition (the run's checkpoint records ``paused``)."""
    fields = plan_pause(current, reason)
    return RunWrite(fields={**fields, "updated_at": now}, events=(), at=now) if fields else None


def pause_plan(reason: str | None) -> Plan:
    """The plan of :meth:`Store.request_pause` with its ``reason``."""
    if reason is None:
        return plan_pause_write
    return lambda current, now: plan_pause_write(current, now, reason)


def plan_unpause_write(
    current: RunRecord, now: float, budget: dict[str, Any] | None = None
) -> RunWrite | None:
    """An unpause of ``current`` (see :meth:`Store.request_unpause`); None: no change.
    ``budget`` replaces the run's budget in its inputs, in the same write."""
    target, fields = plan_unpause(current)
    if budget is not None:
        inputs = {**current.inputs, "budget": budget}
        fields = {**fields, "inputs": dump_json(inputs, "the run's inputs with its budget")}
    if not fields:
        return None
    events = () if target is None else ((current.state, target, current.reason),)
    return RunWrite(fields={**fields, "updated_at": now}, events=events, at=now)


def unpause_plan(budget: dict[str, Any] | None) -> Plan:
    """The plan of :meth:`Store.request_unpause` with its ``budget``."""
    if budget is None:
        return plan_unpause_write
    return lambda current, now: plan_unpause_write(current, now, budget)


def pause_signals_of(
    rows: Iterable[Sequence[Any]], wanted: Collection[str]
) -> dict[str, PauseSignal]:
    """The rows of :attr:`Statements.pausing` (or of the same columns) among ``wanted``."""
    return {
        row[0]: PauseSignal(State(row[1]), bool(row[2]), row[3], bool(row[4]))
        for row in rows
        if row[0] in wanted
    }


class Statements:
    """Every statement the two stores share, rendered for one dialect (built once per store)."""

    def __init__(self, dialect: Dialect) -> None:
        p, q = dialect.param, dialect.qualify
        self.param = p
        self.runs, self.steps = q("runs"), q("steps")
        self.insert_run = (
            f"INSERT INTO {q('runs')} (id, task, state, inputs, owner, owner_token, lease_until, "
            f"parent, created_at, updated_at) VALUES ({', '.join([p] * 10)}) "
            f"ON CONFLICT (id) DO NOTHING RETURNING {RUN_COLUMNS}"
        )
        self.load_run = f"SELECT {RUN_COLUMNS} FROM {q('runs')} WHERE id = {p}"
        self.fence_row = f"SELECT owner_token, state, reason, force FROM {q('runs')} WHERE id = {p}"
        self.record_event = (
            f"INSERT INTO {q('events')} (run_id, source, target, reason, at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p})"
        )
        self.release = (
            f"UPDATE {q('runs')} SET owner = NULL, owner_token = NULL, lease_until = NULL "
            f"WHERE id = {p} AND owner_token = {p}"
        )
        self.heartbeat = f"UPDATE {q('runs')} SET lease_until = {p} WHERE owner_token = {p}"
        self.set_owner = (
            f"UPDATE {q('runs')} SET owner = {p}, owner_token = {p}, lease_until = {p}, "
            f"updated_at = {p} WHERE id = {p}"
        )
        self.insert_partial = (
            f"INSERT INTO {q('partials')} (run_id, seq, value, step, ordinal) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}) ON CONFLICT (run_id, seq) DO NOTHING"
        )
        self.load_steps = f"SELECT {STEP_COLUMNS} FROM {q('steps')} WHERE run_id = {p} ORDER BY idx"
        self.load_partials = (
            f"SELECT {PARTIAL_COLUMNS} FROM {q('partials')} WHERE run_id = {p} ORDER BY seq"
        )
        #: a fork's journal: the source's steps before the fork's first step (parameters: the
        #: fork's id, the source's id, the first step)
        self.copy_steps = (
            f"INSERT INTO {q('steps')} (run_id, {STEP_COPY_COLUMNS}) "
            f"SELECT {p}, {STEP_COPY_COLUMNS} FROM {q('steps')} WHERE run_id = {p} AND idx < {p}"
        )
        #: a fork's partial results emitted inside the steps it copies (those the task's own
        #: code emitted are emitted again as it replays), numbered from 0 in their order
        #: (parameters: the fork's id, the source's id, the first step)
        self.copy_partials = (
            f"INSERT INTO {q('partials')} (run_id, seq, value, step, ordinal) "
            f"SELECT {p}, ROW_NUMBER() OVER (ORDER BY seq) - 1, value, step, ordinal "
            f"FROM {q('partials')} WHERE run_id = {p} AND step IS NOT NULL AND step < {p}"
        )
        #: the runs with a pause requested ("WHERE pause", as the partial index says it)
        self.pausing = f"SELECT id, state, pause, reason, force FROM {q('runs')} WHERE pause"
        self.all_partials = f"SELECT run_id, seq, value FROM {q('partials')} ORDER BY run_id, seq"
        self.all_steps = f"SELECT run_id, {STEP_COLUMNS} FROM {q('steps')} ORDER BY run_id, idx"
        self.all_step_changes = (
            f"SELECT run_id, idx, status FROM {q('changes')} WHERE kind = 'step' ORDER BY seq"
        )
        self._events = f"SELECT seq, run_id, source, target, reason, at FROM {q('events')}"
        self._runs = f"SELECT {RUN_COLUMNS} FROM {q('runs')}"
        early = q("early_cancels")
        #: a cancel pressed before its run existed, taken by the run's creation (parameter: id)
        self.take_early_cancel = f"DELETE FROM {early} WHERE id = {p} RETURNING reason, expires_at"
        #: the remembered cancels whose time ran out (parameter: now)
        live = EARLY_CANCEL_LIVE.format(now=p)
        self.expire_early_cancels = f"DELETE FROM {early} WHERE NOT ({live})"
        #: a cancel remembered for a run id no run has (parameters: id, reason, expires_at, id)
        typed = (
            [p] * 3
            if dialect.name == "sqlite"
            else [f"{p}::{t}" for t in ("text", "text", "float8")]
        )
        self.remember_cancel = (
            f"INSERT INTO {early} (id, reason, expires_at) SELECT {', '.join(typed)} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {q('runs')} WHERE id = {p}) "
            "ON CONFLICT (id) DO UPDATE SET reason = excluded.reason, "
            "expires_at = excluded.expires_at"
        )
        #: a reconcile's answer written into an ``unknown`` step of a run that is final or held
        #: by the fence (parameters: status, result, reconciled, run id, index, run id, fence)
        self.reconcile_step = (
            f"UPDATE {q('steps')} SET status = {p}, result = {p}, reconciled = {p} "
            f"WHERE run_id = {p} AND idx = {p} AND status = 'unknown' AND EXISTS (SELECT 1 FROM "
            f"{q('runs')} WHERE id = {p} AND (state IN ('cancelled', 'failed') "
            f"OR owner_token = {p}))"
        )

    def update_run(
        self,
        fields: Iterable[str],
        *,
        condition: str = "",
        extra: str = "",
        returning: bool = True,
    ) -> str:
        """``UPDATE`` of ``fields`` (parameters: their values, then the run id, then those of
        ``condition``, SQL ANDed to the run's key), returning the row (and ``extra``), unless
        not ``returning``."""
        assignments = ", ".join(f"{name} = {self.param}" for name in fields)
        where = f"id = {self.param}" + (f" AND {condition}" if condition else "")
        update = f"UPDATE {self.runs} SET {assignments} WHERE {where}"
        return f"{update} RETURNING {RUN_COLUMNS}{extra}" if returning else update

    def list_runs(self, state: State | None) -> tuple[str, tuple[Any, ...]]:
        """All runs, or those in ``state``, oldest first."""
        if state is None:
            return f"{self._runs} ORDER BY created_at, id", ()
        return f"{self._runs} WHERE state = {self.param} ORDER BY created_at, id", (state.value,)

    def events(self, run_id: str | None) -> tuple[str, tuple[Any, ...]]:
        """The recorded transitions of one run or all, in order."""
        if run_id is None:
            return f"{self._events} ORDER BY seq", ()
        return f"{self._events} WHERE run_id = {self.param} ORDER BY seq", (run_id,)


def insert_run_parameters(run: NewRun, inputs: str, now: float) -> tuple[Any, ...]:
    """The parameters of :attr:`Statements.insert_run` for ``run``."""
    owner = run.owner
    return (
        run.id,
        run.task,
        run.state.value,
        inputs,
        owner.to_json() if owner else None,
        owner.token if owner else None,
        run.lease_until,
        run.parent,
        now,
        now,
    )


def event_parameters(run_id: str, write: RunWrite) -> list[tuple[Any, ...]]:
    """The parameters of :attr:`Statements.record_event`, one tuple per event of ``write``."""
    return [
        (run_id, source.value if source else None, target.value, reason, write.at)
        for source, target, reason in write.events
    ]
