"""Faults around a run: a locked database, a full disk, two resumers, many runs at once, a server
that closed the connections."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import psycopg
import pytest

import haltwise
import toolkit
from _crash_kit import check_world, spawn, wait_started
from _paths import TESTS
from _pg import PostgresServer, create_database
from _wait import wait_until
from haltwise import State, StepStatus
from haltwise._core.policy import Effect
from haltwise._journal import open_store
from haltwise._journal.owner import new_owner
from haltwise._journal.store import NewRun, StepStart

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


def hold_the_write_lock(path: str, locked: threading.Event, unlock: threading.Event) -> None:
    """Hold the file's write lock from another connection until ``unlock`` (at most 10 s)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    locked.set()
    unlock.wait(10)
    conn.execute("COMMIT")
    conn.close()


async def test_a_database_locked_by_another_writer_is_waited_for(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    locked = threading.Event()
    unlock = threading.Event()
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(toolkit.one_step, "read_async", task_id="blocked")
        await toolkit.between.wait()
        holder = threading.Thread(target=hold_the_write_lock, args=(path, locked, unlock))
        holder.start()
        await anyio.to_thread.run_sync(locked.wait)
        toolkit.go_on.set()
        toolkit.release.set()
        await anyio.sleep(1.0)  # the lock is held on purpose for a while: nothing may fail
        assert toolkit.calls["read_async"] == 0, "a tool body ran before its start was durable"
        unlock.set()
        outcome = await handle.outcome()
        holder.join()
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["read_async"] == 1
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, sqlite_url)).ok


async def test_with_many_runs_a_locked_database_never_stalls_the_event_loop(
    sqlite_url: str,
) -> None:
    # With several runs active their writes are committed on the event loop's own thread, a
    # batch per loop iteration. Another process holding the lock must send the batch to the
    # writer thread, which waits for it, instead of stalling the loop for as long as it is held.
    path = sqlite_url.removeprefix("sqlite:///")
    locked, unlock = threading.Event(), threading.Event()
    gaps: list[float] = []

    async def tick(until: threading.Event) -> None:
        last = time.monotonic()
        while not until.is_set():
            await anyio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with haltwise.Runtime(sqlite_url) as rt:
        handles = [
            await rt.start(toolkit.one_step, "read_async", task_id=f"m{i}") for i in range(5)
        ]
        with anyio.fail_after(10):
            # each run is at the gate, its first partial durable: an emit still waiting for
            # its commit would block the loop behind the lock held below (emit is synchronous)
            while toolkit.calls["quick"] < len(handles) or not all(
                [(await handle.status()).partials for handle in handles]
            ):
                await anyio.sleep(0.01)
        holder = threading.Thread(target=hold_the_write_lock, args=(path, locked, unlock))
        holder.start()
        await anyio.to_thread.run_sync(locked.wait)
        toolkit.go_on.set()
        toolkit.release.set()
        async with anyio.create_task_group() as group:
            group.start_soon(tick, unlock)
            await anyio.sleep(1.0)  # the lock is held on purpose for a while
            assert toolkit.calls["read_async"] == 0, "a tool body ran before its start was durable"
            unlock.set()
        outcomes = [await handle.outcome() for handle in handles]
        holder.join()
    assert {outcome.state for outcome in outcomes} == {State.COMPLETED}
    assert toolkit.calls["read_async"] == len(handles)
    assert max(gaps) < 0.5, f"the event loop stalled for {max(gaps):.2f} s"
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, sqlite_url)).ok


async def test_the_writer_keeps_its_savepoint_journal_in_memory(sqlite_url: str) -> None:
    # A savepoint's (and a triggering statement's) journal holds a copy of every page it
    # changes; in a temporary file, past 64 KiB, that is a write call per page.
    async with haltwise.Runtime(sqlite_url) as rt:
        conn = rt.store._writer.conn  # type: ignore[attr-defined]
        with rt.store._writer.conn_lock:  # type: ignore[attr-defined]
            assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY


@haltwise.tool(cancel="interruptible", effect="none")
async def bump(i: int) -> int:
    return i + 1


@haltwise.task(name="test_faults:bumps")
async def bumps(n: int) -> int:
    total = 0
    for i in range(n):
        total += await bump(i)
    return total


