"""The process a cross-process bulk cancel benchmark cancels: N runs waiting in an interruptible
tool (``tool``), or for the approval of a call (``approval``: the approvals scale row). Prints
``ready KIB_PER_RUN`` once every run waits, ``idle PERCENT`` after an idle window (the process's
CPU over the wall clock, a lease renewal or more inside it), then ``first WALLTIME`` when the
first wait is interrupted and ``final WALLTIME`` when the last run is recorded final (its
outcome seen here).

usage: python _bulk_target.py STORE_URL RUNS IDLE_SECONDS [tool|approval]
"""

from __future__ import annotations

import gc
import sys
import time

import anyio
from bench_operator import rss_kib  # (the script's folder is on the path)

import haltwise

FIRST: list[float] = []


def interrupted() -> None:
    if not FIRST:
        FIRST.append(time.time())
        print(f"first {FIRST[0]:.6f}", flush=True)


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_in_tool() -> None:
    try:
        await anyio.sleep_forever()
    finally:
        interrupted()


@haltwise.tool(cancel="interruptible", effect="external", approval="required")
async def needs_approval() -> None:
    """Never runs: nobody decides."""


@haltwise.task(name="bench:bulk_waiter")
async def waiter() -> None:
    await wait_in_tool()


@haltwise.task(name="bench:bulk_asker")
async def asker() -> None:
    try:
        await needs_approval()
    finally:
        interrupted()  # the wait for the decision is interrupted (the body never began)


async def main(url: str, runs: int, idle_seconds: float, mode: str) -> None:
    task = asker if mode == "approval" else waiter
    async with haltwise.Runtime(url) as runtime:
        gc.collect()
        before = rss_kib()
        handles = [await runtime.start(task, task_id=f"w{i}") for i in range(runs)]
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
    mode = sys.argv[4] if len(sys.argv) > 4 else "tool"
    anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), mode)
