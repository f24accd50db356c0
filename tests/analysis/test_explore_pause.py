"""The explorer's pause trials: a pause at every point, then unpause, loses and repeats nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from _cli_kit import AGENT, Env
from _explore_kit import research, run_explore
from haltwise import Effect, Outcome, State, StepRecord, StepStatus
from haltwise._analysis.explore_checks import Baseline, PauseTrial, Point, after_pause
from haltwise._core.records import RunRecord, RunSnapshot
from haltwise.testing import Recorder

pytestmark = pytest.mark.usefixtures("world")


def test_a_pause_at_every_point_then_unpause_repeats_nothing() -> None:
    report = run_explore(research, pauses=True)
    assert report.ok, report.explain()
    assert report.pauses is not None
    assert len(report.pauses) == len(report.points) // 2 == 7 * 3
    assert all(p.state is State.PAUSED for p in report.pauses)
    assert all(p.final_state is State.COMPLETED for p in report.pauses)
    assert "pause during step 2 (save_note)" in report.explain()
    assert set(report.to_json()) == {"ok", "points", "pauses"}
    assert set(run_explore(research).to_json()) == {"ok", "points"}, "pauses are asked for"


def _step(index: int, status: StepStatus, attempts: int = 1) -> StepRecord:
    return StepRecord(
        index=index,
        tool="charge",
        cancel="finish",
        effect=Effect.EXTERNAL,
        idempotent=False,
        status=status,
        attempts=attempts,
    )


def test_the_pause_checks_catch_a_step_in_flight_a_late_step_and_a_repeat() -> None:
    steps = (_step(0, StepStatus.COMMITTED), _step(1, StepStatus.RUNNING))
    run = RunRecord(id="r", task="t", state=State.PAUSED, inputs={})
    done = Outcome(
        id="r",
        task="t",
        state=State.COMPLETED,
        result=1,
        steps=(_step(0, StepStatus.COMMITTED), _step(1, StepStatus.COMMITTED, attempts=2)),
    )
    baseline = Baseline(outcome=done, points=(), effects=Counter())
    trial = PauseTrial(Point("after", 0, "charge"), "r", RunSnapshot(run, steps, ()), done)
    found = after_pause(trial, baseline, Recorder())
    assert any("step 1 (charge) was running while the run was paused" in f for f in found)
    assert any("step 1 (charge) started after the pause" in f for f in found)
    assert any("step 1 (charge) ran 2 times" in f for f in found)
    never = PauseTrial(Point("after", 0, "charge"), "r", None, done)
    assert after_pause(never, baseline, Recorder()) == [
        "the pause requested after step 0 (charge) never took effect"
    ]


def test_explore_pause_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    env = Env(tmp_path)
    for name in ("think", "send_email"):
        env.release(name)
    done = env.hw(
        "explore", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--pause", "--json"
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert [p["state"] for p in report["pauses"]] == ["paused"] * (4 * 3)
    assert {p["at"] for p in report["pauses"]} == {p["at"] for p in report["points"]}
