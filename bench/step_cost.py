"""Where a sequential step's cost goes on SQLite: CPU per step and WAL frames per commit.

1. CPU per step of one run of ``--steps`` trivial interruptible steps (``synchronous=off``, so
   that the disk does not count; ``time.process_time`` of every thread), as shipped; with the
   change feed as schema version 8 had it (``seq`` ``AUTOINCREMENT``, the index
   ``changes_by_run``: the baseline of version 9's change); and, as an experiment only, with the
   change feed's two step triggers dropped (the store needs them: ``GET /api/events`` reports
   every step start and settlement).
2. SQLite alone: haltwise's own per-step transaction (``BEGIN IMMEDIATE``, the previous step's
   settlement, this step's start, ``COMMIT``) with the store's statements, on a store file made
   by haltwise: CPU per step and WAL frames per commit, for the same three stores and for the
   step's change rows written by the step's own statements from Python instead of the triggers
   (one ``INSERT`` per change: the alternative to the triggers, measured), beside the raw loop
   of ``bench/peers.py`` (one ``INSERT`` + ``COMMIT``).

Variants are interleaved, ``--repeat`` times, fresh databases each time; medians are shown.

usage: python bench/step_cost.py [--steps N] [--repeat N]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
from _measure_once import cpu_per_step
from _report import header, median, table

import haltwise
from haltwise._journal import schema
from haltwise._journal import sqlite as store_sql

#: the change feed of schema version 8, made from a new store's (triggers dropped meanwhile)
V8_FEED = (
    *(f"DROP TRIGGER {trigger[0]}" for trigger in schema._SQLITE_FEED),
    "DROP TABLE changes",
    "CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, "
    "kind TEXT NOT NULL, idx INTEGER, status TEXT, at REAL NOT NULL)",
    "CREATE INDEX changes_by_run ON changes (run_id, seq)",
    *schema.TRIGGERS[0].sqlite,
)

#: what each variant changes in a store file made by haltwise
SQL_VARIANTS: dict[str, tuple[str, ...]] = {
    "as shipped": (),
    "version 8's change feed (AUTOINCREMENT, changes_by_run)": V8_FEED,
    "step triggers dropped (experiment)": (
        "DROP TRIGGER changes_on_step",
        "DROP TRIGGER changes_on_step_status",
    ),
}


def new_store(base: Path) -> Path:
    """A store file made by haltwise (its schema, triggers and page size)."""
    path = Path(tempfile.mkdtemp(dir=base)) / "journal.db"

    async def make() -> None:
        async with haltwise.Runtime(f"sqlite:///{path}"):
            pass

    anyio.run(make)
    return path


def drop(path: Path, statements: tuple[str, ...]) -> None:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def step_cpu(base: Path, steps: int, statements: tuple[str, ...]) -> float:
    path = new_store(base)
    drop(path, statements)
    return anyio.run(cpu_per_step, f"sqlite:///{path}?synchronous=off", steps, "interruptible")


def _haltwise_step(conn: sqlite3.Connection, i: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    if i:
        settled = ("committed", str(i - 1), None, time.time(), "r", i - 1, "r", "tok")
        conn.execute(store_sql._SETTLE_STEP, settled)
    started = ("r", i, "trivial", "interruptible", "none", 0, f"r:{i}:0123456789abcdef", None, 0)
    conn.execute(store_sql._START_STEP, (*started, time.time(), None, "0000abcd", "r", "tok"))
    conn.execute("COMMIT")


#: a step's change row written from Python (with the step triggers dropped)
_CHANGE_ROW = (
    "INSERT INTO changes (run_id, kind, idx, status, at) "
    f"VALUES (?, 'step', ?, ?, {schema._SQLITE_CLOCK})"
)


def _python_feed_step(conn: sqlite3.Connection, i: int) -> None:
    """:func:`_haltwise_step` with its two change rows written by their own statements."""
    conn.execute("BEGIN IMMEDIATE")
    if i:
        settled = ("committed", str(i - 1), None, time.time(), "r", i - 1, "r", "tok")
        conn.execute(store_sql._SETTLE_STEP, settled)
        conn.execute(_CHANGE_ROW, ("r", i - 1, "committed"))
    started = ("r", i, "trivial", "interruptible", "none", 0, f"r:{i}:0123456789abcdef", None, 0)
    conn.execute(store_sql._START_STEP, (*started, time.time(), None, "0000abcd", "r", "tok"))
    conn.execute(_CHANGE_ROW, ("r", i, "running"))
    conn.execute("COMMIT")


def _raw_step(conn: sqlite3.Connection, i: int) -> None:
    conn.execute("BEGIN")
    conn.execute("INSERT INTO raw (i, v) VALUES (?, ?)", (i, "x" * 40))
    conn.execute("COMMIT")


def sql_cost(
    base: Path,
    steps: int,
    statements: tuple[str, ...] | None,
    step: Callable[[sqlite3.Connection, int], None] = _haltwise_step,
) -> tuple[float, float]:
    """CPU us per step and WAL frames per commit; ``statements`` None: the raw loop."""
    if statements is None:
        path = Path(tempfile.mkdtemp(dir=base)) / "raw.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE raw (i INTEGER PRIMARY KEY, v TEXT)")
        step = _raw_step
    else:
        path = new_store(base)
        drop(path, statements)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(
            "INSERT INTO runs (id, task, state, inputs, owner_token, created_at, updated_at) "
            "VALUES ('r', 't', 'running', '{}', 'tok', 0, 0)"
        )
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # every frame stays countable
    start = time.process_time()
    for i in range(steps):
        step(conn, i)
    cpu = (time.process_time() - start) / steps * 1e6
    frames = conn.execute("PRAGMA wal_checkpoint").fetchone()[1]
    conn.close()
    return cpu, frames / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="haltwise-step-cost-"))
    print(header("Where a sequential step's cost goes (SQLite)"))
    runs: dict[str, list[float]] = {}
    sql: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.repeat):
        for name, statements in SQL_VARIANTS.items():
            runs.setdefault(name, []).append(step_cpu(base, args.steps, statements))
        for name, statements in SQL_VARIANTS.items():
            sql.setdefault(name, []).append(sql_cost(base, args.steps, statements))
        sql.setdefault("change rows from Python, not triggers", []).append(
            sql_cost(
                base,
                args.steps,
                SQL_VARIANTS["step triggers dropped (experiment)"],
                _python_feed_step,
            )
        )
        sql.setdefault("raw sqlite3 INSERT+COMMIT (4 KiB pages)", []).append(
            sql_cost(base, args.steps, None)
        )
    print(f"\n1. CPU per step, one run of {args.steps} steps, median of {args.repeat}:\n")
    print(
        table(
            ["store", "CPU us/step", "range"],
            [
                [name, f"{median(xs):.1f}", f"{min(xs):.1f}-{max(xs):.1f}"]
                for name, xs in runs.items()
            ],
        )
    )
    print(f"\n2. SQLite alone, {args.steps} steps, median of {args.repeat}:\n")
    rows = [
        [name, f"{median([c for c, _ in xs]):.1f}", f"{median([f for _, f in xs]):.2f}"]
        for name, xs in sql.items()
    ]
    print(table(["per-step transaction", "CPU us/step", "WAL frames/commit"], rows))


if __name__ == "__main__":
    main()
