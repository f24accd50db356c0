"""Tools of every policy that a test runs concurrently, each with its own gate and counters.

Every tool announces it is in flight (``entered[name]``) and waits for ``release`` (shared), so
a test can cancel while all of them are mid-call. Side effects are counted per tool:
``calls`` (body started), ``done`` (body reached its end), ``undone`` (compensations).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import anyio

import haltwise
from toolkit import Gate

calls: Counter[str] = Counter()
done: Counter[str] = Counter()
undone: Counter[str] = Counter()
entered: dict[str, Gate] = {}
release = Gate()

NAMES = (
    "look",
    "look_plain",
    "charge",
    "charge_plain",
    "write",
    "write_plain",
    "undeclared",
)
#: what a plain cancel mid-call leaves, by tool
SETTLED = {
    "look": haltwise.StepStatus.INTERRUPTED,
    "look_plain": haltwise.StepStatus.INTERRUPTED,
    "charge": haltwise.StepStatus.COMMITTED,
    "charge_plain": haltwise.StepStatus.COMMITTED,
    "write": haltwise.StepStatus.COMPENSATED,
    "write_plain": haltwise.StepStatus.COMPENSATED,
    "undeclared": haltwise.StepStatus.COMMITTED,
}
#: tools that go on after a cancel and need ``release`` to end
FINISHING = ("charge", "charge_plain", "undeclared", "write_plain")


def reset() -> None:
    global release
    calls.clear()
    done.clear()
    undone.clear()
    entered.clear()
    entered.update({name: Gate() for name in NAMES})
    release = Gate()


reset()


async def _hold(name: str, value: Any) -> Any:
    calls[name] += 1
    entered[name].set()
    await release.wait(timeout=30)
    done[name] += 1
    return f"{name}-{value}"


def _hold_plain(name: str, value: Any) -> Any:
    calls[name] += 1
    entered[name].set()
    release.wait_blocking(timeout=30)
    done[name] += 1
    return f"{name}-{value}"


def _undo(name: str) -> Any:
    def compensation(value: Any) -> None:
        undone[name] += 1

    return compensation


@haltwise.tool(cancel="interruptible", effect="read")
async def look(value: Any) -> Any:
    return await _hold("look", value)


@haltwise.tool(cancel="interruptible", effect="read")
def look_plain(value: Any) -> Any:
    return _hold_plain("look_plain", value)


@haltwise.tool(cancel="finish", effect="external", grace=20)
async def charge(value: Any) -> Any:
    return await _hold("charge", value)


@haltwise.tool(cancel="finish", effect="external", grace=20)
def charge_plain(value: Any) -> Any:
    return _hold_plain("charge_plain", value)


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo("write"), grace=20)
async def write(value: Any) -> Any:
    return await _hold("write", value)


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo("write_plain"), grace=20)
def write_plain(value: Any) -> Any:
    return _hold_plain("write_plain", value)


@haltwise.tool
async def undeclared(value: Any) -> Any:
    return await _hold("undeclared", value)


TOOLS = {name: globals()[name] for name in NAMES}


async def wait_all_entered(names: tuple[str, ...] = NAMES, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        for name in names:
            await entered[name].wait(timeout)


def wait_all_entered_blocking(names: tuple[str, ...] = NAMES, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        assert entered[name].wait_blocking(max(0.0, deadline - time.monotonic())), name
