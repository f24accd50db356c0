"""The SQL of the operator's operations, written once for both stores.

A page of runs (newest first, with the retry advice computed from two ``EXISTS`` over the
run's steps, so a listing reads no step row into Python), one run with its history, bulk
cancel, retention (prune) and the change feed. Statements use ``?`` placeholders and the
table names ``{runs}``, ``{steps}``, ... ; :class:`Dialect` renders them for a store (SQLite:
bare names; PostgreSQL: the ``haltwise`` schema and ``%s``).

The change feed is the table ``changes``, filled by triggers on ``events``, ``steps`` and
``partials`` in the transaction that writes them: one row per transition, step start, step
settlement and partial result, numbered by ``seq``. Its ``at`` is the database's clock at the
write (a reader compares it with the same clock; see :func:`Dialect.now`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, final

from .._core.exceptions import InputError
from .._core.outcome import advice
from .._core.records import RunRecord
from .._core.states import State
from .._core.views import Change, ChangeKind, RunSummary, StepTimes
from .store import CancelPlan, plan_cancel

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "cancel_writes",
    "change_from_row",
    "decode_cursor",
    "encode_cursor",
    "sort_named",
    "summary_from_row",
]

_TABLES = ("runs", "steps", "partials", "events", "changes")

#: The columns a page of runs reads, in order (see :func:`summary_from_row`).
_SUMMARY = """
SELECT r.id, r.task, r.state, r.reason, r.created_at, r.updated_at,
    EXISTS (SELECT 1 FROM {steps} s WHERE s.run_id = r.id AND s.status = 'unknown'
            AND s.idempotent = {false}) AS unsafe,
    EXISTS (SELECT 1 FROM {steps} s WHERE s.run_id = r.id
            AND s.effect IN ('write', 'external')
            AND (s.status = 'committed' OR (s.status = 'unknown' AND s.idempotent = {true})))
        AS repeats
