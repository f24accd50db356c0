"""haltwise on PostgreSQL beside a raw psycopg loop and DBOS Transact, on one durable server.

One throwaway PostgreSQL server (``tests/_pg.py``, switched back to ``fsync=on``,
``full_page_writes=on``, ``synchronous_commit=on``; loopback), a fresh database for every
measurement, each measurement in a fresh process (DBOS is a process-wide singleton), the
systems alternating round after round so that a slow spell of the shared machine falls on all:

1. Per-step cost: ``--steps`` (200) sequential trivial steps of one run, median of
   ``--repeat`` (5) fresh databases: wall-clock us per step, the client process's CPU us per
   step (``getrusage``, every thread), and, read from the server after the client's backends have
   exited, commits (``pg_stat_database.xact_commit``: every transaction, read-only ones
   included) and WAL fsyncs (``pg_stat_wal.wal_sync``) per step. The counts are net of a run's
   fixed costs (opening, schema, start, end), measured once per row with no steps. The raw loop
   does one ``INSERT`` and one ``COMMIT`` per step on one connection; haltwise runs
   ``effect="none"`` steps (the settlement rides with the next write) and ``effect="write"``
   ones (settled durably before the task goes on); DBOS runs ``@DBOS.step()`` functions in a
   ``@DBOS.workflow()``.
2. Cancel: runs of 10 steps of 50 ms cancelled at random moments (``bench/_peer_common.py``:
   the same moments for both), ``--trials`` trials: when the cancel call returned, when a final
   state was visible, when none of the run's code was running any more (p50/p95), and how many
   committed steps ran again on resume.
3. Throughput: 1, 10, 100 and 1,000 concurrent runs of ``--scale-steps`` (20) trivial steps in
   one process, beside the one-commit ceiling (1 / the raw loop's seconds per step of section
   1): aggregate durable steps per second, plotted to ``--png``. With ``--procs N`` (2), also
   the 100 runs shared by N worker processes on the same server, started at one moment (the
   aggregate rate: several processes put both cores to Python).

``--load N`` measures section 1 also under an ordinary load made here: N busy-loop processes
(as many as the machine has cores makes its load N + the benchmark's own), started before and
stopped after each loaded pass, at the benchmark's own priority; each repetition measures
every row without them, then every row with them, and the two tables and their targets are
printed side by side (issue 35, item 4: the targets must hold at a load of 2 on 2 cores).
``--steps-only`` measures section 1 alone, and only the rows its targets are read from (no
``effect="write"`` row): the quiet-window command.

``--baseline REV`` measures every haltwise row also with the source tree of an earlier revision
(a temporary git worktree; the benchmark code is always this tree's), alternating with the
working tree: a before/after in the same run. The tables go to stdout (each with the load
average when it began: the machine is shared), the numbers to ``--json``.

usage: python bench/bench_postgres.py [--steps N] [--repeat N] [--trials N] [--runs 1,10,...]
       [--scale-steps N] [--scale-repeat N] [--procs N] [--load N] [--steps-only]
       [--baseline REV] [--json PATH] [--png PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import header, median, table, throughput_plot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tests"))  # for _pg: the tests' throwaway PostgreSQL
from _pg import create_database  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One line of a table: a system, run one way, from one source tree."""

    label: str
    system: str  # "raw", "haltwise" or "dbos"
    variant: str
    #: the haltwise source tree to import (None: whatever this interpreter imports)
    source: Path | None = None


# -- the worker side: one measurement in this process -------------------------------------------


def _cpu() -> float:
    """CPU seconds of this process, every thread (getrusage: finer than os.times' ticks)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_loop(url: str, steps: int) -> tuple[float, float]:
    """(wall s, CPU s) of ``steps`` INSERT + COMMIT round trips on one psycopg connection."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_steps (run_id text, idx integer, result text, "
            "at double precision, PRIMARY KEY (run_id, idx))"
        )
        conn.commit()
        start, cpu = time.perf_counter(), _cpu()
        for i in range(steps):
            conn.execute(
                "INSERT INTO bench_steps VALUES (%s, %s, %s, %s)", ("raw", i, str(i), time.time())
            )
            conn.commit()
        return time.perf_counter() - start, _cpu() - cpu


