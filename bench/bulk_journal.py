"""The journal's share of a bulk cancel of 10,000 waiting runs on SQLite, phase by phase.

What ``Runtime.cancel_many`` asks of the store, without the runtime (issue 17's bulk cancel;
``bench_operator.py bulk`` measures the whole): a store at ``synchronous=FULL`` holds ``--runs``
runs, each ``running`` with one step in flight, owned by this process. Then, timed:

1. the request: ``Store.request_cancels`` of every run by id (one transaction);
2. the ending: each run's step settled ``interrupted`` (deferred: ``durable=False``) and its
   final transition ``cancelling -> cancelled`` (owner released), all submitted in one
   iteration of the event loop, as the runs' tasks do, so that they share one group commit.

Per phase: the process's CPU time (user + system: the machine's other work moves it less than
the wall clock) and the collector's share of it, the wall clock, and in a second pass of its
own (hooks cost time, so they are not in the timed pass) the statements SQLite ran
(``set_trace_callback``: each execution of an ``executemany`` row and each statement a trigger
runs counts), the rows changed (``total_changes``) and the WAL frames written (counted from the
WAL's salts, checkpoints off in that pass).

Each measurement runs in a fresh process, alternating between the working tree and, with
``--against REV``, the source of that revision (``git archive``), round after round; the table
shows medians. Final transitions pass ``returning=False`` where the revision's store has it.

usage: python bench/bulk_journal.py [--runs N] [--rounds N] [--against REV]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PHASES = ("request", "ending")


def wal_frames(wal: str) -> int:
    """The frames of the WAL's current generation (a frame counts when its salts are the
    header's: SQLite's file format)."""
    data = Path(wal).read_bytes()
    if len(data) < 32:
        return 0
    page_size, salts = int.from_bytes(data[8:12], "big"), data[16:24]
    frame = 24 + page_size
    return sum(
        1
        for offset in range(32, len(data) - frame + 1, frame)
        if data[offset + 8 : offset + 16] == salts
    )


async def _once(path: str, runs: int, counting: bool) -> dict[str, dict[str, float]]:
    """Fill a store, then time the two phases (see the module docstring)."""
    import anyio

    from haltwise._core.policy import Effect
    from haltwise._core.records import Owner
    from haltwise._core.states import State, StepStatus
    from haltwise._journal import open_store
    from haltwise._journal.store import NewRun, StepStart

    owner = Owner(token="bench-owner", host=os.uname().nodename, pid=os.getpid(), started=1.0)
    step = StepStart(0, "wait_in_tool", "interruptible", Effect.READ, False, "wait-0")
    store: Any = open_store(f"sqlite:///{path}")
    await store.open()
    ids = [f"run-{index}" for index in range(runs)]
    store.set_concurrency(runs)

    async def waiting(run_id: str) -> None:
        await store.create_run(
            NewRun(id=run_id, task="bench:waiter", inputs={"args": [], "kwargs": {}},
                   state=State.RUNNING, owner=owner, lease_until=time.time() + 3600)
        )  # fmt: skip
        await store.start_step(run_id, step, fence=owner.token)

    for start in range(0, runs, 1000):
        async with anyio.create_task_group() as group:
            for run_id in ids[start : start + 1000]:
                group.start_soon(waiting, run_id)
    conn: sqlite3.Connection = store._writer.conn
    statements = [0]
    if counting:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        store._writer._set_checkpoint = lambda conn, operations: None

        def count(_: str) -> None:
            statements[0] += 1

        conn.set_trace_callback(count)
    unread = "returning" in inspect.signature(store.transition).parameters
    extra = {"returning": False} if unread else {}

    async def end(run_id: str) -> None:
        await store.settle_step(run_id, 0, StepStatus.INTERRUPTED, fence=owner.token, durable=False)
        await store.transition(
            run_id, State.CANCELLED, expected={State.CANCELLING}, cancel_error=None,
            owner=None, lease_until=None, fence=owner.token, **extra,
        )  # fmt: skip

    async def request() -> None:
        result = await store.request_cancels(
            ids=ids, states=(), tasks=None, reason="bulk", force=False
        )
        assert len(result.reached) == runs

    async def ending() -> None:
        async with anyio.create_task_group() as group:
            for run_id in ids:
                group.start_soon(end, run_id)

    collected = [0.0, 0.0]  # CPU in the collector, the start of the current collection

    def collector(stage: str, _: dict[str, int]) -> None:
        if stage == "start":
            collected[1] = time.process_time()
        else:
            collected[0] += time.process_time() - collected[1]

    gc.callbacks.append(collector)
    phases: dict[str, dict[str, float]] = {}
    for name, phase in (("request", request), ("ending", ending)):
        frames, rows, ran = wal_frames(path + "-wal"), conn.total_changes, statements[0]
        cpu, wall, gc_cpu = time.process_time(), time.perf_counter(), collected[0]
        await phase()
        phases[name] = {
            "cpu": time.process_time() - cpu,
            "gc": collected[0] - gc_cpu,
            "wall": time.perf_counter() - wall,
            "rows": conn.total_changes - rows,
            "statements": statements[0] - ran,
            "frames": wal_frames(path + "-wal") - frames if counting else 0,
        }
    gc.callbacks.remove(collector)
    conn.set_trace_callback(None)
    left = [run.id for run in await store.list_runs() if run.state is not State.CANCELLED]
    assert not left, f"{len(left)} runs not cancelled"
    await store.close()
    return phases


def measure(source: Path, runs: int, counting: bool) -> dict[str, dict[str, float]]:
    """One fresh process of this script on the haltwise at ``source``."""
    env = dict(os.environ, PYTHONPATH=str(source))
    command = [sys.executable, __file__, "_once", "--runs", str(runs)]
    command += ["--counting"] if counting else []
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
    return result


def archived(rev: str, into: Path) -> tuple[str, Path]:
    """The source tree of revision ``rev`` (its short name, its ``src``), from ``git archive``."""
    short = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True
    )
    if short.returncode:
        raise SystemExit(f"not a revision: {rev}")
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return short.stdout.strip(), into / "src"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", default="table", choices=["table", "_once"])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="an earlier revision, measured alternately")
    parser.add_argument("--counting", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.what == "_once":
        import anyio

        with tempfile.TemporaryDirectory() as scratch:
            path = f"{scratch}/bulk.db"
            print(json.dumps(anyio.run(_once, path, args.runs, args.counting)))
        return
    from _report import header, median, table

    trees = {"working tree": ROOT / "src"}
    with tempfile.TemporaryDirectory() as scratch:
        if args.against:
            short, source = archived(args.against, Path(scratch))
            trees = {short: source, **trees}
        timed: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, source in trees.items():
                timed[name].append(measure(source, args.runs, counting=False))
        counted = {
            name: measure(source, args.runs, counting=True) for name, source in trees.items()
        }
    print(header(f"The journal's share of a bulk cancel of {args.runs:,} waiting runs (SQLite)"))
    print(f"{args.rounds} rounds, alternating, a fresh process each; medians:\n")
    rows = []
    for name in trees:
        for phase in PHASES:
            counts = counted[name][phase]
            rows.append(
                [
                    name,
                    phase,
                    f"{median([r[phase]['cpu'] for r in timed[name]]) * 1000:,.0f} ms",
                    f"{median([r[phase]['gc'] for r in timed[name]]) * 1000:,.0f} ms",
                    f"{median([r[phase]['wall'] for r in timed[name]]) * 1000:,.0f} ms",
                    f"{counts['statements']:,.0f}",
                    f"{counts['rows']:,.0f}",
                    f"{counts['frames']:,.0f}",
                ]
            )
    headers = ["revision", "phase", "CPU", "of which the collector", "wall", "statements"]
    headers += ["rows changed", "WAL frames"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
