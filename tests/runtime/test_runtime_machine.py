"""The runtime under random interleavings of start, concurrent steps, cancel, force, crash, resume,
pause and unpause, with a step that times out and is retried while the gate is closed, on each
store (SQLite and PostgreSQL).

A hypothesis state machine drives runs whose task makes three tool calls at once (interruptible,
finish, rollback), twice. The tools' bodies wait at their process's gate, which the machine opens
and closes. Each "process" is a runtime in an event loop of its own thread, with a short lease
(``LEASE``). A "crash" is kill -9 as far as the journal can tell: the process's event loop is
frozen for good (nothing it holds runs again, nothing of it is exited or cleaned up), on
PostgreSQL the transactions it left open are ended by the server (as they end when the kernel
closes a killed process's sockets), and its runs are handed to an owner on a host that is gone,
lease expired, as the dead process's would be once its lease ran out. A new process then resumes
what it likes. A crashed process may also come back (it had only stalled, past its lease) and
shut down: it must cancel none of the runs taken from it, and begin no step body and no
compensation.

After every rule: no step is ``running`` in a final run, the store is sound (a step left running
by the crashed owner is the one allowed finding until a resume takes it over), no committed
step's body ever began again, and no process that came back began a body or an undo. Every wait
on a process is bounded (``DEADLINE``): a hang fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import haltwise
from _pg import backends_in_transaction, create_database
from haltwise import State, StepStatus
from haltwise._core.records import Owner
from haltwise._journal.check import CheckReport, verify_journal
from haltwise._journal.store import JournalRows, Store

_T = TypeVar("_T")

#: seconds any one operation on a process may take before the test fails (a hang is a bug)
DEADLINE = 60.0
#: crashes per example
MAX_CRASHES = 3
#: each process's lease (seconds): a crashed process comes back only once it surely ran out
LEASE = 0.1

#: body starts per idempotency key (one key per step, the same in every attempt)
STARTS: Counter[str] = Counter()
#: the bodies (their keys) and compensations a crashed process began after it came back (there
#: must be none)
LATE_STARTS: list[str] = []
_LOCK = threading.Lock()


class Loop:
    """An event loop in a thread of its own, as one process's main thread would hold it:
    :meth:`_setup` runs on it, then it waits until :meth:`stop`."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=type(self).__name__, daemon=True)
        self.thread.start()
        if not self._ready.wait(DEADLINE):
            raise AssertionError(f"a {type(self).__name__} did not start")
        if self._failure is not None:
            raise self._failure

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported by stop() (or __init__)
            self._failure = error
            self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self._setup()

    async def _setup(self) -> None:
        """Set up, call :meth:`_serving` once ready, and tear down when it returns."""
        await self._serving()

    async def _serving(self) -> None:
        self._ready.set()
        assert self._stop is not None
        await self._stop.wait()

    def call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Await ``fn()`` on the loop and return what it returned (or raise)."""

        async def run() -> _T:
            return await fn()

        future: Future[_T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=DEADLINE)

    def stop(self) -> None:
        """Leave :meth:`_setup` (a clean shutdown) and end the thread."""
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), f"a {type(self).__name__} did not shut down"
        if self._failure is not None:
            raise self._failure


class Process(Loop):
    """One runtime, as one process would hold it; ``url`` names it to the store (``name``)."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.gate = asyncio.Event()  # bound to the process's loop at its first wait
        self._thaw = threading.Event()
        self.frozen_at = 0.0
        self.came_back = False
        super().__init__()

    async def _setup(self) -> None:
        PROCESSES[self.loop] = self
        async with haltwise.Runtime(self.url, lease=LEASE) as runtime:
            self.runtime = runtime
            await self._serving()
            self.gate.set()  # shutting down: the bodies end, the runs settle by policy

    def open_gate(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)

    def close_gate(self) -> None:
        def close() -> None:
            if self.gate.is_set():  # bodies already waiting keep waiting on the closed one
                self.gate = asyncio.Event()

        self.call(_sync(close))

    def freeze(self) -> None:
        """kill -9 as the journal sees it: the loop stops between two callbacks, its thread
        blocked, and nothing of it runs or is exited until :meth:`thaw` (if ever)."""
        frozen = threading.Event()
        self._thaw = threading.Event()

        def stall() -> None:
            self.frozen_at = time.monotonic()
            frozen.set()
            self._thaw.wait()

        self.loop.call_soon_threadsafe(stall)
        if not frozen.wait(DEADLINE):
            raise AssertionError("a process's loop did not come to its freeze")

    def thaw(self) -> None:
        """The process comes back once its lease has surely run out (a stall, not a death).

        Its runs were taken over meanwhile: its writes are refused from now on, and a step
        whose start it had journaled when it stalled must not begin its body (the new owner
        may have run that step): the body checks the lease first.
        """
        time.sleep(max(0.0, self.frozen_at + LEASE - time.monotonic()))  # the stall's length
        self.came_back = True
        self._thaw.set()


