"""A process that works runs one after another in a SQLite store, for the test of a write-ahead
log deleted under it (tests/journal/test_faults.py).

Prints ``done N`` once run ``wN`` (a read, then a charge) is ``completed``: that completion was
acknowledged to this process's caller. When the store fails (its log was deleted), prints
``lost: ERROR`` on one line and waits to be killed: it never closes the store (a close would
checkpoint the log), so a kill -9 is how it ends, as a crash would end it.

usage: python wal_writer.py STORE_URL
"""

from __future__ import annotations

import sys

import anyio

import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def look(n: int) -> int:
    return n


@haltwise.tool(cancel="finish", effect="external")
async def charge(n: int) -> str:
    return f"charged-{n}"


@haltwise.task(name="wal:job")
async def job(n: int) -> list[object]:
    return [await look(n), await charge(n)]


async def main(url: str) -> None:
    async with haltwise.Runtime(url) as runtime:
        n = 0
        while True:
            try:
                outcome = await (await runtime.start(job, n, task_id=f"w{n}")).outcome()
            except haltwise.StoreError as error:
                print("lost:", " ".join(str(error).split()), flush=True)
                await anyio.sleep_forever()  # until killed: no close, no checkpoint
            print(f"done {n} {outcome.state.value}", flush=True)
            n += 1


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
