"""A cancel of a paused run, in one process, on both stores: what it settles and who settles it.

A paused run has nothing in flight, so a cancel usually ends it ``cancelled`` at once. Two things
may still be left to settle: an ``on_cancel="compensate"`` task's saga (its committed rollback
steps), and a child run paused with its parent. Then the cancel makes the run ``cancelling``
and whoever works it settles that (the owner, woken in its pause; or, if nobody works the run,
the canceller, as a takeover would) before it is recorded ``cancelled``.
"""

from __future__ import annotations

from typing import Any

import pytest

import haltwise
import toolkit
from haltwise import State, StepStatus
from haltwise._journal.check import verify
from haltwise._runtime import lowlevel
from toolkit import wait_for_state

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


@haltwise.task(on_cancel="compensate", name="test_pause_cancel:notes")
async def notes() -> str:
    """Two committed rollback steps, then a wait between steps (where the pause lands)."""
    await toolkit.quick_write("first")
    await toolkit.quick_write("second")
    await toolkit.quick("read")
    toolkit.between.set()
    await toolkit.go_on.wait(timeout=30)
    await toolkit.quick("after")
    return "done"


@haltwise.task(on_cancel="compensate", name="test_pause_cancel:nothing_to_undo")
async def nothing_to_undo() -> str:
    await toolkit.quick("read")
    toolkit.between.set()
    await toolkit.go_on.wait(timeout=30)
    await toolkit.quick("after")
    return "done"


async def paused_notes(rt: haltwise.Runtime, task: Any = notes) -> haltwise.TaskHandle:
    """Start ``task`` as ``n1`` and return it paused at the checkpoint after its wait."""
    handle = await rt.start(task, task_id="n1")
    await toolkit.between.wait()
    await handle.pause()
    toolkit.go_on.set()
    await wait_for_state(rt, "n1", State.PAUSED)
    return handle


def undone() -> list[tuple[str, Any]]:
    return list(toolkit.compensations)


async def test_a_cancel_of_a_paused_saga_wakes_its_owner_which_runs_the_saga(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_notes(rt)
        assert toolkit.compensations == []
        record = await rt.cancel("n1", reason="budget")
        assert record.state is State.CANCELLING, "the saga is still to run"
        outcome = await handle.outcome()
        events = [(e.source, e.target) for e in await rt.store.events("n1")]
        report = await verify(rt.store)
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert undone() == [("quick_write", ("second",)), ("quick_write", ("first",))]
    assert [s.status for s in outcome.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.COMMITTED,
    ]
    assert toolkit.calls["quick"] == 1, "nothing ran after the pause"
    assert events[-3:] == [
        (State.RUNNING, State.PAUSED),
        (State.PAUSED, State.CANCELLING),
        (State.CANCELLING, State.CANCELLED),
    ]
    assert report.ok, report.findings


async def test_a_cancel_from_another_runtime_reaches_the_paused_owner(store_url: str) -> None:
    """The canceller does not work the run: the owner's watcher delivers it, the owner undoes."""
    async with haltwise.Runtime(store_url) as rt, haltwise.Runtime(store_url) as other:
        handle = await paused_notes(rt)
        record = await other.cancel("n1")
        assert record.state is State.CANCELLING
        assert record.owner is not None and record.owner.token == rt.owner.token
        outcome = await other.outcome("n1")
        assert (await handle.outcome()).state is State.CANCELLED
        report = await verify(rt.store)
    assert outcome.state is State.CANCELLED
    assert undone() == [("quick_write", ("second",)), ("quick_write", ("first",))]
    assert report.ok, report.findings


async def test_a_paused_saga_nobody_works_is_settled_by_the_canceller(store_url: str) -> None:
    """A worker's SIGTERM hands the paused run over; the cancel then runs its saga itself."""
    async with haltwise.Runtime(store_url) as rt:
        await paused_notes(rt)
        await lowlevel.hand_over(rt)
        run = (await rt.store.load("n1")).run
        assert (run.state, run.owner) == (State.PAUSED, None)
    assert toolkit.compensations == []
    async with haltwise.Runtime(store_url) as other:
        record = await other.cancel("n1", reason="gone")
        outcome = await other.status("n1")
        report = await verify(other.store)
    assert (record.state, record.owner) == (State.CANCELLED, None)
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "gone")
    assert undone() == [("quick_write", ("second",)), ("quick_write", ("first",))]
    assert [s.status for s in outcome.steps][:2] == [StepStatus.COMPENSATED] * 2
    assert report.ok, report.findings


async def test_a_forced_cancel_of_a_paused_saga_runs_no_compensation(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_notes(rt)
        await rt.cancel("n1", force=True)
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert toolkit.compensations == []
    assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED] * 3


@pytest.mark.parametrize("task", [nothing_to_undo, toolkit.three_quick], ids=["saga", "keep"])
async def test_a_paused_run_with_nothing_to_settle_is_cancelled_at_once(
    store_url: str, task: Any
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        if task is toolkit.three_quick:
            await rt.submit(task, (), {}, task_id="n1")
            await rt.pause("n1")
            await rt.resume("n1")
            await wait_for_state(rt, "n1", State.PAUSED)
            handle = rt.handle("n1")
        else:
            handle = await paused_notes(rt, task)
        record = await rt.cancel("n1")
        assert (record.state, record.owner) == (State.CANCELLED, None)
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert toolkit.compensations == []


async def test_unpause_after_a_saga_pause_clears_what_the_pause_recorded(store_url: str) -> None:
    """Unpaused and paused again with nothing left to undo... the flag follows the last pause."""
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_notes(rt)
        assert (await rt.store.load("n1")).run.settle_on_cancel
        await rt.unpause("n1")
        outcome = await handle.outcome()
        run = (await rt.store.load("n1")).run
    assert outcome.state is State.COMPLETED
    assert not run.settle_on_cancel and not run.pause
    assert toolkit.compensations == []


async def test_a_bulk_cancel_of_paused_runs_settles_each_as_its_own_cancel_would(
    store_url: str,
) -> None:
    """One transaction for both: the saga goes cancelling (and undoes), the other ends at once."""
    async with haltwise.Runtime(store_url) as rt:
        saga_run = await paused_notes(rt)
        await rt.submit(toolkit.three_quick, (), {}, task_id="k1")
        await rt.pause("k1")
        await rt.resume("k1")
        await wait_for_state(rt, "k1", State.PAUSED)
        batch = await rt.cancel_many(state=State.PAUSED)
        assert sorted(batch.cancelled) == ["k1", "n1"]
        assert batch.states["k1"] is State.CANCELLED
        outcome = await saga_run.outcome()
        report = await verify(rt.store)
    assert outcome.state is State.CANCELLED
    assert undone() == [("quick_write", ("second",)), ("quick_write", ("first",))]
    assert report.ok, report.findings
