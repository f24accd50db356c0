"""Core overheads of haltwise on the embedded SQLite store, each beside its baseline.

1. Per-step overhead: 1,000 trivial sequential steps of one task, against a raw sqlite3 loop
   doing one INSERT + COMMIT per step, WAL mode, at the same ``synchronous`` setting.
2. In-process cancel latency: from ``handle.cancel()`` to the outcome being final, the task
   waiting in an interruptible tool; p50/p99 over the trials.

usage: python bench/bench_core.py [--steps N] [--trials N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import anyio
from _report import header, median, percentile, table

import haltwise
from haltwise._journal.sqlite import _preallocate_wal


@haltwise.tool(cancel="interruptible", effect="none")
async def trivial(i: int) -> int:
    return i


@haltwise.task(name="bench:steps")
async def steps(n: int) -> int:
    total = 0
    for i in range(n):
        total += await trivial(i)
    return total


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_forever(entered: list[anyio.Event]) -> None:
    entered[0].set()
    await anyio.sleep_forever()


WAITING: list[anyio.Event] = []


@haltwise.task(name="bench:waits")
async def waits() -> None:
    await wait_forever(WAITING)


def raw_loop(
    path: Path,
    steps_: int,
    synchronous: str,
    page_size: int | None = None,
    *,
    wal_room: bool = False,
) -> float:
    """Seconds per step of a plain sqlite3 loop: one INSERT + COMMIT per step.

    ``page_size``: SQLite's default (4 KiB) when None; haltwise creates its files with 1 KiB
    pages, and the loop at that size shows how much of the difference that alone makes.
    ``wal_room``: give the WAL the room of 1,000 frames first, as haltwise's store does as it
    opens (``_journal.sqlite._preallocate_wal``), so that commits do not grow the file.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    if page_size is not None:
        conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS steps (run TEXT, idx INTEGER, result TEXT)")
    if wal_room:
        conn.execute("BEGIN IMMEDIATE")
        _preallocate_wal(conn, str(path), 1000)
        conn.execute("COMMIT")
    start = time.perf_counter()
    for i in range(steps_):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO steps VALUES (?, ?, ?)", ("run", i, str(i)))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / steps_


async def haltwise_steps(url: str, steps_: int, run_id: str) -> float:
    async with haltwise.Runtime(url) as runtime:
        start = time.perf_counter()
        outcome = await (await runtime.start(steps, steps_, task_id=run_id)).outcome()
        elapsed = time.perf_counter() - start
    assert outcome.state is haltwise.State.COMPLETED, outcome
    return elapsed / steps_


async def cancel_latencies(url: str, trials: int) -> list[float]:
    latencies = []
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            WAITING[:] = [anyio.Event()]
            handle = await runtime.start(waits, task_id=f"cancel-{i}")
            await WAITING[0].wait()
            start = time.perf_counter()
            await handle.cancel()
            outcome = await handle.outcome()
            latencies.append(time.perf_counter() - start)
            assert outcome.state is haltwise.State.CANCELLED
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3, help="fresh databases per cell (median)")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    print(header("Per-step overhead and in-process cancel latency (SQLite)"))
    rows = []
    for synchronous in ("FULL", "NORMAL"):
        ours, raw, raw_small = [], [], []
        for r in range(args.repeat):
            db = base / f"hw-{synchronous}-{r}.db"
            url = f"sqlite:///{db}?synchronous={synchronous.lower()}"
            ours.append(anyio.run(haltwise_steps, url, args.steps, "steps"))
            raw.append(raw_loop(base / f"raw-{synchronous}-{r}.db", args.steps, synchronous))
            small = base / f"raw1k-{synchronous}-{r}.db"
            raw_small.append(raw_loop(small, args.steps, synchronous, page_size=1024))
        rows.append(
            [
                f"WAL + {synchronous}",
                f"{median(ours) * 1e6:.0f}",
                f"{median(raw) * 1e6:.0f}",
                f"{median(ours) / median(raw):.2f}x",
                f"{median(raw_small) * 1e6:.0f}",
                f"{median(ours) / median(raw_small):.2f}x",
            ]
        )
    print(f"{args.steps} sequential trivial steps, median of {args.repeat} fresh databases:\n")
    columns = ["synchronous", "haltwise us/step", "raw INSERT+COMMIT us/step", "ratio"]
    print(table([*columns, "raw, 1 KiB pages, us/step", "ratio to it"], rows))
    print()
    lat_rows = []
    for synchronous in ("FULL", "NORMAL"):
        url = f"sqlite:///{base / f'cancel-{synchronous}.db'}?synchronous={synchronous.lower()}"
        latencies = anyio.run(cancel_latencies, url, args.trials)
        lat_rows.append(
            [
                f"WAL + {synchronous}",
                args.trials,
                f"{percentile(latencies, 0.5) * 1e3:.2f}",
                f"{percentile(latencies, 0.99) * 1e3:.2f}",
                f"{max(latencies) * 1e3:.2f}",
            ]
        )
    print("In-process cancel latency, request to final state, task in an interruptible tool:\n")
    print(table(["synchronous", "trials", "p50 ms", "p99 ms", "max ms"], lat_rows))


if __name__ == "__main__":
    main()
