"""Prepared statements run through libpq directly, for the PostgreSQL step writer's hot path.

The step writer (:mod:`.postgres_steps`) runs the same few statements all the time on a
connection of its own. Through psycopg's cursor each execution cost ~35 us of Python on top of
libpq's own work (the cursor, the adaptation of every parameter, the prepared-statement cache,
a timer per wait, the row maker): a fifth of a sequential step's client CPU. Here a statement is
prepared once per connection (:meth:`Prepared.ensure`) and executed with ``PQsendQueryPrepared``
on psycopg's own libpq connection (``psycopg.pq``, wrapped by a :class:`Wire`), parameters
encoded as text by :func:`encode` and cast by the statement, results read as text.

Nothing else uses the connection while a statement runs (the writer is its only user, one
statement at a time). A driver error is raised as psycopg raises it
(``psycopg.errors.error_from_result``: the same classes, e.g. ``DeadlockDetected``); a broken
connection raises ``OperationalError`` and reads ``closed`` afterwards, as with psycopg's API.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result
from psycopg.rows import DictRow

_Conn = psycopg.AsyncConnection[DictRow]
#: a prepared statement is planned again after this many executions, or this many seconds
REPLAN_EXECUTIONS = 1000
REPLAN_SECONDS = 60.0
#: a row of a result, each value as the server's text (None: NULL)
Row = tuple[bytes | None, ...]


def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders numbered for the server (``$1``, ``$2``...)."""
    if "%%" in sql or re.search(r"%[^s]", sql):
        raise ValueError("a statement for Prepared may hold no % but its %s placeholders")
    count = iter(range(1, sql.count("%s") + 1))
    return re.sub("%s", lambda _: f"${next(count)}", sql)


def encode(value: Any) -> bytes | None:
    """A parameter as the text PostgreSQL reads (the statement casts it to its column's type).

    Text holding a NUL character is refused with psycopg's own error (``DataError``), as its
    text dumper refuses it: libpq would cut a text parameter at a NUL byte.
    """
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return value.encode()  # type: ignore[no-any-return]
    if value is None:
        return None
    if kind is bool:
        return b"t" if value else b"f"
    if kind is int:
        return str(value).encode()
    if kind is float:
        if math.isfinite(value):
            return repr(value).encode()
        return b"NaN" if math.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"
    return encode(str(value))


class Wire:
    """One connection's libpq end, used by one task at a time: the statements prepared on it,
    and a reader kept registered with the event loop for as long as it is attached (instead of
    one registration per wait). Detach it before the connection is closed."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        #: the statements prepared on this connection: name -> (executions left before it is
        #: planned again, the loop's clock when it was planned)
        self.prepared: dict[bytes, tuple[int, float]] = {}
        self._loop = asyncio.get_running_loop()
        self.clock = self._loop.time
        self._fd = self.pgconn.socket
        self._waiting: asyncio.Future[None] | None = None
        self._loop.add_reader(self._fd, self._readable)
        self._attached = True

    @property
    def usable(self) -> bool:
        """Whether statements can run here (attached, and the connection not closed)."""
        return self._attached and not self.conn.closed

    def detach(self) -> None:
        """Stop watching the connection (before closing it)."""
        if self._attached:
            self._attached = False
            self._loop.remove_reader(self._fd)

    def _readable(self) -> None:
        waiting = self._waiting
        if waiting is not None:
            if not waiting.done():
                waiting.set_result(None)
            return
        # Nobody waits (a notice, or the server closing the connection): read it, so that the
        # reader does not fire again and again; a closed connection is replaced at next use.
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError:
            self.detach()

    async def results(self) -> list[pq.abc.PGresult]:
        """Send what is buffered, then read every result of the statement sent; raise the
        first error."""
        pgconn = self.pgconn
        while pgconn.flush():  # 1: not all sent yet
            await _writable(self._loop, self._fd)
        results = []
        while True:
            while pgconn.is_busy():
                if not self._attached:
                    raise psycopg.OperationalError("the connection was closed")
                self._waiting = self._loop.create_future()
                try:
                    await self._waiting
                finally:
                    self._waiting = None
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                break
            results.append(result)
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise error_from_result(result, encoding="utf-8")
        if not results:  # pragma: no cover - a sent statement always has a result
            raise psycopg.OperationalError("the server sent no result")
        return results


@dataclass(frozen=True, slots=True)
class Prepared:
    """One statement, prepared under ``name`` on each connection that runs it."""

    name: bytes
    #: the statement with ``%s`` placeholders (as the rest of the store writes them)
    sql: str

    async def ensure(self, wire: Wire) -> None:
        """Have the statement prepared on ``wire``'s connection, with a plan made recently.

        The plan is generic (made once, whatever the parameters), from the tables' sizes when
        it was made: one made while the journal was nearly empty may scan a table that has
        since grown. So a statement is planned again after :data:`REPLAN_EXECUTIONS`
        executions or :data:`REPLAN_SECONDS` (a millisecond or so of the server's time).
        """
        left, planned = wire.prepared.get(self.name, (0, 0.0))
        now = wire.clock()
        if left > 0 and now - planned < REPLAN_SECONDS:
            wire.prepared[self.name] = (left - 1, planned)
            return
        if self.name in wire.prepared:
            del wire.prepared[self.name]
            wire.pgconn.send_query(b"DEALLOCATE " + self.name)
            await wire.results()
        wire.pgconn.send_prepare(self.name, _numbered(self.sql).encode())
        await wire.results()
        wire.prepared[self.name] = (REPLAN_EXECUTIONS, now)

    async def rows(self, wire: Wire, values: Sequence[Any]) -> list[Row]:
        """Execute the statement with ``values`` (in autocommit mode: it commits on its own)
        and return the rows of its result."""
        await self.ensure(wire)
        wire.pgconn.send_query_prepared(self.name, [encode(value) for value in values])
        result = (await wire.results())[-1]
        value, columns = result.get_value, range(result.nfields)
        # A list per row, not a generator: a generator is resumed once per value.
        return [tuple([value(i, j) for j in columns]) for i in range(result.ntuples)]


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until ``fd`` can be written."""
    ready = loop.create_future()
    loop.add_writer(fd, _set, ready)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


def _set(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def flag(value: bytes | None) -> bool:
    """A boolean as the server writes it in text (``t``/``f``; NULL is false)."""
    return value == b"t"


def number(value: bytes | None) -> int | None:
    """An integer as the server writes it in text (NULL: None)."""
    return None if value is None else int(value)


def text(value: bytes | None) -> str | None:
    """Text as the server sends it (UTF-8; NULL: None)."""
    return None if value is None else value.decode()
