"""A worker process of the fleet tests: works the runs of fleet_agent.py's tasks in one store.

Prints ``ready PID`` once it is serving. SIGTERM or SIGINT: it prints ``stopping``, stops taking
runs, hands over the ones it holds (in-flight steps settle by their policy) and exits 0. A second
signal makes it exit at once, as after a crash, with 128 + the signal's number.

usage: python fleet_worker.py STORE_URL WORLD_DIR [CONCURRENCY] [LEASE_SECONDS]
"""

from __future__ import annotations

import os
import signal
import sys

import anyio
import anyio.abc

import fleet_agent
import haltwise
from haltwise._runtime.worker import Worker


async def _watch_signals(
    stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            if stop.is_set():
                os._exit(128 + signum)
            print("stopping", flush=True)
            stop.set()


async def main(url: str, concurrency: int, lease: float) -> int:
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        # Watching signals outside the runtime's block: a second signal during the hand-over or
        # the runtime's close still exits at once.
        await group.start(_watch_signals, stop)
        async with haltwise.Runtime(url, lease=lease) as runtime:
            worker = Worker(runtime, fleet_agent.TASKS, concurrency=concurrency)
            print(f"ready {os.getpid()}", flush=True)
            await worker.serve(stop)
        group.cancel_scope.cancel()
    return 0


if __name__ == "__main__":
    os.environ["FLEET_WORLD"] = sys.argv[2]
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    lease = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    sys.exit(anyio.run(main, sys.argv[1], concurrency, lease))
