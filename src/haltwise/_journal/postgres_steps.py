"""The PostgreSQL store's step path: every run's step writes, group-committed on one connection.

A step's start and settlement are the writes a run makes most often. Instead of a transaction on
a pooled connection each, they go to a :class:`StepWriter`: one committer task with a dedicated
connection takes every write queued meanwhile (by every run of this process) and commits them
with **one statement** (one round trip, one transaction, one WAL flush): the writes travel as
two JSON arrays of rows, the run rows are share-locked with the fence check as before, and the
statement returns which starts and settlements were written (with each start's attempts and its
run's cancel state). Each caller waits for the commit that holds its own write, so what was
durable when its coroutine returned is still durable then; writes queued while a batch is in
flight form the next batch (group commit).

A settlement made with ``durable=False`` (see :meth:`Store.settle_step`) is not waited for: it is
held in memory and rides with the next batch, whoever's write that is (a sequential run's next
step start, typically), or is committed on its own after :data:`DEFER_SECONDS` if no write
comes. The store flushes it before any other operation of the same store object, so one
caller's writes still commit in the order they were made; the blocking ``emit`` path, which may
run while the event loop is blocked, writes the deferred settlements itself in its own
transaction, before its partial result. docs/design.md ("Why a settlement may ride with the
next write") says why this is safe.

Within one statement a step row may be written once: a batch in which a (run, step) comes twice
is split where it repeats, the parts committed in order. A batch that fails as a
whole (a driver error) is retried write by write, so that one bad write fails only its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors
from psycopg.rows import DictRow

from .._core.exceptions import StoreError

#: how long a deferred settlement waits for a write to ride with before it is committed alone
DEFER_SECONDS = 0.03
_RETRIES = 5

_Conn = psycopg.AsyncConnection[DictRow]

#: (column, SQL array type) of a step's start, in the order of :func:`start_row`
START_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "text"),
    ("idx", "integer"),
    ("tool", "text"),
    ("cancel", "text"),
    ("effect", "text"),
    ("idempotent", "boolean"),
    ("idem_key", "text"),
    ("args", "text"),
    ("cleanup", "boolean"),
    ("started_at", "double precision"),
    ("call_id", "text"),
    ("fingerprint", "text"),
)
#: the columns a restarted step (a new attempt) takes from the new start
_RESTART_COLUMNS = ("args", "started_at", "call_id", "fingerprint")
#: (column, SQL array type) of a settlement, in the order of :func:`settle_row`
SETTLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "text"),
    ("idx", "integer"),
    ("status", "text"),
    ("result", "text"),
    ("error", "text"),
    ("settled_at", "double precision"),
)


def _rows(name: str, columns: Sequence[tuple[str, str]]) -> str:
    """A CTE ``name`` of the rows of one JSON array parameter (each row an array, in the order
    of ``columns`` then the fence): one text parameter instead of an array per column, which
    the driver would have to build in Python."""
    fields = ", ".join(
        f"(e->>{i})::{kind} AS {column}"
        for i, (column, kind) in enumerate((*columns, ("fence", "text")))
    )
    return f"{name} AS (SELECT {fields} FROM json_array_elements(%s::json) AS t(e))"


def _batch_sql() -> str:
    """The one statement that writes a batch: settlements, then starts, fenced and share-locked
    like the single-step statements they replace."""
    start_names = [name for name, _ in START_COLUMNS]
    inserted = ", ".join([*start_names[:6], "status", "attempts", *start_names[6:]])
    selected = ", ".join([*(f"u.{n}" for n in start_names[:6]), "'running'", "1"])
    selected += ", " + ", ".join(f"u.{n}" for n in start_names[6:])
    restart = ", ".join(f"{n} = excluded.{n}" for n in _RESTART_COLUMNS)
    settled = ", ".join(f"{n} = u.{n}" for n, _ in SETTLE_COLUMNS[2:])
    return f"""
