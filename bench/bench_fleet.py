"""A fleet of worker processes on one PostgreSQL, side by side with the same on one SQLite file.

1. Throughput: ``--runs`` (400) runs of a trivial 10-step task (each step an interruptible
   ``effect="read"`` tool that returns at once) are recorded ``pending``; then 1, 2 and 4 worker
   processes (each working 4 runs at a time, the default) are told to go at the same moment. The
   clock runs from "go" to the completion of the last run (its journaled completion time).
2. Cancel latency: a worker process works one run at a time, its step waiting in an interruptible
   tool; this process calls ``Runtime.cancel`` (what ``haltwise cancel ID`` does). Measured on
   the wall clock (both processes on this host): request -> the worker's tool interrupted, and
   request -> the run recorded ``cancelled`` by the worker. On PostgreSQL the worker hears of the
   request by LISTEN/NOTIFY; on SQLite by polling ``PRAGMA data_version`` every 5 ms.

Both stores are durable at every commit: SQLite in WAL mode with ``synchronous=FULL``; the
PostgreSQL server is a throwaway cluster on loopback (``tests/_pg.py``) switched back to
``fsync=on``, ``full_page_writes=on``, ``synchronous_commit=on``.

usage: python bench/bench_fleet.py [--runs N] [--workers 1,2,4] [--trials N] [--repeat N]
       (``--worker URL CONCURRENCY`` is how this script runs its worker processes)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import anyio.abc
from _cancel_target import wait_for_cancel
from _report import header, median, percentile, read_event, table

import haltwise
from haltwise._journal.store import NewRun
from haltwise._runtime.worker import Worker

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # for _pg: the tests' throwaway PostgreSQL
from _pg import PostgresServer, PostgresUnavailable, create_database  # noqa: E402

STEPS = 10
CONCURRENCY = 4


# -- the tasks the workers run ------------------------------------------------------------------


@haltwise.tool(cancel="interruptible", effect="read")
async def noop(k: int) -> int:
    return k


@haltwise.task(name="bench_fleet:ten")
async def ten() -> int:
    for k in range(STEPS):
        await noop(k)
    return STEPS


@haltwise.task(name="bench_fleet:wait")
async def wait(i: int) -> None:
    await wait_for_cancel(i)


TASKS: dict[str, haltwise.Task[..., object]] = {"bench_fleet:ten": ten, "bench_fleet:wait": wait}


# -- the child processes ------------------------------------------------------------------------


async def _stop_on_signal(
    stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()


async def serve(url: str, concurrency: int) -> None:
    """``--worker``: open the store, print ``ready``, wait for a line on stdin, work until
    SIGTERM."""
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        await group.start(_stop_on_signal, stop)
        async with haltwise.Runtime(url) as runtime:
            worker = Worker(runtime, TASKS, concurrency=concurrency)
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            await worker.serve(stop)
        group.cancel_scope.cancel()


def spawn(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"a worker did not start: {line!r}")
    return proc


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        if proc.wait(timeout=60) != 0:
            raise RuntimeError(f"a worker exited with {proc.returncode}")


# -- throughput ---------------------------------------------------------------------------------


async def submit(url: str, task: str, ids: list[str]) -> None:
    async with haltwise.Runtime(url) as runtime:
        for run_id in ids:
            await runtime.store.create_run(
                NewRun(id=run_id, task=task, inputs={"args": [], "kwargs": {}})
            )


async def last_completion(url: str, count: int) -> float:
    """Wait until ``count`` runs are final (all completed); return the last completion time."""
    async with haltwise.Runtime(url) as runtime:
        while True:
            runs = await runtime.store.list_runs()
            if sum(run.state.is_final for run in runs) >= count:
                break
            await anyio.sleep(0.05)  # the polling interval; the end time comes from the journal
        assert all(run.state is haltwise.State.COMPLETED for run in runs), "a run did not complete"
        return max(run.updated_at for run in runs)


def throughput(url: str, workers: int, runs: int) -> float:
    """Runs per second of ``workers`` processes working ``runs`` pending runs of ``ten``."""
    anyio.run(submit, url, "bench_fleet:ten", [f"t{i}" for i in range(runs)])
    procs = [spawn("--worker", url, str(CONCURRENCY)) for _ in range(workers)]
    try:
        go = time.time()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        end = anyio.run(last_completion, url, runs)
        stop_all(procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return runs / (end - go)


# -- cancel latency -----------------------------------------------------------------------------


async def cancel_latencies(url: str, trials: int) -> tuple[list[float], list[float]]:
    """(request -> tool interrupted, request -> run cancelled) for ``trials`` cancels."""
    proc = spawn("--worker", url, "1")
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    stopped, final = [], []
    try:
        async with haltwise.Runtime(url) as runtime:
            for i in range(trials):
                run_id = f"c{i}"
                await runtime.store.create_run(
                    NewRun(id=run_id, task="bench_fleet:wait", inputs={"args": [i], "kwargs": {}})
                )
                await anyio.to_thread.run_sync(read_event, proc, "entered")
                start = time.time()
                await runtime.cancel(run_id)
                fields = await anyio.to_thread.run_sync(read_event, proc, "stopped")
                stopped.append(float(fields[2]) - start)
                outcome = await runtime.outcome(run_id)
                assert outcome.state is haltwise.State.CANCELLED, outcome
                events = await runtime.store.events(run_id)
                final.append(events[-1].at - start)
        stop_all([proc])
    finally:
        proc.kill()
        proc.wait()
    return stopped, final


# -- the stores and the report ------------------------------------------------------------------


class Stores:
    """Fresh databases: a new SQLite file, or a new database on one durable PostgreSQL server."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.numbers = iter(range(1, 1_000_000))
        self.server: PostgresServer | None = None
        self.pg_version = ""
        self.pg_missing = ""
        try:
            import psycopg
            import psycopg_pool  # noqa: F401  (the PostgreSQL store needs it)
        except ImportError as error:
            self.pg_missing = f"{error}: pip install 'haltwise[postgres]'"
            return
        try:
            server = PostgresServer(durable=True)
            server.start()
        except (PostgresUnavailable, RuntimeError) as error:
            self.pg_missing = str(error)
            return
        self.server = server
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            # Read back, not assumed: an ALTER SYSTEM cannot override the server's command line
            # (the fleet numbers before 2026-12-01 were measured with fsync off because of it).
            settings = [("fsync", "on"), ("full_page_writes", "on"), ("synchronous_commit", "on")]
            for name, expected in settings:
                found = conn.execute(f"SHOW {name}").fetchone()
                if not found or found[0] != expected:
                    raise RuntimeError(f"the benchmark server has {name}={found}, not {expected}")
            row = conn.execute("SHOW server_version").fetchone()
            self.pg_version = str(row[0]) if row else "?"

    def url(self, kind: str) -> str:
        number = next(self.numbers)
        if kind == "sqlite":
            return f"sqlite:///{self.base / f'fleet-{number}.db'}"
        assert self.server is not None
        return create_database(self.server.dsn, prefix="bench")

    @property
    def kinds(self) -> list[str]:
        return ["postgres", "sqlite"] if self.server is not None else ["sqlite"]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400, help="runs per throughput measurement")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts")
    parser.add_argument("--trials", type=int, default=200, help="cancels per store")
    parser.add_argument("--repeat", type=int, default=2, help="fresh databases per cell (median)")
    parser.add_argument("--worker", nargs=2, metavar=("URL", "CONCURRENCY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(serve, args.worker[0], int(args.worker[1]))
        return
    stores = Stores(Path(tempfile.mkdtemp(prefix="haltwise-bench-fleet-")))
    try:
        report(stores, args)
    finally:
        stores.close()


def report(stores: Stores, args: argparse.Namespace) -> None:
    print(header("A fleet of workers: PostgreSQL and SQLite side by side"))
    print(f"- cores: {os.cpu_count()}")
    if stores.server is not None:
        print(f"- PostgreSQL {stores.pg_version} on loopback, fsync=on, synchronous_commit=on")
    else:
        print(f"- PostgreSQL: not measured ({stores.pg_missing})")
    print("- SQLite: one file, WAL, synchronous=FULL\n")
    counts = [int(n) for n in args.workers.split(",")]
    rates: dict[tuple[str, int], float] = {}
    for workers in counts:
        for kind in stores.kinds:
            rates[(kind, workers)] = median(
                [throughput(stores.url(kind), workers, args.runs) for _ in range(args.repeat)]
            )
    rows = []
    for workers in counts:
        row: list[object] = [workers, workers * CONCURRENCY]
        for kind in stores.kinds:
            rate = rates[(kind, workers)]
            row += [f"{rate:.0f}", f"{rate * STEPS:.0f}"]
        rows.append(row)
    heads = ["worker processes", "runs at a time"]
    for kind in stores.kinds:
        heads += [f"{kind} runs/s", f"{kind} steps/s"]
    print(
        f"Throughput: {args.runs} pending runs of {STEPS} trivial steps each, median of "
        f"{args.repeat} fresh databases; from go to the last completion:\n"
    )
    print(table(heads, rows))
    print()
    lat_rows = []
    for kind in stores.kinds:
        stopped, final = anyio.run(cancel_latencies, stores.url(kind), args.trials)
        for what, values in (("tool interrupted", stopped), ("run cancelled", final)):
            lat_rows.append(
                [
                    kind,
                    f"request -> {what}",
                    len(values),
                    f"{percentile(values, 0.5) * 1e3:.2f}",
                    f"{percentile(values, 0.99) * 1e3:.2f}",
                    f"{max(values) * 1e3:.2f}",
                ]
            )
    print(
        "Cancel latency: `Runtime.cancel` in this process, the run's step waiting in an "
        "interruptible tool in a worker process:\n"
    )
    print(table(["store", "what", "trials", "p50 ms", "p99 ms", "max ms"], lat_rows))


if __name__ == "__main__":
    main()
