"""Telling the world, measured: a step's cost with spans, and the events sender's throughput.

1. ``spans``: one run of ``--steps`` trivial async steps on SQLite (``synchronous=off``: the disk
   does not count), CPU per step (``time.process_time``, every thread), in a fresh process per
   measurement, rounds alternating between: OpenTelemetry not importable (the baseline), the API
   installed and no SDK (the default when a dependency brings the API), a no-op tracer provider
   configured, and the SDK with an in-memory exporter (every span recorded).
2. ``events``: ``--runs`` runs of two steps each started at once in one process, while
   ``haltwise events`` (its own process) delivers to a receiver on loopback (uvicorn, answering
   204); the journal's rate of events made (run transitions per second while the workload
   runs) beside the sender's rate of deliveries, and how long after the last run ended the last
   event was acknowledged.

usage: python bench/bench_telemetry.py [spans|events|all] [--steps N] [--runs N] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _report import header, median, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_SPAN_CHILD = textwrap.dedent(
    """
    import json, sys, time
    mode, url, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "absent":
        sys.modules["opentelemetry"] = None
    elif mode != "api":
        from opentelemetry import trace
        if mode == "noop":
            trace.set_tracer_provider(trace.NoOpTracerProvider())
        else:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
            trace.set_tracer_provider(provider)
    import anyio, haltwise

    @haltwise.tool(cancel="interruptible", effect="read")
    async def tick(i: int) -> int:
        return i

    @haltwise.task(name="bench:ticks")
    async def ticks(n: int) -> int:
        for i in range(n):
            await tick(i)
        return n

    async def main():
        async with haltwise.Runtime(url) as rt:
            await (await rt.start(ticks, 10, task_id="warm")).outcome()
            cpu, wall = time.process_time(), time.perf_counter()
            await (await rt.start(ticks, steps, task_id="measured")).outcome()
            return time.process_time() - cpu, time.perf_counter() - wall

    cpu, wall = anyio.run(main)
    print(json.dumps({"cpu_us": cpu / steps * 1e6, "wall_us": wall / steps * 1e6}))
    """
)

SPAN_MODES = {
    "absent": "OpenTelemetry not importable (baseline)",
    "api": "API installed, no SDK",
    "noop": "no-op tracer provider configured",
    "sdk": "SDK, in-memory exporter (recorded)",
}


def bench_spans(steps: int, rounds: int) -> str:
    seen: dict[str, list[dict[str, float]]] = {mode: [] for mode in SPAN_MODES}
    with tempfile.TemporaryDirectory() as tmp:
        modes = list(SPAN_MODES)
        for round_ in range(rounds):
            # the order turns each round: no mode always runs first (after a quiet spell)
            for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
                url = f"sqlite:///{tmp}/{mode}-{round_}.db?synchronous=off"
                done = subprocess.run(
                    [sys.executable, "-c", _SPAN_CHILD, mode, url, str(steps)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                seen[mode].append(json.loads(done.stdout.splitlines()[-1]))
    base = median([m["cpu_us"] for m in seen["absent"]])
    rows = []
    for mode, label in SPAN_MODES.items():
        cpu = median([m["cpu_us"] for m in seen[mode]])
        wall = median([m["wall_us"] for m in seen[mode]])
        rows.append((label, f"{cpu:.1f}", f"{cpu - base:+.1f}", f"{wall:.1f}"))
    return (
        header("A step with spans on and off")
        + f"- {steps} steps per run, {rounds} rounds, medians; load {_load()}\n\n"
        + table(("tracing", "CPU us/step", "vs baseline", "wall us/step"), rows)
    )


_RECEIVER = textwrap.dedent(
    """
    import sys, time, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    log = open(sys.argv[1], "a", buffering=1)
    async def hook(request):
        await request.body()
        log.write(f"{time.time()}\\n")
        return Response(status_code=204)
    app = Starlette(routes=[Route("/hook", hook, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    """
)

_WORKLOAD = textwrap.dedent(
    """
    import json, sys, time
    import anyio, haltwise

    @haltwise.tool(cancel="interruptible", effect="read")
    async def tick(i: int) -> int:
        return i

    @haltwise.task(name="bench:pair")
    async def pair() -> int:
        await tick(0)
        return await tick(1)

    async def main(url, runs):
        async with haltwise.Runtime(url) as rt:
            began = time.time()
            handles = [await rt.start(pair, task_id=f"r{i}") for i in range(runs)]
            for handle in handles:
                await handle.outcome()
            ended = time.time()
            transitions = 0
            for i in range(runs):
                transitions += len((await rt.inspect(f"r{i}")).events)
        return began, ended, transitions

    began, ended, transitions = anyio.run(main, sys.argv[1], int(sys.argv[2]))
    print(json.dumps({"began": began, "ended": ended, "transitions": transitions}))
    """
)


def bench_events(runs: int, rounds: int) -> str:
    rows = []
    for round_ in range(rounds):
        rows.append(_events_round(runs, round_))
    return (
        header("The events sender beside the journal")
        + f"- {runs} runs of two steps, started at once; load {_load()}\n\n"
        + table(
            (
                "round",
                "events made",
                "journal: events/s",
                "sender: deliveries/s",
                "last delivery after the last run ended",
            ),
            rows,
        )
    )


def _events_round(runs: int, round_: int) -> tuple[object, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/events.db"
        log = Path(tmp, "received.log")
        port = _free_port()
        receiver = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(log), str(port)])
        sender = None
        try:
            _wait_for_port(port)
            sender_log = Path(tmp, "sender.log")
            hook = f"http://127.0.0.1:{port}/hook"
            sender = subprocess.Popen(
                [sys.executable, "-m", "haltwise", "events", "--to", hook, "--store", url],
                stderr=sender_log.open("w"),
            )
            deadline = time.monotonic() + 60
            while "delivering to" not in sender_log.read_text():
                assert time.monotonic() < deadline, sender_log.read_text()
                time.sleep(0.02)
            done = subprocess.run(
                [sys.executable, "-c", _WORKLOAD, url, str(runs)],
                capture_output=True,
                text=True,
                check=True,
            )
            work = json.loads(done.stdout.splitlines()[-1])
            expected = work["transitions"]
            deadline = time.monotonic() + 300
            while _count(log) < expected:
                assert time.monotonic() < deadline, f"{_count(log)} of {expected} delivered"
                time.sleep(0.05)
            times = [float(line) for line in log.read_text().split()]
        finally:
            if sender is not None:
                sender.send_signal(signal.SIGTERM)
                sender.wait(timeout=30)
            receiver.kill()
            receiver.wait()
    made_per_s = expected / (work["ended"] - work["began"])
    sent_per_s = len(times) / max(1e-9, max(times) - min(times))
    lag = max(times) - work["ended"]
    return (round_ + 1, expected, f"{made_per_s:,.0f}", f"{sent_per_s:,.0f}", f"{lag:.2f} s")


def _count(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError("the receiver did not start")


def _load() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", default="all", choices=("spans", "events", "all"))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.what in ("spans", "all"):
        print(bench_spans(args.steps, args.rounds), flush=True)
    if args.what in ("events", "all"):
        print(bench_events(args.runs, max(1, args.rounds // 2)), flush=True)


if __name__ == "__main__":
    main()
