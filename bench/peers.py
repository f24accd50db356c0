"""haltwise beside DBOS Transact and LangGraph's SQLite checkpointer, in one run, on one disk.

1. Per-step overhead: ``--steps`` sequential trivial steps of one run, the median over
   ``--repeat`` fresh databases, each system at its durable settings (printed per row), beside
   a raw sqlite3 loop (one INSERT + COMMIT per step, WAL, ``synchronous=FULL`` and ``NORMAL``;
   shown beside, not a target: with 1 KiB pages, and with its WAL preallocated as haltwise's
   store does).
   The repetitions are interleaved (system A, B, C, A, B, C, ...) so that a slow spell of the
   disk does not fall on one system only.
2. Cancel latency: runs of 10 steps of 50 ms, cancelled at random moments (the same moments for
   every system), ``--trials`` trials: when the caller is told, when it can see a final state,
   and when none of the run's code is running any more (p50/p95). For haltwise also with
   ``cancel="finish"`` steps and from another process with ``haltwise cancel ID``.
3. Resume after that cancel: committed steps that ran again, steps that completed twice.

Every measurement runs in a fresh process (DBOS is a process-wide singleton); the peers are
installed only in the benchmark venv (``make bench`` creates it). A peer that cannot be
imported is reported as not run, with the reason. The tables go to stdout, the numbers to
``--json`` (default ``docs/peers.json``).

usage: python bench/peers.py [--steps N] [--repeat N] [--trials N] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import header, median, percentile, table

HERE = Path(__file__).resolve().parent
MODULES = {"haltwise": "_peer_haltwise", "dbos": "_peer_dbos", "langgraph": "_peer_langgraph"}
PACKAGES = ["haltwise", "dbos", "langgraph", "langgraph-checkpoint-sqlite", "SQLAlchemy"]


@dataclass(frozen=True)
class Row:
    """One line of a table: a system, run one way."""

    label: str
    system: str  # "raw" or a key of MODULES
    variant: str
    #: settings changed from the system's defaults (shown, but not the row a target is met on)
    tuned: bool = False


OVERHEAD_ROWS = [
    Row("raw sqlite3 INSERT+COMMIT", "raw", "FULL"),
    Row("raw sqlite3 INSERT+COMMIT", "raw", "NORMAL"),
    Row("raw sqlite3 INSERT+COMMIT, 1 KiB pages", "raw", "FULL-1024", tuned=True),
    Row("raw sqlite3 INSERT+COMMIT, WAL preallocated", "raw", "FULL-room", tuned=True),
    Row('haltwise, effect="none"', "haltwise", "none"),
    Row('haltwise, effect="write"', "haltwise", "write"),
    Row('haltwise, effect="none"', "haltwise", "none-normal"),
    Row("DBOS, async workflow", "dbos", "async"),
    Row("DBOS, sync workflow", "dbos", "sync"),
    Row("DBOS, async workflow, file put in WAL", "dbos", "async-wal", tuned=True),
    Row("DBOS, sync workflow, file put in WAL", "dbos", "sync-wal", tuned=True),
    Row("LangGraph, ainvoke", "langgraph", "async"),
    Row("LangGraph, invoke", "langgraph", "sync"),
]
CANCEL_ROWS = [
    Row('haltwise, cancel="interruptible"', "haltwise", "interruptible"),
    Row('haltwise, cancel="finish"', "haltwise", "finish"),
    Row("haltwise, `haltwise cancel ID` command", "haltwise", "cli"),
    Row("DBOS, cancel_workflow_async", "dbos", "default"),
    Row("LangGraph, task.cancel()", "langgraph", "default"),
]


# -- the worker side: one measurement in this process ------------------------------------------


def worker(system: str, kind: str, variant: str, db: Path, count: int) -> dict[str, Any]:
    if system == "raw":
        from bench_core import raw_loop

        synchronous, _, option = variant.partition("-")
        page_size = int(option) if option.isdigit() else None
        room = option == "room"
        seconds = raw_loop(db, count, synchronous, page_size, wal_room=room)
        pages = f", page_size={page_size}" if page_size else ""
        pages += ", WAL given its room first" if room else ""
        return {"seconds_per_step": seconds, "settings": f"WAL, synchronous={synchronous}{pages}"}
    module = importlib.import_module(MODULES[system])
    if kind == "overhead":
        seconds = module.overhead(db, count, variant)
        return {"seconds_per_step": seconds, "settings": module.settings(db, variant)}
    return {"trials": module.cancel_trials(db, count, variant)}


# -- the orchestrating side ---------------------------------------------------------------------


def measure(row: Row, kind: str, db: Path, count: int) -> dict[str, Any]:
    """Run one measurement in a fresh process; ``{"error": ...}`` if it could not run."""
    command = [sys.executable, str(HERE / "peers.py"), "--worker", row.system, kind, row.variant]
    done = subprocess.run(
        [*command, str(db), str(count)], capture_output=True, text=True, timeout=600
    )
    return worker_result(done)


def worker_result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON a worker process printed last, or ``{"error": its last line of stderr}``."""
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = done.stderr.strip().splitlines()
        last = errors[-1] if errors else f"exit code {done.returncode}"
        return {"error": last if len(last) <= 160 else last[:160] + "..."}
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def versions(packages: list[str] | tuple[str, ...] = tuple(PACKAGES)) -> dict[str, str]:
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def overhead_section(base: Path, steps: int, repeat: int) -> list[dict[str, Any]]:
    per_row: dict[Row, list[dict[str, Any]]] = {row: [] for row in OVERHEAD_ROWS}
    for r in range(repeat):
        for n, row in enumerate(OVERHEAD_ROWS):
            db = base / f"overhead-{n}-{r}.db"
            per_row[row].append(measure(row, "overhead", db, steps))
    results = []
    for row, found in per_row.items():
        good = [f for f in found if "error" not in f]
        entry: dict[str, Any] = {"system": row.label, "variant": row.variant, "tuned": row.tuned}
        if len(good) < len(found):
            entry["error"] = next(f["error"] for f in found if "error" in f)
        if good:
            entry["settings"] = good[0]["settings"]
            entry["us_per_step"] = [f["seconds_per_step"] * 1e6 for f in good]
            entry["median_us"] = median(entry["us_per_step"])
        results.append(entry)
    return results


