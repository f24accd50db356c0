"""Bulk cancel and idle cost as an operator meets them (issue 35, items 1 and 2).

``--runs`` runs (default 10,000) wait in an interruptible tool in one process (SQLite); from a
wheel install (``bench_command.install``: nothing compiled at run time), ``haltwise cancel --all``
is typed in a second process. The figure: from the command's exec to the last of the runs seen
final by the waiting process (target: under 1 s). Beside it, a breakdown (not the target's
figure): the command's own exec to exit; its exit to the first tool interrupted in the waiting
process; from there to the last run final. And the waiting process's idle cost before the
cancel: memory per waiting run (RSS) and CPU over an idle window of ``--idle`` seconds (at least
one lease renewal: the default lease is 15 s, renewed every 5 s) (targets: 16 KiB, 2% of a core).

usage: python bench/bench_bulk_cli.py [--runs N] [--rounds N] [--idle SECONDS] [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from _report import header, median, read_event, table
from bench_command import install, load, plain_env

HERE = Path(__file__).resolve().parent


def one_round(
    bin_dir: Path, scratch: Path, runs: int, idle: float, round_: int
) -> dict[str, float]:
    url = f"sqlite:///{scratch}/bulk-{round_}.db"
    target = subprocess.Popen(
        [str(bin_dir / "python"), str(HERE / "_bulk_target.py"), url, str(runs), str(idle)],
        stdout=subprocess.PIPE,
        text=True,
        env=plain_env(),
    )
    try:
        kib = float(read_event(target, "ready")[1])
        idle_cpu = float(read_event(target, "idle")[1])
        before = load()
        start = time.time()
        done = subprocess.run(
            [str(bin_dir / "haltwise"), "cancel", "--all", "--store", url, "--reason", "bulk"],
            capture_output=True,
            text=True,
            env=plain_env(),
        )
        exited = time.time()
        assert done.returncode == 0, done.stderr
        first = float(read_event(target, "first")[1])
        final = float(read_event(target, "final")[1])
        target.wait(timeout=60)
    finally:
        if target.poll() is None:
            target.kill()
    return {
        "total": final - start,
        "command": exited - start,
        "to_first": first - exited,
        "to_last": final - first,
        "kib": kib,
        "idle": idle_cpu,
        "load": float(before),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=16.0)
    parser.add_argument("--keep", type=Path, help="reuse (or make) the wheel venv in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        bin_dir = scratch / "venv" / "bin"
        if not (bin_dir / "haltwise").exists():
            bin_dir = install(scratch)
        rows = []
        results = []
        for round_ in range(args.rounds):
            result = one_round(bin_dir, scratch, args.runs, args.idle, round_)
            results.append(result)
            rows.append(
                (
                    round_ + 1,
                    f"{result['total'] * 1000:,.0f} ms",
                    f"{result['command'] * 1000:,.0f}",
                    f"{result['to_first'] * 1000:,.0f}",
                    f"{result['to_last'] * 1000:,.0f}",
                    f"{result['kib']:.1f} KiB",
                    f"{result['idle']:.2f}%",
                    f"{result['load']:.1f}",
                )
            )
    totals = [r["total"] * 1000 for r in results]
    print(header(f"haltwise cancel --all of {args.runs:,} waiting runs, from another process"))
    print(
        table(
            (
                "round",
                "exec -> last final",
                "breakdown: command exec -> exit (ms)",
                "exit -> first interrupted",
                "first -> last final",
                "memory per waiting run",
                f"idle CPU ({args.idle:g} s)",
                "load (1 min)",
            ),
            rows,
        )
    )
    print(f"\nmedian exec -> last final: {median(totals):,.0f} ms (target: under 1,000 ms)")


if __name__ == "__main__":
    main()
