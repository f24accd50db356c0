"""The PostgreSQL store: one journal shared by processes on several machines.

The tables live in a schema named ``haltwise`` (created if missing), so the store can share a
database with an application's own tables; the schema holds the same tables and columns as the
SQLite store, plus ``haltwise_meta`` with the ``schema_version``. A schema ``haltwise`` that
holds other tables and no ``haltwise_meta`` is refused, as is a newer schema version.

Every operation is one transaction on a pooled connection (psycopg 3, ``autocommit`` off only
inside an explicit transaction) and is committed when its coroutine returns (and durable, with
the server's ``synchronous_commit``; a step settled with ``durable=False`` is committed with it
off, so it is flushed by the next durable commit or the WAL writer). A caller that is
cancelled while waiting stops waiting, but its operation still completes or rolls back whole, as
with the SQLite store. Transitions and cancel requests lock the run row (``SELECT ... FOR
UPDATE``), check the table and write the new state and its event in the same transaction, so a
cancel racing a completion ends in exactly one final state; a run this store object wrote last
is written in one statement instead, only if its row is still the version written (see
:meth:`PostgresStore._request` and docs/design.md, "A run's fixed costs on PostgreSQL").
Fenced writes hold a share lock on the run row until they commit, so a takeover (which locks
the row for update) cannot slip in between the fence check and the write. Workers claim pending
runs with ``FOR UPDATE SKIP LOCKED``. Deadlocks and serialisation failures are retried a few times.

Every transaction that changes a run row also sends ``NOTIFY haltwise_changes`` (payload: the
run id); a dedicated connection ``LISTEN``\\ s, so :meth:`PostgresStore.wait_for_change`
returns as soon as a change is committed anywhere, or after its timeout if the listener is down.

:meth:`PostgresStore.append_partial_blocking` uses its own synchronous connection, guarded by a
lock, and takes no row lock: it may be called from the event-loop thread while that thread is
blocked, and must never wait for a transaction the blocked loop would have to finish. Its fence
is therefore checked against the last committed owner (a takeover committing at the same instant
may see one more partial result, which a replay would write identically anyway).

URL: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``), with any libpq
parameters. Error messages name the host and database, never the password.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import select
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .._core.approvals import ApprovalRecord
from .._core.exceptions import HaltwiseError, NoStoreError, StoreError, UnknownRunError
from .._core.outcome import ErrorInfo
from .._core.records import (
    Event,
    JSONText,
    Owner,
    PartialKey,
    RunRecord,
    RunSnapshot,
    dump_json,
)
from .._core.states import State, StepStatus
from .._core.views import Change, RunSummary
from .coalesce import Coalescer
from .operator_sql import (
    OperatorSQL,
    approval_from_row,
    approval_parameters,
    change_from_row,
    plan_cancels,
    summary_from_row,
    times_from_rows,
)
from .postgres_steps import StepWriter, event_feed, feed_insert, write_deferred
from .rows import (
    CANCELLED_SELECT,
    PARTIAL_COLUMNS,
    RUN_COLUMNS,
    STEP_COLUMNS,
    cancelled_from_row,
    error_to_text,
    event_from_row,
    journal_from_rows,
    partial_key,
    partials_from_rows,
    read_all,
    run_from_row,
    steps_from_rows,
    transition_fields,
)
from .schema import (
    CHANGES_CHANNEL,
    ID_LOCK,
    PG_CONNECT_TIMEOUT,
    POSTGRES,
    POSTGRES_CLOCK,
    SCHEMA_VERSION,
    TABLES,
    parse_version,
    upgrade_statements,
)
from .secrets import MASK, redact, safe_url
from .shield import shielded
from .sql import (
    Plan,
    RunWrite,
    Statements,
    cancel_plan,
    check_fence,
    early_cancel_live,
    event_parameters,
    insert_run_parameters,
    pause_plan,
    pause_signals_of,
    plan_create,
    plan_create_cancelled,
    plan_transition,
    unpause_plan,
)
from .store import (
    UNSET,
    ApprovalRequest,
    CancelResult,
    JournalRows,
    NewRun,
    PauseSignal,
    RunJournal,
    Spend,
    StepStart,
    StepStarted,
    WriteDone,
)

_CHANNEL = CHANGES_CHANNEL
#: the change feed's row of a step row written outside the step writer (an approval request's)
_STEP_CHANGE = (
    "INSERT INTO haltwise.changes (run_id, kind, idx, status, at) "
    f"VALUES (%s, 'step', %s, %s, {POSTGRES_CLOCK})"
)
#: a settlement that writes no spend (the step's columns keep what they hold)
_NO_SPEND: Spend = (None, None, None)
#: advisory lock key that serialises schema creation between processes opening the store at once
_SCHEMA_LOCK = 0x68616C74
_POOL_MAX = 10
#: connections a store that works runs opens at once (see open)
POOL_WORKING = 4


async def _usable(conn: _Conn) -> bool:
    """Whether the pooled ``conn`` may be used: False (and it is closed, so that the pool
    replaces it) if it is known to be dead.

    An idle connection has nothing to read unless its server sent something unasked: a
    termination notice (a restart, ``pg_terminate_backend``, a proxy's timeout) or the end of the
    stream. Only then is the connection asked (an empty query, one round trip); otherwise the
    check is one ``poll`` with no wait, so that the first write after the server closed the
    pool's connections (a shutdown's release, say) is not lost to a connection already dead. A
    connection the server closes while the write is under way still fails that write.
    """
    if not _has_input(conn.fileno()):
        return True
    try:
        await AsyncConnectionPool.check_connection(conn)
    except psycopg.Error:
        await conn.close()
        return False
    return True


@contextlib.asynccontextmanager
async def _pooled(pool: AsyncConnectionPool[_Conn]) -> AsyncIterator[_Conn]:
    """A connection of ``pool`` not known to be dead (see :func:`_usable`), taken again at once
    while the one given is dead, up to the pool's size; then the next one as it is (an outage:
    the operation fails, as it would have on that connection).

    Not the pool's own ``check``: between two failed checks it waits 1, 2, 4, 8... s, so an
    operation begun while the server was cutting connections (a 3 s outage) waited 12-28 s
    after the outage had ended, and a worker took no run meanwhile."""
    for _ in range(_POOL_MAX):
        async with pool.connection() as conn:
            if await _usable(conn):
                yield conn
                return
    async with pool.connection() as conn:
        yield conn


def _has_input(fd: int) -> bool:
    """Whether the socket ``fd`` can be read without waiting (``poll``: ``select`` refuses a
    descriptor over 1,023, which a busy server's process may well hold)."""
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


_CONNECT_TIMEOUT = PG_CONNECT_TIMEOUT
_RETRIES = 5

_SQL = Statements(POSTGRES)
_OPS = OperatorSQL(POSTGRES)

#: a fork's copied steps in the change feed (the statements writing steps write their changes)
_COPIED_STEPS_FEED = feed_insert(
    "(SELECT run_id, idx, status FROM haltwise.steps WHERE run_id = %s ORDER BY idx) AS w"
)

#: runs with their steps and partial results in one statement (see _load_snapshot)
_LOAD_SNAPSHOTS = (
    f"SELECT {RUN_COLUMNS}, "
    f"(SELECT json_agg(json_build_array({STEP_COLUMNS}) ORDER BY idx) FROM haltwise.steps "
    "WHERE run_id = r.id) AS steps_, "
    f"(SELECT json_agg(json_build_array({PARTIAL_COLUMNS}) ORDER BY seq) FROM haltwise.partials "
    "WHERE run_id = r.id) AS partials_ "
    "FROM haltwise.runs r WHERE r.id "
)
#: one run (the parameter: its id)
_LOAD_SNAPSHOT = _LOAD_SNAPSHOTS + "= %s"
#: several runs (the parameter: an array of ids)
_LOAD_SNAPSHOT_MANY = _LOAD_SNAPSHOTS + "= ANY(%s)"


def _recording(write: str) -> str:
    """One statement: ``write`` (an INSERT or UPDATE of one run row ``RETURNING`` its
    ``RUN_COLUMNS``), the events of the write with their changes and the notification, all
    only if a row was written (see :func:`_recorded` for the parameters)."""
    return f"""WITH written AS ({write}),
recorded AS (
    INSERT INTO haltwise.events (run_id, source, target, reason, at)
    SELECT written.id, e.v->>0, e.v->>1, e.v->>2, %s::double precision
    FROM written, json_array_elements(%s::json) WITH ORDINALITY AS e(v, n) ORDER BY e.n
    RETURNING seq, run_id, target
),
feed AS ({event_feed("recorded")})
SELECT written.*, pg_notify('{_CHANNEL}', left(written.id, 1000)) AS notified FROM written"""


def _recorded(parameters: Sequence[Any], write: RunWrite) -> tuple[Any, ...]:
    """The parameters of a :func:`_recording` statement: the write's own, then its events'."""
    return (*parameters, write.at, json.dumps(_event_rows(write)))


def _event_rows(write: RunWrite) -> list[list[str | None]]:
    """The events of ``write`` as the statements take them: ``[source, target, reason]``."""
    return [
        [None if source is None else source.value, target.value, reason]
        for source, target, reason in write.events
    ]


#: what a write of a run row returns besides RUN_COLUMNS: the row's version (``xmin``, the
#: transaction that wrote it: any later write of the row changes it)
_VERSION = ", xmin::text AS version_"
#: a run created, its events recorded and notified: one statement (no fork)
_LOCK_RUN = f"SELECT {RUN_COLUMNS}{_VERSION} FROM haltwise.runs WHERE id = %s FOR UPDATE"
#: a lease renewed: each run's row version before and after (see PostgresStore.heartbeat)
_HEARTBEAT = (
    "WITH held AS (SELECT id, xmin::text AS before FROM haltwise.runs WHERE owner_token = %s "
    "FOR UPDATE) UPDATE haltwise.runs r SET lease_until = %s FROM held WHERE r.id = held.id "
    "RETURNING r.id, held.before, r.xmin::text AS after"
)
#: how many runs' last written rows a store keeps (see PostgresStore._request)
_KNOWN_MAX = 10_000


#: the PostgreSQL type of each column of a run
_RUN_TYPES = {
    column.name: POSTGRES.types[column.kind]
    for table in TABLES
    if table.name == "runs"
    for column in table.columns
} | {"version": "TEXT"}  # and a row version (xmin), as text
#: the columns of a new run, in the order of ``insert_run_parameters``
_NEW_RUN = [
    "id",
    "task",
    "state",
    "inputs",
    "owner",
    "owner_token",
    "lease_until",
    "parent",
    "created_at",
    "updated_at",
]


#: the lock of a run id that a cancel remembered before the run existed takes, exclusively
#: (``schema._MAY_CREATE`` says why; parameter: the id)
_EARLY_CANCEL_LOCK = f"SELECT pg_advisory_xact_lock({ID_LOCK.format(id='%s')})"

#: one run created, with its events (see :func:`_recording`); not written while its id has a
#: cancel remembered before the run existed (parameters: ``insert_run_parameters``, the id and
#: the time; the guard ``haltwise.may_create`` is schema version 17's): such a run is created
#: apart, cancelled (``_taken_or_cancelled``)
_CREATE = _recording(
    f"INSERT INTO haltwise.runs ({', '.join(_NEW_RUN)}) "
    f"SELECT {', '.join(f'%s::{_RUN_TYPES[c]}' for c in _NEW_RUN)} "
    "WHERE haltwise.may_create(%s, %s::double precision) "
    f"ON CONFLICT (id) DO NOTHING RETURNING {RUN_COLUMNS}{_VERSION}"
)


def _recording_many(columns: Sequence[str], write: str) -> str:
    """Writes of many runs as :func:`_recording` makes one, in one statement: ``write`` (an
    INSERT or UPDATE of run rows ``RETURNING`` their ``RUN_COLUMNS``) reads the CTE ``given``,
    the rows of one JSON array parameter, each the values of ``columns`` (as ``g_<column>``,
    cast to the column's type), then the events (``g_events``) and their time (``g_at``); the
    events with their changes and the notification of each row written, in the rows' order."""
    values = ", ".join(f"(e->>{i})::{_RUN_TYPES[c]} AS g_{c}" for i, c in enumerate(columns))
    return f"""WITH given AS (
    SELECT {values}, e->{len(columns)} AS g_events,
        (e->>{len(columns) + 1})::double precision AS g_at, n AS g_n
    FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(e, n)
),
written AS ({write} RETURNING {RUN_COLUMNS}{_VERSION}),
recorded AS (
    INSERT INTO haltwise.events (run_id, source, target, reason, at)
    SELECT written.id, e.v->>0, e.v->>1, e.v->>2, given.g_at
    FROM written JOIN given ON given.g_id = written.id,
        jsonb_array_elements(given.g_events) WITH ORDINALITY AS e(v, k) ORDER BY given.g_n, e.k
    RETURNING seq, run_id, target
),
feed AS ({event_feed("recorded")})
SELECT written.*, pg_notify('{_CHANNEL}', left(written.id, 1000)) AS notified FROM written"""


#: many runs created as :data:`_CREATE` creates one (see :func:`_recording_many`: the rows are
#: ``insert_run_parameters``' values); a run whose id is taken is not written, not returned
_CREATE_MANY = _recording_many(
    _NEW_RUN,
    f"INSERT INTO haltwise.runs ({', '.join(_NEW_RUN)}) "
    f"SELECT {', '.join(f'g_{c}' for c in _NEW_RUN)} FROM given "
    # an id with a cancel remembered before its run existed is created apart, cancelled
    "WHERE haltwise.may_create(g_id, g_created_at) ORDER BY g_n "
    "ON CONFLICT (id) DO NOTHING",
)


@functools.lru_cache(maxsize=64)
def _update_many_sql(fields: tuple[str, ...]) -> str:
    """Writes of ``fields`` to many runs as :func:`_update_sql` makes one, each only if its
    row is still the version given (see :func:`_recording_many`: the rows are the run id, the
    version, then the fields' values). A run may come once."""
    assignments = ", ".join(f"{name} = given.g_{name}" for name in fields)
    return _recording_many(
        ("id", "version", *fields),
        f"UPDATE haltwise.runs SET {assignments} FROM given "
        "WHERE id = given.g_id AND xmin = given.g_version::xid",
    )


@functools.lru_cache(maxsize=64)
def _update_sql(fields: tuple[str, ...], unchanged: bool) -> str:
    """A planned write of ``fields`` with its events (:func:`_recording`); ``unchanged``: only
    if the row is still the version given after the run id."""
    condition = "xmin = %s::text::xid" if unchanged else ""
    return _recording(_SQL.update_run(fields, condition=condition, extra=_VERSION))


_T = TypeVar("_T")
_Conn = psycopg.AsyncConnection[DictRow]
#: a write of a run only if its row is still a version: (run id, version, the write)
_Update = tuple[str, str, RunWrite]


def _describe(url: str) -> str:
    """``host:port/dbname`` of a libpq URL (never its password), for messages."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return safe_url(url)
    host = params.get("host") or params.get("hostaddr") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or params.get('user') or ''}"


def _one_line(error: BaseException, url: str) -> str:
    """The first line of a driver's error, without any secret of ``url`` in any spelling (the
    driver may quote a bad part of the URL as it was given, percent-encoded or not)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = redact(text, url)
    with contextlib.suppress(psycopg.Error):
        password = conninfo_to_dict(url).get("password")
        if password:
            text = text.replace(str(password), MASK)
    return text


