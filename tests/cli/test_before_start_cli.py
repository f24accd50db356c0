"""``haltwise cancel ID --before-start [--ttl]`` (CONTRACT.md, "Command line"): the cancel of an
id no run has yet is remembered (JSON ``"remembered"``), and ``haltwise run`` with that id then
records the run ``cancelled`` at once, exit 3, nothing run (the agent's ledger stays empty)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _paths import TESTS


def test_a_stop_pressed_before_the_run_exists(tmp_path: Path, sqlite_url: str) -> None:
    world = tmp_path / "world"
    world.mkdir()
    (tmp_path / "agent.py").write_text((TESTS / "reconcile_agent.py").read_text())
    env = {**os.environ, "RECONCILE_WORLD": str(world)}

    def hw(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "haltwise", *args, "--store", sqlite_url]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    hw("list")  # the store exists
    pressed = hw("cancel", "o9", "--before-start", "--ttl", "5m", "--reason", "stop", "--json")
    assert pressed.returncode == 0, pressed.stderr
    assert json.loads(pressed.stdout) == {
        "cancelled": [],
        "already_final": [],
        "unknown": [],
        "remembered": ["o9"],
    }
    started = hw("run", "agent.py:order", "--id", "o9", "--input", '{"amount": 1}', "--json")
    assert started.returncode == 3, started.stderr
    outcome = json.loads(started.stdout)
    assert (outcome["state"], outcome["reason"], outcome["steps"]) == ("cancelled", "stop", [])
    assert not (world / "paying").exists(), "nothing of the run ran"
    # an existing id is cancelled as usual (here: already final)
    again = hw("cancel", "o9", "--before-start", "--json")
    assert json.loads(again.stdout)["already_final"] == ["o9"]
    assert json.loads(again.stdout)["remembered"] == []
    bad = hw("cancel", "o8", "--before-start", "--ttl", "soon")
    assert bad.returncode == 2 and "--ttl" in bad.stderr
