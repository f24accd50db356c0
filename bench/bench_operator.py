"""The operator's seat, measured: bulk cancel, the HTTP API, the event stream, ``haltwise cancel``.

1. ``bulk``: N runs (default 10,000) waiting in an interruptible tool in one process; the memory
   each waiting run costs, the idle process's CPU, then every run cancelled: by one
   ``Runtime.cancel_many`` (one transaction) against the baseline in the same run, one
   ``Runtime.cancel`` per run. Time from the request to the last run recorded ``cancelled``,
   and the process's CPU meanwhile (and the collector's share of it), which a loaded machine
   does not inflate as it does the wall clock.
2. ``api``: a cancel through ``POST /api/runs/{id}/cancel`` of a run another process works, from
   the request to the tool interrupted there (wall clock, one host), p50/p99, beside
   ``haltwise cancel ID`` typed as a command (a new interpreter each time, exec -> interrupted),
   on SQLite and PostgreSQL.
3. ``pages``: ``GET /api/runs?limit=50`` and ``GET /api/runs/{id}`` with 100,000 runs in the
   store (each with two steps), p50/p95, on SQLite and PostgreSQL.
4. ``sse``: a client on ``/api/events``; from the commit of a transition (the database's clock
   in the change row) to the client reading its event.
5. ``command``: ``haltwise cancel ID`` typed as a command (a new interpreter each time), from
   exec to the tool interrupted in another process, p50/p95, on SQLite and PostgreSQL; beside
   it, in the same run, the floor: a bare interpreter's exec -> exit, and the import of the
   command line alone.

usage: python bench/bench_operator.py [bulk|api|pages|sse|command|all] [--runs N] [--trials N]
       python bench/bench_operator.py bulk --runs N --against REV [--against REV2] [--rounds N]
       (PostgreSQL cases need HALTWISE_PG_BIN or a local PostgreSQL; skipped otherwise)

``bulk --against REV`` measures the ``Runtime.cancel_many`` case only, side by side: the working
tree and each earlier revision (its own tree and its own bench script, extracted with
``git archive``, imported through ``PYTHONPATH``), alternating round after round, a fresh
process each, so that the machine's slow and fast spells fall on all alike; one row per
measurement, then the median, lowest and highest of each.
"""

from __future__ import annotations

import argparse
import compileall
import gc
import http.client
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
from _report import header, median, percentile, read_event, table
from bench_cross_process import spawn_target

import haltwise
from haltwise._runtime import lowlevel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))


# -- 1. bulk cancel in one process ------------------------------------------------------------


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_in_tool() -> None:
    await anyio.sleep_forever()


@haltwise.task(name="bench:waiter")
async def waiter() -> None:
    await wait_in_tool()


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def start_waiting(runtime: haltwise.Runtime, runs: int, prefix: str) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(runs)]
    for run_id in ids:
        await runtime.start(waiter, task_id=run_id)
    while True:  # every run's step journaled and waiting
        page = await runtime.list_runs(state="running", limit=1)
        detail = await runtime.inspect(ids[-1])
        if page.runs and detail.outcome.steps:
            break
        await anyio.sleep(0.05)
    await anyio.sleep(0.5)
    return ids


#: The cases of the bulk table: how the runs are cancelled, and whether the process froze its
#: heap first (``gc.freeze()`` once the runs wait: an application's choice, shown to measure the
#: collector's share; haltwise itself never touches the collector).
BULK_CASES = {
    "Runtime.cancel per run (baseline)": (False, False),
    "Runtime.cancel_many (one transaction)": (True, False),
    "Runtime.cancel_many, waiting heap frozen by the application": (True, True),
}


async def bulk_case(url: str, runs: int, bulk: bool, freeze: bool) -> dict[str, float]:
    async with haltwise.Runtime(url) as runtime:
        gc.collect()
        before = rss_kib()
        ids = await start_waiting(runtime, runs, "b" if bulk else "s")
        gc.collect()
        per_run = (rss_kib() - before) / runs
        cpu0, wall0 = time.process_time(), time.monotonic()
        await anyio.sleep(3.0)
        idle = (time.process_time() - cpu0) / (time.monotonic() - wall0) * 100
        if freeze:
            gc.freeze()
        with collecting() as collector:
            cpu = time.process_time()
            start = time.perf_counter()
            if bulk:
                await runtime.cancel_many(ids, reason="bulk")
            else:
                for run_id in ids:
                    await runtime.cancel(run_id, reason="one by one")
            requested = time.perf_counter() - start
            while lowlevel.active_runs(runtime):
                await anyio.sleep(0.001)
            done = time.perf_counter() - start
            cpu = time.process_time() - cpu
        last = await runtime.inspect(ids[-1])
        assert last.outcome.state is haltwise.State.CANCELLED
    return {
        "per_run_kib": per_run,
        "idle_cpu": idle,
        "requested": requested,
        "done": done,
        "cpu": cpu,
        "gc": collector.seconds,
        "full": collector.full,
    }


