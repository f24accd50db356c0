"""The tasks the fleet tests (test_fleet.py) submit, worked by fleet_worker.py processes.

Every tool body records itself in a "world" directory (``$FLEET_WORLD``), so that the tests can
count executions against the journal whatever process ran them and however it ended:

- ``executions``: ``start RUN INDEX PID`` when a tool body begins, ``done RUN INDEX PID`` when it
  returns (a kill -9 between the two leaves only the ``start``), ``undo RUN INDEX PID`` when a
  compensation begins;
- ``charges``: ``RUN INDEX KEY``, the idempotency key each execution of ``charge`` was given.

Each line is one ``write`` to a file opened for appending, so lines from several processes never
interleave, and their order in the file is the order in which they were written.

``RUN`` is the run's own id, handed to the task as its first argument by whoever submits it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio

import haltwise

#: seconds each step of ``fleet:job`` takes (its tool bodies sleep that long)
STEP_DELAY = float(os.environ.get("FLEET_STEP_DELAY", "0.004"))
#: seconds the ``deliver`` step of ``fleet:slow`` takes
SLOW_SECONDS = float(os.environ.get("FLEET_SLOW_SECONDS", "1.0"))
#: the tools of ``fleet:job`` in step order, repeated: step ``i`` calls ``JOB_TOOLS[i % 3]``
JOB_TOOLS = ("look", "charge", "record")


def _world() -> Path:
    return Path(os.environ.get("FLEET_WORLD", "."))


def _log(name: str, line: str) -> None:
    with open(_world() / name, "a") as handle:
        handle.write(line + "\n")


def _start(run: str, index: int) -> None:
    _log("executions", f"start {run} {index} {os.getpid()}")


def _done(run: str, index: int) -> None:
    _log("executions", f"done {run} {index} {os.getpid()}")


def hold_file(run: str) -> Path:
    """While this file exists, run ``run``'s ``look`` bodies wait (a test cancels it there)."""
    return _world() / f"hold-{run.replace('/', '-')}"


async def _while_held(run: str) -> None:
    # The limit only ends a process a failed test left waiting: a passing test lifts the hold
    # long before it, however loaded the machine.
    deadline = time.monotonic() + 600
    while hold_file(run).exists() and time.monotonic() < deadline:
        await anyio.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def look(run: str, index: int) -> int:
    _start(run, index)
    await _while_held(run)
    await anyio.sleep(STEP_DELAY)
    _done(run, index)
    return index


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=10)
async def charge(run: str, index: int) -> str:
    _start(run, index)
    _log("charges", f"{run} {index} {haltwise.idempotency_key()}")
    await anyio.sleep(STEP_DELAY)
    _done(run, index)
    return f"charged-{index}"


@haltwise.tool(cancel="finish", effect="write", grace=10)
async def record(run: str, index: int) -> str:
    """Not idempotent: a crash mid-call leaves it ``unknown`` and the run needs reconciling."""
    _start(run, index)
    await anyio.sleep(STEP_DELAY)
    _done(run, index)
    return f"row-{index}"


JOB_TOOL_FUNCTIONS = {"look": look, "charge": charge, "record": record}


def job_result(steps: int) -> list[object]:
    """What a completed ``fleet:job`` with ``steps`` steps returns."""
    return [[i, f"charged-{i}", f"row-{i}"][i % 3] for i in range(steps)]


@haltwise.task(name="fleet:job")
async def job(run: str, steps: int = 5) -> list[object]:
    results: list[object] = []
    for index in range(steps):
        value = await JOB_TOOL_FUNCTIONS[JOB_TOOLS[index % 3]](run, index)
        haltwise.emit({"index": index})
        results.append(value)
    return results


@haltwise.tool(cancel="finish", effect="external", grace=60)
async def deliver(run: str, index: int) -> str:
    """A long step that must not be repeated (a message sent): ``finish``, not idempotent."""
    _start(run, index)
    await anyio.sleep(SLOW_SECONDS)
    _done(run, index)
    return "delivered"


@haltwise.task(name="fleet:slow")
async def slow(run: str) -> list[object]:
    return [await look(run, 0), await deliver(run, 1), await look(run, 2)]


@haltwise.tool(cancel="interruptible", effect="read")
async def die(run: str, index: int) -> int:
    """SIGKILLs its own process first thing, before the execution record: the kill -9 that
    lands after a step's start is journaled and before its body begins."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("SIGKILL returned")


@haltwise.task(name="fleet:dies")
async def dies(run: str) -> list[object]:
    return [await die(run, 0), await look(run, 1)]


async def unreserve(run: str, index: int) -> None:
    """The compensation of ``reserve``: records itself (``undo RUN INDEX PID`` in
    ``executions``), then waits while the run's hold file exists (a test acts meanwhile)."""
    _log("executions", f"undo {run} {index} {os.getpid()}")
    await _while_held(run)


@haltwise.tool(cancel="rollback", effect="write", compensate=unreserve, grace=10)
async def reserve(run: str, index: int) -> str:
    """Records its start, then, the first time, SIGKILLs its own process: the step is left
    ``running`` by a dead owner, and whoever takes the run over compensates it first. (Run
    again, it returns: a test that sees two starts fails, and its process lives on.)"""
    _start(run, index)
    first = _world() / f"reserved-{run}"
    if not first.exists():
        first.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    _done(run, index)
    return f"reserved-{index}"


@haltwise.task(name="fleet:reserve")
async def reserves(run: str) -> list[object]:
    return [await reserve(run, 0), await look(run, 1)]


@haltwise.task(name="fleet:child")
async def child(run: str) -> list[object]:
    """A child run (its id ``PARENT/0`` is its ``run``): a read, a charge, a row."""
    return [await look(run, 0), await charge(run, 1), await record(run, 2)]


@haltwise.task(name="fleet:parent")
async def parent(run: str) -> list[object]:
    """A parent whose step 0 is child run ``RUN/0`` (``fleet:child``), then a read."""
    return [await child(f"{run}/0"), await look(run, 1)]


def go_file(run: str) -> Path:
    """Run ``run`` of ``fleet:read_then_wait`` returns once this file exists."""
    return _world() / f"go-{run}"


@haltwise.task(name="fleet:read_then_wait")
async def read_then_wait(run: str) -> list[object]:
    """A charge, a held read, then a wait outside any step for its go file: the read's
    settlement (deferred: a read) is the run's last step write before its final transition."""
    done = [await charge(run, 0), await look(run, 1)]
    while not go_file(run).exists():
        await anyio.sleep(0.005)
    return done


TASKS: dict[str, haltwise.Task[..., object]] = {
    "fleet:job": job,
    "fleet:slow": slow,
    "fleet:dies": dies,
    "fleet:reserve": reserves,
    "fleet:child": child,
    "fleet:parent": parent,
    "fleet:read_then_wait": read_then_wait,
}