class PostgresStore:
    """The PostgreSQL journal (see the module docstring for its locking and notifications)."""

    def __init__(self, url: str, *, read_only: bool = False, works_runs: bool = True) -> None:
        self.url = url
        #: opened by a command that only looks (see open_store): never creates or locks
        self.read_only = read_only
        #: False for a process that works no run (see open_store): one connection at open
        self._works_runs = works_runs
        self._where = _describe(url)
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._listen_conn: _Conn | None = None
        self._listener: asyncio.Task[None] | None = None
        self._changes = 0  # notifications received so far
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._sync_lock = threading.Lock()
        self._sync_conn: psycopg.Connection[DictRow] | None = None
        #: run id -> its row as this store last wrote or locked it, and the row's version
        self._known: dict[str, tuple[RunRecord, str]] = {}
        #: the step path: every run's starts and settlements, group-committed
        self._steps = StepWriter(self._connect, self._error)
        #: runs created meanwhile (no fork), one statement a round
        self._creations: Coalescer[tuple[NewRun, str], tuple[RunRecord, bool]] = Coalescer(
            self._create_many, self._create_one
        )
        #: writes of runs this store wrote last (see _if_unchanged), one statement a round
        self._updates: Coalescer[_Update, tuple[RunRecord, str] | None] = Coalescer(
            self._update_many, self._update_one
        )
        #: runs loaded meanwhile, one statement a round
        self._loads: Coalescer[str, RunSnapshot | None] = Coalescer(self._load_many, self._load_one)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            conninfo_to_dict(self.url)
        except psycopg.Error as error:
            text = _one_line(error, self.url)
            raise StoreError(
                f"unusable PostgreSQL store URL {safe_url(self.url)!r}: {text}"
            ) from None
        # The first connection is made directly, not by the pool: a pool retries an unreachable
        # server until its timeout (10 s) and then says only that it timed out; this fails at
        # once, in the server's or the network's own words.
        conn = await self._connect()
        if self._works_runs:
            await self._or_undo(self._prepare_listening(conn), conn.close)
            self._start_listener(conn)
        else:  # a seat listens only once it waits for a change (see wait_for_change)
            await self._or_undo(self._prepare(conn), conn.close)
            await conn.close()
        pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=POOL_WORKING if self._works_runs and not self.read_only else 1,
            max_size=_POOL_MAX,
            open=False,
            name="haltwise",
            # An operation waits this long for a connection, not the pool's 30 s: with the
            # server down, a command or a run's next write says so after 10 s.
            timeout=_CONNECT_TIMEOUT,
        )
        try:
            await pool.open(wait=True, timeout=_CONNECT_TIMEOUT)
        except psycopg.Error as error:
            await pool.close()
            await self._stop_listener()
            raise self._error(error, connecting=True) from None
        self._pool = pool
        self._steps.open()
        if self._works_runs and not self.read_only:  # else connected by a first step, if any
            try:
                await self._steps.connect()
            except BaseException:
                await self.close()
                raise

    async def _prepare_listening(self, conn: _Conn) -> None:
        await self._prepare(conn)
        await conn.execute(f"LISTEN {_CHANNEL}")

    async def _or_undo(
        self, work: Coroutine[Any, Any, None], undo: Callable[[], Awaitable[None]]
    ) -> None:
        """Await ``work``; if it fails, await ``undo`` and raise (a database error as
        :class:`StoreError`)."""
        try:
            await work
        except psycopg.Error as error:
            await undo()
            raise self._error(error) from None
        except BaseException:
            await undo()
            raise

    async def close(self) -> None:
        await self._creations.wait()
        await self._loads.wait()
        await self._updates.wait()
        await self._steps.close()
        pool, self._pool = self._pool, None
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        if pool is not None:
            await pool.close()
        await self._stop_listener()
        with self._sync_lock:
            if self._sync_conn is not None:
                self._sync_conn.close()
                self._sync_conn = None

    async def _connect(self) -> _Conn:
        try:
            return await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, row_factory=dict_row, **self._connect_options()
            )
        except psycopg.Error as error:
            raise self._error(error, connecting=True) from None

    def _connect_options(self) -> dict[str, Any]:
        return {} if "connect_timeout" in self.url else {"connect_timeout": _CONNECT_TIMEOUT}

    async def _prepare(self, conn: _Conn) -> None:
        async with conn.transaction():
            if not self.read_only:  # reading waits for no other process's schema work
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cursor = await conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'haltwise'"
            )
            tables = {row["table_name"] for row in await cursor.fetchall()}
            if tables and "haltwise_meta" not in tables:
                raise StoreError(
                    f"{self._where} is not a haltwise store (its schema haltwise holds other "
                    "tables)"
                )
            found = None
            if "haltwise_meta" in tables:
                cursor = await conn.execute(
                    "SELECT value FROM haltwise.haltwise_meta WHERE key = 'schema_version'"
                )
                row = await cursor.fetchone()
                found = None if row is None else parse_version(row["value"], self._where)
            if found == SCHEMA_VERSION:
                return
            if self.read_only:
                if found is None:
                    raise NoStoreError(f"{safe_url(self.url)} (no haltwise schema there)")
                upgrade_statements(POSTGRES, found, self._where)  # refuses a newer version
                return
            # Checked first because CREATE SCHEMA IF NOT EXISTS needs a privilege even when the
            # schema exists.
            cursor = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'haltwise'")
            if await cursor.fetchone() is None:
                await conn.execute("CREATE SCHEMA haltwise")
            for statement in upgrade_statements(POSTGRES, found, self._where):
                await conn.execute(statement)
            await conn.execute(POSTGRES.set_version(), (str(SCHEMA_VERSION),))

    def _error(self, error: psycopg.Error, *, connecting: bool = False) -> StoreError:
        """The store's one-line error for a driver's ``error`` (every operation's is made here)."""
        if isinstance(error, PoolTimeout):
            # The pool's own words ("couldn't get a connection after 10.00 sec") say neither
            # which store nor why: the server is down or unreachable (or every connection
            # stayed busy that long).
            connecting = True
            text = f"no connection could be made or freed within {_CONNECT_TIMEOUT} s"
        else:
            text = _one_line(error, self.url)
        if connecting:
            return StoreError(f"cannot connect to the PostgreSQL store {self._where}: {text}")
        return StoreError(f"store {self._where}: {text}")

    # -- running operations ------------------------------------------------------------------

    async def _run(
        self,
        op: Callable[[_Conn], Awaitable[_T]],
        *,
        read_only: bool = False,
        after_steps: bool = True,
        single: bool = False,
        runs: Collection[str] | None = None,
    ) -> _T:
        """Run ``op`` in a transaction of its own (see the module docstring).

        ``single``: ``op`` runs one statement, in autocommit mode: the statement is its own
        transaction (and, for a read, its own snapshot), one round trip instead of the
        ``BEGIN`` and ``COMMIT`` around it.

        A deferred settlement commits before any other operation of this store object, except
        the few with ``after_steps=False``: they neither read nor write step rows nor record
        anything a task did (the runtime watcher's cancel and pause reads, the lease
        heartbeat), so nothing they make durable can precede a settlement it depends on, and
        what they read does not show it. They keep the watcher's ticks from forcing a commit of
        their own on a sequential run's deferred settlement.

        ``runs``: ``op`` reads only those runs' rows, and writes only their run rows and
        events, so only their deferred settlements must commit first: what it reads shows
        this store object's own writes of them, and what it makes durable (a run's transition,
        a cancel or pause request) follows those of the same run; another run's settlement is
        in neither (a settlement that may be deferred is one whose loss is harmless, see
        docs/design.md). So an outcome's load, or a final transition, at many concurrent runs
        does not wait for a commit of the others' settlements."""
        pool = self._pool
        if pool is None:
            raise StoreError(f"store {self._where} is not open")
        if after_steps:
            await self._steps.flush(runs)
        # The operation runs in its own task: a caller cancelled while waiting stops waiting,
        # and the transaction still commits or rolls back whole (as in the SQLite store).
        task = asyncio.ensure_future(self._transact(pool, op, read_only, single))
        self._inflight.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller may have stopped waiting

    async def _transact(
        self,
        pool: AsyncConnectionPool[_Conn],
        op: Callable[[_Conn], Awaitable[_T]],
        read_only: bool,
        single: bool,
    ) -> _T:
        attempt = 0
        while True:
            attempt += 1
            try:
                if single:
                    async with _pooled(pool) as conn:
                        return await op(conn)
                async with _pooled(pool) as conn, conn.transaction():
                    if read_only:
                        # one snapshot for every statement of the read (e.g. a run and its steps)
                        await conn.execute(
                            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                        )
                    return await op(conn)
            except (errors.DeadlockDetected, errors.SerializationFailure) as error:
                if attempt >= _RETRIES:
                    raise self._error(error) from None
            except psycopg.Error as error:
                raise self._error(error) from None

    # -- the Store interface -----------------------------------------------------------------

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        inputs = dump_json(run.inputs, "the task inputs")
        if run.fork is None:  # with the other runs created meanwhile (see _create_many)
            return await self._creations.submit((run, inputs))
        return await self._create_one((run, inputs))

    async def _create_many(
        self, runs: Sequence[tuple[NewRun, str]]
    ) -> list[tuple[RunRecord, bool]]:
        """Runs created at once (none a fork): one statement writes every row with its events
        and notification (:data:`_CREATE_MANY`), each run as :meth:`_create_one` would. A run
        whose id was taken (before, or by an earlier run of the same round) is read back, not
        created, as a run whose id is taken alone is."""

        async def op(conn: _Conn) -> list[tuple[RunRecord, bool]]:
            now = time.time()
            given, ids = [], set()
            for run, inputs in runs:
                if run.id not in ids:  # a statement writes one row an id (its events once)
                    ids.add(run.id)
                    events = _event_rows(plan_create(run, now))
                    given.append([*insert_run_parameters(run, inputs, now), events, now])
            # one statement, so all or none of the round is written (a round written in parts
            # and then failing would leave its first part's runs claimed and never started);
            # its id locks are buckets (schema.ID_LOCK), at most 1,024 however large the round
            cursor = await conn.execute(_CREATE_MANY, (json.dumps(given),), prepare=True)
            written = {row["id"]: row for row in await cursor.fetchall()}
            created: list[tuple[RunRecord, bool]] = []
            for run, inputs in runs:
                row = written.pop(run.id, None)
                if row is None:
                    created.append(await _taken_or_cancelled(conn, run, inputs, now))
                else:
                    created.append((self._remember(run_from_row(row), row["version_"]), True))
            return created

        return await self._run(op, single=True)

    async def _create_one(self, given: tuple[NewRun, str]) -> tuple[RunRecord, bool]:
        run, inputs = given

        async def op(conn: _Conn) -> tuple[RunRecord, bool]:
            now = time.time()
            parameters = insert_run_parameters(run, inputs, now)
            if run.fork is None:  # one statement: the row, its events, the notification
                guarded = (*parameters, run.id, now)
                write = _recorded(guarded, plan_create(run, now))
                inserted = await (await conn.execute(_CREATE, write, prepare=True)).fetchone()
                if inserted is None:
                    return await _taken_or_cancelled(conn, run, inputs, now)
            else:
                inserted = await (await conn.execute(_SQL.insert_run, parameters)).fetchone()
            if inserted is None:
                return await _load_run(conn, run.id), False
            if run.fork is not None:
                await _record_events(conn, run.id, plan_create(run, now))
                fork = (run.id, run.fork.source, run.fork.from_step)
                await conn.execute(_SQL.copy_steps, fork)
                await conn.execute(_COPIED_STEPS_FEED, (run.id,))
                await conn.execute(_SQL.copy_partials, fork)
                return run_from_row(inserted), True
            return self._remember(run_from_row(inserted), inserted["version_"]), True

        return await self._run(op, single=run.fork is None)

    async def transition(
        self,
        run_id: str,
        target: State,
        *,
        expected: Collection[State],
        reason: str | None = UNSET,
        result: Any = UNSET,
        error: ErrorInfo | None = UNSET,
        cancel_error: ErrorInfo | None = UNSET,
        owner: Owner | None = UNSET,
        lease_until: float | None = UNSET,
        settle_on_cancel: bool = UNSET,
        fence: str | None = None,
        returning: bool = True,
        note: str | None = None,
    ) -> RunRecord | None:
        fields = transition_fields(
            target,
            reason=reason,
            result=result,
            error=error,
            cancel_error=cancel_error,
            owner=owner,
            lease_until=lease_until,
            settle_on_cancel=settle_on_cancel,
            note=note,
        )

        def plan(current: RunRecord, now: float) -> RunWrite:
            return plan_transition(current, target, expected, fields, fence=fence, now=now)

        if fence is not None:  # the owner's own transition: never past a lost settlement
            await self._steps.flush((run_id,))
            self._steps.raise_deferred_error(run_id, fence)
        written = await self._request(run_id, plan)
        return written if returning else None

    def transition_then(self, then: WriteDone, run_id: str, target: State, **fields: Any) -> bool:
        return False  # its writes are awaited (see Store.transition_then)

    async def request_cancel(
        self, run_id: str, reason: str, *, force: bool, fence: str | None = None
    ) -> RunRecord:
        return await self._request(run_id, cancel_plan(reason, force, fence))

    async def _request(self, run_id: str, plan: Plan) -> RunRecord:
        """Lock the run, ``plan`` the write, apply it (if any): one transaction.

        If this store wrote or locked the run's row last (``_known``: the record and the row's
        version, ``xmin``), the write planned from that record is tried first as one
        statement, applied only if the row is still that version: the same write the locked
        path would make, since the plan is a function of the row alone. Otherwise (another
        write came between, or the plan refuses or changes nothing, which only the locked row
        may decide) the locked path runs.
        """
        known = self._known.get(run_id)
        if known is not None:
            written = await self._if_unchanged(run_id, plan, *known)
            if written is not None:
                return self._remember(*written)

        async def op(conn: _Conn) -> tuple[RunRecord, str]:
            current, version = await _lock_run(conn, run_id)
            write = plan(current, time.time())
            if write is None:
                return current, version
            return _fetched(await _apply(conn, run_id, write, None))

        return self._remember(*await self._run(op, runs=(run_id,)))

    async def _if_unchanged(
        self, run_id: str, plan: Plan, known: RunRecord, version: str
    ) -> tuple[RunRecord, str] | None:
        """``plan`` applied to ``known`` and written if the run's row is still ``version``
        (one statement); None if it was not written."""
        try:
            write = plan(known, time.time())
        except HaltwiseError:
            return None
        if write is None:
            return None

        return await self._updates.submit((run_id, version, write))

    async def _update_one(self, given: _Update) -> tuple[RunRecord, str] | None:
        run_id, version, write = given

        async def op(conn: _Conn) -> tuple[RunRecord, str] | None:
            return await _apply(conn, run_id, write, version)

        return await self._run(op, single=True, runs=(run_id,))

    async def _update_many(self, updates: Sequence[_Update]) -> list[tuple[RunRecord, str] | None]:
        """Writes made at once by :meth:`_if_unchanged`, each only if its run's row is still
        the version given: one statement per set of columns written (:func:`_update_many_sql`),
        a run written twice in the round written the second time alone, after the first."""
        groups: dict[tuple[str, ...], list[int]] = {}
        again: list[int] = []
        seen: set[str] = set()
        for i, (run_id, _, write) in enumerate(updates):
            if run_id in seen:
                again.append(i)
            else:
                seen.add(run_id)
                groups.setdefault(tuple(write.fields), []).append(i)

        async def op(conn: _Conn) -> dict[str, tuple[RunRecord, str]]:
            written: dict[str, tuple[RunRecord, str]] = {}
            for fields, members in groups.items():
                given = [
                    [run_id, version, *write.fields.values(), _event_rows(write), write.at]
                    for run_id, version, write in (updates[i] for i in members)
                ]
                sql = _update_many_sql(fields)
                cursor = await conn.execute(sql, (json.dumps(given),), prepare=True)
                for row in await cursor.fetchall():
                    written[row["id"]] = (run_from_row(row), row["version_"])
            return written

        written = await self._run(op, single=True, runs=seen)
        results = [None if i in again else written.get(updates[i][0]) for i in range(len(updates))]
        for i in again:
            results[i] = await self._update_one(updates[i])
        return results

    def _remember(self, record: RunRecord, version: str) -> RunRecord:
        """Keep ``record`` (the run's row as this store just wrote or locked it, at
        ``version``) for :meth:`_request`'s one-statement write; a final run is forgotten."""
        known = self._known
        known.pop(record.id, None)
        if not record.state.is_final:
            known[record.id] = (record, version)
            if len(known) > _KNOWN_MAX:
                del known[next(iter(known))]  # the oldest
        return record

    async def request_pause(self, run_id: str, *, reason: str | None = None) -> RunRecord:
        return await self._request(run_id, pause_plan(reason))

    async def request_unpause(
        self, run_id: str, *, budget: dict[str, Any] | None = None
    ) -> RunRecord:
        return await self._request(run_id, unpause_plan(budget))

    async def pause_signals(
        self, run_ids: Collection[str], *, watched: Collection[str]
    ) -> dict[str, PauseSignal]:
        ids = list(run_ids)
        if not ids:
            return {}

        async def op(conn: _Conn) -> dict[str, PauseSignal]:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(
                    "SELECT id, state, pause, reason, force FROM haltwise.runs "
                    "WHERE id = ANY(%s) AND (pause OR id = ANY(%s))",
                    (ids, list(watched)),
                )
                return pause_signals_of(await rows.fetchall(), set(ids))

        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def claim(
        self, run_id: str, owner: Owner, *, lease_until: float, expected_owner: str | None
    ) -> bool:
        async def op(conn: _Conn) -> bool:
            current, _ = await _lock_run(conn, run_id)
            if (current.owner.token if current.owner else None) != expected_owner:
                return False
            await conn.execute(
                _SQL.set_owner, (owner.to_json(), owner.token, lease_until, time.time(), run_id)
            )
            await _notify(conn, run_id)
            return True

        claimed = await self._run(op)
        if claimed and expected_owner != owner.token:  # changed hands (not a renewal)
            self._steps.forget_errors(run_id)
        return claimed

    async def release(self, run_id: str, owner_token: str) -> None:
        async def op(conn: _Conn) -> None:
            cursor = await conn.execute(_SQL.release, (run_id, owner_token))
            if cursor.rowcount:
                await _notify(conn, run_id)

        await self._run(op)
        self._steps.forget_errors(run_id)

    async def heartbeat(self, owner_token: str, lease_until: float) -> int:
        async def op(conn: _Conn) -> list[DictRow]:
            cursor = await conn.execute(_HEARTBEAT, (owner_token, lease_until), prepare=True)
            return await cursor.fetchall()

        renewed = await self._run(op, after_steps=False, single=True)
        known = self._known
        for row in renewed:  # the lease is all that changed: known rows stay known
            found = known.get(row["id"])
            if found is not None and found[1] == row["before"]:
                known[row["id"]] = (replace(found[0], lease_until=lease_until), row["after"])
        return len(renewed)

    async def claim_pending(
        self, owner: Owner, tasks: Collection[str], *, lease_until: float, limit: int
    ) -> list[RunRecord]:
        task_list = sorted(tasks)
        if not task_list or limit <= 0:
            return []

        async def op(conn: _Conn) -> list[DictRow]:
            # SKIP LOCKED: concurrent claimers take disjoint runs instead of queueing on a row;
            # a row another claimer took meanwhile fails the re-checked WHERE and is left out.
            cursor = await conn.execute(
                f"UPDATE haltwise.runs SET owner = %s, owner_token = %s, lease_until = %s "
                f"WHERE id IN (SELECT id FROM haltwise.runs WHERE state = 'pending' "
                f"AND owner_token IS NULL AND task = ANY(%s) ORDER BY created_at, id LIMIT %s "
                f"FOR UPDATE SKIP LOCKED) RETURNING {RUN_COLUMNS}",
                (owner.to_json(), owner.token, lease_until, task_list, limit),
            )
            rows = await cursor.fetchall()
            for row in rows:
                await _notify(conn, str(row["id"]))
            return rows

        # Read after the commit: a run whose row does not parse stays claimed (so it does not
        # hold up the queue) and is reported by CorruptRowError, with the others as readable.
        claimed = read_all(run_from_row, await self._run(op))
        return sorted(claimed, key=lambda run: (run.created_at, run.id))

    async def start_step(
        self, run_id: str, step: StepStart, *, fence: str, durable: bool = True
    ) -> StepStarted:
        # One statement with every run's step writes queued meanwhile (see postgres_steps): the
        # fence check with its share lock, the upsert and the run's cancel state together.
        # Always durable (``durable=False`` is a hint a store may ignore).
        row = _start_row(run_id, step, fence, time.time())
        self._steps.raise_deferred_error(run_id, fence)
        with shielded():  # see Store.start_step
            started = await self._steps.start(row)
            if started is None:
                await self._run(partial(_check_fence, run_id=run_id, fence=fence))
        if started is None:
            raise StoreError(f"run {run_id!r}: step {step.index} could not be journaled")
        return started

    async def settle_step(
        self,
        run_id: str,
        index: int,
        status: StepStatus,
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        fence: str,
        durable: bool = True,
        spend: Spend | None = None,
    ) -> None:
        # durable=False: held in memory and committed with the next write of this store (see
        # postgres_steps and docs/design.md, "Why a settlement may ride with the next write").
        if type(result) is JSONText:  # the runtime's: serialised once, by the step
            result_text: str | None = str(result)
        else:
            result_text = None if result is None else dump_json(result, f"step {index}'s result")
        error_text = None if error is None else error_to_text(error)
        usd, tokens, calls = _NO_SPEND if spend is None else spend
        row = (
            run_id,
            index,
            status._value_,
            result_text,
            error_text,
            time.time(),
            usd,
            tokens,
            calls,
            fence,
        )
        self._steps.raise_deferred_error(run_id, fence)
        if not durable:
            self._steps.defer(row)  # no wait: nothing to shield
            return
        with shielded():  # see Store.settle_step
            if not await self._steps.settle(row):
                # raises if the run is not ours; a step that was never started stays unwritten
                await self._run(partial(_check_fence, run_id=run_id, fence=fence))

    async def reconcile_step(
        self,
        run_id: str,
        index: int,
        status: StepStatus,
        *,
        result: Any = None,
        reconciled: str,
        fence: str | None,
    ) -> bool:
        result_text = None if result is None else dump_json(result, f"step {index}'s result")
        parameters = (status.value, result_text, reconciled, run_id, index, run_id, fence)

        async def op(conn: _Conn) -> bool:
            cursor = await conn.execute(_RECONCILE_STEP, parameters)
            return cursor.rowcount > 0

        written: bool = await self._run(op)
        return written

    async def remember_cancel(self, run_id: str, reason: str, expires_at: float) -> bool:
        async def op(conn: _Conn) -> bool:
            # first, the id's lock that a creation holds while it looks for this cancel
            # (``haltwise.may_create``): a creation under way commits before the run is looked
            # for, and one that begins now waits for this cancel to commit and sees it
            await conn.execute(_EARLY_CANCEL_LOCK, (run_id,))
            await conn.execute(_SQL.expire_early_cancels, (time.time(),))
            parameters = (run_id, reason, expires_at, run_id)
            return (await conn.execute(_SQL.remember_cancel, parameters)).rowcount > 0

        remembered: bool = await self._run(op)
        return remembered

    async def append_partial(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        row = _partial_row(run_id, seq, value, origin)

        async def op(conn: _Conn) -> None:
            await _check_fence(conn, run_id, fence)
            await conn.execute(_SQL.insert_partial, row)

        await self._steps.flush((run_id,))
        self._steps.raise_deferred_error(run_id, fence)
        await self._run(op)

    def append_partial_blocking(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        partial = _partial_row(run_id, seq, value, origin)
        if self._pool is None:
            raise StoreError(f"store {self._where} is not open")
        self._steps.raise_deferred_error(run_id, fence)
        with self._sync_lock:
            try:
                if self._sync_conn is None or self._sync_conn.closed:
                    self._sync_conn = psycopg.Connection.connect(
                        self.url, autocommit=True, row_factory=dict_row, **self._connect_options()
                    )
                conn = self._sync_conn
                taken = self._steps.take_deferred()
                try:
                    with conn.transaction():
                        # Deferred settlements first: they commit with this write, in order.
                        write_deferred(conn, taken)
                        # No row lock here (see the module docstring): the last committed owner.
                        row = conn.execute(_SQL.fence_row, (run_id,)).fetchone()
                        if row is None:
                            raise UnknownRunError(run_id)
                        check_fence(run_id, row["owner_token"], fence)
                        conn.execute(_SQL.insert_partial, partial)
                except BaseException:
                    # Rolled back: the settlements it took (of any run) are not written.
                    self._steps.give_back(taken)
                    raise
            except psycopg.Error as error:
                if self._sync_conn is not None and self._sync_conn.broken:
                    self._sync_conn.close()
                    self._sync_conn = None
                raise self._error(error) from None

    async def load(self, run_id: str) -> RunSnapshot:
        snapshot = await self._loads.submit(run_id)
        if snapshot is None:
            raise UnknownRunError(run_id)
        return snapshot

    async def _load_one(self, run_id: str) -> RunSnapshot | None:
        async def op(conn: _Conn) -> RunSnapshot:
            return await _load_snapshot(conn, run_id)

        try:
            return await self._run(op, read_only=True, single=True, runs=(run_id,))
        except UnknownRunError:
            return None

    async def _load_many(self, run_ids: Sequence[str]) -> list[RunSnapshot | None]:
        """Runs loaded at once (see :meth:`load`): one statement, one snapshot for all;
        None for a run that is not there."""

        async def op(conn: _Conn) -> list[RunSnapshot | None]:
            cursor = await conn.execute(_LOAD_SNAPSHOT_MANY, (list(run_ids),), prepare=True)
            found = {row["id"]: row for row in await cursor.fetchall()}
            rows = [found.get(run_id) for run_id in run_ids]
            return [None if row is None else _snapshot_from_row(row) for row in rows]

        return await self._run(op, read_only=True, single=True, runs=run_ids)

    async def list_runs(self, state: State | None = None) -> list[RunRecord]:
        async def op(conn: _Conn) -> list[RunRecord]:
            cursor = await conn.execute(*_SQL.list_runs(state))
            return read_all(run_from_row, await cursor.fetchall())

        return await self._run(op, read_only=True, single=True)

    async def read_journal(self) -> JournalRows:
        async def op(conn: _Conn) -> JournalRows:
            # A read-only operation: one REPEATABLE READ snapshot for all five reads.
            runs = await (await conn.execute(*_SQL.list_runs(None))).fetchall()
            events = await (await conn.execute(*_SQL.events(None))).fetchall()
            async with conn.cursor(row_factory=tuple_row) as plain:  # step_from_row: by position
                await plain.execute(_SQL.all_steps)
                steps = await plain.fetchall()
                await plain.execute(_SQL.all_partials)
                partials = await plain.fetchall()
                await plain.execute(_SQL.all_step_changes)
                changes = await plain.fetchall()
            return journal_from_rows(runs, events, steps, partials, changes)

        return await self._run(op, read_only=True)

    async def events(self, run_id: str | None = None) -> list[Event]:
        async def op(conn: _Conn) -> list[Event]:
            cursor = await conn.execute(*_SQL.events(run_id))
            return read_all(event_from_row, await cursor.fetchall())

        return await self._run(op, read_only=True, single=True)

    async def cancel_requests(
        self, run_ids: Collection[str], *, acting: Sequence[str] = ()
    ) -> dict[str, tuple[str, bool]]:
        ids = list(run_ids)
        if not ids:
            return {}

        async def op(conn: _Conn) -> dict[str, tuple[str, bool]]:
            cursor = await conn.execute(
                "SELECT id, reason, force FROM haltwise.runs "
                "WHERE state = 'cancelling' AND id = ANY(%s) AND (force OR id <> ALL(%s))",
                (ids, list(acting)),
            )
            return {
                row["id"]: (row["reason"] or "user", bool(row["force"]))
                for row in await cursor.fetchall()
            }

        return await self._run(op, read_only=True, single=True, after_steps=False)

    # -- the operator's operations (their SQL: operator_sql) ------------------------------------

    async def run_page(
        self,
        *,
        states: Collection[State],
        tasks: Collection[str] | None,
        limit: int,
        before: tuple[float, str] | None,
        progress: bool = False,
    ) -> list[RunSummary]:
        sql, params = _OPS.run_page(
            states=states, tasks=tasks, limit=limit, before=before, progress=progress
        )

        async def op(conn: _Conn) -> list[RunSummary]:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(sql, params)
                return [summary_from_row(row) for row in await rows.fetchall()]

        return await self._run(op, read_only=True, single=True)

    async def task_names(self) -> list[str]:
        async def op(conn: _Conn) -> list[str]:
            cursor = await conn.execute(_OPS.task_names())
            return [row["task"] for row in await cursor.fetchall()]

        return await self._run(op, read_only=True, single=True)

    async def inspect(self, run_id: str) -> RunJournal:
        async def op(conn: _Conn) -> RunJournal:
            snapshot = await _load_snapshot(conn, run_id)
            cursor = await conn.execute(*_SQL.events(run_id))
            events = read_all(event_from_row, await cursor.fetchall())
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.step_times(), (run_id,))
                times = times_from_rows(await rows.fetchall())
            return RunJournal(snapshot=snapshot, events=tuple(events), step_times=times)

        return await self._run(op, read_only=True, runs=(run_id,))

    async def request_cancels(
        self,
        *,
        ids: Sequence[str] | None,
        states: Collection[State],
        tasks: Collection[str] | None,
        reason: str,
        force: bool,
        dry_run: bool = False,
    ) -> CancelResult:
        if ids is not None:
            query = _OPS.runs_by_ids(lock=not dry_run, columns=CANCELLED_SELECT)
            params: Sequence[Any] = (_OPS.id_list(ids),)
        else:
            query, params = _OPS.active_runs(
                states=states, tasks=tasks, lock=not dry_run, columns=CANCELLED_SELECT
            )

        async def op(conn: _Conn) -> CancelResult:
            # plain tuples: cancelled_from_row reads them by position
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(query, params)
                found = read_all(cancelled_from_row, await rows.fetchall())
            writes, result = plan_cancels(
                _OPS, found, ids, reason=reason, force=force, now=time.time(), dry_run=dry_run
            )
            async with conn.cursor() as batch:
                for statement, parameters in writes:
                    await batch.execute(statement, parameters)
            if result.reached and not dry_run:
                await _notify(conn, result.reached[0].id)
            return result

        return await self._run(op, read_only=dry_run)

    async def prune(
        self, *, ended_before: float, states: Collection[State], dry_run: bool = False
    ) -> list[str]:
        sql, params = _OPS.prunable(states, lock=not dry_run)

        async def op(conn: _Conn) -> list[str]:
            cursor = await conn.execute(sql, (*params, ended_before))
            ids = [row["id"] for row in await cursor.fetchall()]
            if ids and not dry_run:
                for statement in _OPS.prune_deletes():
                    await conn.execute(statement, (_OPS.id_list(ids),))
            return ids

        return await self._run(op, read_only=dry_run)

    async def changes_after(self, seq: int, *, limit: int) -> tuple[list[Change], float]:
        async def op(conn: _Conn) -> tuple[list[Change], float]:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.changes_after(), (seq, limit))
                changes = [change_from_row(row) for row in await rows.fetchall()]
                await rows.execute(_OPS.now())
                now = await rows.fetchone()
            return changes, float(now[0]) if now else time.time()

        return await self._run(op)

    async def last_change(self) -> int:
        async def op(conn: _Conn) -> int:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.last_change())
                row = await rows.fetchone()
            return int(row[0]) if row else 0

        return await self._run(op, read_only=True, single=True)

    async def swap_trace(self, run_id: str, traceparent: str) -> str | None:
        async def op(conn: _Conn) -> str | None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.trace_of(), (run_id,))
                row = await rows.fetchone()
                await rows.execute(_OPS.save_trace(), (traceparent, run_id))
            return None if row is None else row[0]

        return await self._run(op, runs=(run_id,))

    async def request_approval(
        self, run_id: str, request: ApprovalRequest, *, fence: str
    ) -> ApprovalRecord | None:
        asked, step_row = approval_parameters(run_id, request, fence)
        index = request.step.index

        async def op(conn: _Conn) -> ApprovalRecord | None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.approval_request(), asked)
                if rows.rowcount:
                    await rows.execute(_OPS.approval_change(), (run_id, index, "awaiting"))
                await rows.execute(_OPS.approval_step(), step_row)
                if rows.rowcount:
                    await rows.execute(_STEP_CHANGE, (run_id, index, "awaiting"))
                await rows.execute(_OPS.approval_of(), (run_id, index))
                row = await rows.fetchone()
            await _notify(conn, run_id)
            return None if row is None else approval_from_row(row)

        return await self._run(op, runs=(run_id,))

    async def decide_approval(
        self,
        run_id: str,
        index: int,
        state: str,
        *,
        by: str | None,
        note: str | None,
        edited: str | None,
    ) -> tuple[ApprovalRecord | None, bool]:
        async def op(conn: _Conn) -> tuple[ApprovalRecord | None, bool]:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.approval_decide(), (state, by, note, edited, run_id, index))
                won = bool(rows.rowcount)
                if won:
                    await rows.execute(_OPS.approval_change(), (run_id, index, state))
                    await _notify(conn, run_id)  # wakes the run's owner (its watcher)
                await rows.execute(_OPS.approval_of(), (run_id, index))
                row = await rows.fetchone()
            return (None if row is None else approval_from_row(row)), won

        return await self._run(op, after_steps=False)

    async def approvals(
        self, run_id: str | None = None, *, limit: int = 100_000
    ) -> list[ApprovalRecord]:
        async def op(conn: _Conn) -> list[ApprovalRecord]:
            async with conn.cursor(row_factory=tuple_row) as rows:
                if run_id is None:
                    await rows.execute(_OPS.approvals_awaiting(), (limit,))
                else:
                    await rows.execute(_OPS.approvals_of_run(), (run_id,))
                return [approval_from_row(row) for row in await rows.fetchall()]

        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def approval(self, run_id: str, index: int) -> ApprovalRecord | None:
        async def op(conn: _Conn) -> ApprovalRecord | None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.approval_of(), (run_id, index))
                row = await rows.fetchone()
            return None if row is None else approval_from_row(row)

        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def approval_schema(self, run_id: str, index: int) -> str | None:
        async def op(conn: _Conn) -> str | None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.approval_schema(), (run_id, index))
                row = await rows.fetchone()
            return None if row is None else row[0]

        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def pending_approvals_json(self, *, limit: int = 100_000) -> str:
        async def op(conn: _Conn) -> str:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.approvals_pending_json(), (limit,))
                row = await rows.fetchone()
            assert row is not None
            text: str = row[0]
            return text

        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def cancel_approval(self, run_id: str, index: int, *, fence: str) -> None:
        async def op(conn: _Conn) -> None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                fenced = (run_id, index, run_id, fence)
                await rows.execute(_OPS.approval_cancel(), fenced)
                if rows.rowcount:
                    await rows.execute(_OPS.approval_change(), (run_id, index, "cancelled"))
                await rows.execute(_OPS.approval_step_interrupted(), fenced)
                if rows.rowcount:
                    await rows.execute(_STEP_CHANGE, (run_id, index, "interrupted"))
            await _notify(conn, run_id)

        await self._run(op, runs=(run_id,))

    async def delivery_position(self, destination: str) -> int | None:
        async def op(conn: _Conn) -> int | None:
            async with conn.cursor(row_factory=tuple_row) as rows:
                await rows.execute(_OPS.delivery_position(), (destination,))
                row = await rows.fetchone()
            return None if row is None else int(row[0])

        # after_steps=False: neither reads nor writes what a run journals (see _run)
        return await self._run(op, read_only=True, single=True, after_steps=False)

    async def save_delivery_position(self, destination: str, position: int) -> None:
        async def op(conn: _Conn) -> None:
            await conn.execute(_OPS.save_delivery_position(), (destination, position))

        await self._run(op, single=True, after_steps=False)

    async def record_budget_exhausted(self, run_id: str) -> None:
        async def op(conn: _Conn) -> None:
            await conn.execute(_OPS.record_budget_exhausted(), (run_id,))
            await _notify(conn, run_id)

        await self._run(op, single=True, runs=(run_id,))

    def set_concurrency(self, active_runs: int) -> None:
        """Ignored: every operation already runs on a pooled connection of its own."""

    async def wait_for_change(self, timeout: float, since: int | None = None) -> int:
        deadline = time.monotonic() + timeout
        if self._pool is not None and (self._listener is None or self._listener.done()):
            with anyio.move_on_after(timeout):
                await self._restart_listener()
        if self._listener is None:
            await anyio.sleep(max(0.0, deadline - time.monotonic()))
            self._changes += 1  # no notifications: anything may have changed meanwhile
            return self._changes
        if self._changes == (self._changes if since is None else since):
            # Nothing new for this caller since it last looked: wait for a notification.
            wake = self._wake
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await wake.wait()
        return self._changes

    # -- the listener ------------------------------------------------------------------------

    def _start_listener(self, conn: _Conn) -> None:
        self._listen_conn = conn
        self._wake = asyncio.Event()  # bound to the loop that runs the listener
        self._listener = asyncio.get_running_loop().create_task(
            self._listen(conn), name="haltwise-postgres-listener"
        )

    async def _listen(self, conn: _Conn) -> None:
        try:
            async for _ in conn.notifies():
                self._changed()
        except psycopg.Error:
            pass  # the server went away: wait_for_change reopens the listener
        finally:
            self._changed()  # whatever happened meanwhile is unknown: let waiters look

    def _changed(self) -> None:
        self._changes += 1
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def _restart_listener(self) -> None:
        await self._stop_listener()
        try:
            conn = await self._connect()
            await conn.execute(f"LISTEN {_CHANNEL}")
        except (StoreError, psycopg.Error):
            return  # wait_for_change falls back to its timeout until the server is back
        self._start_listener(conn)

    async def _stop_listener(self) -> None:
        listener, self._listener = self._listener, None
        conn, self._listen_conn = self._listen_conn, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await listener
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


