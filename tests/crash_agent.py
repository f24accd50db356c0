"""A 30-step agent run in a subprocess that the crash tests kill -9 and resume.

Its tools change a small "world" on disk so that effects survive the kill: a rollback step
creates ``world/w-INDEX`` (its compensation removes it), an idempotent charge appends
``INDEX KEY`` to ``charges`` and every execution of any step appends to ``executions``.

While the world holds a file named ``hold``, every step's body waits just after it logged its
execution: a test keeps steps in flight with it, for as long as it needs, however loaded the
machine.

usage: python crash_agent.py STORE_URL RUN_ID WORLD_DIR  (CRASH_AS_CHILD=1: as a child run)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

import haltwise

WORLD = Path(sys.argv[3] if len(sys.argv) > 3 else ".")
STEPS = 30
HOLD = WORLD / "hold"


def _log(name: str, line: str) -> None:
    with open(WORLD / name, "a") as handle:
        handle.write(line + "\n")


def remove_note(index: int) -> None:
    _log("executions", f"undo {index}")
    try:
        os.remove(WORLD / f"w-{index}")
    except FileNotFoundError:
        pass


@haltwise.tool(cancel="interruptible", effect="read")
async def look(index: int) -> int:
    _log("executions", f"look {index}")
    while HOLD.exists():
        await anyio.sleep(0.005)
    await anyio.sleep(0.01)
    return index * 2


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=5)
async def charge(index: int) -> str:
    key = haltwise.idempotency_key()
    _log("executions", f"charge {index}")
    while HOLD.exists():
        await anyio.sleep(0.005)
    await anyio.sleep(0.01)
    _log("charges", f"{index} {key}")
    return f"charged-{index}"


@haltwise.tool(cancel="rollback", effect="write", compensate=remove_note, grace=5)
def note(index: int) -> str:
    _log("executions", f"note {index}")
    _log(f"w-{index}", str(index))
    while HOLD.exists():
        time.sleep(0.005)
    time.sleep(0.01)  # a kill landing here leaves the note written but the step running
    return f"note-{index}"


@haltwise.task(name="crash_agent:thirty")
async def thirty() -> list[object]:
    results: list[object] = []
    for index in range(STEPS):
        kind = index % 3
        if kind == 0:
            value: object = await look(index)
        elif kind == 1:
            value = await charge(index)
        else:
            value = await note(index)
        results.append(value)
        haltwise.emit({"index": index, "value": value})
    return results


@haltwise.task(name="crash_agent:parent")
async def parent() -> list[object]:
    """``thirty`` as a child run (``RUN_ID/0``): its parent's one step."""
    return [await thirty()]


async def main(store: str, run_id: str, task: haltwise.Task[..., Any] = thirty) -> int:
    """Resume run ``run_id`` of ``task``, or start it; print ``started``, then its state."""
    async with haltwise.Runtime(store) as runtime:
        try:
            handle = await runtime.resume(run_id)
        except haltwise.UnknownRunError:
            handle = await runtime.start(task, task_id=run_id)
        except haltwise.RunOwnedError as owned:
            print(f"owned: {owned}", flush=True)
            return 2
        print("started", flush=True)
        outcome = await handle.outcome()
    print(outcome.state.value, flush=True)
    return 0 if outcome.state is haltwise.State.COMPLETED else 1


if __name__ == "__main__":
    # CRASH_AS_CHILD=1: the thirty steps run as a child run of a parent (the soak's variant)
    as_child = os.environ.get("CRASH_AS_CHILD") == "1"
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2], parent if as_child else thirty))