def _sync(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        fn()

    return call


#: the process of each event loop (a body waits at its own process's gate)
PROCESSES: dict[asyncio.AbstractEventLoop, Process] = {}


async def _at_gate() -> None:
    process = PROCESSES[asyncio.get_running_loop()]
    key = haltwise.idempotency_key()
    with _LOCK:
        STARTS[key] += 1
        if process.came_back:
            LATE_STARTS.append(key)
    await process.gate.wait()


async def _undo(i: int) -> None:
    """The rollback tool's compensation: never run by a process that came back either."""
    if PROCESSES[asyncio.get_running_loop()].came_back:
        with _LOCK:
            LATE_STARTS.append(f"the undo of store_row({i})")


@haltwise.tool(cancel="interruptible", effect="read")
async def peek(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="finish", effect="external", grace=0.5)
async def pay(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo, grace=0.5)
async def store_row(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.2, retries=1, backoff=(0, 1, 0))
async def glance(i: int) -> int:
    """Times out (and is retried once) while the gate is closed."""
    await _at_gate()
    return i


@haltwise.task(name="machine:three_at_once")
async def three_at_once() -> list[int]:
    first = await asyncio.gather(peek(0), pay(1), store_row(2))
    second = await asyncio.gather(pay(3), peek(4), glance(5))
    return [*first, *second]


class Journal(Loop):
    """The store as the machine looks at it (one open store on a loop of its own)."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__()

    async def _setup(self) -> None:
        self.store: Store = haltwise.Runtime(self.url).store
        await self.store.open()
        try:
            await self._serving()
        finally:
            await self.store.close()

    def look(self) -> tuple[JournalRows, CheckReport]:
        """The whole journal (one snapshot) and what ``check`` says of it."""

        async def look() -> tuple[JournalRows, CheckReport]:
            journal = await self.store.read_journal()
            return journal, verify_journal(journal)

        return self.call(look)

    def hand_to_the_dead(self, token: str) -> None:
        """Give every run ``token`` holds to an owner on a host that is gone, lease expired."""

        async def hand() -> None:
            ghost = Owner(token=uuid.uuid4().hex, host="gone.invalid", pid=1, started=0.0)
            for run in await self.store.list_runs():
                if run.owner is not None and run.owner.token == token:
                    await self.store.claim(
                        run.id, ghost, lease_until=time.time() - 1, expected_owner=token
                    )

        self.call(hand)


class Stores:
    """One store and one :class:`Journal` on it for the whole test, emptied after each example
    (a fresh store each would cost more than the example: ~0.1 s for a PostgreSQL database)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.journal: Journal | None = None

    def begin(self) -> tuple[str, Journal]:
        """The (empty) store for one example, and the machine's view of it."""
        if self.journal is None:
            self.journal = Journal(self.url)
        return self.url, self.journal

    def as_process(self, url: str, name: str) -> str:
        """The URL by which process ``name`` opens the store at ``url``."""
        return url

    def kill(self, url: str, name: str) -> None:
        """What the store sees of process ``name`` frozen for good."""
        raise NotImplementedError

    def end(self) -> None:
        """The example is over (every process but the journal has ended): empty the store."""
        with self._transaction() as conn:
            for (name,) in conn.execute(self.TABLES).fetchall():  # no table has a foreign key
                conn.execute(f"DELETE FROM {self.SCHEMA}{name}")

    #: a query of the store's tables (but its meta row's), and the schema they are in
    TABLES = ""
    SCHEMA = ""

    def _transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A connection to the store, in a transaction committed at the end."""
        raise NotImplementedError

    def close(self) -> None:
        """The test is over."""
        if self.journal is not None:
            self.journal.stop()


class SqliteStores(Stores):
    def __init__(self, directory: Path) -> None:
        self.path = directory / "journal.db"
        super().__init__(f"sqlite:///{self.path}")

    def kill(self, url: str, name: str) -> None:
        """Nothing to undo: the frozen process's writer thread, not its loop, ends the writes
        in flight, and then holds no lock of the file."""

    TABLES = (
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "AND name NOT IN ('haltwise_meta', 'sqlite_sequence')"
    )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with contextlib.closing(sqlite3.connect(self.path, timeout=DEADLINE)) as conn, conn:
            yield conn


class PostgresStores(Stores):
    def __init__(self, server_dsn: str) -> None:
        super().__init__(create_database(server_dsn))

    def as_process(self, url: str, name: str) -> str:
        return f"{url}?application_name={name}"

    def kill(self, url: str, name: str) -> None:
        """End the transactions process ``name`` left open, releasing their locks (for a
        killed process the kernel closing its sockets does; for one that only stalled, the
        server's ``idle_in_transaction_session_timeout``). Its idle connections stay open, as
        a stalled process's would."""
        pids = backends_in_transaction(url, name, DEADLINE)
        end = time.monotonic() + DEADLINE
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
            while admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchall():
                assert time.monotonic() < end, f"the transactions of {name} did not end"

    TABLES = (
        "SELECT tablename FROM pg_tables "
        "WHERE schemaname = 'haltwise' AND tablename <> 'haltwise_meta'"
    )
    SCHEMA = "haltwise."

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.url, autocommit=True) as conn, conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{DEADLINE:.0f}s'")  # a hang fails
            yield conn


_PROCESS_NAMES = itertools.count(1)


class RuntimeMachine(RuleBasedStateMachine):
    def __init__(self, stores: Stores) -> None:
        super().__init__()
        self.stores = stores
        STARTS.clear()
        LATE_STARTS.clear()
        self.url, self.journal = stores.begin()
        self.process = self._new_process()
        #: the crashed processes, frozen
        self.frozen: list[Process] = []
        self.runs: list[str] = []
        #: body starts of each committed step's key, when it was first seen committed
        self.committed: dict[str, int] = {}

    def _new_process(self) -> Process:
        name = f"machine-{next(_PROCESS_NAMES)}"
        return Process(self.stores.as_process(self.url, name), name)

    def _call(self, fn: Callable[[haltwise.Runtime], Awaitable[_T]]) -> _T:
        runtime = self.process.runtime
        return self.process.call(lambda: fn(runtime))

    def _run(self, which: int) -> str:
        return self.runs[which % len(self.runs)]

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: len(self.runs) < 3)
    @rule()
    def start(self) -> None:
        run_id = f"r{len(self.runs)}"
        self._call(lambda rt: rt.start(three_at_once, task_id=run_id))
        self.runs.append(run_id)

    @rule()
    def open_gate(self) -> None:
        self.process.open_gate()

    @rule()
    def close_gate(self) -> None:
        self.process.close_gate()

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2), force=st.booleans())
    def cancel(self, which: int, force: bool) -> None:
        run_id = self._run(which)
        self._call(lambda rt: rt.cancel(run_id, force=force))

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def pause(self, which: int) -> None:
        run_id = self._run(which)
        self._call(lambda rt: rt.pause(run_id))

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def unpause(self, which: int) -> None:
        run_id = self._run(which)
        try:  # a paused run whose owner crashed is taken over and continued here
            self._call(lambda rt: rt.unpause(run_id))
        except haltwise.RunOwnedError:
            pass

    @precondition(lambda self: bool(self.runs) and len(self.frozen) < MAX_CRASHES)
    @rule()
    def crash(self) -> None:
        old = self.process
        old.freeze()
        self.frozen.append(old)
        self.stores.kill(self.url, old.name)
        self.journal.hand_to_the_dead(old.runtime.owner.token)
        self.process = self._new_process()

    @precondition(lambda self: bool(self.frozen))
    @rule(which=st.integers(0, MAX_CRASHES - 1))
    def come_back(self, which: int) -> None:
        """A crashed process had only stalled: it comes back, past its lease, and shuts down."""
        stale = self.frozen.pop(which % len(self.frozen))
        stale.thaw()
        stale.stop()

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def resume(self, which: int) -> None:
        run_id = self._run(which)
        self._call(lambda rt: _resume(rt, run_id))

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def the_journal_keeps_its_promises(self) -> None:
        journal, report = self.journal.look()
        problems = [f for f in report.findings if f.code != "orphaned-step"]
        assert not problems, problems  # a step the crashed left running awaits a takeover
        for run in journal.runs:
            steps = journal.steps.get(run.id, ())
            if run.state.is_final:
                assert all(s.status is not StepStatus.RUNNING for s in steps), (run, steps)
            # only the crashed processes shut down before the teardown, and their runs were
            # taken from them: no run is cancelled for a shutdown
            assert run.reason != "shutdown", run
            for step in steps:
                if step.status is StepStatus.COMMITTED:
                    with _LOCK:
                        seen = STARTS[step.idempotency_key]
                    first = self.committed.setdefault(step.idempotency_key, seen)
                    assert seen == first, f"step {step.index} of {run.id} ran again"
        with _LOCK:
            late = list(LATE_STARTS)
        assert not late, f"a process that came back past its lease began {late}"

    def teardown(self) -> None:
        try:
            while self.frozen:
                self.come_back(0)
            self.process.stop()
            journal, report = self.journal.look()
            assert all(f.code == "orphaned-step" for f in report.findings), report
            assert not LATE_STARTS, LATE_STARTS
            for run in journal.runs:  # seen with --hypothesis-show-statistics
                event(f"a run ends {run.state} with {run.reason or 'no reason'}")
        finally:
            self.stores.end()


