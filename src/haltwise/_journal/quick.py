"""A cancel request written at once, from synchronous code, without a store's machinery.

``haltwise cancel ID`` is typed by someone in a hurry: its request should reach the run in
little more than an interpreter's start. Opening a store (:mod:`.sqlite`, :mod:`.postgres`)
means an event loop, anyio, a writer thread or a connection pool, all of which a single
request does not use. Here the same request is one transaction on one plain connection
(``sqlite3``, or psycopg's synchronous connection), with the same statements and the same
plan as :meth:`Store.request_cancels <haltwise._journal.store.Store.request_cancels>`
(:func:`~.operator_sql.plan_cancels`, the runs read by id and locked as that method reads and
locks them; a PostgreSQL request sends the same notification), so the journal cannot tell the
two apart.

Only a store that is already there, at the schema version of this code, is written here.
Anything else (no file yet, a schema to create or upgrade, a URL this path does not read, a
database error before the commit) returns ``None`` having written nothing, and the caller
opens the store as always, which creates, upgrades or says what is wrong in its own words.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from .operator_sql import OperatorSQL, plan_cancels
from .rows import CANCELLED_SELECT, cancelled_from_row, read_all
from .schema import CHANGES_CHANNEL, PG_CONNECT_TIMEOUT, POSTGRES, SCHEMA_VERSION, SQLITE
from .sqlite_url import parse_url
from .store import CancelResult

__all__ = ["postgres_cancels", "sqlite_cancels"]

_SQLITE = OperatorSQL(SQLITE)
_POSTGRES = OperatorSQL(POSTGRES)
#: the schema version this code writes, as ``haltwise_meta`` holds it
_VERSION = "SELECT value FROM {} WHERE key = 'schema_version'"
#: transactions retried after a deadlock or a serialisation failure (as the store does)
_RETRIES = 5


def sqlite_cancels(
    url: str, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    """Request the cancel of the runs ``ids`` (distinct) in the SQLite store at ``url`` in one
    ``BEGIN IMMEDIATE`` transaction, durable (the URL's ``synchronous``) when this returns; what
    the request did. ``None``, with nothing written, when the store's file or schema is not
    there as this code writes it, or SQLite refused before the commit: open the store instead.
    A row that does not parse raises :class:`~haltwise.CorruptRowError`, as the store does."""
    try:
        path, synchronous, busy_timeout = parse_url(url)
    except Exception:
        return None  # said by the store, in its words
    if not os.path.isfile(path):
        return None
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            return _sqlite_request(conn, ids, reason=reason, force=force)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _sqlite_request(
    conn: sqlite3.Connection, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    if not _current(conn.execute(_VERSION.format("haltwise_meta")).fetchone()):
        return None
    query = _SQLITE.runs_by_ids(lock=False, columns=CANCELLED_SELECT)
    rows = conn.execute(query, (_SQLITE.id_list(ids),)).fetchall()
    writes, result = plan_cancels(
        _SQLITE,
        read_all(cancelled_from_row, rows),
        ids,
        reason=reason,
        force=force,
        now=time.time(),
        dry_run=False,
    )
    for statement, parameters in writes:
        conn.execute(statement, parameters)
    conn.execute("COMMIT")
    return result


def _current(row: Any) -> bool:
    return row is not None and str(row[0]).strip() == str(SCHEMA_VERSION)


def postgres_cancels(
    url: str, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    """Request the cancel of the runs ``ids`` (distinct) in the PostgreSQL store at ``url`` in
    one transaction on one synchronous connection: the runs locked (``FOR UPDATE``), the
    store's writes, ``NOTIFY`` for the processes that work them; committed (the server's
    ``synchronous_commit``) when this returns. ``None``, with nothing written, when the schema
    is not there at this code's version or the server refused before the commit (the store,
    opened instead, says why); a server that cannot be reached raises the store's own
    :class:`~haltwise.StoreError` (trying twice would wait twice)."""
    try:
        import psycopg
        from psycopg import errors
    except ImportError:
        return None  # the store says what to install

    options: dict[str, Any] = (
        {} if "connect_timeout" in url else {"connect_timeout": PG_CONNECT_TIMEOUT}
    )
    try:
        conn = psycopg.connect(url, **options)
    except psycopg.Error as error:
        from .postgres import PostgresStore

        raise PostgresStore(url)._error(error, connecting=True) from None
    try:
        for attempt in range(1, _RETRIES + 1):
            try:
                with conn.transaction():
                    return _postgres_request(conn, ids, reason=reason, force=force)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == _RETRIES:
                    return None
            except psycopg.Error:
                return None
        return None
    finally:
        conn.close()


def _postgres_request(
    conn: Any, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    with conn.cursor() as cursor:
        cursor.execute("SELECT to_regclass('haltwise.haltwise_meta') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return None
        cursor.execute(_VERSION.format(POSTGRES.qualify("haltwise_meta")))
        if not _current(cursor.fetchone()):
            return None
        cursor.execute(
            _POSTGRES.runs_by_ids(lock=True, columns=CANCELLED_SELECT),
            (_POSTGRES.id_list(ids),),
        )
        found = read_all(cancelled_from_row, cursor.fetchall())
        writes, result = plan_cancels(
            _POSTGRES, found, ids, reason=reason, force=force, now=time.time(), dry_run=False
        )
        for statement, parameters in writes:
            cursor.execute(statement, parameters)
        if result.reached:
            # Delivered at commit, and only if it commits (as the store's _notify).
            cursor.execute(
                "SELECT pg_notify(%s, %s)", (CHANGES_CHANNEL, result.reached[0].id[:1000])
            )
    return result
