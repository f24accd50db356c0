"""Schema migrations: an older store is upgraded in place when opened, a newer one refused.

``tests/fixtures/store-v1.db`` was written by haltwise at schema version 1 (the agent that made
it is beside it). Opening it with this code upgrades it in one transaction, after which its
tables have exactly the columns, indexes and triggers of a new store, and every run in it reads
as before. The same holds for a PostgreSQL schema created with version 1's statements.
``tests/fixtures/store-v8.db`` (version 8, its change feed numbered by ``AUTOINCREMENT``) keeps
every change and its number through the table's rebuild, and numbers new ones above all of them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import haltwise
from _paths import TESTS
from haltwise._core.exceptions import StoreError
from haltwise._core.states import State, StepStatus
from haltwise._journal import open_store, schema
from haltwise._journal.schema import SCHEMA_VERSION

pytestmark = pytest.mark.anyio

FIXTURE = TESTS / "fixtures" / "store-v1.db"
V8_FIXTURE = TESTS / "fixtures" / "store-v8.db"

#: What the fixture holds (written by tests/fixtures/agent_v1.py).
V1_RUNS = {
    "done-1": State.COMPLETED,
    "done-1/1": State.COMPLETED,
    "failed-1": State.FAILED,
    "cancelled-1": State.CANCELLED,
}

#: Version 1's PostgreSQL statements, as haltwise 0b15400 ran them.
PG_V1 = """
CREATE TABLE haltwise.haltwise_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE haltwise.runs (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, state TEXT NOT NULL, inputs TEXT NOT NULL,
    reason TEXT, force BOOLEAN NOT NULL DEFAULT FALSE, result TEXT, error TEXT,
    cancel_error TEXT, owner TEXT, owner_token TEXT, lease_until DOUBLE PRECISION, parent TEXT,
    created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX runs_by_state ON haltwise.runs (state);
CREATE INDEX runs_by_owner ON haltwise.runs (owner_token);
CREATE TABLE haltwise.steps (
    run_id TEXT NOT NULL, idx INTEGER NOT NULL, tool TEXT NOT NULL, cancel TEXT,
    effect TEXT NOT NULL, idempotent BOOLEAN NOT NULL, status TEXT NOT NULL,
    attempts INTEGER NOT NULL, result TEXT, error TEXT, idem_key TEXT NOT NULL, args TEXT,
    cleanup BOOLEAN NOT NULL DEFAULT FALSE,
    started_at DOUBLE PRECISION NOT NULL, settled_at DOUBLE PRECISION,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE haltwise.partials (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE haltwise.events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id TEXT NOT NULL, source TEXT,
    target TEXT NOT NULL, reason TEXT, at DOUBLE PRECISION NOT NULL
);
CREATE INDEX events_by_run ON haltwise.events (run_id, seq);
INSERT INTO haltwise.haltwise_meta VALUES ('schema_version', '1');
INSERT INTO haltwise.runs (id, task, state, inputs, reason, created_at, updated_at)
    VALUES ('old-1', 'agent.py:research', 'cancelled', '{"args": [], "kwargs": {}}', 'user', 1, 2);
INSERT INTO haltwise.steps (run_id, idx, tool, cancel, effect, idempotent, status, attempts,
                            result, idem_key, started_at, settled_at)
    VALUES ('old-1', 0, 'search', 'interruptible', 'read', FALSE, 'committed', 1, '["a"]',
            'old-1:0', 1, 1.5);
INSERT INTO haltwise.partials VALUES ('old-1', 0, '{"hit": "a"}');
INSERT INTO haltwise.events (run_id, source, target, reason, at)
    VALUES ('old-1', NULL, 'running', NULL, 1), ('old-1', 'running', 'cancelling', 'user', 1.7),
           ('old-1', 'cancelling', 'cancelled', 'user', 2);
"""


def sqlite_shape(path: Path) -> dict[str, Any]:
    """Every table's columns (name, type, not null, default, key) and whether its key is
    ``AUTOINCREMENT``, every index's columns, and the triggers' names and tables."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall()
        shape: dict[str, Any] = {}
        for table, sql in sorted(tables):
            columns = conn.execute(f"PRAGMA table_info({table})").fetchall()
            shape[table] = (columns, "AUTOINCREMENT" in (sql or "").upper())
        shape["triggers"] = conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type='trigger' ORDER BY name"
        ).fetchall()
        for (index,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='index' AND name NOT LIKE 'sqlite_%'"
        ):
            shape[f"index {index}"] = conn.execute(f"PRAGMA index_info({index})").fetchall()
        shape["version"] = conn.execute(
            "SELECT value FROM haltwise_meta WHERE key='schema_version'"
        ).fetchone()
        return shape


@pytest.fixture
def v1_copy(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    shutil.copy(FIXTURE, path)
    return path


async def test_the_v1_fixture_is_upgraded_in_place_to_a_new_stores_shape(
    v1_copy: Path, tmp_path: Path
) -> None:
    assert sqlite_shape(v1_copy)["version"] == ("1",)
    upgraded = open_store(f"sqlite:///{v1_copy}")
    await upgraded.open()
    fresh = open_store(f"sqlite:///{tmp_path / 'new.db'}")
    await fresh.open()
    try:
        for run_id, state in V1_RUNS.items():
            snapshot = await upgraded.load(run_id)
            assert snapshot.run.state is state
        done = await upgraded.load("done-1")
        assert [step.status for step in done.steps] == [StepStatus.COMMITTED] * 3
        assert done.partials == ({"hit": "cats-0"}, {"hit": "cats-1"})
        assert done.outcome().result == "receipt-42"
    finally:
        await upgraded.close()
        await fresh.close()
    assert sqlite_shape(v1_copy) == sqlite_shape(tmp_path / "new.db")
    assert sqlite_shape(v1_copy)["version"] == (str(SCHEMA_VERSION),)


def test_the_command_line_reads_every_run_of_an_upgraded_store(v1_copy: Path) -> None:
    def haltwise(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haltwise", *args, "--store", f"sqlite:///{v1_copy}"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = haltwise("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {row["id"]: row["state"] for row in json.loads(listed.stdout)["runs"]} == {
        run_id: state.value for run_id, state in V1_RUNS.items()
    }
    status = haltwise("status", "cancelled-1", "--json")
    assert status.returncode == 3 or status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["reason"] == "budget"
    check = haltwise("check", "--json")
    assert check.returncode == 0, check.stdout
    assert json.loads(check.stdout)["ok"] is True


def sqlite_rows(path: Path, query: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query).fetchall()


async def test_a_v8_store_keeps_every_change_and_numbers_new_ones_above_all_it_gave_out(
    tmp_path: Path,
) -> None:
    from haltwise import Runtime
    from haltwise._runtime.operator import feed

    path = tmp_path / "v8.db"
    shutil.copy(V8_FIXTURE, path)
    old = sqlite_rows(path, "SELECT seq, run_id, kind, idx, status, at FROM changes ORDER BY seq")
    (counter,) = sqlite_rows(path, "SELECT seq FROM sqlite_sequence WHERE name = 'changes'")[0]
    assert counter > old[-1][0]  # the fixture's newest run was pruned after its changes
    upgraded = open_store(f"sqlite:///{path}")
    await upgraded.open()
    try:
        changes, _ = await upgraded.changes_after(0, limit=100)
        assert [change.seq for change in changes[:-1]] == [row[0] for row in old]
        assert [(c.run_id, c.kind, c.index, c.status, c.at) for c in changes[:-1]] == [
            row[1:] for row in old
        ]
        assert (changes[-1].seq, changes[-1].run_id) == (counter, "")  # the high-water mark
        fed = []
        with anyio.fail_after(30):
            async for change in feed(upgraded, 0, None):
                fed.append(change)
                if change.seq == old[-1][0]:
                    break
        assert fed == changes[:-1]
    finally:
        await upgraded.close()
    fresh = open_store(f"sqlite:///{tmp_path / 'new.db'}")
    await fresh.open()
    await fresh.close()
    assert sqlite_shape(path) == sqlite_shape(tmp_path / "new.db")
    assert sqlite_rows(path, "SELECT name FROM sqlite_sequence WHERE name = 'changes'") == []
    async with Runtime(f"sqlite:///{path}") as runtime:
        handle = await runtime.start(_one_step, task_id="after-upgrade")
        assert (await handle.outcome()).result == "done"
    new = sqlite_rows(path, "SELECT seq FROM changes WHERE run_id = 'after-upgrade' ORDER BY seq")
    assert [row[0] for row in new] == list(range(counter + 1, counter + 1 + len(new)))
    assert len(new) >= 5  # created, running, the step started and settled, completed


@haltwise.tool(cancel="interruptible", effect="read")
async def _lookup() -> str:
    return "done"


@haltwise.task
async def _one_step() -> str:
    return await _lookup()


def test_check_list_and_prune_work_on_a_v8_store(tmp_path: Path) -> None:
    path = tmp_path / "v8.db"
    shutil.copy(V8_FIXTURE, path)

    def haltwise_cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "haltwise", *args, "--store", f"sqlite:///{path}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done

    # check and list only read (the store stays at version 8); prune upgrades it, then deletes
    # every run, the newest change becoming the high-water mark the migration left.
    assert json.loads(haltwise_cli("check", "--json").stdout)["ok"] is True
    listed = json.loads(haltwise_cli("list", "--json").stdout)["runs"]
    assert {row["id"] for row in listed} == {"kept-1", "kept-2"}
    assert sqlite_rows(path, "SELECT value FROM haltwise_meta") == [("8",)]
    pruned = json.loads(haltwise_cli("prune", "--older-than", "0s", "--json").stdout)
    assert sorted(pruned["pruned"]) == ["kept-1", "kept-2"]
    assert sqlite_rows(path, "SELECT value FROM haltwise_meta") == [(str(SCHEMA_VERSION),)]
    assert sqlite_rows(path, "SELECT seq, run_id FROM changes") == [(21, "")]
    assert json.loads(haltwise_cli("check", "--json").stdout) == {
        "ok": True,
        "runs": 0,
        "findings": [],
    }


async def test_a_failed_migration_leaves_the_store_at_its_old_version(
    v1_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = sqlite_shape(v1_copy)
    broken = schema.Migration(
        SCHEMA_VERSION + 1,
        "a change that cannot apply",
        (
            schema.Index("fine_index", "runs", ("reason",)),
            schema.AddColumn("no_such_table", schema.Column("x", schema.Kind.TEXT)),
        ),
    )
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, broken))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    store = open_store(f"sqlite:///{v1_copy}")
    with pytest.raises(StoreError):
        await store.open()
    await store.close()
    assert sqlite_shape(v1_copy) == before  # not even the migrations before the broken one


async def test_an_unreadable_schema_version_is_one_clear_error(v1_copy: Path) -> None:
    with contextlib.closing(sqlite3.connect(v1_copy)) as conn:
        conn.execute("UPDATE haltwise_meta SET value = 'abc' WHERE key = 'schema_version'")
        conn.commit()
    store = open_store(f"sqlite:///{v1_copy}")
    with pytest.raises(StoreError, match="unreadable schema version") as caught:
        await store.open()
    await store.close()
    assert "\n" not in str(caught.value)


async def pg_shape(url: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'haltwise' "
            "ORDER BY table_name, ordinal_position"
        )
        columns = await cursor.fetchall()
        cursor = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'haltwise' "
            "ORDER BY indexname"
        )
        indexes = await cursor.fetchall()
        cursor = await conn.execute(
            "SELECT event_object_table, trigger_name, event_manipulation, action_timing "
            "FROM information_schema.triggers WHERE trigger_schema = 'haltwise' ORDER BY 1, 2, 3"
        )
        triggers = await cursor.fetchall()
        cursor = await conn.execute(
            "SELECT value FROM haltwise.haltwise_meta WHERE key = 'schema_version'"
        )
        version = await cursor.fetchone()
    return {"columns": columns, "indexes": indexes, "triggers": triggers, "version": version}


