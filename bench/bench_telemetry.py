"""Telling the world, measured: a step's cost with spans, and the events sender's throughput.

1. ``spans``: runs of ``--steps`` trivial async steps on SQLite (``synchronous=off``: the disk
   does not count), CPU per step (``time.process_time``, every thread), ``--span-rounds``
   interleaved A/B rounds (see ``_abcpu``: the order drawn at random, GC collected and frozen,
   warm-up thrown away, the median of per-round differences with a bootstrap interval, an A/A
   control in the same run). Two tables: (a) in the same process (``_span_worker.py ... ab``), spans
   off (haltwise's spans module told OpenTelemetry is absent) against on, for each set-up: the
   API installed and no SDK, a no-op tracer provider configured, the SDK with an in-memory
   exporter; (b) paired processes alive at once (``_span_worker.py ... serve``): a no-op
   provider's process against a process without OpenTelemetry importable, and a second such
   process as the A/A control.
2. ``events``: ``--runs`` runs of two steps each started at once in one process, while
   ``haltwise events`` (its own process) delivers to a receiver on loopback (a minimal asyncio
   HTTP/1.1 responder answering 204: the fixture, kept cheap so that it takes little CPU from
   the sender on a 2-core machine); the journal's rate of events made (run transitions per
   second while the workload runs) beside the sender's rate of deliveries, how long after the
   last run ended the last event was acknowledged, and the CPU the sender (from its first line,
   "delivering to": after its imports) and the receiver spent per event.

usage: python bench/bench_telemetry.py [spans|events|all] [--steps N] [--span-rounds N]
       [--warmup N] [--runs N] [--rounds N]
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

from _abcpu import CONTROL, DIFF_HEADERS, diff_rows, load, order_of
from _report import header, read_event, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SPAN_MODES = {
    "api": "API installed, no SDK",
    "noop": "no-op tracer provider configured",
    "sdk": "SDK, in-memory exporter (every span recorded)",
}
#: issue 34: a configured but no-op provider costs a step under 5 us
SPAN_TARGET_US = 5.0


def bench_spans(steps: int, rounds: int, warmup: int) -> str:
    """Two tables: spans on against off in the same process (per provider set-up), and the
    no-op provider's process against processes without OpenTelemetry (paired processes)."""
    with tempfile.TemporaryDirectory() as tmp:
        began = time.monotonic()
        before = load()
        in_process = []
        for mode, label in SPAN_MODES.items():
            url = f"sqlite:///{tmp}/ab-{mode}.db?synchronous=off"
            done = subprocess.run(
                [
                    sys.executable,
                    str(_WORKER),
                    mode,
                    url,
                    str(steps),
                    "ab",
                    str(rounds),
                    str(warmup),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            per_round = json.loads(done.stdout.splitlines()[-1])
            target = SPAN_TARGET_US if mode == "noop" else None
            for row in diff_rows(per_round, "off", target):
                in_process.append((label, *row))
        after_in = load()
        paired = _paired_spans(tmp, steps, rounds, warmup)
        took = time.monotonic() - began
    return (
        header("A step with spans on and off")
        + f"- {rounds} rounds (+{warmup} warm-up) of one run of {steps} trivial async steps per "
        + f"variant (SQLite, synchronous=off), interleaved; {took:.0f} s in all\n"
        + "- CPU: time.process_time of the process (every thread), start to outcome of a run\n\n"
        + "### In the same process: spans on against off\n\n"
        + "`off`: haltwise's spans module told OpenTelemetry is absent (the path of a process "
        + f"without it); `on`: the provider of the row. Load {before} -> {after_in}.\n\n"
        + table(("provider", *DIFF_HEADERS), in_process)
        + "\n\n### Paired processes: the no-op provider's process against processes without "
        + "OpenTelemetry\n\n"
        + "Three processes alive at once, one run each per round, in a random order; the A/A "
        + "control is a second process without OpenTelemetry (what two processes differ by: "
        + f"memory layout, hash seeds). Load {paired[1]} -> {load()}.\n\n"
        + table(DIFF_HEADERS, paired[0])
    )


_WORKER = HERE / "_span_worker.py"


def _paired_spans(
    tmp: str, steps: int, rounds: int, warmup: int
) -> tuple[list[tuple[str, ...]], str]:
    """Per-round differences between long-lived processes (see _span_worker.py ``serve``)."""
    names = {"OpenTelemetry absent": "absent", CONTROL: "absent", "no-op provider": "noop"}
    before = load()
    procs = {}
    try:
        for i, (name, mode) in enumerate(names.items()):
            url = f"sqlite:///{tmp}/paired-{i}.db?synchronous=off"
            procs[name] = subprocess.Popen(
                [sys.executable, str(_WORKER), mode, url, str(steps), "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        for proc in procs.values():
            read_event(proc, "ready")
        seen: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(warmup + rounds):
            for name in order_of(list(names), round_):
                proc = procs[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("run\n")
                proc.stdin.flush()
                us = float(proc.stdout.readline())
                if round_ >= warmup:
                    seen[name].append(us)
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    return diff_rows(seen, "OpenTelemetry absent", SPAN_TARGET_US), before


_RECEIVER = textwrap.dedent(
    r"""
    import asyncio, sys, time
    # A minimal HTTP/1.1 responder on asyncio (keep-alive, Content-Length bodies, 204): the
    # fixture, not what is measured, so it takes as little CPU from the sender as it can.
    log = open(sys.argv[1], "a", buffering=1)

    class Hook(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""

        def data_received(self, data):
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                length = 0
                for line in self.buffer[:end].split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                log.write(f"{time.time()}\n")
                self.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Hook, "127.0.0.1", int(sys.argv[2]))
        await server.serve_forever()

    asyncio.run(main())
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
                "sender CPU us/event (after its start)",
                "receiver CPU us/event",
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
            sender_started = _cpu_so_far(sender.pid)
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
            sender_cpu = _cpu_so_far(sender.pid) - sender_started
        finally:
            _stopped_cpu(sender)
            receiver_cpu = _stopped_cpu(receiver)
    made_per_s = expected / (work["ended"] - work["began"])
    sent_per_s = len(times) / max(1e-9, max(times) - min(times))
    lag = max(times) - work["ended"]
    return (
        round_ + 1,
        expected,
        f"{made_per_s:,.0f}",
        f"{sent_per_s:,.0f}",
        f"{lag:.2f} s",
        f"{1e6 * sender_cpu / expected:,.0f}",
        f"{1e6 * receiver_cpu / expected:,.0f}",
    )


def _cpu_so_far(pid: int) -> float:
    """The CPU seconds (user and system) process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stopped_cpu(process: subprocess.Popen[bytes] | None) -> float:
    """Stops ``process`` (SIGTERM) and answers the CPU seconds it used, its whole life."""
    if process is None:
        return float("nan")
    process.send_signal(signal.SIGTERM)
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    return usage.ru_utime + usage.ru_stime


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
    parser.add_argument("--steps", type=int, default=200, help="spans: steps per run")
    parser.add_argument("--span-rounds", type=int, default=100, help="spans: measured rounds")
    parser.add_argument("--warmup", type=int, default=8, help="spans: rounds thrown away")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="events: 2 rounds per 5")
    args = parser.parse_args()
    if args.what in ("spans", "all"):
        print(bench_spans(args.steps, args.span_rounds, args.warmup), flush=True)
    if args.what in ("events", "all"):
        print(bench_events(args.runs, max(1, args.rounds // 2)), flush=True)


if __name__ == "__main__":
    main()