async def _resume(runtime: haltwise.Runtime, run_id: str) -> None:
    """Resume ``run_id`` here unless it is worked here or completed, rerunning unknown steps."""
    outcome = await runtime.status(run_id)
    if runtime.is_active(run_id) or outcome.state is State.COMPLETED:
        return
    unknown = {s.index for s in outcome.steps if s.status is StepStatus.UNKNOWN}
    try:
        await runtime.resume(run_id, rerun=unknown)
    except (haltwise.RunOwnedError, haltwise.ResumeRefusedError):
        pass  # taken by the run's own settling meanwhile, or a step became unknown since


#: examples per store, sized so that both stores together cost about what SQLite alone did
EXAMPLES = {"sqlite": 70, "postgres": 25}


@pytest.fixture(params=sorted(EXAMPLES))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Stores]]:
    """Each store kind, for the whole test."""
    where: Stores
    if request.param == "sqlite":
        where = SqliteStores(tmp_path)
    else:
        where = PostgresStores(request.getfixturevalue("pg_dsn"))
    try:
        yield request.param, where
    finally:
        where.close()


def test_runtime_machine(stores: tuple[str, Stores]) -> None:
    kind, where = stores
    run_state_machine_as_test(
        lambda: RuntimeMachine(where),
        settings=settings(
            max_examples=EXAMPLES[kind],
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_frozen_clients_statement_waiting_on_its_own_lock_counts_as_in_a_transaction(
    pg_url: str,
) -> None:
    """The crash rule's kill on PostgreSQL (``backends_in_transaction``) waits until none of the
    frozen process's statements runs. One may wait for a row lock that the process's own open
    transaction holds (a claim frozen between its UPDATE and its COMMIT, a transition of the
    same run queued behind it): it ends only with that transaction, so waiting for it hung
    test_runtime_machine[postgres] for good (session 10). It is counted in, and ended with it."""
    name = "frozen-client"
    with psycopg.connect(pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE held (id integer PRIMARY KEY)")
        setup.execute("INSERT INTO held VALUES (1)")
    own = f"{pg_url}?application_name={name}"
    with psycopg.connect(own) as holder, psycopg.connect(own, autocommit=True) as waiter:
        holder.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE")  # its transaction stays open
        blocked = threading.Thread(
            target=_ignore_errors, args=(waiter, "SELECT id FROM held WHERE id = 1 FOR UPDATE")
        )
        blocked.start()
        try:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                end = time.monotonic() + DEADLINE
                while not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                    (waiter.info.backend_pid,),
                ).fetchall():
                    assert time.monotonic() < end, "the second statement never waited"
                    time.sleep(0.01)
            found = backends_in_transaction(pg_url, name, deadline=5.0)
            assert sorted(found) == sorted([holder.info.backend_pid, waiter.info.backend_pid])
        finally:
            holder.rollback()
            blocked.join(DEADLINE)


def _ignore_errors(conn: psycopg.Connection[Any], statement: str) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute(statement)
