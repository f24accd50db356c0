"""A native cancel haltwise sends a task it runs in must land there, or never: none lingers.

A ``finish`` body awaited by the task function runs in the task function's own task, and a
cancel cuts it with ``Task.cancel()`` of that task, taken back (``uncancel()``) once the step
has settled. Sent from that very task while it runs (a forced cancel that came between the
step's start and its body: asked by the run itself, or delivered while the step confirmed its
lease), such a cancel lands only at the task's next await. On Python 3.11 and 3.12
``uncancel()`` does not withdraw a cancel that has not landed yet: a body that returns without
awaiting left it pending, to fire at a later, unrelated await, or to end the run's task
cancelled once it returned; anyio's task group then cancelled the whole Runtime, the ``async
with`` block included (found by ``haltwise explore --pause`` on CI: the explorer's wait for a
resumed run's outcome was cancelled "via cancel scope" of the Runtime's task group).
"""

from __future__ import annotations

import anyio
import pytest

import haltwise
from haltwise import State, StepStatus
from haltwise._journal.check import check_store
from haltwise._runtime import lowlevel, run_context

pytestmark = pytest.mark.anyio


@haltwise.tool(cancel="finish", effect="write")
async def quick(text: str) -> str:
    """A finish tool whose body never awaits (it cannot be cut: it ends first)."""
    return text


@haltwise.tool(cancel="interruptible", effect="read")
async def look(text: str) -> str:
    return text


@haltwise.task(name="pending:quick_then_more")
async def quick_then_more() -> str:
    await look("a")
    await quick("b")
    await look("c")
    return "done"


@haltwise.task(name="pending:other")
async def other() -> str:
    await look("x")
    await anyio.sleep(0.01)  # a real await of the task's own, where a lingering cancel lands
    await look("y")
    return "other done"


class ForceBeforeBody:
    """The runtime's test probe: a forced cancel of the run, from the run's own task, after
    step ``index`` started and before its body runs (where the explorer cancels)."""

    def __init__(self, runtime: haltwise.Runtime, run_id: str, index: int) -> None:
        self.runtime, self.run_id, self.index = runtime, run_id, index
        self.fired = False

    async def __call__(self, kind: str, index: int) -> None:
        if (kind, index) == ("during", self.index) and not self.fired:
            self.fired = True
            await self.runtime.cancel(self.run_id, reason="probe", force=True)


async def test_a_forced_cancel_before_a_finish_body_that_never_awaits_leaves_nothing_pending(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run yields between steps at most once per _YIELD_INTERVAL (1 ms): a yield there took
    # the pending cancel (as the run's own). On a machine that ran the step, the cancel request
    # and the settlement within that millisecond (CI), nothing took it before the run's task
    # returned. Here, as there: no yield between steps while this run runs.
    monkeypatch.setattr(run_context, "_YIELD_INTERVAL", 3600.0)
    with anyio.fail_after(60):
        async with haltwise.Runtime(store_url) as runtime:
            probe = ForceBeforeBody(runtime, "forced", 1)
            await lowlevel.launch(runtime, quick_then_more, task_id="forced", probe=probe)
            outcome = await runtime.outcome("forced")
            assert probe.fired
            assert outcome.state is State.CANCELLED, outcome
            assert outcome.reason == "probe"
            assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED] * 2
            # The Runtime and this block are not cancelled: before the fix, the run's task
            # ended cancelled, and its task group's cancel landed at the next await here.
            again = await runtime.start(other, task_id="after")
            assert (await again.outcome()).result == "other done"
            await anyio.sleep(0.01)
            resumed = await runtime.resume("forced")
            assert (await resumed.outcome()).state is State.COMPLETED
        assert (await check_store(store_url)).ok
