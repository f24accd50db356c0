"""Replay beyond call ids and results (issue 27): fresh call ids, failed steps the task went past,
host cancels the task body catches, host timeouts, and ids reused for another call.

Side effects are counted in a ledger (a module-level Counter the tools add to); every run's store
is checked afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import anyio
import pytest

import haltwise
from haltwise import State, StepStatus
from toolkit import Gate

pytestmark = pytest.mark.anyio

#: (tool, argument) -> how often the effect happened
ledger: Counter[tuple[str, object]] = Counter()
#: what the tasks below decide by, per test
plan: dict[str, object] = {}


async def check_store(url: str) -> None:
    report = await anyio.to_thread.run_sync(haltwise.verify_store, url)
    assert report.ok, report.findings


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ledger.clear()
    plan.clear()


class MailBounced(Exception):
    """A tool's own error type, found by name in this module when replayed."""


@haltwise.tool(cancel="finish", effect="external")
async def charge(amount: int) -> str:
    ledger["charge", amount] += 1
    return f"charged {amount}"


@haltwise.tool(cancel="finish", effect="external")
async def send(to: str) -> str:
    ledger["send", to] += 1
    if plan.get("bounce") == to:
        raise MailBounced(f"{to} bounced")
    if plan.get("refuse") == to:
        raise ValueError(f"{to} refused")
    return f"sent to {to}"


# -- fresh call ids ---------------------------------------------------------------------------


@haltwise.task(name="identity:fresh_ids")
async def fresh_ids() -> list[str]:
    """As a framework whose model gives every call a new id each time it is asked."""
    done = []
    for amount in (5, 5, 7):
        with haltwise.call_id(f"call_{uuid.uuid4().hex}"):
            done.append(await charge(amount))
    if plan.pop("fail_after", None):
        raise RuntimeError("the agent loop broke")
    return done


async def test_a_fresh_call_id_replays_the_committed_call_of_the_same_tool_and_arguments(
    store_url: str,
) -> None:
    plan["fail_after"] = True
    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(fresh_ids, task_id="f1")).outcome()
        assert failed.state is State.FAILED
        resumed = await (await rt.resume("f1")).outcome()
    assert resumed.state is State.COMPLETED, resumed
    assert resumed.result == ["charged 5", "charged 5", "charged 7"]
    assert ledger == {("charge", 5): 2, ("charge", 7): 1}, "no committed call is made again"
    assert [step.tool for step in resumed.steps] == ["charge"] * 3, "no new step"
    await check_store(store_url)


@haltwise.task(name="identity:other_arguments")
async def other_arguments() -> str:
    with haltwise.call_id(f"call_{uuid.uuid4().hex}"):
        done = await charge(int(str(plan["amount"])))
    if plan.pop("fail_after", None):
        raise RuntimeError("the agent loop broke")
    return done


async def test_a_fresh_call_id_with_other_arguments_is_a_new_call(store_url: str) -> None:
    plan.update(amount=5, fail_after=True)
    async with haltwise.Runtime(store_url) as rt:
        await (await rt.start(other_arguments, task_id="o1")).outcome()
        plan["amount"] = 6
        resumed = await (await rt.resume("o1")).outcome()
    assert resumed.result == "charged 6"
    assert ledger == {("charge", 5): 1, ("charge", 6): 1}


# -- failed steps the task went past --------------------------------------------------------


@haltwise.task(name="identity:went_past")
async def went_past() -> list[str]:
    seen = []
    try:
        await send("bob")
    except MailBounced as error:
        seen.append(f"bounced: {error}")
    try:
        await send("eve")
    except ValueError as error:
        seen.append(f"refused: {error}")
    seen.append(await send("ann"))
    if plan.pop("fail_after", None):
        raise RuntimeError("the agent loop broke")
    return seen


async def test_a_failed_step_the_task_went_past_replays_its_error(store_url: str) -> None:
    plan.update(bounce="bob", refuse="eve", fail_after=True)
    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(went_past, task_id="w1")).outcome()
        assert failed.state is State.FAILED
        plan.clear()  # the world changed: bob's and eve's mail would go through now
        resumed = await (await rt.resume("w1")).outcome()
    assert resumed.state is State.COMPLETED, resumed
    assert resumed.result == ["bounced: bob bounced", "refused: eve refused", "sent to ann"]
    assert ledger == {("send", "bob"): 1, ("send", "eve"): 1, ("send", "ann"): 1}
    assert [step.status for step in resumed.steps] == [
        StepStatus.FAILED,
        StepStatus.FAILED,
        StepStatus.COMMITTED,
    ]
    await check_store(store_url)


@haltwise.task(name="identity:went_past_fresh_ids")
async def went_past_fresh_ids() -> list[str]:
    """As a framework whose model gives every call a new id: the failed call, then its retry."""
    seen = []
    for _ in range(2):
        try:
            with haltwise.call_id(f"call_{uuid.uuid4().hex}"):
                seen.append(await send("bob"))
                break
        except MailBounced as error:
            seen.append(f"bounced: {error}")
            plan.pop("bounce", None)  # the server takes the next one
    if plan.pop("fail_after", None):
        raise RuntimeError("the agent loop broke")
    return seen