async def _haltwise_steps(url: str, steps: int, effect: str) -> tuple[float, float]:
    from _peer_haltwise import trivial_run

    import haltwise

    async with haltwise.Runtime(url) as runtime:
        start, cpu = time.perf_counter(), _cpu()
        handle = await runtime.start(trivial_run, steps, effect, task_id="overhead")
        outcome = await handle.outcome()
        elapsed = time.perf_counter() - start, _cpu() - cpu
    assert outcome.state is haltwise.State.COMPLETED, outcome
    return elapsed


def _launch_dbos(url: str) -> None:
    from dbos import DBOS

    DBOS(config={"name": "haltwise-bench", "system_database_url": url, "log_level": "ERROR"})
    DBOS.launch()


def _dbos_steps(url: str, steps: int, variant: str) -> tuple[float, float]:
    from _peer_dbos import trivial_run_async, trivial_run_sync
    from dbos import DBOS

    _launch_dbos(url)
    try:
        if variant == "sync":
            start, cpu = time.perf_counter(), _cpu()
            DBOS.start_workflow(trivial_run_sync, steps).get_result()
            return time.perf_counter() - start, _cpu() - cpu

        async def run() -> tuple[float, float]:
            start, cpu = time.perf_counter(), _cpu()
            handle = await DBOS.start_workflow_async(trivial_run_async, steps)
            await handle.get_result()
            return time.perf_counter() - start, _cpu() - cpu

        return asyncio.run(run())
    finally:
        DBOS.destroy()


def _cancel_trials(system: str, url: str, trials: int) -> list[dict[str, Any]]:
    if system == "dbos":
        from _peer_dbos import _trials as dbos_trials
        from dbos import DBOS

        _launch_dbos(url)
        try:
            found = asyncio.run(dbos_trials(trials))
        finally:
            DBOS.destroy()
    else:
        import anyio
        from _peer_haltwise import _trials as haltwise_trials

        found = anyio.run(haltwise_trials, url, trials, "interruptible", "api")
    return [trial.to_json() for trial in found]


async def _runs_at(url: str, runs: int, steps: int, start_at: float, prefix: str) -> dict[str, Any]:
    """One of several processes sharing the load: open the runtime, start ``runs`` runs of
    ``steps`` trivial steps at the wall-clock time ``start_at``, return when they are final."""
    import anyio
    from _peer_haltwise import trivial_run

    import haltwise

    async def one(runtime: haltwise.Runtime, task_id: str) -> None:
        handle = await runtime.start(trivial_run, steps, "none", task_id=task_id)
        if (await handle.outcome()).state is not haltwise.State.COMPLETED:
            raise SystemExit(f"run {task_id} did not complete")

    async with haltwise.Runtime(url) as runtime:
        late = time.time() > start_at
        await anyio.sleep(max(0.0, start_at - time.time()))
        async with anyio.create_task_group() as group:
            for k in range(runs):
                group.start_soon(one, runtime, f"{prefix}-{k}")
        return {"end": time.time(), "late": late}


def worker(kind: str, system: str, variant: str, url: str, count: int) -> dict[str, Any]:
    if kind == "procs":  # variant RUNSxSTEPS:START:PREFIX
        import anyio

        shape, start_at, prefix = variant.split(":")
        runs, steps = (int(n) for n in shape.split("x"))
        return anyio.run(_runs_at, url, runs, steps, float(start_at), prefix)
    if kind == "cancel":
        return {"trials": _cancel_trials(system, url, count)}
    if kind == "scale":
        import anyio
        from _measure_once import concurrent  # haltwise's public API only: any revision

        runs, steps = (int(n) for n in variant.split("x"))
        return {"steps_per_s": runs * steps / anyio.run(concurrent, url, runs, steps, "none")}
    if system == "raw":
        wall, cpu = raw_loop(url, count)
    elif system == "dbos":
        wall, cpu = _dbos_steps(url, count, variant)
    else:
        import anyio

        wall, cpu = anyio.run(_haltwise_steps, url, count, variant)
    return {"seconds": wall, "cpu_seconds": cpu}


