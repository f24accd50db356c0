"""The journal's tables, defined once and rendered per dialect, and the migrations between versions.

:data:`TABLES` and :data:`INDEXES` are the schema of :data:`SCHEMA_VERSION`, the newest. A store
opened on a new file or database creates them as they are. A store of an older version is
upgraded in place when it is opened, in one transaction, by the :data:`MIGRATIONS` newer than its
version, in order; a store of a newer version is refused (:class:`SchemaVersionError`), since
this haltwise cannot know what the newer columns promise.

Adding a column or an index means two edits here: the column in :data:`TABLES` (what a new store
gets) and a :class:`Migration` that adds it (what an existing store gets). A test opens a store
file written by the first version and checks that, once upgraded, its tables have exactly the
columns, indexes and triggers of a new one. Changing a column's definition (which SQLite cannot
do in place) is a :class:`Rebuild`: the table made anew and every row copied with its key.
Removing an index is its removal from :data:`INDEXES` and a :class:`DropIndex`.

The schema is rendered by a :class:`Dialect`: SQLite (``?`` parameters, no schema prefix,
``WITHOUT ROWID`` tables, integers for booleans) and PostgreSQL (``%s`` parameters, the tables in
a schema named ``haltwise``, ``BOOLEAN``, ``DOUBLE PRECISION`` and an identity column).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .._core.exceptions import BadRow, CorruptRowError, SchemaVersionError

__all__ = [
    "HIGH_WATER_RUN",
    "INDEXES",
    "MIGRATIONS",
    "POSTGRES",
    "POSTGRES_CLOCK",
    "SCHEMA_VERSION",
    "SQLITE",
    "TABLES",
    "TRIGGERS",
    "Column",
    "Dialect",
    "DropIndex",
    "Index",
    "Kind",
    "Migration",
    "Rebuild",
    "Table",
    "Trigger",
    "create_statements",
    "parse_version",
    "read_views",
    "upgrade_statements",
]


class Kind(enum.Enum):
    """A column's kind of value, which each dialect names in its own way."""

    TEXT = enum.auto()
    INTEGER = enum.auto()
    #: seconds since the epoch, and other floating-point numbers
    REAL = enum.auto()
    BOOLEAN = enum.auto()
    #: an integer primary key the database assigns in increasing order, never reusing one, even
    #: of a deleted row (SQLite: ``AUTOINCREMENT``, which rewrites its counter row in
    #: ``sqlite_sequence`` at every insert)
    SERIAL = enum.auto()
    #: an integer primary key the database assigns as one more than the largest in the table
    #: (SQLite: a plain rowid, no counter to rewrite; PostgreSQL: the same identity column as
    #: :attr:`SERIAL`). On SQLite a key comes back if the newest row is deleted: a table whose
    #: keys must never come back keeps its newest row (the change feed: see ``prune``).
    ROWID = enum.auto()


@dataclass(frozen=True, slots=True)
class Column:
    """One column. ``default`` is a Python value (``False``, ``0``, ``None`` for none)."""

    name: str
    kind: Kind
    not_null: bool = False
    default: bool | int | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """One table; ``primary_key`` is empty when a :attr:`Kind.SERIAL` or :attr:`Kind.ROWID`
    column is the key."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    #: SQLite: store the rows in the primary key's b-tree (tables read by their key)
    without_rowid: bool = False


@dataclass(frozen=True, slots=True)
class Index:
    """An index; with ``where``, a partial index of the rows for which that condition (written
    the same in every dialect) holds; with ``only``, an index of that one dialect (its name)."""

    name: str
    table: str
    columns: tuple[str, ...]
    where: str = ""
    only: str = ""


@dataclass(frozen=True, slots=True)
class AddColumn:
    """A migration's change: add ``column`` to ``table`` (with its default for existing rows)."""

    table: str
    column: Column


@dataclass(frozen=True, slots=True)
class DropIndex:
    """A migration's change: drop the index ``name``, in every dialect (``IF EXISTS``: an index
    a dialect never had is no error)."""

    name: str


