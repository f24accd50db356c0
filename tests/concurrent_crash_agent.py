"""The crash agent's tools, four calls at once per round: killed -9 and resumed by the tests.

Each round gathers an interruptible read, an idempotent finish charge, a rollback note (a plain
function: its compensation removes the note) and a second read, each under its own call id, on
step numbers ``4 * ROUND`` to ``4 * ROUND + 3`` (the tools log them, see ``crash_agent``).

usage: python concurrent_crash_agent.py STORE_URL RUN_ID WORLD_DIR
"""

from __future__ import annotations

import asyncio
import sys

import anyio

import haltwise
from crash_agent import charge, look, main, note

ROUNDS = 6
KINDS = (look, charge, note, look)


async def _call(number: int) -> object:
    with haltwise.call_id(f"call-{number}"):
        return await KINDS[number % 4](number)


@haltwise.task(name="concurrent_crash_agent:rounds")
async def rounds() -> list[list[object]]:
    results: list[list[object]] = []
    for r in range(ROUNDS):
        results.append(list(await asyncio.gather(*(_call(4 * r + k) for k in range(4)))))
        haltwise.emit({"round": r})
    return results


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2], rounds))
