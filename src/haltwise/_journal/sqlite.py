"""The embedded default store: one SQLite file in WAL mode.

The SQL of every :class:`~.store.Store` operation lives here; how operations reach the
database (group commit, the fast path, the writer thread, deferred settlements) lives in
:mod:`.sqlite_writer`. Each write is durable (``synchronous=FULL`` by default) when its
coroutine returns. Other processes' commits are noticed through ``PRAGMA data_version``, polled
every 15 ms on a dedicated connection.

URL: ``sqlite:///relative.db`` or ``sqlite:////absolute.db``; options ``?synchronous=normal``
(survives a process crash, not a power loss) and ``?busy_timeout=SECONDS`` (default 60).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Awaitable, Collection, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Literal
from urllib.parse import quote

import anyio

from .._core.approvals import ApprovalRecord
from .._core.exceptions import NoStoreError, StoreError, StoreGoneError, UnknownRunError
from .._core.outcome import ErrorInfo
from .._core.records import Event, Owner, PartialKey, RunRecord, RunSnapshot, dump_json
from .._core.rules import RunHead
from .._core.states import State, StepStatus
from .._core.views import Change, RunSummary
from .file_watch import FileWatch, open_watch
from .operator_sql import (
    OperatorSQL,
    RunWrites,
    approval_from_row,
    approval_parameters,
    change_from_row,
    plan_cancels,
    summary_from_row,
    times_from_rows,
)
from .rows import (
    CANCELLED_SELECT,
    HEAD_COLUMNS,
    RUN_COLUMNS,
    cancelled_from_row,
    each_read,
    error_to_text,
    event_from_row,
    head_from_row,
    journal_from_rows,
    partial_key,
    partials_from_rows,
    read_all,
    run_from_row,
    run_written,
    steps_from_rows,
    transition_fields,
)
from .schema import SCHEMA_VERSION, SQLITE, parse_version, read_views, upgrade_statements
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
    transition_plan_key,
    unpause_plan,
)
from .sqlite_url import parse_url
from .sqlite_writer import GroupOp, Op, Outcome, Writer, store_error
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

#: The page size of a new store file (bytes).
_PAGE_SIZE = 1024

#: The page cache of the writer's connection (KiB; SQLite's default is 2 MiB). With many runs
#: active a batch touches a page or more per run: a cache smaller than those pages re-reads
#: them from the OS at every batch (measured: 5.3 read calls per step at 1,000 runs with the
#: default, 1.2 with this). It only grows as pages are read, up to this bound.
_CACHE_KIB = 16384

#: Where the writer's connection keeps its temporary files: in memory. The one it writes on the
#: busiest path is the sub-journal, where SQLite copies every page a savepoint (an operation of
#: a batch that needs its own, ``sqlite_writer``) or a statement that may fail halfway (one
#: that fires a trigger, inside a transaction) changes; past 64 KiB in one transaction SQLite
#: writes it to a temporary file. Measured at 1,000 runs of 20 steps: 4.7 write calls and 2.7
#: KiB written per step with the file, 3.9 and 2.3 without (while a batch's settlements shared
#: one savepoint: 15.6 and 8.2 KiB, and 11% more CPU per step; issue 13). Nothing durable
#: is in it: it lives only until its transaction ends.
_TEMP_STORE = "MEMORY"


#: The settings at which every commit syncs the WAL.
_SYNCED = ("FULL", "EXTRA")


def _checkpoint_pages(synchronous: str) -> int:
    """The WAL's size, in pages, at which a commit checkpoints it into the database file.

    SQLite's default is 1,000 pages (4 MiB of its default 4 KiB pages, 1 MiB of this store's
    1 KiB pages). A checkpoint costs two syncs and copies every page the WAL holds a frame of;
    most of a journal's frames are the same few rightmost pages written again. Without a sync
    per commit (``NORMAL``, ``OFF``) checkpointing at 4 MiB, as SQLite does by default in bytes,
    costs less per step (measured: -12% per step at ``NORMAL``). With one (``FULL``, ``EXTRA``)
    the default stays (measured before the WAL was given its room, when a WAL that cycled
    sooner stopped growing sooner: docs/benchmarks.md, "The change feed's cost"); the WAL is
    given the room of this many frames as the store opens (:func:`_preallocate_wal`). The writer
    raises the limit for the commit of a big batch (``sqlite_writer._BIG_BATCH``) and for
    every commit while the process works many runs (``sqlite_writer._MANY_RUNS``).
    """
    return 1000 if synchronous in _SYNCED else 4096


#: a file's data made durable: macOS has no fdatasync
_sync_data = getattr(os, "fdatasync", os.fsync)

#: The bytes of a WAL file's header and of each frame's header (SQLite's file format).
_WAL_HEADER, _FRAME_HEADER = 32, 24


def _preallocate_wal(conn: sqlite3.Connection, path: str, pages: int) -> None:
    """Give the WAL file the room of ``pages`` frames now, written, so that commits write into
    blocks the file has instead of growing it.

    SQLite deletes the WAL when the last connection closes, and a new WAL grows at every commit
    until a checkpoint has copied all of it back and SQLite starts it again from the top (it
    never shrinks it: no ``journal_size_limit``). A sync that must also make a new size and new
    blocks durable (the file system's own journal) costs more than one that only writes data
    into blocks the file has; so does one into blocks ``fallocate`` reserved but that were never
    written (the file system converts them as they are written, measured: docs/benchmarks.md).
    So the room is written with zeros and synced, as PostgreSQL does with its WAL segments.

    Only bytes past the file's end are written, with the connection holding the write lock
    (``BEGIN IMMEDIATE``): no other connection writes the WAL meanwhile, and no frame was ever
    there. Zeros are never read as frames (a frame counts only if its salts and checksums follow
    the WAL header's), as a reused WAL's old frames are not. Best effort: a full disk leaves
    the WAL to grow as before.
    """
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    size = _WAL_HEADER + pages * (_FRAME_HEADER + page_size)
    try:
        fd = os.open(path + "-wal", os.O_WRONLY)  # made by SQLite as the file went to WAL
    except OSError:
        return
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        if end < size:
            os.write(fd, bytes(size - end))
            _sync_data(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: How often wait_for_change looks at PRAGMA data_version (seconds): the bound on noticing a
#: cancel from another process, against the CPU an idle process spends waking up (on the CI's
#: kind of VM a wake-up costs ~100-200 us of CPU, and reading data_version ~30 us more: at
#: 10 ms an idle run used 2.1-3.0% of a core, over issue 4's 2%).
_POLL_INTERVAL = 0.015
#: With a watch of the store's files (Linux): the longest wait_for_change waits for a file event
#: before it reads data_version anyway (a safety net), and how many _POLL_INTERVAL ticks it
#: polls after an event that showed no commit yet. An idle process wakes 4 times a second, not
#: 67 (a wake-up on this kind of VM costs ~100-250 us of CPU: 1.6% of a core at 15 ms).
_WATCH_INTERVAL = 0.25
_POLL_AFTER_EVENT = 3

_SQL = Statements(SQLITE)
_OPS = OperatorSQL(SQLITE)

_START_STEP = """
INSERT INTO steps (run_id, idx, tool, cancel, effect, idempotent, status, attempts, idem_key,
                   args, cleanup, started_at, call_id, fingerprint)
SELECT ?, ?, ?, ?, ?, ?, 'running', 1, ?, ?, ?, ?, ?, ?
WHERE EXISTS (SELECT 1 FROM runs WHERE id = ? AND owner_token = ?)
ON CONFLICT (run_id, idx) DO UPDATE SET status = 'running', attempts = attempts + 1,
    result = NULL, error = NULL, args = excluded.args, started_at = excluded.started_at,
    settled_at = NULL, call_id = excluded.call_id, fingerprint = excluded.fingerprint,
    errors = CASE WHEN error IS NULL THEN errors ELSE json_insert(coalesce(errors, '[]'), '$[#]',
        json_set(json(error), '$.attempt', attempts)) END
RETURNING attempts, (SELECT CASE WHEN state = 'cancelling' THEN 1 WHEN pause THEN 2 ELSE 0 END
                     FROM runs WHERE id = steps.run_id)
"""

_SETTLE_STEP = """
UPDATE steps SET status = ?, result = ?, error = ?, settled_at = ?, usd = coalesce(?, usd),
    tokens = coalesce(?, tokens), calls = coalesce(?, calls)
WHERE run_id = ? AND idx = ? AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND owner_token = ?)
"""


#: how many of the runs whose ids are in the list bound (see OperatorSQL.id_list) the owner
#: token bound holds
_HELD = f"SELECT count(*) FROM runs WHERE id {_OPS.in_ids} AND owner_token = ?"


def _claim_query(task_count: int) -> str:
    """The claim: up to ``limit`` pending runs nobody owns, of the ``task_count`` tasks bound,
    oldest first, take the owner and lease bound (parameters: owner, owner token, lease_until,
    the tasks, limit), every column of each returned. One statement, as on PostgreSQL: the
    writer holds the lock, so no claimer races it."""
    marks = ", ".join("?" * task_count)
    return (
        "UPDATE runs SET owner = ?, owner_token = ?, lease_until = ? WHERE id IN "
        f"(SELECT id FROM runs WHERE state = 'pending' AND owner_token IS NULL "
        f"AND task IN ({marks}) ORDER BY created_at, id LIMIT ?) RETURNING {RUN_COLUMNS}"
    )


#: the cancel requests: the runs in ``cancelling`` (read through the state index)
_CANCELLING = "SELECT id, reason, force FROM runs WHERE state = 'cancelling'"
#: the same, but of the runs whose ids are bound (a JSON array: their cancel acted on by the
#: caller), only forced ones
_CANCELLING_NEWS = f"{_CANCELLING} AND (force OR id NOT IN (SELECT value FROM json_each(?)))"

# Step writes are partials of these, not closures: fewer objects for the garbage collector to
# track per step while it waits for its batch (measurable with a thousand runs waiting).


#: a settlement that writes no spend (the step's columns keep what they hold)
_NO_SPEND: Spend = (None, None, None)

#: a step's first start, in a run neither cancelling nor asked to pause (a record: shared)
_FIRST_START = StepStarted(1)


def _start_step(parameters: tuple[Any, ...], conn: sqlite3.Connection) -> StepStarted:
    # One statement: the fence check, the upsert and the run's cancel and pause state together.
    row = conn.execute(_START_STEP, parameters).fetchone()
    run_id, fence = parameters[-2:]
    if row is None:
        _check_fence(conn, run_id, fence)  # raises why: unknown run or lost ownership
        raise StoreError(f"run {run_id!r}: step {parameters[1]} could not be journaled")
    attempts, signal = row
    if signal == 0 and attempts == 1:
        return _FIRST_START  # the common case, without building a record
    if signal != 1:
        return StepStarted(attempts, pause=signal == 2)
    run = _check_fence(conn, run_id, fence)
    return StepStarted(attempts, cancel=(run["reason"] or "user", bool(run["force"])))


class _SettleStep(GroupOp):
    """A step's settlement (the parameters of ``_SETTLE_STEP``); settlements side by side in
    a batch (many runs' steps ending together) are one ``executemany``."""

    __slots__ = ("parameters",)

    def __init__(self, parameters: tuple[Any, ...]) -> None:
        self.parameters = parameters

    def __call__(self, conn: sqlite3.Connection) -> None:
        if not conn.execute(_SETTLE_STEP, self.parameters).rowcount:
            _check_fence(conn, self.parameters[-2], self.parameters[-1])

    @classmethod
    def run_group(cls, conn: sqlite3.Connection, ops: list[Any]) -> list[Outcome] | None:
        # The fences first: if each holds, each settlement ends as alone it would, whether its
        # step's row is there or not (then it changes nothing, as alone). Counted by the
        # database, per fence (nearly always one): no row read into Python.
        runs: dict[str, set[str]] = {}
        for op in ops:
            runs.setdefault(op.parameters[-1], set()).add(op.parameters[-2])
        for fence, ids in runs.items():
            (held,) = conn.execute(_HELD, (_OPS.id_list(list(ids)), fence)).fetchone()
            if held != len(ids):
                return None  # one fenced off (or no such run): one by one, each raising as alone
        conn.executemany(_SETTLE_STEP, [op.parameters for op in ops])
        return [(None, None)] * len(ops)


class SQLiteStore:
    """The SQLite journal (see the module docstring for its concurrency and durability)."""

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.path, self.synchronous, self.busy_timeout = parse_url(url)
        #: opened by a command that only looks (see open_store): never creates or locks
        self.read_only = read_only
        prepare = self._check_readable if read_only else self._prepare
        self._writer = Writer(
            self.path,
            self.busy_timeout,
            self._connect,
            prepare,
            _checkpoint_pages(self.synchronous),
            self.synchronous if self.synchronous in _SYNCED else None,
        )
        self._watch: sqlite3.Connection | None = None
        self._data_version = 0
        self._changes = 0  # changes of data_version seen by any waiter
        #: the watch of the store's files: None until the first wait_for_change, False if
        #: there is none (wait_for_change polls)
        self._watch_files: FileWatch | Literal[False] | None = None
        self._poll_ticks = 0  # poll ticks left before waiting on the watch again
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file as opened
        #: (device, inode) of its write-ahead log, once there is one (see _check_file)
        self._wal_identity: tuple[int, int] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer.running:
            return
        if self.read_only:
            if not os.path.isfile(self.path):
                raise NoStoreError(f"sqlite:///{os.path.abspath(self.path)}")
        else:
            self._make_directory()
            self._check_writable()
        await self._writer.start()
        self._watch = self._connect()
        self._data_version = self._read_data_version()
        self._identity = _file_identity(self.path)
        self._wal_identity = _file_identity(self.path + "-wal")

    def _make_directory(self) -> None:
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise StoreError(
                f"cannot create the store directory for {self.path}: {error}"
            ) from None

    def _check_writable(self) -> None:
        """Refuse a store this process may not write: a read-only file system, or a file or
        folder its user may not write (``access(2)``, as the kernel will judge SQLite's writes).

        SQLite opens such a file read-only without a word, and with its write-ahead log present
        even reads it: every write then fails on its own, which a worker takes for an outage and
        waits out for ever (issue 29, item 20). The folder must be writable only where SQLite
        has a file to make in it (the database, its log or its shared memory)."""
        files = [self.path, self.path + "-wal", self.path + "-shm"]
        for path in files:
            if os.path.exists(path) and not os.access(path, os.W_OK):
                raise StoreError(f"store {self.path} cannot be written: {path} is read-only")
        folder = os.path.dirname(os.path.abspath(self.path))
        missing = not all(os.path.exists(path) for path in files)
        if missing and not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(
                f"store {self.path} cannot be written: its folder {folder} is read-only"
            )

    async def close(self) -> None:
        await self._writer.stop()
        if self._watch_files:
            self._watch_files.close()
        self._watch_files = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _connect(self) -> sqlite3.Connection:
        # Read-only: SQLite's own read-only mode, so that nothing can be created or written.
        target = (
            f"file:{quote(os.path.abspath(self.path))}?mode=ro" if self.read_only else self.path
        )
        try:
            conn = sqlite3.connect(
                target,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=self.read_only,
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            return conn
        except sqlite3.Error as error:
            raise store_error(self.path, error) from None

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check or create the schema; retried while another process holds the file locked.

        Several processes opening a new file at once race to switch it to WAL, and SQLite
        answers that switch with "database is locked" at once, without its busy handler.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.005
        while True:
            try:
                self._prepare_once(conn)
                return
            except StoreError as error:
                locked = "locked" in str(error) or "busy" in str(error)
                if not locked or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def _prepare_once(self, conn: sqlite3.Connection) -> None:
        try:
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if tables and "haltwise_meta" not in tables:
                raise StoreError(f"{self.path} is not a haltwise store (it holds other tables)")
            if not tables:
                # A new file: small pages, as a journal commits a few small rows at a time and
                # the cost of a commit's sync grows with the bytes it writes (see
                # docs/benchmarks.md). Only possible before the switch to WAL.
                conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            conn.execute(f"PRAGMA temp_store = {_TEMP_STORE}")
            pages = _checkpoint_pages(self.synchronous)
            conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
            conn.execute("BEGIN IMMEDIATE")
            if self.synchronous in _SYNCED:
                _preallocate_wal(conn, self.path, pages)
            self._upgrade(conn, "haltwise_meta" in tables)
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise store_error(self.path, error) from None
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _check_readable(self, conn: sqlite3.Connection) -> None:
        """The read-only counterpart of :meth:`_prepare`: is this a haltwise store we can read?

        Takes no lock and writes nothing (no WAL switch, no migration), so it never waits
        behind another process's write transaction.
        """
        try:
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not tables:
                raise NoStoreError(f"sqlite:///{os.path.abspath(self.path)}")
            if "haltwise_meta" not in tables:
                raise StoreError(f"{self.path} is not a haltwise store (it holds other tables)")
            row = conn.execute(
                "SELECT value FROM haltwise_meta WHERE key = 'schema_version'"
            ).fetchone()
        except sqlite3.Error as error:
            raise store_error(self.path, error) from None
        if row is not None:
            found = parse_version(row[0], self.path)
            upgrade_statements(SQLITE, found, self.path)  # refuses a newer version
            try:
                for statement in read_views(SQLITE, found):
                    conn.execute(statement)  # an older store reads as a new one
            except sqlite3.Error as error:
                raise store_error(self.path, error) from None

    def _upgrade(self, conn: sqlite3.Connection, has_meta: bool) -> None:
        """Create the schema, or upgrade an older one in place (inside the caller's transaction)."""
        found = None
        if has_meta:
            row = conn.execute(
                "SELECT value FROM haltwise_meta WHERE key = 'schema_version'"
            ).fetchone()
            found = None if row is None else parse_version(row[0], self.path)
        statements = upgrade_statements(SQLITE, found, self.path)
        for statement in statements:
            conn.execute(statement)
        if found != SCHEMA_VERSION:
            conn.execute(SQLITE.set_version(), (str(SCHEMA_VERSION),))

    # -- the Store interface -----------------------------------------------------------------

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        inputs = dump_json(run.inputs, "the task inputs")

        def op(conn: sqlite3.Connection) -> tuple[RunRecord, bool]:
            now = time.time()
            if run.fork is None:
                early = conn.execute(_SQL.take_early_cancel, (run.id,)).fetchone()
                if early is not None and early_cancel_live(early[1], now):
                    return _create_cancelled(conn, run, inputs, early[0], now)
            parameters = insert_run_parameters(run, inputs, now)
            inserted = conn.execute(_SQL.insert_run, parameters).fetchone()
            if inserted is None:
                return _load_run(conn, run.id), False
            _record_events(conn, run.id, plan_create(run, now))
            if run.fork is not None:
                fork = (run.id, run.fork.source, run.fork.from_step)
                conn.execute(_SQL.copy_steps, fork)
                conn.execute(_SQL.copy_partials, fork)
            return run_from_row(inserted), True

        result: tuple[RunRecord, bool] = await self._writer.call(op)
        return result

    def transition(
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
    ) -> Awaitable[RunRecord | None]:
        # What the writer hands back itself (in a batch: the operation's future), not a
        # coroutine of ours awaiting it: one frame fewer for each of 10,000 runs whose final
        # transitions wait for one group commit.
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
        self._writer.raise_deferred(run_id, fence)
        return self._writer.call(_Transition(run_id, target, expected, fields, fence, returning))

    def transition_then(self, then: WriteDone, run_id: str, target: State, **fields: Any) -> bool:
        expected, fence = fields.pop("expected"), fields.pop("fence", None)
        self._writer.raise_deferred(run_id, fence)
        written = transition_fields(target, **fields)
        self._writer.call_then(_Transition(run_id, target, expected, written, fence, False), then)
        return True

    async def request_cancel(
        self, run_id: str, reason: str, *, force: bool, fence: str | None = None
    ) -> RunRecord:
        return await self._request(run_id, cancel_plan(reason, force, fence))

    async def _request(self, run_id: str, plan: Plan) -> RunRecord:
        """Read the run, ``plan`` the write, apply it (if any): one transaction."""

        def op(conn: sqlite3.Connection) -> RunRecord:
            current = _load_run(conn, run_id)
            write = plan(current, time.time())
            return current if write is None else _apply(conn, current, write)

        record: RunRecord = await self._writer.call(op)
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
        # On the watch connection, as cancel_requests: the partial index holds only the runs
        # with a pause requested, and the watched runs are read by their key. ``run_ids`` is
        # looked into, not copied (the runtime's 10,000 runs, at every change of the store).
        wanted = run_ids
        if not wanted or self._watch is None:
            return {}
        try:
            rows = self._watch.execute(_SQL.pausing).fetchall()
            if watched:
                marks = ", ".join("?" for _ in watched)
                rows += self._watch.execute(
                    f"SELECT id, state, pause, reason, force FROM runs WHERE id IN ({marks})",
                    tuple(watched),
                ).fetchall()
        except sqlite3.Error as error:
            raise store_error(self.path, error) from None
        return pause_signals_of(rows, wanted)

    async def claim(
        self, run_id: str, owner: Owner, *, lease_until: float, expected_owner: str | None
    ) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            _load_run(conn, run_id)
            cursor = conn.execute(
                _SQL.set_owner + " AND owner_token IS ?",
                (owner.to_json(), owner.token, lease_until, time.time(), run_id, expected_owner),
            )
            return cursor.rowcount == 1

        claimed: bool = await self._writer.call(op)
        if claimed and expected_owner != owner.token:  # changed hands (not a renewal)
            self._writer.forget_errors(run_id)
        return claimed

    async def release(self, run_id: str, owner_token: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(_SQL.release, (run_id, owner_token))

        await self._writer.call(op)
        self._writer.forget_errors(run_id)

    async def heartbeat(self, owner_token: str, lease_until: float) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(_SQL.heartbeat, (lease_until, owner_token)).rowcount

        count: int = await self._writer.call(op)
        return count

    async def claim_pending(
        self, owner: Owner, tasks: Collection[str], *, lease_until: float, limit: int
    ) -> list[RunRecord]:
        task_list = sorted(tasks)

        def op(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            if not task_list or limit <= 0:
                return []
            return conn.execute(
                _claim_query(len(task_list)),
                (owner.to_json(), owner.token, lease_until, *task_list, limit),
            ).fetchall()

        rows: list[sqlite3.Row] = await self._writer.call(op)
        # Read after the commit: a run whose row does not parse stays claimed (so it does not
        # hold up the queue) and is reported by CorruptRowError, with the others as readable.
        return sorted(read_all(run_from_row, rows), key=lambda run: (run.created_at, run.id))

    async def start_step(
        self, run_id: str, step: StepStart, *, fence: str, durable: bool = True
    ) -> StepStarted:
        parameters = (
            run_id,
            step.index,
            step.tool,
            step.cancel,
            step.effect.value,
            int(step.idempotent),
            step.idempotency_key,
            step.args,
            int(step.cleanup),
            time.time(),
            step.call_id,
            step.fingerprint,
            run_id,
            fence,
        )
        self._writer.raise_deferred(run_id, fence)
        started: StepStarted = await self._writer.call(
            partial(_start_step, parameters), atomic=True, shield=True, lazy=not durable
        )
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
        result_text = None if result is None else dump_json(result, f"step {index}'s result")
        usd, tokens, calls = _NO_SPEND if spend is None else spend
        parameters = (
            status.value,
            result_text,
            error_to_text(error),
            time.time(),
            usd,
            tokens,
            calls,
            run_id,
            index,
            run_id,
            fence,
        )
        op = _SettleStep(parameters)
        self._writer.raise_deferred(run_id, fence)
        if durable:
            await self._writer.call(op, atomic=True, shield=True)
        else:
            self._writer.defer(op, run_id, fence)
            if self._watch_files:
                self._watch_files.nudge()  # its commit is due in _POLL_INTERVAL: look then

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

        def op(conn: sqlite3.Connection) -> bool:
            return conn.execute(_SQL.reconcile_step, parameters).rowcount > 0

        written: bool = await self._writer.call(op)
        return written

    async def remember_cancel(self, run_id: str, reason: str, expires_at: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            conn.execute(_SQL.expire_early_cancels, (time.time(),))
            parameters = (run_id, reason, expires_at, run_id)
            return conn.execute(_SQL.remember_cancel, parameters).rowcount > 0

        remembered: bool = await self._writer.call(op)
        return remembered

    async def append_partial(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        self._writer.raise_deferred(run_id, fence)
        await self._writer.call(self._partial_op(run_id, seq, value, fence, origin), atomic=True)

    def append_partial_blocking(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        self._writer.raise_deferred(run_id, fence)
        self._writer.call_blocking(self._partial_op(run_id, seq, value, fence, origin), atomic=True)

    def _partial_op(
        self, run_id: str, seq: int, value: Any, fence: str, origin: PartialKey | None
    ) -> Op:
        text = dump_json(value, "a partial result")
        step, ordinal = origin or (None, seq)

        def op(conn: sqlite3.Connection) -> None:
            _check_fence(conn, run_id, fence)
            conn.execute(_SQL.insert_partial, (run_id, seq, text, step, ordinal))

        return op

    async def load(self, run_id: str) -> RunSnapshot:
        snapshot: RunSnapshot = await self._writer.call(
            partial(_load_snapshot, run_id=run_id), write=False
        )
        return snapshot

    async def list_runs(self, state: State | None = None) -> list[RunRecord]:
        def op(conn: sqlite3.Connection) -> list[RunRecord]:
            return read_all(run_from_row, conn.execute(*_SQL.list_runs(state)))

        runs: list[RunRecord] = await self._writer.call(op, write=False, bulk=True)
        return runs

    async def read_journal(self) -> JournalRows:
        def op(conn: sqlite3.Connection) -> JournalRows:
            # One transaction (as every operation): in WAL, one snapshot for all five reads.
            plain = conn.cursor()
            plain.row_factory = None  # tuples: step_from_row reads by position
            runs = conn.execute(*_SQL.list_runs(None)).fetchall()
            events = conn.execute(*_SQL.events(None)).fetchall()
            steps = plain.execute(_SQL.all_steps).fetchall()
            partials = plain.execute(_SQL.all_partials).fetchall()
            changes = plain.execute(_SQL.all_step_changes)
            return journal_from_rows(runs, events, steps, partials, changes)

        journal: JournalRows = await self._writer.call(op, write=False, bulk=True)
        return journal

    async def events(self, run_id: str | None = None) -> list[Event]:
        def op(conn: sqlite3.Connection) -> list[Event]:
            return read_all(event_from_row, conn.execute(*_SQL.events(run_id)))

        events: list[Event] = await self._writer.call(op, write=False, bulk=True)
        return events

    async def cancel_requests(
        self, run_ids: Collection[str], *, acting: Sequence[str] = ()
    ) -> dict[str, tuple[str, bool]]:
        # Read on the watch connection, not through the writer: it must not wait behind a queue
        # of writes, and with the state index it costs as much as there are cancelling runs.
        # Plain tuples, read one at a time; the runs in `acting` are passed by in the query
        # (after a bulk cancel of 10,000 runs worked here the watcher reads 10,000 cancelling
        # runs, none news: SQLite skips them for a fraction of what a row in Python costs).
        wanted = run_ids  # looked into, not copied (as in pause_signals)
        if not wanted or self._watch is None:
            return {}
        query, params = _CANCELLING, []
        if acting:
            query, params = _CANCELLING_NEWS, [_OPS.id_list(acting)]
        rows = self._watch.cursor()
        rows.row_factory = None
        try:
            return {
                run_id: (reason or "user", bool(force))
                for run_id, reason, force in rows.execute(query, params)
                if run_id in wanted
            }
        except sqlite3.Error as error:
            raise store_error(self.path, error) from None

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

        def op(conn: sqlite3.Connection) -> list[RunSummary]:
            return [summary_from_row(tuple(row)) for row in conn.execute(sql, params)]

        page: list[RunSummary] = await self._writer.call(op, write=False)
        return page

    async def task_names(self) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            return [row[0] for row in conn.execute(_OPS.task_names())]

        names: list[str] = await self._writer.call(op, write=False)
        return names

    async def inspect(self, run_id: str) -> RunJournal:
        def op(conn: sqlite3.Connection) -> RunJournal:
            snapshot = _load_snapshot(conn, run_id)
            events = read_all(event_from_row, conn.execute(*_SQL.events(run_id)))
            times = times_from_rows(conn.execute(_OPS.step_times(), (run_id,)))
            return RunJournal(snapshot=snapshot, events=tuple(events), step_times=times)

        journal: RunJournal = await self._writer.call(op, write=False)
        return journal

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
            query, params = _CANCELLED_BY_IDS, [_OPS.id_list(ids)]
        else:
            query, params = _OPS.active_runs(
                states=states, tasks=tasks, lock=False, columns=CANCELLED_SELECT
            )

        def op(conn: sqlite3.Connection) -> CancelResult:
            rows = conn.cursor()
            rows.row_factory = None  # plain tuples: cancelled_from_row reads them by position
            found = each_read(cancelled_from_row, lambda: rows.execute(query, params))
            writes, result = plan_cancels(
                _OPS, found, ids, reason=reason, force=force, now=time.time(), dry_run=dry_run
            )
            for statement, parameters in writes:
                conn.execute(statement, parameters)
            return result

        result: CancelResult = await self._writer.call(op)
        return result

    async def prune(
        self, *, ended_before: float, states: Collection[State], dry_run: bool = False
    ) -> list[str]:
        sql, params = _OPS.prunable(states, lock=False)

        def op(conn: sqlite3.Connection) -> list[str]:
            ids = [row[0] for row in conn.execute(sql, (*params, ended_before))]
            if ids and not dry_run:
                bound = _OPS.id_list(ids)
                for statement in _OPS.prune_deletes():
                    conn.execute(statement, (bound,))
            return ids

        pruned: list[str] = await self._writer.call(op, write=not dry_run, bulk=True)
        return pruned

    async def changes_after(self, seq: int, *, limit: int) -> tuple[list[Change], float]:
        def op(conn: sqlite3.Connection) -> tuple[list[Change], float]:
            rows = conn.execute(_OPS.changes_after(), (seq, limit))
            changes = [change_from_row(tuple(row)) for row in rows]
            return changes, float(conn.execute(_OPS.now()).fetchone()[0])

        result: tuple[list[Change], float] = await self._writer.call(op, write=False)
        return result

    async def last_change(self) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return int(conn.execute(_OPS.last_change()).fetchone()[0])

        seq: int = await self._writer.call(op, write=False)
        return seq

    async def swap_trace(self, run_id: str, traceparent: str) -> str | None:
        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(_OPS.trace_of(), (run_id,)).fetchone()
            conn.execute(_OPS.save_trace(), (traceparent, run_id))
            return None if row is None else row[0]

        earlier: str | None = await self._writer.call(op, write=True)
        return earlier

    async def request_approval(
        self, run_id: str, request: ApprovalRequest, *, fence: str
    ) -> ApprovalRecord | None:
        asked, step_row = approval_parameters(run_id, request, fence)
        index = request.step.index

        def op(conn: sqlite3.Connection) -> ApprovalRecord | None:
            if conn.execute(_OPS.approval_request(), asked).rowcount:
                conn.execute(_OPS.approval_change(), (run_id, index, "awaiting"))
            # (the step row's change is written by the trigger on steps)
            conn.execute(_OPS.approval_step(), step_row)
            row = conn.execute(_OPS.approval_of(), (run_id, index)).fetchone()
            return None if row is None else approval_from_row(row)

        record: ApprovalRecord | None = await self._writer.call(op, write=True, shield=True)
        return record

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
        def op(conn: sqlite3.Connection) -> tuple[ApprovalRecord | None, bool]:
            params = (state, by, note, edited, run_id, index)
            won = bool(conn.execute(_OPS.approval_decide(), params).rowcount)
            if won:
                conn.execute(_OPS.approval_change(), (run_id, index, state))
            row = conn.execute(_OPS.approval_of(), (run_id, index)).fetchone()
            return (None if row is None else approval_from_row(row)), won

        decided: tuple[ApprovalRecord | None, bool] = await self._writer.call(
            op, write=True, shield=True
        )
        return decided

    async def approvals(
        self, run_id: str | None = None, *, limit: int = 100_000
    ) -> list[ApprovalRecord]:
        def op(conn: sqlite3.Connection) -> list[ApprovalRecord]:
            if run_id is None:
                rows = conn.execute(_OPS.approvals_awaiting(), (limit,)).fetchall()
            else:
                rows = conn.execute(_OPS.approvals_of_run(), (run_id,)).fetchall()
            return [approval_from_row(row) for row in rows]

        found: list[ApprovalRecord] = await self._writer.call(op, write=False)
        return found

    async def approval(self, run_id: str, index: int) -> ApprovalRecord | None:
        def op(conn: sqlite3.Connection) -> ApprovalRecord | None:
            row = conn.execute(_OPS.approval_of(), (run_id, index)).fetchone()
            return None if row is None else approval_from_row(row)

        found: ApprovalRecord | None = await self._writer.call(op, write=False)
        return found

    async def approval_schema(self, run_id: str, index: int) -> str | None:
        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(_OPS.approval_schema(), (run_id, index)).fetchone()
            return None if row is None else row[0]

        found: str | None = await self._writer.call(op, write=False)
        return found

    async def pending_approvals_json(self, *, limit: int = 100_000) -> str:
        def op(conn: sqlite3.Connection) -> str:
            text: str = conn.execute(_OPS.approvals_pending_json(), (limit,)).fetchone()[0]
            return text

        body: str = await self._writer.call(op, write=False)
        return body

    async def cancel_approval(self, run_id: str, index: int, *, fence: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            fenced = (run_id, index, run_id, fence)
            if conn.execute(_OPS.approval_cancel(), fenced).rowcount:
                conn.execute(_OPS.approval_change(), (run_id, index, "cancelled"))
            # (the step row's change is written by the trigger on steps)
            conn.execute(_OPS.approval_step_interrupted(), fenced)

        await self._writer.call(op, write=True, shield=True)

    async def delivery_position(self, destination: str) -> int | None:
        def op(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(_OPS.delivery_position(), (destination,)).fetchone()
            return None if row is None else int(row[0])

        position: int | None = await self._writer.call(op, write=False)
        return position

    async def save_delivery_position(self, destination: str, position: int) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(_OPS.save_delivery_position(), (destination, position))

        await self._writer.call(op, write=True)

    async def record_budget_exhausted(self, run_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(_OPS.record_budget_exhausted(), (run_id,))

        await self._writer.call(op, write=True)

    def set_concurrency(self, active_runs: int) -> None:
        # One run: commit each write at once (no wait). Several: group commit, batched per
        # iteration of the event loop (see sqlite_writer).
        self._writer.set_active_runs(active_runs)

    async def wait_for_change(self, timeout: float, since: int | None = None) -> int:
        # PRAGMA data_version changes when any other connection commits: reading it on a
        # dedicated connection costs microseconds and never blocks. When to read it: on Linux
        # when the store's files are written (a file watch), else every _POLL_INTERVAL.
        start = self._changes if since is None else since
        deadline = time.monotonic() + timeout
        watch = self._file_watch()
        while self._changes == start and (left := deadline - time.monotonic()) > 0:
            self._writer.flush_deferred(older_than=_POLL_INTERVAL)
            if watch is None or self._poll_ticks > 0 or self._writer.deferring:
                self._poll_ticks = max(0, self._poll_ticks - 1)
                await anyio.sleep(min(_POLL_INTERVAL, left))
            elif await watch.wait(min(_WATCH_INTERVAL, left)):
                # A write of the log may come before the commit it belongs to is visible (the
                # log's index is updated after it): poll a few ticks before trusting the watch
                # again, so a commit is seen as soon as without the watch.
                self._poll_ticks = _POLL_AFTER_EVENT
            self._check_file()
            version = self._read_data_version()
            if version != self._data_version:
                # (the poll ticks stay: the events drained may have been of two commits, the
                # second not visible yet; a look at it must not wait for the safety read)
                self._data_version = version
                self._changes += 1
        return self._changes

    def _file_watch(self) -> FileWatch | None:
        """The watch of the store's files (made on the first wait), or None: poll."""
        if self._watch_files is None:
            self._watch_files = open_watch(self.path) or False
        return self._watch_files or None

    def _check_file(self) -> None:
        """Raise :class:`StoreGoneError` (for good) if the store's file was deleted or replaced.

        SQLite goes on writing to a deleted file it holds open: without this, a run would end
        ``completed`` with nothing durable, and no other process could see or cancel it.
        """
        if self._writer.lost is None and _file_identity(self.path) != self._identity:
            self._writer.lost = StoreGoneError(
                f"store {self.path}: the file was deleted or replaced while in use; nothing "
                "written since is durable"
            )
        if self._writer.lost is None:
            # Its write-ahead log too: SQLite unlinks it only when the last connection closes
            # (this store holds two open), so a -wal that is gone or another file was deleted
            # or replaced under it, and every commit since lives in a file nobody will read.
            wal = _file_identity(self.path + "-wal")
            if self._wal_identity is None:
                self._wal_identity = wal  # created by the first transaction, after the open
            elif wal != self._wal_identity:
                self._writer.stop_for_good(
                    lambda kept: StoreGoneError(
                        f"store {self.path}: its write-ahead log ({self.path}-wal) was deleted "
                        "or replaced while in use; the store takes no more writes ("
                        + (
                            "what it had committed was copied into the database file)"
                            if kept
                            else "what it committed since is lost)"
                        )
                    )
                )
        if self._writer.lost is not None:
            raise self._writer.lost

    def _read_data_version(self) -> int:
        """``PRAGMA data_version`` on the watch connection. A failure is raised (as
        :class:`StoreError`), never swallowed: a stale version would freeze the detection of
        other processes' changes (their cancels) without anyone noticing."""
        if self._watch is None:
            return 0
        try:
            return int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error as error:
            raise store_error(self.path, error) from None


# -- SQL helpers run by the writer thread ------------------------------------------------------


def _load_snapshot(conn: sqlite3.Connection, run_id: str) -> RunSnapshot:
    run = _load_run(conn, run_id)
    rows = conn.cursor()
    rows.row_factory = None  # plain tuples: step_from_row reads them by position
    steps = steps_from_rows(run_id, rows.execute(_SQL.load_steps, (run_id,)).fetchall())
    found = conn.execute(_SQL.load_partials, (run_id,)).fetchall()
    return RunSnapshot(
        run=run,
        steps=steps,
        partials=partials_from_rows(run_id, [row[0] for row in found]),
        partial_keys=tuple(partial_key(row[1], row[2], row[3]) for row in found),
    )


def _file_identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``, None if there is none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _load_run(conn: sqlite3.Connection, run_id: str) -> RunRecord:
    row = conn.execute(_SQL.load_run, (run_id,)).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    return run_from_row(row)


class _Transition(GroupOp):
    """:meth:`SQLiteStore.transition`'s transaction: read the run, plan the write, apply it.

    Transitions side by side in a batch (many runs ending together) read their runs in one
    query and write them in as few statements as their shapes allow (:class:`RunWrites`), each
    write as :func:`plan_transition` plans it alone, against the run as read: planned once for
    each :func:`transition_plan_key`, the runs alike sharing it (10,000 runs cancelled
    together: one plan, not 10,000 alike). When none of them returns the run as written
    (``returning`` False), the query reads only what the rules read of a run
    (:class:`RunHead`), not whole runs."""

    __slots__ = ("expected", "fence", "fields", "returning", "run_id", "target")

    def __init__(
        self,
        run_id: str,
        target: State,
        expected: Collection[State],
        fields: dict[str, Any],
        fence: str | None,
        returning: bool = True,
    ) -> None:
        self.run_id, self.target, self.expected = run_id, target, expected
        self.fields, self.fence, self.returning = fields, fence, returning

    def __call__(self, conn: sqlite3.Connection) -> RunRecord | None:
        current = _load_run(conn, self.run_id)
        written = _apply(conn, current, self._plan(current, time.time()))
        return written if self.returning else None

    def _plan(self, current: RunHead, now: float) -> RunWrite:
        return plan_transition(
            current, self.target, self.expected, self.fields, fence=self.fence, now=now
        )

    @classmethod
    def run_group(cls, conn: sqlite3.Connection, ops: list[Any]) -> list[Outcome] | None:
        position = {op.run_id: index for index, op in enumerate(ops)}
        if len(position) < len(ops):
            return None  # one run twice: its writes must follow each other, one by one
        bound = (_OPS.id_list(list(position)),)
        returning = any(op.returning for op in ops)
        if returning:
            runs: Iterable[RunHead] = map(run_from_row, conn.execute(_RUNS_BY_IDS, bound))
        else:
            heads = conn.cursor()
            heads.row_factory = None
            runs = map(head_from_row, heads.execute(_HEADS_BY_IDS, bound))
        now = time.time()
        outcomes: list[Outcome] = [(None, None)] * len(ops)
        found = [False] * len(ops)
        #: transition_plan_key -> the write planned for the first run of the key, the runs of it
        plans: dict[tuple[Any, ...], tuple[RunWrite, list[str]]] = {}
        # Each run planned as it is read, so that the run as read is dropped at once (a bad
        # row raises: the batch runs again, one write at a time).
        for current in runs:
            index = position[current.id]
            found[index] = True
            op = ops[index]
            key = transition_plan_key(current, op.target, op.expected, op.fields, op.fence)
            # (A field value that does not hash raises here, and RunWrites would raise on it
            # anyway: the group fails and its batch runs again, one write at a time.)
            plan = plans.get(key)
            try:
                if plan is None:
                    plan = plans[key] = (op._plan(current, now), [])
                if op.returning:  # (else its outcome stays the shared (None, None))
                    assert isinstance(current, RunRecord)  # (read whole: see above)
                    outcomes[index] = (run_written(current, plan[0].fields), None)
            except Exception as error:  # as alone: this one fails, nothing of it written
                outcomes[index] = (None, error)
                continue
            plan[1].append(op.run_id)
        for index, op in enumerate(ops):
            if not found[index]:
                outcomes[index] = (None, UnknownRunError(op.run_id))
        writes = RunWrites(_OPS)
        for write, run_ids in plans.values():
            if run_ids:
                writes.add_all(run_ids, write)
        for statement, parameters in writes.statements():
            conn.execute(statement, parameters)
        return outcomes


#: every column of the runs whose ids are bound (one parameter: see OperatorSQL.id_list)
_RUNS_BY_IDS = _OPS.runs_by_ids(lock=False)
#: what a bulk cancel request reads of each run whose id is in the list bound (CancelledRun)
_CANCELLED_BY_IDS = _OPS.runs_by_ids(lock=False, columns=CANCELLED_SELECT)
#: what the rules of a transition read of each run whose id is in the list bound (RunHead)
_HEADS_BY_IDS = f"SELECT {', '.join(HEAD_COLUMNS)} FROM runs WHERE id {_OPS.in_ids}"


def _check_fence(conn: sqlite3.Connection, run_id: str, fence: str) -> sqlite3.Row:
    row: sqlite3.Row | None = conn.execute(_SQL.fence_row, (run_id,)).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    check_fence(run_id, row["owner_token"], fence)
    return row


def _apply(conn: sqlite3.Connection, current: RunRecord, write: RunWrite) -> RunRecord:
    """Write ``write``'s fields to the row of run ``current`` (as just read in this
    transaction), record its events, return the run as it is now (not read back)."""
    sql = _SQL.update_run(write.fields, returning=False)
    conn.execute(sql, (*write.fields.values(), current.id))
    _record_events(conn, current.id, write)
    return run_written(current, write.fields)


def _create_cancelled(
    conn: sqlite3.Connection, run: NewRun, inputs: str, reason: str, now: float
) -> tuple[RunRecord, bool]:
    """``run`` created ``cancelled`` by a cancel remembered before it existed (see
    :meth:`Store.remember_cancel`): unowned, with that cancel's reason and its two events."""
    cancelled = replace(run, state=State.CANCELLED, owner=None, lease_until=None)
    if conn.execute(_SQL.insert_run, insert_run_parameters(cancelled, inputs, now)).fetchone():
        write = plan_create_cancelled(reason, now)
        conn.execute(_SQL.update_run(("reason",), returning=False), (reason, run.id))
        _record_events(conn, run.id, write)
        return _load_run(conn, run.id), True
    return _load_run(conn, run.id), False


def _record_events(conn: sqlite3.Connection, run_id: str, write: RunWrite) -> None:
    conn.executemany(_SQL.record_event, event_parameters(run_id, write))
