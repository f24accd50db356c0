"""Defects found by reading the runtime and the SQLite store (issue 15, items 4, 5, 15, 16, 17).

Real stores, real files: the store file is deleted under a running run, the watch connection
is closed under the store, a deferred write is made to fail by a fence that does not hold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

import haltwise
import toolkit
from _cli_kit import AGENT, PATIENCE, Env, error_line
from _wait import wait_until
from haltwise import State, StepStatus
from haltwise._core.records import Owner
from haltwise._journal import open_store
from haltwise._journal.store import NewRun, StepStart

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


@haltwise.task
async def echo_types(items: Any, mapping: Any) -> list[str]:
    """What the task function sees of its inputs: their types and keys."""
    await toolkit.quick(1)
    return [type(items).__name__, *(type(key).__name__ for key in mapping)]


async def test_inputs_are_handed_to_the_task_as_json_gives_them_back(store_url: str) -> None:
    """Item 5: the first attempt sees what every resume will see (a list, string keys)."""
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(echo_types, (1, 2), {1: "a", 2: "b"}, task_id="j")
        outcome = await handle.outcome()
    assert outcome.result == ["list", "str", "str"]


async def test_start_outside_async_with_records_nothing(store_url: str) -> None:
    """Item 15: the check comes before the write, so no run is left running and unworked."""
    runtime = haltwise.Runtime(store_url)
    await runtime.store.open()
    try:
        with pytest.raises(haltwise.HaltwiseError, match="async with"):
            await runtime.start(toolkit.three_quick, task_id="orphan")
        with pytest.raises(haltwise.HaltwiseError, match="async with"):
            await runtime.resume("orphan")
        assert await runtime.store.list_runs() == []
    finally:
        await runtime.store.close()


async def test_a_deleted_store_stops_the_run_and_outcome_says_so_every_time(
    sqlite_url: str,
) -> None:
    """Items 4 and 16: the run stops with a clear error, and outcome() raises it on every call
    instead of raising once and then waiting forever."""
    path = sqlite_url.removeprefix("sqlite:///")
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(toolkit.one_step, "read_async", task_id="gone")
        await toolkit.between.wait()
        toolkit.go_on.set()
        await toolkit.entered.wait()
        os.unlink(path)
        for _ in range(2):
            with anyio.fail_after(PATIENCE), pytest.raises(haltwise.StoreError, match="deleted"):
                await handle.outcome()
    assert toolkit.calls["quick"] == 1, "the run went on after its store was gone"


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_deleted_or_replaced_wal_stops_the_run_and_keeps_what_was_committed(
    sqlite_url: str, tmp_path: Path, how: str
) -> None:
    """Issue 28: the store's write-ahead log deleted (or replaced) under a running process:
    SQLite commits on into a file nobody will read, runs were reported ``completed`` on writes
    that were not durable, and after a kill -9 every commit since the last checkpoint was gone
    (the takeover repeated their effects). The run stops with a clear error, and what the store
    had committed is copied into the database file first."""
    path = sqlite_url.removeprefix("sqlite:///")
    wal = path + "-wal"
    crashed = tmp_path / "crashed.db"
    async with haltwise.Runtime(sqlite_url) as rt:
        handle = await rt.start(toolkit.one_step, "read_async", task_id="walless")
        await toolkit.between.wait()
        toolkit.go_on.set()
        await toolkit.entered.wait()
        assert os.path.exists(wal)
        os.unlink(wal)
        if how == "replaced":
            Path(wal).write_bytes(b"")
        for _ in range(2):
            with anyio.fail_after(PATIENCE), pytest.raises(haltwise.StoreError, match="-wal"):
                await handle.outcome()
        # The process dies now, as by kill -9 (its close would checkpoint the open log): the
        # disk holds the database file and whatever is at the log's path.
        shutil.copy(path, crashed)
        if os.path.exists(wal):
            shutil.copy(wal, f"{crashed}-wal")
    assert toolkit.calls["quick"] == 1, "the run went on after its log was gone"
    async with haltwise.Runtime(f"sqlite:///{crashed}") as rt:
        found = await rt.status("walless")
    assert found.state is State.RUNNING, found
    assert [s.status for s in found.steps][:1] == [StepStatus.COMMITTED], found.steps


def test_a_deleted_store_makes_run_exit_2_with_one_line(tmp_path: Path) -> None:
    """Item 4 from the command line: the gated step is in flight when the file goes."""
    (tmp_path / "agent.py").write_text(AGENT)
    env = Env(tmp_path)
    process = env.popen("run", "agent.py:flow", "--input", '{"policy": "interruptible"}')
    wait_until(lambda: "record:cats" in env.effects(), "the step", process=process)
    (tmp_path / "store.db").unlink()
    out, err = process.communicate(timeout=PATIENCE)
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert "deleted or replaced" in error_line(done)


async def test_a_failing_watch_connection_is_raised_not_swallowed(sqlite_url: str) -> None:
    """Item 17: a stale data_version would freeze cross-process change detection unnoticed."""
    store = open_store(sqlite_url)
    await store.open()
    try:
        watch = store._watch  # type: ignore[attr-defined]
        watch.close()  # the fault: the connection PRAGMA data_version is read on is unusable
        with pytest.raises(haltwise.StoreError):
            await store.wait_for_change(0.2)
    finally:
        store._watch = None  # type: ignore[attr-defined]
        await store.close()


async def test_a_deferred_write_that_fails_is_raised_by_its_runs_later_writes(
    sqlite_url: str,
) -> None:
    """Item 17, and issue 28: the failure of a write made with durable=False reaches every
    later write of its run under its fence (never a read, never another run's operation)."""
    owner = Owner(token="t", host="h", pid=1, started=1.0)
    store = open_store(sqlite_url)
    await store.open()
    try:
        await store.create_run(
            NewRun(id="r", task="t", inputs={}, state=State.RUNNING, owner=owner, lease_until=0)
        )
        start = StepStart(0, "tool", "finish", haltwise.Effect.WRITE, False, "k")
        await store.start_step("r", start, fence="t")
        await store.settle_step("r", 0, StepStatus.COMMITTED, fence="not-the-owner", durable=False)
        for _ in range(3):
            await store.load("r")
            await store.wait_for_change(0.05)
        for _ in range(2):
            with pytest.raises(haltwise.LostOwnershipError):
                await store.transition(
                    "r", State.COMPLETED, expected={State.RUNNING}, fence="not-the-owner"
                )
        assert (await store.load("r")).steps[0].status is StepStatus.RUNNING
    finally:
        await store.close()


def test_python_api_outcome_docstrings_say_what_they_raise() -> None:
    doc = haltwise.TaskHandle.outcome.__doc__ or ""
    assert "StoreError" in doc and "every call" in doc


@pytest.mark.parametrize(
    "bad",
    [
        lambda: haltwise.Runtime("sqlite:///x.db", lease=-1),
        lambda: haltwise.Runtime("sqlite:///x.db", lease=float("nan")),
        lambda: haltwise.Runtime("sqlite:///x.db", lease=float("inf")),
        lambda: toolkit.quick.schema("anthropic"),
        lambda: haltwise.Runtime("mysql://u:pw@h/db"),
    ],
    ids=["lease<0", "lease nan", "lease inf", "schema format", "store url"],
)
def test_bad_arguments_in_python_are_haltwise_errors(bad: Any) -> None:
    """The sweep, in Python: a bad argument is a HaltwiseError (an InputError is also a
    ValueError), never a bare ValueError or TypeError."""
    with pytest.raises(haltwise.HaltwiseError) as raised:
        bad()
    assert "pw" not in str(raised.value)


@pytest.mark.parametrize("seconds", [-1, float("nan"), "5", None])
async def test_a_shield_of_no_usable_length_is_an_input_error(seconds: Any) -> None:
    with pytest.raises(haltwise.InputError):
        async with haltwise.shield(seconds):
            pass


#: set by :func:`held_read` once its body runs (made by the test, in its event loop)
_began: list[anyio.Event] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def held_read() -> str:
    _began[0].set()
    await anyio.sleep(3600)  # ends by the deadline's cancel
    return "never"


@haltwise.task(name="hardening:held")
async def held() -> str:
    return await held_read()


async def test_a_deadline_the_store_cannot_record_yet_is_recorded_later_and_ends_nothing_else(
    sqlite_url: str,
) -> None:
    # Issue 28 item 6: a run's deadline fired while the store refused writes (a PostgreSQL
    # restart, here SQLite's query_only): the store's error left the run's task group into the
    # runtime's, whose block then ended under its caller (a server's runs all cancelled with
    # reason "shutdown", its API still answering). The deadline's cancel must be tried again
    # once the store is back, and nothing else stop.
    _began[:] = [anyio.Event()]
    tried = threading.Event()

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):  # a write (the deadline's), refused
            tried.set()

    async with haltwise.Runtime(sqlite_url) as rt:
        writer = rt.store._writer  # type: ignore[attr-defined]
        handle = await rt.start(held, task_id="late", deadline=0.3)
        await _began[0].wait()
        with writer.conn_lock:
            writer.conn.execute("PRAGMA query_only = ON")
            writer.conn.set_trace_callback(trace)
        assert await anyio.to_thread.run_sync(tried.wait, PATIENCE), "no write was tried"
        with writer.conn_lock:
            writer.conn.set_trace_callback(None)
            writer.conn.execute("PRAGMA query_only = OFF")
        with anyio.fail_after(PATIENCE):
            outcome = await handle.outcome()
        second = await rt.start(toolkit.three_quick, task_id="after")  # the runtime goes on
        assert (await second.outcome()).state is State.COMPLETED
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "deadline"), outcome
    assert [s.status for s in outcome.steps] == [StepStatus.INTERRUPTED]