@dataclass(frozen=True, slots=True)
class Trigger:
    """A trigger (or a function of the database), in each dialect's own words (their trigger
    languages differ too much to render one from the other): the statements that create it,
    idempotently."""

    name: str
    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rebuild:
    """A migration's change, SQLite only: ``table`` made anew as :data:`TABLES` defines it now
    (SQLite cannot change a column's definition in place), every row copied with its key.

    The old table's indexes go with it (the migration recreates those still wanted) and no
    trigger may name the table meanwhile: the migration drops those before and recreates them
    after. ``after_copy`` runs once the rows are copied, before the old table is dropped
    (``{old}`` and ``{new}`` name the two tables). PostgreSQL renders such a table as it did.
    """

    table: Table
    after_copy: tuple[str, ...] = ()


Change = AddColumn | Index | DropIndex | Table | Trigger | Rebuild


@dataclass(frozen=True, slots=True)
class Migration:
    """The changes that take a store from ``version - 1`` to ``version``."""

    version: int
    summary: str
    changes: tuple[Change, ...]


def _text(name: str, *, not_null: bool = False) -> Column:
    return Column(name, Kind.TEXT, not_null=not_null)


#: a pause was requested and not undone (set while the run is ``paused``)
_PAUSE = Column("pause", Kind.BOOLEAN, not_null=True, default=False)
#: the runs with a pause requested, for the watcher (``Store.pause_signals``): nearly always none
_PAUSING = Index("runs_pausing", "runs", ("id",), where="pause")
#: Version 7: set by the owner as its run enters ``paused``: a cancel of the paused run has
#: something to settle (a step still in flight: a child run paused with it; a saga to run), so it
#: goes ``cancelling`` instead of ending ``cancelled`` at once (see ``plan_cancel``)
_SETTLE_ON_CANCEL = Column("settle_on_cancel", Kind.BOOLEAN, not_null=True, default=False)
#: Version 13: the W3C ``traceparent`` of the span of the run's latest attempt, kept while spans
#: are recorded, so that the next attempt's span links to it, in whatever process it runs.
_TRACE = _text("trace")

#: Version 5: how a replayed call is matched to its journaled step (the framework's call id, and a
#: fingerprint of its arguments checked on replay).
_STEP_IDENTITY = (_text("call_id"), _text("fingerprint"))
#: Version 5: which step emitted a partial result (NULL: the task's own code) and its ordinal
#: among that emitter's partials, so that a replayed step does not emit it again.
_PARTIAL_ORIGIN = (Column("step", Kind.INTEGER), Column("ordinal", Kind.INTEGER))

#: The change feed: one row per transition, step start or settlement and partial result, written
#: by the triggers of :data:`TRIGGERS` (on PostgreSQL a step's by the statement writing it) in
#: the transaction that writes them; ``idx`` is the event's, step's or partial's number,
#: ``status`` the new state or step status, ``at`` the database's clock (see :mod:`.operator_sql`).
#: ``seq`` is a plain rowid on SQLite (version 9): no counter row rewritten per change; ``prune``
#: keeps the newest row so that no number is ever given out twice (see ``OperatorSQL``).
_CHANGES = Table(
    "changes",
    (
        Column("seq", Kind.ROWID),
        _text("run_id", not_null=True),
        _text("kind", not_null=True),
        Column("idx", Kind.INTEGER),
        _text("status"),
        Column("at", Kind.REAL, not_null=True),
    ),
)

#: Version 12: where ``haltwise events`` got to for each destination URL: every change numbered
#: up to ``position`` was acknowledged by the receiver (CONTRACT.md, "Telling the world").
_DELIVERIES = Table(
    "deliveries",
    (
        _text("destination", not_null=True),
        Column("position", Kind.INTEGER, not_null=True),
        Column("updated_at", Kind.REAL, not_null=True),
    ),
    primary_key=("destination",),
)