async def test_many_runs_share_their_commits(sqlite_url: str) -> None:
    # Group commit: 50 runs of 4 steps write 200 step starts (each durable before its body
    # runs), and far fewer transactions, because the runs' writes are committed together.
    runs, steps = 50, 4
    async with haltwise.Runtime(sqlite_url) as rt:
        commits = []  # write transactions
        rt.store._writer.conn.set_trace_callback(  # type: ignore[attr-defined]
            lambda sql: commits.append(sql) if sql == "BEGIN IMMEDIATE" else None
        )
        outcomes: list[haltwise.Outcome] = []

        async def one(k: int) -> None:
            handle = await rt.start(bumps, steps, task_id=f"g{k}")
            outcomes.append(await handle.outcome())

        async with anyio.create_task_group() as group:
            for k in range(runs):
                group.start_soon(one, k)
    assert [outcome.result for outcome in outcomes] == [steps * (steps + 1) // 2] * runs
    assert sum(len(o.steps) for o in outcomes) == runs * steps
    assert len(commits) < runs, f"{len(commits)} commits for {runs * steps} steps"


def store_with_pages(tmp_path: Path, page_size: int) -> str:
    """The URL of a new store whose file has pages of ``page_size`` bytes: a new store gets
    1 KiB pages, one made by an older haltwise has 4 KiB pages."""
    path = tmp_path / "haltwise.db"
    if page_size != 1024:
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("VACUUM")
        conn.close()
    return f"sqlite:///{path}"


#: a store's page size and the WAL size, in pages, at which its big commits checkpoint: 16 MiB
BIG_CHECKPOINTS = pytest.mark.parametrize(("page_size", "big_pages"), [(1024, 16384), (4096, 4096)])


@BIG_CHECKPOINTS
async def test_a_big_batch_checkpoints_at_16_mib_of_pages_and_one_run_at_the_stores_limit(
    tmp_path: Path, page_size: int, big_pages: int
) -> None:
    # At FULL the store checkpoints its WAL at 1,000 pages; the batch of 400 runs (a start and
    # the previous step's settlement each: 800 operations) raises that to 16 MiB of the file's
    # pages for its commit, so that not every such commit checkpoints; smaller commits (the
    # batch's tail, one run's) put it back.
    async with haltwise.Runtime(store_with_pages(tmp_path, page_size)) as rt:
        settings: list[str] = []
        rt.store._writer.conn.set_trace_callback(  # type: ignore[attr-defined]
            lambda sql: settings.append(sql) if "wal_autocheckpoint" in sql else None
        )

        async def one(k: int) -> None:
            handle = await rt.start(bumps, 3, task_id=f"b{k}")
            assert (await handle.outcome()).state is State.COMPLETED

        async with anyio.create_task_group() as group:
            for k in range(400):
                group.start_soon(one, k)
        assert settings[0] == f"PRAGMA wal_autocheckpoint = {big_pages}", settings
        await one(400)
    assert settings[-1] == "PRAGMA wal_autocheckpoint = 1000", settings


@BIG_CHECKPOINTS
async def test_every_commit_checkpoints_at_16_mib_of_pages_while_the_process_works_many_runs(
    tmp_path: Path, page_size: int, big_pages: int
) -> None:
    # A bulk request is one operation that writes as many runs as a big batch (a cancel of
    # 10,000 runs: ~4,000 WAL frames): while the process works 512 runs or more, even a commit
    # of one operation checkpoints at the big batch's limit, 16 MiB of the file's own pages (a
    # store made by an older haltwise has 4 KiB pages: 4,096 of them, not 16,384); with fewer
    # runs, at the store's own 1,000 pages.
    from haltwise._journal import open_store
    from haltwise._journal.store import NewRun

    store = open_store(store_with_pages(tmp_path, page_size))
    await store.open()
    try:
        settings: list[str] = []
        store._writer.conn.set_trace_callback(  # type: ignore[attr-defined]
            lambda sql: settings.append(sql) if "wal_autocheckpoint" in sql else None
        )
        for active_runs, pages in ((600, big_pages), (2, 1000)):
            store.set_concurrency(active_runs)
            await store.create_run(NewRun(id=f"r{active_runs}", task="t", inputs={}))
            assert settings[-1] == f"PRAGMA wal_autocheckpoint = {pages}", settings
    finally:
        await store.close()


@haltwise.task(name="test_faults:chatty")
async def chatty(n: int) -> int:
    for i in range(n):
        await toolkit.quick(i)
        haltwise.emit({"i": i, "padding": "x" * 4000})
    return n


async def test_a_full_disk_stops_the_run_cleanly_and_resume_finishes_it(sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        store = rt.store
        with store._writer.conn_lock:  # SQLite's own "disk full": no page beyond the current ones
            pages = store._writer.conn.execute("PRAGMA page_count").fetchone()[0]
            store._writer.conn.execute(f"PRAGMA max_page_count = {pages + 2}")
        handle = await rt.start(chatty, 40, task_id="full")
        # Either the final transition still fits (the run fails with the store's error), or it
        # does not either (the run stops where its journal stands, as after a crash).
        try:
            stopped = await handle.outcome()
        except haltwise.StoreError as error:
            assert "resume it once the store is usable" in str(error)
            stopped = await rt.status("full")
            assert stopped.state is State.RUNNING
        else:
            assert stopped.state is State.FAILED
            assert stopped.error is not None and stopped.error.type == "StoreError"
            assert "full" in stopped.error.message
        assert len(stopped.partials) < 40
        with store._writer.conn_lock:
            store._writer.conn.execute("PRAGMA max_page_count = 1073741823")
        outcome = await (await rt.resume("full")).outcome()
    assert outcome.state is State.COMPLETED
    assert [p["i"] for p in outcome.partials] == list(range(40))
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, sqlite_url)).ok


