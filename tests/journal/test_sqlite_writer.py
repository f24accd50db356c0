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
