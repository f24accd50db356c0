"""A seat (a process that works no run: ``haltwise cancel``, ``status``) on PostgreSQL holds one
connection, its pool's; it listens for changes only once it waits for one, and a runtime, which
works runs, holds its pool's working connections, its listener and its step writer's
connections from the start.

Counted on the server itself (``pg_stat_activity`` of the test's own database).
"""

from __future__ import annotations

import time

import psycopg
import pytest

import haltwise
from haltwise._journal.postgres import POOL_WORKING
from haltwise._journal.postgres_steps import LANES
from haltwise._runtime.seat import open_seat, reading

pytestmark = pytest.mark.anyio


def connections(url: str, expected: int) -> int:
    """Connections to ``url``'s database other than this count's own, once they number
    ``expected`` (or after 30 s: a closed connection's server process ends a little later)."""
    deadline = time.monotonic() + 30.0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert row is not None
            if int(row[0]) == expected or time.monotonic() > deadline:
                return int(row[0])
            time.sleep(0.01)  # the poll's interval


async def test_a_seat_opens_one_connection_and_listens_once_it_waits(pg_url: str) -> None:
    async with haltwise.Runtime(pg_url):  # creates the store; a runtime works runs
        working = POOL_WORKING + 1 + LANES  # its pool's, its listener's, its step writer's
        assert connections(pg_url, working) == working
    assert connections(pg_url, 0) == 0
    async with open_seat(pg_url) as seat:
        assert connections(pg_url, 1) == 1
        missing = await seat.list_runs()
        assert missing.runs == ()
        await seat.wait_for_change(0.05)  # the listener starts here
        assert connections(pg_url, 2) == 2
    async with reading(pg_url) as looking:
        assert looking is not None
        assert connections(pg_url, 1) == 1
    assert connections(pg_url, 0) == 0
