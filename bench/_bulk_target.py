"""The process a cross-process bulk cancel benchmark cancels: N runs waiting in an interruptible
tool. Prints ``ready KIB_PER_RUN`` once every run waits, ``idle PERCENT`` after an idle window
(the process's CPU over the wall clock, a lease renewal or more inside it), then
``first WALLTIME`` when the first tool is interrupted and ``final WALLTIME`` when the last run
is recorded final (its outcome seen here).

usage: python _bulk_target.py STORE_URL RUNS IDLE_SECONDS
"""

from __future__ import annotations

import gc
import sys
import time

import anyio
from bench_operator import rss_kib  # (the script's folder is on the path)

import haltwise

FIRST: list[float] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_in_tool() -> None:
    try:
        await anyio.sleep_forever()
    finally:
        if not FIRST:
            FIRST.append(time.time())
            print(f"first {FIRST[0]:.6f}", flush=True)


@haltwise.task(name="bench:bulk_waiter")
async def waiter() -> None:
    await wait_in_tool()


async def main(url: str, runs: int, idle_seconds: float) -> None:
    async with haltwise.Runtime(url) as runtime:
        gc.collect()
        before = rss_kib()
        handles = [await runtime.start(waiter, task_id=f"w{i}") for i in range(runs)]
        while len((await runtime.inspect(f"w{runs - 1}")).outcome.steps) < 1:
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        gc.collect()
        print(f"ready {(rss_kib() - before) / runs:.2f}", flush=True)
        cpu, wall = time.process_time(), time.monotonic()
        await anyio.sleep(idle_seconds)
        print(
            f"idle {(time.process_time() - cpu) / (time.monotonic() - wall) * 100:.2f}", flush=True
        )
        for handle in handles:
            await handle.outcome()
        print(f"final {time.time():.6f}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
