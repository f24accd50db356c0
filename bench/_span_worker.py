"""A process that runs runs of trivial steps for ``bench_telemetry.py spans``, with
OpenTelemetry set up as ``MODE`` says before haltwise is imported:

- ``absent``: OpenTelemetry not importable (``sys.modules["opentelemetry"] = None``);
- ``api``: the API installed, no SDK (its default proxy provider: spans not recorded);
- ``noop``: a ``NoOpTracerProvider`` configured;
- ``sdk``: the SDK's ``TracerProvider`` with an in-memory exporter (every span recorded).

usage: python _span_worker.py MODE URL STEPS ab ROUNDS WARMUP
         In this process, rounds of three runs, in an order drawn at random each round (see _abcpu):
         ``off`` (haltwise's spans module told OpenTelemetry is absent: ``spans.use_api(
         None)``, the very code path of a process without it), ``A/A control`` (the same
         again), ``on`` (the module given the API: the path of MODE). Prints one JSON line:
         the CPU us/step of each variant, round by round.
       python _span_worker.py MODE URL STEPS serve
         One run per ``run`` line read on stdin (after one warm-up run), printing its CPU
         us/step; ends at end of input. (Paired processes: the parent alternates them.)

CPU is ``time.process_time`` (every thread) around one run, start to outcome; GC collected and
frozen before each.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

MODE, URL, STEPS, HOW = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

if MODE == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
elif MODE in ("noop", "sdk"):
    from opentelemetry import trace

    if MODE == "noop":
        trace.set_tracer_provider(trace.NoOpTracerProvider())
    else:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
elif MODE != "api":
    raise SystemExit(f"unknown mode {MODE!r}")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
from _abcpu import CONTROL, order_of, settle_gc  # noqa: E402

import haltwise  # noqa: E402
from haltwise._runtime import spans  # noqa: E402


@haltwise.tool(cancel="interruptible", effect="read")
async def tick(i: int) -> int:
    return i


@haltwise.task(name="bench:ticks")
async def ticks(n: int) -> int:
    for i in range(n):
        await tick(i)
    return n


class Runs:
    def __init__(self, runtime: haltwise.Runtime) -> None:
        self.runtime = runtime
        self.count = 0

    async def one(self) -> float:
        """CPU us per step of one run of STEPS steps (ids of one length: see budget_cost.py)."""
        self.count += 1
        settle_gc()
        start = time.process_time()
        outcome = await (
            await self.runtime.start(ticks, STEPS, task_id=f"r{self.count:07d}")
        ).outcome()
        cpu = time.process_time() - start
        assert outcome.state is haltwise.State.COMPLETED, outcome
        return cpu / STEPS * 1e6


def _switch(on: bool) -> None:
    """Spans as MODE sets them up (``on``), or as if OpenTelemetry were absent."""
    if on:
        from opentelemetry import trace

        spans.use_api(trace)
    else:
        spans.use_api(None)


async def ab(rounds: int, warmup: int) -> dict[str, list[float]]:
    variants = ["off", CONTROL, "on"]
    seen: dict[str, list[float]] = {name: [] for name in variants}
    async with haltwise.Runtime(URL) as runtime:
        runs = Runs(runtime)
        for round_ in range(warmup + rounds):
            for name in order_of(variants, round_):
                _switch(name == "on")
                us = await runs.one()
                if round_ >= warmup:
                    seen[name].append(us)
        _switch(True)
    return seen


async def serve() -> None:
    async with haltwise.Runtime(URL) as runtime:
        runs = Runs(runtime)
        await runs.one()  # warm-up
        print("ready", flush=True)
        while True:
            line: Any = await anyio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            print(f"{await runs.one():.3f}", flush=True)


if HOW == "ab":
    print(json.dumps(anyio.run(ab, int(sys.argv[5]), int(sys.argv[6]))), flush=True)
elif HOW == "serve":
    anyio.run(serve)
else:
    raise SystemExit(f"unknown way {HOW!r}")
