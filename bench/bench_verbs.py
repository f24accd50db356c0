"""Pause latency, in process and from another process, beside a cancel of the same run, and
what a retried step costs beside a plain one (SQLite).

The run is a loop of trivial steps (``tick``: interruptible, effect none), so a pause lands at
the next checkpoint, between two steps. Measured:

1. In process: ``Runtime.pause`` -> the run recorded ``paused`` (the checkpoint's transition
   committed), and ``Runtime.unpause`` -> stepping again; the baseline in the same run is
   ``Runtime.cancel`` of the same kind of run -> recorded ``cancelled``.
2. From another process (wall clock, both on this host): this process calls ``Runtime.pause``
   on a run the other process works; request -> paused there, unpause -> running there; the
   baseline is a cancel of the same kind of run -> final there.

3. Per step, in one run of ``--steps`` steps (median of ``--repeat`` fresh stores): a plain
   step (interruptible, effect ``write``, so each settlement is a durable commit), the same tool
   declared ``retries=3`` (nothing fails: the machinery's cost), declared ``timeout=30`` (a
   timer per call), and one whose every call fails once and is retried at once (``backoff=(0,
   1, 0)``): two attempts, each journaled, the first one's error kept. All async functions
   (a plain function's thread start would be most of the difference); ``synchronous=NORMAL``
   (no sync per commit: the CPU and statement costs) and ``FULL`` (every commit synced).

With ``--postgres``, the latency table again on a throwaway PostgreSQL cluster (the tests'
``_pg``: ``HALTWISE_PG_BIN`` or the PATH's binaries).

With ``--idle SECONDS``, the CPU of a process whose one run waits paused, at SQLite's watcher
poll interval and at two shorter ones (what a quicker cross-process unpause would cost).

usage: python bench/bench_verbs.py [--trials N] [--steps N] [--repeat N] [--postgres]
       [--idle SECONDS]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from _report import header, percentile, read_event, table

import haltwise
import haltwise._journal.sqlite as sqlite_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _pause_target import ticker  # noqa: E402

#: how long a run ticks before it is paused or cancelled (seconds)
_WARMUP = 0.01


async def until_paused(rt: haltwise.Runtime, run_id: str, paused: bool) -> None:
    """Poll this process's own view of the run (0.2 ms) until it is (not) paused."""
    while rt.is_paused(run_id) is not paused:
        await anyio.sleep(0.0002)


async def in_process(url: str, trials: int) -> tuple[list[float], list[float], list[float]]:
    paused, resumed, cancelled = [], [], []
    async with haltwise.Runtime(url) as rt:
        for i in range(trials):
            handle = await rt.start(ticker, task_id=f"p{i}")
            await anyio.sleep(_WARMUP)
            start = time.perf_counter()
            await handle.pause()
            await until_paused(rt, handle.id, True)
            paused.append(time.perf_counter() - start)
            start = time.perf_counter()
            await handle.unpause()
            await until_paused(rt, handle.id, False)
            resumed.append(time.perf_counter() - start)
            await handle.cancel()
            await handle.outcome()
            other = await rt.start(ticker, task_id=f"c{i}")
            await anyio.sleep(_WARMUP)
            start = time.perf_counter()
            await other.cancel()
            await other.outcome()
            cancelled.append(time.perf_counter() - start)
    return paused, resumed, cancelled


async def cross_process(url: str, trials: int) -> tuple[list[float], list[float], list[float]]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_pause_target.py"), url, str(2 * trials)],
        stdout=subprocess.PIPE,
        text=True,
    )
    paused, resumed, cancelled = [], [], []
    async with haltwise.Runtime(url) as rt:
        for i in range(2 * trials):
            await anyio.to_thread.run_sync(read_event, proc, "started")
            await anyio.sleep(_WARMUP)
            run_id = f"p{i}"
            if i % 2:  # the baseline: a cancel of the same kind of run
                start = time.time()
                await rt.cancel(run_id)
                final = await anyio.to_thread.run_sync(read_event, proc, "final")
                cancelled.append(float(final[2]) - start)
                continue
            start = time.time()
            await rt.pause(run_id)
            fields = await anyio.to_thread.run_sync(read_event, proc, "paused")
            paused.append(float(fields[2]) - start)
            start = time.time()
            await rt.unpause(run_id)
            fields = await anyio.to_thread.run_sync(read_event, proc, "resumed")
            resumed.append(float(fields[2]) - start)
            await rt.cancel(run_id)
            await anyio.to_thread.run_sync(read_event, proc, "final")
    proc.wait(timeout=30)
    return paused, resumed, cancelled


@haltwise.tool(cancel="interruptible", effect="write")
async def plain(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="write", retries=3)
async def with_retries(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="write", timeout=30)
async def with_timeout(i: int) -> int:
    return i


FAILED_ONCE: set[int] = set()


@haltwise.tool(cancel="interruptible", effect="write", retries=1, backoff=(0, 1, 0))
async def fails_once(i: int) -> int:
    if i not in FAILED_ONCE:
        FAILED_ONCE.add(i)
        raise ConnectionError("the first attempt fails")
    return i


#: each kind of step, by the name the table shows; the first is the baseline of the others
STEP_KINDS = {
    "plain step": plain,
    "retries=3, nothing fails": with_retries,
    "timeout=30": with_timeout,
    "fails once, retried at once (2 attempts)": fails_once,
}