async def test_a_failed_call_under_a_fresh_id_replays_its_error(store_url: str) -> None:
    plan.update(bounce="bob", fail_after=True)
    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(went_past_fresh_ids, task_id="wf")).outcome()
        assert failed.state is State.FAILED
        resumed = await (await rt.resume("wf")).outcome()
    assert resumed.result == ["bounced: bob bounced", "sent to bob"], resumed
    assert ledger == {("send", "bob"): 2}, "the failed call and its retry, each once"


@haltwise.task(name="identity:ends_on_error")
async def ends_on_error() -> str:
    try:
        await send("bob")
    except MailBounced:
        pass
    return await send("eve")


async def test_only_the_step_whose_error_ended_the_run_runs_again(store_url: str) -> None:
    plan.update(bounce="bob", refuse="eve")
    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(ends_on_error, task_id="e1")).outcome()
        assert failed.state is State.FAILED and failed.error is not None
        assert failed.error.type == "ValueError"
        plan.clear()
        resumed = await (await rt.resume("e1")).outcome()
    assert resumed.state is State.COMPLETED and resumed.result == "sent to eve"
    assert ledger == {("send", "bob"): 1, ("send", "eve"): 2}


# -- host cancels and timeouts ---------------------------------------------------------------

body_task: list[asyncio.Task[object]] = []
waiting = Gate()


@haltwise.task(name="identity:catches_host_cancel")
async def catches_host_cancel() -> str:
    await charge(1)
    task = asyncio.current_task()
    assert task is not None
    body_task.append(task)
    try:
        waiting.set()
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "caught it"
    return "never"


async def test_a_host_cancel_the_body_catches_still_cancels_the_run(store_url: str) -> None:
    global waiting
    waiting = Gate()
    body_task.clear()
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(catches_host_cancel, task_id="h1")
        await waiting.wait()
        body_task[0].cancel()
        outcome = await handle.outcome()
        assert outcome.state is State.CANCELLED, outcome
        assert outcome.reason == "host"
        # The host's cancel did not escape into the runtime: it runs the next run.
        after = await (await rt.start(fresh_ids, task_id="h2")).outcome()
        assert after.state is State.COMPLETED
    await check_store(store_url)


@haltwise.task(name="identity:timed_out")
async def timed_out(how: str) -> str:
    await charge(2)
    never = asyncio.Event()
    if how == "wait_for":
        await asyncio.wait_for(never.wait(), timeout=0.01)
    elif how == "asyncio":
        async with asyncio.timeout(0.01):
            await never.wait()
    else:
        with anyio.fail_after(0.01):
            await never.wait()
    return "never"


@pytest.mark.parametrize("how", ["wait_for", "asyncio", "anyio"])
async def test_a_host_timeout_leaving_the_body_cancels_the_run(store_url: str, how: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(timed_out, how, task_id="t1")).outcome()
    assert outcome.state is State.CANCELLED, outcome
    assert outcome.reason == "timeout"
    assert outcome.error is None


@haltwise.tool(cancel="interruptible", effect="read")
async def slow_index() -> str:
    raise TimeoutError("the index did not answer")


@haltwise.task(name="identity:tool_timed_out")
async def tool_timed_out() -> str:
    return await slow_index()


async def test_a_tools_own_timeout_error_fails_the_run(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(tool_timed_out, task_id="t2")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error == haltwise.ErrorInfo("TimeoutError", "the index did not answer")


# -- cancel_error of an earlier attempt -----------------------------------------------------


@haltwise.task(name="identity:raises_while_cancelling")
async def raises_while_cancelling() -> str:
    await charge(3)
    if plan.pop("stop", None):
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("cleanup broke") from None
    return "done"


async def test_cancel_error_is_cleared_when_a_resume_completes_the_run(store_url: str) -> None:
    global waiting
    waiting = Gate()
    plan["stop"] = True
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(raises_while_cancelling, task_id="c1")
        await waiting.wait()
        await handle.cancel()
        cancelled = await handle.outcome()
        assert cancelled.state is State.CANCELLED
        assert cancelled.cancel_error == haltwise.ErrorInfo("ValueError", "cleanup broke")
        resumed = await (await rt.resume("c1")).outcome()
        assert resumed.state is State.COMPLETED
        assert resumed.cancel_error is None
    assert ledger == {("charge", 3): 1}


# -- a task_id that exists ---------------------------------------------------------------------


async def test_an_existing_id_with_other_inputs_or_task_is_refused(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        first = await (await rt.start(timed_out, "anyio", task_id="k1")).outcome()
        again = await rt.start(timed_out, "anyio", task_id="k1")
        assert (await again.outcome()) == first, "the same call: the existing run's handle"
        with pytest.raises(haltwise.IdempotencyConflictError, match=r"'k1'.*other inputs"):
            await rt.start(timed_out, "wait_for", task_id="k1")
        with pytest.raises(haltwise.IdempotencyConflictError, match=r"'k1'.*another task"):
            await rt.start(fresh_ids, task_id="k1")
        with pytest.raises(haltwise.IdempotencyConflictError):
            await rt.submit(timed_out, ("asyncio",), task_id="k1")
        assert (await rt.submit(timed_out, ("anyio",), task_id="k1")) == ("k1", False)
    assert ledger == {("charge", 2): 1}
    await check_store(store_url)
