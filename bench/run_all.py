"""Run every benchmark in sequence with this interpreter (``make bench``: the benchmark venv).

The order: core overheads, cross-process cancel, the peers (DBOS, LangGraph), throughput at
scale, the fleet benchmark when ``bench/bench_fleet.py`` exists, PostgreSQL beside DBOS
(``bench_postgres.py``), then any other ``bench/bench_*.py`` (by name), so that a new benchmark
is never left out. Each runs in its own
process; one that fails does not stop the others, and the exit code is 1 if any failed.

usage: python bench/run_all.py [--quick]   (--quick: fewer steps and trials, for a smoke run)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (script, arguments for a full run, arguments for --quick); a quick run writes its JSON and
#: plots to a scratch directory ({tmp}), never over the measured ones in docs/
BENCHMARKS: list[tuple[str, list[str], list[str]]] = [
    ("bench_core.py", [], ["--steps", "200", "--trials", "20", "--repeat", "1"]),
    ("bench_cross_process.py", [], ["--trials", "20", "--cli-trials", "3", "--idle-seconds", "1"]),
    ("peers.py", [], ["--steps", "50", "--repeat", "1", "--trials", "3", "--json", "{tmp}/p.json"]),
    (
        "bench_scale.py",
        [],
        ["--runs", "1,10,100", "--repeat", "1", "--json", "{tmp}/t.json", "--png", "{tmp}/t.png"],
    ),
    ("bench_fleet.py", [], []),
    (
        "bench_postgres.py",
        [],
        [
            "--steps",
            "50",
            "--repeat",
            "1",
            "--trials",
            "3",
            "--runs",
            "1,10",
            "--scale-repeat",
            "1",
            "--json",
            "{tmp}/pg.json",
            "--png",
            "{tmp}/pg.png",
        ],
    ),
    ("bench_integrations.py", [], ["--calls", "3", "--runs", "3"]),
    ("bench_pydantic_dbos.py", [], ["--runs", "5", "--trials", "2"]),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for the docs")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="haltwise-bench-quick-")
    failed = []
    began = time.monotonic()
    listed = {script for script, _, _ in BENCHMARKS}
    others = [(p.name, [], []) for p in sorted(HERE.glob("bench_*.py")) if p.name not in listed]
    for script, full, quick in [*BENCHMARKS, *others]:
        if not (HERE / script).exists():
            print(f"({script} does not exist here: skipped)\n", flush=True)
            continue
        # A path relative to the repository, so that each benchmark's header shows the command
        # as a reader would type it.
        extra = [arg.format(tmp=scratch) for arg in quick] if args.quick else full
        command = [sys.executable, f"bench/{script}", *extra]
        print(f"$ {' '.join(['python', *command[1:]])}", flush=True)
        start = time.monotonic()
        code = subprocess.run(command, cwd=HERE.parent).returncode
        print(f"\n({script}: exit code {code}, {time.monotonic() - start:.0f} s)\n", flush=True)
        if code != 0:
            failed.append(script)
    print(f"all benchmarks: {time.monotonic() - began:.0f} s", end="")
    print(f"; FAILED: {', '.join(failed)}" if failed else "")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