async def test_a_v1_postgres_schema_is_upgraded_in_place(pg_dsn: str) -> None:
    from _pg import create_database

    old_url, new_url = create_database(pg_dsn), create_database(pg_dsn)
    async with await psycopg.AsyncConnection.connect(old_url, autocommit=True) as conn:
        await conn.execute("CREATE SCHEMA haltwise")
        for statement in filter(str.strip, PG_V1.split(";")):
            await conn.execute(statement)  # type: ignore[call-overload]
    upgraded, fresh = open_store(old_url), open_store(new_url)
    await upgraded.open()
    await fresh.open()
    try:
        snapshot = await upgraded.load("old-1")
        assert snapshot.run.state is State.CANCELLED and snapshot.run.reason == "user"
        assert [step.status for step in snapshot.steps] == [StepStatus.COMMITTED]
        assert snapshot.partials == ({"hit": "a"},)
    finally:
        await upgraded.close()
        await fresh.close()
    old_shape, new_shape = await pg_shape(old_url), await pg_shape(new_url)
    assert old_shape == new_shape
    assert old_shape["version"] == (str(SCHEMA_VERSION),)


#: the migration that drops PostgreSQL's row trigger on steps (the step statements write the feed)
STEP_TRIGGER_DROPPED = next(
    migration.version
    for migration in schema.MIGRATIONS
    for change in migration.changes
    if isinstance(change, schema.Trigger) and any("changes_on_step" in s for s in change.postgresql)
)
#: the change feed on PostgreSQL before that migration: a row trigger on steps too
PG_STEP_TRIGGER = (
    "CREATE OR REPLACE FUNCTION haltwise.record_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN IF TG_TABLE_NAME = 'events' THEN INSERT INTO haltwise.changes "
    "(run_id, kind, idx, status, at) VALUES (NEW.run_id, 'transition', NEW.seq, NEW.target, 0); "
    "ELSIF TG_TABLE_NAME = 'steps' THEN INSERT INTO haltwise.changes "
    "(run_id, kind, idx, status, at) VALUES (NEW.run_id, 'step', NEW.idx, NEW.status, 0); "
    "ELSE INSERT INTO haltwise.changes (run_id, kind, idx, status, at) "
    "VALUES (NEW.run_id, 'partial', NEW.seq, NULL, 0); END IF; RETURN NULL; END $$",
    "CREATE OR REPLACE TRIGGER changes_on_step AFTER INSERT OR UPDATE OF status ON haltwise.steps "
    "FOR EACH ROW EXECUTE FUNCTION haltwise.record_change()",
)


