"""Ctrl-C on a foreground ``haltwise run`` (issue 15, item 7), in real processes.

Two SIGINTs close together used to end in exit 130 or death by SIGINT (the second landing
after the run's signal handling was gone, or while the interpreter shut down), and two SIGINTs
during a CPU-bound stretch of the task were both ignored. Each trial here waits for a marker
file the task writes, then signals; the exit code must be 3 and the journal must say
``cancelled`` every time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _cli_kit import PATIENCE, Env
from _wait import wait_until

AGENT = """
import time
from pathlib import Path

import anyio

import haltwise

HERE = Path(__file__).parent
if (HERE / "slow-import").exists():
    (HERE / "importing").touch()
    time.sleep(1.0)  # a slow import: a signal now must be queued, not lost


@haltwise.tool(cancel="interruptible", effect="read")
async def look(x: str) -> str:
    return x


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_long(x: str) -> str:
    (HERE / "in-step").touch()
    await anyio.sleep(60)
    return x


@haltwise.task
async def gated() -> str:
    await look("x")
    return await wait_long("y")


@haltwise.task
async def burn() -> int:
    await look("x")
    (HERE / "burning").touch()
    total = 0
    for i in range(10**12):  # CPU-bound: no await, the event loop is held
        total += i
    return total
"""


@pytest.fixture
def env(tmp_path: Path) -> Env:
    (tmp_path / "agent.py").write_text(AGENT)
    return Env(tmp_path)


def wait_for_file(path: Path, process: subprocess.Popen[str]) -> None:
    wait_until(path.exists, f"{path.name} appearing", process=process, timeout=PATIENCE)


def interrupt(env: Env, task: str, marker: str, gap: float, run_id: str) -> dict[str, object]:
    (env.root / marker).unlink(missing_ok=True)
    process = env.popen("run", f"agent.py:{task}", "--id", run_id, "--json")
    wait_for_file(env.root / marker, process)
    process.send_signal(signal.SIGINT)
    if gap:
        time.sleep(gap)  # the gap between the two signals is the input under test
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 3, (process.returncode, out, err)
    assert "Traceback" not in err
    outcome: dict[str, object] = json.loads(out)
    assert outcome["state"] == "cancelled"
    return outcome


@pytest.mark.parametrize("gap", [0.0, 0.002, 0.005, 0.01, 0.02, 0.05])
def test_two_quick_sigints_end_cancelled_with_exit_3(env: Env, gap: float) -> None:
    for trial in range(2):
        interrupt(env, "gated", "in-step", gap, f"g{trial}")
    assert env.hw("check").returncode == 0


def test_two_sigints_stop_a_cpu_bound_task(env: Env) -> None:
    outcome = interrupt(env, "burn", "burning", 0.2, "b1")
    assert outcome["reason"] == "user"
    assert env.hw("check").returncode == 0


def test_a_sigint_while_the_file_loads_cancels_the_run_once_it_starts(env: Env) -> None:
    (env.root / "slow-import").touch()
    process = env.popen("run", "agent.py:gated", "--id", "s1", "--json")
    wait_for_file(env.root / "importing", process)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 3, (out, err)
    outcome = json.loads(out)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "user")
    assert not (env.root / "in-step").exists(), "the gated step ran although Ctrl-C came first"