# -- the orchestrating side ---------------------------------------------------------------------


class Server:
    """The durable throwaway server, a fresh database per measurement, and its counters."""

    def __init__(self) -> None:
        from bench_fleet import Stores  # the fleet benchmark's durable server

        self._stores = Stores(Path(tempfile.mkdtemp(prefix="haltwise-bench-pg-")))
        self.missing = self._stores.pg_missing
        self.version = self._stores.pg_version
        self.dsn = self._stores.server.dsn if self._stores.server is not None else ""

    def close(self) -> None:
        self._stores.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    def counters(self, name: str) -> tuple[int, int]:
        """(commits of database ``name``, WAL fsyncs of the server) once they stop moving: the
        client's backends report their counts when they exit."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not self._query("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)):
                break
            time.sleep(0.05)
        last = None
        while time.monotonic() < deadline:
            commits = self._query(
                "SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database WHERE datname = %s",
                (name,),
            )
            found = (int(commits), int(self._query("SELECT wal_sync FROM pg_stat_wal")))
            if found == last:
                return found
            last = found
            time.sleep(0.3)
        return last or (0, 0)

    def measure(self, kind: str, row: Row, count: int) -> dict[str, Any]:
        """One measurement in a fresh process on a fresh database; ``{"error": ...}`` if it could
        not run."""
        url = create_database(self.dsn, prefix="bench")
        name = url.rpartition("/")[2]
        before = self.counters(name)
        env = dict(os.environ)
        if row.source is not None:
            env["PYTHONPATH"] = str(row.source)
        command = [sys.executable, __file__, "--worker", kind, row.system, row.variant, url]
        done = subprocess.run(
            [*command, str(count)], capture_output=True, text=True, timeout=900, env=env, cwd=HERE
        )
        from peers import worker_result

        after = self.counters(name)
        self._query(f'DROP DATABASE "{name}" WITH (FORCE)')
        found = worker_result(done)
        if "error" in found:
            return found
        found["commits"], found["wal_syncs"] = after[0] - before[0], after[1] - before[1]
        return found

    def measure_procs(self, row: Row, runs: int, steps: int, procs: int) -> dict[str, Any]:
        """``runs`` runs of ``steps`` steps shared by ``procs`` fresh processes on one fresh
        database, all told to start at the same moment (after each opened its runtime):
        aggregate steps per second from that moment to the last completion."""
        url = create_database(self.dsn, prefix="bench")
        name = url.rpartition("/")[2]
        env = dict(os.environ)
        if row.source is not None:
            env["PYTHONPATH"] = str(row.source)
        start_at = time.time() + 3.0 + 0.5 * procs  # time for each process to open its runtime
        shares = [runs // procs + (1 if i < runs % procs else 0) for i in range(procs)]
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    "procs",
                    "haltwise",
                    f"{share}x{steps}:{start_at}:p{i}",
                    url,
                    "0",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=HERE,
            )
            for i, share in enumerate(shares)
        ]
        from peers import worker_result

        found = []
        for child in children:
            out, err = child.communicate(timeout=900)
            found.append(
                worker_result(subprocess.CompletedProcess(child.args, child.returncode, out, err))
            )
        self._query(f'DROP DATABASE "{name}" WITH (FORCE)')
        errors = [f["error"] for f in found if "error" in f]
        if errors:
            return {"error": errors[0]}
        if any(f["late"] for f in found):
            return {"error": "a process opened its runtime after the start (machine too busy)"}
        return {"steps_per_s": runs * steps / (max(f["end"] for f in found) - start_at)}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` busy loops (each a process spinning on one core) for the ``with`` block;
    children of this process, so at its priority."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def step_section(
    server: Server, rows: list[Row], steps: int, repeat: int, burn: int = 0, loads: Any = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Section 1; with ``burn`` busy loops, also loaded (each repetition: every row without
    them, then every row with them running): (the rows without, the rows with, or None).
    The 1-minute load average at the end of each loaded pass is appended to ``loads``."""
    fixed = {row: server.measure("steps", row, 0) for row in rows}
    per_row: dict[Row, list[dict[str, Any]]] = {row: [] for row in rows}
    loaded: dict[Row, list[dict[str, Any]]] = {row: [] for row in rows}
    for _ in range(repeat):
        for row in rows:
            per_row[row].append(server.measure("steps", row, steps))
        if burn:
            with busy(burn):
                for row in rows:
                    loaded[row].append(server.measure("steps", row, steps))
                if loads is not None:
                    loads.append(load()[0])
    quiet = step_rows(per_row, fixed, steps)
    return quiet, step_rows(loaded, fixed, steps) if burn else None


