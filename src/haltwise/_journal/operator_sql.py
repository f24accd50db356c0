"""The SQL of the operator's operations, written once for both stores.

A page of runs (newest first, with the retry advice computed from two ``EXISTS`` over the
run's steps, so a listing reads no step row into Python), one run's step times, bulk cancel,
retention (prune) and the change feed. :class:`OperatorSQL` renders them for one
:class:`~haltwise._journal.schema.Dialect`; what a cancel request does to each run is
:func:`~haltwise._journal.sql.plan_cancel_write`'s to say, as for a single cancel.

The change feed is the table ``changes`` (see :data:`~haltwise._journal.schema.TRIGGERS`): one
row per transition, step start, step settlement and partial result, numbered by ``seq``, its
``at`` the database's clock (a reader compares it with :meth:`OperatorSQL.now`). No number is
ever given out twice: on SQLite the next change is numbered one above the largest in the table,
so prune never deletes the newest row (it turns it into a high-water mark, see
:func:`is_high_water`); PostgreSQL's identity never goes back.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, final

from .._core.approvals import ApprovalRecord, ApprovalState
from .._core.budget import Spent
from .._core.exceptions import InputError
from .._core.outcome import advice
from .._core.reconcile import HOOK_NOT_ASKED
from .._core.records import load_json
from .._core.states import FINAL_STATES, State
from .._core.views import Change, ChangeKind, RunSummary, StepTimes
from .rows import RUN_COLUMNS, cancelled_written, run_columns
from .schema import HIGH_WATER_RUN, Dialect
from .sql import RunWrite, cancel_plan_key, plan_cancel_write
from .store import ApprovalRequest, CancelledRun, CancelResult

__all__ = [
    "APPROVAL_COLUMNS",
    "OperatorSQL",
    "RunWrites",
    "approval_from_row",
    "approval_parameters",
    "change_from_row",
    "decode_cursor",
    "encode_cursor",
    "is_high_water",
    "plan_cancels",
    "summary_from_row",
]

_TABLES = ("runs", "steps", "partials", "events", "changes", "deliveries", "approvals")
#: the columns of an approval request, in the order of ``rows.approval_from_row``
APPROVAL_COLUMNS = (
    "run_id, idx, tool, fingerprint, arguments, state, requested_at, timeout_at, decided_by, "
    "decided_at, note, edited"
)

#: The columns a page of runs reads, in order (see :func:`summary_from_row`).
_SUMMARY = """
SELECT r.id, r.task, r.state, r.reason, r.created_at, r.updated_at,
    (SELECT 1 FROM {steps} s WHERE s.run_id = r.id AND s.status = 'unknown'
     AND s.idempotent = {false} AND (s.reconciled IS NULL OR s.reconciled <> {hook_not_asked})
     LIMIT 1) IS NOT NULL AS unsafe,
    (SELECT 1 FROM {steps} s WHERE s.run_id = r.id AND s.effect IN ('write', 'external')
     AND (s.status = 'committed' OR (s.status = 'unknown' AND s.idempotent = {true}))
     LIMIT 1) IS NOT NULL AS repeats,
    (SELECT 1 FROM {steps} s WHERE s.run_id = r.id AND s.status = 'unknown'
     AND s.idempotent = {false} AND s.reconciled = {hook_not_asked}
     LIMIT 1) IS NOT NULL AS hooked,
    (SELECT coalesce(sum(s.usd), 0) FROM {steps} s WHERE s.run_id = r.id) AS usd,
    (SELECT CAST(coalesce(sum(s.tokens), 0) AS BIGINT) FROM {steps} s WHERE s.run_id = r.id)
        AS tokens,
    (SELECT CAST(coalesce(sum(coalesce(s.calls, s.attempts)), 0) AS BIGINT) FROM {steps} s
     WHERE s.run_id = r.id) AS calls{progress}
