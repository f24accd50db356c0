"""A thousand concurrent runs in one process, all cancelled at once (SQLite store).

Each run waits in an interruptible tool; then every run is cancelled concurrently. Reported:
the time from the first cancel request to the last run recorded ``cancelled``, beside the floor
of the same number of bare asyncio tasks cancelled with no journal at all.

usage: python bench/bench_many.py [--runs N] [--synchronous full|normal]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
from _report import header, table

import haltwise

ENTERED: list[int] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_here(i: int) -> None:
    ENTERED.append(i)
    await anyio.sleep_forever()


@haltwise.task(name="bench:many")
async def many(i: int) -> None:
    await wait_here(i)


async def haltwise_cancel_all(url: str, runs: int) -> tuple[float, float, int]:
    ENTERED.clear()
    async with haltwise.Runtime(url) as runtime:
        started = time.perf_counter()
        handles = [await runtime.start(many, i, task_id=f"m{i}") for i in range(runs)]
        while len(ENTERED) < runs:
            await anyio.sleep(0.001)
        start_all = time.perf_counter() - started
        begin = time.perf_counter()
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(handle.cancel)
        outcomes = [await handle.outcome() for handle in handles]
        elapsed = time.perf_counter() - begin
    cancelled = sum(o.state is haltwise.State.CANCELLED for o in outcomes)
    return start_all, elapsed, cancelled


async def bare_cancel_all(runs: int) -> float:
    async with anyio.create_task_group() as group:
        for _ in range(runs):
            group.start_soon(anyio.sleep_forever)
        await anyio.sleep(0.01)
        begin = time.perf_counter()
        group.cancel_scope.cancel()
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--synchronous", default="full", choices=["full", "normal"])
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="haltwise-many-"))
    url = f"sqlite:///{base / 'many.db'}?synchronous={args.synchronous}"
    print(header(f"{args.runs} concurrent runs, all cancelled at once (SQLite)"))
    start_all, elapsed, cancelled = anyio.run(haltwise_cancel_all, url, args.runs)
    floor = anyio.run(bare_cancel_all, args.runs)
    print(
        table(
            ["what", "runs", "seconds", "ended cancelled"],
            [
                [
                    f"haltwise: start {args.runs} runs (each durable)",
                    args.runs,
                    f"{start_all:.2f}",
                    "-",
                ],
                [
                    "haltwise: cancel all -> all recorded cancelled",
                    args.runs,
                    f"{elapsed:.2f}",
                    f"{cancelled}/{args.runs}",
                ],
                ["baseline: cancel as many bare asyncio tasks", args.runs, f"{floor:.4f}", "-"],
            ],
        )
    )


if __name__ == "__main__":
    main()
