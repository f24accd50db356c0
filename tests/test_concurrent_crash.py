"""kill -9 while several steps of one run are in flight, then takeover: nothing lost or repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio

import haltwise
from haltwise import State, StepStatus

AGENT = Path(__file__).with_name("concurrent_crash_agent.py")
ROUNDS = 6


def spawn(store: str, run_id: str, world: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), store, run_id, str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CRASH_STEP_DELAY": "0.05"},
    )


def wait_started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "started", (line, proc.stderr.read() if proc.stderr else "")


async def running_steps(store: str, run_id: str) -> int:
    async with haltwise.Runtime(store) as rt:
        try:
            steps = (await rt.status(run_id)).steps
        except haltwise.UnknownRunError:
            return 0
    return sum(step.status is StepStatus.RUNNING for step in steps)


def kill_when_in_flight(store: str, run_id: str, world: Path, wanted: int) -> None:
    """Start the agent and kill -9 it once ``wanted`` steps are running at once."""
    proc = spawn(store, run_id, world)
    wait_started(proc)
    try:
        for _ in range(2000):
            if anyio.run(running_steps, store, run_id) >= wanted:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()


def finish(store: str, run_id: str, world: Path, rng: random.Random, kills: int) -> int:
    """Kill the agent at random moments (``kills`` times at most), then let it complete."""
    done = 0
    while True:
        proc = spawn(store, run_id, world)
        wait_started(proc)
        if done < kills:
            try:
                proc.wait(timeout=rng.uniform(0.0, 0.4))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                done += 1
                continue
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        return done


def check(store: str, run_id: str, world: Path, kills: int) -> None:
    async def load() -> haltwise.Outcome:
        async with haltwise.Runtime(store) as rt:
            return await rt.status(run_id)

    outcome = anyio.run(load)
    assert outcome.state is State.COMPLETED
    assert outcome.result == [
        [f"a{r}", f"charged-{r}", f"note-{r}", f"b{r}"] for r in range(ROUNDS)
    ]
    assert list(outcome.partials) == [{"round": r} for r in range(ROUNDS)]
    executions = Counter(line for line in (world / "executions").read_text().splitlines())
    for step in outcome.steps:
        assert step.status is StepStatus.COMMITTED
        assert step.call_id is not None
    by_call = {step.call_id: step for step in outcome.steps}
    for r in range(ROUNDS):
        for call, line in (
            (f"r{r}-a", f"look-a {r}"),
            (f"r{r}-charge", f"charge {r}"),
            (f"r{r}-note", f"note {r}"),
            (f"r{r}-b", f"look-b {r}"),
        ):
            assert 1 <= executions[line] <= by_call[call].attempts, (call, executions[line])
        assert (world / f"w-{r}").read_text().splitlines() == [str(r)], "a note written twice"
    reruns = sum(executions[line] - 1 for line in executions if not line.startswith("undo"))
    assert reruns <= 4 * kills, "at most the steps in flight run again after a kill"
    charges: dict[str, set[str]] = {}
    for line in (world / "charges").read_text().splitlines():
        round_, key = line.split()
        charges.setdefault(round_, set()).add(key)
    assert len(charges) == ROUNDS
    assert all(len(keys) == 1 for keys in charges.values()), "a charge changed its key"
    report = haltwise.verify_store(store)
    assert report.ok, report.findings


def test_kill_9_with_concurrent_steps_in_flight_then_takeover(
    sqlite_url: str, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    kill_when_in_flight(sqlite_url, "c0", world, wanted=3)
    dead = haltwise.verify_store(sqlite_url)
    assert {f.code for f in dead.findings} == {"orphaned-step"}, dead.findings
    kills = 1 + finish(sqlite_url, "c0", world, random.Random(5), kills=0)
    check(sqlite_url, "c0", world, kills)


def test_kill_9_at_random_moments_with_concurrent_steps(sqlite_url: str, tmp_path: Path) -> None:
    rng = random.Random(17)
    for round_ in range(3):
        world = tmp_path / f"world{round_}"
        world.mkdir()
        kills = finish(sqlite_url, f"k{round_}", world, rng, kills=4)
        check(sqlite_url, f"k{round_}", world, kills)
