"""What prune costs on SQLite since the change feed lost its index by run (schema version 9).

A store file made by haltwise, its ``changes`` filled with ``--runs`` runs of ``--changes``
changes each (a run of 20 steps writes ~44: two per step and its transitions). Then one prune's
statements (``OperatorSQL.prune_deletes``, in one transaction, ``synchronous=off``) delete the
changes of ``--few`` runs, or of every other run, as shipped (one scan of ``changes`` for the
batch, the newest row kept as the high-water mark) and, the baseline, on the same rows in
version 8's table (``AUTOINCREMENT``, the index ``changes_by_run``) with version 8's statement
(one probe of the index per run). Median of ``--repeat`` fresh files; wall seconds.

usage: python bench/prune_cost.py [--runs N] [--changes N] [--few N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from _report import header, median, table
from step_cost import V8_FEED, drop, new_store

from haltwise._journal import sqlite as store_sql

#: version 8's prune of the changes (the other tables' deletes are the same in both)
V8_PRUNE = "DELETE FROM changes WHERE run_id IN (SELECT value FROM json_each(?))"


def filled(base: Path, runs: int, changes: int, version8: bool) -> sqlite3.Connection:
    path = new_store(base)
    if version8:
        drop(path, V8_FEED)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    rows = (
        (f"run-{run:06d}-0123456789abcdef", "step", index, "committed", 1.0)
        for index in range(changes)
        for run in range(runs)
    )
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO changes (run_id, kind, idx, status, at) VALUES (?,?,?,?,?)", rows)
    conn.execute("COMMIT")
    return conn


def prune_seconds(conn: sqlite3.Connection, ids: list[str], version8: bool) -> float:
    ops = store_sql._OPS
    statements = ops.prune_deletes()
    if version8:  # version 8's delete of the changes in place of version 9's
        statements = [V8_PRUNE, *statements[len(ops.prune_changes()) :]]
    bound = json.dumps(ids)
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    for statement in statements:
        conn.execute(statement, (bound,))
    conn.execute("COMMIT")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=44)
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="haltwise-prune-cost-"))
    print(header("What prune costs on SQLite (the change feed without its index by run)"))
    names = [f"run-{run:06d}-0123456789abcdef" for run in range(args.runs)]
    batches = {
        f"{args.few} runs": names[:: max(1, args.runs // args.few)][: args.few],
        f"{args.runs // 2:,} runs (every other one)": names[::2],
    }
    stores = {"version 9 (as shipped): one scan": False, "version 8: the index": True}
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for batch, ids in batches.items():
            for store, version8 in stores.items():
                conn = filled(base, args.runs, args.changes, version8)
                seconds.setdefault((batch, store), []).append(prune_seconds(conn, ids, version8))
                conn.close()
    print(
        f"\n{args.runs:,} runs of {args.changes} changes ({args.runs * args.changes:,} rows), "
        f"median of {args.repeat}:\n"
    )
    rows = [[batch, store, f"{median(xs):.3f}"] for (batch, store), xs in seconds.items()]
    print(table(["pruned", "store", "seconds"], rows))


if __name__ == "__main__":
    main()
