"""The SQLite writer: one connection, group commit, and three ways to reach it.

Every operation is a short function of a connection, run in the order it was submitted, and
committed together with whatever else is ready (group commit), each operation inside its own
savepoint so that one failing operation changes nothing while the others in its batch commit. A
caller is resumed only after the commit that holds its operation returned, so each write is
durable (at the connection's ``synchronous`` setting) when it returns. An operation is run:

- at once on the caller's thread (the fast path), when one run is active and the writer is idle;
- with many runs active, in the event loop's batch: every operation submitted from the loop
  during one iteration is committed together, on the loop's own thread, once every task made
  ready by the previous batch has run up to its next write, and the callbacks those tasks
  scheduled have run (the ends of tasks that submitted their last write: see
  :meth:`Writer._schedule_loop_batch`);
- otherwise by the writer thread, which drains whatever is queued and commits it as one
  transaction: for a caller that is not on an event loop (``emit`` from a tool's thread), and
  whenever the other two find the database locked by another process.

Consecutive operations of one :class:`GroupOp` class in a batch (the settlements, or the final
transitions, of many runs ending together) run as one group: one ``executemany`` for all, each
operation's outcome the same as alone.

The fast path and the loop's batch never wait for another process's lock (they would block the
event loop): they hand their operations to the writer thread instead, which waits up to the busy
timeout. They run on the loop's thread, not the writer's, because the two threads share one GIL:
a writer thread that releases the GIL for each statement waits, to get it back, for the loop to
give it up (up to the interpreter's switch interval, 5 ms) whenever the loop is busy running the
other runs, which it is exactly when there is a batch to commit. Several processes may share the
file: ``BEGIN IMMEDIATE``, retried until the busy timeout, serialises writers, and WAL lets
readers go on meanwhile.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .._core.exceptions import StoreError
from .shield import shielded

Op = Callable[[sqlite3.Connection], Any]
_Deliver = Callable[[Any, BaseException | None], None]
Outcome = tuple[Any, BaseException | None]
_MAX_BATCH = 512
#: A commit of at least this many operations (the loop's batch of many runs) checkpoints the
#: WAL at :data:`_BIG_BATCH_CHECKPOINT_BYTES` at the least, not at the store's own limit (why,
#: and what it bounds: docs/design.md, "What one step costs on SQLite").
_BIG_BATCH = 512
#: While a process works at least this many runs (:meth:`Writer.set_active_runs`), every commit
#: checkpoints as a big batch's does: a bulk request is one operation that writes as many runs
#: as a big batch does. A count of runs, not of operations: it equals _BIG_BATCH because so
#: many runs at work commit in batches of at least that many operations (each run's step
#: start, with its previous settlement), not because the two must stay equal.
_MANY_RUNS = 512
#: The WAL's size at which a big commit checkpoints, in bytes of pages: 16,384 pages of this
#: store's 1 KiB pages, 4,096 of the 4 KiB pages of a store an older haltwise made.
_BIG_BATCH_CHECKPOINT_BYTES = 16 * 1024 * 1024


class GroupOp:
    """An operation that runs more cheaply together with the operations of its own class that
    were submitted right before or after it (one ``executemany`` for all, say).

    Called on a connection, it runs alone, as any operation. Consecutive operations of one
    such class in a batch are handed to :meth:`run_group` together: it returns each one's
    outcome in order, exactly as running them one after the other would have, or None, having
    written nothing, to say it cannot (then each runs alone, in its own savepoint, as any
    other operation). If it raises, the batch's transaction is rolled back and the batch run
    again with no groups.
    """

    __slots__ = ()

    def __call__(self, conn: sqlite3.Connection) -> Any:
        raise NotImplementedError

    @classmethod
    def run_group(cls, conn: sqlite3.Connection, ops: list[Any]) -> list[Outcome] | None:
        """The outcomes of ``ops`` (instances of this class), or None (see the class)."""
        raise NotImplementedError


@dataclass(slots=True)
class _Item:
    op: Op
    write: bool
    #: who learns the outcome: a callback, or (for a caller on an event loop) a future of
    #: ``loop``, set there (batched wake-ups), made when the item is handed on (awaitable)
    deliver: _Deliver | None
    #: the op writes with at most one statement, so a failure leaves nothing to undo and it
    #: needs no savepoint of its own in a batch (SQLite undoes a failed statement by itself)
    atomic: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[Any] | None = None
    #: its cost grows with the store (a listing): run by the writer thread only, so that it
    #: never holds up the event loop
    bulk: bool = False
    #: its commit need not be synced to the disk before its caller goes on (a deferred
    #: settlement, a step start with ``durable=False``): a batch of such operations alone
    #: commits without a sync (see Writer._set_synced)
    lazy: bool = False

    def awaitable(self) -> None:
        """Give an operation submitted from an event loop its future, before it is handed to
        whoever may complete it (the loop's batch, the writer thread). Called on that loop; an
        operation run at once (the fast path) never needs one, nor one whose submitter gave a
        callback (``deliver``, called on the loop: see :meth:`Writer.call_then`)."""
        if self.loop is not None and self.future is None and self.deliver is None:
            self.future = self.loop.create_future()

    def hand(self, value: Any, error: BaseException | None) -> None:
        """Give the operation's outcome to whoever waits for it (on the future's loop)."""
        future = self.future
        if future is None:
            assert self.deliver is not None
            self.deliver(value, error)
        elif future.done():
            pass  # its waiter was cancelled; the operation still happened
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


class _GroupFailed(Exception):
    """A group of operations failed once it had written: run the batch again without groups."""


@dataclass(slots=True)
class _Waiter:
    """Lets a thread (not the event loop) block on an operation's completion."""

    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None

    def deliver(self, value: Any, error: BaseException | None) -> None:
        self.value, self.error = value, error
        self.done.set()


