"""Shared helpers for the benchmarks: percentiles, a Markdown table, the environment line, a
child process's event lines."""

from __future__ import annotations

import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (aligned, so it also reads well in a terminal)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def header(title: str) -> str:
    command = " ".join(["python", *sys.argv])
    return (
        f"## {title}\n\n"
        f"- command: `{command}`\n"
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
        f"- machine: {platform.machine()}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}\n"
    )


def throughput_plot(
    series: Sequence[tuple[str, Sequence[int], Sequence[float], dict[str, str]]],
    runs: Sequence[int],
    ceiling: tuple[float, str, int, str],
    xlabel: str,
    title: str,
    path: Path,
) -> str:
    """Plot steps per second against concurrent runs, log-log: each ``(label, runs, rates,
    line style)`` of ``series``, and the one-commit ceiling ``(steps/s, by what, the target's
    multiple, at how many runs)`` with its target as lines; save to ``path``. Returns what it
    did (matplotlib may be missing: it is in the benchmark venv only)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed here (make bench installs it): no plot"
    figure, axes = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for label, xs, ys, style in series:
        axes.plot(xs, ys, label=label, **style)
    roof, by, multiple, at = ceiling
    axes.axhline(roof, color="grey", linestyle="--", label=f"one commit per step ({by})")
    axes.axhline(
        multiple * roof, color="grey", linestyle=":", label=f"{multiple}x that (the target at {at})"
    )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(runs, [f"{n:,}" for n in runs])
    axes.set_xlabel(xlabel)
    axes.set_ylabel("durable steps per second (all runs)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return f"plot written to {path}"


def read_event(proc: subprocess.Popen[str], kind: str) -> list[str]:
    """The fields of the next line ``proc`` prints that begins with ``kind`` (lines before it
    are passed over); RuntimeError if ``proc`` ends first."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the process ended before a {kind!r} line")
        fields = line.split()
        if fields and fields[0] == kind:
            return fields