class _Collector:
    """CPU time spent in the garbage collector (the process's, so that a loaded machine does
    not inflate it), and how many full (generation 2) collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
            return
        self.seconds += time.process_time() - self._began
        self.full += info["generation"] == 2


@contextmanager
def collecting() -> Iterator[_Collector]:
    collector = _Collector()
    gc.callbacks.append(collector)
    try:
        yield collector
    finally:
        gc.callbacks.remove(collector)


def run_bulk(runs: int) -> None:
    print(header(f"{runs:,} runs waiting in a tool, in one process: cancel them all (SQLite)"))
    rows = []
    for how, (bulk, freeze) in BULK_CASES.items():
        result = fresh_process_bulk_case(runs, bulk, freeze)
        rows.append(
            [
                how,
                f"{result['requested'] * 1000:,.0f} ms",
                f"{result['done'] * 1000:,.0f} ms",
                f"{result['cpu'] * 1000:,.0f} ms",
                f"{result['gc'] * 1000:,.0f} ms ({result['full']:.0f} full)",
                f"{result['per_run_kib']:.1f} KiB",
                f"{result['idle_cpu']:.1f}%",
            ]
        )
    print(
        table(
            [
                "how",
                "requests recorded",
                "all cancelled",
                "CPU of the process meanwhile",
                "of which garbage collection (CPU)",
                "memory per waiting run",
                "idle CPU",
            ],
            rows,
        )
    )


def fresh_process_bulk_case(runs: int, bulk: bool, freeze: bool) -> dict[str, float]:
    """:func:`bulk_case` in a process of its own (memory per run is measured from its start)."""
    argv = [sys.executable, __file__, "_bulk_case", "--runs", str(runs)]
    argv += ["--bulk"] if bulk else []
    argv += ["--freeze"] if freeze else []
    done = subprocess.run(argv, check=True, capture_output=True)
    result: dict[str, float] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def run_bulk_against(runs: int, revisions: list[str], rounds: int) -> None:
    """The ``cancel_many`` case of the working tree beside each of ``revisions`` (see the
    module docstring)."""
    print(header(f"{runs:,} runs waiting in a tool: cancel_many, side by side with {revisions}"))
    here = f"working tree ({_describe('HEAD')})"
    with tempfile.TemporaryDirectory() as scratch:
        trees = {here: ROOT}
        for revision in revisions:
            tree = Path(scratch) / revision
            tree.mkdir()
            archive = subprocess.run(
                ["git", "archive", revision], cwd=ROOT, check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            short = _describe(revision)
            trees[revision if short == revision else f"{revision} ({short})"] = tree
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        rows = []
        for round_ in range(1, rounds + 1):
            for name, tree in trees.items():
                result = _bulk_case_of(tree, runs)
                results[name].append(result)
                rows.append([f"{name} #{round_}", *_bulk_cells(result)])
    print(
        table(
            ["revision", "requests recorded", "all cancelled", "CPU meanwhile", "collector (CPU)"],
            rows,
        )
    )
    print()
    summary = []
    for name, measured in results.items():
        done = [result["done"] * 1000 for result in measured]
        cpu = [result["cpu"] * 1000 for result in measured]
        summary.append(
            [
                name,
                f"{median(done):,.0f} ms ({min(done):,.0f}-{max(done):,.0f})",
                f"{median(cpu):,.0f} ms ({min(cpu):,.0f}-{max(cpu):,.0f})",
            ]
        )
    print(table(["revision", "all cancelled: median (min-max)", "CPU: median (min-max)"], summary))


def _describe(revision: str) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", revision], cwd=ROOT, check=True, capture_output=True
    )
    return done.stdout.decode().strip()


def _bulk_case_of(tree: Path, runs: int) -> dict[str, float]:
    """The ``cancel_many`` case measured by ``tree``'s own bench script on ``tree``'s source."""
    argv = [sys.executable, str(tree / "bench" / "bench_operator.py"), "_bulk_case"]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    done = subprocess.run(
        [*argv, "--runs", str(runs), "--bulk"], check=True, capture_output=True, env=env
    )
    result: dict[str, float] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def _bulk_cells(result: dict[str, float]) -> list[str]:
    return [
        f"{result['requested'] * 1000:,.0f} ms",
        f"{result['done'] * 1000:,.0f} ms",
        f"{result['cpu'] * 1000:,.0f} ms",
        f"{result['gc'] * 1000:,.0f} ms ({result['full']:.0f} full)",
    ]


def bulk_case_here(runs: int, bulk: bool, freeze: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/bulk.db"
        print(json.dumps(anyio.run(bulk_case, url, runs, bulk, freeze)))


# -- 2. a cancel through the API, beside the command -------------------------------------------


@contextmanager
def server(url: str, root: Path) -> Iterator[tuple[str, str]]:
    from _serve import start_server

    served = start_server(root, url)
    try:
        yield served.host, served.token
    finally:
        served.stop()


def api_cancels(url: str, trials: int, root: Path) -> list[float]:
    latencies = []
    with server(url, root) as (host, token):
        target = spawn_target(url, trials)
        connection = http.client.HTTPConnection(host, timeout=30)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for i in range(trials):
            read_event(target, "entered")
            time.sleep(0.05)  # the step journaled and waiting
            sent = time.time()
            connection.request("POST", f"/api/runs/x{i}/cancel", body=b"{}", headers=headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 202, response.status
            stopped = float(read_event(target, "stopped")[2])
            latencies.append(stopped - sent)
            read_event(target, "final")
        target.wait(timeout=30)
        connection.close()
    return latencies


def cli_cancels(url: str, trials: int) -> tuple[list[float], list[float]]:
    """Per trial: exec -> the tool interrupted (wall), and the command's own CPU (user+sys)."""
    latencies, cpus = [], []
    target = spawn_target(url, trials)
    for i in range(trials):
        read_event(target, "entered")
        time.sleep(0.05)
        before = children_cpu()
        sent = time.time()
        subprocess.run(
            [sys.executable, "-m", "haltwise", "cancel", f"x{i}", "--store", url],
            check=True,
            capture_output=True,
        )
        cpus.append(children_cpu() - before)
        stopped = float(read_event(target, "stopped")[2])
        latencies.append(stopped - sent)
        read_event(target, "final")
    target.wait(timeout=30)
    return latencies, cpus


