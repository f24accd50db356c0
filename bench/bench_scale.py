"""Durable steps per second with many concurrent runs in one process (SQLite, WAL + FULL).

Each run is a task of ``--steps`` (20) trivial sequential steps; 1, 10, 100 and 1,000 runs are
started at once in one process and the clock stops when the last one is final. Every step is
durable by then (its start before its body ran, its settlement before the next step's start or
the run's completion), and each run waits for its own writes to be durable, so the aggregate
rate shows how much of the disk's commit rate concurrent runs share (group commit: the store
commits the queued writes of many runs in one transaction).

The ceiling beside it is one commit per step: a raw sqlite3 loop doing one INSERT + COMMIT per
step at the same settings (WAL, ``synchronous=FULL``), on the same disk, in the same run. The
steps are ``effect="none"`` (one durable write per step: the settlement rides with the next
write) and ``effect="write"`` (two: the settlement is durable before the task goes on).

Writes a table to stdout, the numbers to ``--json`` and a plot to ``--png`` (matplotlib, from
the benchmark venv; skipped with a note when it is not installed).

usage: python bench/bench_scale.py [--runs 1,10,100,1000] [--steps N] [--repeat N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _peer_haltwise import trivial_run
from _report import header, median, table, throughput_plot
from bench_core import raw_loop

import haltwise
from haltwise._journal.schema import SQLITE, create_statements
from haltwise._journal.sqlite import _CACHE_KIB, _PAGE_SIZE, _SETTLE_STEP, _START_STEP

DOCS = Path(__file__).resolve().parent.parent / "docs"
EFFECTS = ("none", "write")


async def concurrent_runs(url: str, runs: int, steps_: int, effect: str) -> float:
    """Aggregate durable steps per second of ``runs`` runs started together."""
    failed: list[haltwise.Outcome] = []

    async def one(runtime: haltwise.Runtime, k: int) -> None:
        handle = await runtime.start(trivial_run, steps_, effect, task_id=f"run-{k}")
        outcome = await handle.outcome()
        if outcome.state is not haltwise.State.COMPLETED:
            failed.append(outcome)

    async with haltwise.Runtime(url) as runtime:
        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            for k in range(runs):
                group.start_soon(one, runtime, k)
        elapsed = time.perf_counter() - start
    assert not failed, failed[0]
    return runs * steps_ / elapsed


def sql_alone(path: Path, runs: int, steps_: int) -> float:
    """Steps per second of haltwise's own journal statements for ``runs`` runs, without its
    runtime: step by step, for every run the previous step's settlement and the next step's
    start, all runs' in one transaction (as the event loop's batch commits them when every run
    is ready at once). Same schema, statements, page size, cache and settings (WAL + FULL) as
    the store."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
    for statement in create_statements(SQLITE):
        conn.execute(statement)
    ids = [f"run-{k}" for k in range(runs)]
    conn.executemany(
        "INSERT INTO runs (id, task, state, inputs, owner_token, created_at, updated_at) "
        "VALUES (?, 'bench:scale', 'running', '{}', 'owner', 0, 0)",
        [(run_id,) for run_id in ids],
    )
    start = time.perf_counter()
    for i in range(steps_):
        conn.execute("BEGIN IMMEDIATE")
        for run_id in ids:
            if i:
                settle = ("committed", str(i - 1), None, time.time(), run_id, i - 1)
                conn.execute(_SETTLE_STEP, (*settle, run_id, "owner"))
            key = f"{run_id}:{i}:0123456789abcdef"
            start_step = (run_id, i, "trivial_none", "interruptible", "none", 0, key)
            conn.execute(_START_STEP, (*start_step, None, 0, time.time(), run_id, "owner"))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return runs * steps_ / elapsed


def ceiling(base: Path, repeat: int, commits: int = 1000) -> float:
    """Commits per second of the raw one-INSERT-per-COMMIT loop (WAL + FULL), median."""
    return median([1 / raw_loop(base / f"ceiling-{r}.db", commits, "FULL") for r in range(repeat)])


