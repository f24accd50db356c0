"""Runs ``ticks``: trivial steps, each logged in ``DIR/ticks.log``, until ``DIR/stop`` exists;
prints "started", then the run's final state.

usage: python tick_agent.py STORE_URL DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

import haltwise

LOG: Path


@haltwise.tool(cancel="interruptible", effect="write")
def tick(i: int) -> int:
    with LOG.open("a") as log:
        log.write(f"{i}\n")
    return i


@haltwise.task(name="tick_agent:ticks")
async def ticks() -> int:
    """Not deterministic on resume (it reads the disk outside a step): it is never resumed."""
    i = 0
    while not (LOG.parent / "stop").exists():
        await tick(i)
        i += 1
    return i


async def main(store: str) -> None:
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(ticks, task_id="ticks")
        print("started", flush=True)
        outcome = await handle.outcome()
        print(outcome.state.value, flush=True)


if __name__ == "__main__":
    LOG = Path(sys.argv[2]) / "ticks.log"
    anyio.run(main, sys.argv[1])