async def test_a_postgres_store_with_the_step_trigger_records_each_step_change_once_upgraded(
    pg_dsn: str,
) -> None:
    # Since STEP_TRIGGER_DROPPED a step's change is written by the statement that writes the
    # step: the older trigger must be gone, or every step write would be in the feed twice.
    from _pg import create_database
    from haltwise._core.policy import Effect
    from haltwise._core.records import Owner
    from haltwise._journal.store import NewRun, StepStart

    url = create_database(pg_dsn)
    store = open_store(url)
    await store.open()
    await store.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for statement in PG_STEP_TRIGGER:
            await conn.execute(statement)  # type: ignore[call-overload]
        await conn.execute(
            "UPDATE haltwise.haltwise_meta SET value = %s WHERE key = 'schema_version'",
            (str(STEP_TRIGGER_DROPPED - 1),),
        )
    owner = Owner(token="t", host="h", pid=1, started=1.0)
    store = open_store(url)
    await store.open()
    try:
        await store.create_run(
            NewRun(id="r", task="t", inputs={}, state=State.RUNNING, owner=owner)
        )
        start = StepStart(0, "tool", "finish", Effect.WRITE, False, "k")
        await store.start_step("r", start, fence="t")
        await store.settle_step("r", 0, StepStatus.COMMITTED, result=1, fence="t")
        changes, _ = await store.changes_after(0, limit=100)
    finally:
        await store.close()
    steps = [(c.index, c.status) for c in changes if c.kind == "step"]
    assert steps == [(0, "running"), (0, "committed")]
    shape = await pg_shape(url)
    assert shape["version"] == (str(SCHEMA_VERSION),)
    assert "changes_on_step" not in {trigger[1] for trigger in shape["triggers"]}


