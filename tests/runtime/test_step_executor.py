"""The step executor without a Runtime: a real SQLite store and a run built from the narrow
protocol a run needs of its runtime (``RunHost``).

``StoreHost`` is not a stand-in for the thing under test: it is a second, minimal implementation
of that protocol (a cancel is recorded in the store and delivered to the run, as the Runtime
does; one run, no children). The task body is run by ``ending.call_task`` and ended by
``ending.finish``, the calls the Runtime makes; every step goes through ``steps.execute_step``
and is checked in the journal the store wrote, then with ``haltwise check``'s own checker.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import State, StepStatus
from haltwise._journal import open_store
from haltwise._journal.owner import new_owner
from haltwise._journal.store import NewRun, Store
from haltwise._runtime.ending import call_task, finish
from haltwise._runtime.run_context import ChildHandle, RunContext
from haltwise._runtime.steps import execute_step
from haltwise._runtime.tool import OnCancel, Task

pytestmark = pytest.mark.anyio

calls: Counter[str] = Counter()
owner = new_owner()
#: set once ``wanted`` tool bodies are inside (wait_forever, charge)
inside = anyio.Event()
wanted = [1]
#: what the first attempt of ``writes_then_fail`` raises at its end (None: nothing)
failure: list[Exception] = []
#: the task each ``charge`` body ran in
charged_in: list[asyncio.Task[Any] | None] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global inside
    calls.clear()
    failure.clear()
    charged_in.clear()
    wanted[:] = [1]
    inside = anyio.Event()


def enter(name: str) -> None:
    calls[name] += 1
    if sum(calls[tool] for tool in ("wait_forever", "charge")) >= wanted[0]:
        inside.set()


class StoreHost:
    """A RunHost over a store alone: one run, cancels recorded and delivered here."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs: dict[str, RunContext] = {}
        self.side_steps = 0
        self.most_side_steps = 0

    @property
    def active_runs(self) -> int:
        return len(self.runs)

    def count_side_steps(self, delta: int) -> None:
        self.side_steps += delta
        self.most_side_steps = max(self.most_side_steps, self.side_steps)
        self.store.set_concurrency(len(self.runs) + self.side_steps)

    async def cancel(self, task_id: str, *, reason: str, force: bool = False) -> object:
        record = await self.store.request_cancel(task_id, reason, force=force)
        run = self.runs.get(task_id)
        if run is not None and record.state is State.CANCELLING:
            run.request_cancel(reason, force=force)
        return record

    async def start_child(self, *args: Any) -> ChildHandle:
        raise AssertionError("no child runs here")


@haltwise.tool(cancel="finish", effect="write")
async def write(text: str) -> str:
    calls["write"] += 1
    return text.upper()


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_forever() -> None:
    enter("wait_forever")
    await anyio.sleep_forever()


@haltwise.tool(cancel="finish", effect="external")
async def charge(amount: int) -> int:
    enter("charge")
    charged_in.append(asyncio.current_task())
    await anyio.sleep(0.05)  # the cancel arrives meanwhile: a finish step runs to its end
    return amount


async def three_writes() -> list[str]:
    written = [await write("a"), await write("b"), await write("c")]
    if failure:
        raise failure.pop()
    return written


async def two_at_once() -> list[Any]:
    return list(await asyncio.gather(wait_forever(), charge(7)))


async def write_then_wait() -> None:
    await write("a")
    await wait_forever()


async def charged() -> int:
    return await charge(5)


async def open_run(tmp_path: Path, fn: Any, run_id: str = "r1") -> tuple[StoreHost, RunContext]:
    store = open_store(url_in(tmp_path))
    await store.open()
    await store.create_run(
        NewRun(id=run_id, task=fn.__name__, inputs={}, state=State.RUNNING, owner=owner)
    )
    host = StoreHost(store)
    run = context(host, fn, run_id, owner.token, None)
    return host, run


def context(host: StoreHost, fn: Any, run_id: str, fence: str, snapshot: Any) -> RunContext:
    task = Task(fn, OnCancel.KEEP, fn.__name__, register=False)
    run = RunContext.for_snapshot(
        snapshot,
        run_id=run_id,
        task=task,
        host=host,
        execute=execute_step,
        store=host.store,
        fence=fence,
    )
    host.runs[run_id] = run
    return run


async def drive(run: RunContext) -> haltwise.Outcome:
    """Run the body and end the run by the calls the Runtime's _drive makes (with no callback
    for the final write, which is then always returned to be awaited)."""
    written = await finish(run, await call_task(run, {}))
    assert written is not None
    await written
    return (await run.store.load(run.run_id)).outcome()