#: Version 15: approval requests (CONTRACT.md, "Someone else decides"), one per step that asked:
#: bound to the run, the step, the tool and the fingerprint of the arguments asked for;
#: ``arguments`` (JSON, by parameter name) for the approver; a decision (``state`` other than
#: ``awaiting``) with who, when, the note and the arguments an edit ran the call with.
_APPROVALS_15 = Table(
    "approvals",
    (
        _text("run_id", not_null=True),
        Column("idx", Kind.INTEGER, not_null=True),
        _text("tool", not_null=True),
        _text("fingerprint"),
        _text("arguments", not_null=True),
        _text("state", not_null=True),
        Column("requested_at", Kind.REAL, not_null=True),
        Column("timeout_at", Kind.REAL),
        _text("decided_by"),
        Column("decided_at", Kind.REAL),
        _text("note"),
        _text("edited"),
    ),
    primary_key=("run_id", "idx"),
)
#: Version 18: the JSON schema of the tool's parameters recorded with each request (any process
#: validates an edit against it without importing the tool).
_PARAMS_SCHEMA = _text("params_schema")
_APPROVALS = replace(_APPROVALS_15, columns=(*_APPROVALS_15.columns, _PARAMS_SCHEMA))
#: The pending requests in the order they are listed (oldest first, then by run and step): read
#: in the index's order, no sort (GET /api/approvals with 10,000 pending: ~15 ms less); version
#: 15's index had ``requested_at`` alone.
_APPROVALS_AWAITING = Index(
    "approvals_awaiting",
    "approvals",
    ("requested_at", "run_id", "idx"),
    where="state = 'awaiting'",
)

#: PostgreSQL's index of a run's changes, for prune. SQLite has none since version 9: it cost a
#: step ~1.5 WAL pages and ~4 us (docs/benchmarks.md), and SQLite's prune scans the table once.
_CHANGES_BY_RUN = Index("changes_by_run", "changes", ("run_id", "seq"), only="postgresql")

#: Version 16: what a step spent (issue 33), written by its settlement: US dollars, model tokens,
#: and the tool calls it counts when not its attempts (a model request: 0; a child step: its
#: child run's). NULL: nothing written (a step's calls are then its attempts).
_STEP_SPEND = (
    Column("usd", Kind.REAL),
    Column("tokens", Kind.INTEGER),
    Column("calls", Kind.INTEGER),
)

#: Version 6: the errors of a step's earlier failed attempts (a JSON list of ``{"attempt",
#: "type", "message"}``), kept when the step runs again (a retry, a resume)
_ATTEMPT_ERRORS = _text("errors")

#: Version 14: what a reconcile found out about an ``unknown`` step (JSON ``{"by", "answer",
#: "at"}``), or ``_core.reconcile.HOOK_NOT_ASKED`` while its tool's hook has not been asked
_RECONCILED = _text("reconciled")

#: Version 14: cancels pressed before their run exists (``cancel --before-start``): a run created
#: with such an id before ``expires_at`` (epoch seconds) is recorded ``cancelled`` with ``reason``
_EARLY_CANCELS = Table(
    "early_cancels",
    (
        _text("id", not_null=True),
        _text("reason", not_null=True),
        Column("expires_at", Kind.REAL, not_null=True),
    ),
    primary_key=("id",),
)

#: The rule of a cancel remembered before its run existed, in SQL (``{now}``: the time a run is
#: created): it applies to a run created while this holds, and is dropped once it does not.
#: ``_journal/sql.early_cancel_live`` is the same rule in Python; both stores use these two only.
EARLY_CANCEL_LIVE = "expires_at > {now}"

#: The advisory lock a run id's creation and a cancel remembered before it share (PostgreSQL):
#: one of 1,024 buckets of ids (by the id's hash), in haltwise's own class of the two-key lock
#: space (``0x68616c74``, "halt": never an application's one-key lock). A bucket, not the id:
#: a creation round of 10,000 runs in one transaction then holds at most 1,024 locks, where the
#: server's lock table holds ~6,400 for every connection together ("out of shared memory"). Two
#: ids of one bucket only make a remembered cancel wait for the other's creation to commit.
#: (``{id}``: the id as SQL: a parameter, a column.)
ID_LOCK = "1751215220, hashtext({id}) & 1023"

