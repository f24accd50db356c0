"""The SQLite store's change detection is woken by writes of its files, not a clock (issue 35,
idle cost of 10,000 waiting runs): another process's commit wakes a waiter at once; a write of
another file in the same directory does not; an idle wait reads ``PRAGMA data_version`` a few
times a second (the safety net), not every 15 ms; a settlement deferred meanwhile still commits
without another write to push it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from _wait import until
from haltwise._core.policy import Effect
from haltwise._core.records import Owner
from haltwise._core.states import State, StepStatus
from haltwise._journal import open_store
from haltwise._journal.file_watch import open_watch
from haltwise._journal.sqlite import SQLiteStore
from haltwise._journal.store import NewRun, StepStart

pytestmark = pytest.mark.anyio

OWNER = Owner(token="token-a", host="host-a", pid=101, started=1.0)

#: another process's commit into the store (a real process, plain sqlite3)
COMMIT = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("CREATE TABLE IF NOT EXISTS other_process (x)")
conn.execute("INSERT INTO other_process VALUES (1)")
conn.commit()
"""


async def opened(path: Path) -> SQLiteStore:
    store = open_store(f"sqlite:///{path}")
    assert isinstance(store, SQLiteStore)
    await store.open()
    return store


def count_statements(store: SQLiteStore) -> list[str]:
    """Every statement run on the store's watch connection from now on (SQLite's trace)."""
    seen: list[str] = []
    assert store._watch is not None
    store._watch.set_trace_callback(seen.append)
    return seen


async def test_another_process_commit_wakes_the_watch(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await opened(path)
    try:
        watch = open_watch(str(path))
        assert watch is not None  # Linux: the CI and this machine
        woken: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                woken.append(await watch.wait(60.0))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.to_thread.run_sync(
                lambda: subprocess.run([sys.executable, "-c", COMMIT, str(path)], check=True)
            )
        assert woken == [True]  # by the commit, not the 60 s timeout
        watch.close()
    finally:
        await store.close()


async def test_another_file_in_the_directory_does_not_wake_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await opened(path)
    try:
        watch = open_watch(str(path))
        assert watch is not None
        assert not await watch.wait(0.01)  # nothing pending
        (tmp_path / "ledger.txt").write_text("a side effect\n")
        assert not await watch.wait(0.3)
        sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
        assert await watch.wait(60.0)
        watch.close()
    finally:
        await store.close()


async def test_an_idle_wait_reads_data_version_a_few_times_a_second(tmp_path: Path) -> None:
    store = await opened(tmp_path / "store.db")
    try:
        await store.wait_for_change(0.05)  # opens the watch
        statements = count_statements(store)
        seen = await store.wait_for_change(1.0)
        reads = [s for s in statements if "data_version" in s]
        # The watch's safety net reads it every 0.25 s; polling every 15 ms read it ~67 times.
        assert 1 <= len(reads) <= 10, len(reads)
        assert seen == await store.wait_for_change(0.0)  # nothing changed
    finally:
        await store.close()


async def test_a_wait_sees_another_process_commit(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await opened(path)
    try:
        before = await store.wait_for_change(0.0)
        async with anyio.create_task_group() as tg:
            changed: list[int] = []

            async def wait() -> None:
                changed.append(await store.wait_for_change(60.0, since=before))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.to_thread.run_sync(
                lambda: subprocess.run([sys.executable, "-c", COMMIT, str(path)], check=True)
            )
        assert changed and changed[0] > before
    finally:
        await store.close()


async def test_a_nudge_wakes_every_waiter(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await opened(path)
    try:
        watch = open_watch(str(path))
        assert watch is not None
        woken: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                woken.append(await watch.wait(60.0))

            tg.start_soon(wait)
            tg.start_soon(wait)  # the second waits for the first one's read
            await anyio.wait_all_tasks_blocked()
            watch.nudge()
        assert woken == [True, True]
        watch.close()
    finally:
        await store.close()


async def test_a_deferred_settlement_commits_while_the_store_waits(tmp_path: Path) -> None:
    """A settlement deferred while a waiter sleeps on the watch is committed without another
    write: the defer nudges the waiter, which commits it on its next tick (as polling did)."""
    path = tmp_path / "store.db"
    store = await opened(path)
    try:
        await store.create_run(
            NewRun(
                id="r",
                task="t",
                inputs={"args": [], "kwargs": {}},
                state=State.RUNNING,
                owner=OWNER,
            )
        )
        start = StepStart(0, "look", "interruptible", Effect.READ, False, "key-0")
        await store.start_step("r", start, fence=OWNER.token)
        store.set_concurrency(2)  # several runs: settlements may be deferred
        async with anyio.create_task_group() as tg:

            async def watch() -> None:  # as the runtime's watcher: wait again after a change
                seen = None
                while True:
                    seen = await store.wait_for_change(60.0, since=seen)

            tg.start_soon(watch)
            await anyio.wait_all_tasks_blocked()
            await store.settle_step(
                "r", 0, StepStatus.COMMITTED, result=1, fence=OWNER.token, durable=False
            )

            def committed() -> bool:
                with sqlite3.connect(path) as other:
                    row = other.execute("SELECT status FROM steps WHERE run_id = 'r'").fetchone()
                return bool(row and row[0] == "committed")

            await until(committed, "the deferred settlement committed by another connection")
            tg.cancel_scope.cancel()
    finally:
        await store.close()
