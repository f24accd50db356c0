"""The PostgreSQL store's step path: every run's step writes, group-committed on two connections.

A step's start and settlement are the writes a run makes most often. Instead of a transaction on
a pooled connection each, they go to a :class:`StepWriter`: a committer task with two dedicated
connections takes every write queued meanwhile (by every run of this process) whenever one of
them is free and commits them with **one statement** (one round trip, one transaction, one WAL
flush) on it, a run's writes never in two batches at once (see :class:`StepWriter`). The
writes travel as two JSON arrays of rows, the run rows are share-locked with the fence check as
before, and the statement returns which starts and settlements were written (with each
start's attempts and its run's cancel state). Each caller waits for the commit that holds its
own write, so what was durable when its coroutine returned is still durable then; writes queued
while both connections have a batch in flight form the next batch (group commit).

A settlement made with ``durable=False`` (see :meth:`Store.settle_step`) is not waited for: it is
held in memory and rides with the next batch, whoever's write that is (a sequential run's next
step start, typically), or is committed on its own after :data:`DEFER_SECONDS` if no write
comes. The store flushes it before any other operation of the same store object, so one
caller's writes still commit in the order they were made; the blocking ``emit`` path, which may
run while the event loop is blocked, writes the deferred settlements itself in its own
transaction, before its partial result. docs/design.md ("Why a settlement may ride with the
next write") says why this is safe.

Within one statement a step row may be written once: a batch in which a (run, step) comes twice
is split where it repeats, the parts committed in order. A part that is one run's settlement
and next start (a sequential run) has a statement of its own, cheaper for the server. A batch
that fails as a whole (a driver error) is retried write by write, so that one bad write fails
only its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import psycopg
from psycopg import errors
from psycopg.rows import DictRow

from .._core.exceptions import StoreError
from .._core.states import State
from .postgres_wire import Prepared, Wire, flag, number, text
from .schema import POSTGRES_CLOCK
from .store import StepStarted

#: how long a deferred settlement waits for a write to ride with before it is committed alone
DEFER_SECONDS = 0.03
#: how many connections the writer commits on, each with a batch in flight at once
LANES = 2
#: a round is divided among the free connections in parts of at least this many runs
DIVIDE_AT = 8
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
    ("usd", "double precision"),
    ("tokens", "bigint"),
    ("calls", "integer"),
)
#: the settlement's columns that keep what the step holds when the settlement gives none (its
#: spend: a takeover's settlement of an orphaned step leaves what an earlier attempt spent)
_KEPT = frozenset({"usd", "tokens", "calls"})


def _set(name: str, value: str) -> str:
    """``name = value`` in a settlement's ``SET`` (see :data:`_KEPT`)."""
    if name in _KEPT:
        return f"{name} = coalesce({value}, s.{name})"
    return f"{name} = {value}"


def _rows(name: str, columns: Sequence[tuple[str, str]]) -> str:
    """A CTE ``name`` of the rows of one JSON array parameter (each row an array, in the order
    of ``columns`` then the fence): one text parameter instead of an array per column, which
    the driver would have to build in Python. As ``jsonb``: parsed once, each field then read
    from the parsed value (a ``json`` value's text is scanned again for each field: ~20% of a
    100-run batch's execution)."""
    fields = ", ".join(
        f"(e->>{i})::{kind} AS {column}"
        for i, (column, kind) in enumerate((*columns, ("fence", "text")))
    )
    return f"{name} AS (SELECT {fields} FROM jsonb_array_elements(%s::jsonb) AS t(e))"


def feed_insert(written: str, kind: str = "step") -> str:
    """The statement that records, in the change feed, one change of ``kind`` per row of the
    subquery ``written`` (columns run_id, idx, status; in its order): the PostgreSQL store
    writes a step's or a transition's change in the statement that writes the step row or the
    event (see schema.TRIGGERS)."""
    return (
        "INSERT INTO haltwise.changes (run_id, kind, idx, status, at) "
        f"SELECT run_id, '{kind}', idx, status, {POSTGRES_CLOCK} FROM {written}"
    )


def event_feed(recorded: str) -> str:
    """:func:`feed_insert` of the transitions whose events the CTE ``recorded`` inserted
    (``RETURNING seq, run_id, target``), in their order."""
    rows = f"(SELECT run_id, seq AS idx, target AS status FROM {recorded} ORDER BY seq) AS w"
    return feed_insert(rows, "transition")


