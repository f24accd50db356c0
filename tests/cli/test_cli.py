"""The command line end to end: real ``python -m haltwise`` processes against a SQLite store.

The harness is tests/_cli_kit.py. Every tool of its agent file appends a line to
``effects.log`` when its effect happens, so a test can count side effects across processes.
Gated tools wait for a ``release-NAME`` file, so a test can hold a step in flight exactly as long
as it needs (it polls ``status --json`` with a deadline instead of sleeping).
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from _cli_kit import AGENT, PATIENCE, Env, error_line, finish, statuses, step_is

CLEAN_TOOLS = """
import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> list:
    return []
"""


# -- run -------------------------------------------------------------------------------------


def test_run_to_completion_prints_the_contract_json(env: Env) -> None:
    env.release("send_email")
    done = env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "t1", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    code = shown.pop("code")  # the run's code version (CONTRACT.md, "Resume and determinism")
    assert code["file"] == str((env.root / "agent.py").resolve())
    assert code["digest"] == hashlib.sha256((env.root / "agent.py").read_bytes()).hexdigest()
    assert shown == {
        "id": "t1",
        "task": "agent.py:flow",
        "state": "completed",
        "reason": None,
        "retry": "none",
        "result": "sent cats",
        "error": None,
        "partials": [{"hit": "cats-a"}, {"hit": "cats-b"}],
        "steps": [
            {
                "index": 0,
                "tool": "search",
                "cancel": "interruptible",
                "effect": "read",
                "idempotent": False,
                "status": "committed",
                "attempts": 1,
            },
            {
                "index": 1,
                "tool": "record",
                "cancel": "finish",
                "effect": "write",
                "idempotent": False,
                "status": "committed",
                "attempts": 1,
            },
            {
                "index": 2,
                "tool": "send_email",
                "cancel": "finish",
                "effect": "external",
                "idempotent": False,
                "status": "committed",
                "attempts": 1,
            },
            {
                "index": 3,
                "tool": "record",
                "cancel": "finish",
                "effect": "write",
                "idempotent": False,
                "status": "committed",
                "attempts": 1,
            },
        ],
        "budget": {"limit": None, "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 4}},
    }
    assert done.stdout.count("\n") == 1


def test_run_human_summary_without_a_terminal(env: Env) -> None:
    env.release("send_email")
    done = env.hw("run", f"{env.agent}:flow", "--input", '{"policy": "finish"}')
    assert done.returncode == 0, done.stderr
    assert "state: completed" in done.stdout
    assert "send_email" in done.stdout and '{"hit": "cats-a"}' in done.stdout
    assert "\x1b[" not in done.stdout  # no colour, no live view


def test_failing_task_exits_1(env: Env) -> None:
    done = env.hw("run", "agent.py:boom", "--id", "b1", "--json")
    assert done.returncode == 1, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["state"] == "failed"
    assert outcome["error"] == {"type": "ValueError", "message": "boom: x"}
    assert outcome["retry"] == "restart"


def test_deadline_cancels_with_reason_deadline(env: Env) -> None:
    done = env.hw(
        "run",
        "agent.py:flow",
        "--input",
        '{"policy": "interruptible"}',
        "--deadline",
        "0.5",
        "--json",
    )
    assert done.returncode == 3, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "deadline")


def test_run_with_the_id_of_a_final_run_runs_nothing(env: Env) -> None:
    env.release("send_email")
    flow = '{"policy": "finish"}'
    assert env.hw("run", "agent.py:flow", "--input", flow, "--id", "t1").returncode == 0
    assert env.hw("run", "agent.py:boom", "--id", "b1").returncode == 1
    before = env.effects()

    again = env.hw("run", "agent.py:flow", "--input", flow, "--id", "t1", "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["state"] == "completed"
    failed = env.hw("run", "agent.py:boom", "--id", "b1", "--json")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["error"]["type"] == "ValueError"
    assert env.effects() == before
    # The same id with other inputs, or for another task: refused in one line (exit 2).
    other = env.hw("run", "agent.py:flow", "--input", '{"policy": "rollback"}', "--id", "t1")
    assert other.returncode == 2, other.stderr
    assert "'t1'" in other.stderr and "other inputs" in other.stderr
    assert "Traceback" not in other.stderr
    assert env.hw("run", "agent.py:boom", "--id", "t1").returncode == 2
    assert env.effects() == before


# -- cancel from another process, per policy -------------------------------------------------


def test_cancel_interruptible_step(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    cancel = env.hw("cancel", "r1")
    assert cancel.returncode == 0, cancel.stderr
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "user")
    assert statuses(outcome) == ["committed", "committed", "interrupted"]
    assert outcome["retry"] == "resume"  # record (a write) is committed
    assert outcome["partials"] == [{"hit": "cats-a"}, {"hit": "cats-b"}]
    assert "think" not in env.effects()


def test_cancel_finish_step_waits_for_it(env: Env) -> None:
    process = env.start_flow("r1", "finish", "--json")
    assert env.hw("cancel", "r1", "--reason", "budget").returncode == 0
    held = env.wait_for("r1", "cancelling", lambda s: s["state"] == "cancelling")
    assert step_is(held, 2, "running")  # shielded: still running after the cancel
    human = env.hw("status", "r1").stdout
    assert "cancelling: waiting for send_email (finish)" in human  # grace: tool not loaded
    env.release("send_email")
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "budget")
    assert statuses(outcome) == ["committed", "committed", "committed"]
    assert env.effects().count("send_email") == 1
    assert "record:done" not in env.effects()


def test_cancel_rollback_step_compensates(env: Env) -> None:
    process = env.start_flow("r1", "rollback", "--json")
    assert env.hw("cancel", "r1").returncode == 0
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert statuses(outcome) == ["committed", "committed", "compensated"]
    effects = env.effects()
    assert "undo_note" in effects and "insert_note" not in effects
    assert effects.index("insert_note:start") < effects.index("undo_note")


def test_cancel_undeclared_step_behaves_as_finish(env: Env) -> None:
    process = env.start_flow("r1", "undeclared", "--json")
    assert env.hw("cancel", "r1").returncode == 0
    env.wait_for("r1", "cancelling", lambda s: s["state"] == "cancelling")
    env.release("legacy")
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert statuses(outcome) == ["committed", "committed", "committed"]
    assert outcome["steps"][2]["cancel"] is None
    assert env.effects().count("legacy") == 1


def test_cancel_force_does_not_wait_for_a_finish_step(env: Env) -> None:
    process = env.start_flow("r1", "finish", "--json")
    assert env.hw("cancel", "r1", "--force").returncode == 0
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert statuses(outcome) == ["committed", "committed", "unknown"]
    assert outcome["retry"] == "reconcile"
    assert "send_email" not in env.effects()


def test_cancel_wait_reports_the_final_state(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    cancel = env.hw("cancel", "r1", "--wait")
    assert cancel.returncode == 0, cancel.stderr
    assert "state: cancelled" in cancel.stdout
    assert finish(process)[0] == 3


def test_cancel_a_final_run_says_so(env: Env) -> None:
    assert env.hw("run", "agent.py:boom", "--id", "b1").returncode == 1
    done = env.hw("cancel", "b1", "--wait")
    assert done.returncode == 0
    assert "already failed" in done.stdout
    assert env.status("b1") is not None


def test_a_run_held_by_a_live_owner_cannot_be_run_or_resumed(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    taken = error_line(
        env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "r1")
    )
    assert "live owner" in taken and f"pid {process.pid}" in taken
    assert f"pid {process.pid}" in error_line(env.hw("resume", "r1"))
    assert env.hw("cancel", "r1").returncode == 0
    assert finish(process)[0] == 3


# -- status --------------------------------------------------------------------------------


def resume_completes(env: Env) -> None:
    """``resume r1`` (its think step let go) completes the run: the interrupted step runs again,
    the committed ones do not."""
    env.release("think")
    resumed = env.hw("resume", "r1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "completed"
    assert env.effects() == ["search", "record:cats", "think", "record:done"]


def test_status_of_an_active_and_of_a_final_run(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    active = env.hw("status", "r1")
    assert active.returncode == 0
    assert "state: running" in active.stdout and f"owner: pid {process.pid}" in active.stdout
    env.release("think")
    assert finish(process)[0] == 0
    final = env.hw("status", "r1")
    assert final.returncode == 0
    assert "state: completed" in final.stdout
    as_json = env.status("r1")
    assert as_json is not None and as_json["state"] == "completed"


def test_status_shows_a_dead_owner(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    process.kill()
    process.communicate()
    done = env.hw("status", "r1")
    assert done.returncode == 0
    assert "is gone" in done.stdout and "haltwise resume r1" in done.stdout
    again = error_line(env.hw("run", "agent.py:flow", "--input", '{"policy": "x"}', "--id", "r1"))
    assert "haltwise resume r1" in again
    resume_completes(env)  # resume takes it over


def test_cancel_of_a_run_whose_owner_died_settles_it_there(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    process.kill()
    process.communicate()
    done = env.hw("cancel", "r1", "--wait")
    assert done.returncode == 0, done.stderr
    assert "cancel requested for run r1" in done.stdout
    assert "settled here" in done.stdout
    settled = env.status("r1")
    assert settled is not None
    assert (settled["state"], settled["reason"]) == ("cancelled", "user")
    assert statuses(settled) == ["committed", "committed", "interrupted"]
    resume_completes(env)  # resume continues the cancelled run


# -- resume --------------------------------------------------------------------------------


def test_resume_after_cancel_does_not_repeat_committed_steps(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    assert env.hw("cancel", "r1").returncode == 0
    assert finish(process)[0] == 3
    env.release("think")
    elsewhere = env.root / "elsewhere"
    elsewhere.mkdir()
    resumed = subprocess.run(  # from outside the project: the file must be named
        [sys.executable, "-m", "haltwise", "resume", "r1", "../agent.py", "--json"],
        cwd=elsewhere,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    outcome = json.loads(resumed.stdout)
    assert (outcome["state"], outcome["result"], outcome["reason"]) == ("completed", "cats", None)
    assert [s["attempts"] for s in outcome["steps"]] == [1, 1, 2, 1]
    assert outcome["partials"] == [{"hit": "cats-a"}, {"hit": "cats-b"}]
    assert env.effects() == ["search", "record:cats", "think", "record:done"]
    # resuming a completed run runs nothing and reports it
    again = env.hw("resume", "r1", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "completed"
    assert env.effects() == ["search", "record:cats", "think", "record:done"]


def _unknown_post(env: Env, run_id: str) -> None:
    """Leave run ``run_id`` cancelled with step 2 (post_message, grace 0.2 s) unknown."""
    process = env.start_flow(run_id, "short", "--json")
    assert env.hw("cancel", run_id).returncode == 0
    code, outcome, _ = finish(process)
    assert code == 3
    assert isinstance(outcome, dict)
    assert statuses(outcome) == ["committed", "committed", "unknown"]
    assert outcome["retry"] == "reconcile"


def test_resume_refused_then_assume_done(env: Env) -> None:
    _unknown_post(env, "r1")
    human = env.hw("status", "r1")
    assert "reconcile step 2 (post_message)" in human.stdout
    assert "--assume-done 2 or --rerun 2" in human.stdout
    refused = error_line(env.hw("resume", "r1"))
    assert "step 2 (post_message)" in refused
    assert "--assume-done 2 or --rerun 2" in refused, "the options, phrased as status says them"
    done = env.hw("resume", "r1", "--assume-done", '2="posted by hand"', "--json")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["state"], outcome["result"]) == ("completed", "posted by hand")
    assert "post_message" not in env.effects()
    assert env.effects().count("record:cats") == 1


def test_resume_refused_then_rerun(env: Env) -> None:
    _unknown_post(env, "r1")
    assert env.hw("resume", "r1").returncode == 2
    env.release("post_message")
    done = env.hw("resume", "r1", "--rerun", "2", "--json")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["state"], outcome["result"]) == ("completed", "posted cats")
    assert env.effects().count("post_message") == 1


def test_resume_bad_step_options(env: Env) -> None:
    _unknown_post(env, "r1")
    assert "--assume-done" in error_line(env.hw("resume", "r1", "--assume-done", "two"))
    assert "not valid JSON" in error_line(env.hw("resume", "r1", "--assume-done", "2={"))
    assert "no step 9" in error_line(env.hw("resume", "r1", "--rerun", "9"))
    assert "already committed" in error_line(env.hw("resume", "r1", "--rerun", "1"))


# -- signals -------------------------------------------------------------------------------


def test_sigint_cancels_with_reason_user(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    process.send_signal(signal.SIGINT)
    code, outcome, err = finish(process)
    assert code == 3, err
    assert isinstance(outcome, dict)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "user")
    assert statuses(outcome)[2] == "interrupted"
    assert "Traceback" not in err


def test_second_sigint_forces(env: Env) -> None:
    process = env.start_flow("r1", "finish", "--json")
    process.send_signal(signal.SIGINT)
    env.wait_for("r1", "cancelling", lambda s: s["state"] == "cancelling")
    process.send_signal(signal.SIGINT)
    code, outcome, err = finish(process)
    assert code == 3, err
    assert isinstance(outcome, dict)
    assert (outcome["reason"], statuses(outcome)[2]) == ("user", "unknown")
    assert "send_email" not in env.effects()


def test_sigterm_cancels_with_reason_shutdown(env: Env) -> None:
    process = env.start_flow("r1", "interruptible")
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process)
    assert code == 3, err
    assert "state: cancelled (reason: shutdown)" in str(out)
    assert "resume: restarting would repeat record" in str(out)


# -- the live view (on a terminal) -----------------------------------------------------------


def test_live_view_on_a_terminal_shows_the_cancel_wait(env: Env) -> None:
    controller, terminal = pty.openpty()
    process = env.popen(
        "run",
        "agent.py:flow",
        "--id",
        "r1",
        "--input",
        '{"policy": "finish"}',
        stdout=terminal,
    )
    os.close(terminal)
    screen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        env.wait_in_flight("r1")
        assert env.hw("cancel", "r1").returncode == 0
        deadline = time.monotonic() + PATIENCE
        wanted = b"cancelling: waiting for send_email (finish, grace 60s)"
        while wanted not in b"".join(screen) and time.monotonic() < deadline:
            time.sleep(0.02)
        env.release("send_email")
        assert process.wait(timeout=PATIENCE) == 3
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(timeout=5)
        os.close(controller)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(screen).decode(errors="replace"))
    assert "cancelling: waiting for send_email (finish, grace 60s)" in shown
    assert "state: cancelled (reason: user)" in shown


# -- list ------------------------------------------------------------------------------------


def test_list_and_state_filter(env: Env) -> None:
    env.release("send_email")
    assert (
        env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "a").returncode
        == 0
    )
    assert env.hw("run", "agent.py:boom", "--id", "b").returncode == 1
    done = env.hw("list", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout) == {  # newest created first
        "runs": [
            {
                "id": "b",
                "task": "agent.py:boom",
                "state": "failed",
                "reason": None,
                "retry": "restart",
                "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 1},
            },
            {
                "id": "a",
                "task": "agent.py:flow",
                "state": "completed",
                "reason": None,
                "retry": "none",
                "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 4},
            },
        ]
    }
    failed = json.loads(env.hw("list", "--state", "failed", "--json").stdout)
    assert [run["id"] for run in failed["runs"]] == ["b"]
    assert json.loads(env.hw("list", "--state", "cancelled", "--json").stdout) == {"runs": []}
    human = env.hw("list")
    assert human.returncode == 0 and "agent.py:boom" in human.stdout
    assert "--state" in error_line(env.hw("list", "--state", "sleeping"))


# -- audit -----------------------------------------------------------------------------------


def test_audit_json_and_strict(env: Env) -> None:
    done = env.hw("audit", "agent.py", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    tools = {tool["name"]: tool for tool in report["tools"]}
    assert tools["legacy"]["cancel"] is None and tools["legacy"]["declared"] is False
    assert tools["insert_note"]["compensate"] == "undo_note"
    assert {"undeclared-cancel", "undeclared-effect"} <= {
        f["code"] for f in report["findings"] if f["tool"] == "legacy"
    }
    assert env.hw("audit", "agent.py", "--strict").returncode == 1
    with_deadline = json.loads(env.hw("audit", "agent.py", "--json", "--deadline", "1").stdout)
    assert any(
        f["tool"] == "send_email" and f["code"] == "grace-exceeds-deadline"
        for f in with_deadline["findings"]
    )
    (env.root / "clean.py").write_text(CLEAN_TOOLS)
    clean = env.hw("audit", "clean.py", "--strict", "--json")
    assert clean.returncode == 0 and json.loads(clean.stdout)["findings"] == []
    markdown = env.hw("audit", "agent.py", "--markdown")
    assert markdown.returncode == 0 and "legacy" in markdown.stdout
    assert "missing.py" in error_line(env.hw("audit", "missing.py"))


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("status", "nope"), "no run with id 'nope'"),
        (("cancel", "nope"), "no run with id 'nope'"),
        (("resume", "nope"), "no run with id 'nope'"),
        (("run", "missing.py:flow"), "missing.py: no such file"),
        (("run", "agent.py:nope"), "no task 'nope'"),
        (("run", "agent.py"), "FILE.py:TASK"),
        (("run", "agent.py:flow", "--input", "{policy"), "--input is not valid JSON"),
        (("run", "agent.py:flow", "--input", "[1, 2]"), "JSON object"),
        (("run", "agent.py:flow", "--input", '{"colour": "red"}'), "--input does not fit"),
        (("run", "agent.py:flow", "--input", '{"policy": "x"}', "--deadline", "-1"), "deadline"),
        (("run", "agent.py:flow", "--deadline", "soon"), "--deadline"),
        (("run",), "Missing argument"),
        (("frobnicate",), "No such command"),
        (("status", "x", "--store", "mysql://db"), "unusable store URL"),
    ],
)
def test_bad_input_exits_2_with_one_line(env: Env, args: tuple[str, ...], says: str) -> None:
    assert says in error_line(env.hw(*args))


def test_store_that_is_not_a_haltwise_store(env: Env) -> None:
    junk = env.root / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    assert "not a haltwise store" in error_line(env.hw("list", "--store", f"sqlite:///{junk}"))
    other = env.root / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
    assert "not a haltwise store" in error_line(env.hw("list", "--store", f"sqlite:///{other}"))
    blocker = env.root / "file.txt"
    blocker.write_text("a file, not a directory")
    bad_path = f"sqlite:///{blocker}/sub/store.db"
    assert "cannot create" in error_line(env.hw("cancel", "x", "--store", bad_path))
    # a command that only reads creates nothing, and says where it looked (issue 29, item 6:
    # a named store whose folder does not exist is refused, naming the folder)
    line = error_line(env.hw("status", "x", "--store", bad_path))
    assert "there is no store there" in line and f"no folder '{blocker}/sub'" in line


def test_default_store_is_under_the_current_directory(env: Env) -> None:
    env.release("send_email")
    environ = env.environ()
    del environ["HALTWISE_STORE"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "haltwise",
            "run",
            "agent.py:flow",
            "--input",
            '{"policy": "finish"}',
            "--id",
            "d1",
        ],
        cwd=env.root,
        env=environ,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (env.root / ".haltwise" / "haltwise.db").exists()


def test_resume_when_the_task_file_is_gone(env: Env) -> None:
    (env.root / "gone.py").write_text(AGENT)
    assert env.hw("run", "gone.py:boom", "--id", "g1").returncode == 1
    (env.root / "gone.py").unlink()
    assert "no such file" in error_line(env.hw("resume", "g1"))


def test_bare_command_shows_help_and_exits_2(env: Env) -> None:
    done = env.hw()
    assert done.returncode == 2
    assert "Usage: haltwise" in done.stderr and done.stdout == ""
    assert "Traceback" not in done.stderr