WITH {_rows("settle_in", SETTLE_COLUMNS)},
{_rows("start_in", START_COLUMNS)},
run AS (
    SELECT r.id, r.owner_token, r.state, r.reason, r.force FROM haltwise.runs r
    WHERE (r.id, r.owner_token) IN (SELECT run_id, fence FROM settle_in
                                    UNION SELECT run_id, fence FROM start_in)
    FOR SHARE
),
settled AS (
    UPDATE haltwise.steps s SET {settled}
    FROM settle_in u JOIN run ON run.id = u.run_id AND run.owner_token = u.fence
    WHERE s.run_id = u.run_id AND s.idx = u.idx
    RETURNING s.run_id, s.idx
),
started AS (
    INSERT INTO haltwise.steps AS s ({inserted})
    SELECT {selected}
    FROM start_in u JOIN run ON run.id = u.run_id AND run.owner_token = u.fence
    ON CONFLICT (run_id, idx) DO UPDATE SET status = 'running', attempts = s.attempts + 1,
        result = NULL, error = NULL, settled_at = NULL, {restart},
        errors = CASE WHEN s.error IS NULL THEN s.errors ELSE (coalesce(s.errors, '[]')::jsonb
            || jsonb_build_array(s.error::jsonb || jsonb_build_object('attempt', s.attempts)))::text
            END
    RETURNING s.run_id, s.idx, s.attempts
)
SELECT false AS start, run_id, idx, 0 AS attempts, NULL::text AS state, NULL::text AS reason,
       NULL::boolean AS force FROM settled
