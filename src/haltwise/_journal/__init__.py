"""The journal: the store interface (:mod:`.store`), its SQLite and PostgreSQL implementations,
the rows they share, owner identity, and the integrity check. No layer above this one writes SQL.

This entry holds the one place that names the stores: :func:`open_store`, the URL -> store
factory (each store's module is imported only when its URL is opened).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .._core.exceptions import StoreError, install_hint
from .secrets import remember, safe_url

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .store import CancelResult, Store

DEFAULT_STORE_URL = "sqlite:///.haltwise/haltwise.db"
#: Environment variable naming the store when none is given.
STORE_ENV = "HALTWISE_STORE"


def store_url_from(url: str | None) -> str:
    """The store URL to use: ``url``, else ``$HALTWISE_STORE``, else the default SQLite file."""
    return url or os.environ.get(STORE_ENV) or DEFAULT_STORE_URL


def open_store(
    url: str | None = None, *, read_only: bool = False, works_runs: bool = True
) -> Store:
    """Build (not yet open) the store for ``url`` (see :func:`store_url_from`).

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` and ``postgresql://...``
    (or ``postgres://``) are understood; anything else raises :class:`StoreError`. The URL's
    secrets are remembered, so that no message this process prints shows them
    (:mod:`.secrets`).

    ``read_only=True`` is for commands that only look: opening then never creates, migrates or
    locks anything, waits for no other process's write lock, and raises
    :class:`~haltwise._core.exceptions.NoStoreError` if there is no store there. Only the
    reading operations may be used.

    ``works_runs=False`` is for a process that works no run (a seat: ``haltwise cancel``,
    ``status``): the store may put off what only working runs needs. PostgreSQL then opens one
    connection (its pool's), connects the step writer at a first step write, and listens for
    other connections' changes from the first :meth:`Store.wait_for_change` on; SQLite opens
    as always.
    """
    resolved = store_url_from(url)
    remember(resolved)
    if resolved.startswith("sqlite://"):
        from .sqlite import SQLiteStore

        return SQLiteStore(resolved, read_only=read_only)
    if resolved.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresStore
        except ImportError as error:
            raise StoreError(
                f"the PostgreSQL store needs psycopg: {install_hint('postgres')} ({error})"
            ) from None
        return PostgresStore(resolved, read_only=read_only, works_runs=works_runs)
    raise StoreError(
        f"unusable store URL {safe_url(resolved)!r}: expected sqlite:///PATH.db or postgresql://..."
    )


def request_cancels_now(
    url: str | None, ids: Sequence[str], *, reason: str, force: bool
) -> CancelResult | None:
    """Request the cancel of the runs ``ids`` (distinct) in the store at ``url`` (see
    :func:`store_url_from`) at once, from synchronous code, in one transaction on one plain
    connection: the request :meth:`Store.request_cancels` would write, durable when this returns
    (:mod:`.quick`). ``None``, with nothing written, when this path does not serve that store
    as it is (no store there yet, another schema version, a kind of URL it does not know):
    the caller then opens the store (:func:`open_store`) and asks it."""
    resolved = store_url_from(url)
    remember(resolved)
    if resolved.startswith("sqlite://"):
        from .quick import sqlite_cancels

        return sqlite_cancels(resolved, ids, reason=reason, force=force)
    if resolved.startswith(("postgresql://", "postgres://")):
        from .quick import postgres_cancels

        return postgres_cancels(resolved, ids, reason=reason, force=force)
    return None
