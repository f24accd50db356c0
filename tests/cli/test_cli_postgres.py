"""The command line against PostgreSQL: the same commands, the same answers as on SQLite."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from _cli_kit import AGENT, PATIENCE, Env, finish, statuses, step_is


@pytest.fixture
def env(tmp_path: Path, pg_url: str) -> Env:
    (tmp_path / "agent.py").write_text(AGENT)
    return Env(tmp_path, pg_url)


def test_run_cancel_status_resume_list_on_postgres(env: Env) -> None:
    run = env.start_flow("p1", "interruptible", "--json")
    cancelled = env.hw("cancel", "p1")
    assert cancelled.returncode == 0, cancelled.stderr
    code, outcome, _ = finish(run)
    assert code == 3
    assert isinstance(outcome, dict) and outcome["state"] == "cancelled"
    assert statuses(outcome) == ["committed", "committed", "interrupted"]
    status = env.status("p1")
    assert status is not None and status["retry"] == "resume"
    env.release("think")
    resumed = env.hw("resume", "p1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "completed"
    assert env.effects().count("search") == 1, "the committed search did not run again"
    listed = json.loads(env.hw("list", "--json").stdout)["runs"]
    assert [(r["id"], r["state"]) for r in listed] == [("p1", "completed")]
    assert env.hw("check").returncode == 0


def test_a_finish_step_finishes_and_a_worker_takes_over_on_postgres(env: Env) -> None:
    env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "p2")
    worker = env.popen("worker", "agent.py")
    env.wait_for("p2", "its finish step in flight", lambda s: step_is(s, 2, "running"))
    worker.send_signal(signal.SIGTERM)
    assert worker.stderr is not None
    while "handing over" not in (line := worker.stderr.readline()):
        assert line, "the worker ended without handing over"
    env.release("send_email")
    assert worker.wait(timeout=PATIENCE) == 0
    held = env.status("p2")
    assert held is not None and held["state"] == "running" and step_is(held, 2, "committed")
    taker = env.popen("worker", "agent.py")
    env.wait_for("p2", "completed", lambda s: s["state"] == "completed")
    taker.send_signal(signal.SIGTERM)
    assert taker.wait(timeout=PATIENCE) == 0
    assert env.effects().count("send_email") == 1
