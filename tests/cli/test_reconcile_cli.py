"""``haltwise reconcile ID [--json]`` (CONTRACT.md, "Command line"): a paid call cut by a forced
cancel from another process, its tool's reconcile hook asked from the command line: exit 1
while the hook cannot tell, 0 once no step is left unknown; the answer is journaled and shown
by ``status --json``. The agent is tests/reconcile_agent.py, run as FILE.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _paths import TESTS

PATIENCE = 60.0


def test_reconcile_asks_the_hook_and_journals_the_answer(tmp_path: Path, store_url: str) -> None:
    world = tmp_path / "world"
    world.mkdir()
    (tmp_path / "agent.py").write_text((TESTS / "reconcile_agent.py").read_text())
    env = {**os.environ, "RECONCILE_WORLD": str(world)}

    def hw(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "haltwise", *args, "--store", store_url]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PATIENCE
        )

    def status() -> dict[str, Any]:
        done = hw("status", "o1", "--json")
        assert done.returncode in (0, 1, 3, 4), done.stderr
        return dict(json.loads(done.stdout))

    (world / "hold-after").touch()
    command = [sys.executable, "-m", "haltwise", "run", "agent.py:order", "--id", "o1"]
    command += ["--input", '{"amount": 42}', "--json", "--store", store_url]
    runner = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + PATIENCE
    while not (world / "charged").exists():
        assert runner.poll() is None, runner.communicate()
        assert time.monotonic() < deadline, "the charge never began"
        time.sleep(0.01)
    assert hw("cancel", "o1", "--force", "--wait").returncode == 0
    runner.communicate(timeout=PATIENCE)
    (world / "hold-after").unlink()
    assert status()["steps"][0]["status"] == "unknown"

    (world / "hook").write_text("none")
    cannot = hw("reconcile", "o1", "--json")
    assert cannot.returncode == 1, cannot.stderr
    shown = json.loads(cannot.stdout)
    assert shown["steps"][0]["status"] == "unknown"
    assert shown["steps"][0]["reconciled"]["answer"] == "unknown"
    assert shown["retry"] == "reconcile"

    (world / "hook").write_text("ledger")
    told = hw("reconcile", "o1", "--json")
    assert told.returncode == 0, told.stderr
    step = json.loads(told.stdout)["steps"][0]
    assert step["status"] == "committed"
    assert (step["reconciled"]["by"], step["reconciled"]["answer"]) == ("hook", "happened")
    assert status()["steps"][0]["reconciled"] == step["reconciled"]
    assert len((world / "ledger").read_text().splitlines()) == 1


def test_a_workers_takeover_asks_the_hook(tmp_path: Path, store_url: str) -> None:
    """``haltwise run`` killed -9 mid-charge; a worker of the file takes the run over, asks the
    hook (the charge happened) and completes the run without charging again."""
    world = tmp_path / "world"
    world.mkdir()
    (tmp_path / "agent.py").write_text((TESTS / "reconcile_agent.py").read_text())
    env = {**os.environ, "RECONCILE_WORLD": str(world)}
    (world / "hold-after").touch()
    command = [sys.executable, "-m", "haltwise", "run", "agent.py:order", "--id", "o1"]
    command += ["--input", '{"amount": 42}', "--store", store_url]
    runner = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + PATIENCE
    while not (world / "charged").exists():
        assert runner.poll() is None, runner.communicate()
        assert time.monotonic() < deadline, "the charge never began"
        time.sleep(0.01)
    runner.kill()
    runner.communicate()
    (world / "hold-after").unlink()

    worker = subprocess.Popen(
        [sys.executable, "-m", "haltwise", "worker", "agent.py", "--store", store_url],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + PATIENCE
        while True:
            done = subprocess.run(
                [sys.executable, "-m", "haltwise", "status", "o1", "--json", "--store", store_url],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=PATIENCE,
            )
            shown = json.loads(done.stdout)
            if shown["state"] == "completed":
                break
            assert shown["state"] != "failed", shown
            assert time.monotonic() < deadline, shown
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.communicate(timeout=PATIENCE)
    step = shown["steps"][0]
    assert step["status"] == "committed" and step["attempts"] == 1
    assert (step["reconciled"]["by"], step["reconciled"]["answer"]) == ("hook", "happened")
    assert len((world / "ledger").read_text().splitlines()) == 1
