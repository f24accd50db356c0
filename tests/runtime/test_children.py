"""Child tasks: one step of the parent, cancelled with it, resumed with it."""

from __future__ import annotations

import pytest

import haltwise
import toolkit
from haltwise import State, StepStatus

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


async def test_a_child_task_is_one_committed_step_of_its_parent(store_url: str) -> None:
    toolkit.release.set()
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(toolkit.parent, "read_async", task_id="p")).outcome()
        child = await rt.status("p/1")
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["parent-a", ["child-a", "child-b"], "parent-c"]
    assert [(s.index, s.tool, s.status) for s in outcome.steps] == [
        (0, "quick", StepStatus.COMMITTED),
        (1, "toolkit:child", StepStatus.COMMITTED),
        (2, "quick", StepStatus.COMMITTED),
    ]
    assert child.state is State.COMPLETED
    assert child.partials == ("child-partial",)
    assert child.task == "toolkit:child"


async def test_cancelling_the_parent_cancels_the_child_and_resume_continues_both(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(toolkit.parent, "read_async", task_id="p")
        await toolkit.entered.wait()
        await handle.cancel()
        outcome = await handle.outcome()
        child = await rt.status("p/1")
        assert outcome.state is State.CANCELLED
        assert outcome.steps[1].status is StepStatus.INTERRUPTED
        assert child.state is State.CANCELLED
        assert child.reason == "parent"
        assert child.steps[1].status is StepStatus.INTERRUPTED
        toolkit.release.set()
        resumed = await (await rt.resume("p")).outcome()
        child = await rt.status("p/1")
    assert resumed.state is State.COMPLETED
    assert resumed.result == ["parent-a", ["child-a", "child-b"], "parent-c"]
    assert child.state is State.COMPLETED
    assert child.partials == ("child-partial",)
    assert toolkit.calls["quick"] == 3, "committed steps of parent and child ran once"
    assert toolkit.calls["read_async"] == 2


async def test_forced_parent_cancel_forces_the_child(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(toolkit.parent, "charge_async", task_id="p")
        await toolkit.entered.wait()
        await handle.cancel(force=True)
        outcome = await handle.outcome()
        child = await rt.status("p/1")
    toolkit.release.set()
    assert outcome.state is State.CANCELLED
    assert child.state is State.CANCELLED
    assert child.steps[1].status is StepStatus.UNKNOWN


async def test_a_failing_child_fails_the_parent_step(store_url: str) -> None:
    @haltwise.task(name="toolkit:bad_child")
    async def bad_child() -> None:
        await toolkit.quick(1)
        raise LookupError("no such page")

    @haltwise.task(name="toolkit:bad_parent")
    async def bad_parent() -> None:
        await bad_child()

    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(bad_parent, task_id="bp")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "ChildRunError"
    assert "LookupError: no such page" in outcome.error.message
    assert outcome.steps[0].status is StepStatus.FAILED
