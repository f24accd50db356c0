"""The kill -9 harness: the crash agent (tests/crash_agent.py) in its own process, killed at
random moments and resumed until its run completes, and the check that its world shows nothing
lost and nothing repeated.

The agent prints ``started`` once its run has begun, then works ``STEPS`` steps that cycle
through a read (``look``), an idempotent charge and a rollback note; its docstring says what each
leaves in the world directory.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import haltwise
from _paths import TESTS
from haltwise import State, StepStatus

AGENT = TESTS / "crash_agent.py"
STEPS = 30


def expected_results() -> list[object]:
    return [[i * 2, f"charged-{i}", f"note-{i}"][i % 3] for i in range(STEPS)]


def spawn(
    store: str, run_id: str, world: Path, agent: Path = AGENT, **env: str
) -> subprocess.Popen[str]:
    """Start ``agent`` on run ``run_id``, with ``env`` added to this process's environment
    (``CRASH_STEP_DELAY``: how long each step's body lasts, see ``crash_agent``)."""
    return subprocess.Popen(
        [sys.executable, str(agent), store, run_id, str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def wait_started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "started", (line, proc.stderr.read() if proc.stderr else "")


#: The most times ``kill_and_resume`` kills one run's agent; the next one is left to finish.
#: Without a bound the loop need not end: an attempt lives 0-0.15 s from ``started``, and on a
#: loaded machine what is left of the run (its steps, its end, the interpreter's exit) may take
#: longer than that every time.
KILLS_AT_MOST = 30


def kill_and_resume(
    store: str,
    run_id: str,
    world: Path,
    rng: random.Random,
    agent: Path = AGENT,
    **env: str,
) -> int:
    """Kill ``agent`` at random moments (0-0.15 s after it says ``started``), resuming it each
    time, until its run completes or it was killed ``KILLS_AT_MOST`` times, then let it finish;
    return how many kills. ``env`` is added to the agent's environment."""
    kills = 0
    while True:
        proc = spawn(store, run_id, world, agent, **env)
        wait_started(proc)
        if kills < KILLS_AT_MOST:
            try:
                proc.wait(timeout=rng.uniform(0.0, 0.15))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        return kills


def check_world(world: Path, snapshot: haltwise.Outcome, kills: int) -> None:
    assert snapshot.state is State.COMPLETED
    assert snapshot.result == expected_results()
    assert list(snapshot.partials) == [
        {"index": i, "value": v} for i, v in enumerate(expected_results())
    ]
    executions = Counter(
        tuple(line.split()) for line in (world / "executions").read_text().splitlines()
    )
    reruns = 0
    for step in snapshot.steps:
        assert step.status is StepStatus.COMMITTED
        kind = ["look", "charge", "note"][step.index % 3]
        ran = executions[(kind, str(step.index))]
        assert 1 <= ran <= step.attempts, (step, ran)
        reruns += ran - 1
    assert reruns <= kills, "at most one re-execution per kill"
    # The world holds every note exactly once, whatever was compensated on the way.
    notes = sorted(p.name for p in world.glob("w-*"))
    assert notes == sorted(f"w-{i}" for i in range(STEPS) if i % 3 == 2)
    for path in world.glob("w-*"):
        assert path.read_text().splitlines() == [path.name[2:]], "a note was written twice"
    charges: dict[str, set[str]] = {}
    for line in (world / "charges").read_text().splitlines():
        index, key = line.split()
        charges.setdefault(index, set()).add(key)
    assert all(len(keys) == 1 for keys in charges.values()), "an idempotent step changed its key"
    assert len(charges) == STEPS // 3
