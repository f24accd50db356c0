"""The SQLite writer's order: every operation submitted from the event loop commits in the order it
was submitted, whichever way it goes (at once on the caller's thread, in the event loop's batch, on
the writer thread), so a read made after a write sees it even when the write's caller stopped
waiting for it."""

from __future__ import annotations

import asyncio

import pytest

from haltwise._core.policy import Effect
from haltwise._core.records import Owner
from haltwise._core.states import State, StepStatus
from haltwise._journal import open_store
from haltwise._journal.sqlite import SQLiteStore
from haltwise._journal.store import NewRun, StepStart

pytestmark = pytest.mark.anyio

OWNER = Owner(token="token-a", host="host-a", pid=101, started=1.0)


async def opened_with_a_step(url: str) -> SQLiteStore:
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    await store.open()
    inputs = {"args": [], "kwargs": {}}
    await store.create_run(
        NewRun(id="r", task="t", inputs=inputs, state=State.RUNNING, owner=OWNER)
    )
    start = StepStart(0, "charge", "finish", Effect.EXTERNAL, False, "key-0")
    await store.start_step("r", start, fence=OWNER.token)
    return store


async def settle_in_the_loop_batch(store: SQLiteStore) -> asyncio.Task[None]:
    """Submit the step's settlement into the loop's batch (several runs active) from a task of
    its own, as a step settling after a framework's cancel does, and return once it waits."""
    store.set_concurrency(2)
    settling = asyncio.ensure_future(
        store.settle_step("r", 0, StepStatus.COMMITTED, result=5, fence=OWNER.token)
    )
    await asyncio.sleep(0)  # its task runs: the settlement is in the batch, not yet committed
    assert not settling.done()
    return settling


async def test_a_read_once_one_run_is_left_sees_the_write_still_in_the_loop_batch(
    sqlite_url: str,
) -> None:
    store = await opened_with_a_step(sqlite_url)
    try:
        settling = await settle_in_the_loop_batch(store)
        store.set_concurrency(1)  # the other runs ended: the fast path is on again
        snapshot = await store.load("r")  # not run at once, ahead of the batch: after it
        assert snapshot.steps[0].status is StepStatus.COMMITTED
        await settling
    finally:
        await store.close()


async def test_a_read_on_the_writer_thread_sees_the_write_still_in_the_loop_batch(
    sqlite_url: str,
) -> None:
    store = await opened_with_a_step(sqlite_url)
    try:
        settling = await settle_in_the_loop_batch(store)
        journal = await store.read_journal()  # on the writer thread: after the batch
        assert [step.status for step in journal.steps["r"]] == [StepStatus.COMMITTED]
        await settling
    finally:
        await store.close()


def commit_settings(statements: list[str]) -> list[str]:
    """The ``synchronous`` setting each ``COMMIT`` of ``statements`` ran at (the store's own,
    FULL, until a ``PRAGMA synchronous`` changes it)."""
    setting, settings = "FULL", []
    for text in statements:
        if text.upper().startswith("PRAGMA SYNCHRONOUS"):
            setting = text.split("=")[1].strip().upper()
        elif text.strip().upper() == "COMMIT":
            settings.append(setting)
    return settings


async def test_a_start_that_need_not_be_durable_commits_unsynced_and_the_next_write_syncs(
    tmp_path: object,
) -> None:
    """``start_step(durable=False)`` commits at NORMAL (written to the log, not synced), and
    is visible to another connection at once; the next write that must be durable commits at
    the store's own FULL again, which syncs the log and the lazy start with it."""
    import sqlite3
    from pathlib import Path

    path = Path(str(tmp_path)) / "lazy.db"
    store = await opened_with_a_step(f"sqlite:///{path}")
    try:
        statements: list[str] = []
        assert store._writer.conn is not None
        store._writer.conn.set_trace_callback(statements.append)
        start = StepStart(1, "lookup", "interruptible", Effect.READ, False, "key-1")
        await store.start_step("r", start, fence=OWNER.token, durable=False)
        with sqlite3.connect(path) as other:  # another reader sees the start at once
            rows = other.execute("SELECT idx, status FROM steps WHERE run_id = 'r'").fetchall()
        assert (1, "running") in rows
        await store.settle_step("r", 1, StepStatus.COMMITTED, result=1, fence=OWNER.token)
        start = StepStart(2, "charge", "finish", Effect.EXTERNAL, False, "key-2")
        await store.start_step("r", start, fence=OWNER.token)
        # the lazy start unsynced; the settlement, then the start of a step that must be
        # durable, synced again
        assert commit_settings(statements) == ["NORMAL", "FULL", "FULL"], statements
    finally:
        await store.close()