#: Version 17, PostgreSQL (its lock by bucket: version 19): ``haltwise.may_create(id, now)``, true
#: if a run ``id`` created at ``now`` has no live cancel remembered (the creation statements'
#: guard). It first takes the id's advisory lock (:data:`ID_LOCK`), shared, held until the
#: creating transaction ends; then it reads
#: ``early_cancels`` in a snapshot of its own (each statement of a VOLATILE function takes a new
#: one, after the lock). ``remember_cancel`` takes the same lock exclusively before it looks for
#: the run. So of a creation and a remembered cancel of one id that overlap, either the cancel
#: waits for the creation to commit and sees the run (the caller cancels it as usual), or the
#: creation waits for the cancel to commit and sees it (the run is created cancelled): under READ
#: COMMITTED two plain NOT EXISTS probes could each miss the other's uncommitted row.
_MAY_CREATE = Trigger(
    "may_create",
    sqlite=(),
    postgresql=(
        "CREATE OR REPLACE FUNCTION haltwise.may_create(run_id text, now double precision) "
        "RETURNS boolean LANGUAGE sql VOLATILE AS $$ "
        f"SELECT pg_advisory_xact_lock_shared({ID_LOCK.format(id='run_id')}); "
        "SELECT NOT EXISTS (SELECT 1 FROM haltwise.early_cancels WHERE id = run_id AND "
        + EARLY_CANCEL_LIVE.format(now="now")
        + ") $$",
    ),
)

TABLES: tuple[Table, ...] = (
    Table(
        "haltwise_meta",
        # Keys as version 1 declared them (no NOT NULL: a primary key implies it where it
        # matters), so that an upgraded store and a new one have the same shape.
        (_text("key"), _text("value", not_null=True)),
        primary_key=("key",),
    ),
    Table(
        "runs",
        (
            _text("id"),
            _text("task", not_null=True),
            _text("state", not_null=True),
            _text("inputs", not_null=True),
            _text("reason"),
            Column("force", Kind.BOOLEAN, not_null=True, default=False),
            _text("result"),
            _text("error"),
            _text("cancel_error"),
            _text("owner"),
            _text("owner_token"),
            Column("lease_until", Kind.REAL),
            _text("parent"),
            Column("created_at", Kind.REAL, not_null=True),
            Column("updated_at", Kind.REAL, not_null=True),
            _PAUSE,
            _SETTLE_ON_CANCEL,
            _TRACE,
        ),
        primary_key=("id",),
    ),
    Table(
        "steps",
        (
            _text("run_id", not_null=True),
            Column("idx", Kind.INTEGER, not_null=True),
            _text("tool", not_null=True),
            _text("cancel"),
            _text("effect", not_null=True),
            Column("idempotent", Kind.BOOLEAN, not_null=True),
            _text("status", not_null=True),
            Column("attempts", Kind.INTEGER, not_null=True),
            _text("result"),
            _text("error"),
            _text("idem_key", not_null=True),
            _text("args"),
            Column("cleanup", Kind.BOOLEAN, not_null=True, default=False),
            Column("started_at", Kind.REAL, not_null=True),
            Column("settled_at", Kind.REAL),
            *_STEP_IDENTITY,
            _ATTEMPT_ERRORS,
            _RECONCILED,
            *_STEP_SPEND,
        ),
        primary_key=("run_id", "idx"),
        without_rowid=True,
    ),
    Table(
        "partials",
        (
            _text("run_id", not_null=True),
            Column("seq", Kind.INTEGER, not_null=True),
            _text("value", not_null=True),
            *_PARTIAL_ORIGIN,
        ),
        primary_key=("run_id", "seq"),
        without_rowid=True,
    ),
    Table(
        "events",
        (
            Column("seq", Kind.SERIAL),
            _text("run_id", not_null=True),
            _text("source"),
            _text("target", not_null=True),
            _text("reason"),
            Column("at", Kind.REAL, not_null=True),
        ),
    ),
    _CHANGES,
    _DELIVERIES,
    _EARLY_CANCELS,
    _APPROVALS,
)

INDEXES: tuple[Index, ...] = (
    Index("runs_by_owner", "runs", ("owner_token",)),
    Index("events_by_run", "events", ("run_id", "seq")),
    Index("runs_by_created", "runs", ("created_at", "id")),
    Index("runs_by_task", "runs", ("task", "created_at")),
    _PAUSING,
    Index("runs_by_state_created", "runs", ("state", "created_at")),
    _CHANGES_BY_RUN,
    _APPROVALS_AWAITING,
)

