"""Which file a run's task is loaded from, and what it is called (issue 15, items 2, 12, 22).

Loading a task runs its file, so ``resume`` never runs a file just because the journal names it:
the tests point a run's journaled source at a file outside the project that leaves a marker
when it is imported, and count the markers.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_kit import PATIENCE, Env, error_line

AGENT = """
from pathlib import Path

import haltwise

HERE = Path(__file__).parent


@haltwise.tool(cancel="interruptible", effect="read")
async def look(topic: str) -> str:
    return topic


@haltwise.task
async def child(topic: str) -> str:
    return await look(topic)


@haltwise.task
async def flaky(topic: str = "x") -> str:
    await look(topic)
    if not (HERE / "go").exists():
        raise RuntimeError("not yet")
    return await child(topic)
"""

EVIL = """
from pathlib import Path

import haltwise

Path(__file__).with_name("imported").touch()


@haltwise.task
async def flaky(topic: str = "x") -> str:
    return "evil ran"
"""

SCRIPT = """
import sys
from pathlib import Path

import haltwise

HERE = Path(__file__).parent


@haltwise.tool(cancel="interruptible", effect="read")
async def look(topic: str) -> str:
    return topic


@haltwise.task
async def research(topic: str) -> str:
    await look(topic)
    if not (HERE / "go").exists():
        raise RuntimeError("not yet")
    return "done " + topic


if __name__ == "__main__":
    try:
        haltwise.run(research, "cats", task_id="s1", store=sys.argv[1])
    except Exception:
        pass
"""


@pytest.fixture
def env(tmp_path: Path) -> Env:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (project / "agent.py").write_text(AGENT)
    return Env(project)


@pytest.fixture
def evil(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text(EVIL)
    return outside / "evil.py"


def failed_run(env: Env, run_id: str = "r1") -> None:
    done = env.hw("run", "agent.py:flaky", "--id", run_id)
    assert done.returncode == 1, done.stderr


def point_at(env: Env, run_id: str, *, source: Path | None = None, task: str | None = None) -> None:
    with sqlite3.connect(env.root / "store.db") as conn:
        (inputs,) = conn.execute("SELECT inputs FROM runs WHERE id = ?", (run_id,)).fetchone()
        data = json.loads(inputs)
        if source is not None:
            data["source"] = str(source)
        else:
            data.pop("source", None)
        conn.execute("UPDATE runs SET inputs = ? WHERE id = ?", (json.dumps(data), run_id))
        if task is not None:
            conn.execute("UPDATE runs SET task = ? WHERE id = ?", (task, run_id))


def test_resume_refuses_a_journaled_file_outside_the_project(env: Env, evil: Path) -> None:
    failed_run(env)
    point_at(env, "r1", source=evil)
    line = error_line(env.hw("resume", "r1"))
    assert str(evil) in line and "outside this project" in line
    assert not evil.with_name("imported").exists(), "resume ran a file the journal named"
    # status shows the code the run recorded (issue 32: file and digest), not the rewritten row
    shown = env.hw("status", "r1").stdout
    assert f"source: {env.root / 'agent.py'}, sha256 " in shown and str(evil) not in shown
    # a task name that is a path is a file too
    point_at(env, "r1", task=f"{evil}:flaky")
    assert "outside this project" in error_line(env.hw("resume", "r1"))
    assert not evil.with_name("imported").exists()


def test_resume_runs_a_file_outside_the_project_when_it_is_named(env: Env, evil: Path) -> None:
    failed_run(env)
    point_at(env, "r1", source=evil)
    # its digest is not the recorded one: refused with both digests (issue 32), nothing imported
    refused = error_line(env.hw("resume", "r1", str(evil), "--json"))
    assert str(evil) in refused and refused.count("sha256") == 1 and "now" in refused
    assert not evil.with_name("imported").exists()
    done = env.hw("resume", "r1", str(evil), "--allow-code-change", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "evil ran"
    assert evil.with_name("imported").exists()


def test_resume_refuses_a_named_file_other_than_the_journals_unless_moved(env: Env) -> None:
    failed_run(env)
    moved = env.root / "moved.py"
    moved.write_text(AGENT)
    line = error_line(env.hw("resume", "r1", "moved.py"))
    assert "--moved" in line and str(env.root / "agent.py") in line
    (env.root / "go").touch()
    done = env.hw("resume", "r1", "moved.py", "--moved", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "completed"


def test_resume_from_a_subdirectory_of_the_project_loads_the_journaled_file(env: Env) -> None:
    failed_run(env)
    (env.root / "go").touch()
    sub = env.root / "sub"
    sub.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "resume", "r1", "--json"],
        cwd=sub,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=PATIENCE * 3,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "completed"


def test_child_runs_are_named_after_the_file_not_an_internal_module(env: Env) -> None:
    (env.root / "go").touch()
    done = env.hw("run", "agent.py:flaky", "--id", "p")
    assert done.returncode == 0, done.stderr
    runs = json.loads(env.hw("list", "--json").stdout)["runs"]
    assert {run["id"]: run["task"] for run in runs} == {
        "p": "agent.py:flaky",
        "p/1": "agent.py:child",
    }
    assert "haltwise_user" not in env.hw("status", "p/1").stdout


def test_a_run_started_from_a_script_can_be_resumed_from_the_command_line(env: Env) -> None:
    (env.root / "script.py").write_text(SCRIPT)
    started = subprocess.run(
        [sys.executable, "script.py", env.store],
        cwd=env.root,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=PATIENCE * 3,
    )
    assert started.returncode == 0, started.stderr
    status = env.status("s1")
    assert status is not None
    assert (status["task"], status["state"]) == ("script.py:research", "failed")
    (env.root / "go").touch()
    done = env.hw("resume", "s1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "done cats"