UNION ALL
SELECT true, st.run_id, st.idx, st.attempts, run.state, run.reason, run.force
FROM started st JOIN run ON run.id = st.run_id
"""


_BATCH = _batch_sql()


@dataclass(frozen=True, slots=True)
class Started:
    """What a written start returns: the step's attempts and its run's cancel state."""

    attempts: int
    state: str
    reason: str | None
    force: bool


@dataclass(slots=True)
class _Write:
    start: bool
    #: run id, step index, the columns, then the fence (see START_COLUMNS / SETTLE_COLUMNS)
    row: tuple[Any, ...]
    #: resolved once the write's commit returned (None: a deferred settlement)
    done: asyncio.Future[Started | bool | None] | None = None
    key: tuple[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.row[0], self.row[1])


class StepWriter:
    """Group commit of step starts and settlements (see the module docstring).

    ``connect`` opens the writer's own connection (autocommit); ``error`` turns a driver error
    into the store's :class:`StoreError`. All methods but :meth:`take_deferred` are called on
    the event loop that ran :meth:`open`.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[_Conn]],
        error: Callable[[psycopg.Error], StoreError],
    ) -> None:
        self._connect = connect
        self._error = error
        self._conn: _Conn | None = None
        self._queue: list[_Write] = []
        #: deferred settlements; guarded by _lock (the blocking partial path takes them)
        self._deferred: list[_Write] = []
        self._lock = threading.Lock()
        self._deferred_error: StoreError | None = None
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._flushes: list[asyncio.Future[None]] = []
        #: deferred settlements taken into the batch being committed (guarded by _lock)
        self._inflight: list[tuple[Any, ...]] = []
        #: set when the oldest deferred settlement has waited DEFER_SECONDS
        self._deferred_due = False
        #: counts the times _deferred became non-empty (tells a timer whether it is stale)
        self._deferred_rounds = 0

    def open(self) -> None:
        """Start the committer (on the running loop); it connects at its first write."""
        self._task = asyncio.get_running_loop().create_task(
            self._commit_loop(), name="haltwise-postgres-steps"
        )

    async def close(self) -> None:
        """Commit what is queued and deferred, then stop."""
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(StoreError):
                await self.flush()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    # -- what the store calls ----------------------------------------------------------------

    async def start(self, row: tuple[Any, ...]) -> Started | None:
        """Write a step's start (``start_row``); None if the fence did not hold the run."""
        found = await self._submit(_Write(True, row))
        return found if isinstance(found, Started) else None

    async def settle(self, row: tuple[Any, ...]) -> bool:
        """Write a settlement (``settle_row``); False if no step row was written (the fence did
        not hold, or no such step)."""
        return bool(await self._submit(_Write(False, row)))

    def defer(self, row: tuple[Any, ...]) -> None:
        """Hold a settlement (``durable=False``) for the next batch (see the module docstring)."""
        with self._lock:
            first = not self._deferred
            self._deferred.append(_Write(False, row))
        if first:  # the committer looks again once this one has waited long enough
            self._deferred_rounds += 1
            asyncio.get_running_loop().call_later(
                DEFER_SECONDS, self._deferred_waited, self._deferred_rounds
            )

    def _deferred_waited(self, rounds: int) -> None:
        if rounds == self._deferred_rounds and self._deferred:
            self._deferred_due = True
            self._poke()

    def has_deferred(self) -> bool:
        """Whether a deferred settlement is not committed yet (held, or in the batch being
        committed)."""
        return bool(self._deferred or self._inflight)

    async def flush(self) -> None:
        """Commit the deferred settlements now (asynchronously, see the module docstring) and
        raise the error of any deferred settlement that failed."""
        if self.has_deferred() and self._task is not None:
            done = asyncio.get_running_loop().create_future()
            self._flushes.append(done)
            self._poke()
            await asyncio.shield(done)
        self.raise_deferred_error()

    def raise_deferred_error(self) -> None:
        error, self._deferred_error = self._deferred_error, None
        if error is not None:
            raise error

    def take_deferred(self) -> list[tuple[Any, ...]]:
        """Hand the deferred settlements to a caller that commits them itself, before its own
        write (any thread, the loop's included, while the loop is blocked): their rows, in
        order, with those of the batch being committed (written again: a settlement is the
        same write twice, and the caller's write must not become durable before them)."""
        with self._lock:
            taken, self._deferred = self._deferred, []
            return [*self._inflight, *(write.row for write in taken)]

    # -- the committer -----------------------------------------------------------------------

    async def _submit(self, write: _Write) -> Started | bool | None:
        if self._task is None:
            raise StoreError("the store is not open")
        write.done = asyncio.get_running_loop().create_future()
        self._queue.append(write)
        self._poke()
        return await write.done  # the store's callers shield this wait

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not (self._queue or self._flushes or self._deferred_due):
                self._wake = loop.create_future()
                # Woken by the first write queued: the runs made ready with it (by the commit
                # just made) run first, and queue their writes, before this task does.
                await self._wake
                self._wake = None
            if not (self._queue or self._flushes or self._deferred_due):
                continue
            with self._lock:
                deferred, self._deferred = self._deferred, []
                self._inflight = [write.row for write in deferred]
            self._deferred_due = False
            batch, self._queue = [*deferred, *self._queue], []
            flushes, self._flushes = self._flushes, []
            try:
                if batch:
                    await self._commit(batch)
            except Exception as error:  # a bug, not the database: fail the callers, go on
                failure = StoreError(f"journal write failed: {error}")
                for write in batch:
                    self._fail(write, failure)
            finally:
                with self._lock:
                    self._inflight = []
            for done in flushes:
                if not done.done():
                    done.set_result(None)

    async def _commit(self, batch: list[_Write]) -> None:
        try:
            found = await self._execute(batch)
        except StoreError as error:
            if len(batch) == 1:
                self._fail(batch[0], error)
                return
            for write in batch:  # one by one: a bad write fails only its own caller
                try:
                    self._resolve([write], await self._execute([write]))
                except StoreError as single:
                    self._fail(write, single)
            return
        self._resolve(batch, found)

    def _resolve(self, batch: list[_Write], found: dict[tuple[bool, str, int], Any]) -> None:
        for write in batch:
            if write.done is not None and not write.done.done():
                write.done.set_result(found.get((write.start, *write.key)))

    def _fail(self, write: _Write, error: StoreError) -> None:
        if write.done is None:
            self._deferred_error = error  # raised to the next caller (see Store)
        elif not write.done.done():
            write.done.set_exception(error)

    async def _execute(self, batch: list[_Write]) -> dict[tuple[bool, str, int], Any]:
        """Commit ``batch``, part after part (retrying deadlocks); ``{(start?, run, index):
        result}``. Each part is one statement in autocommit mode: it commits on the server
        whatever this process does meanwhile, so no transaction of the writer ever waits for the
        event loop (a blocked loop, in ``emit``, cannot hold up a lock the writer holds)."""
        found: dict[tuple[bool, str, int], Any] = {}
        for part in _split(batch):
            attempt = 0
            while True:
                attempt += 1
                try:
                    found.update(await _write_part(await self._connection(), part))
                    break
                except (errors.DeadlockDetected, errors.SerializationFailure) as error:
                    if attempt >= _RETRIES:
                        raise self._error(error) from None
                except psycopg.Error as error:
                    raise self._error(error) from None
        return found

    async def _connection(self) -> _Conn:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
            self._conn = conn = await self._connect()
            # One statement shape, executed all the time: plan it once.
            await conn.execute("SET plan_cache_mode = force_generic_plan")
        return conn