_SQLITE_CLOCK = "((julianday('now') - 2440587.5) * 86400.0)"
#: the database's clock, seconds since the epoch (the change feed's ``at``)
POSTGRES_CLOCK = "extract(epoch from clock_timestamp())::double precision"


def _sqlite_trigger(name: str, when: str, kind: str, index: str, status: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {name} {when} BEGIN "
        "INSERT INTO changes (run_id, kind, idx, status, at) "
        f"VALUES (NEW.run_id, '{kind}', {index}, {status}, {_SQLITE_CLOCK}); END"
    )


def _postgres_insert(kind: str, index: str, status: str) -> str:
    return (
        "INSERT INTO haltwise.changes (run_id, kind, idx, status, at) "
        f"VALUES (NEW.run_id, '{kind}', {index}, {status}, {POSTGRES_CLOCK});"
    )


#: SQLite's triggers filling ``changes``: name, event, and the new row's kind, index and status
_SQLITE_FEED = (
    ("changes_on_event", "AFTER INSERT ON events", "transition", "NEW.seq", "NEW.target"),
    ("changes_on_step", "AFTER INSERT ON steps", "step", "NEW.idx", "NEW.status"),
    ("changes_on_step_status", "AFTER UPDATE OF status ON steps", "step", "NEW.idx", "NEW.status"),
    ("changes_on_partial", "AFTER INSERT ON partials", "partial", "NEW.seq", "NULL"),
)

#: The run id of a high-water mark: a row of ``changes`` that records no change and only holds
#: the largest number given out so far, so that SQLite numbers the next change above it (see
#: :attr:`Kind.ROWID`). ``prune`` leaves one where it deleted the newest change; the feed skips it.
HIGH_WATER_RUN = ""

#: PostgreSQL's function behind the trigger of :data:`TRIGGERS` (partial results; until version
#: 10 transitions too)
_RECORD_CHANGE = (
    "CREATE OR REPLACE FUNCTION haltwise.record_change() RETURNS trigger "
    "LANGUAGE plpgsql AS $$ BEGIN IF TG_TABLE_NAME = 'events' THEN "
    + _postgres_insert("transition", "NEW.seq", "NEW.target")
    + " ELSE "
    + _postgres_insert("partial", "NEW.seq", "NULL")
    + " END IF; RETURN NULL; END $$"
)

