"""Cancel racing completion: exactly one final state, every time."""

from __future__ import annotations

import random

import anyio
import pytest

import haltwise
import toolkit
from haltwise import State
from haltwise._core.states import TRANSITIONS

pytestmark = pytest.mark.anyio


async def test_cancel_racing_completion_ends_in_exactly_one_final_state(store_url: str) -> None:
    rng = random.Random(7)
    seen = set()
    async with haltwise.Runtime(store_url) as rt:
        for i in range(60):
            handle = await rt.start(toolkit.returns_immediately, task_id=f"race{i}")
            for _ in range(rng.randrange(4)):
                await anyio.lowlevel.checkpoint()
            await handle.cancel(force=rng.random() < 0.3)
            outcome = await handle.outcome()
            seen.add(outcome.state)
            assert outcome.state in (State.COMPLETED, State.CANCELLED)
            events = await rt.store.events(f"race{i}")
            finals = [e for e in events if e.target.is_final]
            assert len(finals) == 1
            for event in events[1:]:
                assert event.source is not None
                assert (event.source, event.target) in TRANSITIONS
            assert (outcome.result == "done") == (outcome.state is State.COMPLETED)
    assert seen, "the race was never run"


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
