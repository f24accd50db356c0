"""Shared helpers for the benchmarks: percentiles, a Markdown table, the environment line."""

from __future__ import annotations

import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Sequence


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
