"""Starts run ``held`` whose only step (finish, not idempotent) waits forever; prints "in flight".

usage: python hold_agent.py STORE_URL DIR
"""

from __future__ import annotations

import sys

import anyio

import haltwise


@haltwise.tool(cancel="finish", effect="external")
async def hold() -> None:
    print("in flight", flush=True)
    await anyio.sleep_forever()


@haltwise.task(name="hold_agent:holder")
async def holder() -> None:
    await hold()


async def main(store: str) -> None:
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(holder, task_id="held")
        await handle.outcome()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