# -- SQL helpers ------------------------------------------------------------------------------


def _partial_row(
    run_id: str, seq: int, value: Any, origin: PartialKey | None
) -> tuple[str, int, str, int | None, int]:
    step, ordinal = origin or (None, seq)
    return (run_id, seq, dump_json(value, "a partial result"), step, ordinal)


async def _load_snapshot(conn: _Conn, run_id: str) -> RunSnapshot:
    """The run with its steps and partial results: one statement (one round trip, and one
    snapshot even outside a transaction), the steps and partials as JSON arrays of their
    columns in order (``STEP_COLUMNS``, ``PARTIAL_COLUMNS``)."""
    row = await (await conn.execute(_LOAD_SNAPSHOT, (run_id,), prepare=True)).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    return _snapshot_from_row(row)


def _snapshot_from_row(row: DictRow) -> RunSnapshot:
    """A run's snapshot from a row of :data:`_LOAD_SNAPSHOTS`."""
    run_id = row["id"]
    partials = row["partials_"] or []
    return RunSnapshot(
        run=run_from_row(row),
        steps=steps_from_rows(run_id, row["steps_"] or []),
        partials=partials_from_rows(run_id, [value for value, _, _, _ in partials]),
        partial_keys=tuple(partial_key(step, ordinal, seq) for _, step, ordinal, seq in partials),
    )


