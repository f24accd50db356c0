"""``pause`` and ``unpause`` end to end: real processes on both stores, side effects counted.

The run is worked by one ``haltwise run`` (or ``worker``) process; the pause, unpause and cancel
come from others, so every request crosses processes through the store (SQLite's data-version
watcher, PostgreSQL's LISTEN/NOTIFY).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from _cli_kit import PATIENCE, Env, env_on, error_line, finish, statuses, step_is


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return env_on(request, tmp_path)


def paused(env: Env, run_id: str) -> dict[str, object]:
    return env.wait_for(run_id, "paused", lambda s: s["state"] == "paused")


def test_pause_from_another_process_lets_the_step_end_then_unpause_goes_on(env: Env) -> None:
    run = env.start_flow("t1", "interruptible", "--json")
    asked = env.hw("pause", "t1")
    assert asked.returncode == 0, asked.stderr
    assert "pause requested for run t1" in asked.stdout
    held = env.status("t1")
    assert held is not None and held["state"] == "running" and step_is(held, 2, "running")
    assert "pause requested" in env.hw("status", "t1").stdout
    env.release("think")  # the interruptible step is not interrupted: it runs to its end
    seen = paused(env, "t1")
    assert statuses(seen) == ["committed", "committed", "committed"]
    assert seen["retry"] == "resume"
    assert "haltwise unpause t1" in env.hw("status", "t1").stdout
    listed = json.loads(env.hw("list", "--state", "paused", "--json").stdout)["runs"]
    assert [(r["id"], r["state"]) for r in listed] == [("t1", "paused")]
    assert env.hw("check").returncode == 0
    again = env.hw("unpause", "t1", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"id": "t1", "state": "running", "pause": False}
    code, outcome, err = finish(run)
    assert code == 0, err
    assert isinstance(outcome, dict) and outcome["state"] == "completed"
    assert env.effects() == ["search", "record:cats", "think", "record:done"]


def test_pause_wait_json_and_a_cancel_of_the_paused_run(env: Env) -> None:
    run = env.start_flow("t2", "finish", "--json")
    assert env.hw("pause", "t2").returncode == 0
    env.release("send_email")
    asked = env.hw("pause", "t2", "--wait", "--json")  # asked again: waits for the first
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == {"id": "t2", "state": "paused", "pause": True}
    cancelled = env.hw("cancel", "t2", "--reason", "budget")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled at once" in cancelled.stdout
    now = env.status("t2")
    assert now is not None and (now["state"], now["reason"]) == ("cancelled", "budget")
    code, outcome, _ = finish(run)
    assert code == 3
    assert isinstance(outcome, dict) and statuses(outcome) == ["committed"] * 3
    assert env.effects().count("record:done") == 0, "no step ran after the pause"
    assert env.hw("check").returncode == 0


def test_unpause_continues_a_paused_run_whose_owner_died(env: Env) -> None:
    run = env.start_flow("t3", "interruptible")
    assert env.hw("pause", "t3").returncode == 0
    env.release("think")
    paused(env, "t3")
    run.kill()  # kill -9: the paused run's owner is gone
    run.communicate(timeout=PATIENCE)
    done = env.hw("unpause", "t3", "--json")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["state"] == "completed"
    assert outcome["result"] == "cats"
    assert env.effects() == ["search", "record:cats", "think", "record:done"], "nothing repeated"


def handed_over_paused(env: Env, run_id: str, target: str, *submit: str) -> None:
    """Submit ``run_id``, let a worker run it to its gated step 2, pause it there, then SIGTERM
    the worker: the run is left paused, handed over (no owner)."""
    assert env.hw("submit", target, *submit, "--id", run_id).returncode == 0
    worker = env.popen("worker", "agent.py")
    env.wait_in_flight(run_id)
    assert env.hw("pause", run_id).returncode == 0
    env.release("think")
    paused(env, run_id)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=PATIENCE)
    assert worker.returncode == 0, err


def test_a_worker_hands_a_paused_run_over_and_another_keeps_it_paused(env: Env) -> None:
    handed_over_paused(env, "w1", "agent.py:flow", "--input", '{"policy": "interruptible"}')
    held = env.status("w1")
    assert held is not None and held["state"] == "paused", "handed over, still paused"
    second = env.popen("worker", "agent.py")
    try:
        env.wait_for("w1", "taken over", lambda _: "owner: pid" in env.hw("status", "w1").stdout)
        assert (env.status("w1") or {})["state"] == "paused"
        assert env.hw("unpause", "w1").returncode == 0
        env.wait_for("w1", "completed", lambda s: s["state"] == "completed")
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=PATIENCE)
    assert second.returncode == 0
    assert env.effects() == ["search", "record:cats", "think", "record:done"]


def test_pause_and_unpause_of_runs_they_do_not_apply_to(env: Env) -> None:
    env.release("send_email")
    assert (
        env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "d").returncode
        == 0
    )
    done = env.hw("pause", "d")
    assert (done.returncode, done.stdout.strip()) == (
        0,
        "run d is already completed; nothing to pause",
    )
    done = env.hw("unpause", "d")
    assert done.returncode == 0 and "not paused" in done.stdout
    assert "no run with id 'missing'" in error_line(env.hw("pause", "missing"))
    assert "no run with id 'missing'" in error_line(env.hw("unpause", "missing"))


def test_a_paused_run_holds_no_worker_slot(env: Env) -> None:
    for run_id, policy in (("s1", "interruptible"), ("s2", "rollback")):
        args = ("--input", json.dumps({"policy": policy}), "--id", run_id)
        assert env.hw("submit", "agent.py:flow", *args).returncode == 0
    env.release("insert_note")
    worker = env.popen("worker", "agent.py", "--concurrency", "1")
    try:
        env.wait_for("s1", "its step in flight", lambda s: step_is(s, 2, "running"))
        assert (env.status("s2") or {})["state"] == "pending", "one slot, and s1 holds it"
        assert env.hw("pause", "s1").returncode == 0
        env.release("think")
        paused(env, "s1")
        env.wait_for("s2", "completed in the slot s1 left", lambda s: s["state"] == "completed")
        assert (env.status("s1") or {})["state"] == "paused"
        assert env.hw("unpause", "s1").returncode == 0
        env.wait_for("s1", "completed", lambda s: s["state"] == "completed")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=PATIENCE)
    assert env.effects().count("think") == 1


def paused_saga(env: Env, run_id: str) -> subprocess.Popen[str]:
    """``notes`` run by a ``haltwise run`` process, paused after its gated step."""
    run = env.popen("run", "agent.py:notes", "--id", run_id, "--json")
    env.wait_in_flight(run_id)
    assert env.hw("pause", run_id).returncode == 0
    env.release("think")
    paused(env, run_id)
    return run


SAGA_DONE = ["note:one", "note:two", "think"]


def test_a_cancel_from_another_process_wakes_the_paused_owner_to_run_its_saga(env: Env) -> None:
    run = paused_saga(env, "g1")
    cancelled = env.hw("cancel", "g1", "--reason", "budget")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "settled here" not in cancelled.stdout, "the owner, alive, runs the saga"
    assert "cancelled at once" not in cancelled.stdout
    code, outcome, err = finish(run)
    assert code == 3, err
    assert isinstance(outcome, dict)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "budget")
    assert statuses(outcome) == ["compensated", "compensated", "committed"]
    assert env.effects() == [*SAGA_DONE, "undo:two", "undo:one"], "each undone once, newest first"
    assert env.hw("check").returncode == 0


def test_a_cancel_of_a_paused_saga_whose_owner_died_runs_the_saga_itself(env: Env) -> None:
    run = paused_saga(env, "g2")
    run.kill()  # kill -9: nobody works the paused run any more
    run.communicate(timeout=PATIENCE)
    cancelled = env.hw("cancel", "g2", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["cancelled"] == ["g2"]
    now = env.status("g2")
    assert now is not None and now["state"] == "cancelled", "settled by the cancel command"
    assert statuses(now) == ["compensated", "compensated", "committed"]
    assert env.effects() == [*SAGA_DONE, "undo:two", "undo:one"]
    assert env.hw("check").returncode == 0
    again = env.hw("cancel", "g2")
    assert again.returncode == 0 and "already cancelled" in again.stdout
    assert env.effects().count("undo:one") == 1


def test_a_cancel_of_a_paused_saga_a_worker_handed_over_runs_the_saga(env: Env) -> None:
    handed_over_paused(env, "g3", "agent.py:notes")
    cancelled = env.hw("cancel", "g3", "--wait")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "settled here" in cancelled.stdout
    assert env.effects() == [*SAGA_DONE, "undo:two", "undo:one"]
    assert env.hw("check").returncode == 0


def paused_family(env: Env, run_id: str) -> subprocess.Popen[str]:
    """``family`` run by a ``haltwise run`` process, paused from another process while its
    child's gated step is in flight: returned once parent and child are both paused."""
    run = env.popen("run", "agent.py:family", "--id", run_id, "--json")
    env.wait_in_flight(f"{run_id}/1", index=1)
    assert env.hw("pause", run_id).returncode == 0
    env.wait_for(
        f"{run_id}/1",
        "its pause relayed",
        lambda _: "pause requested" in env.hw("status", f"{run_id}/1").stdout,
    )
    env.release("think")
    paused(env, f"{run_id}/1")
    parent = paused(env, run_id)
    assert statuses(parent) == ["committed", "running"], "the child step waits, paused"
    assert f"child run {run_id}/1 paused with it" in env.hw("status", run_id).stdout
    assert env.hw("check").returncode == 0
    return run


