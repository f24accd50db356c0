"""The process a cross-process pause benchmark pauses: one run at a time, each a loop of trivial
steps. Prints ``started I`` once run I is running, ``paused I WALLTIME`` as soon as this process
has it paused (its checkpoint recorded ``paused``), ``resumed I WALLTIME`` once it runs again
after an unpause, and ``final I WALLTIME STATE`` when it ends (a cancel ends it).

usage: python _pause_target.py STORE_URL TRIALS
"""

from __future__ import annotations

import sys
import time

import anyio

import haltwise


@haltwise.tool(cancel="interruptible", effect="none")
def tick(i: int) -> int:
    return i


@haltwise.task(name="bench:ticker")
async def ticker() -> None:
    i = 0
    while True:
        await tick(i)
        i += 1


async def watch(runtime: haltwise.Runtime, run_id: str, i: int) -> None:
    """Poll this process's own view of the run (0.2 ms): when it paused, when it went on."""
    while not runtime.is_paused(run_id):
        await anyio.sleep(0.0002)
    print(f"paused {i} {time.time():.6f}", flush=True)
    while runtime.is_paused(run_id):
        await anyio.sleep(0.0002)
    print(f"resumed {i} {time.time():.6f}", flush=True)


async def main(url: str, trials: int) -> None:
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            handle = await runtime.start(ticker, task_id=f"p{i}")
            print(f"started {i}", flush=True)
            async with anyio.create_task_group() as group:
                group.start_soon(watch, runtime, handle.id, i)
                outcome = await handle.outcome()
                group.cancel_scope.cancel()
            print(f"final {i} {time.time():.6f} {outcome.state.value}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
