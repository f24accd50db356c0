"""kill -9 while several steps of one run are in flight, then takeover: nothing lost or repeated."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
from collections import Counter
from pathlib import Path

import anyio
import psycopg

import haltwise
from _crash_kit import kill_and_resume, spawn, wait_started
from _paths import TESTS
from _wait import wait_until
from haltwise import State, StepStatus

AGENT = TESTS / "concurrent_crash_agent.py"
ROUNDS = 6


def running_steps(store: str, run_id: str) -> int:
    """Steps of ``run_id`` journaled running, read straight from the store (fast: a poll)."""
    if not store.startswith("sqlite:"):
        with psycopg.connect(store, autocommit=True) as conn:
            try:
                found = conn.execute(
                    "SELECT count(*) FROM haltwise.steps WHERE run_id = %s AND status = 'running'",
                    (run_id,),
                ).fetchone()
            except psycopg.errors.UndefinedTable:  # the schema is not there yet
                return 0
        return int(found[0]) if found else 0
    path = store.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as conn:
        try:
            row = conn.execute(
                "SELECT count(*) FROM steps WHERE run_id = ? AND status = 'running'", (run_id,)
            ).fetchone()
        except sqlite3.OperationalError:  # the schema is not there yet
            return 0
    return int(row[0])


FIRST_ROUND = ["charge 1", "look 0", "look 3", "note 2"]


def first_round_entered(store: str, run_id: str, world: Path) -> bool:
    """Whether the four steps of the first round are journaled running and their bodies ran."""
    log = world / "executions"
    entered = sorted(log.read_text().splitlines()) if log.exists() else []
    return entered == FIRST_ROUND and running_steps(store, run_id) == 4


def kill_in_the_first_round(store: str, run_id: str, world: Path) -> None:
    """Start the agent with its steps held (the world's ``hold`` file) and kill -9 it once the
    four steps of its first round are in flight together; then lift the hold."""
    (world / "hold").touch()
    proc = spawn(store, run_id, world, AGENT)
    try:
        wait_started(proc)
        wait_until(
            lambda: first_round_entered(store, run_id, world),
            "the four steps in flight together",
            process=proc,
            timeout=60,
            interval=0.005,
        )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        (world / "hold").unlink()


def check(store: str, run_id: str, world: Path, kills: int) -> None:
    async def load() -> haltwise.Outcome:
        async with haltwise.Runtime(store) as rt:
            return await rt.status(run_id)

    outcome = anyio.run(load)
    assert outcome.state is State.COMPLETED
    kinds = ("look", "charge", "note", "look")
    values = (lambda i: i * 2, lambda i: f"charged-{i}", lambda i: f"note-{i}", lambda i: i * 2)
    assert outcome.result == [[values[k](4 * r + k) for k in range(4)] for r in range(ROUNDS)]
    assert list(outcome.partials) == [{"round": r} for r in range(ROUNDS)]
    executions = Counter(line for line in (world / "executions").read_text().splitlines())
    for step in outcome.steps:
        assert step.status is StepStatus.COMMITTED
        number = int(str(step.call_id).removeprefix("call-"))
        ran = executions[f"{kinds[number % 4]} {number}"]
        assert 1 <= ran <= step.attempts, (step, ran)
    for number in range(2, 4 * ROUNDS, 4):
        assert (world / f"w-{number}").read_text().splitlines() == [str(number)], "written twice"
    reruns = sum(count - 1 for line, count in executions.items() if not line.startswith("undo"))
    assert reruns <= 4 * kills, "at most the steps in flight run again after a kill"
    charges: dict[str, set[str]] = {}
    for line in (world / "charges").read_text().splitlines():
        number, key = line.split()
        charges.setdefault(number, set()).add(key)
    assert len(charges) == ROUNDS
    assert all(len(keys) == 1 for keys in charges.values()), "a charge changed its key"
    report = haltwise.verify_store(store)
    assert report.ok, report.findings


def test_kill_9_with_concurrent_steps_in_flight_then_takeover(
    store_url: str, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    kill_in_the_first_round(store_url, "c0", world)
    assert first_round_entered(store_url, "c0", world)
    dead = haltwise.verify_store(store_url)
    assert {f.code for f in dead.findings} == {"orphaned-step"}, dead.findings
    kills = 1 + kill_and_resume(store_url, "c0", world, random.Random(5), AGENT)
    check(store_url, "c0", world, kills)


def test_kill_9_at_random_moments_with_concurrent_steps(sqlite_url: str, tmp_path: Path) -> None:
    rng = random.Random(17)
    for round_ in range(3):
        world = tmp_path / f"world{round_}"
        world.mkdir()
        kills = kill_and_resume(sqlite_url, f"k{round_}", world, rng, AGENT)
        check(sqlite_url, f"k{round_}", world, kills)