FROM {runs} r
"""

_CHANGE_COLUMNS = "seq, run_id, kind, idx, status, at"


@final
@dataclass(frozen=True, slots=True)
class Dialect:
    """How one store spells the statements: table prefix, placeholder, booleans, id lists."""

    prefix: str
    placeholder: str
    true: str
    false: str
    #: an SQL expression: the database's clock, in epoch seconds
    clock: str
    #: ``id {in_ids}``: true if the id is in the list bound to the placeholder
    in_ids: str

    def sql(self, text: str) -> str:
        names = {name: f"{self.prefix}{name}" for name in _TABLES}
        rendered = text.format(**names, true=self.true, false=self.false, clock=self.clock)
        return rendered.replace("?", self.placeholder)

    def id_list(self, ids: Sequence[str]) -> Any:
        """The value bound for :attr:`in_ids`."""
        return json.dumps(list(ids)) if self is SQLITE else list(ids)

    # -- a page of runs ------------------------------------------------------------------------

    def run_page(
        self,
        *,
        states: Collection[State],
        tasks: Collection[str] | None,
        limit: int,
        before: tuple[float, str] | None,
    ) -> tuple[str, list[Any]]:
        """Runs newest created first (ties by id, descending), after ``before`` if given."""
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
        text = _SUMMARY + (f" WHERE {' AND '.join(where)}" if where else "")
        text += " ORDER BY r.created_at DESC, r.id DESC LIMIT ?"
        return self.sql(text), [*params, limit]

    def task_names(self) -> str:
        return self.sql("SELECT DISTINCT task FROM {runs}")

    # -- one run -------------------------------------------------------------------------------

    def step_times(self) -> str:
        return self.sql("SELECT idx, started_at, settled_at FROM {steps} WHERE run_id = ?")

    # -- bulk cancel ---------------------------------------------------------------------------

    def runs_by_ids(self, lock: bool) -> str:
        """Every column of the runs whose ids are bound (one parameter)."""
        text = f"SELECT {{columns}} FROM {{runs}} WHERE id {self.in_ids}"
        return self._locked(text, lock)

    def active_runs(
        self, *, states: Collection[State], tasks: Collection[str] | None, lock: bool
    ) -> tuple[str, list[Any]]:
        """The runs in ``states`` (all active ones when empty), of ``tasks`` if given."""
        chosen = [state.value for state in states] or [
            state.value for state in State if not state.is_final
        ]
        text = f"SELECT {{columns}} FROM {{runs}} WHERE state IN ({', '.join('?' for _ in chosen)})"
        params: list[Any] = list(chosen)
        if tasks is not None:
            text += f" AND task IN ({', '.join('?' for _ in tasks) or 'NULL'})"
            params += list(tasks)
        return self._locked(text + " ORDER BY created_at, id", lock), params

    def _locked(self, text: str, lock: bool) -> str:
        from .rows import RUN_COLUMNS

        text = text.replace("{columns}", RUN_COLUMNS)
        return self.sql(text + (" FOR UPDATE" if lock else ""))

    # -- prune ---------------------------------------------------------------------------------

    def prunable(self, states: Collection[State]) -> tuple[str, list[Any]]:
        """Final runs (in ``states``, all final ones when empty) last changed before ``?``."""
        chosen = [state.value for state in states] or [
            state.value for state in State if state.is_final
        ]
        marks = ", ".join("?" for _ in chosen)
        text = (
            f"SELECT id FROM {{runs}} WHERE state IN ({marks}) AND updated_at < ? "
            "ORDER BY updated_at, id"
        )
        return self.sql(text), chosen

    def prune_deletes(self) -> list[str]:
        """One ``DELETE`` per table, each taking the id list (one parameter)."""
        return [
            self.sql(f"DELETE FROM {{{table}}} WHERE {key} {self.in_ids}")
            for table, key in (
                ("changes", "run_id"),
                ("partials", "run_id"),
                ("steps", "run_id"),
                ("events", "run_id"),
                ("runs", "id"),
            )
        ]

    # -- the change feed -----------------------------------------------------------------------

    def changes_after(self) -> str:
        return self.sql(
            f"SELECT {_CHANGE_COLUMNS} FROM {{changes}} WHERE seq > ? ORDER BY seq LIMIT ?"
        )

    def last_change(self) -> str:
        return self.sql("SELECT COALESCE(MAX(seq), 0) FROM {changes}")

    def now(self) -> str:
        return self.sql("SELECT {clock}")


SQLITE = Dialect(
    prefix="",
    placeholder="?",
    true="1",
    false="0",
    clock="((julianday('now') - 2440587.5) * 86400.0)",
    in_ids="IN (SELECT value FROM json_each(?))",
)
POSTGRES = Dialect(
    prefix="haltwise.",
    placeholder="%s",
    true="TRUE",
    false="FALSE",
    clock="extract(epoch from clock_timestamp())::double precision",
    in_ids="= ANY(?)",
)

#: The change feed and the listing indexes, for SQLite (each statement whole: triggers hold ``;``).
SQLITE_FEED_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at, id)",
    "CREATE INDEX IF NOT EXISTS runs_by_state_created ON runs (state, created_at)",
    "CREATE INDEX IF NOT EXISTS runs_by_task_created ON runs (task, created_at)",
    "CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "run_id TEXT NOT NULL, kind TEXT NOT NULL, idx INTEGER, status TEXT, at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS changes_by_run ON changes (run_id, seq)",
    f"""CREATE TRIGGER IF NOT EXISTS changes_on_event AFTER INSERT ON events BEGIN
        INSERT INTO changes (run_id, kind, idx, status, at)
        VALUES (NEW.run_id, 'transition', NEW.seq, NEW.target, {SQLITE.clock}); END""",
    f"""CREATE TRIGGER IF NOT EXISTS changes_on_step AFTER INSERT ON steps BEGIN
        INSERT INTO changes (run_id, kind, idx, status, at)
        VALUES (NEW.run_id, 'step', NEW.idx, NEW.status, {SQLITE.clock}); END""",
    f"""CREATE TRIGGER IF NOT EXISTS changes_on_step_status AFTER UPDATE OF status ON steps
        BEGIN INSERT INTO changes (run_id, kind, idx, status, at)
        VALUES (NEW.run_id, 'step', NEW.idx, NEW.status, {SQLITE.clock}); END""",
    f"""CREATE TRIGGER IF NOT EXISTS changes_on_partial AFTER INSERT ON partials BEGIN
        INSERT INTO changes (run_id, kind, idx, status, at)
        VALUES (NEW.run_id, 'partial', NEW.seq, NULL, {SQLITE.clock}); END""",
)

#: The same for PostgreSQL (one trigger function for the three tables).
POSTGRES_FEED_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS runs_by_created ON haltwise.runs (created_at, id)",
    "CREATE INDEX IF NOT EXISTS runs_by_state_created ON haltwise.runs (state, created_at)",
    "CREATE INDEX IF NOT EXISTS runs_by_task_created ON haltwise.runs (task, created_at)",
    "CREATE TABLE IF NOT EXISTS haltwise.changes (seq BIGINT GENERATED ALWAYS AS IDENTITY "
    "PRIMARY KEY, run_id TEXT NOT NULL, kind TEXT NOT NULL, idx BIGINT, status TEXT, "
    "at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS changes_by_run ON haltwise.changes (run_id, seq)",
    f"""CREATE OR REPLACE FUNCTION haltwise.record_change() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_TABLE_NAME = 'events' THEN
            INSERT INTO haltwise.changes (run_id, kind, idx, status, at)
            VALUES (NEW.run_id, 'transition', NEW.seq, NEW.target, {POSTGRES.clock});
        ELSIF TG_TABLE_NAME = 'steps' THEN
            INSERT INTO haltwise.changes (run_id, kind, idx, status, at)
            VALUES (NEW.run_id, 'step', NEW.idx, NEW.status, {POSTGRES.clock});
        ELSE
            INSERT INTO haltwise.changes (run_id, kind, idx, status, at)
            VALUES (NEW.run_id, 'partial', NEW.seq, NULL, {POSTGRES.clock});
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE OR REPLACE TRIGGER changes_on_event AFTER INSERT ON haltwise.events "
    "FOR EACH ROW EXECUTE FUNCTION haltwise.record_change()",
    "CREATE OR REPLACE TRIGGER changes_on_step AFTER INSERT OR UPDATE OF status "
    "ON haltwise.steps FOR EACH ROW EXECUTE FUNCTION haltwise.record_change()",
    "CREATE OR REPLACE TRIGGER changes_on_partial AFTER INSERT ON haltwise.partials "
    "FOR EACH ROW EXECUTE FUNCTION haltwise.record_change()",
)


