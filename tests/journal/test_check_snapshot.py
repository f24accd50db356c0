"""``check`` on a live store: what it reads is one snapshot, whatever commits meanwhile.

The runtime state machine once reported ``state-mismatch`` (a run ``running`` whose events end
at ``completed``) on a sound journal: ``check`` read the runs, then (in another transaction) the
events, and a run's completion committed in between. The test below commits that completion, from
another connection as another process would, exactly when ``check`` starts reading the events.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import anyio

from haltwise._core.records import JSONText, Owner
from haltwise._core.states import State
from haltwise._journal import open_store
from haltwise._journal.check import verify
from haltwise._journal.store import NewRun

OWNER = Owner(token="live", host="here", pid=1, started=0.0)


async def _create_running(url: str, run_id: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        run = NewRun(
            id=run_id,
            task="t",
            inputs={},
            state=State.RUNNING,
            owner=OWNER,
            lease_until=time.time() + 3600,
        )
        await store.create_run(run)
    finally:
        await store.close()


async def _complete(url: str, run_id: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.transition(
            run_id,
            State.COMPLETED,
            expected={State.RUNNING},
            result=JSONText("1"),
            owner=None,
            lease_until=None,
            fence=OWNER.token,
        )
    finally:
        await store.close()


def test_a_run_completing_while_check_reads_is_no_finding(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    anyio.run(_create_running, url, "r")
    completed = threading.Event()

    def commit_a_completion_before_the_events_are_read(statement: str) -> None:
        if "FROM events" in statement and not completed.is_set():
            completed.set()  # another process's commit, between two of check's statements
            other = threading.Thread(target=anyio.run, args=(_complete, url, "r"))
            other.start()
            other.join(timeout=60)

    async def check() -> list[str]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            connection: sqlite3.Connection = store._writer.conn  # type: ignore[attr-defined]
            connection.set_trace_callback(commit_a_completion_before_the_events_are_read)
            report = await verify(store)
        finally:
            await store.close()
        return [f"{finding.code}: {finding.message}" for finding in report.findings]

    assert anyio.run(check) == []
    assert completed.is_set()  # the completion did commit while check was reading
    assert anyio.run(check) == []  # and the store, read again, is sound
