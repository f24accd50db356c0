"""DBOS Transact's side of ``bench/peers.py``, on its SQLite system database.

Steps are ``@DBOS.step()`` functions called in a ``@DBOS.workflow()``; the cancel is
``DBOS.cancel_workflow_async`` and the resume ``DBOS.resume_workflow_async``. Durable settings:
DBOS's own defaults on SQLite (it sets no journal mode or synchronous level, so SQLite's
rollback journal with ``synchronous=FULL``; ``settings`` reads them back from the database),
and for comparison the same database put in WAL mode beforehand.
DBOS is a process-wide singleton: one database per process, which ``bench/peers.py`` ensures
by running each measurement in a process of its own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _peer_common import RUN_STEPS, STEP_SECONDS, CancelTrial, Trace, cancel_moments
from dbos import DBOS, SetWorkflowID

TRACE = Trace()


@DBOS.step()
async def trivial_async(i: int) -> int:
    return i


@DBOS.workflow()
async def trivial_run_async(n: int) -> int:
    total = 0
    for i in range(n):
        total += await trivial_async(i)
    return total


@DBOS.step()
def trivial_sync(i: int) -> int:
    return i


@DBOS.workflow()
def trivial_run_sync(n: int) -> int:
    total = 0
    for i in range(n):
        total += trivial_sync(i)
    return total


@DBOS.step()
async def step(i: int) -> int:
    return await TRACE.step(i, STEP_SECONDS)


@DBOS.workflow()
async def steps_run(n: int) -> int:
    with TRACE.code():
        total = 0
        for i in range(n):
            total += await step(i)
        return total


def _launch(db: Path, *, wal: bool = False) -> None:
    if wal:  # WAL is a property of the file: DBOS's connections then use it
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
    DBOS(
        config={
            "name": "haltwise-peers",
            "system_database_url": f"sqlite:///{db}",
            "log_level": "ERROR",
        }
    )
    DBOS.launch()


def settings(db: Path, variant: str) -> str:
    """The journal mode of ``db`` and the synchronous level a connection gets by default
    (DBOS sets neither)."""
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        mode = conn.execute(sa.text("PRAGMA journal_mode")).scalar()
        level = conn.execute(sa.text("PRAGMA synchronous")).scalar()
    engine.dispose()
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={str(mode).upper()}, synchronous={names.get(int(level or 0))}"


def overhead(db: Path, steps: int, variant: str) -> float:
    """Seconds per trivial step of one workflow; ``variant`` is ``async`` or ``sync``, and
    ``-wal`` after it puts the database in WAL mode first (DBOS's default is the rollback
    journal)."""
    api, _, wal = variant.partition("-")
    _launch(db, wal=bool(wal))
    try:
        if api == "sync":
            start = time.perf_counter()
            handle = DBOS.start_workflow(trivial_run_sync, steps)
            handle.get_result()
            return (time.perf_counter() - start) / steps

        async def run() -> float:
            start = time.perf_counter()
            handle = await DBOS.start_workflow_async(trivial_run_async, steps)
            await handle.get_result()
            return (time.perf_counter() - start) / steps

        return asyncio.run(run())
    finally:
        DBOS.destroy()


async def _committed(workflow_id: str) -> set[int]:
    return {
        int(info["output"])
        for info in await DBOS.list_workflow_steps_async(workflow_id)
        if info["function_name"].endswith("step")
        and info["error"] is None
        and info["completed_at_epoch_ms"] is not None
    }


async def _trials(trials: int) -> list[CancelTrial]:
    results = []
    for k, delay in enumerate(cancel_moments(trials)):
        TRACE.reset()
        workflow_id = f"cancel-{k}"
        with SetWorkflowID(workflow_id):
            await DBOS.start_workflow_async(steps_run, RUN_STEPS)
        await asyncio.sleep(delay)
        start = time.perf_counter()
        await DBOS.cancel_workflow_async(workflow_id)
        told = time.perf_counter() - start
        status = await DBOS.get_workflow_status_async(workflow_id)
        final = time.perf_counter() - start
        assert status is not None and status.status == "CANCELLED", status
        stopped = await TRACE.stopped_after(start)
        committed = await _committed(workflow_id)
        before = TRACE.started.copy()
        handle = await DBOS.resume_workflow_async(workflow_id)
        await handle.get_result()
        rerun, twice = TRACE.repeated(committed, before)
        ok = all(TRACE.completed[i] >= 1 for i in range(RUN_STEPS))
        results.append(CancelTrial(told, final, stopped, len(committed), rerun, twice, ok))
    return results


def cancel_trials(db: Path, trials: int, variant: str) -> list[dict[str, Any]]:
    _launch(db)
    try:
        return [trial.to_json() for trial in asyncio.run(_trials(trials))]
    finally:
        DBOS.destroy()
