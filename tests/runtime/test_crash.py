"""kill -9 at random moments, resumed each time: nothing lost, nothing repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

import haltwise
from _crash_kit import check_world, kill_and_resume
from _paths import TESTS
from haltwise import State, StepStatus
from haltwise._runtime.loader import load_target


def run_crash_test(
    store: str, tmp_path: Path, kills: int, seed: int, *, as_child: bool = False
) -> int:
    """Crash runs of the agent, each resumed until done, until ``kills`` kills happened; return
    how many runs. ``as_child``: the agent's thirty steps are a child run of its run (each
    resume of the parent resumes the child through the parent's child step)."""
    rng = random.Random(seed)
    env = {"CRASH_AS_CHILD": "1"} if as_child else {}
    total = 0
    round_ = 0
    while total < kills:
        world = tmp_path / f"world{round_}"
        world.mkdir()
        run_id = f"crash{round_}"
        done = kill_and_resume(store, run_id, world, rng, **env)
        worked = f"{run_id}/0" if as_child else run_id

        async def load(run_id: str = worked) -> haltwise.Outcome:
            async with haltwise.Runtime(store) as rt:
                return await rt.status(run_id)

        check_world(world, anyio.run(load), done)
        report = haltwise.verify_store(store)
        assert report.ok, report.findings
        total += done
        round_ += 1
    print(f"soak: {total} kills over {round_} runs (child runs: {as_child}), {store.split(':')[0]}")
    return round_


def test_kill_9_at_random_moments_loses_and_repeats_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    run_crash_test(sqlite_url, tmp_path, kills=20, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("as_child", [False, True], ids=["runs", "child-runs"])
def test_kill_9_soak(sqlite_url: str, tmp_path: Path, as_child: bool) -> None:
    run_crash_test(sqlite_url, tmp_path, kills=300, seed=int(time.time()), as_child=as_child)


@pytest.mark.slow
@pytest.mark.parametrize("as_child", [False, True], ids=["runs", "child-runs"])
def test_kill_9_soak_on_postgres(pg_url: str, tmp_path: Path, as_child: bool) -> None:
    run_crash_test(pg_url, tmp_path, kills=150, seed=int(time.time()), as_child=as_child)


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
