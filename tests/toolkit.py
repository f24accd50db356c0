"""Tools and tasks the runtime tests drive, with side effects counted per tool.

Gates let a test put a run exactly where it wants it (inside a step, between steps) without
sleeping: a tool announces it is in flight with ``entered``, and waits on ``release``. A test
that uses the module takes the ``fresh_toolkit`` fixture (tests/conftest.py), which resets it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import anyio

import haltwise
from _wait import until_state

calls: Counter[str] = Counter()
compensations: list[tuple[str, Any]] = []
keys: dict[str, list[str]] = {}


class Gate:
    """An event that can be set from any thread and waited for from the loop or a thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float = 10.0) -> None:
        event = asyncio.Event()
        with self._lock:
            if self._event.is_set():
                return
            self._waiters.append((asyncio.get_running_loop(), event))
        with anyio.fail_after(timeout):
            await event.wait()

    def wait_blocking(self, timeout: float = 10.0) -> bool:
        return self._event.wait(timeout)


entered = Gate()
release = Gate()
between = Gate()
go_on = Gate()


def reset() -> None:
    """Forget every count and make fresh gates (the ``fresh_toolkit`` fixture, before a test)."""
    global entered, release, between, go_on
    calls.clear()
    compensations.clear()
    keys.clear()
    entered, release, between, go_on = Gate(), Gate(), Gate(), Gate()


async def wait_for_state(
    rt: haltwise.Runtime, run_id: str, state: haltwise.State, timeout: float = 20.0
) -> haltwise.Outcome:
    """Wait until the journal has the run in ``state`` (``_wait.until_state``)."""
    return await until_state(rt, run_id, state, timeout)


def undo(name: str) -> Any:
    def compensation(*args: Any, **kwargs: Any) -> None:
        compensations.append((name, args))

    return compensation


async def _hold(name: str, value: Any) -> Any:
    calls[name] += 1
    keys.setdefault(name, []).append(haltwise.idempotency_key())
    entered.set()
    await release.wait(timeout=30)
    return value


def _hold_blocking(name: str, value: Any) -> Any:
    calls[name] += 1
    keys.setdefault(name, []).append(haltwise.idempotency_key())
    entered.set()
    release.wait_blocking(timeout=30)
    return value


@haltwise.tool(cancel="interruptible", effect="read")
async def read_async(value: Any) -> Any:
    return await _hold("read_async", value)


@haltwise.tool(cancel="interruptible", effect="read")
def read_plain(value: Any) -> Any:
    return _hold_blocking("read_plain", value)


@haltwise.tool(cancel="interruptible", effect="read")
def read_polling(value: Any) -> Any:
    calls["read_polling"] += 1
    entered.set()
    while not haltwise.cancel_requested():
        if release.wait_blocking(0.001):
            return value
    raise haltwise.Cancelled()


@haltwise.tool(cancel="finish", effect="external", grace=5.0)
async def charge_async(value: Any) -> Any:
    return await _hold("charge_async", value)


@haltwise.tool(cancel="finish", effect="external", grace=5.0)
def charge_plain(value: Any) -> Any:
    return _hold_blocking("charge_plain", value)


@haltwise.tool(cancel="finish", effect="external", grace=0.05)
async def charge_short_grace(value: Any) -> Any:
    return await _hold("charge_short_grace", value)


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=0.05)
async def charge_idempotent(value: Any) -> Any:
    return await _hold("charge_idempotent", value)


@haltwise.tool(cancel="rollback", effect="write", compensate=undo("write_async"), grace=5.0)
async def write_async(value: Any) -> Any:
    return await _hold("write_async", value)


@haltwise.tool(cancel="rollback", effect="write", compensate=undo("write_plain"), grace=5.0)
def write_plain(value: Any) -> Any:
    return _hold_blocking("write_plain", value)


@haltwise.tool(cancel="rollback", effect="write", grace=5.0)
async def write_no_undo(value: Any) -> Any:
    """rollback with nothing to undo it: audit reports it, a cancel mid-call leaves unknown."""
    return await _hold("write_no_undo", value)


@haltwise.tool
async def undeclared(value: Any) -> Any:
    return await _hold("undeclared", value)


@haltwise.tool(cancel="interruptible", effect="none")
def quick(value: Any) -> Any:
    calls["quick"] += 1
    return value


@haltwise.tool(cancel="rollback", effect="write", compensate=undo("quick_write"))
def quick_write(value: Any) -> Any:
    calls["quick_write"] += 1
    return value


@haltwise.tool(cancel="finish", effect="external")
def quick_external(value: Any) -> Any:
    calls["quick_external"] += 1
    return value


TOOLS = {
    "read_async": read_async,
    "read_plain": read_plain,
    "read_polling": read_polling,
    "charge_async": charge_async,
    "charge_plain": charge_plain,
    "charge_short_grace": charge_short_grace,
    "charge_idempotent": charge_idempotent,
    "write_async": write_async,
    "write_plain": write_plain,
    "write_no_undo": write_no_undo,
    "undeclared": undeclared,
}


@haltwise.task
async def one_step(tool_name: str) -> Any:
    """quick -> (wait at gate) -> the named tool -> quick; emits around each step."""
    first = await quick("a")
    haltwise.emit({"step": 0})
    between.set()
    await go_on.wait(timeout=30)
    middle = await TOOLS[tool_name]("b")
    haltwise.emit({"step": 1})
    last = await quick("c")
    return [first, middle, last]


@haltwise.task
async def three_quick(n: int = 3) -> list[Any]:
    out = []
    for i in range(n):
        out.append(await quick(i))
        haltwise.emit(i)
    return out


@haltwise.task(on_cancel="compensate")
async def saga() -> str:
    await quick_write("first")
    await quick_write("second")
    await quick("read")
    between.set()
    await go_on.wait(timeout=30)
    await haltwise.checkpoint()
    return "never"


@haltwise.task
async def returns_immediately() -> str:
    await quick("x")
    return "done"


@haltwise.task(name="toolkit:child")
async def child(tool_name: str) -> list[Any]:
    first = await quick("child-a")
    haltwise.emit("child-partial")
    second = await TOOLS[tool_name]("child-b")
    return [first, second]


@haltwise.task(name="toolkit:parent")
async def parent(tool_name: str) -> list[Any]:
    before = await quick("parent-a")
    inner = await child(tool_name)
    after = await quick("parent-c")
    return [before, inner, after]
