"""The version of a run's code (CONTRACT.md, "Resume and determinism"): recorded when the run
starts and shown by ``status``; a task file edited between a cancel and a resume refused with
``CodeChangedError`` naming the file and both digests (exit 2 on the command line), resumed
with ``--allow-code-change`` / ``allow_code_change=True`` and that recorded in the run's
events; a journal row rewritten to name another file of the project never imports it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import State
from haltwise._runtime.loader import load_target

pytestmark = pytest.mark.anyio

AGENT = """
import anyio

import haltwise

@haltwise.tool(cancel="interruptible", effect="read")
async def look(n: int) -> int:
    return n


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_here() -> str:
    await anyio.sleep(600)
    return "never"


@haltwise.task
async def job() -> list:
    got = [await look(1)]
    got.append(await wait_here())
    return got
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hw(root: Path, store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args, "--store", store],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def cancelled_run(root: Path, store: str) -> dict[str, Any]:
    """``haltwise run agent.py:job --id c1`` cancelled (from another process) while it waits."""
    (root / "pyproject.toml").write_text("")  # the project's root
    (root / "agent.py").write_text(AGENT)
    command = [sys.executable, "-m", "haltwise", "run", "agent.py:job", "--id", "c1"]
    runner = subprocess.Popen(
        [*command, "--store", store], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        while True:  # each look is a process of its own: no sleep needed between them
            shown = hw(root, store, "status", "c1", "--json")
            if shown.returncode == 0 and len(json.loads(shown.stdout)["steps"]) == 2:
                break
            assert runner.poll() is None, runner.communicate()
        assert hw(root, store, "cancel", "c1", "--wait").returncode == 0
    finally:
        runner.communicate(timeout=60)
    return dict(json.loads(hw(root, store, "status", "c1", "--json").stdout))


def test_an_edited_file_is_refused_then_allowed(tmp_path: Path, store_url: str) -> None:
    status = cancelled_run(tmp_path, store_url)
    agent = tmp_path / "agent.py"
    recorded = sha(agent)
    assert status["code"]["file"] == str(agent.resolve())
    assert status["code"]["digest"] == recorded
    assert set(status["code"]["tools"]) == {"look", "wait_here"}

    agent.write_text(AGENT.replace("await anyio.sleep(600)", "pass"))
    edited = sha(agent)
    assert "changed since the run started" in hw(tmp_path, store_url, "status", "c1").stdout

    refused = hw(tmp_path, store_url, "resume", "c1")
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert str(agent.resolve()) in line and recorded in line and edited in line, line
    assert "Traceback" not in refused.stderr

    allowed = hw(tmp_path, store_url, "resume", "c1", "--allow-code-change", "--json")
    assert allowed.returncode == 0, allowed.stderr
    outcome = json.loads(allowed.stdout)
    assert outcome["state"] == "completed" and outcome["result"] == [1, "never"]
    detail = json.loads(hw(tmp_path, store_url, "status", "c1", "--json").stdout)
    assert detail["state"] == "completed"


def test_a_rewritten_journal_row_never_imports_the_other_file(
    tmp_path: Path, sqlite_url: str
) -> None:
    cancelled_run(tmp_path, sqlite_url)
    other = tmp_path / "other.py"
    marker = tmp_path / "imported"
    other.write_text(f"open({str(marker)!r}, 'w').write('1')\n" + AGENT)
    import sqlite3

    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    (text,) = db.execute("SELECT inputs FROM runs WHERE id = 'c1'").fetchone()
    inputs = json.loads(text)
    inputs["source"] = str(other)
    db.execute("UPDATE runs SET inputs = ? WHERE id = 'c1'", (json.dumps(inputs),))
    db.commit()
    db.close()
    refused = hw(tmp_path, sqlite_url, "resume", "c1")
    assert refused.returncode == 2, refused.stderr
    assert str(other) in refused.stderr
    assert not marker.exists(), "the file the rewritten row names was never imported"


async def test_python_resume_refuses_a_changed_file_and_records_the_allowance(
    tmp_path: Path, store_url: str
) -> None:
    agent = tmp_path / "code_agent.py"
    agent.write_text(AGENT.replace("@haltwise.task", "@haltwise.task(name='code_agent:job')"))
    _, task = load_target(f"{agent}:job")
    assert task is not None
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(task, task_id="p1")
        while len((await rt.status("p1")).steps) < 2:
            await anyio.sleep(0.01)
        await handle.cancel()
        cancelled = await handle.outcome()
        assert cancelled.state is State.CANCELLED
        assert cancelled.code is not None and cancelled.code.digest == sha(agent)
        agent.write_text(AGENT + "\n# edited\n")
        with pytest.raises(haltwise.CodeChangedError) as refused:
            await rt.resume("p1", task=task)
        assert refused.value.file == str(agent.resolve())
        digests = (refused.value.recorded, refused.value.current)
        assert digests == (cancelled.code.digest, sha(agent))
        assert (await rt.status("p1")).state is State.CANCELLED, "a refused resume changes nothing"
        handle = await rt.resume("p1", task=task, allow_code_change=True)
        await handle.cancel()
        await handle.outcome()
        events = (await rt.inspect("p1")).events
    notes = [e.reason for e in events if e.target is State.RUNNING and e.reason]
    assert len(notes) == 1 and "allow_code_change" in notes[0] and sha(agent) in notes[0]
