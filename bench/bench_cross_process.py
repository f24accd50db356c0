"""Cancel from another process, and what an idle waiting run costs (SQLite store).

1. Cross-process cancel latency: this process calls ``Runtime.cancel`` on a run that another
   process is working, its step waiting in an interruptible tool. Measured on the wall clock
   (both processes on this host): request -> the tool interrupted in the other process, and
   request -> the run recorded final there. Side by side: the same cancel in-process.
2. ``haltwise cancel ID`` as a command (a new Python process each time), request -> final.
3. CPU used by a process whose run waits idle in an interruptible tool, against a bare
   asyncio process sleeping (the floor) and one that only wakes as often as the watcher polls
   (what waking that often costs on this machine by itself).

usage: python bench/bench_cross_process.py [--trials N] [--cli-trials N] [--idle-seconds S]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from _report import header, percentile, read_event, table
from bench_core import cancel_latencies

import haltwise
from haltwise._journal.sqlite import _POLL_INTERVAL

HERE = Path(__file__).resolve().parent


def spawn_target(url: str, trials: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_cancel_target.py"), url, str(trials)],
        stdout=subprocess.PIPE,
        text=True,
    )


async def cross_process(url: str, trials: int) -> tuple[list[float], list[float]]:
    proc = spawn_target(url, trials)
    stopped, final = [], []
    async with haltwise.Runtime(url) as runtime:
        for i in range(trials):
            await anyio.to_thread.run_sync(read_event, proc, "entered")
            start = time.time()
            await runtime.cancel(f"x{i}")
            stop_fields = await anyio.to_thread.run_sync(read_event, proc, "stopped")
            final_fields = await anyio.to_thread.run_sync(read_event, proc, "final")
            assert final_fields[3] == "cancelled", final_fields
            stopped.append(float(stop_fields[2]) - start)
            final.append(float(final_fields[2]) - start)
    proc.wait(timeout=30)
    return stopped, final


def cli_cancels(url: str, trials: int) -> list[float]:
    proc = spawn_target(url, trials)
    env = {**os.environ, "HALTWISE_STORE": url}
    latencies = []
    for i in range(trials):
        read_event(proc, "entered")
        start = time.time()
        subprocess.run(
            [sys.executable, "-m", "haltwise", "cancel", f"x{i}"],
            env=env,
            check=True,
            capture_output=True,
        )
        latencies.append(float(read_event(proc, "final")[2]) - start)
    proc.wait(timeout=30)
    return latencies


#: What the watcher's poll costs by itself: an event loop that wakes as often and does nothing.
_POLL_LOOP = f"""
import asyncio
async def poll():
    while True:
        await asyncio.sleep({_POLL_INTERVAL})
asyncio.run(poll())
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(command: list[str], seconds: float, ready: str | None) -> float:
    """Percent of one core a process uses over ``seconds`` once it printed ``ready``."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    if ready is not None:
        read_event(proc, ready)
    else:
        time.sleep(0.5)  # let the interpreter start
    before, start = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)  # the measurement window itself
    used = cpu_seconds(proc.pid) - before
    elapsed = time.monotonic() - start
    proc.kill()
    proc.wait()
    return 100 * used / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--cli-trials", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="haltwise-xproc-"))
    print(header("Cancel from another process (SQLite, WAL + FULL)"))
    stopped, final = anyio.run(cross_process, f"sqlite:///{base / 'x.db'}", args.trials)
    local = anyio.run(cancel_latencies, f"sqlite:///{base / 'local.db'}", args.trials)
    cli = cli_cancels(f"sqlite:///{base / 'cli.db'}", args.cli_trials)

    def row(name: str, values: list[float]) -> list[object]:
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        worst = max(values)
        return [name, len(values), f"{p50 * 1e3:.2f}", f"{p99 * 1e3:.2f}", f"{worst * 1e3:.2f}"]

    print(
        table(
            ["what", "trials", "p50 ms", "p99 ms", "max ms"],
            [
                row("other process: request -> tool interrupted", stopped),
                row("other process: request -> run final", final),
                row("baseline, same process: request -> run final", local),
                row("`haltwise cancel ID` command -> run final", cli),
            ],
        )
    )
    print()
    waiting = idle_cpu(
        [sys.executable, str(HERE / "_cancel_target.py"), f"sqlite:///{base / 'idle.db'}", "1"],
        args.idle_seconds,
        "entered",
    )
    floor = idle_cpu(
        [sys.executable, "-c", "import asyncio; asyncio.run(asyncio.sleep(3600))"],
        args.idle_seconds,
        None,
    )
    polling = idle_cpu(
        [sys.executable, "-c", _POLL_LOOP],
        args.idle_seconds,
        None,
    )
    print(f"CPU of an idle process over {args.idle_seconds:g} s:\n")
    print(
        table(
            ["process", "% of one core"],
            [
                ["a run waiting in an interruptible tool (watching for cancels)", f"{waiting:.2f}"],
                ["baseline: bare asyncio.sleep", f"{floor:.2f}"],
                [
                    f"baseline: a bare asyncio loop waking every {_POLL_INTERVAL * 1000:g} ms",
                    f"{polling:.2f}",
                ],
            ],
        )
    )


if __name__ == "__main__":
    main()
