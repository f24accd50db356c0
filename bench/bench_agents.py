"""What real agents cost: parallel tool calls, and a cancel during a call that is not a step.

1. One run makes 8 tool calls at once (``asyncio.gather``): how many commits journal their 8
   starts, and how many their 8 settlements (with the run's end), on SQLite at FULL. The
   concurrent steps' writes are group-committed: counted by wrapping the SQLite writer's
   transaction (the only internal this benchmark touches).
2. A cancel requested (in process) while the task awaits something that is not a step (a model
   call, say: here an ``anyio.sleep``): the time from ``handle.cancel()`` being called until the
   task function sees the cancellation, and until the run's outcome is final.

usage: python bench/bench_agents.py [--trials N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _report import header, median, percentile, table

import haltwise
from haltwise._journal import sqlite, sqlite_writer

PARALLEL = 8


class CommitCounter:
    """Counts the transactions the SQLite writer commits (any of its three paths) that hold a
    step's start, and those that hold a step's settlement."""

    def __init__(self) -> None:
        self.starts = 0
        self.settles = 0
        self._original = sqlite_writer.Writer._execute

    def __enter__(self) -> CommitCounter:
        original = self._original
        counter = self

        def counting(writer: Any, batch: Any, *, wait: bool) -> Any:
            outcomes = original(writer, batch, wait=wait)
            if outcomes is not None:
                kinds = {getattr(item.op, "func", type(item.op)) for item in batch}
                counter.starts += sqlite._start_step in kinds
                counter.settles += sqlite._SettleStep in kinds
            return outcomes

        sqlite_writer.Writer._execute = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        sqlite_writer.Writer._execute = self._original  # type: ignore[method-assign]


GO: list[asyncio.Event] = []
ENTERED: list[int] = [0]
ALL_IN: list[asyncio.Event] = []


@haltwise.tool(cancel="rollback", effect="write", compensate=lambda i: None)
async def write_row(i: int) -> int:
    ENTERED[0] += 1
    if ENTERED[0] == PARALLEL:
        ALL_IN[0].set()
    await GO[0].wait()
    return i


@haltwise.task(name="bench:parallel")
async def parallel() -> list[int]:
    return list(await asyncio.gather(*(write_row(i) for i in range(PARALLEL))))


async def parallel_commits(url: str) -> tuple[int, int]:
    GO[:], ALL_IN[:], ENTERED[:] = [asyncio.Event()], [asyncio.Event()], [0]
    async with haltwise.Runtime(url) as runtime:
        with CommitCounter() as counter:
            handle = await runtime.start(parallel, task_id="parallel")
            await ALL_IN[0].wait()
            GO[0].set()
            outcome = await handle.outcome()
        assert outcome.state is haltwise.State.COMPLETED
    return counter.starts, counter.settles


SLEEPING: list[asyncio.Event] = []
LANDED: list[float] = []


@haltwise.task(name="bench:model_wait")
async def model_wait() -> None:
    SLEEPING[0].set()
    try:
        await anyio.sleep(3600)  # a model request that is not a step
    except BaseException:
        LANDED.append(time.perf_counter())
        raise


async def cancel_latencies(url: str, trials: int) -> tuple[list[float], list[float], list[float]]:
    landed, delivered, final = [], [], []
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            SLEEPING[:], LANDED[:] = [asyncio.Event()], []
            handle = await runtime.start(model_wait, task_id=f"wait-{i}")
            await SLEEPING[0].wait()
            start = time.perf_counter()
            await handle.cancel()
            durable = time.perf_counter()
            outcome = await handle.outcome()
            end = time.perf_counter()
            assert outcome.state is haltwise.State.CANCELLED
            landed.append(LANDED[0] - start)
            delivered.append(LANDED[0] - durable)
            final.append(end - start)
    return landed, delivered, final


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-bench-agents-"))
    base.mkdir(parents=True, exist_ok=True)

    print(header(f"{PARALLEL} parallel tool calls in one run (SQLite, WAL + FULL)"))
    counts = [
        anyio.run(parallel_commits, f"sqlite:///{base / f'parallel-{r}.db'}")
        for r in range(args.repeat)
    ]
    rows = [[r + 1, starts, settles] for r, (starts, settles) in enumerate(counts)]
    columns = ["fresh database", "commits holding the 8 starts", "commits holding the settlements"]
    print(table(columns, rows))
    print()

    print(header("A cancel during an await that is not a step (in process, SQLite)"))
    rows = []
    for synchronous in ("full", "normal"):
        url = f"sqlite:///{base / f'cancel-{synchronous}.db'}?synchronous={synchronous}"
        landed, delivered, final = anyio.run(cancel_latencies, url, args.trials)
        rows.append(
            [
                f"WAL + {synchronous.upper()}",
                args.trials,
                f"{percentile(landed, 0.5) * 1e3:.2f}",
                f"{percentile(landed, 0.99) * 1e3:.2f}",
                f"{percentile(delivered, 0.5) * 1e3:.3f}",
                f"{percentile(delivered, 0.99) * 1e3:.3f}",
                f"{median(final) * 1e3:.2f}",
            ]
        )
    columns = [
        "store",
        "trials",
        "lands p50 ms",
        "lands p99 ms",
        "after durable p50 ms",
        "after durable p99 ms",
        "final p50 ms",
    ]
    print(table(columns, rows))
    print(
        "\n'lands': from handle.cancel() being called to the task function seeing the "
        "cancellation (it includes the commit of the cancel request); 'after durable': from "
        "handle.cancel() returning (the request is durable) to the task seeing it; 'final': "
        "from handle.cancel() being called to the outcome."
    )


if __name__ == "__main__":
    main()
