"""The process a cross-process cancel benchmark cancels: one run at a time, each waiting in an
interruptible tool until cancelled. Prints ``entered I`` when run I is in flight, then
``stopped I WALLTIME`` when its tool was interrupted and ``final I WALLTIME`` when the run is
recorded final.

usage: python _cancel_target.py STORE_URL TRIALS
"""

from __future__ import annotations

import sys
import time

import anyio

import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_for_cancel(i: int) -> None:
    print(f"entered {i}", flush=True)
    try:
        await anyio.sleep_forever()
    finally:
        print(f"stopped {i} {time.time():.6f}", flush=True)


@haltwise.task(name="bench:target")
async def target(i: int) -> None:
    await wait_for_cancel(i)


async def main(url: str, trials: int) -> None:
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            handle = await runtime.start(target, i, task_id=f"x{i}")
            outcome = await handle.outcome()
            print(f"final {i} {time.time():.6f} {outcome.state.value}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
