"""An order paid through a fake payment provider, in a subprocess the reconcile tests kill -9 (or
in the test's own process, for a forced cancel).

The provider is a ledger on disk, ``WORLD/ledger``: each charge appends ``KEY AMOUNT``; it can
be asked whether a charge with a key exists. The paying tool is ``finish``, ``external`` and
not idempotent; its ``reconcile`` hook asks the ledger by the step's idempotency key. What the
hook does is read from ``WORLD/hook`` (``ledger``: answer from the ledger, the default;
``none``: return None; ``raise``: raise). ``WORLD/hold-before`` holds the charge before it
reaches the provider, ``WORLD/hold-after`` after it did (the body waits while the file exists);
``WORLD/paying`` is written once the body has begun, ``WORLD/charged`` once the charge is in
the ledger.

usage: python reconcile_agent.py STORE_URL RUN_ID WORLD_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

import haltwise

WORLD = Path(os.environ.get("RECONCILE_WORLD", "."))


def world() -> Path:
    return WORLD


def use_world(path: Path) -> None:
    """Point the agent (imported by a test) at ``path``."""
    global WORLD
    WORLD = path


def charges() -> list[tuple[str, int]]:
    """The provider's ledger: every charge made, ``(key, amount)``, oldest first."""
    ledger = world() / "ledger"
    if not ledger.exists():
        return []
    pairs = (line.split() for line in ledger.read_text().splitlines() if line)
    return [(key, int(amount)) for key, amount in pairs]


def find_charge(amount: int) -> haltwise.Happened | haltwise.NotHappened | None:
    """The reconcile hook: asks the provider for the charge of this step's key."""
    mode = (world() / "hook").read_text().strip() if (world() / "hook").exists() else "ledger"
    if mode == "none":
        return None
    if mode == "raise":
        raise ConnectionError("the provider does not answer")
    key = haltwise.idempotency_key()
    if any(charged == key for charged, _ in charges()):
        return haltwise.Happened(f"receipt-{amount}")
    return haltwise.NotHappened()


@haltwise.tool(cancel="finish", effect="external", grace=30, reconcile=find_charge)
async def pay_for_order(amount: int) -> str:
    (world() / "paying").write_text("1")
    while (world() / "hold-before").exists():
        await anyio.sleep(0.005)
    with open(world() / "ledger", "a") as ledger:
        ledger.write(f"{haltwise.idempotency_key()} {amount}\n")
    (world() / "charged").write_text("1")
    while (world() / "hold-after").exists():
        await anyio.sleep(0.005)
    return f"receipt-{amount}"


@haltwise.tool(cancel="interruptible", effect="none")
async def confirm(receipt: str) -> str:
    return f"confirmed {receipt}"


@haltwise.task(name="reconcile_agent:order")
async def order(amount: int) -> list[str]:
    receipt = await pay_for_order(amount)
    return [receipt, await confirm(receipt)]


async def main(store: str, run_id: str) -> int:
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(order, 42, task_id=run_id)
        print("started", flush=True)
        outcome = await handle.outcome()
    print(outcome.state.value, flush=True)
    return 0


if __name__ == "__main__":
    WORLD = Path(sys.argv[3])
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2]))
