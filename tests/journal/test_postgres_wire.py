"""The PostgreSQL step writer's statements through libpq directly (``_journal/postgres_wire``):
parameters as the server reads them, errors as psycopg raises them, plans made again as the
journal grows. Against a real PostgreSQL server."""

from __future__ import annotations

import math

import psycopg
import pytest
from psycopg.rows import dict_row

from haltwise._journal import postgres_wire
from haltwise._journal.postgres_wire import Prepared, Wire, encode, flag, number, text

pytestmark = pytest.mark.anyio

ECHO = Prepared(
    b"haltwise_test_echo",
    "SELECT %s::text, %s::integer, %s::double precision, %s::boolean, %s::text",
)
PLANNED = Prepared(
    b"haltwise_test_planned",
    "SELECT prepare_time::text FROM pg_prepared_statements WHERE name = 'haltwise_test_planned'",
)


async def connected(url: str) -> Wire:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    await conn.execute("SET client_encoding = 'UTF8'")
    return Wire(conn)


async def close(wire: Wire) -> None:
    wire.detach()
    await wire.conn.close()


async def test_parameters_reach_the_server_as_they_were(pg_url: str) -> None:
    wire = await connected(pg_url)
    try:
        for values in [
            ("héllo ✓", 7, 0.1 + 0.2, True, None),
            ("", -(2**31), 1e300, False, "x"),
            ("'; DROP TABLE x; --", 0, -0.0, True, "\\"),
        ]:
            (row,) = await ECHO.rows(wire, values)
            assert text(row[0]) == values[0] and number(row[1]) == values[1]
            assert row[2] is not None and float(row[2]) == values[2]
            assert flag(row[3]) is values[3] and text(row[4]) == values[4]
        (row,) = await ECHO.rows(wire, ("a", 1, math.inf, False, None))
        assert row[2] == b"Infinity"
    finally:
        await close(wire)


async def test_errors_are_psycopgs_own_and_the_connection_goes_on(pg_url: str) -> None:
    wire = await connected(pg_url)
    try:
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            await ECHO.rows(wire, ("a", 2**40, 1.0, True, None))
        with pytest.raises(psycopg.DataError, match="NUL"):
            encode("a\x00b")
        assert len(await ECHO.rows(wire, ("a", 1, 1.0, True, None))) == 1
    finally:
        await close(wire)


async def test_a_statement_is_planned_again_after_its_executions(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A generic plan made while the journal was empty must not stay for the connection's life.
    monkeypatch.setattr(postgres_wire, "REPLAN_EXECUTIONS", 3)
    wire = await connected(pg_url)
    try:
        times = [text((await PLANNED.rows(wire, ()))[0][0]) for _ in range(8)]
    finally:
        await close(wire)
    assert times[0] == times[1] == times[2] == times[3]  # planned once, then 3 more executions
    assert times[4] != times[3] and times[4] == times[7]  # planned again, then kept