#: set by the test once every run of :func:`on_cue` waits: then they all end together
_cue: list[anyio.Event] = []


@haltwise.task(name="test_faults:on_cue")
async def on_cue(i: int) -> str:
    await _cue[0].wait()
    return f"{i}:" + "x" * 20_000  # more than any page has room for: it needs new pages


async def test_with_many_runs_a_full_disk_at_their_final_writes_stops_each_as_one_alone(
    sqlite_url: str,
) -> None:
    # 50 runs end together: their final transitions share a commit of the loop's batch, and
    # each run learns how its write went from that commit (its task has ended already). A
    # commit that fails (the disk is full) must stop each run exactly as it stops one alone:
    # its outcome says so, it stays running in the journal, released; a resume finishes it.
    _cue[:] = [anyio.Event()]
    ids = [f"cue{i}" for i in range(50)]
    async with haltwise.Runtime(sqlite_url) as rt:
        for i, run_id in enumerate(ids):
            await rt.start(on_cue, i, task_id=run_id)
        store = rt.store
        with store._writer.conn_lock:  # no page beyond the current ones
            pages = store._writer.conn.execute("PRAGMA page_count").fetchone()[0]
            store._writer.conn.execute(f"PRAGMA max_page_count = {pages}")
        _cue[0].set()
        for run_id in ids:
            with anyio.fail_after(60), pytest.raises(haltwise.StoreError) as raised:
                await rt.outcome(run_id)
            assert "resume it once the store is usable" in str(raised.value)
            assert not rt.is_active(run_id)
        stopped = [await rt.status(run_id) for run_id in ids]
        assert {outcome.state for outcome in stopped} == {State.RUNNING}
        with store._writer.conn_lock:
            store._writer.conn.execute("PRAGMA max_page_count = 1073741823")
        handles = [await rt.resume(run_id) for run_id in ids]
        outcomes = [await handle.outcome() for handle in handles]
    assert [outcome.state for outcome in outcomes] == [State.COMPLETED] * 50
    assert [outcome.result.split(":")[0] for outcome in outcomes] == [str(i) for i in range(50)]
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, sqlite_url)).ok