def test_a_pause_of_a_parent_from_another_process_pauses_its_child(env: Env) -> None:
    run = paused_family(env, "f1")
    assert env.effects() == ["record:mom", "record:kid", "think"]
    assert env.hw("unpause", "f1").returncode == 0
    code, outcome, err = finish(run)
    assert code == 0, err
    assert isinstance(outcome, dict) and outcome["result"] == "kid"
    assert (env.status("f1/1") or {})["state"] == "completed"
    assert env.effects() == ["record:mom", "record:kid", "think", "record:after"]


def test_a_cancel_of_a_paused_parent_from_another_process_cancels_the_child(env: Env) -> None:
    run = paused_family(env, "f2")
    assert env.hw("cancel", "f2").returncode == 0
    code, outcome, err = finish(run)
    assert code == 3, err
    assert isinstance(outcome, dict) and statuses(outcome) == ["committed", "interrupted"]
    child = env.status("f2/1")
    assert child is not None and (child["state"], child["reason"]) == ("cancelled", "parent")
    assert env.hw("check").returncode == 0


def test_a_cancel_of_a_paused_parent_whose_owner_died_settles_the_child_too(env: Env) -> None:
    run = paused_family(env, "f3")
    run.kill()
    run.communicate(timeout=PATIENCE)
    assert env.hw("cancel", "f3").returncode == 0
    parent, child = env.status("f3"), env.status("f3/1")
    assert parent is not None and parent["state"] == "cancelled"
    assert child is not None and (child["state"], child["reason"]) == ("cancelled", "parent")
    assert env.hw("check").returncode == 0
    assert env.effects() == ["record:mom", "record:kid", "think"]


def test_a_retried_and_a_timed_out_step_on_the_command_line(env: Env) -> None:
    done = env.hw("run", "agent.py:patient", "--id", "r1", "--json")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["state"], outcome["result"]) == ("completed", "x (slow timed out)")
    retried, timed_out = outcome["steps"]
    assert (retried["status"], retried["attempts"]) == ("committed", 2)
    assert [(e["attempt"], e["type"]) for e in retried["earlier_errors"]] == [
        (1, "ConnectionError")
    ]
    assert (timed_out["status"], timed_out["error"]["type"]) == ("failed", "StepTimeoutError")
    status = env.status("r1")
    for step in status["steps"]:  # status adds each step's times (issue 29, item 3)
        assert step.pop("started_at") <= step.pop("settled_at")
    assert status == outcome, "status --json says the same"
    shown = env.hw("status", "r1").stdout
    assert "StepTimeoutError" in shown
    assert env.hw("check").returncode == 0