FROM {runs} r
"""
#: what a page of runs asked with ``progress`` reads besides: each run's committed steps and its
#: journaled steps (two more probes of the run's steps; a listing without it reads neither)
_PROGRESS = """,
    (SELECT count(*) FROM {steps} s WHERE s.run_id = r.id AND s.status = 'committed') AS done,
    (SELECT count(*) FROM {steps} s WHERE s.run_id = r.id) AS known"""
# (Scalar subqueries with LIMIT 1, not EXISTS: PostgreSQL turns an EXISTS in the select list into
# a hashed subplan over every step of the store; these stay one index probe per listed run.)

_SUMMARY_COLUMNS = ("id", "task", "state", "reason", "created_at", "updated_at")


@final
class OperatorSQL:
    """The operator's statements for one dialect (built once per store)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        sqlite = dialect.name == "sqlite"
        self._true, self._false = ("1", "0") if sqlite else ("TRUE", "FALSE")
        self._clock = (
            "((julianday('now') - 2440587.5) * 86400.0)"
            if sqlite
            else "extract(epoch from clock_timestamp())::double precision"
        )
        #: ``id {in_ids}``: the id is in the list bound to one parameter (see :meth:`id_list`)
        self.in_ids = "IN (SELECT value FROM json_each(?))" if sqlite else "= ANY(?)"

    def sql(self, text: str) -> str:
        names = {name: self.dialect.qualify(name) for name in _TABLES}
        rendered = text.format(
            **names,
            true=self._true,
            false=self._false,
            clock=self._clock,
            hook_not_asked=f"'{HOOK_NOT_ASKED}'",
        )
        return rendered.replace("?", self.dialect.param)

    def id_list(self, ids: Sequence[str]) -> Any:
        """The value bound for :attr:`in_ids`."""
        return json.dumps(list(ids)) if self.dialect.name == "sqlite" else list(ids)

    # -- a page of runs ------------------------------------------------------------------------

    def run_page(
        self,
        *,
        states: Collection[State],
        tasks: Collection[str] | None,
        limit: int,
        before: tuple[float, str] | None,
        progress: bool = False,
    ) -> tuple[str, list[Any]]:
        """Runs newest created first (ties by id, descending), after ``before`` if given; with
        ``progress``, each row also counts the run's committed and journaled steps."""
        where: list[str] = []
        params: list[Any] = []
        if states:
            where.append(f"r.state IN ({', '.join('?' for _ in states)})")
            params += [state.value for state in states]
        if tasks is not None:
            where.append(f"r.task IN ({', '.join('?' for _ in tasks) or 'NULL'})")
            params += list(tasks)
        if before is not None:
            where.append("(r.created_at < ? OR (r.created_at = ? AND r.id < ?))")
            params += [before[0], before[0], before[1]]
        text = _SUMMARY.replace("{progress}", _PROGRESS if progress else "")
        text += f" WHERE {' AND '.join(where)}" if where else ""
        text += " ORDER BY r.created_at DESC, r.id DESC LIMIT ?"
        return self.sql(text), [*params, limit]

    def task_names(self) -> str:
        return self.sql("SELECT DISTINCT task FROM {runs}")

    # -- one run -------------------------------------------------------------------------------

    def step_times(self) -> str:
        return self.sql("SELECT idx, started_at, settled_at FROM {steps} WHERE run_id = ?")

    # -- bulk cancel ---------------------------------------------------------------------------

    def runs_by_ids(self, lock: bool, columns: str = RUN_COLUMNS) -> str:
        """The ``columns`` (every column by default) of the runs whose ids are bound (one
        parameter)."""
        text = f"SELECT {columns} FROM {{runs}} WHERE id {self.in_ids}"
        return self.sql(text + (" FOR UPDATE" if lock else ""))

    def active_runs(
        self,
        *,
        states: Collection[State],
        tasks: Collection[str] | None,
        lock: bool,
        columns: str = RUN_COLUMNS,
    ) -> tuple[str, list[Any]]:
        """The ``columns`` (every column by default) of the runs in ``states`` (all active
        ones when empty), of ``tasks`` if given."""
        chosen = [state.value for state in states] or [
            state.value for state in State if not state.is_final
        ]
        text = f"SELECT {columns} FROM {{runs}} WHERE state IN ({', '.join('?' for _ in chosen)})"
        params: list[Any] = list(chosen)
        if tasks is not None:
            text += f" AND task IN ({', '.join('?' for _ in tasks) or 'NULL'})"
            params += list(tasks)
        text += " ORDER BY created_at, id" + (" FOR UPDATE" if lock else "")
        return self.sql(text), params

    def update_ids(self, names: Sequence[str]) -> str:
        """``UPDATE`` of the columns ``names`` of every run whose id is in the list bound
        last (parameters: the columns' values, then the id list, see :meth:`id_list`)."""
        assignments = ", ".join(f"{name} = ?" for name in names)
        return self.sql(f"UPDATE {{runs}} SET {assignments} WHERE id {self.in_ids}")

    def record_events_of_ids(self) -> str:
        """One event of one shape for each run of an id list, recorded in the list's order,
        each with its change in the feed, in the same order (parameters: source, target,
        reason, at, then the id list). On SQLite the events' trigger writes the changes."""
        if self.dialect.name == "sqlite":
            return self.sql(
                "INSERT INTO {events} (run_id, source, target, reason, at) "
                "SELECT value, ?, ?, ?, ? FROM json_each(?) ORDER BY key"
            )
        return self.sql(
            "WITH recorded AS (INSERT INTO {events} (run_id, source, target, reason, at) "
            "SELECT id, ?, ?, ?, ? FROM unnest(?::text[]) WITH ORDINALITY AS ids (id, n) "
            "ORDER BY n RETURNING seq, run_id, target) "
            "INSERT INTO {changes} (run_id, kind, idx, status, at) "
            "SELECT run_id, 'transition', seq, target, {clock} FROM recorded ORDER BY seq"
        )

    def record_budget_exhausted(self) -> str:
        """A run's budget exhausted, in the change feed (parameter: the run id)."""
        return self.sql(
            "INSERT INTO {changes} (run_id, kind, idx, status, at) "
            "VALUES (?, 'budget', NULL, 'exhausted', {clock})"
        )

    def record_event(self) -> str:
        """An event recorded with its change in the feed (on SQLite its trigger writes the
        change; on PostgreSQL this statement does, see ``schema.TRIGGERS``)."""
        insert = "INSERT INTO {events} (run_id, source, target, reason, at) VALUES (?, ?, ?, ?, ?)"
        if self.dialect.name == "sqlite":
            return self.sql(insert)
        return self.sql(
            f"WITH recorded AS ({insert} RETURNING seq, run_id, target) "
            "INSERT INTO {changes} (run_id, kind, idx, status, at) "
            "SELECT run_id, 'transition', seq, target, {clock} FROM recorded"
        )

    # -- prune ---------------------------------------------------------------------------------

    def prunable(self, states: Collection[State], *, lock: bool) -> tuple[str, list[Any]]:
        """Final runs (in ``states``, all final ones when empty) last changed before ``?``."""
        chosen = [state.value for state in states] or [
            state.value for state in State if state.is_final
        ]
        marks = ", ".join("?" for _ in chosen)
        text = (
            f"SELECT id FROM {{runs}} WHERE state IN ({marks}) AND updated_at < ? "
            "ORDER BY updated_at, id" + (" FOR UPDATE" if lock else "")
        )
        return self.sql(text), chosen

    def prune_deletes(self) -> list[str]:
        """The statements deleting the runs, each taking the id list (one parameter): their
        changes (:meth:`prune_changes`), then one ``DELETE`` per table."""
        return [
            *self.prune_changes(),
            *(
                self.sql(f"DELETE FROM {{{table}}} WHERE {key} {self.in_ids}")
                for table, key in (
                    ("partials", "run_id"),
                    ("approvals", "run_id"),
                    ("steps", "run_id"),
                    ("events", "run_id"),
                    ("runs", "id"),
                )
            ),
        ]

    def prune_changes(self) -> list[str]:
        """The pruned runs' changes deleted (each statement takes the id list).

        SQLite (no index by run: one scan of ``changes`` for the whole batch) numbers a new
        change one above the largest left, so the newest row is never deleted: if it is a
        pruned run's, it becomes the store's high-water mark (older marks are deleted).
        PostgreSQL deletes by its index ``changes_by_run``; its identity never goes back.
        """
        pruned = f"run_id {self.in_ids}"
        if self.dialect.name != "sqlite":
            return [self.sql(f"DELETE FROM {{changes}} WHERE {pruned}")]
        newest = "(SELECT MAX(seq) FROM {changes})"
        mark = f"'{HIGH_WATER_RUN}'"
        return [
            self.sql(
                f"DELETE FROM {{changes}} WHERE ({pruned} OR run_id = {mark}) AND seq < {newest}"
            ),
            self.sql(
                f"UPDATE {{changes}} SET run_id = {mark}, idx = NULL, status = NULL "
                f"WHERE seq = {newest} AND {pruned}"
            ),
        ]

    # -- the change feed -----------------------------------------------------------------------

    def changes_after(self) -> str:
        """The changes after a ``seq``, each with what it is about (:class:`Change`): a
        transition's event, a partial result's value, a step's tool."""
        return self.sql(
            "SELECT c.seq, c.run_id, c.kind, c.idx, c.status, c.at, e.source, e.reason, "
            "p.value, s.tool FROM {changes} c "
            "LEFT JOIN {events} e ON c.kind = 'transition' AND e.run_id = c.run_id "
            "AND e.seq = c.idx "
            "LEFT JOIN {partials} p ON c.kind = 'partial' AND p.run_id = c.run_id "
            "AND p.seq = c.idx "
            "LEFT JOIN {steps} s ON c.kind = 'step' AND s.run_id = c.run_id AND s.idx = c.idx "
            "WHERE c.seq > ? ORDER BY c.seq LIMIT ?"
        )

    def last_change(self) -> str:
        return self.sql("SELECT COALESCE(MAX(seq), 0) FROM {changes}")

    def now(self) -> str:
        return self.sql("SELECT {clock}")

    # -- the span context of a run's latest attempt ---------------------------------------------

    def trace_of(self) -> str:
        return self.sql("SELECT trace FROM {runs} WHERE id = ?")

    def save_trace(self) -> str:
        return self.sql("UPDATE {runs} SET trace = ? WHERE id = ?")

    # -- the events sender's positions ---------------------------------------------------------

    # -- approvals -------------------------------------------------------------------------------

    def approval_request(self) -> str:
        """Journal an approval request for step ``idx`` of the run, if the step has none yet or
        its request was cancelled (a resume asks anew), and if ``owner_token`` still holds the
        run. Parameters: run_id, idx, tool, fingerprint, arguments, timeout_at, params_schema,
        run_id, owner_token."""
        request = self.sql(
            "INSERT INTO {approvals} (run_id, idx, tool, fingerprint, arguments, state, "
            "requested_at, timeout_at, params_schema) "
            "SELECT ?, ?, ?, ?, ?, 'awaiting', {clock}, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM {runs} WHERE id = ? AND owner_token = ?) "
            "ON CONFLICT (run_id, idx) DO UPDATE SET state = 'awaiting', "
            "requested_at = excluded.requested_at, timeout_at = excluded.timeout_at, "
            "decided_by = NULL, decided_at = NULL, note = NULL, edited = NULL, "
            "fingerprint = excluded.fingerprint, arguments = excluded.arguments, "
            "params_schema = excluded.params_schema "
            "WHERE {approvals}.state = 'cancelled'"
        )
        return request

    def approval_step(self) -> str:
        """The step row of a request (status ``awaiting``), unless the step has one that is
        not ``interrupted`` (a resume asking anew after a cancel). Parameters: run_id, idx,
        tool, cancel, effect, idempotent, idem_key, call_id, fingerprint, run_id, idx."""
        return self.sql(
            "INSERT INTO {steps} (run_id, idx, tool, cancel, effect, idempotent, status, "
            "attempts, idem_key, cleanup, started_at, call_id, fingerprint) "
            "SELECT ?, ?, ?, ?, ?, ?, 'awaiting', 0, ?, {false}, {clock}, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM {approvals} WHERE run_id = ? AND idx = ? "
            "AND state = 'awaiting') "
            "ON CONFLICT (run_id, idx) DO UPDATE SET status = 'awaiting' "
            "WHERE {steps}.status = 'interrupted'"
        )

    def approval_of(self) -> str:
        return self.sql(
            f"SELECT {APPROVAL_COLUMNS} FROM {{approvals}} WHERE run_id = ? AND idx = ?"
        )

    def approval_schema(self) -> str:
        return self.sql("SELECT params_schema FROM {approvals} WHERE run_id = ? AND idx = ?")

    def approvals_of_run(self) -> str:
        return self.sql(
            f"SELECT {APPROVAL_COLUMNS} FROM {{approvals}} WHERE run_id = ? ORDER BY idx"
        )

    def approvals_awaiting(self) -> str:
        """Every request awaiting a decision, oldest first (parameter: the limit)."""
        return self.sql(
            f"SELECT {APPROVAL_COLUMNS} FROM {{approvals}} WHERE state = 'awaiting' "
            "ORDER BY requested_at, run_id, idx LIMIT ?"
        )

    def approvals_pending_json(self) -> str:
        """:meth:`Store.pending_approvals_json`'s one query (parameter: the limit): the text
        put together by the database in the index's order, the stored argument text (JSON the
        runtime wrote) spliced in as it is, each time in full precision (``printf('%!.17g')``
        on SQLite, whose own rendering of a REAL has 15 digits; ``float8::text`` on PostgreSQL,
        the shortest that reads back the same)."""
        if self.dialect.name == "sqlite":
            quote, number, items = (
                "json_quote({})",
                "printf('%!.17g', {})",
                "group_concat(item, ',')",
            )
        else:
            quote, number = "to_json({})::text", "{}::text"
            items = "string_agg(item, ',' ORDER BY requested_at, run_id, idx)"
        timeout = f"CASE WHEN timeout_at IS NULL THEN 'null' ELSE {number.format('timeout_at')} END"
        item = (
            f"""'{{"run":' || {quote.format("run_id")} || ',"step":' || idx || """
            f"""',"tool":' || {quote.format("tool")} || ',"arguments":' || arguments || """
            f"""',"requested_at":' || {number.format("requested_at")} || """
            f"""',"timeout_at":' || {timeout} || '}}'"""
        )
        body = f"""'{{"approvals":[' || COALESCE({items}, '') || ']}}'"""
        braces = str.maketrans({"{": "{{", "}": "}}"})  # literal in what self.sql formats
        return self.sql(
            f"SELECT {body.translate(braces)} FROM (SELECT {item.translate(braces)} AS item, "
            "requested_at, run_id, idx FROM {approvals} "
            "WHERE state = 'awaiting' ORDER BY requested_at, run_id, idx LIMIT ?) pending"
        )

    def approval_step_interrupted(self) -> str:
        """A cancelled request's step ``interrupted``, if still ``awaiting`` and the fence
        holds. Parameters: run_id, idx, run_id, owner_token."""
        return self.sql(
            "UPDATE {steps} SET status = 'interrupted', settled_at = {clock} "
            "WHERE run_id = ? AND idx = ? AND status = 'awaiting' "
            "AND EXISTS (SELECT 1 FROM {runs} WHERE id = ? AND owner_token = ?)"
        )

    def approval_decide(self) -> str:
        """The decision, compare-and-set: only a request still ``awaiting`` is decided.
        Parameters: state, decided_by, note, edited, run_id, idx."""
        return self.sql(
            "UPDATE {approvals} SET state = ?, decided_by = ?, decided_at = {clock}, note = ?, "
            "edited = ? WHERE run_id = ? AND idx = ? AND state = 'awaiting'"
        )

    def approval_cancel(self) -> str:
        """A request cancelled with its run: compare-and-set as a decision, and only while the
        fence holds the run (a process that lost the run must not cancel the request its new
        owner waits on). Parameters: run_id, idx, run_id, owner_token."""
        return self.sql(
            "UPDATE {approvals} SET state = 'cancelled', decided_at = {clock} "
            "WHERE run_id = ? AND idx = ? AND state = 'awaiting' "
            "AND EXISTS (SELECT 1 FROM {runs} WHERE id = ? AND owner_token = ?)"
        )

    def approval_change(self) -> str:
        """The change feed's row of a request made or decided (run_id, idx, state)."""
        return self.sql(
            "INSERT INTO {changes} (run_id, kind, idx, status, at) "
            "VALUES (?, 'approval', ?, ?, {clock})"
        )

    def delivery_position(self) -> str:
        return self.sql("SELECT position FROM {deliveries} WHERE destination = ?")

    def save_delivery_position(self) -> str:
        return self.sql(
            "INSERT INTO {deliveries} (destination, position, updated_at) VALUES (?, ?, {clock}) "
            "ON CONFLICT (destination) DO UPDATE SET position = excluded.position, "
            "updated_at = excluded.updated_at"
        )