#: a reconcile's answer written with its change (see ``Statements.reconcile_step``)
_RECONCILE_STEP = f"WITH w AS ({_SQL.reconcile_step} RETURNING run_id, idx, status) " + feed_insert(
    "w"
)


async def _taken_or_cancelled(
    conn: _Conn, run: NewRun, inputs: str, now: float
) -> tuple[RunRecord, bool]:
    """A run the creation statement did not write: its id is taken (the run as it is), or has a
    cancel remembered before the run existed: then the run is created ``cancelled``, unowned,
    with that cancel's reason and its two events (see :meth:`Store.remember_cancel`)."""
    early = await (await conn.execute(_SQL.take_early_cancel, (run.id,))).fetchone()
    if early is None or not early_cancel_live(early["expires_at"], now):
        return await _load_run(conn, run.id), False
    reason = early["reason"]
    cancelled = replace(run, state=State.CANCELLED, owner=None, lease_until=None)
    parameters = insert_run_parameters(cancelled, inputs, now)
    if await (await conn.execute(_SQL.insert_run, parameters)).fetchone() is None:
        return await _load_run(conn, run.id), False
    await conn.execute(_SQL.update_run(("reason",), returning=False), (reason, run.id))
    await _record_events(conn, run.id, plan_create_cancelled(reason, now))
    return await _load_run(conn, run.id), True