def step_rows(
    per_row: dict[Row, list[dict[str, Any]]], fixed: dict[Row, dict[str, Any]], steps: int
) -> list[dict[str, Any]]:
    """Each row's figures over its repetitions, net of its fixed costs (``fixed``)."""
    results = []
    for row, found in per_row.items():
        good = [f for f in found if "error" not in f]
        entry: dict[str, Any] = {"system": row.label, "variant": row.variant}
        errors = [f["error"] for f in [*found, fixed[row]] if "error" in f]
        if errors:
            entry["error"] = errors[0]
        if good and "error" not in fixed[row]:
            base = fixed[row]
            entry["us_per_step"] = [f["seconds"] / steps * 1e6 for f in good]
            entry["median_us"] = median(entry["us_per_step"])
            entry["cpu_us_per_step"] = median(
                [(f["cpu_seconds"] - base["cpu_seconds"]) / steps * 1e6 for f in good]
            )
            for name in ("commits", "wal_syncs"):
                entry[f"{name}_per_step"] = median([(f[name] - base[name]) / steps for f in good])
        results.append(entry)
    return results


def cancel_section(server: Server, rows: list[Row], trials: int) -> list[dict[str, Any]]:
    from peers import summarise_trials

    results = []
    for row in rows:
        found = server.measure("cancel", row, trials)
        entry: dict[str, Any] = {"system": row.label, **found}
        if "trials" in found:
            entry.update(summarise_trials(found.pop("trials")))
        results.append(entry)
    return results


def scale_section(
    server: Server, rows: list[Row], runs: list[int], steps: int, repeat: int
) -> dict[str, list[dict[str, Any]]]:
    cells: dict[str, list[dict[str, Any]]] = {row.label: [] for row in rows}
    for count in runs:
        found: dict[str, list[float]] = {row.label: [] for row in rows}
        errors: dict[str, str] = {}
        for _ in range(repeat if count < 1000 else max(1, repeat - 1)):
            for row in rows:
                result = server.measure("scale", Row(row.label, "haltwise", f"{count}x{steps}",
                                                     row.source), 0)  # fmt: skip
                if "steps_per_s" in result:
                    found[row.label].append(result["steps_per_s"])
                else:
                    errors[row.label] = result.get("error", "?")
        for label, rates in found.items():
            cell = {"runs": count, "steps_per_s": rates, "median": median(rates) if rates else None}
            if label in errors:
                cell["error"] = errors.pop(label)
            cells[label].append(cell)
    return cells


def procs_section(
    server: Server, row: Row, runs: int, steps: int, procs: int, repeat: int
) -> dict[str, Any]:
    """``runs`` concurrent runs shared by ``procs`` worker processes (``row``'s tree)."""
    rates, errors = [], []
    for _ in range(repeat):
        found = server.measure_procs(row, runs, steps, procs)
        if "steps_per_s" in found:
            rates.append(found["steps_per_s"])
        else:
            errors.append(found["error"])
    cell: dict[str, Any] = {"runs": runs, "procs": procs, "steps_per_s": rates}
    cell["median"] = median(rates) if rates else None
    if errors:
        cell["error"] = errors[0]
    return cell


