"""One measurement for ``compare_revisions.py``, run in a fresh process against whichever
haltwise ``PYTHONPATH`` points at; prints one number per fresh database.

usage: python _measure_once.py scale RUNS EFFECT   (durable steps per second, 20-step runs)
       python _measure_once.py scalecpu RUNS EFFECT   (CPU us per step of the same: every
                                                   thread of the process, so less moved by
                                                   the disk and the load than steps per second)
       python _measure_once.py scalewrites RUNS EFFECT   (KiB the process wrote per step of
                                                   the same: the WAL's frames, the checkpoints'
                                                   copies, any temporary file; Linux only)
       python _measure_once.py sequential STEPS SYNCHRONOUS   (us per step, one run)
       python _measure_once.py runs RUNS EFFECT   (us per run of RUNS concurrent runs of no
                                                   steps: a run's fixed costs)
       python _measure_once.py cpu STEPS POLICY   (CPU us per step of one run, synchronous=OFF:
                                                   the step's own Python, without the disk)
       python _measure_once.py pgcpu RUNS EFFECT   (scalecpu on PostgreSQL: a fresh database
                                                   per measurement on the server at
                                                   $HALTWISE_BENCH_PG, a server DSN)
       python _measure_once.py pgcalls RUNS EFFECT   (the Python calls per step of the same,
                                                   coroutine resumptions included: counted,
                                                   so the load does not move it)

Only haltwise's public API is used, so that any revision can be measured.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
from _peer_haltwise import trivial_run

import haltwise

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # for _pg

DATABASES = 2
#: a few runs end in a few milliseconds, which the machine's other work moves a lot: so many
#: runs take more fresh databases per measurement (10 runs: 10, 100 runs: 6)
_STEPS_PER_MEASUREMENT = 600
_MAX_DATABASES = 10


async def concurrent(
    url: str, runs: int, steps: int, effect: str, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds for ``runs`` runs of ``steps`` steps, started together, to be final (by
    ``clock``: wall time, or ``time.process_time`` for the CPU they took)."""

    async def one(runtime: haltwise.Runtime, k: int) -> None:
        handle = await runtime.start(trivial_run, steps, effect, task_id=f"run-{k}")
        if (await handle.outcome()).state is not haltwise.State.COMPLETED:
            raise SystemExit(f"run {k} did not complete")

    async with haltwise.Runtime(url) as runtime:
        start = clock()
        async with anyio.create_task_group() as group:
            for k in range(runs):
                group.start_soon(one, runtime, k)
        return clock() - start


@haltwise.tool(cancel="finish", effect="none")
async def trivial_finish(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="none")
async def trivial_interruptible(i: int) -> int:
    return i


@haltwise.task(name="compare:policy_steps")
async def policy_steps(n: int, policy: str) -> int:
    tool = trivial_finish if policy == "finish" else trivial_interruptible
    total = 0
    for i in range(n):
        total += await tool(i)
    return total


async def cpu_per_step(url: str, steps: int, policy: str) -> float:
    """CPU time (every thread of the process) per step of one run, after a warm-up run."""
    async with haltwise.Runtime(url) as runtime:
        await (await runtime.start(policy_steps, 50, policy, task_id="warm-up")).outcome()
        start = time.process_time()
        await (await runtime.start(policy_steps, steps, policy, task_id="cpu")).outcome()
        return (time.process_time() - start) / steps * 1e6


async def sequential(url: str, steps: int) -> float:
    async with haltwise.Runtime(url) as runtime:
        start = time.perf_counter()
        handle = await runtime.start(trivial_run, steps, "none", task_id="sequential")
        await handle.outcome()
        return (time.perf_counter() - start) / steps * 1e6


class CallCounter:
    """A clock for :func:`concurrent` that reads the Python calls made so far in this thread
    (coroutine resumptions included) while it is :meth:`installed`, instead of the time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        return float(self.calls)

    def _count(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1

    def installed(self) -> CallCounter:
        sys.setprofile(self._count)
        return self


def _postgres_url() -> str:
    """A fresh database on the server at ``$HALTWISE_BENCH_PG`` (compare_revisions starts it)."""
    from _pg import create_database

    return create_database(os.environ["HALTWISE_BENCH_PG"], prefix="compare")


def _written_kib() -> float:
    """KiB this process has written so far, by any system call (``wchar`` of /proc/self/io)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1]) / 1024
    raise SystemExit("no wchar in /proc/self/io")


def main() -> None:
    kind, size, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    databases = DATABASES
    if kind.startswith(("scale", "pg")):
        databases = min(_MAX_DATABASES, max(DATABASES, _STEPS_PER_MEASUREMENT // size))
    for _ in range(databases):
        path = f"{tempfile.mkdtemp(prefix='haltwise-compare-')}/journal.db"
        if kind == "scale":
            print(size * 20 / anyio.run(concurrent, f"sqlite:///{path}", size, 20, setting))
        elif kind == "scalewrites":
            kib = anyio.run(concurrent, f"sqlite:///{path}", size, 20, setting, _written_kib)
            print(kib / (size * 20))
        elif kind == "scalecpu":
            cpu = anyio.run(concurrent, f"sqlite:///{path}", size, 20, setting, time.process_time)
            print(cpu / (size * 20) * 1e6)
        elif kind == "pgcpu":
            cpu = anyio.run(concurrent, _postgres_url(), size, 20, setting, time.process_time)
            print(cpu / (size * 20) * 1e6)
        elif kind == "pgcalls":
            counter = CallCounter()
            url = _postgres_url()
            try:
                calls = anyio.run(concurrent, url, size, 20, setting, counter.installed())
            finally:
                sys.setprofile(None)
            print(calls / (size * 20))
        elif kind == "cpu":
            print(anyio.run(cpu_per_step, f"sqlite:///{path}?synchronous=off", size, setting))
        elif kind == "runs":
            print(anyio.run(concurrent, f"sqlite:///{path}", size, 0, setting) / size * 1e6)
        else:
            print(anyio.run(sequential, f"sqlite:///{path}?synchronous={setting}", size))


if __name__ == "__main__":
    main()
