"""kill -9 at random moments, resumed each time: nothing lost, nothing repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

import haltwise
from _paths import TESTS
from haltwise import State, StepStatus
from haltwise._runtime.loader import load_target

AGENT = TESTS / "crash_agent.py"
STEPS = 30


def expected_results() -> list[object]:
    return [[i * 2, f"charged-{i}", f"note-{i}"][i % 3] for i in range(STEPS)]


def spawn(store: str, run_id: str, world: Path, agent: Path = AGENT) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(agent), store, run_id, str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "started", (line, proc.stderr.read() if proc.stderr else "")


def kill_and_resume(
    store: str, run_id: str, world: Path, rng: random.Random, agent: Path = AGENT
) -> int:
    """Kill ``agent`` at random moments until its run completes; return how many kills."""
    kills = 0
    while True:
        proc = spawn(store, run_id, world, agent)
        wait_started(proc)
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


def run_crash_test(store: str, tmp_path: Path, kills: int, seed: int) -> None:
    """Crash runs of the agent, each resumed until done, until ``kills`` kills happened."""
    rng = random.Random(seed)
    total = 0
    round_ = 0
    while total < kills:
        world = tmp_path / f"world{round_}"
        world.mkdir()
        run_id = f"crash{round_}"
        done = kill_and_resume(store, run_id, world, rng)

        async def load(run_id: str = run_id) -> haltwise.Outcome:
            async with haltwise.Runtime(store) as rt:
                return await rt.status(run_id)

        check_world(world, anyio.run(load), done)
        report = haltwise.verify_store(store)
        assert report.ok, report.findings
        total += done
        round_ += 1


def test_kill_9_at_random_moments_loses_and_repeats_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    run_crash_test(sqlite_url, tmp_path, kills=20, seed=11)


@pytest.mark.slow
def test_kill_9_soak(sqlite_url: str, tmp_path: Path) -> None:
    run_crash_test(sqlite_url, tmp_path, kills=300, seed=int(time.time()))


def test_check_reports_an_orphaned_step_until_takeover(sqlite_url: str, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "hold_agent.py"), sqlite_url, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "in flight"
    live = haltwise.verify_store(sqlite_url)
    assert live.ok, "a step held by a live owner is not a finding"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    dead = haltwise.verify_store(sqlite_url)
    assert [f.code for f in dead.findings] == ["orphaned-step"]
    assert dead.to_json()["findings"][0]["run"] == "held"

    load_target(f"{(TESTS / 'hold_agent.py')}:holder")

    async def take_over() -> haltwise.Outcome:
        async with haltwise.Runtime(sqlite_url) as rt:
            with pytest.raises(haltwise.ResumeRefusedError, match=r"step 0 \(hold\)"):
                await rt.resume("held")
            return await rt.status("held")

    outcome = anyio.run(take_over)
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "UnknownStepError"
    assert outcome.steps[0].status is StepStatus.UNKNOWN
    assert outcome.retry is haltwise.Retry.RECONCILE
    assert haltwise.verify_store(sqlite_url).ok