def step_targets(steps: list[dict[str, Any]], mine: str, at: str = "") -> list[dict[str, Any]]:
    """The two per-step targets on the rows ``steps`` (``at``: how they were measured)."""
    from peers import _fastest, _paired, _target

    ours = next((r for r in steps if r["system"] == mine), None)
    raw = next((r for r in steps if r["variant"] == "loop"), None)
    dbos = _fastest([{**r, "tuned": False} for r in steps], "DBOS")
    return [
        _target(f"per-step, haltwise / raw psycopg{at}", -1.5, _paired(ours, raw)),
        _target(f"per-step, DBOS / haltwise{at}", 4, _paired(dbos, ours)),
    ]


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    from peers import _target

    steps, cancel = report["steps"], report.get("cancel", [])
    mine = report["ours"]
    found = step_targets(steps, mine, " (no load added)" if report.get("steps_loaded") else "")
    if report.get("steps_loaded"):
        found += step_targets(report["steps_loaded"], mine, f" (--load {report['burn']} added)")
    if "scale" not in report:
        return found
    ours_cancel = next((r for r in cancel if r["system"] == mine), {})
    dbos_cancel = next((r for r in cancel if r["system"].startswith("DBOS")), {})
    stopped = None
    if "stopped_p95_ms" in ours_cancel and "stopped_p95_ms" in dbos_cancel:
        stopped = dbos_cancel["stopped_p95_ms"] / max(ours_cancel["stopped_p95_ms"], 1e-6)
    at_100 = next((c for c in report["scale"].get(mine, []) if c["runs"] == 100), None)
    roof = report.get("ceiling_steps_per_s")
    scale = at_100["median"] / roof if at_100 and at_100["median"] and roof else None
    shared = report.get("procs") or {}
    procs = shared["median"] / roof if shared.get("median") and roof else None
    return [
        *found,
        _target("cancel 'stopped' p95, DBOS / haltwise", 3, stopped),
        _target("100 concurrent runs / the one-commit ceiling", 5, scale),
        *(
            [_target(f"100 runs over {shared['procs']} processes / the ceiling", 5, procs)]
            if shared
            else []
        ),
    ]


HALTWISE_NONE = 'haltwise, effect="none"'


def haltwise_rows(variants: list[tuple[str, str]], trees: dict[str, Path | None]) -> list[Row]:
    rows = []
    for label, variant in variants:
        for name, source in trees.items():
            rows.append(Row(label + name, "haltwise", variant, source))
    return rows


def print_steps(report: dict[str, Any], key: str = "steps") -> None:
    how = (
        f"with {report['burn']} busy-loop processes running (--load {report['burn']}), "
        "alternating with the table above (no load added); 1-minute load average at the end "
        f"of each loaded pass {report['load'].get('loaded', '?')}"
        if key == "steps_loaded"
        else f"load average at start {report['load']['steps']}"
    )
    print(
        f"\n1. Per-step cost: {report['step_count']} sequential trivial steps of one run, median "
        f"of {report['repeat']} fresh databases; {how}:\n"
    )
    rows = []
    for r in report[key]:
        if "median_us" not in r:
            rows.append([r["system"], "not run: " + r.get("error", "?"), "-", "-", "-", "-"])
            continue
        rows.append(
            [
                r["system"],
                f"{r['median_us']:,.0f}",
                f"{min(r['us_per_step']):,.0f}-{max(r['us_per_step']):,.0f}",
                f"{r['cpu_us_per_step']:,.0f}",
                f"{r['commits_per_step']:.2f}",
                f"{r['wal_syncs_per_step']:.2f}",
            ]
        )
    headers = ["system", "us/step", "range", "client CPU us/step", "commits/step"]
    print(table([*headers, "WAL fsyncs/step"], rows))


