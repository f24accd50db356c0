"""What issue 32 added to a run's start, measured: the guard of a cancel pressed before the run
existed, and the recorded code version.

Every ``Runtime.start`` (not a fork) now (1) looks for a cancel remembered for its id: on
PostgreSQL the creation statement calls ``haltwise.may_create(id, now)`` (schema 17: the id's
advisory lock, shared, then a probe of ``early_cancels``; session 12 had a plain ``NOT EXISTS``
probe, which lost a cancel racing the creation), on SQLite a ``DELETE ... RETURNING`` of the
id's row before the insert; and (2) records ``inputs.code``, the task's file digest and its
tools' (worked out once per task, cached: a dict copied into each run's inputs).

Variants, in one process on one store, interleaved round by round (the order turning each
round, ``_abcpu.order_of``), each round measuring every variant on ``--runs`` sequential runs of
an empty task (``start`` then its outcome: one creation, one final transition):

- ``baseline``: neither (the guard replaced by a constant, ``version_of`` returning None);
- ``A/A control``: the baseline again (the noise floor of this very run);
- ``+ code``: the code version recorded, no guard;
- PostgreSQL ``+ code + NOT EXISTS probe``: session 12's guard (lost cancels under a race);
- ``+ code + guard`` (PostgreSQL: ``may_create``; SQLite: the ``DELETE ... RETURNING``): as
  shipped.

Each figure is the median over rounds of wall ms per run, and of the per-round difference
against the baseline of the same round (with its bootstrap 95% interval); client CPU per run
likewise (``time.process_time``). The server's CPU is inside the wall time only.

    flock /tmp/hw-bench.lock nice -n -5 .venv/bin/python bench/bench_before_start.py
    (--rounds 12 --runs 40: about a minute on 2 cores; --store sqlite|postgres|both)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from _abcpu import CONTROL, bootstrap_median, load, order_of, settle_gc
from _report import header, table

import haltwise
from haltwise._journal import postgres as pg_module
from haltwise._journal import sqlite as sqlite_module
from haltwise._runtime import runtime as runtime_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # for _pg: the tests' throwaway PostgreSQL
from _pg import PostgresServer, create_database  # noqa: E402


@haltwise.task(name="bench_before_start:empty")
async def empty() -> int:
    return 1


_GUARD = "WHERE haltwise.may_create(%s, %s::double precision) "
_GUARD_MANY = "WHERE haltwise.may_create(g_id, g_created_at) "
_PROBE = (
    "WHERE NOT EXISTS (SELECT 1 FROM haltwise.early_cancels x "
    "WHERE x.id = %s AND x.expires_at > %s::double precision) "
)
_PROBE_MANY = (
    "WHERE NOT EXISTS (SELECT 1 FROM haltwise.early_cancels x "
    "WHERE x.id = g_id AND x.expires_at > g_created_at) "
)
_NONE = "WHERE %s::text IS NOT NULL AND %s::double precision IS NOT NULL "
_SHIPPED = (pg_module._CREATE, pg_module._CREATE_MANY)
assert _GUARD in _SHIPPED[0] and _GUARD_MANY in _SHIPPED[1], "the creation statements changed"
_REAL_VERSION_OF = runtime_module.version_of
_REAL_TAKE = sqlite_module._SQL.take_early_cancel


@contextmanager
def variant(kind: str, name: str) -> Iterator[None]:
    """The start path as variant ``name`` has it, for the duration of the block."""
    code = "code" in name
    runtime_module.version_of = _REAL_VERSION_OF if code else (lambda task: None)  # type: ignore[assignment]
    if kind == "postgres":
        one, many = _SHIPPED
        if "probe" in name:
            one, many = one.replace(_GUARD, _PROBE), many.replace(_GUARD_MANY, _PROBE_MANY)
        elif "guard" not in name:
            one, many = one.replace(_GUARD, _NONE), many.replace(_GUARD_MANY, "")
        pg_module._CREATE, pg_module._CREATE_MANY = one, many  # type: ignore[misc]
    else:
        take = _REAL_TAKE if "guard" in name else "SELECT NULL, NULL WHERE ? IS NULL"
        sqlite_module._SQL.take_early_cancel = take
    try:
        yield
    finally:
        runtime_module.version_of = _REAL_VERSION_OF
        pg_module._CREATE, pg_module._CREATE_MANY = _SHIPPED  # type: ignore[misc]
        sqlite_module._SQL.take_early_cancel = _REAL_TAKE


def variants_of(kind: str) -> list[str]:
    names = ["baseline", CONTROL, "+ code"]
    if kind == "postgres":
        names.append("+ code + NOT EXISTS probe (session 12)")
    names.append("+ code + guard (shipped)")
    return names


async def measure(url: str, kind: str, rounds: int, runs: int, warmup: int) -> dict[str, Any]:
    names = variants_of(kind)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    numbers = iter(range(10**9))
    async with haltwise.Runtime(url) as rt:
        for round_ in range(warmup + rounds):
            for name in order_of(names, round_):
                with variant(kind, name):
                    settle_gc()
                    began, began_cpu = time.perf_counter(), time.process_time()
                    for _ in range(runs):
                        handle = await rt.start(empty, task_id=f"r{next(numbers)}")
                        await handle.outcome()
                    spent = time.perf_counter() - began
                    spent_cpu = time.process_time() - began_cpu
                if round_ >= warmup:
                    wall[name].append(spent / runs * 1e3)
                    cpu[name].append(spent_cpu / runs * 1e6)
    return {"wall": wall, "cpu": cpu}


def rows_of(per_round: dict[str, list[float]], unit: str, digits: int) -> list[list[str]]:
    base = per_round["baseline"]
    rows = [["baseline", f"{statistics.median(base):.{digits}f} {unit}", "(baseline)", ""]]
    for name, values in per_round.items():
        if name == "baseline":
            continue
        diffs = [v - b for v, b in zip(values, base, strict=True)]
        low, high = bootstrap_median(diffs)
        rows.append(
            [
                name,
                f"{statistics.median(values):.{digits}f} {unit}",
                f"{statistics.median(diffs):+.{digits}f}",
                f"[{low:+.{digits}f}, {high:+.{digits}f}]",
            ]
        )
    return rows


@contextmanager
def store_url(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="haltwise-bench-early-"))
        yield f"sqlite:///{folder / 'bench.db'}"
        return
    server = PostgresServer(durable=True)
    server.start()
    try:
        yield create_database(server.dsn, prefix="bench")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runs", type=int, default=40, help="runs per variant per round")
    parser.add_argument("--warmup", type=int, default=2, help="rounds measured and thrown away")
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    kinds = ["postgres", "sqlite"] if args.store == "both" else [args.store]
    print(header("What a start pays for issue 32: the early-cancel guard and the code version"))
    for kind in kinds:
        before = load()
        with store_url(kind) as url:
            result = anyio.run(measure, url, kind, args.rounds, args.runs, args.warmup)
        after = load()
        print(f"\n### {kind}: {args.rounds} rounds x {args.runs} runs a variant")
        print(f"\nload (1/5/15 min) before: {before}; after: {after}\n")
        headers = ["variant", "wall per run (median)", "minus baseline, same round", "95%"]
        print(table(headers, rows_of(result["wall"], "ms", 3)))
        print()
        headers = ["variant", "client CPU per run (median)", "minus baseline, same round", "95%"]
        print(table(headers, rows_of(result["cpu"], "us", 1)))


if __name__ == "__main__":
    main()