def children_cpu() -> float:
    """User + system CPU seconds of the ended children of this process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exec_seconds(argv: list[str]) -> tuple[float, float]:
    """One process from exec to its exit: its wall time and its CPU (user+sys) seconds."""
    before = children_cpu()
    start = time.time()
    subprocess.run(argv, check=True, capture_output=True)
    return time.time() - start, children_cpu() - before


def run_command(trials: int) -> None:
    print(header("haltwise cancel ID typed in a shell: exec to the tool interrupted"))
    python = sys.executable
    floors = {
        "bare interpreter: python -c pass (exec -> exit)": [python, "-c", "pass"],
        "import haltwise._cli (exec -> exit)": [python, "-c", "import haltwise._cli"],
    }
    rows = []
    for what, argv in floors.items():
        walls, cpus = zip(*(exec_seconds(argv) for _ in range(trials)), strict=True)
        rows.append(["-", what, trials, *_p50_p95(list(walls)), ms(list(cpus), 0.5)])
    for name, fresh in stores():
        walls, cpus = cli_cancels(fresh(), trials)
        what = "haltwise cancel ID (exec -> interrupted)"
        rows.append([name, what, trials, *_p50_p95(walls), ms(cpus, 0.5)])
    print(table(["store", "what", "trials", "p50", "p95", "CPU of the process, p50"], rows))


def _p50_p95(values: list[float]) -> list[str]:
    return [ms(values, 0.5), ms(values, 0.95)]


def stores() -> Iterator[tuple[str, Callable[[], str]]]:
    """Each store kind with a function that makes a fresh, empty store's URL."""
    with tempfile.TemporaryDirectory() as scratch:
        count = iter(range(1_000_000))
        yield "SQLite", lambda: f"sqlite:///{scratch}/s{next(count)}.db"
    try:
        from _pg import PostgresServer, PostgresUnavailable, create_database

        pg = PostgresServer()
    except (ImportError, PostgresUnavailable):
        print("(PostgreSQL not found: its rows are left out)")
        return
    pg.start()
    try:
        yield "PostgreSQL", lambda: create_database(pg.dsn)
    finally:
        pg.stop()


def ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1000:.1f} ms"


def run_api(trials: int) -> None:
    print(header("A cancel from the request to the tool interrupted in another process"))
    rows = []
    for name, fresh in stores():
        with tempfile.TemporaryDirectory() as root:
            api = api_cancels(fresh(), trials, Path(root))
        command, _ = cli_cancels(fresh(), max(5, trials // 3))
        rows.append([name, "POST /api/runs/{id}/cancel", trials, ms(api, 0.5), ms(api, 0.99)])
        rows.append(
            [name, "haltwise cancel ID (exec)", len(command), ms(command, 0.5), ms(command, 0.95)]
        )
    print(table(["store", "how", "trials", "p50", "p99 (cli: p95)"], rows))


# -- 3. pages at 100,000 runs -----------------------------------------------------------------


def fill_sqlite(url: str, runs: int) -> None:
    async def create() -> None:
        async with haltwise.Runtime(url):
            pass  # the schema

    anyio.run(create)
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    now = time.time()
    conn.executemany(
        "INSERT INTO runs (id, task, state, inputs, reason, force, created_at, updated_at) "
        "VALUES (?, 'bench:page', ?, '{\"args\":[],\"kwargs\":{}}', ?, 0, ?, ?)",
        (
            (
                f"r{i:06d}",
                "cancelled" if i % 3 else "completed",
                "user" if i % 3 else None,
                now + i / 1e4,
                now + i / 1e4,
            )
            for i in range(runs)
        ),
    )
    conn.executemany(
        "INSERT INTO steps (run_id, idx, tool, cancel, effect, idempotent, status, attempts, "
        "idem_key, started_at, settled_at) VALUES (?, ?, 'search', 'interruptible', ?, 0, "
        "'committed', 1, ?, ?, ?)",
        (
            (f"r{i:06d}", idx, "write" if idx else "read", f"k{i}-{idx}", now, now + 0.01)
            for i in range(runs)
            for idx in (0, 1)
        ),
    )
    conn.commit()
    conn.close()


def fill_postgres(url: str, runs: int) -> None:
    import psycopg

    async def create() -> None:
        async with haltwise.Runtime(url):
            pass

    anyio.run(create)
    now = time.time()
    with psycopg.connect(url) as pg, pg.cursor() as cursor:
        runs_columns = "id, task, state, inputs, reason, force, created_at, updated_at"
        with cursor.copy(f"COPY haltwise.runs ({runs_columns}) FROM STDIN") as copy:
            for i in range(runs):
                copy.write_row(
                    (
                        f"r{i:06d}",
                        "bench:page",
                        "cancelled" if i % 3 else "completed",
                        '{"args":[],"kwargs":{}}',
                        "user" if i % 3 else None,
                        False,
                        now + i / 1e4,
                        now + i / 1e4,
                    )
                )
        with cursor.copy(
            "COPY haltwise.steps (run_id, idx, tool, cancel, effect, idempotent, status, attempts, "
            "idem_key, started_at, settled_at) FROM STDIN"
        ) as copy:
            for i in range(runs):
                for idx in (0, 1):
                    copy.write_row(
                        (
                            f"r{i:06d}",
                            idx,
                            "search",
                            "interruptible",
                            "write" if idx else "read",
                            False,
                            "committed",
                            1,
                            f"k{i}-{idx}",
                            now,
                            now + 0.01,
                        )
                    )
        cursor.execute("ANALYZE")


def timed_gets(host: str, token: str, paths: list[str]) -> list[float]:
    connection = http.client.HTTPConnection(host, timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    times = []
    for path in paths:
        start = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, (path, response.status)
        times.append(time.perf_counter() - start)
    connection.close()
    return times


def get_json(host: str, token: str, path: str) -> dict[str, list[object]]:
    connection = http.client.HTTPConnection(host, timeout=30)
    connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    value: dict[str, list[object]] = json.loads(connection.getresponse().read())
    connection.close()
    return value


def run_pages(runs: int, trials: int) -> None:
    print(header(f"The API with {runs:,} runs in the store (two steps each)"))
    rows = []
    for name, fresh in stores():
        url = fresh()
        (fill_sqlite if url.startswith("sqlite") else fill_postgres)(url, runs)
        with tempfile.TemporaryDirectory() as root, server(url, Path(root)) as (host, token):
            timed_gets(host, token, ["/api/runs?limit=50"] * 5)  # warm
            assert len(get_json(host, token, "/api/runs?limit=50")["runs"]) == 50
            first = timed_gets(host, token, ["/api/runs?limit=50"] * trials)
            filtered = timed_gets(host, token, ["/api/runs?limit=50&state=completed"] * trials)
            one = timed_gets(
                host, token, [f"/api/runs/r{(i * 7919) % runs:06d}" for i in range(trials)]
            )
        for what, values in (
            ("GET /api/runs?limit=50", first),
            ("GET /api/runs?limit=50&state=completed", filtered),
            ("GET /api/runs/{id}", one),
        ):
            rows.append([name, what, trials, ms(values, 0.5), ms(values, 0.95)])
    print(table(["store", "request", "trials", "p50", "p95"], rows))


# -- 4. the event stream ----------------------------------------------------------------------


def sse_latencies(url: str, trials: int, root: Path) -> list[float]:
    """Cancel in this process (the request returns once committed), then read the stream."""
    latencies = []
    with server(url, root) as (host, token):
        connection = http.client.HTTPConnection(host, timeout=30)
        connection.request("GET", "/api/events", headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        response.readline()
        target = spawn_target(url, trials)

        async def cancel(run_id: str) -> float:
            async with haltwise.Runtime(url) as runtime:
                await runtime.cancel(run_id, reason="sse")
                return time.perf_counter()

        for i in range(trials):
            read_event(target, "entered")
            committed = anyio.run(cancel, f"x{i}")
            while True:
                line = response.readline().decode()
                if line.startswith("data: "):
                    change = json.loads(line[6:])
                    if change["kind"] == "transition" and change["status"] == "cancelling":
                        latencies.append(time.perf_counter() - committed)
                        break
            read_event(target, "final")
        target.wait(timeout=30)
        connection.close()
    return latencies


def run_sse(trials: int) -> None:
    print(
        header(
            "An SSE client sees a transition: from its commit (the request returned) to the event"
        )
    )
    rows = []
    for name, fresh in stores():
        with tempfile.TemporaryDirectory() as root:
            values = sse_latencies(fresh(), trials, Path(root))
        rows.append([name, trials, ms(values, 0.5), ms(values, 0.95), ms(values, 1.0)])
    print(table(["store", "trials", "p50", "p95", "max"], rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=["bulk", "api", "pages", "sse", "command", "all", "_bulk_case"],
    )
    parser.add_argument("--bulk", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--freeze", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=10_000, help="runs for bulk")
    parser.add_argument("--page-runs", type=int, default=100_000, help="runs for pages")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument(
        "--against",
        action="append",
        metavar="REV",
        help="bulk: the cancel_many case side by side with this revision (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="bulk --against: rounds")
    args = parser.parse_args()
    if args.against and args.what != "bulk":
        parser.error("--against measures the bulk case only: use it with 'bulk'")
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    # As installed (pip byte-compiles a wheel): with PYTHONDONTWRITEBYTECODE set, an editable
    # checkout would otherwise compile every module changed since its last .pyc in every
    # process a case starts (each `haltwise cancel`, each server).
    compileall.compile_dir(str(Path(haltwise.__file__).parent), quiet=1)
    os.environ.pop("HALTWISE_TOKEN", None)
    if args.what == "_bulk_case":
        bulk_case_here(args.runs, args.bulk, args.freeze)
        return
    if args.what == "bulk" and args.against:
        run_bulk_against(args.runs, args.against, args.rounds)
    elif args.what in ("bulk", "all"):
        run_bulk(args.runs)
    if args.what in ("api", "all"):
        run_api(args.trials)
    if args.what in ("pages", "all"):
        run_pages(args.page_runs, args.trials)
    if args.what in ("sse", "all"):
        run_sse(max(10, args.trials // 3))
    if args.what in ("command", "all"):
        run_command(args.trials)


if __name__ == "__main__":
    main()
