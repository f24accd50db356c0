"""The command line's test harness: the agent file, a test directory driven through real
``python -m haltwise`` processes, and the small readers of their answers.

Every tool of ``AGENT`` appends a line to ``effects.log`` when its effect happens, so a test can
count side effects across processes. Gated tools wait for a ``release-NAME`` file, so a test can
hold a step in flight exactly as long as it needs (``Env.wait_for`` polls ``status --json`` with a
deadline instead of sleeping). An ``Env`` works on a SQLite file in the test's directory, or on
the store at its ``url`` (a PostgreSQL database); ``env_on`` makes one for a fixture parametrized
by store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

AGENT = '''
from pathlib import Path

import anyio

import haltwise

HERE = Path(__file__).parent


def effect(name):
    with open(HERE / "effects.log", "a") as log:
        log.write(name + "\\n")


async def until_released(name, limit=600.0):
    # The limit only ends a process a failed test left waiting: a passing test releases the
    # gate long before it, however loaded the machine (30 s was met at load 7).
    gate = HERE / f"release-{name}"
    with anyio.fail_after(limit):
        while not gate.exists():
            await anyio.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> list:
    effect("search")
    return [query + "-a", query + "-b"]


@haltwise.tool(cancel="finish", effect="write")
async def record(text: str) -> str:
    effect("record:" + text)
    return text


@haltwise.tool(cancel="interruptible", effect="read")
async def think(topic: str) -> str:
    await until_released("think")
    effect("think")
    return topic


@haltwise.tool(cancel="finish", effect="external", grace=60)
async def send_email(topic: str) -> str:
    await until_released("send_email")
    effect("send_email")
    return "sent " + topic


@haltwise.tool(cancel="finish", effect="external", grace=0.2)
async def post_message(topic: str) -> str:
    await until_released("post_message")
    effect("post_message")
    return "posted " + topic


def undo_note(topic):
    effect("undo_note")


@haltwise.tool(cancel="rollback", effect="write", compensate=undo_note, grace=5)
async def insert_note(topic: str) -> int:
    effect("insert_note:start")
    await until_released("insert_note")
    effect("insert_note")
    return 1


@haltwise.tool
async def legacy(topic: str) -> str:
    await until_released("legacy")
    effect("legacy")
    return "legacy " + topic


GATED = {
    "interruptible": think,
    "finish": send_email,
    "rollback": insert_note,
    "undeclared": legacy,
    "short": post_message,
}


@haltwise.task
async def flow(policy: str, topic: str = "cats"):
    """search, record, the gated tool of ``policy`` (step 2), record."""
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
    await record(topic)
    result = await GATED[policy](topic)
    await record("done")
    return result


@haltwise.task
async def boom(topic: str = "x"):
    await search(topic)
    raise ValueError("boom: " + topic)
'''

#: How long a test waits for a run to reach a state before it fails (generous: at load 10 one
#: ``haltwise`` process of a test may take 5 s).
PATIENCE = 60.0


@dataclass
class Env:
    """One test's directory: the agent file, its store and its side-effect log.

    The store is the one at ``url`` if given, else the SQLite file ``store.db`` in ``root``.
    """

    root: Path
    url: str = ""

    @property
    def store(self) -> str:
        return self.url or f"sqlite:///{self.root / 'store.db'}"

    @property
    def agent(self) -> str:
        return str(self.root / "agent.py")

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HALTWISE_STORE"] = self.store
        env.pop("COLUMNS", None)
        return env

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "haltwise", *args],
            cwd=self.root,
            env=self.environ(),
            text=True,
            stdout=kwargs.pop("stdout", subprocess.PIPE),
            stderr=kwargs.pop("stderr", subprocess.PIPE),
            **kwargs,
        )

    def hw(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haltwise", *args],
            cwd=self.root,
            env=self.environ(),
            text=True,
            capture_output=True,
            timeout=timeout,
        )

    def release(self, name: str) -> None:
        (self.root / f"release-{name}").touch()

    def effects(self) -> list[str]:
        log = self.root / "effects.log"
        return log.read_text().split() if log.exists() else []

    def status(self, run_id: str) -> dict[str, Any] | None:
        done = self.hw("status", run_id, "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def wait_for(
        self, run_id: str, what: str, predicate: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        deadline = time.monotonic() + PATIENCE
        seen: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            seen = self.status(run_id)
            if seen is not None and predicate(seen):
                return seen
            time.sleep(0.02)
        raise AssertionError(f"run {run_id} never got {what}; last seen: {seen}")

    def wait_in_flight(self, run_id: str, index: int = 2) -> dict[str, Any]:
        return self.wait_for(
            run_id, f"step {index} in flight", lambda s: step_is(s, index, "running")
        )

    def start_flow(self, run_id: str, policy: str, *extra: str) -> subprocess.Popen[str]:
        """Start ``flow`` in the background and return once its gated step 2 is in flight."""
        process = self.popen(
            "run",
            "agent.py:flow",
            "--id",
            run_id,
            "--input",
            json.dumps({"policy": policy}),
            *extra,
        )
        try:
            self.wait_in_flight(run_id)
        except AssertionError:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"run did not start: {out}\n{err}") from None
        return process


def step_is(outcome: dict[str, Any], index: int, status: str) -> bool:
    return any(s["index"] == index and s["status"] == status for s in outcome["steps"])


def statuses(outcome: dict[str, Any]) -> list[str]:
    return [step["status"] for step in outcome["steps"]]


def finish(process: subprocess.Popen[str]) -> tuple[int, dict[str, Any] | str, str]:
    """Wait for a background ``haltwise`` process; parse stdout as JSON when it is JSON."""
    out, err = process.communicate(timeout=PATIENCE)
    try:
        return process.returncode, json.loads(out), err
    except json.JSONDecodeError:
        return process.returncode, out, err


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``haltwise: error:`` line a usage error prints (and nothing on stdout)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("haltwise: error: ")
    assert "Traceback" not in done.stderr
    return lines[0]


# -- the verbs' agent: a saga, a family of runs, a retried and a timed-out step ---------------

#: A saga: two notes (rollback steps, each undone by its compensation), then the gated step.
SAGA = """

