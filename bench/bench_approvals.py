"""Approvals (issue 31): what a decision and a waiting request cost.

1. A decision from another process reaching the waiting run: this process decides
   (``Seat.decide``) a request of a run another process works; measured on the wall clock (both
   processes on this host) from the decision's call to the approved call's body beginning there.
   Baseline in the same run: a cancel from another process to the tool interrupted (the same
   watcher carries both).
2. 10,000 runs awaiting approval in one process: memory (RSS growth per run) and CPU while idle,
   against 10,000 runs waiting in an interruptible tool.
3. ``GET /api/approvals`` with 10,000 pending requests (a real ``haltwise serve``), against
   ``GET /api/runs?limit=100`` on the same store.

usage: python bench/bench_approvals.py [--store sqlite|postgres|both] [--trials N] [--runs N]
       [--idle-seconds S] [--gets N] [--parts decision,idle,get]
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _report import header, percentile, read_event, table

from haltwise._runtime.seat import open_seat

HERE = Path(__file__).resolve().parent


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def spawn(url: str, trials: int, mode: str, block: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_approval_target.py"), url, str(trials), mode, str(block)],
        stdout=subprocess.PIPE,
        text=True,
    )


async def decisions(url: str, trials: int, block: int) -> list[float]:
    proc = spawn(url, trials, "approve", block)
    latencies = []
    async with open_seat(url) as seat:
        for i in range(trials):
            await anyio.to_thread.run_sync(read_event, proc, "asked")
            start = time.time()
            await seat.decide(f"a{block}-{i}", 0, approve=True, by="bench")
            begun = await anyio.to_thread.run_sync(read_event, proc, "begun")
            latencies.append(float(begun[2]) - start)
            await anyio.to_thread.run_sync(read_event, proc, "final")
    proc.wait(timeout=60)
    return latencies


async def cancels(url: str, trials: int, block: int) -> list[float]:
    proc = spawn(url, trials, "cancel", block)
    latencies = []
    async with open_seat(url) as seat:
        for i in range(trials):
            await anyio.to_thread.run_sync(read_event, proc, "asked")
            start = time.time()
            await seat.request_cancel(f"c{block}-{i}", "user", force=False)
            stopped = await anyio.to_thread.run_sync(read_event, proc, "stopped")
            latencies.append(float(stopped[2]) - start)
            await anyio.to_thread.run_sync(read_event, proc, "final")
    proc.wait(timeout=60)
    return latencies


#: one process holding N runs that wait: for approval (``approve``) or in a tool (``tool``);
#: prints RSS growth per run (KiB) and CPU share while idle
_MANY = """
import resource, sys, time
import anyio
import haltwise

@haltwise.tool(cancel="finish", effect="external", approval="required")
async def paid(i: int) -> None: ...

@haltwise.tool(cancel="interruptible", effect="read")
async def waits(i: int) -> None:
    await anyio.sleep_forever()

@haltwise.task(name="bench:many-approval")
async def asks(i: int) -> None:
    await paid(i)

@haltwise.task(name="bench:many-tool")
async def in_tool(i: int) -> None:
    await waits(i)

def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4

async def main(url, n, mode, idle):
    async with haltwise.Runtime(url) as rt:
        await rt.start(asks if mode == "approve" else in_tool, -1, task_id="warm-" + mode)
        await anyio.sleep(1)
        before = rss_kib()
        for i in range(n):
            await rt.start(asks if mode == "approve" else in_tool, i, task_id=f"{mode}-{i}")
        if mode == "approve":
            while len(await rt.approvals()) < n + 1:
                await anyio.sleep(0.2)
        else:
            await anyio.sleep(5)
        await anyio.sleep(2)
        after = rss_kib()
        cpu0, wall0 = time.process_time(), time.monotonic()
        await anyio.sleep(idle)
        cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        print(f"result {(after - before) / n:.2f} {cpu * 100:.3f}", flush=True)
        sys.stdout.flush()
        import os
        os._exit(0)