#: The triggers that fill ``changes``. On PostgreSQL only a partial result's: a step's start and
#: settlement and a transition's event are written with their change by the statement that
#: writes them (``postgres_steps.feed_insert``), which costs the server less than a row trigger
#: calling PL/pgSQL (docs/design.md, "What one step costs on PostgreSQL"; a run's creation
#: spent 70% of its statement's time in the trigger of its two events).
TRIGGERS: tuple[Trigger, ...] = (
    Trigger(
        "record_change",
        sqlite=tuple(_sqlite_trigger(*trigger) for trigger in _SQLITE_FEED),
        postgresql=(
            _RECORD_CHANGE,
            "CREATE OR REPLACE TRIGGER changes_on_partial AFTER INSERT ON haltwise.partials "
            "FOR EACH ROW EXECUTE FUNCTION haltwise.record_change()",
        ),
    ),
    _MAY_CREATE,
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2,
        "indexes for listing runs newest first, by task",
        (
            Index("runs_by_created", "runs", ("created_at", "id")),
            Index("runs_by_task", "runs", ("task", "created_at")),
        ),
    ),
    Migration(3, "the pause request of a run (issue 18)", (AddColumn("runs", _PAUSE), _PAUSING)),
    Migration(
        4,
        "the change feed (table changes, filled by triggers) and runs by state, newest first",
        (
            _CHANGES,
            _CHANGES_BY_RUN,
            Index("runs_by_state_created", "runs", ("state", "created_at")),
            TRIGGERS[0],  # (the others name tables of later versions)
        ),
    ),
    Migration(
        5,
        "step identity (call id, argument fingerprint) and the step that emitted each partial",
        (
            *(AddColumn("steps", column) for column in _STEP_IDENTITY),
            *(AddColumn("partials", column) for column in _PARTIAL_ORIGIN),
        ),
    ),
    Migration(
        6,
        "the errors of a step's earlier attempts (issue 18)",
        (AddColumn("steps", _ATTEMPT_ERRORS),),
    ),
    Migration(
        7,
        "whether a cancel of a paused run has something to settle (issue 18)",
        (AddColumn("runs", _SETTLE_ON_CANCEL),),
    ),
    Migration(
        8,
        "PostgreSQL: a step's change is written by the statement that writes the step (no trigger)",
        (
            Trigger(
                "record_change",
                sqlite=(),
                postgresql=(
                    _RECORD_CHANGE,
                    "DROP TRIGGER IF EXISTS changes_on_step ON haltwise.steps",
                ),
            ),
        ),
    ),
    Migration(
        9,
        "SQLite: the change feed's seq a plain rowid (no AUTOINCREMENT), no index changes_by_run",
        (
            Trigger(
                "record_change",
                sqlite=tuple(f"DROP TRIGGER IF EXISTS {trigger[0]}" for trigger in _SQLITE_FEED),
                postgresql=(),
            ),
            Rebuild(
                _CHANGES,
                # AUTOINCREMENT's counter may be above the largest seq left (prune deleted the
                # newest changes): a high-water mark keeps the numbers given out from coming back.
                after_copy=(
                    "INSERT INTO {new} (seq, run_id, kind, at) "
                    f"SELECT seq, '{HIGH_WATER_RUN}', 'transition', {_SQLITE_CLOCK} "
                    "FROM sqlite_sequence WHERE name = '{old}' "
                    "AND seq > (SELECT COALESCE(MAX(seq), 0) FROM {old})",
                ),
            ),
            Trigger("record_change", sqlite=TRIGGERS[0].sqlite, postgresql=()),
        ),
    ),
    Migration(
        10,
        "PostgreSQL: a transition's change is written by the statement that records it",
        (
            Trigger(
                "record_change",
                sqlite=(),
                postgresql=("DROP TRIGGER IF EXISTS changes_on_event ON haltwise.events",),
            ),
        ),
    ),
    # runs_by_state (state) was a prefix of runs_by_state_created (state, created_at): every
    # query by state searches the longer one as it did the shorter (tests/journal/
    # test_migrations.py checks their plans), and each state change maintained both (a bulk
    # cancel of 10,000 runs on SQLite: ~25 ms in the final transitions' UPDATE alone).
    Migration(
        11,
        "no index runs_by_state: runs_by_state_created serves every query by state",
        (DropIndex("runs_by_state"),),
    ),
    Migration(12, "the events sender's delivery position per destination", (_DELIVERIES,)),
    Migration(13, "the span context of a run's latest attempt", (AddColumn("runs", _TRACE),)),
    Migration(
        14,
        "reconcile answers of steps, cancels pressed before their run exists (issue 32)",
        (AddColumn("steps", _RECONCILED), _EARLY_CANCELS),
    ),
    Migration(
        15,
        "approval requests and their decisions (issue 31)",
        (
            _APPROVALS_15,
            Index("approvals_awaiting", "approvals", ("requested_at",), where="state = 'awaiting'"),
        ),
    ),
    Migration(
        16,
        "what each step spent: usd, tokens, calls (budgets, issue 33)",
        tuple(AddColumn("steps", column) for column in _STEP_SPEND),
    ),
    Migration(
        17,
        "PostgreSQL: a run's creation and a cancel remembered before it serialised on the id",
        (_MAY_CREATE,),
    ),
    Migration(
        18,
        "the JSON schema of the tool's parameters with its approval request; the pending "
        "requests' index in their listed order (issue 31)",
        (
            AddColumn("approvals", _PARAMS_SCHEMA),
            DropIndex("approvals_awaiting"),
            _APPROVALS_AWAITING,
        ),
    ),
    Migration(
        19,
        "PostgreSQL: a run's creation and a remembered cancel lock the id's bucket of 1,024 "
        "(a creation round holds a bounded number of locks)",
        (_MAY_CREATE,),
    ),
)