async def _load_run(conn: _Conn, run_id: str) -> RunRecord:
    row = await (await conn.execute(_SQL.load_run, (run_id,))).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    return run_from_row(row)


async def _lock_run(conn: _Conn, run_id: str) -> tuple[RunRecord, str]:
    """The run and its row's version, the row locked until the transaction ends."""
    row = await (await conn.execute(_LOCK_RUN, (run_id,), prepare=True)).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    return run_from_row(row), row["version_"]


def _start_row(run_id: str, step: StepStart, fence: str, now: float) -> tuple[Any, ...]:
    """A step start as ``postgres_steps.START_COLUMNS`` lists them, then the fence."""
    return (
        run_id,
        step.index,
        step.tool,
        step.cancel,
        step.effect._value_,  # the member's own text (``.value`` is a property: slower)
        step.idempotent,
        step.idempotency_key,
        step.args,
        step.cleanup,
        now,
        step.call_id,
        step.fingerprint,
        fence,
    )


async def _check_fence(conn: _Conn, run_id: str, fence: str) -> DictRow:
    """Raise :class:`LostOwnershipError` unless ``fence`` holds the run; share-lock its row."""
    row = await (await conn.execute(_SQL.fence_row + " FOR SHARE", (run_id,))).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    check_fence(run_id, row["owner_token"], fence)
    return row


async def _apply(
    conn: _Conn, run_id: str, write: RunWrite, version: str | None
) -> tuple[RunRecord, str] | None:
    """Write ``write``'s fields to the run's row, record its events, notify: one statement.
    The row is locked already, or (``version`` given) written only if it is still that
    version; the record written and its version, None if not written."""
    condition = () if version is None else (version,)
    parameters = _recorded((*write.fields.values(), run_id, *condition), write)
    sql = _update_sql(tuple(write.fields), version is not None)
    row = await (await conn.execute(sql, parameters, prepare=True)).fetchone()
    return None if row is None else (run_from_row(row), row["version_"])


def _fetched(written: tuple[RunRecord, str] | None) -> tuple[RunRecord, str]:
    if written is None:  # pragma: no cover - the locked row is there to update
        raise StoreError("the store returned no row")
    return written


async def _record_events(conn: _Conn, run_id: str, write: RunWrite) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(_OPS.record_event(), event_parameters(run_id, write))
    await _notify(conn, run_id)


async def _notify(conn: _Conn, run_id: str) -> None:
    # Delivered at commit, and only if the transaction commits.
    await conn.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, run_id[:1000]))
