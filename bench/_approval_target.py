"""The process an approvals benchmark decides for: one run at a time, each asking for approval.
Prints ``asked I`` when run I's request is journaled and ``begun I WALLTIME`` when its approved
call begins; with ``cancel`` as the mode, each run waits in an interruptible tool instead and
prints ``stopped I WALLTIME`` when a cancel interrupts it (the baseline: the same watcher).

usage: python _approval_target.py STORE_URL TRIALS approve|cancel BLOCK (ids aBLOCK-I, cBLOCK-I)
"""

from __future__ import annotations

import sys
import time

import anyio

import haltwise


@haltwise.tool(cancel="finish", effect="external", approval="required")
async def paid(i: int) -> None:
    print(f"begun {i} {time.time():.6f}", flush=True)


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_for_cancel(i: int) -> None:
    print(f"asked {i}", flush=True)
    try:
        await anyio.sleep_forever()
    finally:
        print(f"stopped {i} {time.time():.6f}", flush=True)


@haltwise.task(name="bench:approval")
async def approval_target(i: int) -> None:
    await paid(i)


@haltwise.task(name="bench:cancel")
async def cancel_target(i: int) -> None:
    await wait_for_cancel(i)


async def main(url: str, trials: int, mode: str, block: str) -> None:
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            if mode == "approve":
                handle = await runtime.start(approval_target, i, task_id=f"a{block}-{i}")
                while not await runtime.approvals(f"a{block}-{i}"):
                    await anyio.sleep(0.001)
                print(f"asked {i}", flush=True)
            else:
                handle = await runtime.start(cancel_target, i, task_id=f"c{block}-{i}")
            await handle.outcome()
            print(f"final {i} {time.time():.6f}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