# -- rows -> records ----------------------------------------------------------------------------


def summary_from_row(row: Sequence[Any]) -> RunSummary:
    """A :class:`RunSummary` from a row of the page query, by position."""
    run_id, task, state_text, reason, created_at, updated_at, unsafe, repeats = row
    state = State(state_text)
    return RunSummary(
        id=run_id,
        task=task,
        state=state,
        reason=reason,
        retry=advice(state, unknown_unsafe=bool(unsafe), repeats_harm=bool(repeats)),
        created_at=created_at,
        updated_at=updated_at,
    )


def change_from_row(row: Sequence[Any]) -> Change:
    seq, run_id, kind, index, status, at = row
    return Change(
        seq=int(seq),
        run_id=run_id,
        kind=ChangeKind(kind),
        index=None if index is None else int(index),
        status=status,
        at=float(at),
    )


def times_from_rows(rows: Iterable[Sequence[Any]]) -> dict[int, StepTimes]:
    return {int(row[0]): StepTimes(started_at=row[1], settled_at=row[2]) for row in rows}


# -- bulk cancel: the writes, from the rule of one cancel ----------------------------------------


@final
@dataclass(frozen=True, slots=True)
class CancelWrite:
    """One statement of a bulk cancel and the parameter rows it runs with (``executemany``)."""

    sql: str
    rows: list[tuple[Any, ...]]


def cancel_writes(
    dialect: Dialect,
    runs: Iterable[tuple[str, State, bool]],
    reason: str,
    force: bool,
    now: float,
) -> tuple[list[CancelWrite], list[str]]:
    """The writes of cancelling ``runs`` (``(id, state, force)``), each by :func:`plan_cancel`.

    Returns the statements (updates grouped by what they write, then the events) and the ids the
    request reached (every run that was not final).
    """
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    events: list[tuple[Any, ...]] = []
    reached: list[str] = []
    for run_id, state, current_force in runs:
        if state.is_final:
            continue
        reached.append(run_id)
        plan: CancelPlan = plan_cancel(state, current_force, force)
        fields = plan.fields(reason)
        if not fields:
            continue
        fields["updated_at"] = now
        groups.setdefault(tuple(fields), []).append((*fields.values(), run_id))
        if plan.target is not None:
            events.append((run_id, state.value, plan.target.value, reason, now))
    writes = [
        CancelWrite(
            dialect.sql(
                f"UPDATE {{runs}} SET {', '.join(f'{name} = ?' for name in names)} WHERE id = ?"
            ),
            rows,
        )
        for names, rows in groups.items()
    ]
    if events:
        writes.append(
            CancelWrite(
                dialect.sql(
                    "INSERT INTO {events} (run_id, source, target, reason, at) "
                    "VALUES (?, ?, ?, ?, ?)"
                ),
                events,
            )
        )
    return writes, reached


def sort_named(
    found: Iterable[RunRecord], ids: Sequence[str] | None
) -> tuple[list[RunRecord], tuple[RunRecord, ...], tuple[str, ...]]:
    """Of the runs read for a bulk cancel: the active ones, the named final ones, the named
    ids the store does not hold."""
    by_id = {run.id: run for run in found}
    active = [run for run in by_id.values() if not run.state.is_final]
    named = ids or ()
    final = tuple(by_id[i] for i in named if i in by_id and by_id[i].state.is_final)
    unknown = tuple(i for i in named if i not in by_id)
    return active, final, unknown


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