def test_two_processes_resuming_the_same_run_exactly_one_wins(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Both resume the run its killed owner left; the steps are held (the world's ``hold``
    file) until each has answered, so the loser meets the winner still running it."""
    world = tmp_path / "world"
    world.mkdir()
    (world / "hold").touch()
    first = spawn(sqlite_url, "race", world)
    wait_started(first)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    racers = [spawn(sqlite_url, "race", world), spawn(sqlite_url, "race", world)]
    try:
        said = [proc.stdout.readline().strip() for proc in racers if proc.stdout]
        log = world / "executions"
        ran = log.read_text().splitlines() if log.exists() else []
        assert set(ran) <= {"look 0"}, f"the run went on past its held first step: {ran}"
    finally:
        (world / "hold").unlink()
    results = [proc.communicate(timeout=120) for proc in racers]
    loser, winner = sorted(said)
    assert loser.startswith("owned: run 'race' is held by") and winner == "started", said
    assert sorted(proc.returncode for proc in racers) == [0, 2], results

    async def load() -> haltwise.Outcome:
        async with haltwise.Runtime(sqlite_url) as rt:
            return await rt.status("race")

    check_world(world, anyio.run(load), kills=1)
    assert haltwise.verify_store(sqlite_url).ok


def wal_frames(wal: Path) -> tuple[int, int]:
    """(frames of the WAL's current generation, frames the file has room for): a frame belongs
    to it when its salts are the header's (SQLite's file format)."""
    data = wal.read_bytes()
    page_size, salts = int.from_bytes(data[8:12], "big"), data[16:24]
    frame = 24 + page_size
    room = (len(data) - 32) // frame
    offsets = (32 + k * frame for k in range(room))
    return sum(1 for at in offsets if data[at + 8 : at + 16] == salts), room


def test_a_run_killed_with_room_left_in_its_wal_loses_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The WAL is given its room as the store opens: a kill -9 leaves the file longer than its
    frames, and the next process must read exactly the committed frames back. The agent ticks
    (durable write steps, each logged as its body runs) until it is killed."""
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    agent = [sys.executable, str(TESTS / "tick_agent.py"), sqlite_url, str(tmp_path)]
    proc = subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_started(proc)
    log = tmp_path / "ticks.log"
    wait_until(
        lambda: log.exists() and len(log.read_text().splitlines()) >= 6,
        "six steps ticking",
        process=proc,
        timeout=60,
        interval=0.005,
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    frames, room = wal_frames(path.with_name(path.name + "-wal"))
    assert room >= 1000 > frames > 0, (frames, room)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    ticked = [int(line) for line in log.read_text().splitlines()]

    async def load() -> haltwise.Outcome:
        async with haltwise.Runtime(sqlite_url) as rt:
            return await rt.status("ticks")

    steps = anyio.run(load).steps
    committed = [step.index for step in steps if step.status is StepStatus.COMMITTED]
    # A tick's settlement is durable before the next tick begins: only the last may be missing.
    assert committed in (ticked, ticked[:-1]), (committed, ticked)


async def test_a_thousand_runs_cancelled_at_once_all_end_cancelled(sqlite_url: str) -> None:
    async with haltwise.Runtime(sqlite_url) as rt:
        handles = [
            await rt.start(toolkit.one_step, "read_async", task_id=f"k{i}") for i in range(1000)
        ]
        toolkit.go_on.set()
        await toolkit.entered.wait()
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(handle.cancel)
        outcomes = [await handle.outcome() for handle in handles]
        runs = await rt.store.list_runs()
    assert {o.state for o in outcomes} == {State.CANCELLED}
    assert len(runs) == 1000
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, sqlite_url)).ok


#: set by :func:`wait_for_ever` once its body runs (made by the test, in its event loop)
_waiting: list[anyio.Event] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_for_ever() -> str:
    _waiting[0].set()
    await anyio.sleep(3600)
    return "never"


@haltwise.task(name="faults:waiting")
async def waiting() -> str:
    return await wait_for_ever()


async def test_a_runtime_whose_server_closed_its_connections_still_ends_its_runs(
    pg_url: str,
) -> None:
    # A server restart, a failover or a proxy's idle timeout closes the pool's connections while
    # they sit idle: the shutdown's first write must not take a dead one and lose the run's
    # ending (it stayed `running` until its lease ran out, and leaving the runtime raised). The
    # termination is waited for (its timeout), as for connections closed a while ago.
    victim = f"{pg_url}?application_name=faults_victim"
    _waiting[:] = [anyio.Event()]
    async with haltwise.Runtime(victim) as rt:
        await rt.start(waiting, task_id="cut")
        await _waiting[0].wait()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE application_name = 'faults_victim'"
            ).fetchall()
        assert len(ended) >= 1
    async with haltwise.Runtime(pg_url) as rt:
        assert (await rt.status("cut")).state is State.CANCELLED
    assert (await anyio.to_thread.run_sync(haltwise.verify_store, pg_url)).ok


