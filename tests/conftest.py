"""Shared fixtures: the anyio backend, a reset toolkit, and the stores every contract test runs on.

``store_url`` is parametrized with ``sqlite`` and ``postgres``, so a test that takes it runs once
per store (as AnyIO runs its tests once per backend). The PostgreSQL server is started once per
session, the first time a test asks for it; every test gets its own fresh database. Without
PostgreSQL binaries the ``postgres`` cases fail with the reason (``make test`` installs them:
scripts/ensure-postgres.sh); a skipped case would check nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from _pg import PostgresServer, PostgresUnavailable, create_database


@pytest.fixture
def anyio_backend() -> str:
    """The runtime is asyncio-only."""
    return "asyncio"


@pytest.fixture
def fresh_toolkit() -> None:
    """tests/toolkit.py with no counts and fresh gates (a module asks for it with
    ``pytest.mark.usefixtures("fresh_toolkit")``)."""
    import toolkit  # here, not at the top: only the tests that use the toolkit load its tools

    toolkit.reset()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The URL of a PostgreSQL server (its ``postgres`` database) for this test session."""
    external = os.environ.get("HALTWISE_TEST_PG_DSN")
    if external:
        yield external
        return
    try:
        server = PostgresServer()
    except PostgresUnavailable as error:
        pytest.fail(f"{error} (make test installs PostgreSQL: scripts/ensure-postgres.sh)")
    try:
        server.start()
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """A fresh PostgreSQL database on the session's server."""
    return create_database(pg_dsn)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite store in a fresh directory."""
    return f"sqlite:///{tmp_path}/haltwise.db"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each kind: the test runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/haltwise.db"
    url: str = request.getfixturevalue("pg_url")
    return url