# -- rows -> records ----------------------------------------------------------------------------


def summary_from_row(row: Sequence[Any]) -> RunSummary:
    """A :class:`RunSummary` from a row of the page query, by position."""
    run_id, task, state, reason, created_at, updated_at = run_columns(
        row[0], _SUMMARY_COLUMNS, row[:6]
    )
    unsafe, repeats, hooked, usd, tokens, calls = row[6:12]
    progress = (int(row[12]), int(row[13])) if len(row) > 12 else None
    return RunSummary(
        id=run_id,
        task=task,
        state=state,
        reason=reason,
        retry=advice(
            state,
            unknown_unsafe=bool(unsafe),
            repeats_harm=bool(repeats),
            awaits_hook=bool(hooked),
        ),
        created_at=created_at,
        updated_at=updated_at,
        spent=Spent(float(usd or 0), int(tokens or 0), int(calls or 0)),
        progress=progress,
    )


def approval_parameters(
    run_id: str, request: ApprovalRequest, fence: str
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The parameters of :meth:`OperatorSQL.approval_request` and
    :meth:`OperatorSQL.approval_step` for ``request``."""
    step = request.step
    asked = (
        run_id,
        step.index,
        step.tool,
        step.fingerprint,
        request.arguments,
        request.timeout_at,
        request.schema,
        run_id,
        fence,
    )
    row = (
        run_id,
        step.index,
        step.tool,
        step.cancel,
        step.effect.value,
        step.idempotent,
        step.idempotency_key,
        step.call_id,
        step.fingerprint,
        run_id,
        step.index,
    )
    return asked, row


def approval_from_row(row: Sequence[Any]) -> ApprovalRecord:
    """An approval request from its row (columns :data:`APPROVAL_COLUMNS`)."""
    run_id, idx, tool, print_, arguments, state, requested, timeout, by, at, note, edited = row
    return ApprovalRecord(
        run_id=run_id,
        index=int(idx),
        tool=tool,
        fingerprint=print_,
        arguments=json.loads(arguments),
        state=ApprovalState(state),
        requested_at=float(requested),
        timeout_at=None if timeout is None else float(timeout),
        by=by,
        at=None if at is None else float(at),
        note=note,
        edited=None if edited is None else json.loads(edited),
    )


def change_from_row(row: Sequence[Any]) -> Change:
    """A :class:`Change` from a row of :meth:`OperatorSql.changes_after` (or of its first six
    columns only)."""
    seq, run_id, kind, index, status, at = row[:6]
    source, reason, value, tool = (*row[6:10], None, None, None, None)[:4]
    try:
        parsed, has_value = (load_json(value), True) if value is not None else (None, False)
    except ValueError:  # a damaged row: the feed goes on; `haltwise check` names it
        parsed, has_value = None, False
    return Change(
        seq=int(seq),
        run_id=run_id,
        kind=ChangeKind(kind),
        index=None if index is None else int(index),
        status=status,
        at=float(at),
        source=source,
        reason=reason,
        tool=tool,
        value=parsed,
        has_value=has_value,
    )


def is_high_water(change: Change) -> bool:
    """Whether ``change`` is a high-water mark (:data:`.schema.HIGH_WATER_RUN`): a row that
    records no change; a reader of the feed passes it by."""
    return change.run_id == HIGH_WATER_RUN


def times_from_rows(rows: Iterable[Sequence[Any]]) -> dict[int, StepTimes]:
    return {int(row[0]): StepTimes(started_at=row[1], settled_at=row[2]) for row in rows}


# -- the writes of many runs in few statements ---------------------------------------------------


@final
class RunWrites:
    """The writes of many runs (each a :class:`~haltwise._journal.sql.RunWrite`), made as few
    statements as their shapes allow: one ``UPDATE`` per distinct set of column values, one
    ``INSERT`` per distinct event shape, each naming its runs by one id list parameter.

    Each run's row ends as its own ``UPDATE`` would leave it, and its events are recorded in
    their order (a write's ``k``-th event goes in with the other ``k``-th ones, after every
    ``k-1``-th); between runs the order of the events is any (one transaction). A run may be
    added once only (two writes of one run would not follow each other). The values are
    those of columns (text, numbers, None), so they compare and hash as the database would
    store them.
    """

    __slots__ = ("_events", "_ops", "_updates")

    def __init__(self, ops: OperatorSQL) -> None:
        self._ops = ops
        self._updates: dict[tuple[tuple[str, Any], ...], list[str]] = {}
        self._events: dict[tuple[int, str | None, str, str | None, float], list[str]] = {}

    def add(self, run_id: str, write: RunWrite) -> None:
        self.add_all((run_id,), write)

    def add_all(self, run_ids: Sequence[str], write: RunWrite) -> None:
        """:meth:`add` of each of ``run_ids``, all with the one ``write``."""
        if write.fields:
            self._updates.setdefault(tuple(write.fields.items()), []).extend(run_ids)
        for position, (source, target, reason) in enumerate(write.events):
            shape = (position, source.value if source else None, target.value, reason, write.at)
            self._events.setdefault(shape, []).extend(run_ids)

    def statements(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The statements and their parameters, in the order to run them."""
        ops = self._ops
        updates = [
            (
                ops.update_ids([name for name, _ in items]),
                (*(value for _, value in items), ops.id_list(ids)),
            )
            for items, ids in self._updates.items()
        ]
        events = [
            (ops.record_events_of_ids(), (*shape[1:], ops.id_list(ids)))
            for shape, ids in sorted(self._events.items(), key=lambda item: item[0][0])
        ]
        return updates + events


# -- bulk cancel: the writes, from the rule of one cancel ----------------------------------------


#: a run as a cancel's write leaves it, from the run as read (see :func:`_rewriter`)
_Rewrite = Callable[[CancelledRun], CancelledRun]

_CANCELLED_SIZE = len(CancelledRun._fields)


def _rewriter(fields: Mapping[str, Any]) -> _Rewrite:
    """``run._replace(**cancelled_written(fields))`` for any run, as one function built once per
    plan: the run's values and the written ones in one tuple, picked in field order by one
    ``itemgetter`` (C), made a CancelledRun by ``_make`` (a Python classmethod: ``tuple.__new__``
    and a length check), where ``_replace`` costs a dict and a generator per run (10,000 runs
    share a plan)."""
    written = cancelled_written(fields)
    picks = [
        _CANCELLED_SIZE + list(written).index(name) if name in written else position
        for position, name in enumerate(CancelledRun._fields)
    ]
    values = tuple(written.values())
    pick = itemgetter(*picks)
    make = CancelledRun._make

    def rewrite(run: CancelledRun) -> CancelledRun:
        return make(pick(run + values))

    return rewrite


def plan_cancels(
    ops: OperatorSQL,
    found: Iterable[CancelledRun],
    ids: Sequence[str] | None,
    *,
    reason: str,
    force: bool,
    now: float,
    dry_run: bool,
) -> tuple[list[tuple[str, tuple[Any, ...]]], CancelResult]:
    """A bulk cancel request on the runs ``found`` (read in its transaction: the columns of
    :class:`CancelledRun`), each run planned as :func:`plan_cancel_write` says, then dropped
    (only the run as the writes leave it is kept).

    A cancel's write is planned once for each :func:`cancel_plan_key`, and the runs alike share
    it (one plan, not 10,000 alike, for 10,000 runs waiting in tools).

    Returns the statements with their parameters (:class:`RunWrites`; none with ``dry_run``)
    and what the request did: the runs it reached (every one not final as read) as the
    writes leave them, in the order of ``ids`` (else as found); the named runs already final;
    the named ids the store does not hold.
    """
    after: dict[str, CancelledRun] = {}
    was_final: set[str] = set()
    #: cancel_plan_key -> the write, the runs it is for, how it leaves each (see _rewriter)
    plans: dict[tuple[State, bool, bool], tuple[RunWrite, list[str], _Rewrite] | None] = {}
    for run in found:
        if run.state in FINAL_STATES:
            was_final.add(run.id)
        elif not dry_run:
            key = cancel_plan_key(run)
            if key not in plans:
                write = plan_cancel_write(run, reason, force, now)
                plans[key] = None if write is None else (write, [], _rewriter(write.fields))
            if (plan := plans[key]) is not None:
                plan[1].append(run.id)
                run = plan[2](run)
        after[run.id] = run
    writes = RunWrites(ops)
    for plan in plans.values():
        if plan is not None:
            writes.add_all(plan[1], plan[0])
    named = ids or ()
    order = after if ids is None else dict.fromkeys(ids)
    return writes.statements(), CancelResult(
        reached=tuple(after[i] for i in order if i in after and i not in was_final),
        already_final=tuple(after[i] for i in named if i in was_final),
        unknown=tuple(i for i in named if i not in after),
    )


# -- the cursor of a page -----------------------------------------------------------------------


def encode_cursor(created_at: float, run_id: str) -> str:
    """An opaque cursor for the page after the run created at ``created_at`` with ``run_id``."""
    raw = json.dumps([created_at, run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The position a cursor of :func:`encode_cursor` names; :class:`InputError` if malformed."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, run_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise ValueError(created_at)
        if not isinstance(run_id, str):
            raise ValueError(run_id)
    except (ValueError, TypeError, binascii.Error, UnicodeError):
        raise InputError(f"malformed cursor {cursor[:80]!r}") from None
    return float(created_at), run_id