@dataclass(slots=True)
class _Signal:
    """A future of the event loop that made it, completed from another thread (the writer's
    "ready" and "ended"), with the error the thread hit, or None."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[BaseException | None]

    @classmethod
    def here(cls) -> _Signal:
        loop = asyncio.get_running_loop()
        return cls(loop, loop.create_future())

    def send(self, error: BaseException | None) -> None:
        """Complete the future (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self._complete, error)
        except RuntimeError:  # that loop is closed: nobody waits any more
            pass

    def _complete(self, error: BaseException | None) -> None:
        if not self.future.done():
            self.future.set_result(error)

    async def wait(self) -> BaseException | None:
        """Wait for :meth:`send`; a cancel of the caller does not cut the wait (the thread
        goes on either way, as a thread the caller waited on would)."""
        with shielded():
            error = await self.future
        return error


def store_error(path: str, error: sqlite3.Error) -> StoreError:
    text = str(error)
    if "not a database" in text or "malformed" in text:
        return StoreError(f"{path} is not a haltwise store (not a SQLite database)")
    return StoreError(f"store {path}: {text}")


def _deliver_all(batch: list[_Item], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """Hand each operation its outcome: one wake-up per event loop for the whole batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Item, Any, BaseException | None]]]
    by_loop = {}
    for item, (value, error) in zip(batch, outcomes, strict=True):
        if item.loop is None:
            item.hand(value, error)
        else:
            by_loop.setdefault(item.loop, []).append((item, value, error))
    for loop, deliveries in by_loop.items():
        try:
            loop.call_soon_threadsafe(_run_deliveries, deliveries)
        except RuntimeError:  # that loop is closed: nobody waits any more
            pass


async def _ran(value: Any, error: BaseException | None) -> Any:
    """The outcome of an operation that ran at once (the fast path), as :meth:`Writer.call`
    hands it back."""
    if error is not None:
        raise error
    return value


async def _shielded(future: asyncio.Future[Any]) -> Any:
    with shielded():
        return await future


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _run_deliveries(deliveries: list[tuple[_Item, Any, BaseException | None]]) -> None:
    for item, value, error in deliveries:
        item.hand(value, error)


class Writer:
    """Runs operations on one SQLite connection (see the module docstring)."""

    def __init__(
        self,
        path: str,
        busy_timeout: float,
        connect: Callable[[], sqlite3.Connection],
        prepare: Callable[[sqlite3.Connection], None],
        checkpoint_pages: int,
        synced_setting: str | None = None,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._connect_fn = connect
        self._prepare_fn = prepare
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Settlements whose caller does not wait for durability: they ride along with the next
        # operation's transaction (one commit for "settle step k" + "start step k+1").
        self._deferred: list[_Item] = []
        #: monotonic time when _deferred last became non-empty
        self._deferred_since = 0.0
        #: (run, fence) -> the error of a deferred settlement of the run that was not written
        #: (guarded by _lock): raised to every later write of that run under that fence
        #: (:meth:`raise_deferred`), and to no other operation
        self._deferred_errors: dict[tuple[str, str], BaseException] = {}
        #: set once the store's file is gone: every later operation raises it
        self.lost: StoreError | None = None
        # _lock guards _deferred and _pending (items queued or in the writer's hands);
        # conn_lock guards the one connection, used by the writer or by the fast path.
        self._lock = threading.Lock()
        self.conn_lock = threading.Lock()
        self._pending = 0
        self.conn: sqlite3.Connection | None = None
        # The connection's busy timeout as last set (ms): the fast path needs 0, the writer
        # thread the full timeout, and a PRAGMA is paid only on a switch between the two.
        self._busy_ms = int(busy_timeout * 1000)
        #: the WAL size (pages) at which a commit checkpoints, as ``prepare`` set it, and as the
        #: connection has it now (a PRAGMA is paid only on a switch: see _BIG_BATCH)
        self._checkpoint_pages = self._checkpoint_now = checkpoint_pages
        #: the WAL size (pages) at which a big commit checkpoints: _BIG_BATCH_CHECKPOINT_BYTES
        #: of the store's pages, known once the connection is open
        self._big_checkpoint_pages = checkpoint_pages
        #: Whether an idle writer may run an operation on the caller's thread. Off while many
        #: runs share the store: a commit done inline blocks the event loop, so the other runs
        #: could not queue their writes to share it; they go to the loop's batch instead.
        self.fast_path = True
        #: whether this process works many runs (see _MANY_RUNS)
        self._many_runs = False
        #: the store's own ``synchronous`` setting when it syncs commits (FULL, EXTRA), else
        #: None; and whether the connection has it now (a batch of lazy operations only commits
        #: at NORMAL: a PRAGMA is paid only on a switch)
        self._synced_setting = synced_setting
        self._synced_now = True
        # The loop's batch: operations submitted from _batch_loop since its last flush, which
        # is scheduled on that loop (or, while the writer thread has operations queued, waits
        # for it to finish them: _batch_waits; the writer then schedules it).
        self._loop_batch: list[_Item] = []
        self._batch_loop: asyncio.AbstractEventLoop | None = None
        self._batch_waits = False
        #: told by the writer thread as it ends, once stop() asked (see stop and _main)
        self._ended: _Signal | None = None
        self._finished = False

    @property
    def running(self) -> bool:
        return self._thread is not None

    async def start(self) -> None:
        """Open the connection (in the writer thread) and prepare it; raise what that raised.

        The wait is an event loop future the writer thread completes, not a worker thread of
        anyio's blocked on it: that thread would stay on, idle, beside the run.
        """
        ready = _Signal.here()
        self._ended = None
        self._finished = False
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="haltwise-sqlite-writer", daemon=True
        )
        self._thread.start()
        error = await ready.wait()
        if error is not None:
            self._thread = None
            raise error

    async def stop(self) -> None:
        """Commit what is deferred, let the queue drain, close the connection."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        ended = _Signal.here()
        with self._lock:  # what is left of the loop's batch goes to the writer thread
            self._enqueue([*self._deferred, *self._loop_batch])
            self._deferred, self._loop_batch = [], []
            if not self._finished:  # else the thread has ended already (see _main)
                self._ended = ended
        self._queue.put(None)
        if self._ended is ended:
            await ended.wait()
        thread.join()  # it has closed the connection: only its return is left

    # -- executing operations --------------------------------------------------------------

    def _main(self, ready: _Signal) -> None:
        try:
            conn = self._connect_fn()
            self._prepare_fn(conn)
            # The file's own page size: a store made by an older haltwise has 4 KiB pages.
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            self._big_checkpoint_pages = _BIG_BATCH_CHECKPOINT_BYTES // page_size
            self.conn = conn
        except BaseException as error:
            ready.send(error)
            return
        ready.send(None)
        try:
            while (item := self._queue.get()) is not None:
                batch, stop = self._drain(item)
                with self.conn_lock:
                    outcomes = self._execute(batch, wait=True)
                with self._lock:
                    self._pending -= len(batch)
                    if not self._pending and self._batch_waits:
                        self._batch_waits = False
                        self._schedule_loop_batch()
                assert outcomes is not None
                _deliver_all(batch, outcomes)
                if stop:
                    break
        finally:
            self.conn = None
            conn.close()
            with self._lock:
                self._finished = True
                ended = self._ended
            if ended is not None:
                ended.send(None)

    def _drain(self, first: _Item) -> tuple[list[_Item], bool]:
        batch = [first]
        while len(batch) < _MAX_BATCH:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                return batch, True
            batch.append(more)
        return batch, False

    def _execute(
        self, batch: list[_Item], *, wait: bool
    ) -> list[tuple[Any, BaseException | None]] | None:
        """Run ``batch`` in one transaction; None if the write lock is taken and not ``wait``.

        Each operation runs in its own savepoint (when there are several), so one failing
        changes nothing while the others commit; an operation alone needs none (if it fails,
        the transaction is rolled back). If the commit fails (a full disk, say), every
        operation of the batch fails and nothing of it holds.
        """
        conn = self.conn
        assert conn is not None
        if self.lost is not None:  # (under conn_lock: see stop_for_good)
            return [(None, self.lost)] * len(batch)
        grouped = True
        while True:
            try:
                return self._transaction(conn, batch, wait=wait, grouped=grouped)
            except _GroupFailed:
                conn.execute("ROLLBACK")
                grouped = False  # the batch again, each operation on its own
            except sqlite3.Error as error:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                return [(None, store_error(self.path, error))] * len(batch)
            except Exception as error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                return [(None, error)] * len(batch)

    def _transaction(
        self, conn: sqlite3.Connection, batch: list[_Item], *, wait: bool, grouped: bool
    ) -> list[Outcome] | None:
        big = self._many_runs or len(batch) >= _BIG_BATCH
        if big or self._checkpoint_now != self._checkpoint_pages:
            self._set_checkpoint(conn, big)
        write, lazy = False, True  # lazy: every write of the batch may commit unsynced
        for item in batch:  # not any(...): a generator per commit costs more than this
            if item.write:
                write = True
                lazy = lazy and item.lazy
        if write and self._synced_setting is not None and self._synced_now == lazy:
            self._set_synced(conn, not lazy)
        if not self._begin(conn, write, wait=wait):
            return None
        if len(batch) == 1:
            # A savepoint costs a copy of every page the operation changes (the sub-journal):
            # alone, it needs none, its failure undoes the whole transaction.
            outcome = self._apply(conn, batch[0], savepoint=False)
            conn.execute("COMMIT" if outcome[1] is None else "ROLLBACK")
            return [outcome]
        outcomes = self._apply_all(conn, batch, grouped=grouped)
        conn.execute("COMMIT")
        return outcomes

    def _apply_all(
        self, conn: sqlite3.Connection, batch: list[_Item], *, grouped: bool
    ) -> list[Outcome]:
        """Run every operation of ``batch`` in order, consecutive ones of one
        :class:`GroupOp` class as a group (if ``grouped``)."""
        outcomes: list[Outcome] = []
        start, size = 0, len(batch)
        while start < size:
            kind = type(batch[start].op)
            end = start + 1
            if grouped and issubclass(kind, GroupOp):
                while end < size and type(batch[end].op) is kind:
                    end += 1
            if end - start > 1:
                outcomes += self._apply_group(conn, batch[start:end])
            else:
                outcomes.append(self._apply(conn, batch[start], savepoint=True))
            start = end
        return outcomes

    def _apply_group(self, conn: sqlite3.Connection, group: list[_Item]) -> list[Outcome]:
        """Run consecutive operations of one :class:`GroupOp` class together, or one by one
        (each in its savepoint) if the group says it cannot. No savepoint around the group (it
        would copy every page the group changes): if it fails once it has written, the whole
        batch is run again without groups (:class:`_GroupFailed`)."""
        kind = type(group[0].op)
        assert issubclass(kind, GroupOp)
        try:
            outcomes = kind.run_group(conn, [item.op for item in group])
        except Exception as error:
            if not conn.in_transaction:
                raise  # SQLite rolled the whole transaction back (I/O error, full disk)
            raise _GroupFailed from error
        if outcomes is None:
            return [self._apply(conn, item, savepoint=True) for item in group]
        return outcomes

    def _apply(self, conn: sqlite3.Connection, item: _Item, *, savepoint: bool) -> Outcome:
        savepoint = savepoint and not item.atomic
        if savepoint:
            conn.execute("SAVEPOINT op")
        try:
            value = item.op(conn)
        except Exception as error:
            if not conn.in_transaction:
                raise  # SQLite rolled the whole transaction back (I/O error, full disk)
            if savepoint:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
            if isinstance(error, sqlite3.Error):
                return None, store_error(self.path, error)
            return None, error
        if savepoint:
            conn.execute("RELEASE op")
        return value, None

    def _begin(self, conn: sqlite3.Connection, write: bool, *, wait: bool) -> bool:
        """Open the transaction; False if another writer holds the lock and not ``wait``.

        Waiting is SQLite's own busy handler (the connection's busy timeout). The fast path
        turns it off: it must never block the event loop on another process's lock, and hands
        the operation to the writer thread instead.
        """
        self._set_busy_timeout(conn, int(self.busy_timeout * 1000) if wait else 0)
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            return True
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            if not wait:
                return False
            raise StoreError(
                f"store {self.path}: another writer held the database for more than "
                f"{self.busy_timeout:g} s"
            ) from None

    def _set_checkpoint(self, conn: sqlite3.Connection, big: bool) -> None:
        """Set the WAL size at which the commit about to run checkpoints (``big``: see
        _BIG_BATCH and _MANY_RUNS)."""
        pages = self._checkpoint_pages
        if big:
            pages = max(pages, self._big_checkpoint_pages)
        if pages != self._checkpoint_now:
            conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
            self._checkpoint_now = pages

    def _set_synced(self, conn: sqlite3.Connection, synced: bool) -> None:
        """Have the next commit synced to the disk (the store's own setting) or not (NORMAL).

        In WAL mode a commit at NORMAL is written to the log (kept through a crash of the
        process, visible to every reader) but not synced; the next synced commit syncs the
        log, and with it every commit before it: a crash of the machine may lose the lazy
        commits after the last synced one, never one before it, so the journal it leaves is
        a prefix of what was committed."""
        setting = self._synced_setting if synced else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {setting}")
        self._synced_now = synced

    def set_active_runs(self, active_runs: int) -> None:
        """How many runs this process works now: one commits each write at once, on the caller's
        thread (the fast path); several share the loop's batch; many (see _MANY_RUNS) commit
        at the larger checkpoint limit."""
        self.fast_path = active_runs <= 1
        self._many_runs = active_runs >= _MANY_RUNS

    def _set_busy_timeout(self, conn: sqlite3.Connection, milliseconds: int) -> None:
        if self._busy_ms != milliseconds:
            conn.execute(f"PRAGMA busy_timeout = {milliseconds}")
            self._busy_ms = milliseconds

    # -- submitting operations ---------------------------------------------------------------

    def _submit(self, item: _Item) -> tuple[bool, Any, BaseException | None]:
        """Run ``item`` here and now if the store is idle, else add it to the loop's batch or
        hand it to the writer thread (see the module docstring).

        Returns ``(True, value, error)`` when it ran here. Operations submitted from the event
        loop commit in the order they were submitted, whichever way each goes (one submitted from
        another thread, by ``call_blocking``, goes to the writer thread without the loop's batch
        and may commit ahead of it): the fast path needs the writer idle, with nothing queued
        and the loop's batch empty (an operation submitted while that batch holds operations
        joins it, even once the store is back to one run: a read made right after a write whose
        caller stopped waiting for it, a cancelled one, then sees it), and an operation handed
        to the writer thread takes the loop's batch along ahead of it. The fast path never waits
        for another process's lock (then the writer thread waits instead).
        """
        if self._thread is None:
            raise StoreError(f"store {self.path} is not open")
        if self.lost is not None:
            raise self.lost
        with self._lock:
            loop = item.loop
            batching = self._batch_loop is loop and bool(self._loop_batch)
            if (not self.fast_path or batching) and loop is not None and not item.bulk:
                if self._batch_loop is None:
                    self._batch_loop = loop
                    self._schedule_loop_batch()
                if self._batch_loop is loop:
                    item.awaitable()
                    self._loop_batch.append(item)
                    return False, None, None
            if batching:  # (a bulk operation) after the loop's batch, on the writer thread
                batch = [*self._deferred, *self._loop_batch, item]
                self._loop_batch = []
            else:
                batch = [*self._deferred, item]
            self._deferred = []
            inline = (
                self.fast_path
                and not item.bulk
                and self._pending == 0
                and not self._loop_batch
                and self.conn_lock.acquire(blocking=False)
            )
            if not inline:
                item.awaitable()
                self._enqueue(batch)
                return False, None, None
        try:
            outcomes = self._execute(batch, wait=False)
        finally:
            self.conn_lock.release()
        if outcomes is None:
            item.awaitable()
            with self._lock:
                self._enqueue(batch)
            return False, None, None
        for earlier, (_, earlier_error) in zip(batch[:-1], outcomes, strict=False):
            earlier.hand(None, earlier_error)
        value, error = outcomes[-1]
        return True, value, error

    def _enqueue(self, batch: list[_Item]) -> None:
        """Queue ``batch`` for the writer; the caller holds ``self._lock``."""
        self._pending += len(batch)
        for queued in batch:
            self._queue.put(queued)

    def _schedule_loop_batch(self) -> None:
        """Have _batch_loop flush its batch; the caller holds ``self._lock``.

        The flush runs a turn of the loop after the one this schedules for: after the
        callbacks that the tasks filling the batch scheduled as they went, in particular the
        ends of the tasks that submitted their last write (:meth:`call_then`), which free
        everything such a task held (its coroutines, its context) before the commit allocates
        what it needs. With 10,000 runs ending together they were otherwise all alive through
        the commit, for the garbage collector to move to its oldest generation. The turn
        costs no one a read of their own write: whatever is submitted meanwhile joins the
        batch, behind it (see :meth:`_submit`).
        """
        assert self._batch_loop is not None
        try:
            self._batch_loop.call_soon_threadsafe(self._flush_next_turn)
        except RuntimeError:  # that loop is closed: nobody waits for its batch any more
            self._batch_loop, self._loop_batch = None, []

    def _flush_next_turn(self) -> None:
        asyncio.get_running_loop().call_soon(self._flush_loop_batch)

    def _flush_loop_batch(self) -> None:
        """Commit the loop's batch (with the deferred settlements) on this, the loop's thread.

        Scheduled once per batch, when its first operation is added; runs after every task that
        was ready then, and the callbacks they scheduled (see :meth:`_schedule_loop_batch`). It
        waits while the writer thread has operations queued (they were submitted first), and
        hands the batch to it if another process holds the lock.
        """
        with self._lock:
            if self._pending:
                self._batch_waits = True
                return
            batch = [*self._deferred, *self._loop_batch]
            self._deferred, self._loop_batch, self._batch_loop = [], [], None
            if not batch:
                return  # stop() handed what was left to the writer thread
        with self.conn_lock:
            outcomes = self._execute(batch, wait=False)
        if outcomes is None:
            with self._lock:
                self._enqueue(batch)
            return
        for item, (value, error) in zip(batch, outcomes, strict=True):
            item.hand(value, error)

    @property
    def deferring(self) -> bool:
        """Whether settlements wait to be committed (:meth:`flush_deferred` commits them)."""
        return bool(self._deferred)

    def flush_deferred(self, *, older_than: float) -> None:
        """Commit the deferred settlements soon, if any has waited ``older_than`` seconds: a
        run that writes again sooner takes them along in its own commit. Called from the event
        loop, they go to its batch while many runs are active, else to the writer thread."""
        with self._lock:
            if not self._deferred or time.monotonic() - self._deferred_since < older_than:
                return
            if self._batch_loop is not None:
                return  # the loop's next batch takes them along
            loop = None if self.fast_path else _running_loop()
            if loop is not None:
                self._batch_loop = loop
                self._schedule_loop_batch()
            else:
                deferred, self._deferred = self._deferred, []
                self._enqueue(deferred)

    def stop_for_good(self, error: Callable[[bool], StoreError]) -> bool:
        """The store's write-ahead log is gone (deleted or replaced under it): take no more
        writes, and copy what this connection committed into the database file while its open
        log still holds it (a checkpoint through the open file: the log's frames are in the
        unlinked file, which no other connection will ever read). ``lost`` is then
        ``error(kept)``: every later operation raises it; True if the copy was made.

        Under the connection's lock, so that no commit of this store lands after the copy:
        a batch that takes the lock later fails with ``lost`` (:meth:`_execute`)."""
        with self.conn_lock:
            kept = False
            conn = self.conn
            if conn is not None and not conn.in_transaction:
                try:
                    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    kept = busy == 0
                except sqlite3.Error:
                    kept = False
            self.lost = error(kept)
            return kept

    def defer(self, op: Op, run_id: str, fence: str) -> None:
        """Hold settlement ``op`` of run ``run_id`` (written under ``fence``) for the next
        commit; if it fails, the run's later writes under that fence raise its error."""
        with self._lock:
            if not self._deferred:
                self._deferred_since = time.monotonic()
            deliver = partial(self._deferred_done, (run_id, fence))
            self._deferred.append(_Item(op, True, deliver, atomic=True, lazy=True))

    def _deferred_done(self, key: tuple[str, str], value: Any, error: BaseException | None) -> None:
        if error is not None:
            with self._lock:
                self._deferred_errors.setdefault(key, error)

    def raise_deferred(self, run_id: str, fence: str | None) -> None:
        """Raise the error of a deferred settlement of run ``run_id`` under ``fence`` that was
        not written, at every write of the run under that fence: nothing the run does after
        the settlement may become durable without it (its final transition least of all). Its
        attempt ends there, as after a crash; a takeover (a new fence) settles the step."""
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

    def call(
        self,
        op: Op,
        *,
        write: bool = True,
        atomic: bool = False,
        shield: bool = False,
        bulk: bool = False,
        lazy: bool = False,
    ) -> Awaitable[Any]:
        """Submit ``op`` now; awaited, what this returns returns once ``op`` is committed (its
        value) or raises what ``op`` raised.

        Waiting for the loop's batch or the writer thread, that is the operation's future
        itself, not a coroutine of ours awaiting it (one object fewer per write in a batch of
        10,000). With ``shield``, a cancel of the caller does not interrupt the wait for the
        operation, so the caller always learns how it ended. Only that wait needs the shield:
        run on the fast path, the operation has no point to be cancelled at. A ``bulk``
        operation (one whose cost grows with the store) is always run by the writer thread. A
        ``lazy`` one may be committed without a sync to the disk (see :class:`_Item`).
        """
        loop = asyncio.get_running_loop()
        item = _Item(op, write, None, atomic or not write, loop, None, bulk, lazy)
        ran, value, error = self._submit(item)
        if ran:
            return _ran(value, error)
        future = item.future
        assert future is not None  # given by _submit before it handed the item on
        return _shielded(future) if shield else future

    def call_then(self, op: Op, then: _Deliver) -> None:
        """Submit ``op`` (a write) now; ``then(value, error)`` is called once it is committed,
        or failed, on this event loop's thread: at once if it ran at once (the fast path), else
        from the commit of the loop's batch itself (no wake-up of a task, no future), or from a
        callback the writer thread schedules on the loop. ``then`` must not raise."""
        loop = asyncio.get_running_loop()
        ran, value, error = self._submit(_Item(op, True, then, False, loop))
        if ran:
            then(value, error)

    def call_blocking(self, op: Op, *, write: bool = True, atomic: bool = False) -> Any:
        """Run ``op`` and block this thread until it is committed (for ``emit``)."""
        waiter = _Waiter()
        ran, value, error = self._submit(_Item(op, write, waiter.deliver, atomic or not write))
        if not ran:
            waiter.done.wait()
            value, error = waiter.value, waiter.error
        if error is not None:
            raise error
        return value