def unnote(text):
    effect("undo:" + text)


@haltwise.tool(cancel="rollback", effect="write", compensate=unnote)
async def note(text: str) -> str:
    effect("note:" + text)
    return text


@haltwise.task(on_cancel="compensate")
async def notes():
    await note("one")
    await note("two")
    await think("x")
    await note("three")
    return "done"
"""


#: A parent whose step 1 is a child run with the gated step (the child's step 1).
FAMILY = """

@haltwise.task
async def kid():
    await record("kid")
    return await think("kid")


@haltwise.task
async def family():
    await record("mom")
    inner = await kid()
    await record("after")
    return inner
"""


#: A step retried once (its first attempt fails), then one that times out, caught by the task
#: (needs only ``anyio`` and ``haltwise`` imported before it: the HTTP tests serve it too).
PATIENT = """

FLAKY = []


@haltwise.tool(cancel="interruptible", effect="read", retries=2, backoff=(0, 1, 0))
async def flaky(topic: str) -> str:
    FLAKY.append(topic)
    if len(FLAKY) == 1:
        raise ConnectionError("the first attempt fails")
    return topic


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.05)
async def slow(topic: str) -> str:
    await anyio.sleep(60)
    return topic


@haltwise.task
async def patient(topic: str = "x"):
    got = await flaky(topic)
    try:
        await slow(topic)
    except haltwise.StepTimeoutError:
        return got + " (slow timed out)"
    return got
"""


def env_on(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    """A test directory whose agent file is ``AGENT`` with the verbs' tasks (``SAGA``,
    ``FAMILY``, ``PATIENT``), on the store ``request.param`` names: ``"sqlite"`` (a file in the
    directory) or ``"postgres"`` (a fresh database from the ``pg_url`` fixture)."""
    (tmp_path / "agent.py").write_text(AGENT + SAGA + FAMILY + PATIENT)
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    return Env(tmp_path, url)