#: The version of :data:`TABLES`: 1 for the first schema, then the newest migration's.
SCHEMA_VERSION = MIGRATIONS[-1].version if MIGRATIONS else 1

#: The PostgreSQL channel every transaction that changes a run row notifies (payload: the run
#: id), and that a store working runs listens on.
CHANGES_CHANNEL = "haltwise_changes"
#: How long a connection to a PostgreSQL server may take (seconds), unless its URL says.
PG_CONNECT_TIMEOUT = 10


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells the schema."""

    name: str
    #: the parameter placeholder
    param: str
    #: prefixed to every table and index name's table (``"haltwise."`` or ``""``)
    prefix: str
    types: dict[Kind, str]
    supports_without_rowid: bool

    def qualify(self, table: str) -> str:
        return f"{self.prefix}{table}"

    def column(self, column: Column) -> str:
        if column.kind in (Kind.SERIAL, Kind.ROWID):
            return f"{column.name} {self.types[column.kind]}"
        words = [column.name, self.types[column.kind]]
        if column.not_null:
            words.append("NOT NULL")
        if column.default is not None:
            words.append(f"DEFAULT {self._literal(column)}")
        return " ".join(words)

    def _literal(self, column: Column) -> str:
        if column.kind is Kind.BOOLEAN and self.types[Kind.BOOLEAN] == "BOOLEAN":
            return "TRUE" if column.default else "FALSE"
        return str(int(column.default or 0))

    def create_table(self, table: Table) -> str:
        parts = [self.column(column) for column in table.columns]
        if table.primary_key:
            parts.append(f"PRIMARY KEY ({', '.join(table.primary_key)})")
        tail = " WITHOUT ROWID" if table.without_rowid and self.supports_without_rowid else ""
        return f"CREATE TABLE IF NOT EXISTS {self.qualify(table.name)} ({', '.join(parts)}){tail}"

    def create_indexes(self, index: Index) -> list[str]:
        """The statement creating ``index``; none if it is another dialect's only."""
        if index.only and index.only != self.name:
            return []
        where = f" WHERE {index.where}" if index.where else ""
        return [
            f"CREATE INDEX IF NOT EXISTS {index.name} ON {self.qualify(index.table)} "
            f"({', '.join(index.columns)}){where}"
        ]

    def rebuild(self, change: Rebuild) -> list[str]:
        """The statements of a :class:`Rebuild` (none but on SQLite)."""
        if self.name != "sqlite":
            return []
        old = change.table.name
        new = f"{old}_rebuilt"
        columns = ", ".join(column.name for column in change.table.columns)
        return [
            self.create_table(replace(change.table, name=new)),
            f"INSERT INTO {new} ({columns}) SELECT {columns} FROM {old} ORDER BY rowid",
            *(statement.format(old=old, new=new) for statement in change.after_copy),
            f"DROP TABLE {old}",
            f"ALTER TABLE {new} RENAME TO {old}",
        ]

    def change(self, change: Change) -> list[str]:
        """The statements of one migration change."""
        if isinstance(change, Index):
            return self.create_indexes(change)
        if isinstance(change, DropIndex):
            return [f"DROP INDEX IF EXISTS {self.qualify(change.name)}"]
        if isinstance(change, Table):
            return [self.create_table(change)]
        if isinstance(change, Trigger):
            return list(change.sqlite if self.name == "sqlite" else change.postgresql)
        if isinstance(change, Rebuild):
            return self.rebuild(change)
        # PostgreSQL: IF NOT EXISTS, so that a migration applied again (a version recorded lower
        # than the tables are) is no error; SQLite has no such clause and is never asked that.
        exists = "" if self.name == "sqlite" else "IF NOT EXISTS "
        table = self.qualify(change.table)
        return [f"ALTER TABLE {table} ADD COLUMN {exists}{self.column(change.column)}"]

    def set_version(self) -> str:
        """The statement that records the schema version (one parameter: the version)."""
        return (
            f"INSERT INTO {self.qualify('haltwise_meta')} (key, value) "
            f"VALUES ('schema_version', {self.param}) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )


SQLITE = Dialect(
    name="sqlite",
    param="?",
    prefix="",
    types={
        Kind.TEXT: "TEXT",
        Kind.INTEGER: "INTEGER",
        Kind.REAL: "REAL",
        Kind.BOOLEAN: "INTEGER",
        Kind.SERIAL: "INTEGER PRIMARY KEY AUTOINCREMENT",
        Kind.ROWID: "INTEGER PRIMARY KEY",
    },
    supports_without_rowid=True,
)

POSTGRES = Dialect(
    name="postgresql",
    param="%s",
    prefix="haltwise.",
    types={
        Kind.TEXT: "TEXT",
        Kind.INTEGER: "INTEGER",
        Kind.REAL: "DOUBLE PRECISION",
        Kind.BOOLEAN: "BOOLEAN",
        Kind.SERIAL: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        Kind.ROWID: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    },
    supports_without_rowid=False,
)


def create_statements(dialect: Dialect) -> list[str]:
    """The statements that create the newest schema in an empty store (version not included)."""
    return [
        *(dialect.create_table(table) for table in TABLES),
        *(statement for index in INDEXES for statement in dialect.create_indexes(index)),
        *(statement for trigger in TRIGGERS for statement in dialect.change(trigger)),
    ]


def parse_version(text: object, where: str) -> int:
    """The schema version stored as ``text``; a value that is not a whole number is refused."""
    try:
        version = int(str(text))
    except ValueError:
        version = 0
    if version < 1:
        # A bad row like any other: check reports it as a finding, every command names it.
        problem = f"unreadable schema version ({str(text)[:40]!r}) in {where}"
        raise CorruptRowError([BadRow("haltwise_meta", "", "schema_version", problem)])
    return version


def _default_sql(dialect: Dialect, column: Column) -> str:
    """The value an added column holds in existing rows: its default, else NULL."""
    return "NULL" if column.default is None else dialect._literal(column)


def read_views(dialect: Dialect, found: int) -> list[str]:
    """For a reader that may not upgrade a store of version ``found`` (a read-only SQLite
    connection): temporary views, one per table that later migrations added columns to, that
    shadow the table and show each missing column with its default, and an empty one per table
    that later migrations made, so that the newest statements read the older store as they read
    a new one.

    SQLite only (an unqualified name finds a temporary view before the table).
    """
    added: dict[str, list[Column]] = {}
    for migration in MIGRATIONS:
        if migration.version > found:
            for change in migration.changes:
                if isinstance(change, AddColumn):
                    added.setdefault(change.table, []).append(change.column)
    # A table a later migration made is shown empty (the approvals of a store older than them),
    # with the columns later migrations added to it too.
    made = [
        change
        for migration in MIGRATIONS
        if migration.version > found
        for change in migration.changes
        if isinstance(change, Table)
    ]
    empty = [
        f"CREATE TEMP VIEW IF NOT EXISTS {change.name} AS SELECT "
        + ", ".join(
            f"NULL AS {column.name}" for column in (*change.columns, *added.pop(change.name, ()))
        )
        + " WHERE 0"
        for change in made
    ]
    return empty + [
        f"CREATE TEMP VIEW IF NOT EXISTS {table} AS SELECT *, "
        + ", ".join(f"{_default_sql(dialect, column)} AS {column.name}" for column in columns)
        + f" FROM main.{table}"
        for table, columns in added.items()
    ]


def upgrade_statements(dialect: Dialect, found: int | None, where: str) -> Sequence[str]:
    """What to run, in one transaction, on opening a store whose schema version is ``found``.

    ``None`` (no version recorded: a new store) creates the newest schema. An older version runs
    the migrations after it; the current version runs nothing. The version itself is then set
    by :meth:`Dialect.set_version` (the caller does it when this returns anything). A newer
    version raises :class:`SchemaVersionError`.
    """
    if found is None:
        return create_statements(dialect)
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} has schema version {found}; this haltwise reads up to "
            f"{SCHEMA_VERSION}: upgrade haltwise"
        )
    return [
        statement
        for migration in MIGRATIONS
        if migration.version > found
        for change in migration.changes
        for statement in dialect.change(change)
    ]
