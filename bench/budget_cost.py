"""What budget accounting costs a step (issue 33): CPU per step and commits per step of one run of
``--steps`` trivial steps on SQLite (``synchronous=off``, so that the disk does not count;
``time.process_time`` of every thread), in three variants measured in the same process,
interleaved, ``--repeat`` times, fresh databases each time (medians shown):

- ``no budget``: the baseline, steps that spend nothing (spend is still counted: a tool call per
  step, journaled as its attempt);
- ``budget``: the same run with a budget (``usd``, ``tokens`` and ``tool_calls`` limits far
  above what it spends): the check before and after every step, the call counted;
- ``budget + spend``: the same with ``haltwise.spend(usd=..., tokens=...)`` in every step: the
  spend counted, checked, and journaled by the step's settlement (three more values in its
  statement).

Commits are the ``COMMIT`` statements the store's connection ran (SQLite's trace callback), per
step: budget accounting must add none (its spend rides in the step's own settlement write).

usage: python bench/budget_cost.py [--steps N] [--repeat N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _report import header, median, table

import haltwise

LIMITS = haltwise.Budget(usd=1e12, tokens=10**15, tool_calls=10**9)


@haltwise.tool(cancel="interruptible", effect="none")
async def plain(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="none")
async def spending(i: int) -> int:
    haltwise.spend(usd=0.0001, tokens=10)
    return i


@haltwise.task(name="bench:budget_steps")
async def steps(n: int, spend: bool) -> int:
    tool = spending if spend else plain
    for i in range(n):
        await tool(i)
    return n


VARIANTS: dict[str, tuple[haltwise.Budget | None, bool]] = {
    "no budget": (None, False),
    "budget": (LIMITS, False),
    "budget + spend": (LIMITS, True),
}


async def measure(
    url: str, n: int, budget: haltwise.Budget | None, spend: bool
) -> tuple[float, float]:
    """(CPU us per step, commits per step) of one run of ``n`` steps, after a warm-up run."""
    commits = 0

    def trace(statement: str) -> None:
        nonlocal commits
        if statement.strip().upper().startswith("COMMIT"):
            commits += 1

    async with haltwise.Runtime(url) as runtime:
        warm = await runtime.start(steps, 50, spend, task_id="warm-up", budget=budget)
        await warm.outcome()
        conn: Any = runtime.store._writer.conn  # type: ignore[attr-defined]  # bench only
        conn.set_trace_callback(trace)
        start = time.process_time()
        handle = await runtime.start(steps, n, spend, task_id="measured", budget=budget)
        outcome = await handle.outcome()
        cpu = time.process_time() - start
        conn.set_trace_callback(None)
    if outcome.state is not haltwise.State.COMPLETED:
        raise SystemExit(f"the run did not complete: {outcome}")
    spent = outcome.to_json()["budget"]["spent"]
    if spent["tool_calls"] != n or spent["tokens"] != (10 * n if spend else 0):
        raise SystemExit(f"spend not counted as expected: {spent}")
    return cpu / n * 1e6, commits / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    commits: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as base:
        for round_ in range(args.repeat):
            for name, (budget, spend) in VARIANTS.items():
                path = Path(base) / f"{round_}-{len(cpu[name])}-{name.replace(' ', '_')}.db"
                url = f"sqlite:///{path}?synchronous=off"
                us, per_step = anyio.run(measure, url, args.steps, budget, spend)
                cpu[name].append(us)
                commits[name].append(per_step)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(header("Budget accounting: CPU and commits per step (SQLite, synchronous=off)"))
    print(f"- load (1, 5, 15 min) after the run: {' '.join(load)}\n")
    base_cpu = median(cpu["no budget"])
    rows = [
        (
            name,
            f"{median(cpu[name]):.1f}",
            f"{median(cpu[name]) - base_cpu:+.1f}",
            f"{min(cpu[name]):.1f}-{max(cpu[name]):.1f}",
            f"{median(commits[name]):.3f}",
        )
        for name in VARIANTS
    ]
    headers = ("variant", "CPU us/step", "vs no budget", "range", "commits/step")
    print(table(headers, rows))


if __name__ == "__main__":
    main()
