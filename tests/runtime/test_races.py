"""Cancel racing completion: exactly one final state, every time."""

from __future__ import annotations

import time

import anyio
import pytest

import haltwise
import toolkit
from haltwise import State, StepStatus
from haltwise._core.states import TRANSITIONS

pytestmark = pytest.mark.anyio


TRIALS = 60


async def test_cancel_racing_completion_ends_in_exactly_one_final_state(store_url: str) -> None:
    """A cancel lands at every moment of a run, from before its first step to after its end.

    The delays are spread over three times the longest of three uncancelled runs (measured
    first, on this machine, as it is loaded now), so the race is run for real: both final
    states occur, and some cancels land while the run is in the middle of its steps (issue 15,
    item 19: the cancel always won before, so the assertions could not fail).
    """
    seen: dict[State, int] = {}
    landed_mid_run = 0
    async with haltwise.Runtime(store_url) as rt:
        durations = []
        for i in range(3):
            began = time.perf_counter()
            await (await rt.start(toolkit.three_quick, 4, task_id=f"calibrate{i}")).outcome()
            durations.append(time.perf_counter() - began)
        span = 3 * max(durations)
        for i in range(TRIALS):
            handle = await rt.start(toolkit.three_quick, 4, task_id=f"race{i}")
            if i:
                await anyio.sleep(span * i / (TRIALS - 1))
            await handle.cancel(force=i % 3 == 0)
            outcome = await handle.outcome()
            seen[outcome.state] = seen.get(outcome.state, 0) + 1
            assert outcome.state in (State.COMPLETED, State.CANCELLED)
            events = await rt.store.events(f"race{i}")
            finals = [e for e in events if e.target.is_final]
            assert len(finals) == 1
            for event in events[1:]:
                assert event.source is not None
                assert (event.source, event.target) in TRANSITIONS
            assert (outcome.result == [0, 1, 2, 3]) == (outcome.state is State.COMPLETED)
            steps_done = sum(step.status is StepStatus.COMMITTED for step in outcome.steps)
            if State.CANCELLING in [e.target for e in events] and 0 < steps_done < 4:
                landed_mid_run += 1
    assert seen.get(State.COMPLETED, 0) > 0 and seen.get(State.CANCELLED, 0) > 0, seen
    assert landed_mid_run > 0, f"no cancel landed between steps: {seen}"


async def test_many_concurrent_runs_all_cancelled(store_url: str) -> None:
    toolkit.reset()
    async with haltwise.Runtime(store_url) as rt:
        handles = [
            await rt.start(toolkit.one_step, "read_async", task_id=f"m{i}") for i in range(50)
        ]
        await toolkit.between.wait()
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(handle.cancel)
        toolkit.go_on.set()
        outcomes = [await handle.outcome() for handle in handles]
    assert {o.state for o in outcomes} == {State.CANCELLED}