@haltwise.task(name="bench:steps_of")
async def steps_of(kind: str, n: int) -> None:
    tool = STEP_KINDS[kind]
    for i in range(n):
        await tool(i)


async def per_step(url: str, kind: str, n: int) -> float:
    FAILED_ONCE.clear()
    async with haltwise.Runtime(url) as rt:
        start = time.perf_counter()
        outcome = await (await rt.start(steps_of, kind, n)).outcome()
        elapsed = time.perf_counter() - start
    assert outcome.state is haltwise.State.COMPLETED, outcome
    return elapsed / n


def step_costs(base: Path, n: int, repeat: int, synchronous: str) -> list[list[object]]:
    """Median per-step time of each kind; the kinds alternate within each repetition, so that
    a slow spell of the disk falls on all of them alike."""
    times: dict[str, list[float]] = {kind: [] for kind in STEP_KINDS}
    for r in range(repeat):
        for number, kind in enumerate(STEP_KINDS):
            path = base / f"steps-{synchronous}-{number}-{r}.db"
            url = f"sqlite:///{path}?synchronous={synchronous}"
            times[kind].append(anyio.run(per_step, url, kind, n))
    medians = {kind: sorted(found)[len(found) // 2] for kind, found in times.items()}
    return [
        [
            f"{kind} ({synchronous.upper()})",
            n,
            f"{medians[kind] * 1e6:.0f}",
            f"{medians[kind] / medians['plain step']:.2f}x",
        ]
        for kind in STEP_KINDS
    ]


def row(name: str, values: list[float]) -> list[object]:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    return [name, len(values), f"{p50 * 1e3:.2f}", f"{p99 * 1e3:.2f}", f"{max(values) * 1e3:.2f}"]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def paused_cpu(url: str, interval: float, seconds: float) -> float:
    """This process's CPU (fraction of a core) while its one run waits paused for ``seconds``,
    with SQLite's watcher polling every ``interval`` (the default, or what a shorter one would
    cost: the only way a paused run learns of an unpause from another process)."""
    sqlite_store._POLL_INTERVAL = interval
    async with haltwise.Runtime(url) as rt:
        handle = await rt.start(ticker, task_id="idle")
        await anyio.sleep(_WARMUP)
        await handle.pause()
        await until_paused(rt, handle.id, True)
        before, start = cpu_seconds(), time.monotonic()
        await anyio.sleep(seconds)
        used = (cpu_seconds() - before) / (time.monotonic() - start)
        await handle.cancel()
        await handle.outcome()
    return used


def idle_table(base: Path, seconds: float) -> None:
    default = sqlite_store._POLL_INTERVAL
    rows = []
    try:
        for interval in (default, 0.005, 0.002):
            url = f"sqlite:///{base / f'idle-{interval}.db'}"
            used = anyio.run(paused_cpu, url, interval, seconds)
            name = f"{interval * 1e3:.0f} ms" + (" (the default)" if interval == default else "")
            rows.append([name, f"{seconds:.0f} s", f"{used * 100:.2f} %"])
    finally:
        sqlite_store._POLL_INTERVAL = default
    print("The CPU of a process while its one run waits paused (SQLite), by the watcher's poll:")
    print()
    print(table(["poll interval", "measured over", "CPU of a core"], rows))
    print()


def latencies(local_url: str, remote_url: str, trials: int) -> None:
    """The latency table: in this process on ``local_url``, across processes on ``remote_url``."""
    local = anyio.run(in_process, local_url, trials)
    remote = anyio.run(cross_process, remote_url, trials)
    rows = [
        row("same process: pause -> paused", local[0]),
        row("same process: unpause -> running", local[1]),
        row("baseline, same process: cancel -> cancelled", local[2]),
        row("other process: pause -> paused there", remote[0]),
        row("other process: unpause -> running there", remote[1]),
        row("baseline, other process: cancel -> final there", remote[2]),
    ]
    print(table(["what", "trials", "p50 ms", "p99 ms", "max ms"], rows))
    print()


def on_postgres(trials: int) -> None:
    """:func:`latencies` on a throwaway PostgreSQL cluster (requests reach the other process
    through LISTEN/NOTIFY, not a poll)."""
    sys.path.insert(0, str(HERE.parent / "tests"))  # for _pg: the tests' throwaway PostgreSQL
    from _pg import PostgresServer, create_database

    print("The same on PostgreSQL (a throwaway local cluster, default settings):")
    print()
    server = PostgresServer()
    server.start()
    try:
        latencies(create_database(server.dsn), create_database(server.dsn), trials)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="also the latency table on a throwaway PostgreSQL cluster (the tests' _pg)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also the CPU of a process whose run waits paused, by the watcher's poll interval",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="haltwise-verbs-"))
    print(header("Pause and unpause latency (SQLite, WAL + FULL)"))
    latencies(f"sqlite:///{base / 'local.db'}", f"sqlite:///{base / 'remote.db'}", args.trials)
    if args.postgres:
        on_postgres(args.trials)
    if args.idle:
        idle_table(base, args.idle)
    print("A step's cost (one run, median of fresh stores), beside a plain step of the same kind:")
    print()
    costs = [
        row
        for synchronous in ("normal", "full")
        for row in step_costs(base, args.steps, args.repeat, synchronous)
    ]
    print(table(["step", "steps", "us per step", "vs plain"], costs))


if __name__ == "__main__":
    main()
