"""A worker on a store it cannot write (issue 29, item 20): a one-line error, exit 2, nothing
written, instead of a worker that claims nothing, says nothing and waits for ever.

The store is a real SQLite file left with its write-ahead log and shared memory by a process
killed mid-way (as a store copied from a live machine, or mounted read-only, is found), then made
read-only with its folder. SQLite opens such a file read-only without a word, and reads it; every
write then fails on its own. The commands run as a user who may not write the files: ``nobody``
when the tests run as root (root ignores file permissions), else the tests' own user.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from _paths import TESTS

#: a process that writes the store, then is killed with its log and shared memory left behind
_WRITE_AND_DIE = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("UPDATE runs SET updated_at = updated_at")
conn.commit()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder every user may enter (a test's tmp_path is its owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="hw-readonly-"))
    path.chmod(0o755)
    yield path
    for inner in [path, *path.rglob("*")]:
        inner.chmod(0o755 if inner.is_dir() else 0o644)
    shutil.rmtree(path)


def _as_reader() -> list[str]:
    """What a command line is run under to be a user who may not write the store's files."""
    if os.geteuid() != 0:
        return []  # permissions apply to this user
    # (util-linux's setpriv: a preexec_fn's setuid leaves the interpreter, reached through
    # root's own folder, unexecutable)
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_a_worker_on_a_store_it_cannot_write_says_so_and_exits_2(folder: Path) -> None:
    agent = folder / "agent.py"
    agent.write_text((TESTS / "reconcile_agent.py").read_text())
    agent.chmod(0o644)
    store = folder / "store"
    store.mkdir()
    url = f"sqlite:///{store / 'haltwise.db'}"
    env = {**os.environ, "HOME": str(folder), "RECONCILE_WORLD": str(folder)}

    def hw(*args: str, reader: bool = False) -> subprocess.CompletedProcess[str]:
        user = _as_reader() if reader else []
        command = [*user, sys.executable, "-m", "haltwise", *args, "--store", url]
        return subprocess.run(
            command, cwd=folder, env=env, capture_output=True, text=True, timeout=60
        )

    submitted = hw("submit", "agent.py:order", "--input", '{"amount": 1}')
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    killed = subprocess.run([sys.executable, "-c", _WRITE_AND_DIE, str(store / "haltwise.db")])
    assert killed.returncode == -signal.SIGKILL
    assert {p.name for p in store.iterdir()} >= {"haltwise.db-wal", "haltwise.db-shm"}
    for path in store.iterdir():
        path.chmod(0o444)
    store.chmod(0o555)
    before = _digests(store)

    worked = hw("worker", "agent.py", reader=True)
    assert worked.returncode == 2, (worked.returncode, worked.stdout, worked.stderr)
    lines = worked.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be written" in lines[0], worked.stderr
    assert str(store) in lines[0] and "Traceback" not in worked.stderr
    assert worked.stdout == ""
    assert _digests(store) == before, "nothing written"
    # the run is still pending, for a worker that can write the store
    store.chmod(0o755)
    status = hw("status", run_id, "--json")
    assert '"state": "pending"' in status.stdout, status.stdout + status.stderr
