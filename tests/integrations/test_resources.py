"""A resource that is not JSON (here a database connection) reaches a tool and its compensation,
also in the process that takes the run over after ``kill -9`` (docs/integrations.md, "Resources
that are not JSON").

The design under test: a resource is process state found by name when the tool (or its
compensation) runs, never journaled; each process builds its own. Process A inserts a row
through its connection and is killed while the rollback step is in flight; process B
(``haltwise resume``) compensates that step through *its* connection, then runs the step again.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from _wait import wait_until

AGENT = """
import os
import sqlite3
import time
from pathlib import Path

import haltwise

HERE = Path(__file__).parent
#: the resources of this process, by name: built on first use, never journaled
RESOURCES = {}


def database():
    if "db" not in RESOURCES:
        RESOURCES["db"] = sqlite3.connect(HERE / "world.db", isolation_level=None)
        RESOURCES["db"].execute("CREATE TABLE IF NOT EXISTS rows (text TEXT, pid INTEGER)")
    return RESOURCES["db"]


def delete_row(text):
    database().execute("DELETE FROM rows WHERE text = ?", (text,))
    with open(HERE / "undone.log", "a") as log:
        log.write(f"{os.getpid()}\\n")


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_row)
def insert_row(text: str) -> int:
    database().execute("INSERT INTO rows VALUES (?, ?)", (text, os.getpid()))
    while not (HERE / "release").exists():
        time.sleep(0.005)
    return os.getpid()


@haltwise.task
async def store_row(text: str) -> int:
    return await insert_row(text)
"""

PATIENCE = 60.0
RUN_ARGS = ["--input", '{"text": "hello"}', "--id", "r1", "--store"]


def rows(world: Path) -> list[tuple[str, int]]:
    if not world.exists():
        return []
    with sqlite3.connect(world) as conn:
        try:
            return conn.execute("SELECT text, pid FROM rows").fetchall()
        except sqlite3.OperationalError:
            return []


def haltwise_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )


def test_the_compensation_after_a_takeover_uses_the_new_process_resource(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    store = f"sqlite:///{tmp_path}/haltwise.db"
    first = subprocess.Popen(
        [sys.executable, "-m", "haltwise", "run", "agent.py:store_row", *RUN_ARGS, store],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(
        lambda: bool(rows(tmp_path / "world.db")), "the first process's row", timeout=PATIENCE
    )
    ((_, inserted_by),) = rows(tmp_path / "world.db")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=PATIENCE)
    (tmp_path / "release").touch()

    resumed = haltwise_cli("resume", "r1", "--json", "--store", store, cwd=tmp_path)

    assert resumed.returncode == 0, resumed.stderr
    outcome = json.loads(resumed.stdout)
    assert outcome["state"] == "completed"
    assert [s["status"] for s in outcome["steps"]] == ["committed"]
    undone_by = [int(pid) for pid in (tmp_path / "undone.log").read_text().split()]
    assert len(undone_by) == 1
    assert undone_by[0] != inserted_by  # compensated by the process that took over
    # the first process's row undone; the one the step made again in the new process kept
    assert rows(tmp_path / "world.db") == [("hello", outcome["result"])]
    assert outcome["result"] == undone_by[0]
