"""Each cancel policy, with the cancel arriving before, during and after the call."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import pytest

import haltwise
import toolkit
from haltwise import Retry, State, StepStatus
from toolkit import Gate

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]

IN_FLIGHT = {
    # tool -> (status after a plain cancel while it runs, whether the test must release it)
    "read_async": (StepStatus.INTERRUPTED, False),
    "read_plain": (StepStatus.INTERRUPTED, False),
    "read_polling": (StepStatus.INTERRUPTED, False),
    "charge_async": (StepStatus.COMMITTED, True),
    "charge_plain": (StepStatus.COMMITTED, True),
    "undeclared": (StepStatus.COMMITTED, True),
    "write_async": (StepStatus.COMPENSATED, False),
    "write_plain": (StepStatus.COMPENSATED, True),
}


def status_of(outcome: haltwise.Outcome, index: int) -> StepStatus:
    return {step.index: step.status for step in outcome.steps}[index]


async def wait_for_status(
    rt: haltwise.Runtime, run_id: str, index: int, status: StepStatus, timeout: float = 10.0
) -> None:
    """Poll the journal (with a deadline) until step ``index`` has ``status``."""
    with anyio.fail_after(timeout):
        while True:
            steps = (await rt.status(run_id)).steps
            if len(steps) > index and steps[index].status is status:
                return
            await anyio.sleep(0.001)


async def cancelled_between(
    rt: haltwise.Runtime, task: Any, run_id: str, **cancel: Any
) -> haltwise.Outcome:
    """Start ``task`` as ``run_id``, cancel it (``cancel``: the keywords) once it waits for
    ``toolkit.go_on``, let it go on, and return how it ended."""
    handle = await rt.start(task, task_id=run_id)
    await toolkit.between.wait()
    await handle.cancel(**cancel)
    toolkit.go_on.set()
    return await handle.outcome()


async def start_one_step(rt: haltwise.Runtime, tool: str) -> haltwise.TaskHandle:
    handle = await rt.start(toolkit.one_step, tool, task_id="r1")
    await toolkit.between.wait()
    return handle


@pytest.mark.parametrize("tool", sorted(IN_FLIGHT))
async def test_cancel_before_the_call_never_starts_it(store_url: str, tool: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, tool)
        await handle.cancel()
        toolkit.go_on.set()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "user"
    assert toolkit.calls[tool] == 0
    assert [s.index for s in outcome.steps] == [0]
    assert outcome.partials == ({"step": 0},)
    assert outcome.retry is Retry.RESTART


@pytest.mark.parametrize("tool", sorted(IN_FLIGHT))
async def test_cancel_during_the_call_follows_the_policy(store_url: str, tool: str) -> None:
    expected, needs_release = IN_FLIGHT[tool]
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, tool)
        toolkit.go_on.set()
        await toolkit.entered.wait()
        await handle.cancel()
        if needs_release:
            toolkit.release.set()
        outcome = await handle.outcome()
    toolkit.release.set()  # let an abandoned thread end
    assert outcome.state is State.CANCELLED
    assert toolkit.calls[tool] == 1
    assert status_of(outcome, 1) is expected
    assert len(outcome.steps) == 2, "no step may start after the cancel"
    assert outcome.partials == ({"step": 0},)
    if expected is StepStatus.COMPENSATED:
        assert toolkit.compensations == [(tool, ("b",))]
    else:
        assert toolkit.compensations == []
    expected_retry = Retry.RESUME if expected is StepStatus.COMMITTED else Retry.RESTART
    assert outcome.retry is expected_retry


@pytest.mark.parametrize("tool", sorted(IN_FLIGHT))
async def test_cancel_after_the_call_lands_at_the_next_checkpoint(
    store_url: str, tool: str
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, tool)
        toolkit.release.set()
        toolkit.go_on.set()
        outcome = await handle.outcome()
        assert outcome.state is State.COMPLETED
        # A second run of the same task, cancelled after the tool returned:
        toolkit.reset()
        toolkit.release.set()
        handle = await rt.start(toolkit.one_step, tool, task_id="r2")
        await toolkit.between.wait()
        toolkit.go_on.set()
        await wait_for_status(rt, "r2", 1, StepStatus.COMMITTED)
        # Cancel before or after `quick("c")`: either way the committed step stays committed.
        await handle.cancel()
        outcome = await handle.outcome()
    assert outcome.state in (State.CANCELLED, State.COMPLETED)
    assert status_of(outcome, 1) is StepStatus.COMMITTED
    assert toolkit.calls[tool] == 1


async def test_finish_grace_runs_out_the_step_is_unknown(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, "charge_short_grace")
        toolkit.go_on.set()
        await toolkit.entered.wait()
        await handle.cancel()
        outcome = await handle.outcome()
    toolkit.release.set()
    assert outcome.state is State.CANCELLED
    assert status_of(outcome, 1) is StepStatus.UNKNOWN
    assert outcome.retry is Retry.RECONCILE


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("charge_async", StepStatus.UNKNOWN),
        ("charge_plain", StepStatus.UNKNOWN),
        ("undeclared", StepStatus.UNKNOWN),
        ("write_async", StepStatus.UNKNOWN),
        ("read_async", StepStatus.INTERRUPTED),
        ("read_plain", StepStatus.INTERRUPTED),
    ],
)
async def test_forced_cancel_stops_at_once(store_url: str, tool: str, expected: StepStatus) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, tool)
        toolkit.go_on.set()
        await toolkit.entered.wait()
        await handle.cancel(force=True)
        outcome = await handle.outcome()
    toolkit.release.set()
    assert outcome.state is State.CANCELLED
    assert status_of(outcome, 1) is expected
    assert toolkit.compensations == [], "a forced cancel runs no compensation"


async def test_force_after_plain_cancel_cuts_the_grace(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, "charge_async")
        toolkit.go_on.set()
        await toolkit.entered.wait()
        await handle.cancel()
        await handle.cancel(force=True)
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert status_of(outcome, 1) is StepStatus.UNKNOWN
    assert outcome.reason == "user"


@haltwise.tool(cancel="finish", effect="external", grace=120.0)
async def charge_for_long(value: Any) -> Any:
    """A ``finish`` call whose grace outlasts the test: only a forced cancel ends it early."""
    toolkit.entered.set()
    await anyio.sleep(120)
    return value


@haltwise.task(name="policies:charge_for_long")
async def charge_for_long_task() -> None:
    await charge_for_long("x")


async def test_a_forced_cancel_from_another_process_cuts_the_grace_of_a_cancel_acted_on(
    store_url: str,
) -> None:
    """The watcher asks the store only for the news of a run whose cancel it acts on already
    (``cancel_requests(acting=...)``): a forced request recorded by another process is news,
    and must reach the run through the watcher and cut its grace."""
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(charge_for_long_task, task_id="r1")
        await toolkit.entered.wait()
        await handle.cancel()  # plain, delivered here: the call goes on in its grace
        assert (await rt.status("r1")).state is State.CANCELLING
        done = await anyio.run_process(
            [sys.executable, "-m", "haltwise", "cancel", "r1", "--force", "--store", store_url],
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        with anyio.fail_after(60):
            outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert [step.status for step in outcome.steps] == [StepStatus.UNKNOWN]


async def test_deadline_is_a_cancellation_with_reason_deadline(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(toolkit.one_step, "read_async", task_id="d1", deadline=0.3)
        toolkit.go_on.set()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "deadline"
    assert outcome.error is None
    assert status_of(outcome, 1) is StepStatus.INTERRUPTED


async def test_saga_compensates_committed_rollback_steps_in_reverse(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancelled_between(rt, toolkit.saga, "s1")
    assert outcome.state is State.CANCELLED
    assert toolkit.compensations == [("quick_write", ("second",)), ("quick_write", ("first",))]
    assert [s.status for s in outcome.steps] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.COMMITTED,
    ]
    assert outcome.retry is Retry.RESTART


async def test_keep_is_the_default_committed_steps_stay(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await start_one_step(rt, "write_async")
        await handle.cancel()
        toolkit.go_on.set()
        outcome = await handle.outcome()
    assert toolkit.compensations == []
    assert status_of(outcome, 0) is StepStatus.COMMITTED


async def test_shield_lets_cleanup_call_tools_after_a_cancel(store_url: str) -> None:
    seen: list[Any] = []

    @haltwise.task
    async def cleans_up() -> str:
        try:
            toolkit.between.set()
            await toolkit.go_on.wait()  # a cancel lands here, as asyncio's CancelledError
            await haltwise.checkpoint()
        except (haltwise.Cancelled, asyncio.CancelledError):
            async with haltwise.shield(5):
                seen.append(await toolkit.quick("cleanup"))
                await haltwise.checkpoint()
            raise
        return "not cancelled"

    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancelled_between(rt, cleans_up, "c1")
    assert seen == ["cleanup"]
    assert outcome.state is State.CANCELLED
    assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED]
    assert outcome.steps[0].cleanup


async def test_cleanup_steps_are_not_replayed_on_resume(store_url: str) -> None:
    @haltwise.task
    async def tidy() -> list[Any]:
        first = await toolkit.quick("a")
        try:
            between_gate = toolkit.between
            between_gate.set()
            await toolkit.go_on.wait()  # a cancel lands here, as asyncio's CancelledError
            return [first, await toolkit.quick("b")]
        except (haltwise.Cancelled, asyncio.CancelledError):
            async with haltwise.shield(5):
                await toolkit.quick_external("notify")
            raise

    async with haltwise.Runtime(store_url) as rt:
        cancelled = await cancelled_between(rt, tidy, "t")
        assert [(s.index, s.tool, s.cleanup) for s in cancelled.steps] == [
            (0, "quick", False),
            (1, "quick_external", True),
        ]
        resumed = await (await rt.resume("t")).outcome()
    assert resumed.state is State.COMPLETED
    assert resumed.result == ["a", "b"]
    assert [(s.index, s.tool) for s in resumed.steps] == [
        (0, "quick"),
        (1, "quick_external"),
        (2, "quick"),
    ]
    assert toolkit.calls["quick"] == 2 and toolkit.calls["quick_external"] == 1


async def test_cancel_is_level_triggered_and_cannot_be_undone(store_url: str) -> None:
    raised = 0

    @haltwise.task
    async def swallows() -> str:
        nonlocal raised
        toolkit.between.set()
        async with haltwise.shield(30):  # hold the cancel off until the checkpoints
            await toolkit.go_on.wait()
        for _ in range(3):
            try:
                await haltwise.checkpoint()
            except haltwise.Cancelled:
                raised += 1
        return "pretends nothing happened"

    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancelled_between(rt, swallows, "l1", reason="operator said so")
    assert raised == 3
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "operator said so"
    assert outcome.result is None


async def test_error_raised_while_cancelling_is_kept_as_cancel_error(store_url: str) -> None:
    @haltwise.task
    async def breaks_on_cancel() -> str:
        toolkit.between.set()
        async with haltwise.shield(30):  # hold the cancel off until the checkpoint
            await toolkit.go_on.wait()
        try:
            await haltwise.checkpoint()
        except haltwise.Cancelled:
            raise RuntimeError("cleanup failed") from None
        return "x"

    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancelled_between(rt, breaks_on_cancel, "e1")
    assert outcome.state is State.CANCELLED
    assert outcome.error is None
    assert outcome.cancel_error == haltwise.ErrorInfo("RuntimeError", "cleanup failed")


def test_plain_tool_threads_are_gates_not_sleeps() -> None:
    gate = Gate()
    assert not gate.wait_blocking(0.001)
    gate.set()
    assert gate.wait_blocking(0.001)
