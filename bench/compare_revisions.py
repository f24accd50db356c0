"""The same measurements on an earlier revision of haltwise and on the working tree, side by side.

Each measurement runs in a fresh process (``_measure_once.py``), alternating between the two
source trees round after round, so that the machine's slow and fast spells fall on both alike;
the table shows the medians, and beside each the spread of its databases (lowest to highest, as
a change from the median): the machine's noise on that case in that run. A change smaller than
both spreads is not a change. The earlier revision is checked out in a temporary git worktree
(removed afterwards); the benchmark code itself is always the working tree's.

usage: python bench/compare_revisions.py REV [--rounds N]
       [--kind cpu|pgcalls|pgcpu|runs|scale|scalecpu|scalewrites|sequential]

The PostgreSQL cases (pgcpu, pgcalls) run on a durable throwaway server started for the run
(bench_fleet's, as bench_postgres.py's), a fresh database per measurement.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _report import header, median, table
from bench_fleet import Stores

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: (what, kind, size, setting, unit): scale measures steps/s (higher is better), scalecpu the
#: CPU time per step of the same runs (lower is better: the disk's and the machine's other work
#: move it less than steps/s), scalewrites the KiB written per step of the same runs (all
#: files: the WAL, the checkpoints' copies, temporary files; Linux), sequential us per step,
#: runs us per run (a run's fixed costs: its creation, start, end and outcome) and cpu the CPU
#: time of a step without the disk (synchronous=OFF; lower is better); pgcpu is scalecpu on
#: PostgreSQL (issue 19's 100 runs), pgcalls the Python calls per step of the same runs
CASES = [
    ("1,000 runs, effect=none", "scale", 1000, "none", "steps/s"),
    ("1,000 runs, effect=none, CPU", "scalecpu", 1000, "none", "CPU us/step"),
    ("1,000 runs, effect=none, written", "scalewrites", 1000, "none", "KiB/step"),
    ("1,000 runs, effect=write", "scale", 1000, "write", "steps/s"),
    ("100 runs, effect=none", "scale", 100, "none", "steps/s"),
    ("10 runs, effect=none", "scale", 10, "none", "steps/s"),
    ("10 runs, effect=none, written", "scalewrites", 10, "none", "KiB/step"),
    ("1,000 runs of no steps", "runs", 1000, "none", "us/run"),
    ("1 run, 1,000 steps, FULL", "sequential", 1000, "full", "us/step"),
    ("1 run, 5,000 steps, NORMAL", "sequential", 5000, "normal", "us/step"),
    ("1 run, 3,000 interruptible steps, CPU", "cpu", 3000, "interruptible", "CPU us/step"),
    ("1 run, 3,000 finish steps, CPU", "cpu", 3000, "finish", "CPU us/step"),
    ("100 runs on PostgreSQL, CPU", "pgcpu", 100, "none", "CPU us/step"),
    ("100 runs on PostgreSQL, Python calls", "pgcalls", 100, "none", "calls/step"),
]


def measure(source: Path, kind: str, size: int, setting: str, postgres: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(source), HALTWISE_BENCH_PG=postgres)
    command = [sys.executable, str(HERE / "_measure_once.py"), kind, str(size), setting]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return [float(line) for line in done.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rev", help="the earlier revision (anything git rev-parse takes)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--kind", choices=sorted({case[1] for case in CASES}), help="only the cases of this kind"
    )
    args = parser.parse_args()
    cases = [case for case in CASES if args.kind is None or case[1] == args.kind]
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True
    )
    if rev.returncode:
        raise SystemExit(f"not a revision: {args.rev}")
    short = rev.stdout.strip()
    worktree = Path(tempfile.mkdtemp(prefix="haltwise-rev-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(worktree), short], cwd=ROOT, check=True
    )
    trees = {short: worktree / "src", "working tree": ROOT / "src"}
    server = _postgres(cases)
    dsn = server.server.dsn if server is not None and server.server is not None else ""
    try:
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for what, kind, size, setting, _unit in cases:
                for name, source in trees.items():
                    results.setdefault((what, name), []).extend(
                        measure(source, kind, size, setting, dsn)
                    )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
        if server is not None:
            server.close()
    stores = "SQLite, WAL" + (f"; PostgreSQL {server.pg_version}, durable" if server else "")
    print(header(f"haltwise at {short} against the working tree ({stores})"))
    counts = {len(values) for values in results.values()}
    shown = "-".join(str(count) for count in sorted(counts))
    print(f"{args.rounds} rounds, alternating, {shown} fresh databases per cell:\n")
    rows = []
    for what, _kind, _size, _setting, unit in cases:
        olds, news = results[(what, short)], results[(what, "working tree")]
        before, after = median(olds), median(news)
        better = "higher" if unit == "steps/s" else "lower"
        rows.append(
            [
                what,
                f"{unit} ({better} is better)",
                f"{before:,.1f}",
                spread(olds),
                f"{after:,.1f}",
                spread(news),
                percent(after / before - 1),
            ]
        )
    headers = ["case", "unit", short, "spread", "working tree", "spread", "change"]
    print(table(headers, rows))


def _postgres(cases: list[tuple[str, str, int, str, str]]) -> Stores | None:
    """The durable throwaway PostgreSQL server of the PostgreSQL cases, if any is selected."""
    if not any(kind.startswith("pg") for _, kind, _, _, _ in cases):
        return None
    stores = Stores(Path(tempfile.mkdtemp(prefix="haltwise-compare-pg-")))
    if stores.server is None:
        raise SystemExit(f"the PostgreSQL cases need a server: {stores.pg_missing}")
    return stores


def percent(change: float) -> str:
    return f"{change:+.0%}" if abs(change) >= 0.005 else "0%"


def spread(values: list[float]) -> str:
    """The lowest and highest of ``values`` as changes from their median: ``-4%..+6%``."""
    middle = median(values)
    return f"{percent(min(values) / middle - 1)}..{percent(max(values) / middle - 1)}"


if __name__ == "__main__":
    main()