def feed_cte(written: str) -> str:
    """:func:`feed_insert` as a CTE named ``feed``."""
    return f"feed AS ({feed_insert(written)})"


#: the change of every step row that the CTEs ``settled`` and ``started`` wrote, settlements first
_WRITTEN = (
    "(SELECT run_id, idx, status FROM settled UNION ALL "
    "SELECT run_id, idx, 'running' FROM started) AS w"
)
_START_NAMES = [name for name, _ in START_COLUMNS]
#: the columns a start inserts, with ``status`` and ``attempts`` in their place
_INSERTED = ", ".join([*_START_NAMES[:6], "status", "attempts", *_START_NAMES[6:]])


def _inserted_values(value: Callable[[str, str], str]) -> str:
    """The values of :data:`_INSERTED`: each start column's ``value(column, type)``."""
    values = [value(name, kind) for name, kind in START_COLUMNS]
    return ", ".join([*values[:6], "'running'", "1", *values[6:]])


def _upsert(select: str) -> str:
    """The CTE ``started``: the starts that ``select`` yields, inserted, or restarted as a new
    attempt (the earlier attempt's error kept in ``errors``)."""
    restart = ", ".join(f"{n} = excluded.{n}" for n in _RESTART_COLUMNS)
    return f"""started AS (
    INSERT INTO haltwise.steps AS s ({_INSERTED})
    {select}
    ON CONFLICT (run_id, idx) DO UPDATE SET status = 'running', attempts = s.attempts + 1,
        result = NULL, error = NULL, settled_at = NULL, {restart},
        errors = CASE WHEN s.error IS NULL THEN s.errors ELSE (coalesce(s.errors, '[]')::jsonb
            || jsonb_build_array(s.error::jsonb || jsonb_build_object('attempt', s.attempts)))::text
            END
    RETURNING s.run_id, s.idx, s.attempts
)"""


def _batch_sql() -> str:
    """The statement that writes any batch: settlements, then starts, fenced and share-locked
    like the single-step statements they replace, with their changes in the feed. The run rows
    are found by their key (an index scan whatever the plan thinks of the batch's size), then
    the fence is checked on the locked row. It returns the starts written and the settlements
    written that a caller waits for (``wanted``; a deferred one's result is read by nobody:
    at 100 runs half the rows the client would read and drop)."""
    settled = ", ".join(_set(n, f"u.{n}") for n, _ in SETTLE_COLUMNS[2:])
    selected = _inserted_values(lambda name, _: f"u.{name}")
    fenced = "start_in u JOIN run ON run.id = u.run_id AND run.owner_token = u.fence"
    return f"""
WITH {_rows("settle_in", (*SETTLE_COLUMNS, ("wanted", "boolean")))},
{_rows("start_in", START_COLUMNS)},
run AS (
    SELECT r.id, r.owner_token, r.state, r.reason, r.force, r.pause FROM haltwise.runs r
    WHERE r.id = ANY(ARRAY(SELECT run_id FROM settle_in UNION SELECT run_id FROM start_in))
    FOR SHARE
),
settled AS (
    UPDATE haltwise.steps s SET {settled}
    FROM settle_in u JOIN run ON run.id = u.run_id AND run.owner_token = u.fence
    WHERE s.run_id = u.run_id AND s.idx = u.idx
    RETURNING s.run_id, s.idx, s.status, u.wanted
),
{_upsert(f"SELECT {selected} FROM {fenced}")},
{feed_cte(_WRITTEN)}
SELECT false AS start, run_id, idx, 0 AS attempts, NULL::text AS state, NULL::text AS reason,
       NULL::boolean AS force, NULL::boolean AS pause FROM settled WHERE wanted
UNION ALL
SELECT true, st.run_id, st.idx, st.attempts, run.state, run.reason, run.force, run.pause
FROM started st JOIN run ON run.id = st.run_id
"""