def url_in(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/haltwise.db"


async def checked(store: Store, tmp_path: Path) -> None:
    await store.close()
    report = await anyio.to_thread.run_sync(haltwise.verify_store, url_in(tmp_path))
    assert report.ok, report.findings


async def attempt_again(host: StoreHost, run: RunContext, fn: Any) -> RunContext:
    """A second attempt of a failed run, from its journal (as a resume makes it)."""
    lease = time.time() + 60
    assert await host.store.claim(run.run_id, owner, lease_until=lease, expected_owner=None)
    await host.store.transition(
        run.run_id, State.RUNNING, expected={State.FAILED}, fence=run.fence, reason=None
    )
    snapshot = await host.store.load(run.run_id)
    return context(host, fn, run.run_id, run.fence, snapshot)


async def test_steps_are_journaled_and_replayed_without_a_runtime(tmp_path: Path) -> None:
    failure.append(RuntimeError("after the steps"))
    host, run = await open_run(tmp_path, three_writes)
    outcome = await drive(run)
    assert outcome.state is State.FAILED
    assert [(s.index, s.tool, s.status, s.result) for s in outcome.steps] == [
        (0, "write", StepStatus.COMMITTED, "A"),
        (1, "write", StepStatus.COMMITTED, "B"),
        (2, "write", StepStatus.COMMITTED, "C"),
    ]
    assert calls["write"] == 3

    # A second attempt from the journal replays every step: no body runs again.
    again = await attempt_again(host, run, three_writes)
    outcome = await drive(again)
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["A", "B", "C"]
    assert calls["write"] == 3
    await checked(host.store, tmp_path)


async def drive_cancelled_inside(host: StoreHost, run: RunContext) -> haltwise.Outcome:
    """Drive the run; cancel it (reason ``enough``) once a tool body says it is inside."""

    async def cancel_when_inside() -> None:
        await inside.wait()
        await host.cancel(run.run_id, reason="enough")

    with anyio.fail_after(20):  # (a run that ends before a body is inside fails, not hangs)
        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_inside)
            return await drive(run)


async def test_a_cancel_interrupts_the_step_in_flight(tmp_path: Path) -> None:
    host, run = await open_run(tmp_path, write_then_wait)
    outcome = await drive_cancelled_inside(host, run)
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "enough"
    assert [(s.tool, s.status) for s in outcome.steps] == [
        ("write", StepStatus.COMMITTED),
        ("wait_forever", StepStatus.INTERRUPTED),
    ]
    assert calls == Counter(write=1, wait_forever=1)
    await checked(host.store, tmp_path)


@pytest.mark.parametrize("task_states", ["anyio's", "gone"])
async def test_a_finish_step_runs_to_its_end_through_a_cancel(
    tmp_path: Path, task_states: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With anyio's record of each task's cancel scopes, a finish body the task function awaits
    runs in the task function's own task; were a later anyio to move it (``gone``: what
    ``steps.anyio_task_states`` then answers), in a task of its own, with the same outcome."""
    from haltwise._runtime import steps

    if task_states == "gone":
        monkeypatch.setattr(steps, "ANYIO_TASK_STATES", None)
    host, run = await open_run(tmp_path, charged)
    outcome = await drive_cancelled_inside(host, run)
    assert outcome.state is State.CANCELLED
    assert [(s.tool, s.status, s.result) for s in outcome.steps] == [
        ("charge", StepStatus.COMMITTED, 5)
    ]
    assert calls["charge"] == 1
    assert (charged_in == [asyncio.current_task()]) is (task_states == "anyio's")
    await checked(host.store, tmp_path)


async def test_concurrent_steps_settle_each_by_its_policy(tmp_path: Path) -> None:
    """Two steps beside the task function's own code (a gather): both count as side steps for
    the store's batching, and a cancel settles each by its own policy."""
    wanted[:] = [2]  # cancel once both bodies run
    host, run = await open_run(tmp_path, two_at_once)
    outcome = await drive_cancelled_inside(host, run)
    assert outcome.state is State.CANCELLED
    assert {s.tool: s.status for s in outcome.steps} == {
        "wait_forever": StepStatus.INTERRUPTED,
        "charge": StepStatus.COMMITTED,
    }
    assert calls == Counter(wait_forever=1, charge=1)
    assert host.side_steps == 0  # every side step counted in was counted out
    assert host.most_side_steps == 2
    await checked(host.store, tmp_path)


async def test_changed_arguments_on_replay_are_refused(tmp_path: Path) -> None:
    failure.append(RuntimeError("after the steps"))
    host, run = await open_run(tmp_path, three_writes)
    await drive(run)

    async def other_writes() -> list[str]:
        return [await write("a"), await write("x")]

    outcome = await drive(await attempt_again(host, run, other_writes))
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "NonDeterminismError"
    assert calls["write"] == 3
    await checked(host.store, tmp_path)


async def test_a_tool_outside_a_run_just_runs() -> None:
    assert await write("z") == "Z"
    assert calls["write"] == 1


def test_the_step_path_reads_anyios_record_of_cancel_scopes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``steps`` reads anyio's private record of each task's cancel scopes to run a ``finish``
    body in the task function's own task; were it moved by a later anyio, such bodies would
    still work, silently in a task of their own (slower; the test above runs both): this says
    so, and that the moved record is answered None."""
    import anyio._backends._asyncio as backend

    from haltwise._runtime import steps

    assert steps.ANYIO_TASK_STATES is backend._task_states
    monkeypatch.delattr(backend, "_task_states")
    assert steps.anyio_task_states() is None
