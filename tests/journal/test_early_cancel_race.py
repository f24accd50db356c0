"""A stop pressed before the run exists, racing the run's creation on PostgreSQL (CONTRACT.md,
"Command line": ``cancel --before-start``; "A cancel is never lost").

Under READ COMMITTED a creation's probe of ``early_cancels`` and a remembered cancel's probe of
``runs`` each miss the other's uncommitted row: both used to commit, the cancel "remembered" and
the run running on. Each test holds one side open mid-statement (a third connection holds an
uncommitted row the side's insert must wait for, after its probe), lets the other side run, then
lets go: both orders are seen, each ends with the run cancelled. The first order goes through
``haltwise cancel --before-start`` in another process: the run began between its request and its
remember, so it must be cancelled as usual (the command's "it began meanwhile" branch), exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import psycopg
import pytest

import haltwise
from _wait import until
from haltwise import State

pytestmark = pytest.mark.anyio

GATE: list[anyio.Event] = []


@haltwise.tool(cancel="interruptible", effect="write")
async def wait_for_ever(text: str) -> str:
    await GATE[0].wait()  # never set: only a cancel ends the step
    return text


@haltwise.task(name="early_race:job")
async def job(text: str = "row") -> str:
    return await wait_for_ever(text)


def _waiting(url: str, locktype: str) -> bool:
    """Whether a statement of the test's database waits for a lock of ``locktype``."""
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND l.locktype = %s AND a.datname = current_database()",
            (locktype,),
        ).fetchone()
    return row is not None and row[0] > 0


async def test_a_creation_under_way_then_the_stop_the_command_cancels_it(
    pg_url: str, tmp_path: Path
) -> None:
    GATE[:] = [anyio.Event()]
    holder = await psycopg.AsyncConnection.connect(pg_url)
    async with haltwise.Runtime(pg_url) as rt, anyio.create_task_group() as tg:
        # the creation's insert waits for this uncommitted row of the same id, after its probe
        await holder.execute(
            "INSERT INTO haltwise.runs (id, task, state, inputs, created_at, updated_at) "
            "VALUES ('r1', 'held', 'pending', '{}', 0, 0)"
        )
        started: list[haltwise.TaskHandle[str]] = []

        async def start() -> None:
            started.append(await rt.start(job, task_id="r1"))

        tg.start_soon(start)
        await until(lambda: _waiting(pg_url, "transactionid"), "the creation waits on the row")
        command = [sys.executable, "-m", "haltwise", "cancel", "r1", "--before-start"]
        pressed: list[subprocess.CompletedProcess[bytes]] = []

        async def press() -> None:
            argv = [*command, "--reason", "stop", "--json", "--store", pg_url]
            pressed.append(await anyio.run_process(argv, cwd=tmp_path, check=False))

        tg.start_soon(press)
        # the command's remember waits for the creation (fixed), or is done already (the race)
        await until(
            lambda: bool(pressed) or _waiting(pg_url, "advisory"),
            "the remembered cancel waits for the creation under way, or ends",
        )
        await holder.rollback()  # the creation goes on
        await until(lambda: bool(pressed) and bool(started), "both sides end")
        answer = pressed[0]
        assert answer.returncode == 0, answer.stderr.decode()
        report = json.loads(answer.stdout)
        assert report["remembered"] == [], "the run existed when the cancel was remembered"
        assert (report["cancelled"], report["unknown"]) == (["r1"], [])
        outcome = await started[0].outcome()  # the cancel reaches the run worked here
    await holder.close()
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "stop")
    assert [step.status.value for step in outcome.steps] == ["interrupted"]


async def test_a_stop_under_way_then_the_creation_records_the_run_cancelled(
    pg_url: str,
) -> None:
    GATE[:] = [anyio.Event()]
    holder = await psycopg.AsyncConnection.connect(pg_url)
    async with (
        haltwise.Runtime(pg_url) as rt,
        haltwise.Runtime(pg_url) as pressing,
        anyio.create_task_group() as tg,
    ):
        # the remembered cancel's insert waits for this uncommitted row, after its probe of runs
        await holder.execute(
            "INSERT INTO haltwise.early_cancels (id, reason, expires_at) VALUES ('r2', 'held', 0)"
        )
        remembered: list[haltwise.RunRecord | None] = []

        async def press() -> None:
            remembered.append(await pressing.cancel("r2", reason="stop", before_start=True))

        tg.start_soon(press)
        await until(lambda: _waiting(pg_url, "transactionid"), "the remember waits on the row")
        started: list[haltwise.TaskHandle[str]] = []

        async def start() -> None:
            started.append(await rt.start(job, task_id="r2"))

        tg.start_soon(start)
        # the creation waits for the remembered cancel (fixed), or is done already (the race)
        await until(
            lambda: bool(started) or _waiting(pg_url, "advisory"),
            "the creation waits for the stop under way, or ends",
        )
        await holder.rollback()  # the remembered cancel goes on
        await until(lambda: bool(remembered) and bool(started), "both sides end")
        status = await rt.status("r2")
        if status.state is not State.CANCELLED:
            await rt.cancel("r2")  # the lost cancel, for the test to end
    await holder.close()
    assert remembered == [None], "no run had the id when the cancel was remembered"
    assert status.state is State.CANCELLED, f"the remembered cancel was lost: {status}"
    assert (status.reason, status.steps) == ("stop", ())
