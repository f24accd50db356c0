"""Bulk cancel and idle cost as an operator meets them (issue 35, items 1 and 2).

``--runs`` runs (default 10,000) wait in an interruptible tool in one process (SQLite); from a
wheel install (``bench_command.install``: nothing compiled at run time), ``haltwise cancel --all``
is typed in a second process. The figure: from the command's exec to the last of the runs seen
final by the waiting process (target: under 1 s). Beside it, a breakdown (not the target's
figure): the command's own exec to exit; its exit to the first tool interrupted in the waiting
process; from there to the last run final. And the waiting process's idle cost before the
cancel: memory per waiting run (RSS) and CPU over an idle window of ``--idle`` seconds (at least
one lease renewal: the default lease is 15 s, renewed every 5 s) (targets: 16 KiB, 2% of a core).

A baseline in the same run: one waiting run. With ``--approval``, the same rounds with the runs
awaiting the approval of a call instead (the approvals scale row: they should cost what runs
waiting in a tool cost).

usage: python bench/bench_bulk_cli.py [--runs N] [--rounds N] [--idle SECONDS] [--approval]
       [--keep DIR]
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
    bin_dir: Path, scratch: Path, runs: int, idle: float, round_: int, mode: str = "tool"
) -> dict[str, float]:
    db = scratch / f"bulk-{mode}-{runs}-{round_}.db"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)  # (a kept folder holds the last run's store)
    url = f"sqlite:///{db}"
    target = subprocess.Popen(
        [
            str(bin_dir / "python"),
            str(HERE / "_bulk_target.py"),
            url,
            str(runs),
            str(idle),
            mode,
        ],
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
    parser.add_argument(
        "--approval",
        action="store_true",
        help="also the runs awaiting approval (the approvals scale row), side by side",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        bin_dir = scratch / "venv" / "bin"
        if not (bin_dir / "haltwise").exists():
            bin_dir = install(scratch)
        rows = []
        results = []
        # the baseline, in the same run: one waiting run (the fixed cost of a process that
        # waits, and of the command)
        plans = [("baseline: 1 run in a tool", 1, "tool")]
        plans += [(f"{args.runs:,} in a tool", args.runs, "tool")] * args.rounds
        if args.approval:  # the approvals scale row, side by side
            plans += [(f"{args.runs:,} awaiting approval", args.runs, "approval")] * args.rounds
        for round_, (label, runs, mode) in enumerate(plans):
            result = one_round(bin_dir, scratch, runs, args.idle, round_, mode)
            if runs == args.runs and mode == "tool":
                results.append(result)
            rows.append(
                (
                    label,
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
                "waiting runs",
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
