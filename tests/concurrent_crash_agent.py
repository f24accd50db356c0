"""An agent that makes four tool calls at once per round, killed -9 and resumed by the tests.

Each round gathers an interruptible read, an idempotent finish charge, a rollback note (a plain
function: it writes ``world/w-ROUND``, its compensation removes it) and a second read, each under
its own call id. Every execution appends to ``world/executions``; a charge appends
``ROUND KEY`` to ``world/charges``.

usage: python concurrent_crash_agent.py STORE_URL RUN_ID WORLD_DIR
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import anyio

import haltwise

WORLD = Path(sys.argv[3] if len(sys.argv) > 3 else ".")
ROUNDS = 6
DELAY = float(os.environ.get("CRASH_STEP_DELAY", "0.02"))


def _log(name: str, line: str) -> None:
    with open(WORLD / name, "a") as handle:
        handle.write(line + "\n")


def remove_note(round_: int) -> None:
    _log("executions", f"undo {round_}")
    try:
        os.remove(WORLD / f"w-{round_}")
    except FileNotFoundError:
        pass


@haltwise.tool(cancel="interruptible", effect="read")
async def look(round_: int, which: str) -> str:
    _log("executions", f"look-{which} {round_}")
    await anyio.sleep(DELAY)
    return f"{which}{round_}"


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=5)
async def charge(round_: int) -> str:
    key = haltwise.idempotency_key()
    _log("executions", f"charge {round_}")
    await anyio.sleep(DELAY)
    _log("charges", f"{round_} {key}")
    return f"charged-{round_}"


@haltwise.tool(cancel="rollback", effect="write", compensate=remove_note, grace=5)
def note(round_: int) -> str:
    _log("executions", f"note {round_}")
    _log(f"w-{round_}", str(round_))
    time.sleep(DELAY)  # a kill landing here leaves the note written but the step running
    return f"note-{round_}"


async def _call(call: str, tool: haltwise.Tool[..., str], *args: object) -> str:
    with haltwise.call_id(call):
        return await tool(*args)


@haltwise.task(name="concurrent_crash_agent:rounds")
async def rounds() -> list[list[str]]:
    results: list[list[str]] = []
    for r in range(ROUNDS):
        batch = await asyncio.gather(
            _call(f"r{r}-a", look, r, "a"),
            _call(f"r{r}-charge", charge, r),
            _call(f"r{r}-note", note, r),
            _call(f"r{r}-b", look, r, "b"),
        )
        results.append(list(batch))
        haltwise.emit({"round": r})
    return results


async def main(store: str, run_id: str) -> int:
    async with haltwise.Runtime(store) as runtime:
        try:
            handle = await runtime.resume(run_id)
        except haltwise.UnknownRunError:
            handle = await runtime.start(rounds, task_id=run_id)
        print("started", flush=True)
        outcome = await handle.outcome()
    print(outcome.state.value, flush=True)
    return 0 if outcome.state is haltwise.State.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2]))
