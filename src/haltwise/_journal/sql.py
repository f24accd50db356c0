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

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .._core.records import RunRecord
from .._core.states import State
from .rows import PARTIAL_COLUMNS, RUN_COLUMNS, STEP_COLUMNS
from .schema import SCHEMA_VERSION, Dialect
from .store import LostOwnershipError, NewRun, check_transition, plan_cancel

#: the schema version that added steps.call_id/fingerprint and partials.step/ordinal
_STEP_IDENTITY_VERSION = 3

__all__ = [
    "RunWrite",
    "Statements",
    "check_fence",
    "lost",
    "plan_cancel_write",
    "plan_create",
    "plan_transition",
]


@dataclass(frozen=True, slots=True)
class RunWrite:
    """What one write does to a run: the columns to set and the transitions to record."""

    #: column -> value; ``updated_at`` included
    fields: dict[str, Any]
    #: ``(source, target, reason)`` of each transition, in order
    events: tuple[tuple[State | None, State, str | None], ...]
    at: float


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
    """A new run's events: its creation as ``pending``, then its start if created ``running``."""
    events: list[tuple[State | None, State, str | None]] = [(None, State.PENDING, None)]
    if run.state is not State.PENDING:
        events.append((State.PENDING, run.state, None))
    return RunWrite(fields={}, events=tuple(events), at=now)


def plan_transition(
    current: RunRecord,
    target: State,
    expected: Collection[State],
    fields: dict[str, Any],
    *,
    fence: str | None,
    now: float,
) -> RunWrite:
    """A compare-and-set transition of ``current`` (see :meth:`Store.transition`)."""
    check_fence(current.id, current.owner.token if current.owner else None, fence)
    check_transition(current.id, current.state, target, expected)
    reason = fields.get("reason", current.reason)
    return RunWrite(
        fields={**fields, "updated_at": now},
        events=((current.state, target, reason),),
        at=now,
    )


def plan_cancel_write(current: RunRecord, reason: str, force: bool, now: float) -> RunWrite | None:
    """A cancel request on ``current`` (see :meth:`Store.request_cancel`); None: no change."""
    plan = plan_cancel(current.state, current.force, force)
    fields = plan.fields(reason)
    if not fields:
        return None
    events = () if plan.target is None else ((current.state, plan.target, reason),)
    return RunWrite(fields={**fields, "updated_at": now}, events=events, at=now)


class Statements:
    """Every statement the two stores share, rendered for one dialect (built once per store)."""

    def __init__(self, dialect: Dialect, version: int = SCHEMA_VERSION) -> None:
        """``version``: the schema version of the store read (an older one, opened read-only and
        so not upgraded, lacks the newer columns: they read as NULL)."""
        p, q = dialect.param, dialect.qualify
        step_columns, partial_columns = STEP_COLUMNS, PARTIAL_COLUMNS
        if version < _STEP_IDENTITY_VERSION:
            step_columns = step_columns.replace("call_id, fingerprint", "NULL, NULL")
            partial_columns = partial_columns.replace("step, ordinal", "NULL, NULL")
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
        self.load_steps = f"SELECT {step_columns} FROM {q('steps')} WHERE run_id = {p} ORDER BY idx"
        self.load_partials = (
            f"SELECT {partial_columns} FROM {q('partials')} WHERE run_id = {p} ORDER BY seq"
        )
        self.partial_seqs = f"SELECT run_id, seq FROM {q('partials')} ORDER BY run_id, seq"
        self._events = f"SELECT seq, run_id, source, target, reason, at FROM {q('events')}"
        self._runs = f"SELECT {RUN_COLUMNS} FROM {q('runs')}"

    def update_run(self, fields: dict[str, Any]) -> str:
        """``UPDATE`` of ``fields`` (parameters: their values, then the run id), returning it."""
        assignments = ", ".join(f"{name} = {self.param}" for name in fields)
        return (
            f"UPDATE {self.runs} SET {assignments} WHERE id = {self.param} RETURNING {RUN_COLUMNS}"
        )

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