def print_cancel(report: dict[str, Any]) -> None:
    from peers import cancel_table

    print(
        f"\n2. Cancel, then resume: runs of 10 steps x 50 ms cancelled at random moments, "
        f"{report['trials']} trials (ms from the cancel call); load average at start "
        f"{report['load']['cancel']}:\n"
    )
    print(cancel_table(report["cancel"]))


def print_scale(report: dict[str, Any]) -> None:
    roof = report["ceiling_steps_per_s"]
    print(
        f"\n3. Throughput: concurrent runs of {report['scale_steps']} trivial steps "
        f'(effect="none") in one process; one commit per step (the raw loop above) = '
        f"{roof:,.0f} steps/s; load average at start {report['load']['scale']}:\n"
    )
    labels = list(report["scale"])
    rows = []
    for i, count in enumerate(report["runs"]):
        row: list[object] = [f"{count:,}"]
        for label in labels:
            rate = report["scale"][label][i]["median"]
            cell = report["scale"][label][i]
            if rate is None:
                row += ["not run: " + cell.get("error", "?"), "-"]
            else:
                row += [f"{rate:,.0f}", f"{rate / roof:.1f}x"]
        rows.append(row)
    headers = ["runs"]
    for label in labels:
        headers += [f"{label} steps/s", "x ceiling"]
    print(table(headers, rows))
    shared = report.get("procs")
    if shared:
        rate = shared["median"]
        found = (
            f"{rate:,.0f} steps/s ({rate / roof:.1f}x the ceiling)"
            if rate
            else "not run: " + shared.get("error", "?")
        )
        print(
            f"\nThe same 100 runs shared by {shared['procs']} worker processes on the one server "
            f"({labels[-1]}; started at one moment, to the last completion; median of "
            f"{len(shared['steps_per_s'])}): {found}"
        )


def print_targets(report: dict[str, Any]) -> None:
    print("\nTargets (ratios in this run; per-step ratios are medians of per-repetition ratios):\n")
    rows = [
        [t["target"], t["goal"], t["value"], "met" if t["met"] else "MISSED"]
        for t in report["targets"]
    ]
    print(table(["target", "goal", "measured", ""], rows))


def plot(report: dict[str, Any], path: Path) -> str:
    series = []
    for label, marker in zip(report["scale"], "osD^", strict=False):
        points = [(c["runs"], c["median"]) for c in report["scale"][label] if c["median"]]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        series.append((label, xs, ys, {"marker": marker}))
    return throughput_plot(
        series,
        report["runs"],
        (report["ceiling_steps_per_s"], "raw psycopg", 5, "100"),
        f"concurrent runs in one process ({report['scale_steps']} steps each)",
        "haltwise on PostgreSQL (fsync, synchronous_commit on): throughput",
        path,
    )


def checkout(rev: str) -> tuple[str, Path]:
    """A temporary detached worktree of ``rev``: (short name, its path)."""
    found = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True
    )
    if found.returncode:
        raise SystemExit(f"not a revision: {rev}")
    short = found.stdout.strip()
    path = Path(tempfile.mkdtemp(prefix="haltwise-rev-"))
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), short], cwd=ROOT,
                   check=True)  # fmt: skip
    return short, path