async def test_every_query_of_runs_by_state_searches_an_index_on_sqlite(tmp_path: Path) -> None:
    # Since version 11 runs_by_state_created (state, created_at) is the only index by state
    # (runs_by_state, its prefix, dropped): each of these still searches it, none scans runs
    # (the watcher's read after a bulk cancel, _CANCELLING_NEWS, and the claim among them).
    from haltwise._journal import sqlite as sqlite_store

    store = open_store(f"sqlite:///{tmp_path / 'plans.db'}")
    await store.open()
    await store.close()
    ops, sql = sqlite_store._OPS, sqlite_store._SQL
    queries: list[tuple[str, Any]] = [
        (sqlite_store._CANCELLING, ()),
        (sqlite_store._CANCELLING_NEWS, (ops.id_list(["a", "b"]),)),
        sql.list_runs(State.RUNNING),
        ops.active_runs(states=(), tasks=None, lock=False),
        ops.active_runs(states=(State.RUNNING,), tasks=["t"], lock=False),
        ops.run_page(states=(State.RUNNING,), tasks=None, limit=10, before=None),
        (ops.prunable((), lock=False)[0], [*ops.prunable((), lock=False)[1], 1.0]),
    ]
    with contextlib.closing(sqlite3.connect(tmp_path / "plans.db")) as conn:
        for query, parameters in queries:
            plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", parameters)]
            assert plan[0].endswith("USING INDEX runs_by_state_created (state=?)"), (query, plan)
        # the claim updates its runs by id, picked by a subquery that searches the state index
        claim = sqlite_store._claim_query(2)
        plan = [
            row[-1]
            for row in conn.execute(f"EXPLAIN QUERY PLAN {claim}", ("o", "t", 1.0, "a", "b", 5))
        ]
        assert plan[0].endswith("(id=?)"), plan
        assert any(line.endswith("USING INDEX runs_by_state_created (state=?)") for line in plan), (
            plan
        )
        assert not any(line.startswith("SCAN runs") for line in plan), plan


def test_cancel_on_an_older_store_upgrades_it_and_answers_as_on_a_new_one(v1_copy: Path) -> None:
    """``haltwise cancel ID`` writes its request without opening the store only on a store at
    this code's schema version (issue 35): on an older one it writes nothing that way, and the
    store, opened as before, upgrades it and answers."""
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "cancel", "done-1", "--store", f"sqlite:///{v1_copy}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "run done-1 is already completed; nothing to cancel" in done.stdout
    assert sqlite_rows(v1_copy, "SELECT value FROM haltwise_meta") == [(str(SCHEMA_VERSION),)]