@pytest.mark.parametrize("mode", ["immediate", "fast"])
async def test_a_settlement_lost_with_the_server_stops_its_own_run_and_no_other(
    mode: str,
) -> None:
    # Issue 28: PostgreSQL restarted while two runs' deferred settlements were in flight: the
    # store kept one error for the store, raised to whichever operation came next, and the
    # other run's final transition committed once the server was back: `completed` with its
    # step `running`, for good. Each run's own writes must fail, and only its own.
    server = PostgresServer()  # its own server: this test stops and starts it
    await anyio.to_thread.run_sync(server.start)
    try:
        url = create_database(server.dsn)
        store = open_store(url)
        await store.open()
        try:
            owner = new_owner()
            fence = owner.token
            for run_id in ("a", "b", "c"):
                await store.create_run(
                    NewRun(id=run_id, task="t", inputs={}, state=State.RUNNING, owner=owner)
                )
            start = StepStart(
                index=0, tool="look", cancel="interruptible", effect=Effect.READ,
                idempotent=False, idempotency_key="k",
            )  # fmt: skip
            for run_id in ("a", "b"):
                await store.start_step(run_id, start, fence=fence)
                await store.settle_step(
                    run_id, 0, StepStatus.COMMITTED, result=1, fence=fence, durable=False
                )
            stop = ("pg_ctl", "stop", "-m", mode, "-w", "-D", str(server.data))
            await anyio.to_thread.run_sync(lambda: server._run(*stop))
            with pytest.raises(haltwise.StoreError):  # the server is down
                await store.transition("a", State.COMPLETED, expected={State.RUNNING}, fence=fence)
            again = ("pg_ctl", "restart", "-w", "-D", str(server.data), "-l", str(server.log))
            await anyio.to_thread.run_sync(lambda: server._run(*again))
            # Another run's operations never hear of b's lost settlement (a's rode with b's
            # start: durable) ...
            await store.start_step("c", start, fence=fence)
            await store.request_pause("c")
            await store.transition(
                "a", State.COMPLETED, expected={State.RUNNING}, fence=fence, owner=None
            )
            # ... and b does not end while its settlement is not durable, however often asked.
            for _ in range(2):
                with pytest.raises(haltwise.StoreError):
                    await store.transition(
                        "b", State.COMPLETED, expected={State.RUNNING}, fence=fence
                    )
            snapshot = await store.load("b")
            assert snapshot.run.state is State.RUNNING, snapshot.run
            assert snapshot.steps[0].status is StepStatus.RUNNING, snapshot.steps
            # Released (the runtime's answer to a failed write), a takeover settles them.
            await store.release("b", fence)
            assert await store.claim("b", new_owner(), lease_until=time.time() + 60,
                                     expected_owner=None)  # fmt: skip
        finally:
            await store.close()
        report = await anyio.to_thread.run_sync(haltwise.verify_store, url)
        assert [(f.code, f.run) for f in report.findings] == [], report.findings
    finally:
        await anyio.to_thread.run_sync(server.stop)


def test_a_wal_deleted_under_a_writing_process_then_kill_9_loses_no_acknowledged_run(
    tmp_path: Path,
) -> None:
    # Issue 28 item 3, across processes: another process deletes the store's -wal file while
    # a process works runs, then that process is killed -9 (no close, which would checkpoint
    # the log it still holds open). SQLite went on committing into the deleted file, so every
    # run since the last checkpoint, acknowledged `completed`, was gone for the next process.
    # The writer must notice, stop on one line, and keep what it acknowledged.
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    writer = subprocess.Popen(
        [sys.executable, str(TESTS / "wal_writer.py"), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(writer.stdout or ()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: len(lines) >= 5, "five runs acknowledged", process=writer)
        os.unlink(f"{path}-wal")
        wait_until(lambda: lines[-1].startswith("lost:"), "the writer to notice", process=writer)
    finally:
        writer.kill()  # SIGKILL
        writer.wait()
    reader.join(10)
    lost = [line for line in lines if line.startswith("lost:")]
    assert len(lost) == 1 and "-wal" in lost[0], lines[-3:]
    acknowledged = [line.split()[1] for line in lines if line.startswith("done")]
    assert all(line.endswith("completed\n") for line in lines if line.startswith("done"))
    listed = subprocess.run(
        [sys.executable, "-m", "haltwise", "list", "--json", "--limit", "100000", "--store", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    states = {run["id"]: run["state"] for run in json.loads(listed.stdout)["runs"]}
    assert {f"w{n}": states.get(f"w{n}") for n in acknowledged} == {
        f"w{n}": "completed" for n in acknowledged
    }
