"""A tool's own TimeoutError is the tool's failure, never a host's timeout (CONTRACT.md, "Cancels
from the host"): also when it is not the latest step's, and when it is replayed on resume."""

from __future__ import annotations

import pytest

import haltwise

pytestmark = pytest.mark.anyio

CALLS: list[int] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def flaky_lookup(n: int) -> int:
    CALLS.append(n)
    if n == 0:
        raise TimeoutError("the index did not answer in time")
    return n


BROKEN: list[bool] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def breaker() -> None:
    if not BROKEN:
        BROKEN.append(True)
        raise ValueError("broken the first time")


@haltwise.task(name="test_host_timeouts:past_a_timeout")
async def past_a_timeout() -> None:
    try:
        await flaky_lookup(0)
    except TimeoutError as first:
        await breaker()  # the first attempt fails here; the resume goes on
        raise first


@haltwise.task(name="test_host_timeouts:second_try_then_reraise")
async def second_try_then_reraise() -> int:
    try:
        await flaky_lookup(0)
    except TimeoutError as first:
        try:
            await flaky_lookup(0)  # tried again: another TimeoutError, the latest step's
        except TimeoutError:
            pass
        raise first
    return 0


async def test_a_tool_timeout_the_task_reraises_after_another_step_fails_the_run(
    store_url: str,
) -> None:
    CALLS.clear()
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(second_try_then_reraise, task_id="t")).outcome()
        assert (outcome.state, outcome.reason) == (haltwise.State.FAILED, None)
        assert outcome.error is not None and outcome.error.type == "TimeoutError"
    assert CALLS == [0, 0]


async def test_a_replayed_tool_timeout_reraised_fails_the_run(store_url: str) -> None:
    CALLS.clear()
    BROKEN.clear()
    async with haltwise.Runtime(store_url) as rt:
        first = await (await rt.start(past_a_timeout, task_id="p")).outcome()
        assert first.state is haltwise.State.FAILED and first.error is not None
        assert first.error.type == "ValueError"
        # resumed: step 0's TimeoutError, which the task went past, is replayed (not run
        # again); step 1 ended the run, runs again and passes; the replayed error re-raised is
        # still the tool's, not a host's timeout
        again = await (await rt.resume("p")).outcome()
    assert (again.state, again.reason) == (haltwise.State.FAILED, None)
    assert again.error is not None and again.error.type == "TimeoutError"
    assert CALLS == [0]