def plot(report: dict[str, Any], path: Path) -> str:
    runs = report["runs"]
    series: list[tuple[str, list[int], list[float], dict[str, str]]] = [
        (
            f'haltwise, effect="{effect}"',
            runs,
            [cell["median"] for cell in report["cells"][effect]],
            {"marker": marker},
        )
        for effect, marker in zip(EFFECTS, ("o", "s"), strict=True)
    ]
    alone = [cell["median"] for cell in report["cells"]["sql_alone"]]
    series.append(
        ("haltwise's SQL alone (no runtime)", runs, alone, {"marker": "^", "linestyle": "-."})
    )
    return throughput_plot(
        series,
        runs,
        (report["ceiling_steps_per_s"], "raw sqlite3", 10, "1,000"),
        f"concurrent runs in one process ({report['steps']} steps each)",
        "haltwise on SQLite (WAL, synchronous=FULL): throughput vs concurrency",
        path,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="1,10,100,1000", help="comma-separated run counts")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3, help="fresh databases per cell (median)")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--json", type=Path, default=DOCS / "throughput.json")
    parser.add_argument("--png", type=Path, default=DOCS / "throughput.png")
    args = parser.parse_args()
    run_counts = [int(n) for n in args.runs.split(",")]
    base = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    print(header("Throughput with many concurrent runs (SQLite, WAL + FULL)"))
    # other work on the machine skews a disk benchmark: say how busy it was
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start (1, 5, 15 min): {load}\n")
    roof = ceiling(base, args.repeat)
    cells: dict[str, list[dict[str, Any]]] = {effect: [] for effect in EFFECTS}
    for runs in run_counts:
        for effect in EFFECTS:
            rates = [
                anyio.run(
                    concurrent_runs,
                    f"sqlite:///{base / f'scale-{runs}-{effect}-{r}.db'}",
                    runs,
                    args.steps,
                    effect,
                )
                for r in range(args.repeat)
            ]
            cells[effect].append({"runs": runs, "steps_per_s": rates, "median": median(rates)})
        alone = [
            sql_alone(base / f"sql-{runs}-{r}.db", runs, args.steps) for r in range(args.repeat)
        ]
        cells.setdefault("sql_alone", []).append(
            {"runs": runs, "steps_per_s": alone, "median": median(alone)}
        )
    report = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_start": load,
        "runs": run_counts,
        "steps": args.steps,
        "repeat": args.repeat,
        "ceiling_steps_per_s": roof,
        "cells": cells,
    }
    rows = []
    for i, runs in enumerate(run_counts):
        row: list[object] = [f"{runs:,}", f"{runs * args.steps:,}"]
        for column in (*EFFECTS, "sql_alone"):
            rate = cells[column][i]["median"]
            row += [f"{rate:,.0f}", f"{rate / roof:.1f}x"]
        rows.append(row)
    print(
        f"{args.steps}-step tasks, median of {args.repeat} fresh databases; one commit per step "
        f"(raw sqlite3 INSERT+COMMIT, WAL+FULL) = {roof:,.0f} steps/s:\n"
    )
    headers = ["runs", "steps", 'effect="none" steps/s', "x ceiling"]
    headers += ['effect="write" steps/s', "x ceiling"]
    headers += ["haltwise's SQL alone, steps/s", "x ceiling"]
    print(table(headers, rows))
    print(
        "\n(SQL alone: the store's own step statements for as many runs, every run's in one"
        " transaction per step as the event loop's batch commits them, with no runtime: the"
        " rate the journal's statements allow.)"
    )
    at_most = cells["none"][-1]
    goal_met = at_most["median"] >= 10 * roof
    print(
        f"\ntarget: at {at_most['runs']:,} runs, at least 10x one commit per step: "
        f"{at_most['median'] / roof:.1f}x ({'met' if goal_met else 'MISSED'})"
    )
    report["target_met"] = goal_met
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"numbers written to {args.json}; {plot(report, args.png)}")


if __name__ == "__main__":
    main()
