"""Journal rows that do not parse (issue 15, item 1), on both stores, through real processes.

Each case edits one row of a real store the way a person with a SQL prompt (or a bug) could:
a state that is no state, JSON that is not JSON, a garbage owner, an unknown step status or
effect, a partial that is not JSON, an event naming an unknown state, an error object without
its ``type``. ``check`` must report each as a finding (exit 1); every other command must name the
row in one line and exit 2; a worker must skip the run and go on working the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from _cli_kit import PATIENCE, Env, error_line
from _pg import create_database
from haltwise._core.exceptions import CorruptRowError
from haltwise._core.records import RunRecord
from haltwise._journal import rows
from haltwise._journal.owner import new_owner

AGENT = """
import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def search(topic: str) -> list:
    return [topic + "-a"]


@haltwise.task
async def quick(topic: str = "x"):
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
    return "ok"
"""

#: run id -> the statement that makes one of its rows unreadable ({t} is the table prefix)
CORRUPTIONS = {
    "state": "UPDATE {t}runs SET state = 'bogus' WHERE id = 'state'",
    "inputs": "UPDATE {t}runs SET inputs = '{{not json' WHERE id = 'inputs'",
    "owner": "UPDATE {t}runs SET owner = 'garbage' WHERE id = 'owner'",
    "status": "UPDATE {t}steps SET status = 'weird' WHERE run_id = 'status'",
    "effect": "UPDATE {t}steps SET effect = 'weird' WHERE run_id = 'effect'",
    "partial": "UPDATE {t}partials SET value = '{{nope' WHERE run_id = 'partial'",
    "event": "UPDATE {t}events SET target = 'zzz' WHERE run_id = 'event' AND source IS NOT NULL",
    "error": """UPDATE {t}runs SET error = '{{"message": "x"}}' WHERE id = 'error'""",
    "deep": "UPDATE {t}runs SET result = '" + "[" * 50_000 + "]" * 50_000 + "' WHERE id = 'deep'",
    "bigint": "UPDATE {t}runs SET result = '" + "7" * 5000 + "' WHERE id = 'bigint'",
}


#: the runs whose unreadable row a command on the run reads (an event row only ``check`` reads)
READ_BY_COMMANDS = [run_id for run_id in CORRUPTIONS if run_id != "event"]


class StoreEnv(Env):
    """A test directory whose store (at ``url``, either kind) a test can also write directly."""

    def sql(self, *statements: str) -> None:
        """Run ``statements`` on the store's database directly ({t}: the tables' prefix)."""
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
            for statement in statements:
                conn.execute(statement.format(t=""))
            conn.close()
            return
        with psycopg.connect(self.url, autocommit=True) as pg:
            for statement in statements:
                pg.execute(statement.format(t="haltwise.").encode())

    def run_all(self, ids: list[str]) -> None:
        processes = [self.popen("run", "agent.py:quick", "--id", run_id) for run_id in ids]
        for process in processes:
            out, err = process.communicate(timeout=PATIENCE * 3)
            assert process.returncode == 0, (out, err)


@pytest.fixture
def env(tmp_path: Path, store_url: str) -> StoreEnv:
    (tmp_path / "agent.py").write_text(AGENT)
    return StoreEnv(tmp_path, store_url)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def corrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StoreEnv:
    """One store per kind with every corruption, shared by the tests that only read it (the
    commands they run on a bad row change nothing: that is what they check)."""
    root = tmp_path_factory.mktemp(f"corrupted-{request.param}")
    (root / "agent.py").write_text(AGENT)
    if request.param == "sqlite":
        url = f"sqlite:///{root}/haltwise.db"
    else:
        url = create_database(request.getfixturevalue("pg_dsn"))
    env = StoreEnv(root, url)
    env.run_all([*CORRUPTIONS, "sound"])
    env.sql(*CORRUPTIONS.values())
    return env


def test_check_reports_every_unreadable_row_as_a_finding(corrupted: StoreEnv) -> None:
    done = corrupted.hw("check", "--json")
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["runs"] == len(CORRUPTIONS) + 1
    unreadable = {f["run"] for f in report["findings"] if f["code"] == "unreadable-row"}
    assert unreadable == set(CORRUPTIONS)
    assert "sound" not in {finding["run"] for finding in report["findings"]}
    plain = corrupted.hw("check")
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert "unreadable-row" in plain.stdout


@pytest.mark.parametrize("command", ["status", "cancel", "resume", "run"])
def test_a_command_on_an_unreadable_run_names_the_row_and_exits_2(
    corrupted: StoreEnv, command: str
) -> None:
    # status meets every kind of bad row; the other commands, every other kind (they read the
    # run through the same load, so between them each kind is met twice)
    number = ["status", "cancel", "resume", "run"].index(command)
    chosen = READ_BY_COMMANDS if number == 0 else READ_BY_COMMANDS[number % 2 :: 2]
    for run_id in chosen:
        args = ["run", "agent.py:quick", "--id", run_id] if command == "run" else [command, run_id]
        line = error_line(corrupted.hw(*args))
        assert f"run {run_id!r}" in line, line
        assert "unreadable row" in line
    assert corrupted.hw("status", "sound").returncode == 0


def test_list_names_the_unreadable_row_and_exits_2(corrupted: StoreEnv) -> None:
    for args in (["list"], ["list", "--json"]):  # they read the run whose state is bogus
        line = error_line(corrupted.hw(*args))
        assert "unreadable row" in line and "haltwise check" in line
    # list reads the runs' listed columns only (one query, no step rows): the completed runs
    # whose other rows are unreadable are listed, and status names those rows
    completed = corrupted.hw("list", "--state", "completed", "--json")
    assert completed.returncode == 0, completed.stderr
    assert "state" not in {run["id"] for run in json.loads(completed.stdout)["runs"]}


def test_a_schema_version_that_is_no_number_is_a_finding_and_exit_2(env: StoreEnv) -> None:
    env.run_all(["one"])
    env.sql("UPDATE {t}haltwise_meta SET value = 'abc' WHERE key = 'schema_version'")
    checked = env.hw("check", "--json")
    assert checked.returncode == 1, checked.stderr
    findings = json.loads(checked.stdout)["findings"]
    assert [f["code"] for f in findings] == ["unreadable-row"]
    assert "schema_version" in findings[0]["message"]
    for args in (["list"], ["status", "one"], ["cancel", "one"], ["run", "agent.py:quick"]):
        assert "schema_version" in error_line(env.hw(*args))


def test_a_worker_skips_an_unreadable_run_and_works_the_others(env: StoreEnv) -> None:
    for run_id in ("bad", "good1", "good2"):
        submitted = env.hw("submit", "agent.py:quick", "--id", run_id)
        assert submitted.returncode == 0, submitted.stderr
    env.sql("UPDATE {t}runs SET inputs = '{{not json' WHERE id = 'bad'")
    worker = env.popen("worker", "agent.py", "--concurrency", "1")
    try:
        for run_id in ("good1", "good2"):
            env.wait_for(run_id, "completed", lambda s: s["state"] == "completed")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=PATIENCE)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    skipped = [line for line in err.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and "'bad'" in skipped[0] and "inputs" in skipped[0], err


def test_a_listing_reports_bad_rows_and_keeps_the_readable_ones(env: StoreEnv) -> None:
    """The Python API: CorruptRowError carries the rows it could read."""
    env.run_all(["a", "b"])
    env.sql("UPDATE {t}runs SET state = 'bogus' WHERE id = 'a'")
    script = (
        "import anyio, haltwise\n"
        "from haltwise import CorruptRowError\n"
        "async def main():\n"
        f"    async with haltwise.Runtime({env.url!r}) as rt:\n"
        "        try:\n"
        "            await rt.store.list_runs()\n"
        "        except CorruptRowError as error:\n"
        "            print([r.run_id for r in error.rows], [r.id for r in error.readable])\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE
    )
    assert done.stdout.strip() == "['a'] ['b']", done.stderr


# -- a run's row, read by the fast path and column by column ------------------------------------

#: a runs row in which every column differs from its record field's default
SOUND_RUN_ROW = {
    "id": "r1",
    "task": "agent.py:quick",
    "state": "cancelling",
    "inputs": '{"args":[1],"kwargs":{"k":"v"},"source":"/x/agent.py"}',
    "reason": "user",
    "force": 1,
    "result": '{"a":[1,2]}',
    "error": '{"type":"ValueError","message":"bad"}',
    "cancel_error": '{"type":"KeyError","message":"k"}',
    "owner": new_owner().to_json(),
    "lease_until": 123.5,
    "parent": "p0",
    "created_at": 1.25,
    "updated_at": 2.5,
    "pause": 1,
    "settle_on_cancel": 1,
}


def read_column_by_column(row: dict[str, object]) -> RunRecord:
    values = [row[name] for name in rows._RUN_NAMES]
    checked = rows._checked("runs", "r1", "", rows._RUN_CHECKS, values)
    return RunRecord(**dict(zip(rows._RUN_NAMES, checked, strict=True)))


def test_a_run_row_reads_alike_on_the_fast_path_and_column_by_column() -> None:
    assert set(SOUND_RUN_ROW) == set(rows._RUN_NAMES)  # the row covers every column read
    fast = rows._run_from_plain_row(SOUND_RUN_ROW)
    assert fast == read_column_by_column(SOUND_RUN_ROW)
    for field in dataclasses.fields(RunRecord):  # so a column the fast path forgot shows
        assert getattr(fast, field.name) != field.default, field.name


#: a value of each run column that its converter refuses
REFUSED = [
    ("id", None),
    ("task", 3),
    ("state", "bogus"),
    ("reason", 5),
    ("force", 2),
    ("pause", None),
    ("settle_on_cancel", "yes"),
    ("created_at", math.nan),
    ("updated_at", "late"),
    ("lease_until", math.nan),
    ("parent", 7),
    ("inputs", "[]"),
    ("result", b"1"),
    ("error", '{"message":"x"}'),
    ("owner", "garbage"),
]


@pytest.mark.parametrize(("column", "value"), REFUSED)
def test_a_run_value_the_converters_refuse_is_never_read(column: str, value: object) -> None:
    row = {**SOUND_RUN_ROW, column: value}
    with pytest.raises(CorruptRowError, match=f"column {column}"):
        rows.run_from_row(row)


#: the readers of some of a run's columns, by position (a bulk cancel's, a transition group's)
PART_READERS = {
    "cancelled_from_row": (rows.cancelled_from_row, rows.CANCELLED_COLUMNS),
    "head_from_row": (rows.head_from_row, rows.HEAD_COLUMNS),
}


@pytest.mark.parametrize("reader", PART_READERS)
def test_some_columns_of_a_run_read_as_the_whole_row_reads_them(reader: str) -> None:
    read, columns = PART_READERS[reader]
    whole = rows.run_from_row(SOUND_RUN_ROW)
    expected = tuple(getattr(whole, column) for column in columns)
    assert read(tuple(SOUND_RUN_ROW[column] for column in columns)) == expected
    slow = {**SOUND_RUN_ROW, "lease_until": 5, "id": "r1"}  # an integer time: column by column
    if "lease_until" in columns:
        assert read(tuple(slow[column] for column in columns)).lease_until == 5.0


@pytest.mark.parametrize(
    ("reader", "column", "value"),
    [
        (reader, column, value)
        for reader, (_, columns) in PART_READERS.items()
        for column, value in REFUSED
        if column in columns
    ],
)
def test_a_value_some_columns_refuse_is_never_read(reader: str, column: str, value: object) -> None:
    read, columns = PART_READERS[reader]
    row = tuple(value if name == column else SOUND_RUN_ROW[name] for name in columns)
    with pytest.raises(CorruptRowError, match=f"column {column}"):
        read(row)
