"""``submit``, ``worker``, ``check`` and ``explore`` end to end, in real processes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys

from _cli_kit import PATIENCE, Env, error_line, step_is
from _paths import ROOT

ROOT = ROOT
DEMO = ROOT / "examples" / "research_agent.py"

BROKEN = """
import anyio
import haltwise
from haltwise.testing import record_effect

CHARGED = set()

@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def charge(cents: int) -> str:
    record_effect("charge")          # claims idempotent=True, but charges every call
    await anyio.sleep(0.01)          # a cancel landing here leaves the step unknown
    return "ok"

@haltwise.tool(cancel="interruptible", effect="read")
async def look() -> int:
    return 1

@haltwise.task
async def pay() -> str:
    await look()
    return await charge(5)
"""


def worker(env: Env, *extra: str) -> subprocess.Popen[str]:
    return env.popen("worker", "agent.py", *extra)


def test_submit_prints_the_id_and_records_a_pending_run_once(env: Env) -> None:
    first = env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "q1")
    assert (first.returncode, first.stdout) == (0, "q1\n"), first.stderr
    again = env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "q1")
    assert (again.returncode, again.stdout) == (0, "q1\n")  # the same call: nothing recorded
    other = env.hw("submit", "agent.py:flow", "--input", '{"policy": "rollback"}', "--id", "q1")
    assert other.returncode == 2 and "q1" in error_line(other)  # a reused id, other inputs
    runs = json.loads(env.hw("list", "--json").stdout)["runs"]
    assert runs == [
        {
            "id": "q1",
            "task": "agent.py:flow",
            "state": "pending",
            "reason": None,
            "retry": "restart",
            "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 0},
        }
    ]
    generated = env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}')
    assert generated.returncode == 0 and len(generated.stdout.strip()) >= 16


def test_submit_bad_input_is_exit_2(env: Env) -> None:
    assert "does not fit" in error_line(env.hw("submit", "agent.py:flow", "--input", '{"x": 1}'))
    assert "no task" in error_line(env.hw("submit", "agent.py:nothing"))


def test_cancel_of_a_pending_run_cancels_it_before_it_begins(env: Env) -> None:
    env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "q2")
    done = env.hw("cancel", "q2")
    assert done.returncode == 0
    status = env.status("q2")
    assert status is not None and status["state"] == "cancelled" and status["steps"] == []


def test_a_worker_works_submitted_runs_and_hands_over_on_sigterm(env: Env) -> None:
    for name in ("think", "insert_note", "legacy", "post_message"):
        env.release(name)
    for i in range(3):
        env.hw("submit", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--id", f"w{i}")
    env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "held")
    proc = worker(env, "--concurrency", "2")
    for i in range(3):
        env.wait_for(f"w{i}", "completed", lambda s: s["state"] == "completed")
    env.wait_for("held", "its finish step in flight", lambda s: step_is(s, 2, "running"))
    assert proc.stderr is not None
    # a line per run it starts and per run that ends (issue 29, item 7)
    said: list[str] = []
    ended = {f"haltwise: run w{i} completed" for i in range(3)}
    while not ended <= set(said):
        line = proc.stderr.readline()
        assert line, f"the worker ended; it said {said}"
        said.append(line.strip())
    assert {f"haltwise: working run {i}" for i in ("w0", "w1", "w2", "held")} <= set(said)
    proc.send_signal(signal.SIGTERM)
    while "handing over" not in (line := proc.stderr.readline()):
        assert line, "the worker ended without handing over"
    env.release("send_email")  # the finish step finishes within its grace
    _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 0, err
    held = env.status("held")
    assert held is not None
    assert held["state"] == "running", "a stopped worker hands its runs over, never cancels"
    assert step_is(held, 2, "committed")
    store = sqlite3.connect(env.store.removeprefix("sqlite:///"))
    assert store.execute("SELECT owner FROM runs WHERE id = 'held'").fetchone() == (None,)
    taker = worker(env)
    env.wait_for("held", "completed by another worker", lambda s: s["state"] == "completed")
    taker.send_signal(signal.SIGTERM)
    assert taker.wait(timeout=PATIENCE) == 0
    assert env.effects().count("send_email") == 1, "the committed step did not run again"
    assert env.hw("check").returncode == 0


def test_a_second_signal_stops_a_worker_at_once(env: Env) -> None:
    env.hw("submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "h")
    proc = worker(env)
    env.wait_for("h", "its finish step in flight", lambda s: step_is(s, 2, "running"))
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    while "worker stopping" not in (line := proc.stderr.readline()):  # the signal was taken
        assert line.startswith("haltwise: working run"), line
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=PATIENCE) == 128 + signal.SIGTERM
    env.release("send_email")


def test_check_finds_a_broken_journal(env: Env) -> None:
    env.release("send_email")
    assert env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}').returncode == 0
    sound = env.hw("check", "--json")
    assert sound.returncode == 0
    report = json.loads(sound.stdout)
    assert report == {"ok": True, "runs": 1, "findings": []}
    store = sqlite3.connect(env.store.removeprefix("sqlite:///"))
    with store:
        store.execute("DELETE FROM partials WHERE seq = 0")
        store.execute("UPDATE runs SET state = 'failed'")
    broken = env.hw("check", "--json")
    assert broken.returncode == 1
    codes = sorted(f["code"] for f in json.loads(broken.stdout)["findings"])
    assert codes == ["partial-gap", "state-mismatch"]
    human = env.hw("check")
    assert human.returncode == 1 and "partial-gap" in human.stdout


def test_explore_passes_on_the_demo_agent(env: Env) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "explore", f"{DEMO}:research", "--json"],
        cwd=env.root,
        env={**env.environ(), "DEMO_LATENCY": "0.002", "DEMO_WORLD": str(env.root / "w")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    ats = [(p["at"], p["force"]) for p in report["points"]]
    assert ("during step 12 (charge_summary_api)", True) in ats
    assert all(set(p) == {"at", "force", "state", "retry", "violations"} for p in report["points"])


def test_explore_catches_a_tool_that_claims_idempotent_but_charges_twice(env: Env) -> None:
    (env.root / "broken.py").write_text(BROKEN)
    done = env.hw("explore", "broken.py:pay", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    violations = [v for p in report["points"] for v in p["violations"]]
    assert any("idempotent" in v for v in violations), violations
    human = env.hw("explore", "broken.py:pay")
    assert human.returncode == 1 and "idempotent" in human.stdout
    # a line per scenario on stderr while it works (a pipe gets no bar: issue 29, item 7)
    lines = [line for line in human.stderr.splitlines() if line.startswith("explore: ")]
    total = 1 + len(report["points"])
    assert lines[0] == f"explore: 1/{total} the uninterrupted run", human.stderr
    assert lines[-1].startswith(f"explore: {total}/{total} cancel "), lines[-1]
    assert len(lines) == total
