"""A pause of a parent run reaches its child runs, on both stores.

A child run is one step of its parent. Pausing the parent pauses the child (its own step in
flight runs to its end first); the parent, whose only step in flight is that paused child, is
then paused too. Unpausing the parent unpauses the child; cancelling the paused parent cancels
the child with reason ``"parent"``, as a cancel of a running parent does.
"""

from __future__ import annotations

import pytest

import haltwise
import toolkit
from _wait import until
from haltwise import State, StepStatus
from haltwise._journal.check import verify
from haltwise._runtime import lowlevel
from toolkit import wait_for_state

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


@haltwise.task(name="test_pause_children:grandparent")
async def grandparent() -> list[object]:
    first = await toolkit.quick("grand-a")
    inner = await toolkit.parent("charge_async")
    return [first, inner]


async def family(rt: haltwise.Runtime, run_id: str = "p") -> haltwise.TaskHandle:
    """``toolkit.parent``, returned once its child's finish step is in flight."""
    handle = await rt.start(toolkit.parent, "charge_async", task_id=run_id)
    await toolkit.entered.wait()
    return handle


async def relayed(rt: haltwise.Runtime, child_id: str) -> None:
    """Wait (with a deadline) until the pause of a parent has been relayed to ``child_id``.

    The relay is the parent's owner's: it records the child's pause request after the parent's
    (one store write per generation), so a child step that ends before it may be followed by
    another step; a test that lets the child go on waits for the relay first."""

    async def requested() -> bool:
        return (await rt.store.load(child_id)).run.pause

    await until(requested, f"the pause relayed to {child_id}")


async def paused_family(rt: haltwise.Runtime, run_id: str = "p") -> haltwise.TaskHandle:
    """:func:`family`, paused; both are paused once that step has ended (returned only then)."""
    handle = await family(rt, run_id)
    record = await rt.pause(run_id)
    assert (record.state, record.pause) == (State.RUNNING, True)
    await relayed(rt, f"{run_id}/1")
    child = await rt.status(f"{run_id}/1")
    assert child.state is State.RUNNING, "the child's step in flight runs to its end first"
    assert (await rt.status(run_id)).state is State.RUNNING, "and the parent waits for it"
    toolkit.release.set()
    await wait_for_state(rt, f"{run_id}/1", State.PAUSED)
    await wait_for_state(rt, run_id, State.PAUSED)
    return handle


async def test_pausing_a_parent_pauses_its_child_and_unpause_goes_on_with_both(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_family(rt)
        parent = await rt.status("p")
        child = await rt.status("p/1")
        assert [s.status for s in parent.steps] == [StepStatus.COMMITTED, StepStatus.RUNNING]
        assert [s.status for s in child.steps] == [StepStatus.COMMITTED] * 2
        report = await verify(rt.store)
        assert report.ok, report.findings
        assert toolkit.calls["quick"] == 2, "no step started while paused"
        record = await rt.unpause("p")
        assert record.state is State.RUNNING
        outcome = await handle.outcome()
        child = await rt.status("p/1")
        report = await verify(rt.store)
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["parent-a", ["child-a", "child-b"], "parent-c"]
    assert child.state is State.COMPLETED
    assert toolkit.calls["charge_async"] == 1
    assert toolkit.calls["quick"] == 3
    assert report.ok, report.findings


async def test_a_cancel_of_a_paused_parent_cancels_its_paused_child(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_family(rt)
        record = await rt.cancel("p", reason="budget")
        assert record.state is State.CANCELLING, "its child step is still to settle"
        outcome = await handle.outcome()
        child = await rt.status("p/1")
        report = await verify(rt.store)
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert outcome.steps[1].status is StepStatus.INTERRUPTED
    assert (child.state, child.reason) == (State.CANCELLED, "parent")
    assert [s.status for s in child.steps] == [StepStatus.COMMITTED] * 2
    assert toolkit.calls["quick"] == 2
    assert report.ok, report.findings


async def test_a_cancel_of_a_paused_parent_nobody_works_cancels_the_child_too(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await paused_family(rt)
        await lowlevel.hand_over(rt)
        runs = [(await rt.store.load(i)).run for i in ("p", "p/1")]
        assert [(r.state, r.owner) for r in runs] == [(State.PAUSED, None)] * 2
    async with haltwise.Runtime(store_url) as other:
        record = await other.cancel("p")
        child = await other.status("p/1")
        report = await verify(other.store)
    assert record.state is State.CANCELLED
    assert (child.state, child.reason) == (State.CANCELLED, "parent")
    assert report.ok, report.findings


async def test_unpause_of_a_handed_over_paused_parent_continues_both(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await paused_family(rt)
        await lowlevel.hand_over(rt)
    async with haltwise.Runtime(store_url) as other:
        await other.unpause("p")
        outcome = await other.outcome("p")
        child = await other.status("p/1")
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["parent-a", ["child-a", "child-b"], "parent-c"]
    assert child.state is State.COMPLETED
    assert toolkit.calls["charge_async"] == 1, "the child's committed step was replayed"


async def test_a_pause_of_the_child_alone_stays_when_the_parent_is_unpaused(
    store_url: str,
) -> None:
    """The relay undoes only the pause it made: a child paused on its own stays paused."""
    async with haltwise.Runtime(store_url) as rt:
        handle = await family(rt)
        await rt.pause("p/1")
        toolkit.release.set()
        await wait_for_state(rt, "p/1", State.PAUSED)
        assert (await rt.status("p")).state is State.RUNNING, "the parent was not paused"
        await rt.pause("p")
        await wait_for_state(rt, "p", State.PAUSED)
        await rt.unpause("p")
        # The relay runs within the unpause of a parent worked here (Runtime.unpause awaits
        # it, as the watcher's tick does): a wrong relay would have unpaused the child, in
        # the journal and in its gate, by the time the unpause returned.
        assert rt.is_paused("p/1")
        await wait_for_state(rt, "p", State.RUNNING)
        assert (await rt.status("p/1")).state is State.PAUSED
        await rt.unpause("p/1")
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED


async def test_a_pause_reaches_a_grandchild(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(grandparent, task_id="g")
        await toolkit.entered.wait()
        await rt.pause("g")
        await relayed(rt, "g/1/1")
        toolkit.release.set()
        for run_id in ("g/1/1", "g/1", "g"):
            await wait_for_state(rt, run_id, State.PAUSED)
        report = await verify(rt.store)
        assert report.ok, report.findings
        await rt.unpause("g")
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["grand-a", ["parent-a", ["child-a", "child-b"], "parent-c"]]
