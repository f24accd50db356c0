"""Pause and unpause in one process, on both stores: in-flight steps end, nothing repeats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import haltwise
import toolkit
from _paths import TESTS
from _wait import until
from haltwise import Retry, State, StepStatus
from haltwise._journal.check import verify
from haltwise._runtime import lowlevel
from toolkit import wait_for_state

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]

HERE = TESTS


async def in_flight(rt: haltwise.Runtime, tool: str, run_id: str = "p1") -> haltwise.TaskHandle:
    """Start ``one_step`` and return once its step 1 (``tool``) is in flight."""
    handle = await rt.start(toolkit.one_step, tool, task_id=run_id)
    await toolkit.between.wait()
    toolkit.go_on.set()
    await toolkit.entered.wait()
    return handle


async def paused_after_a_step(rt: haltwise.Runtime) -> haltwise.TaskHandle:
    """Run ``p1`` (``one_step`` with a finish step), pause it in that step; return it paused."""
    handle = await in_flight(rt, "charge_async")
    await handle.pause()
    toolkit.release.set()
    await wait_for_state(rt, "p1", State.PAUSED)
    # The journal says paused once the write commits; the runtime marks the run paused when
    # that write's await returns, which may come later (on PostgreSQL another connection sees
    # the commit first).
    await until(lambda: rt.is_paused("p1"), "p1 paused in the runtime")
    return handle


@pytest.mark.parametrize("tool", ["read_async", "charge_async", "write_async", "read_plain"])
async def test_a_step_in_flight_runs_to_its_end_whatever_its_policy(
    store_url: str, tool: str
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await in_flight(rt, tool)
        record = await rt.pause("p1")
        assert (record.state, record.pause) == (State.RUNNING, True)
        snapshot = await rt.store.load("p1")
        assert snapshot.run.state is State.RUNNING, "paused only once the step has ended"
        assert snapshot.steps[1].status is StepStatus.RUNNING
        toolkit.release.set()
        paused = await wait_for_state(rt, "p1", State.PAUSED)
        assert [s.status for s in paused.steps] == [StepStatus.COMMITTED] * 2
        assert toolkit.calls["quick"] == 1, "no step starts while paused"
        await handle.unpause()
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["a", "b", "c"]
    assert toolkit.calls[tool] == 1
    assert toolkit.calls["quick"] == 2
    assert toolkit.compensations == []
    assert outcome.partials == ({"step": 0}, {"step": 1})
    assert [s.attempts for s in outcome.steps] == [1, 1, 1]


async def test_pause_between_steps_lands_at_the_next_checkpoint(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(toolkit.one_step, "charge_async", task_id="p1")
        await toolkit.between.wait()
        await handle.pause()
        toolkit.go_on.set()  # the task goes on to its next checkpoint: before step 1
        paused = await wait_for_state(rt, "p1", State.PAUSED)
        assert len(paused.steps) == 1
        assert toolkit.calls["charge_async"] == 0
        toolkit.release.set()
        await rt.unpause("p1")
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["charge_async"] == 1


async def test_checkpoint_in_the_task_code_waits_while_paused(store_url: str) -> None:
    resumed = anyio.Event()

    @haltwise.task
    async def loop() -> int:
        await toolkit.quick(0)
        toolkit.between.set()
        await toolkit.go_on.wait()
        await haltwise.checkpoint()
        resumed.set()
        return 1

    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(loop, task_id="p1")
        await toolkit.between.wait()
        await handle.pause()
        toolkit.go_on.set()
        await wait_for_state(rt, "p1", State.PAUSED)
        assert not resumed.is_set()
        await handle.unpause()
        assert (await handle.outcome()).result == 1
    assert resumed.is_set()


async def test_outcome_keeps_waiting_through_a_pause(store_url: str) -> None:
    got: list[haltwise.Outcome] = []
    async with haltwise.Runtime(store_url) as rt:
        handle = await in_flight(rt, "charge_async")
        await handle.pause()

        async def wait_outcome() -> None:
            got.append(await handle.outcome())

        async with anyio.create_task_group() as group:
            group.start_soon(wait_outcome)
            toolkit.release.set()
            await wait_for_state(rt, "p1", State.PAUSED)
            await until(lambda: rt.is_paused("p1"), "p1 paused in the runtime")
            # Every task of this loop now waits on something (none is runnable): an outcome()
            # that a pause woke would have returned by now, and it would be the paused run's.
            await anyio.wait_all_tasks_blocked()
            assert got == []
            await handle.unpause()
    assert [o.state for o in got] == [State.COMPLETED], "one outcome, the final one"


async def test_a_cancel_ends_a_paused_run_cancelled_at_once(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_after_a_step(rt)
        record = await rt.cancel("p1", reason="budget")
        assert (record.state, record.reason, record.owner) == (State.CANCELLED, "budget", None)
        outcome = await handle.outcome()
        events = [(e.source, e.target) for e in await rt.store.events("p1")]
        report = await verify(rt.store)
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "budget"
    assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED] * 2
    assert outcome.retry is Retry.RESUME, "the committed charge would repeat on a restart"
    assert toolkit.calls["quick"] == 1
    assert events[-2:] == [(State.RUNNING, State.PAUSED), (State.PAUSED, State.CANCELLED)]
    assert report.ok, report.findings


async def test_a_cancel_before_the_pause_took_effect_wins(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await in_flight(rt, "read_async")
        await handle.pause()
        await handle.cancel()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert outcome.steps[1].status is StepStatus.INTERRUPTED


async def test_unpause_before_the_pause_took_effect_withdraws_it(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await in_flight(rt, "charge_async")
        await handle.pause()
        record = await rt.unpause("p1")
        assert (record.state, record.pause) == (State.RUNNING, False)
        toolkit.release.set()
        outcome = await handle.outcome()
        events = [e.target for e in await rt.store.events("p1")]
    assert outcome.state is State.COMPLETED
    assert State.PAUSED not in events


async def test_pause_of_a_final_or_unknown_run(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        done = await (await rt.start(toolkit.three_quick, task_id="done")).outcome()
        assert done.state is State.COMPLETED
        record = await rt.pause("done")
        assert (record.state, record.pause) == (State.COMPLETED, False)
        record = await rt.unpause("done")
        assert record.state is State.COMPLETED
        with pytest.raises(haltwise.UnknownRunError):
            await rt.pause("missing")
        with pytest.raises(haltwise.UnknownRunError):
            await rt.unpause("missing")


async def test_a_pending_run_pauses_at_its_first_checkpoint(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await rt.submit(toolkit.three_quick, (), {}, task_id="q1")
        record = await rt.pause("q1")
        assert (record.state, record.pause) == (State.PENDING, True)
        await rt.resume("q1")  # what a worker does with a pending run
        paused = await wait_for_state(rt, "q1", State.PAUSED)
        assert paused.steps == ()
        await rt.unpause("q1")
        outcome = await rt.outcome("q1")
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["quick"] == 3


async def test_hand_over_keeps_a_paused_run_paused_and_unpause_continues_it(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await paused_after_a_step(rt)
        assert rt.is_paused("p1")
        await lowlevel.hand_over(rt)
        run = (await rt.store.load("p1")).run
        assert (run.state, run.owner, run.pause) == (State.PAUSED, None, True)
    async with haltwise.Runtime(store_url) as other:
        record = await other.unpause("p1")
        assert record.state is State.RUNNING
        assert record.owner is not None and record.owner.token == other.owner.token
        outcome = await other.outcome("p1")
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["charge_async"] == 1, "the committed step was replayed, not run"
    assert toolkit.calls["quick"] == 2


async def test_a_worker_taking_over_a_paused_run_keeps_it_paused(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await paused_after_a_step(rt)
        await lowlevel.hand_over(rt)
    async with haltwise.Runtime(store_url) as other:
        handle = await lowlevel.adopt(other, "p1", toolkit.one_step)
        assert handle is not None
        # The run's own gate says it waits at its first checkpoint: a takeover that ran on
        # would have gone past it (and completed) instead.
        await until(lambda: other.is_paused("p1"), "p1 waiting in its pause after the takeover")
        snapshot = await other.store.load("p1")
        assert snapshot.run.state is State.PAUSED
        assert snapshot.run.owner is not None and snapshot.run.owner.token == other.owner.token
        assert toolkit.calls["quick"] == 1
        await other.unpause("p1")
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["quick"] == 2


async def test_resume_of_a_paused_run_means_unpause(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await paused_after_a_step(rt)
        again = await rt.resume("p1")
        outcome = await again.outcome()
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["charge_async"] == 1


async def test_a_forced_cancel_of_a_paused_run(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await paused_after_a_step(rt)
        await handle.cancel(force=True)
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED] * 2


async def test_concurrent_runs_pause_independently(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        first = await rt.start(toolkit.one_step, "charge_async", task_id="a")
        await toolkit.between.wait()
        await first.pause()
        toolkit.go_on.set()
        toolkit.release.set()
        second = await (await rt.start(toolkit.three_quick, 20, task_id="b")).outcome()
        await wait_for_state(rt, "a", State.PAUSED)
        await first.unpause()
        outcome = await first.outcome()
    assert (outcome.state, second.state) == (State.COMPLETED, State.COMPLETED)
    assert second.result == list(range(20))


async def test_pause_and_unpause_racing_from_another_process_lose_and_repeat_nothing(
    store_url: str, tmp_path: Path
) -> None:
    """Pause and unpause requests in quick succession, not waiting for either to take effect,
    against a run of trivial steps in another process: it still completes, each step once."""
    agent = subprocess.Popen(
        [sys.executable, str(HERE / "tick_agent.py"), store_url, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    try:
        assert agent.stdout.readline().strip() == "started"
        async with haltwise.Runtime(store_url) as rt:
            for round_ in range(30):
                await rt.pause("ticks")
                if round_ % 3 == 0:
                    await wait_for_state(rt, "ticks", State.PAUSED)
                await rt.unpause("ticks")
            (tmp_path / "stop").touch()
            outcome = await rt.outcome("ticks")
            report = await verify(rt.store)
        assert agent.stdout.readline().strip() == "completed"
    finally:
        agent.kill()
        agent.wait()
    assert outcome.state is State.COMPLETED
    ticked = outcome.result
    assert ticked == len(outcome.steps) > 0
    assert all(step.attempts == 1 for step in outcome.steps)
    assert (tmp_path / "ticks.log").read_text().split() == [str(i) for i in range(ticked)]
    assert report.ok, report.findings
