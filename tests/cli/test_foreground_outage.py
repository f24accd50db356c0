"""A PostgreSQL server that goes down under a run ``haltwise run`` follows: whatever meets the
outage first (the run's own next write, or the foreground's read of the run just after its
start), the command ends with the run's one line: its journal could not be written, its last
durable state stands. And leaving a runtime's block while the store is down raises the store's
error if the block raised nothing, and never replaces the block's own error with it (the landing
CI's flake of
test_cli_hardening::test_a_postgres_outage_prints_one_line_and_no_driver_log_noise: the
foreground's ``check_ours`` met the outage first, and the shutdown cancel's pool timeout was
printed instead).

In process, on a server of their own that they stop (``pg_ctl stop -m immediate``), so that the
order is the test's, not the machine's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import haltwise
from _pg import PostgresServer, create_database
from haltwise._cli.foreground import check_ours
from toolkit import Gate

pytestmark = pytest.mark.anyio

entered = Gate()
release = Gate()


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_here() -> str:
    entered.set()
    await release.wait(timeout=60)
    return "done"


@haltwise.task(name="foreground_outage:waits")
async def waits() -> str:
    return await wait_here()


def _reset() -> None:
    global entered, release
    entered, release = Gate(), Gate()


@asynccontextmanager
async def a_run_in_flight() -> AsyncIterator[tuple[PostgresServer, haltwise.Runtime, str]]:
    """A runtime on a server of its own, working a run whose step waits for ``release``."""
    _reset()
    server = PostgresServer()
    server.start()
    try:
        async with haltwise.Runtime(create_database(server.dsn)) as runtime:
            handle = await runtime.start(waits)
            await entered.wait(timeout=60)
            yield server, runtime, handle.id
    finally:
        release.set()
        server.stop()


def stop_now(server: PostgresServer) -> None:
    server._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(server.data))


async def test_a_foreground_read_that_meets_the_outage_first_leaves_it_to_the_run() -> None:
    async with a_run_in_flight() as (server, runtime, run_id):
        stop_now(server)
        await check_ours(runtime, run_id)  # its read fails: the run is worked here, it reports
        release.set()
        with pytest.raises(haltwise.StoreError, match="could not be written") as raised:
            await runtime.outcome(run_id)
        assert "\n" not in str(raised.value)


class Leaving(Exception):
    pass


async def test_leaving_the_block_while_the_store_is_down_raises_the_blocks_own_error() -> None:
    with pytest.raises(Leaving):
        async with a_run_in_flight() as (server, runtime, run_id):
            stop_now(server)
            with pytest.raises(haltwise.StoreError) as raised:
                await runtime.status(run_id)  # a read of the pool's, which times out
            raise Leaving  # __aexit__'s shutdown cancel of the run in flight cannot be recorded
    assert not runtime.is_active(run_id)  # stopped here all the same (handed over)
    # the pool's timeout in the store's own words, on one line
    message = str(raised.value)
    assert message.startswith("cannot connect to the PostgreSQL store 127.0.0.1:"), message
    assert "\n" not in message and "couldn't get a connection" not in message


async def test_leaving_the_block_normally_while_the_store_is_down_raises_the_store_error() -> None:
    with pytest.raises(haltwise.StoreError) as raised:
        async with a_run_in_flight() as (server, runtime, run_id):
            stop_now(server)  # __aexit__'s shutdown cancel of the run in flight is not recorded
    assert not runtime.is_active(run_id)  # stopped here all the same (handed over)
    message = str(raised.value)
    assert message.startswith("cannot connect to the PostgreSQL store 127.0.0.1:"), message
    assert "\n" not in message
