"""The command line's edges a new user meets first (issue 29): tables in a pipe and at 80
columns, a ``--store`` in a folder that does not exist."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from _cli_kit import Env, error_line

#: 32 characters, as a generated id is
LONG_ID = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"


def hw_with(env: Env, extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args],
        cwd=env.root,
        env={**env.environ(), **extra},
        text=True,
        capture_output=True,
        timeout=60,
    )


def test_a_pipe_gets_whole_ids_and_80_columns_get_every_audit_column(env: Env) -> None:
    env.release("think")
    ran = env.hw("run", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--id", LONG_ID)
    assert ran.returncode == 0, ran.stderr
    listed = env.hw("list")  # stdout is a pipe: no COLUMNS, no terminal
    row = next(line for line in listed.stdout.splitlines() if LONG_ID in line)
    assert "agent.py:flow" in row and "completed" in row, listed.stdout
    audit = json.loads(env.hw("audit", "agent.py", "--json").stdout)
    for columns in ("80", "100"):
        shown = hw_with(env, {"COLUMNS": columns}, "audit", "agent.py")
        assert shown.returncode == 0, shown.stderr
        assert max(map(len, shown.stdout.splitlines())) <= int(columns)
        flat = " ".join(shown.stdout.split())
        for tool in audit["tools"]:
            assert tool["name"] in flat
        # what a cancel mid-call leaves, for every tool, readable (not a letter a line)
        assert flat.count("a cancel mid-call leaves: ") == len(audit["tools"]), shown.stdout
        assert "nothing: the read is dropped" in flat


def test_a_store_in_a_folder_that_does_not_exist_is_a_one_line_error(env: Env) -> None:
    missing = env.root / "no-such-folder" / "store.db"
    for args in (["list"], ["status", "r1"], ["list", "--json"]):
        done = env.hw(*args, "--store", f"sqlite:///{missing}")
        assert done.returncode == 2, (args, done.stdout)
        assert "no-such-folder" in error_line(done)
        assert "Traceback" not in done.stderr
    assert not missing.parent.exists()
    # the default store's folder not made yet is a project where nothing ran: no runs, exit 0
    fresh = subprocess.run(
        [sys.executable, "-m", "haltwise", "list"],
        cwd=env.root,
        env={k: v for k, v in env.environ().items() if k != "HALTWISE_STORE"},
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert fresh.returncode == 0 and "no runs" in fresh.stdout, fresh.stderr


SUBMIT = """
import sys

import anyio

import haltwise
from agent import flow


async def main() -> None:
    async with haltwise.Runtime(sys.argv[1]) as rt:
        run_id, _ = await rt.submit(flow, kwargs={"policy": "interruptible"}, task_id="py1")
        print(rt and (await rt.status(run_id)).task)


anyio.run(main)
"""


def test_a_run_submitted_from_python_is_worked_by_a_worker_of_its_file(env: Env) -> None:
    """Issue 29, item 22: Python records ``agent:flow``, the worker knew only ``agent.py:flow``."""
    env.release("think")
    (env.root / "submit.py").write_text(SUBMIT)
    submitted = subprocess.run(
        [sys.executable, "submit.py", env.store],
        cwd=env.root,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "agent:flow"
    worker = env.popen("worker", "agent.py")
    try:
        env.wait_for("py1", "completed by the worker", lambda s: s["state"] == "completed")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)


def test_a_run_id_that_is_not_utf8_is_a_one_line_error(env: Env) -> None:
    # a byte that is not UTF-8 in an argument reaches Python as a lone surrogate ('r\udcff')
    command = [sys.executable.encode(), b"-m", b"haltwise", b"submit", b"agent.py:boom"]
    done = subprocess.run(
        [*command, b"--id", b"r\xff"],
        cwd=env.root,
        env=env.environ(),
        capture_output=True,
        timeout=60,
    )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 2, stderr
    assert stderr.count("\n") == 1 and "not valid UTF-8" in stderr, stderr
    assert "Traceback" not in stderr
    listed = env.hw("list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["runs"] == []  # nothing written
