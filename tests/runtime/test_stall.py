"""A process stopped (SIGSTOP) between journaling a step's start and beginning its body, past
its lease, while another process takes its run over and completes it: when it comes back it
does not begin that body (the tool's side effect happens once), and the journal is sound.

Real processes, a real SQLite file, a real SIGSTOP/SIGCONT; the stall point is a file the
agent waits for, the lease's end is polled in the store.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio

import haltwise
from _paths import TESTS
from haltwise import State, StepStatus

AGENT = TESTS / "stall_agent.py"
DEADLINE = 60.0
LEASE = 1.0


def spawn(store: str, world: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), store, "pay", str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STALL_LEASE": str(LEASE), **env},
    )


def poll(what: str, done: object) -> None:
    """Wait (generously: the machine may be loaded) until ``done()`` is true."""
    assert callable(done)
    end = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def writable(db: Path) -> bool:
    """Whether nobody holds the SQLite file's write lock right now."""
    conn = sqlite3.connect(db, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def stop_outside_a_write(proc: subprocess.Popen[str], db: Path) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write lock (a heartbeat may be in flight)."""
    end = time.monotonic() + DEADLINE
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        if writable(db):
            return
        os.kill(proc.pid, signal.SIGCONT)
        assert time.monotonic() < end, "the agent never left the write lock"
        time.sleep(0.01)


def lease_expired(store: str) -> bool:
    async def read() -> bool:
        opened = haltwise.Runtime(store).store
        await opened.open()
        try:
            run = (await opened.load("pay")).run
        finally:
            await opened.close()
        return run.lease_until is not None and run.lease_until < time.time()

    return anyio.run(read)


def test_a_process_stopped_before_a_step_body_past_its_lease_does_not_begin_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    world = tmp_path / "world"
    world.mkdir()
    stale = spawn(sqlite_url, world, STALL="1", STALL_HOST="stalled.invalid")
    try:
        poll("the step's start", (world / "ready").exists)
        stop_outside_a_write(stale, db)
        poll("the stopped agent's lease to run out", lambda: lease_expired(sqlite_url))
        fresh = spawn(sqlite_url, world)
        out, err = fresh.communicate(timeout=DEADLINE)
        assert fresh.returncode == 0 and out.split() == ["started", "completed"], (out, err)
        (world / "go").touch()
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    out, err = stale.communicate(timeout=DEADLINE)
    assert stale.returncode == 0, (out, err)
    assert "Traceback" not in err, err

    effects = (world / "effects").read_text().splitlines()
    assert len(effects) == 1, f"the charge ran {len(effects)} times: {effects}"

    async def load() -> haltwise.Outcome:
        async with haltwise.Runtime(sqlite_url) as rt:
            return await rt.status("pay")

    outcome = anyio.run(load)
    assert outcome.state is State.COMPLETED, outcome
    assert outcome.result == "charged-5"
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED]
    checked = subprocess.run(
        [sys.executable, "-m", "haltwise", "check"],
        env={**os.environ, "HALTWISE_STORE": sqlite_url},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
