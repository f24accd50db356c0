"""A one-step agent run in a subprocess that test_stall stops (SIGSTOP) before its step's body.

Its runtime passes for one on another host (``STALL_HOST``), so that only its lease, not its
pid, tells the others whether it is alive, and its lease is short (``STALL_LEASE`` seconds).
With ``STALL=1`` the step's start is journaled, then the agent creates ``WORLD/ready`` and
waits, before the body, until ``WORLD/go`` exists: the test stops it there. Every execution of
the charge's body appends a line to ``WORLD/effects``.

usage: python stall_agent.py STORE_URL RUN_ID WORLD_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

import haltwise
from haltwise._journal import owner
from haltwise._runtime import lowlevel

WORLD = Path(sys.argv[3])
if os.environ.get("STALL_HOST"):
    owner.HOST = os.environ["STALL_HOST"]


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def charge(amount: int) -> str:
    with open(WORLD / "effects", "a") as effects:
        effects.write(f"{amount} {haltwise.idempotency_key()}\n")
    return f"charged-{amount}"


@haltwise.task(name="stall_agent:pay")
async def pay() -> str:
    return await charge(5)


async def stall_before_the_body(kind: str, index: int) -> None:
    if kind != "during":
        return
    (WORLD / "ready").touch()
    with anyio.fail_after(120):
        while not (WORLD / "go").exists():
            await anyio.sleep(0.01)


async def main(store: str, run_id: str) -> int:
    probe = stall_before_the_body if os.environ.get("STALL") == "1" else None
    lease = float(os.environ.get("STALL_LEASE", "15"))
    async with haltwise.Runtime(store, lease=lease) as runtime:
        try:
            handle = await runtime.resume(run_id)
        except haltwise.UnknownRunError:
            # the probe is the runtime's own test hook (haltwise.testing uses it likewise)
            handle = await lowlevel.launch(runtime, pay, task_id=run_id, probe=probe)
        except haltwise.RunOwnedError as owned:
            print(f"owned: {owned}", flush=True)
            return 2
        print("started", flush=True)
        outcome = await handle.outcome()
    print(outcome.state.value, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2]))