anyio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
"""


def many(url: str, n: int, mode: str, idle: float) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _MANY, url, str(n), mode, str(idle)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("result ")), None)
    assert line is not None, done.stdout + done.stderr
    _, kib, cpu = line.split()
    return float(kib), float(cpu)


def gets(url: str, count: int) -> tuple[list[float], list[float]]:
    env = {**os.environ, "HALTWISE_TOKEN": "bench-token"}
    process = subprocess.Popen(
        [sys.executable, "-m", "haltwise", "serve", "--port", "0", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    base = process.stdout.readline().strip().partition("?")[0].rstrip("/")
    host = base.removeprefix("http://")
    headers = {"Authorization": "Bearer bench-token"}

    def timed(path: str) -> float:
        connection = http.client.HTTPConnection(host, timeout=60)
        start = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - start
        connection.close()
        assert response.status == 200, body[:200]
        return elapsed

    try:
        for _ in range(3):
            timed("/api/approvals")
        approvals = [timed("/api/approvals") for _ in range(count)]
        runs = [timed("/api/runs?limit=100") for _ in range(count)]
    finally:
        process.terminate()
        process.wait(timeout=30)
    return approvals, runs


def ms(value: float) -> str:
    return f"{value * 1000:.1f}"


def quantiles(values: list[float], fractions: tuple[float, ...]) -> list[str]:
    return [ms(percentile(values, q)) for q in fractions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("HALTWISE_BENCH_PG", ""))
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--parts", default="decision,idle,get", help="which of 1, 2, 3 to run")
    args = parser.parse_args()
    print(header("Approvals (issue 31)"))
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    servers: list[Any] = []
    try:
        measure(args, stores, servers)
    finally:
        for server in servers:
            server.stop()


def decision(args: argparse.Namespace, kind: str, url: str) -> None:
    """Part 1, against its baseline, the two interleaved in blocks of 20 trials (ABAB...)."""
    load = _load()
    decided: list[float] = []
    cancelled: list[float] = []
    for block in range(max(1, args.trials // 20)):
        decided += anyio.run(decisions, url, min(20, args.trials), block)
        cancelled += anyio.run(cancels, url, min(20, args.trials), block)
    print(f"### {kind}: a decision from another process reaching the waiting run")
    print(f"(load {load} -> {_load()}, {len(decided)} trials each, in alternating blocks of 20)\n")
    rows = [
        ["decision -> the approved call begins", *quantiles(decided, (0.5, 0.95, 0.99))],
        ["baseline: cancel -> the tool interrupted", *quantiles(cancelled, (0.5, 0.95, 0.99))],
    ]
    print(table(["from another process", "p50 ms", "p95 ms", "p99 ms"], rows) + "\n")


def measure(args: argparse.Namespace, stores: list[str], servers: list[Any]) -> None:
    for kind in stores:
        if kind == "sqlite":
            url = f"sqlite:///{tempfile.mkdtemp()}/approvals.db"
        elif args.pg_url:
            url = args.pg_url
        else:  # a throwaway durable server (the tests' tests/_pg.py, fsync on)
            sys.path.insert(0, str(HERE.parent / "tests"))
            from _pg import PostgresServer, create_database

            server = PostgresServer(durable=True)
            server.start()
            servers.append(server)
            url = create_database(server.dsn)
        parts = set(args.parts.split(","))
        if "decision" in parts:
            decision(args, kind, url)
        if kind != "sqlite" or not parts & {"idle", "get"}:
            continue
        load = _load()
        approving = many(url, args.runs, "approve", args.idle_seconds)  # (leaves them pending)
        if "idle" in parts:
            in_tool = many(url, args.runs, "tool", args.idle_seconds)
            print(f"### {kind}: {args.runs:,} runs waiting in one process")
            print(f"(load {load} -> {_load()})\n")
            rows = [
                [f"{args.runs:,} awaiting approval", f"{approving[0]:.1f}", f"{approving[1]:.2f}"],
                [f"baseline: {args.runs:,} in a tool", f"{in_tool[0]:.1f}", f"{in_tool[1]:.2f}"],
            ]
            print(table(["runs", "KiB each (RSS)", "idle CPU % of a core"], rows) + "\n")
        if "get" not in parts:
            continue
        load = _load()
        approvals, runs = gets(url, args.gets)
        pending = args.runs + 1
        print(f"### {kind}: GET /api/approvals, {pending:,} pending (load {load} -> {_load()})\n")
        rows = [
            ["GET /api/approvals", *quantiles(approvals, (0.5, 0.95))],
            ["baseline: GET /api/runs?limit=100", *quantiles(runs, (0.5, 0.95))],
        ]
        print(table(["request", "p50 ms", "p95 ms"], rows) + "\n")


if __name__ == "__main__":
    main()