def _split(batch: list[_Write]) -> list[list[_Write]]:
    """``batch`` in order, cut wherever a (start?, run, step) would come twice in one part
    (one statement may write a row once); a settlement and a start of the same step share a
    part only if the settlement comes first (the statement writes settlements first)."""
    parts: list[list[_Write]] = [[]]
    seen: set[tuple[bool, str, int]] = set()
    for write in batch:
        key = (write.start, *write.key)
        clash = key in seen or (not write.start and (True, *write.key) in seen)
        if clash:
            parts.append([])
            seen = set()
        parts[-1].append(write)
        seen.add(key)
    return parts


def batch_parameters(
    starts: Sequence[tuple[Any, ...]], settles: Sequence[tuple[Any, ...]]
) -> tuple[str, str]:
    """The statement's two parameters: the settlements' rows, then the starts', as JSON."""
    return json.dumps(settles), json.dumps(starts)


async def _write_part(conn: _Conn, part: list[_Write]) -> dict[tuple[bool, str, int], Any]:
    starts = [write.row for write in part if write.start]
    settles = [write.row for write in part if not write.start]
    cursor = await conn.execute(_BATCH, batch_parameters(starts, settles), prepare=True)
    found: dict[tuple[bool, str, int], Any] = {}
    for row in await cursor.fetchall():
        key = (bool(row["start"]), row["run_id"], row["idx"])
        if row["start"]:
            found[key] = Started(row["attempts"], row["state"], row["reason"], bool(row["force"]))
        else:
            found[key] = True
    return found


def _settle_unlocked_sql() -> str:
    """Settlements written without waiting for any lock: no share lock on the run rows (the
    fence is the last committed owner, as for the blocking partial path), and step rows that
    another transaction holds are skipped (see :func:`write_deferred`)."""
    settled = ", ".join(f"{n} = u.{n}" for n, _ in SETTLE_COLUMNS[2:])
    return f"""
WITH {_rows("u", SETTLE_COLUMNS)},
free AS (
    SELECT s.run_id, s.idx FROM haltwise.steps s JOIN u ON s.run_id = u.run_id AND s.idx = u.idx
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE haltwise.steps s SET {settled}
FROM u JOIN free ON free.run_id = u.run_id AND free.idx = u.idx
WHERE s.run_id = u.run_id AND s.idx = u.idx
    AND EXISTS (SELECT 1 FROM haltwise.runs r WHERE r.id = u.run_id AND r.owner_token = u.fence)
"""


_SETTLE_UNLOCKED = _settle_unlocked_sql()


def write_deferred(conn: psycopg.Connection[DictRow], rows: Sequence[tuple[Any, ...]]) -> None:
    """Write deferred settlements on a synchronous connection, inside the caller's transaction.

    The caller may be the event loop's own thread, blocked: nothing here may wait for a lock
    that a transaction needing the loop holds. So no row lock on the runs, and a step row
    locked by someone else is skipped: the writer's own batch holding it (it rewrites the same
    settlement and commits it), or another process taking the run over (the fence has moved:
    the settlement is not ours to write any more).
    """
    if rows:
        conn.execute(_SETTLE_UNLOCKED, (json.dumps(rows),), prepare=True)
