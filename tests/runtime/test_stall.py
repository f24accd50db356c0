"""A process stopped (SIGSTOP) between journaling a step's start and beginning its body, past
its lease, while another process takes its run over and completes it: when it comes back it
does not begin that body (the tool's side effect happens once), and the journal is sound.

Real processes, a real SQLite file or PostgreSQL database, a real SIGSTOP/SIGCONT; the stall
point is a file the agent waits for, the lease's end is polled in the store. The agent is stopped
only at a moment it holds no lock (SQLite's write lock; on PostgreSQL no transaction open, seen
in ``pg_stat_activity``): a stopped holder would keep the other agent waiting until it comes
back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import haltwise
from _paths import TESTS
from _pg import backends_in_transaction
from _wait import wait_until
from haltwise import State, StepStatus
from haltwise._core.records import Owner
from haltwise._journal.check import check_store
from haltwise._runtime import lowlevel
from toolkit import Gate

AGENT = TESTS / "stall_agent.py"
DEADLINE = 60.0
LEASE = 1.0
#: the stopped agent's name to PostgreSQL (its connections' ``application_name``)
STALE_APP = "stall-stale"


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
    wait_until(done, what, timeout=DEADLINE)


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


def holds_no_lock(store: str) -> bool:
    """Whether the stopped agent holds no lock the other agent would wait for: on SQLite the
    file's write lock, on PostgreSQL an open transaction's row locks."""
    if store.startswith("sqlite:"):
        return writable(Path(store.removeprefix("sqlite:///")))
    return not backends_in_transaction(store, STALE_APP, DEADLINE)


def stop_outside_a_write(proc: subprocess.Popen[str], store: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write lock (a heartbeat may be in flight)."""
    end = time.monotonic() + DEADLINE
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        if holds_no_lock(store):
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
    store_url: str, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    stale = spawn(store_url, world, STALL="1", STALL_HOST="stalled.invalid", PGAPPNAME=STALE_APP)
    try:
        poll("the step's start", (world / "ready").exists)
        stop_outside_a_write(stale, store_url)
        poll("the stopped agent's lease to run out", lambda: lease_expired(store_url))
        fresh = spawn(store_url, world)
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
        async with haltwise.Runtime(store_url) as rt:
            return await rt.status("pay")

    outcome = anyio.run(load)
    assert outcome.state is State.COMPLETED, outcome
    assert outcome.result == "charged-5"
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED]
    checked = subprocess.run(
        [sys.executable, "-m", "haltwise", "check"],
        env={**os.environ, "HALTWISE_STORE": store_url},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert checked.returncode == 0, (checked.stdout, checked.stderr)


# -- the event loop of this very process stalls (SQLite, in process) ------------------------------
#
# A stall can also be this process's own loop blocked by a synchronous call (a long GC pause, a
# CPU-bound callback of another task) at a moment a probe of the runtime chooses: right after
# the lease was looked at, or while the write confirming it is in flight. Another owner takes
# the run during the stall (as it may once the lease has run out). SQLite only: the stalled
# process's writer thread, not its loop, commits its writes, so a stall never holds a lock the
# hand-over would wait for (on PostgreSQL a heartbeat's transaction may be open across the
# stall); the checks are store-independent, and the fencing they use is in the contract tests.

IN_PROCESS_LEASE = 1.0
#: the stopped agent's name to PostgreSQL (its connections' ``application_name``)
STALE_APP = "stall-stale"
EFFECTS: list[str] = []


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def charge_here(amount: int) -> str:
    EFFECTS.append(haltwise.idempotency_key())
    return f"charged-{amount}"


@haltwise.task(name="stall:apart")
async def pay_apart() -> list[str]:
    """The finish body runs in a task of its own (a gather's child calls it)."""
    return await asyncio.gather(charge_here(5))


@haltwise.task(name="stall:here")
async def pay_here() -> str:
    return await charge_here(5)


def hand_over(url: str, run_id: str, token: str) -> None:
    """From another thread (this loop is blocked), give the run ``token`` holds to an owner on a
    host that is gone."""

    async def take() -> None:
        store = haltwise.Runtime(url).store
        await store.open()
        try:
            ghost = Owner(token=uuid.uuid4().hex, host="gone.invalid", pid=1, started=0.0)
            taken = await store.claim(run_id, ghost, lease_until=time.time() - 1,
                                      expected_owner=token)  # fmt: skip
            assert taken
        finally:
            await store.close()

    failure: list[BaseException] = []

    def main() -> None:
        try:
            anyio.run(take)
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join(DEADLINE)
    assert not thread.is_alive() and not failure, failure


def stall_past_the_lease() -> None:
    """Block this loop for the lease: every lease held here has surely run out after it."""
    time.sleep(IN_PROCESS_LEASE)


Probe = Callable[[str, int], Awaitable[None]]


async def lose_and_take_over(
    url: str, task: Any, probe_for: Callable[[str], Probe], *, stall_after_claims: bool = False
) -> None:
    """Run ``task`` as ``r`` under the probe ``probe_for(owner token)``, until this runtime has
    lost it; then a second runtime takes the run over and completes it, the charge once.

    With ``stall_after_claims``, each claim this runtime makes of ``r`` (the one write that
    confirms a lease) is followed, once committed, by a stall past the lease during which the
    run is taken."""
    EFFECTS.clear()
    async with haltwise.Runtime(url, lease=IN_PROCESS_LEASE) as first:
        token = first.owner.token
        if stall_after_claims:
            store = first.store
            claim = store.claim

            async def claim_then_stall(run_id: str, owner: Owner, **how: Any) -> bool:
                held = await claim(run_id, owner, **how)
                if held and run_id == "r":
                    hand_over(url, run_id, token)
                    stall_past_the_lease()
                return held

            store.claim = claim_then_stall  # type: ignore[method-assign]
        probe = probe_for(token)
        await lowlevel.launch(first, task, task_id="r", probe=probe)
        with anyio.fail_after(DEADLINE):
            while first.is_active("r"):
                await anyio.sleep(0.01)
        assert EFFECTS == [], "the body began after the run was taken over"
    async with haltwise.Runtime(url) as second:
        outcome = await (await second.resume("r")).outcome()
    assert outcome.state is State.COMPLETED, outcome
    assert len(EFFECTS) == 1, EFFECTS
    assert (await check_store(url)).ok


@pytest.mark.anyio
async def test_a_stall_between_the_lease_check_and_the_body_task_begins_no_body(
    sqlite_url: str,
) -> None:
    def probe_for(token: str) -> Probe:
        def stall() -> None:
            hand_over(sqlite_url, "r", token)
            stall_past_the_lease()

        async def probe(kind: str, index: int) -> None:
            if kind == "during":  # the lease is looked at next, the body's task begins after
                asyncio.get_running_loop().call_soon(stall)

        return probe

    await lose_and_take_over(sqlite_url, pay_apart, probe_for)


@pytest.mark.anyio
async def test_a_lease_confirmation_answered_after_a_stall_is_no_proof(sqlite_url: str) -> None:
    """The body must confirm the lease (the loop stalled past it before the check); the
    confirming write commits, and then the loop stalls again, past the lease it renewed, while
    another takes the run: that answer proves nothing, and the body does not begin."""

    def probe_for(token: str) -> Probe:
        async def probe(kind: str, index: int) -> None:
            if kind == "during":
                stall_past_the_lease()

        return probe

    await lose_and_take_over(sqlite_url, pay_here, probe_for, stall_after_claims=True)


UNDONE: list[str] = []
writing = Gate()


async def unwrite(amount: int) -> None:
    UNDONE.append(f"undo {amount}")


@haltwise.tool(cancel="rollback", effect="write", compensate=unwrite, grace=5.0)
async def write_row(amount: int) -> str:
    writing.set()
    await anyio.sleep(3600)  # interrupted by the cancel
    return "written"


@haltwise.task(name="stall:writes")
async def writes() -> str:
    return await write_row(7)


@pytest.mark.anyio
async def test_a_process_that_lost_its_run_in_a_stall_undoes_nothing(sqlite_url: str) -> None:
    """A rollback body is in flight when the loop stalls past the lease and the run is taken;
    then the process shuts down (its own cancel, refused by the fence, stops the attempt here):
    the undo is the new owner's, done once, there."""
    global writing
    writing = Gate()
    UNDONE.clear()
    async with haltwise.Runtime(sqlite_url, lease=IN_PROCESS_LEASE) as first:
        await first.start(writes, task_id="w")
        await writing.wait()
        hand_over(sqlite_url, "w", first.owner.token)
        stall_past_the_lease()
    assert UNDONE == [], "the process that lost the run undid its step"
    async with haltwise.Runtime(sqlite_url) as second:
        await second.cancel("w")
        outcome = await second.outcome("w")
    assert outcome.state is State.CANCELLED, outcome
    assert [step.status for step in outcome.steps] == [StepStatus.COMPENSATED]
    assert UNDONE == ["undo 7"]
    assert (await check_store(sqlite_url)).ok