def _one_run_sql() -> str:
    """The statement for the most common batch, one run's writes: at most one settlement and
    at most one start (a sequential run's settlement of step i and start of step i + 1) under
    one fence. The same writes, locks and changes as :func:`_batch_sql`, with a parameter per
    column instead of JSON: a plan the server runs in about half the time. Parameters: the run
    id and fence, the settlement's columns then its index (all NULL: none), the start's columns
    from ``idx`` on, then whether there is a start."""
    settled = ", ".join(_set(n, f"%s::{kind}") for n, kind in SETTLE_COLUMNS[2:])
    selected = _inserted_values(lambda name, kind: "run.id" if name == "run_id" else f"%s::{kind}")
    return f"""
WITH run AS (
    SELECT r.id, r.state, r.reason, r.force, r.pause FROM haltwise.runs r
    WHERE r.id = %s::text AND r.owner_token = %s::text
    FOR SHARE
),
settled AS (
    UPDATE haltwise.steps s SET {settled}
    FROM run WHERE s.run_id = run.id AND s.idx = %s::integer
    RETURNING s.run_id, s.idx, s.status
),
{_upsert(f"SELECT {selected} FROM run WHERE %s::boolean")},
{feed_cte(_WRITTEN)}
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT attempts FROM started) AS attempts,
       run.state, run.reason, run.force, run.pause
FROM run
"""


_BATCH = Prepared(b"haltwise_steps_batch", _batch_sql())
_ONE_RUN = Prepared(b"haltwise_steps_one_run", _one_run_sql())
_NO_SETTLE = (None,) * (len(SETTLE_COLUMNS) - 1)
_NO_START = (None,) * (len(START_COLUMNS) - 1)
#: a waited write's result: its start as written (None: not written), or a settlement's True
_Done = asyncio.Future[StepStarted | bool | None]


class _Write:
    """One write queued for the committer (a plain class: one is made per step write)."""

    __slots__ = ("done", "key", "row", "start")

    def __init__(self, start: bool, row: tuple[Any, ...], done: _Done | None = None) -> None:
        self.start = start
        #: run id, step index, the columns, then the fence (see START_COLUMNS / SETTLE_COLUMNS)
        self.row = row
        #: resolved once the write's commit returned (None: a deferred settlement)
        self.done = done
        self.key: tuple[str, int] = (row[0], row[1])


@dataclass(slots=True)
class _Lane:
    """One of the writer's connections and the batch under way on it (if any)."""

    #: the connection (postgres_wire), opened at its first batch unless the store's open did
    wire: Wire | None = None
    #: resolved (with None) once the batch under way is committed or failed; None: free
    finished: asyncio.Future[None] | None = None
    #: the runs with a write in the batch under way
    runs: frozenset[str] = frozenset()
    #: the deferred settlements in it (guarded by StepWriter._lock: the blocking path reads them)
    deferred: list[tuple[Any, ...]] = field(default_factory=list)