def cancel_section(base: Path, trials: int) -> list[dict[str, Any]]:
    results = []
    for n, row in enumerate(CANCEL_ROWS):
        found = measure(row, "cancel", base / f"cancel-{n}.db", trials)
        entry: dict[str, Any] = {"system": row.label, "variant": row.variant, **found}
        if "trials" in found:
            entry.update(summarise_trials(found["trials"]))
        results.append(entry)
    return results


def summarise_trials(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 of each cancel trial's times (ms) and the totals of what ran again."""
    entry: dict[str, Any] = {}
    for name in ("told", "final", "stopped"):
        values = [t[name] for t in runs]
        entry[f"{name}_p50_ms"] = percentile(values, 0.5) * 1e3
        entry[f"{name}_p95_ms"] = percentile(values, 0.95) * 1e3
    for name in ("rerun_committed", "completed_twice"):
        entry[f"{name}_total"] = sum(t[name] for t in runs)
        entry[f"{name}_trials"] = sum(1 for t in runs if t[name])
    entry["resumed_all"] = all(t["resumed"] for t in runs)
    return entry


def _fastest(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    """The overhead row of system ``prefix`` at its default settings with the lowest median."""
    found = [
        r for r in rows if r["system"].startswith(prefix) and "median_us" in r and not r["tuned"]
    ]
    return min(found, key=lambda r: float(r["median_us"])) if found else None


def _paired(over: dict[str, Any] | None, under: dict[str, Any] | None) -> float | None:
    """``over / under`` per step: the median of the per-repetition ratios (the two were measured
    back to back in each repetition, so a slow spell of the disk weighs on both sides), or the
    ratio of the medians if a repetition is missing on one side."""
    if over is None or under is None or "median_us" not in over or "median_us" not in under:
        return None
    ups, downs = over["us_per_step"], under["us_per_step"]
    if len(ups) != len(downs):
        return float(over["median_us"]) / float(under["median_us"])
    return median([up / down for up, down in zip(ups, downs, strict=True)])


def _target(name: str, goal: float, value: float | None) -> dict[str, Any]:
    """``value`` must reach ``goal``, or stay at most ``-goal`` when ``goal`` is negative."""
    sign = ">=" if goal > 0 else "<="
    if value is None:
        return {
            "target": name,
            "goal": f"{sign} {abs(goal):g}x",
            "value": "not measured",
            "met": False,
        }
    met = value >= goal if goal > 0 else value <= -goal
    return {"target": name, "goal": f"{sign} {abs(goal):g}x", "value": f"{value:.2f}x", "met": met}


def targets(overhead: list[dict[str, Any]], cancel: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, as ratios in this run: a peer's fastest variant at its own default
    settings is the one to beat (the rows with tuned settings are shown beside, not used)."""
    ours = next((r for r in overhead if r["variant"] == "none"), None)
    raw = next((r for r in overhead if r["variant"] == "FULL"), None)
    ours_cancel = next((r for r in cancel if r["variant"] == "interruptible"), {})
    dbos_cancel = next((r for r in cancel if r["system"].startswith("DBOS")), {})
    stopped = None
    if "stopped_p95_ms" in ours_cancel and "stopped_p95_ms" in dbos_cancel:
        stopped = dbos_cancel["stopped_p95_ms"] / max(ours_cancel["stopped_p95_ms"], 1e-6)
    haltwise_cancel = [r for r in cancel if r["system"].startswith("haltwise")]
    twice = sum(r.get("completed_twice_total", 0) for r in haltwise_cancel)
    measured = all("trials" in r for r in haltwise_cancel)
    return [
        _target("per-step overhead, DBOS / haltwise", 5, _paired(_fastest(overhead, "DBOS"), ours)),
        _target(
            "per-step overhead, LangGraph / haltwise",
            3,
            _paired(_fastest(overhead, "LangGraph"), ours),
        ),
        _target("per-step overhead, haltwise / raw WAL+FULL", -1.5, _paired(ours, raw)),
        _target("cancel 'stopped' p95, DBOS / haltwise", 3, stopped),
        {
            "target": "haltwise steps completed twice (all haltwise cancel rows)",
            "goal": "0",
            "value": str(twice) if measured else "not measured",
            "met": measured and twice == 0,
        },
    ]


def print_tables(report: dict[str, Any], steps: int, repeat: int, trials: int) -> None:
    print(f"versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items())}")
    print(f"load average at start (1, 5, 15 min): {report['load_average_at_start']}\n")
    print(
        f"1. Per-step overhead: {steps} sequential trivial steps, median of {repeat} fresh "
        "databases (each system's durable settings):\n"
    )
    rows = []
    for r in report["overhead"]:
        if "median_us" not in r:
            rows.append([r["system"], "-", "not run: " + r.get("error", "?"), "-"])
            continue
        spread = f"{min(r['us_per_step']):.0f}-{max(r['us_per_step']):.0f}"
        rows.append([r["system"], r["settings"], f"{r['median_us']:.0f}", spread])
    print(table(["system", "durable settings", "us/step (median)", "range"], rows))
    print(
        f"\n2-3. Cancel, then resume: runs of 10 steps x 50 ms cancelled at random moments, "
        f"{trials} trials (ms from the cancel call):\n"
    )
    print(cancel_table(report["cancel"]))
    print(
        "\nTargets (ratios in this run; per-step ratios are medians of the per-repetition "
        "ratios):\n"
    )
    rows = [
        [t["target"], t["goal"], t["value"], "met" if t["met"] else "MISSED"]
        for t in report["targets"]
    ]
    print(table(["target", "goal", "measured", ""], rows))
    overhead = report["overhead"]
    ours = next((r for r in overhead if r["variant"] == "none"), None)
    beside = [
        (what, _paired(ours, next((r for r in overhead if r["variant"] == variant), None)))
        for what, variant in (
            ("the raw loop with 1 KiB pages (haltwise's page size)", "FULL-1024"),
            ("the raw loop with its WAL preallocated (as haltwise's store does)", "FULL-room"),
        )
    ]
    for what, ratio in beside:
        if ratio is not None:
            print(f"\nNot a target, for reading the third: haltwise / {what} = {ratio:.2f}x")


def cancel_table(entries: list[dict[str, Any]]) -> str:
    """The cancel-then-resume table of :func:`summarise_trials` entries."""
    rows = []
    for r in entries:
        if "told_p50_ms" not in r:
            rows.append([r["system"], "not run: " + r.get("error", "?"), *["-"] * 5])
            continue
        rows.append(
            [
                r["system"],
                f"{r['told_p50_ms']:.1f} / {r['told_p95_ms']:.1f}",
                f"{r['final_p50_ms']:.1f} / {r['final_p95_ms']:.1f}",
                f"{r['stopped_p50_ms']:.1f} / {r['stopped_p95_ms']:.1f}",
                f"{r['rerun_committed_total']} in {r['rerun_committed_trials']}",
                f"{r['completed_twice_total']} in {r['completed_twice_trials']}",
                "yes" if r["resumed_all"] else "NO",
            ]
        )
    headers = [
        "system",
        "told p50/p95",
        "final p50/p95",
        "stopped p50/p95",
        "committed steps run again",
        "steps completed twice",
        "resume completed",
    ]
    return table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--json", type=Path, default=HERE.parent / "docs" / "peers.json")
    parser.add_argument(
        "--worker",
        nargs=5,
        metavar=("SYSTEM", "KIND", "VARIANT", "DB", "N"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.worker:
        system, kind, variant, db, count = args.worker
        print(json.dumps(worker(system, kind, variant, Path(db), int(count))))
        return
    base = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-peers-"))
    base.mkdir(parents=True, exist_ok=True)
    print(header("haltwise beside DBOS Transact and LangGraph (SQLite, one disk)"))
    report: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        # other work on the machine skews a disk benchmark: say how busy it was
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
        "steps": args.steps,
        "repeat": args.repeat,
        "trials": args.trials,
    }
    report["overhead"] = overhead_section(base, args.steps, args.repeat)
    report["cancel"] = cancel_section(base, args.trials)
    report["targets"] = targets(report["overhead"], report["cancel"])
    print_tables(report, args.steps, args.repeat, args.trials)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nnumbers written to {args.json}")


if __name__ == "__main__":
    main()
