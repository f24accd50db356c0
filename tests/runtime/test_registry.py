"""The registries of tools and tasks: namesakes never stand in for each other.

Two modules may each declare a tool ``insert``: a takeover compensates a crashed rollback step
with exactly the function that ran (the journal records its key), never with the namesake that
was declared last. Two tasks of one name would make a resume run whichever came last, so the
second is refused at declaration; the same function declared again (a module loaded again)
replaces the first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import haltwise
from _wait import wait_until
from haltwise._runtime.tool import TASKS

MODULE = """
import anyio, haltwise
from pathlib import Path

WORLD = Path(__file__).parent / "world"

def undo(x: str) -> None:
    (WORLD / "{name}-undone").write_text(x)

@haltwise.tool(cancel="rollback", effect="write", compensate=undo, name="insert")
async def insert(x: str) -> None:
    (WORLD / "{name}-started").write_text(x)
    await anyio.sleep(3600)  # killed in here
"""

AGENT = """
import haltwise
import mod_a  # the tool that runs
import mod_b  # its namesake, declared last

@haltwise.task
async def job() -> None:
    await mod_a.insert("row")
"""


def haltwise_cli(root: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.Popen(
        [sys.executable, "-m", "haltwise", *args, "--store", f"sqlite:///{root / 'h.db'}"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_takeover_compensates_with_the_tool_that_ran_not_its_namesake(tmp_path: Path) -> None:
    (tmp_path / "world").mkdir()
    for name in ("a", "b"):
        (tmp_path / f"mod_{name}.py").write_text(MODULE.format(name=name))
    (tmp_path / "agent.py").write_text(AGENT)
    run = haltwise_cli(tmp_path, "run", "agent.py:job", "--id", "r1")
    started = tmp_path / "world" / "a-started"
    wait_until(started.exists, "the rollback step beginning", process=run, timeout=60)
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    resumed = haltwise_cli(tmp_path, "resume", "r1", "--json")
    # the resume compensates the crashed call, then runs it again: it hangs in it, so cancel it
    undone = tmp_path / "world" / "a-undone"
    wait_until(undone.exists, "the crashed step compensated", process=resumed, timeout=60)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "haltwise",
            "cancel",
            "r1",
            "--force",
            "--wait",
            "--store",
            f"sqlite:///{tmp_path / 'h.db'}",
        ],
        check=True,
        timeout=60,
        capture_output=True,
    )
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 3, err
    assert json.loads(out)["state"] == "cancelled"
    assert sorted(path.name for path in (tmp_path / "world").iterdir()) == [
        "a-started",
        "a-undone",
    ]  # mod_b's compensation never ran


async def _job() -> None:
    pass


async def _other_job() -> None:
    pass


def test_a_second_task_of_one_name_is_refused_and_a_redeclaration_replaces() -> None:
    first = haltwise.task(name="test_registry:job")(_job)
    again = haltwise.task(name="test_registry:job")(_job)  # the same function: a reload
    assert TASKS["test_registry:job"] is again is not first
    with pytest.raises(haltwise.PolicyError, match="already declared"):
        haltwise.task(name="test_registry:job")(_other_job)
    assert TASKS["test_registry:job"] is again