class StepWriter:
    """Group commit of step starts and settlements (see the module docstring), on
    :data:`LANES` connections with a batch in flight on each at once.

    A round takes every write queued (and every deferred settlement) when a connection is free,
    except the writes of a run that has a write in a batch still under way: those wait for the
    next round, so that one run's writes commit in the order they were made whatever the order
    in which two connections' commits land. A round taken while several connections are free
    is divided among them by run, in parts of at least :data:`DIVIDE_AT` runs: the server
    commits them at once (its WAL flushes grouped), and their callers, given their results as
    each commit returns, then make their next writes apart, so that this process works one
    part's runs while the server commits another's (without it, every run waits on the same
    batch: the server idles while the client works them all, and the client while the server
    commits).

    ``connect`` opens a connection of the writer (autocommit); ``error`` turns a driver error
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
        self._lanes = [_Lane() for _ in range(LANES)]
        #: the lanes' commit tasks under way
        self._commits: set[asyncio.Task[None]] = set()
        self._queue: list[_Write] = []
        #: deferred settlements; guarded by _lock (the blocking partial path takes them)
        self._deferred: list[_Write] = []
        self._lock = threading.Lock()
        #: (run, fence) -> the error of a deferred settlement of the run that was not written
        #: (guarded by _lock): raised to every later write of that run under that fence
        #: (:meth:`raise_deferred_error`), and to no other operation
        self._deferred_errors: dict[tuple[str, str], StoreError] = {}
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._flushes: list[asyncio.Future[None]] = []
        #: set when the oldest deferred settlement has waited DEFER_SECONDS
        self._deferred_due = False
        #: when _deferred last became non-empty (the loop's clock), and the timer looking at it
        self._deferred_since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        """Start the committer (on the running loop); each connection is opened at its first
        batch, unless :meth:`connect` did already."""
        self._task = asyncio.get_running_loop().create_task(
            self._commit_loop(), name="haltwise-postgres-steps"
        )

    async def connect(self) -> None:
        """Open the writer's connections and prepare their statements now (the store's open),
        so that a run's first step does not pay for them."""
        await asyncio.gather(*(self._prepare(lane) for lane in self._lanes))

    async def _prepare(self, lane: _Lane) -> None:
        wire = await self._connection(lane)
        try:
            for statement in (_ONE_RUN, _BATCH):
                await statement.ensure(wire)
            # Executed once with no rows (it writes nothing): the server makes the batch's plan
            # and reads the tables' and indexes' descriptions now, not at the first batch.
            await _BATCH.rows(wire, batch_parameters([], []))
        except psycopg.Error as error:
            raise self._error(error) from None

    async def close(self) -> None:
        """Commit what is queued and deferred, then stop."""
        task, self._task = self._task, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if task is not None:
            with contextlib.suppress(StoreError):
                await self.flush()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)
        for lane in self._lanes:
            await self._disconnect(lane)

    # -- what the store calls ----------------------------------------------------------------

    def start(self, row: tuple[Any, ...]) -> asyncio.Future[StepStarted | None]:
        """Write a step's start (``start_row``): the future of the start as written (None if
        the fence did not hold the run), resolved once it is committed."""
        return cast("asyncio.Future[StepStarted | None]", self._submit(True, row))

    def settle(self, row: tuple[Any, ...]) -> asyncio.Future[bool | None]:
        """Write a settlement (``settle_row``): the future of whether the step row was written
        (True; None if the fence did not hold, or there is no such step), resolved once it is
        committed."""
        return cast("asyncio.Future[bool | None]", self._submit(False, row))

    def defer(self, row: tuple[Any, ...]) -> None:
        """Hold a settlement (``durable=False``) for the next batch (see the module docstring)."""
        with self._lock:
            first = not self._deferred
            self._deferred.append(_Write(False, row))
        if first:  # the committer looks again once this one has waited long enough
            loop = asyncio.get_running_loop()
            self._deferred_since = loop.time()
            if self._timer is None:  # one timer at a time, not one per step
                self._timer = loop.call_at(self._deferred_since + DEFER_SECONDS, self._waited)

    def _waited(self) -> None:
        """The timer: the oldest deferred settlement has waited long enough (commit it), or the
        ones it was set for are committed already (wait for the current oldest)."""
        self._timer = None
        if not self._deferred:
            return
        due = self._deferred_since + DEFER_SECONDS
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self._deferred_due = True
            self._poke()
        else:
            self._timer = loop.call_at(due, self._waited)

    async def flush(self, runs: Collection[str] | None = None) -> None:
        """Wait until the deferred settlements made so far (of ``runs``, or of every run) are
        committed, committing them now (asynchronously, see the module docstring): the
        batches under way that hold some, and a round taking the others. A settlement that
        failed is not raised here: it is its run's owner's to learn, at its next write under
        that fence (:meth:`raise_deferred_error`), never another operation's."""
        if self._task is not None:
            waits = self._flushes_for(None if runs is None else set(runs))
            if waits:
                await asyncio.shield(asyncio.gather(*waits))

    def _flushes_for(self, runs: set[str] | None) -> list[asyncio.Future[None]]:
        """What :meth:`flush` waits for (nothing if none of ``runs``' settlements is deferred)."""
        with self._lock:
            waits = [
                lane.finished
                for lane in self._lanes
                if lane.finished is not None and _any_of(lane.deferred, runs)
            ]
            queued = _any_of([write.row for write in self._deferred], runs)
        if queued:
            done = asyncio.get_running_loop().create_future()
            self._flushes.append(done)
            self._poke()
            waits.append(done)
        return waits

    def raise_deferred_error(self, run_id: str, fence: str | None) -> None:
        """Raise the error of a deferred settlement of run ``run_id`` under ``fence`` that was
        not written (a lost connection, a fence that refused it), at every write of the run
        under that fence: its settlement is not durable, so nothing the run does after it may
        become durable (its final transition least of all). The run's attempt ends there, as
        after a crash; a takeover (a new fence) settles the step. (Flush first.)"""
        if self._deferred_errors and fence is not None:
            with self._lock:
                error = self._deferred_errors.get((run_id, fence))
            if error is not None:
                raise error

    def forget_errors(self, run_id: str) -> None:
        """The run changed hands (a claim, a release): its old fence's errors are moot."""
        if self._deferred_errors:
            with self._lock:
                for key in [key for key in self._deferred_errors if key[0] == run_id]:
                    del self._deferred_errors[key]

    def give_back(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Deferred settlements taken by :meth:`take_deferred` whose transaction rolled back
        (any thread): deferred again, ahead of the others, for the next round or flush (a
        settlement written twice is the same row; the fence keeps a lost run's out)."""
        with self._lock:
            self._deferred[:0] = [_Write(False, row) for row in rows]

    def take_deferred(self) -> list[tuple[Any, ...]]:
        """Hand the deferred settlements to a caller that commits them itself, before its own
        write (any thread, the loop's included, while the loop is blocked): their rows, in
        order, with those of the batches being committed (written again: a settlement is the
        same write twice, and the caller's write must not become durable before them)."""
        with self._lock:
            taken, self._deferred = self._deferred, []
            inflight = [row for lane in self._lanes for row in lane.deferred]
            return [*inflight, *(write.row for write in taken)]

    # -- the committer -----------------------------------------------------------------------

    def _submit(self, start: bool, row: tuple[Any, ...]) -> _Done:
        if self._task is None:
            raise StoreError("the store is not open")
        done: _Done = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(start, row, done))
        self._poke()
        return done  # the store's callers shield their wait for it

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._queue or self._flushes or self._deferred_due:
                free = [lane for lane in self._lanes if lane.finished is None]
                if free and self._start_round(free):
                    continue
            self._wake = loop.create_future()
            # Woken by the first write queued (or a connection's commit returning): the runs
            # made ready with it (by the commit just made) run first, and queue their writes,
            # before this task does.
            await self._wake
            self._wake = None

    def _start_round(self, free: list[_Lane]) -> bool:
        """Start a round on the ``free`` connections (see the class docstring); False if there
        was nothing it could take."""
        busy = {run for lane in self._lanes if lane.finished is not None for run in lane.runs}
        with self._lock:
            writes = [*self._deferred, *self._queue]
            ready = [write for write in writes if write.key[0] not in busy]
            held = [write for write in writes if write.key[0] in busy]
            self._deferred = [write for write in held if write.done is None]
        self._queue = [write for write in held if write.done is not None]
        # held deferred ones go in the next round, once their run's batch is committed
        self._deferred_due = bool(self._deferred)
        flushes: list[asyncio.Future[None]] = []
        if not self._deferred:  # a flush waits for the round that takes every deferred one
            flushes, self._flushes = self._flushes, []
        started = []
        for lane, part in zip(free, _divide(ready, len(free)), strict=False):
            started.append(self._launch(lane, part))
        if flushes:
            resolve = partial(_release, flushes)
            if started:
                asyncio.gather(*started).add_done_callback(resolve)
            else:
                resolve(None)
        return bool(started)

    def _launch(self, lane: _Lane, part: list[_Write]) -> asyncio.Future[None]:
        """Commit ``part`` on ``lane`` in a task of its own; the future of its end."""
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            lane.deferred = [write.row for write in part if write.done is None]
        lane.runs = frozenset(write.key[0] for write in part)
        lane.finished = finished
        task = asyncio.get_running_loop().create_task(self._commit_on(lane, part))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        return finished

    async def _commit_on(self, lane: _Lane, batch: list[_Write]) -> None:
        try:
            await self._commit(lane, batch)
        except Exception as error:  # a bug, not the database: fail the callers, go on
            failure = StoreError(f"journal write failed: {error}")
            for write in batch:
                self._fail(write, failure)
        finally:
            with self._lock:
                lane.deferred = []
            lane.runs = frozenset()
            finished, lane.finished = lane.finished, None
            if finished is not None:
                finished.set_result(None)
            self._poke()

    async def _commit(self, lane: _Lane, batch: list[_Write]) -> None:
        try:
            found = await self._execute(lane, batch)
        except StoreError as error:
            if len(batch) == 1:
                self._fail(batch[0], error)
                return
            for write in batch:  # one by one: a bad write fails only its own caller
                try:
                    self._resolve([write], await self._execute(lane, [write]))
                except StoreError as single:
                    self._fail(write, single)
            return
        self._resolve(batch, found)

    def _resolve(self, batch: list[_Write], found: dict[tuple[bool, str, int], Any]) -> None:
        for write in batch:
            if write.done is not None and not write.done.done():
                write.done.set_result(found.get((write.start, *write.key)))

    def _fail(self, write: _Write, error: StoreError) -> None:
        if write.done is None:  # raised to the run's later writes (raise_deferred_error)
            with self._lock:
                self._deferred_errors.setdefault((write.key[0], write.row[-1]), error)
        elif not write.done.done():
            write.done.set_exception(error)

    async def _execute(self, lane: _Lane, batch: list[_Write]) -> dict[tuple[bool, str, int], Any]:
        """Commit ``batch`` on ``lane``, part after part (retrying deadlocks); ``{(start?, run,
        index): result}``. Each part is one statement in autocommit mode: it commits on the
        server whatever this process does meanwhile, so no transaction of the writer ever waits
        for the event loop (a blocked loop, in ``emit``, cannot hold up a lock the writer
        holds)."""
        found: dict[tuple[bool, str, int], Any] = {}
        for part in _split(batch):
            attempt = 0
            while True:
                attempt += 1
                try:
                    found.update(await _write_part(await self._connection(lane), part))
                    break
                except (errors.DeadlockDetected, errors.SerializationFailure) as error:
                    if attempt >= _RETRIES:
                        raise self._error(error) from None
                except psycopg.Error as error:
                    raise self._error(error) from None
        return found

    async def _connection(self, lane: _Lane) -> Wire:
        wire = lane.wire
        if wire is None or not wire.usable:
            await self._disconnect(lane)
            conn = await self._connect()
            try:
                # A few statement shapes, executed all the time: plan each once. Text
                # parameters and results are UTF-8 (postgres_wire).
                await conn.execute("SET plan_cache_mode = force_generic_plan")
                await conn.execute("SET client_encoding = 'UTF8'")
            except BaseException:
                await conn.close()
                raise
            lane.wire = wire = Wire(conn)
        return wire

    async def _disconnect(self, lane: _Lane) -> None:
        wire, lane.wire = lane.wire, None
        if wire is not None:
            wire.detach()
            with contextlib.suppress(psycopg.Error):
                await wire.conn.close()


def _any_of(rows: list[tuple[Any, ...]], runs: set[str] | None) -> bool:
    """Whether any of ``rows`` is of one of ``runs`` (of any run: None)."""
    if runs is None:
        return bool(rows)
    return any(row[0] in runs for row in rows)


def _release(flushes: list[asyncio.Future[None]], _: object) -> None:
    """Resolve the flushes whose round is committed."""
    for done in flushes:
        if not done.done():
            done.set_result(None)


def _divide(writes: list[_Write], ways: int) -> list[list[_Write]]:
    """``writes`` in at most ``ways`` parts of about as many runs each, and of at least
    :data:`DIVIDE_AT` runs each (one part if they are of fewer), each run's writes in one part
    and in order. (No part when there are no writes.)"""
    if not writes:
        return []
    runs = list(dict.fromkeys(write.key[0] for write in writes))
    ways = min(ways, len(runs) // DIVIDE_AT)
    if ways < 2:
        return [writes]
    share = -(-len(runs) // ways)
    part_of = {run: k // share for k, run in enumerate(runs)}
    parts: list[list[_Write]] = [[] for _ in range(-(-len(runs) // share))]
    for write in writes:
        parts[part_of[write.key[0]]].append(write)
    return parts


def _split(batch: list[_Write]) -> list[list[_Write]]:
    """``batch`` in order, cut wherever a step would be written twice in one part (one
    statement may write a row once: PostgreSQL refuses an upsert of a row the same statement
    updated)."""
    parts: list[list[_Write]] = [[]]
    seen: set[tuple[str, int]] = set()
    for write in batch:
        if write.key in seen:
            parts.append([])
            seen = set()
        parts[-1].append(write)
        seen.add(write.key)
    return parts


def batch_parameters(
    starts: Sequence[tuple[Any, ...]], settles: Sequence[tuple[Any, ...]]
) -> tuple[str, str]:
    """The batch statement's two parameters: the settlements' rows (each with whether its
    caller waits for it, before the fence), then the starts', as JSON."""
    return json.dumps(settles), json.dumps(starts)


def one_run_parameters(start: tuple[Any, ...] | None, settle: tuple[Any, ...] | None) -> list[Any]:
    """The one-run statement's parameters (see :func:`_one_run_sql`); ``start`` and ``settle``
    (either may be None) are of the same run, under the same fence."""
    first = start if start is not None else settle
    assert first is not None
    settled = _NO_SETTLE if settle is None else (*settle[2:-1], settle[1])
    started = (*_NO_START, False) if start is None else (*start[1:-1], True)
    return [first[0], first[-1], *settled, *started]


def _one_run(part: list[_Write]) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None] | None:
    """(start, settlement) if ``part`` is one run's writes under one fence, at most one of each."""
    starts = [write.row for write in part if write.start]
    settles = [write.row for write in part if not write.start]
    if len(starts) > 1 or len(settles) > 1 or len({(w.row[0], w.row[-1]) for w in part}) > 1:
        return None
    return (starts[0] if starts else None), (settles[0] if settles else None)


async def _write_part(wire: Wire, part: list[_Write]) -> dict[tuple[bool, str, int], Any]:
    found: dict[tuple[bool, str, int], Any] = {}
    one = _one_run(part)
    if one is not None:
        start, settle = one
        rows = await _ONE_RUN.rows(wire, one_run_parameters(start, settle))
        for settled, attempts, state, reason, force, pause in rows:  # one row, or none
            if settle is not None and number(settled):
                found[(False, settle[0], settle[1])] = True
            if start is not None and attempts is not None:
                found[(True, start[0], start[1])] = _started(attempts, state, reason, force, pause)
        return found
    starts = [write.row for write in part if write.start]
    settles = [(*w.row[:-1], w.done is not None, w.row[-1]) for w in part if not w.start]
    # Read here without a call per value: at 100 runs, 100 rows of 8 values per statement.
    for is_start, run_id, index, attempts, state, reason, force, pause in await _BATCH.rows(
        wire, batch_parameters(starts, settles)
    ):
        key = (is_start == b"t", (run_id or b"").decode(), int(index or 0))
        found[key] = _started(attempts, state, reason, force, pause) if key[0] else True
    return found


_CANCELLING = State.CANCELLING.value.encode()


def _started(
    attempts: bytes | None,
    state: bytes | None,
    reason: bytes | None,
    force: bytes | None,
    pause: bytes | None,
) -> StepStarted:
    """What a written start returns (:meth:`Store.start_step`), from the values its statement
    read back as text: the step's attempts, and its run's cancel (if ``cancelling``) or whether
    a pause of the run is requested."""
    if state == _CANCELLING:  # (positional: keyword arguments are matched at every call)
        return StepStarted(int(attempts or 0), (text(reason) or "user", flag(force)))
    return StepStarted(int(attempts or 0), None, flag(pause))


def _settle_unlocked_sql() -> str:
    """Settlements written without waiting for any lock: no share lock on the run rows (the
    fence is the last committed owner, as for the blocking partial path), and step rows that
    another transaction holds are skipped (see :func:`write_deferred`)."""
    settled = ", ".join(_set(n, f"u.{n}") for n, _ in SETTLE_COLUMNS[2:])
    return f"""
WITH {_rows("u", SETTLE_COLUMNS)},
free AS (
    SELECT s.run_id, s.idx FROM haltwise.steps s JOIN u ON s.run_id = u.run_id AND s.idx = u.idx
    FOR UPDATE OF s SKIP LOCKED
),
settled AS (
    UPDATE haltwise.steps s SET {settled}
    FROM u JOIN free ON free.run_id = u.run_id AND free.idx = u.idx
    WHERE s.run_id = u.run_id AND s.idx = u.idx
        AND EXISTS (SELECT 1 FROM haltwise.runs r WHERE r.id = u.run_id AND r.owner_token = u.fence)
    RETURNING s.run_id, s.idx, s.status
),
{feed_cte("settled")}
SELECT 1
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