def run(server: Server, args: argparse.Namespace, trees: dict[str, Path | None]) -> None:
    print(header("haltwise on PostgreSQL beside raw psycopg and DBOS Transact"))
    from peers import versions

    found = versions(("haltwise", "psycopg", "psycopg-pool", "dbos"))
    print(f"- PostgreSQL {server.version} on loopback, fsync=on, synchronous_commit=on")
    print(f"- versions: {', '.join(f'{k} {v}' for k, v in found.items())}; cores: {os.cpu_count()}")
    if len(trees) > 1:
        print(f"- haltwise rows from two source trees, alternating: {', '.join(trees)}")
    print()
    report: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "postgres": server.version,
        "versions": found,
        "step_count": args.steps,
        "repeat": args.repeat,
        "trials": args.trials,
        "runs": [int(n) for n in args.runs.split(",")],
        "scale_steps": args.scale_steps,
        "load": {},
        #: the row the targets are measured on: haltwise's working tree
        "ours": HALTWISE_NONE + list(trees)[-1],
    }
    variants = [(HALTWISE_NONE, "none")]
    if not args.steps_only:  # (the quiet-window command measures the targets' rows only)
        variants.append(('haltwise, effect="write"', "write"))
    step_rows = [
        Row("raw psycopg, INSERT + COMMIT per step", "raw", "loop"),
        *haltwise_rows(variants, trees),
        Row("DBOS, async workflow", "dbos", "async"),
        Row("DBOS, sync workflow", "dbos", "sync"),
    ]
    report["load"]["steps"] = load()
    report["burn"] = args.load
    report["load"]["loaded"] = []
    report["steps"], loaded = step_section(
        server, step_rows, args.steps, args.repeat, args.load, report["load"]["loaded"]
    )
    print_steps(report)
    if loaded is not None:
        report["steps_loaded"] = loaded
        print_steps(report, "steps_loaded")
    if args.steps_only:
        report["targets"] = targets(report)
        print_targets(report)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nnumbers written to {args.json}")
        return
    report["load"]["cancel"] = load()
    cancel_rows = [*haltwise_rows([(HALTWISE_NONE, "none")], trees), Row("DBOS", "dbos", "")]
    report["cancel"] = cancel_section(server, cancel_rows, args.trials)
    print_cancel(report)
    raw = next(r for r in report["steps"] if r["variant"] == "loop")
    report["ceiling_steps_per_s"] = 1e6 / raw["median_us"] if "median_us" in raw else 0.0
    report["load"]["scale"] = load()
    scale_rows = haltwise_rows([(HALTWISE_NONE, "none")], trees)
    report["scale"] = scale_section(
        server, scale_rows, report["runs"], args.scale_steps, args.scale_repeat
    )
    if args.procs > 1 and 100 in report["runs"]:
        report["procs"] = procs_section(
            server, scale_rows[-1], 100, args.scale_steps, args.procs, args.scale_repeat
        )
    if report["ceiling_steps_per_s"]:
        print_scale(report)
    report["targets"] = targets(report)
    print_targets(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    measured = any(c["median"] for cells in report["scale"].values() for c in cells)
    shown = plot(report, args.png) if report["ceiling_steps_per_s"] and measured else "no plot"
    print(f"\nnumbers written to {args.json}; {shown}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--runs", default="1,10,100,1000", help="concurrent run counts")
    parser.add_argument("--scale-steps", type=int, default=20)
    parser.add_argument("--scale-repeat", type=int, default=3)
    parser.add_argument(
        "--procs", type=int, default=2, help="also 100 runs over this many processes (0: not)"
    )
    parser.add_argument(
        "--load", type=int, default=0, help="also measure section 1 beside N busy-loop processes"
    )
    parser.add_argument("--steps-only", action="store_true", help="measure section 1 alone")
    parser.add_argument("--baseline", help="also measure haltwise at this earlier revision")
    parser.add_argument("--json", type=Path, default=DOCS / "postgres.json")
    parser.add_argument("--png", type=Path, default=DOCS / "postgres_throughput.png")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, system, variant, url, count = args.worker
        print(json.dumps(worker(kind, system, variant, url, int(count))))
        return
    server = Server()
    if server.missing:
        print(f"PostgreSQL not measured: {server.missing}")
        return
    trees: dict[str, Path | None] = {"": ROOT / "src"}
    worktree = None
    try:
        if args.baseline:
            short, worktree = checkout(args.baseline)
            trees = {f" @{short}": worktree / "src", " (working tree)": ROOT / "src"}
        run(server, args, trees)
    finally:
        server.close()
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)


if __name__ == "__main__":
    main()
