"""Reconcile hooks (CONTRACT.md, "Tool policies"): an ``unknown`` step of a tool that can tell
what happened is asked before a resume refuses, after a forced cancel and after kill -9, on both
stores; its answer is journaled with the step and the retry advice follows it.

The tool pays through a fake provider whose ledger is on disk (tests/reconcile_agent.py): the
ledger counts the side effects, and the hook asks it by the step's idempotency key.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import haltwise
import reconcile_agent as agent
from _paths import TESTS
from _wait import until as until_async
from haltwise import Retry, State, StepStatus

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Path]:
    place = tmp_path / "world"
    place.mkdir()
    agent.use_world(place)
    yield place


async def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.01)


async def forced_cancel_mid_call(rt: haltwise.Runtime, world: Path, hold: str) -> haltwise.Outcome:
    """Start the order with the charge held (``hold-before`` or ``hold-after``), force a cancel
    while it is in flight; the step is then ``unknown``."""
    (world / hold).write_text("1")
    handle = await rt.start(agent.order, 42, task_id="o1")
    begun = world / ("charged" if hold == "hold-after" else "paying")
    await until(begun.exists, "the charge to begin")
    await handle.cancel(force=True)
    outcome = await handle.outcome()
    (world / hold).unlink()
    assert outcome.state is State.CANCELLED
    assert outcome.steps[0].status is StepStatus.UNKNOWN
    return outcome


def kill_mid_call(store_url: str, world: Path, hold: str) -> None:
    """Run the order in a subprocess and kill -9 it while the charge is in flight."""
    (world / hold).write_text("1")
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "reconcile_agent.py"), store_url, "o1", str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # held after the charge: wait until the provider has it; before: until the call began
    begun = world / ("charged" if hold == "hold-after" else "paying")
    try:
        deadline = time.monotonic() + 60
        while not begun.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent never began its charge"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    (world / hold).unlink()


@pytest.mark.parametrize("crash", ["forced", "kill"])
async def test_happened_resumes_with_no_second_charge(
    store_url: str, world: Path, crash: str
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        if crash == "forced":
            cancelled = await forced_cancel_mid_call(rt, world, "hold-after")
            assert cancelled.retry is Retry.RESUME, "the hook has not been asked yet"
            assert "reconciled" not in cancelled.steps[0].to_json()
        else:
            kill_mid_call(store_url, world, "hold-after")
            assert len(agent.charges()) == 1
        outcome = await (await rt.resume("o1", task=agent.order)).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["receipt-42", "confirmed receipt-42"]
    assert len(agent.charges()) == 1, "the charge happened once"
    step = outcome.steps[0]
    assert step.status is StepStatus.COMMITTED and step.attempts == 1
    assert step.reconciled is not None
    assert step.to_json()["reconciled"] == {
        "by": "hook",
        "answer": "happened",
        "at": step.reconciled.at,
    }


@pytest.mark.parametrize("crash", ["forced", "kill"])
async def test_not_happened_runs_the_call_again_with_the_same_key(
    store_url: str, world: Path, crash: str
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        if crash == "forced":
            await forced_cancel_mid_call(rt, world, "hold-before")
        else:
            kill_mid_call(store_url, world, "hold-before")
        assert agent.charges() == []
        key = (await rt.status("o1")).steps[0].idempotency_key
        outcome = await (await rt.resume("o1", task=agent.order)).outcome()
    assert outcome.state is State.COMPLETED
    assert agent.charges() == [(key, 42)], "charged once, with the step's own key"
    step = outcome.steps[0]
    assert step.attempts == 2
    assert step.reconciled is not None and step.reconciled.answer == "not_happened"


@pytest.mark.parametrize(("crash", "mode"), [("forced", "none"), ("kill", "raise")])
async def test_a_hook_that_cannot_tell_leaves_the_step_unknown(
    store_url: str, world: Path, crash: str, mode: str
) -> None:
    (world / "hook").write_text(mode)
    async with haltwise.Runtime(store_url) as rt:
        if crash == "forced":
            await forced_cancel_mid_call(rt, world, "hold-after")
        else:
            kill_mid_call(store_url, world, "hold-after")
        with pytest.raises(haltwise.ResumeRefusedError) as refused:
            await rt.resume("o1", task=agent.order)
        assert refused.value.steps == ((0, "pay_for_order"),)
        after = await rt.status("o1")
        step = after.steps[0]
        assert step.status is StepStatus.UNKNOWN
        assert step.reconciled is not None and step.reconciled.by == "hook"
        assert step.reconciled.answer == "unknown"
        assert after.retry is Retry.RECONCILE, "a hook that could not tell counts as none"
        listed = await rt.list_runs()
        assert [row.retry for row in listed.runs] == [Retry.RECONCILE]
        # the operator's word is journaled too
        (world / "hook").write_text("ledger")
        outcome = await (
            await rt.resume("o1", task=agent.order, assume_done={0: "receipt-42"})
        ).outcome()
    assert outcome.state is State.COMPLETED
    assert len(agent.charges()) == 1
    answered = outcome.steps[0].reconciled
    assert answered is not None and (answered.by, answered.answer) == ("operator", "happened")


async def test_the_listing_says_resume_while_a_hook_waits(store_url: str, world: Path) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await forced_cancel_mid_call(rt, world, "hold-after")
        listed = await rt.list_runs()
        assert [row.retry for row in listed.runs] == [Retry.RESUME]
        assert [row.progress for row in listed.runs] == [None], "counted only when asked"
        counted = await rt.list_runs(progress=True)
        assert [row.progress for row in counted.runs] == [(0, 1)], "(committed, journaled)"
        outcome = await rt.reconcile("o1")
        assert outcome.steps[0].status is StepStatus.COMMITTED
        assert outcome.state is State.CANCELLED, "reconcile resumes nothing"
        assert outcome.retry is Retry.RESUME
        counted = await rt.list_runs(progress=True)
        assert [row.progress for row in counted.runs] == [(1, 1)]


HOOK_CALLS: list[int] = []
GATES: dict[str, anyio.Event] = {}


def ask_the_provider(amount: int) -> haltwise.Happened:
    HOOK_CALLS.append(amount)
    return haltwise.Happened(f"paid {amount}")


@haltwise.tool(cancel="finish", effect="external", grace=0.05, reconcile=ask_the_provider)
async def pay_with_a_short_grace(amount: int) -> str:
    await GATES["pay"].wait()
    return f"paid {amount}"


@haltwise.tool(cancel="finish", effect="external", grace=600)
async def notify_with_a_long_grace(text: str) -> str:
    await GATES["notify"].wait()
    return text


@haltwise.task(name="reconcile_test:pay_and_notify")
async def pay_and_notify() -> list[str]:
    return list(await asyncio.gather(pay_with_a_short_grace(3), notify_with_a_long_grace("paid")))


async def test_reconcile_refuses_a_run_still_active_and_asks_no_hook(store_url: str) -> None:
    """A run still ``cancelling`` (one step ran out of grace: ``unknown``; another still
    finishing) is its owner's to settle: ``reconcile`` from another runtime refuses in one
    line (RunOwnedError: HTTP 409) and calls no hook (it used to call them all and journal
    nothing: the run is held);
    once the run is final, it asks."""
    HOOK_CALLS.clear()
    GATES.update(pay=anyio.Event(), notify=anyio.Event())
    async with haltwise.Runtime(store_url) as rt, haltwise.Runtime(store_url) as other:
        handle = await rt.start(pay_and_notify, task_id="a1")

        async def both_running() -> bool:
            return len((await rt.status("a1")).steps) == 2

        await until_async(both_running, "both calls in flight")
        await handle.cancel()

        async def pay_unknown() -> bool:
            return (await rt.status("a1")).steps[0].status is StepStatus.UNKNOWN

        await until_async(pay_unknown, "the short grace to run out")
        assert (await rt.status("a1")).state is State.CANCELLING
        try:
            with pytest.raises(haltwise.RunOwnedError, match="held by a live owner"):
                await other.reconcile("a1", task=pay_and_notify)
            assert HOOK_CALLS == [], "no hook asked about a run another owner holds"
        finally:
            GATES["notify"].set()  # (a failed check must not leave a 600 s grace to wait out)
        assert (await handle.outcome()).state is State.CANCELLED
        after = await other.reconcile("a1", task=pay_and_notify)
    assert HOOK_CALLS == [3]
    assert after.steps[0].status is StepStatus.COMMITTED


ANSWERS: dict[int, haltwise.Happened | None] = {}


def ask_the_ledger(amount: int) -> haltwise.Happened | None:
    return ANSWERS.get(amount)


@haltwise.tool(cancel="finish", effect="external", grace=30, reconcile=ask_the_ledger)
async def charge_held(amount: int) -> str:
    await GATES["held"].wait()
    return f"charged {amount}"


@haltwise.tool(cancel="finish", effect="external", grace=30)
async def post_held(text: str) -> str:
    await GATES["held"].wait()
    return text


@haltwise.tool(cancel="interruptible", effect="write")
async def write_row(text: str) -> str:
    return text


@haltwise.tool(cancel="interruptible", effect="read")
async def read_held(text: str) -> str:
    await GATES["held"].wait()
    return text


@haltwise.task(name="reconcile_test:advice")
async def advice_case(case: str) -> str:
    if case == "hooked":
        return await charge_held(1)
    if case == "hook-none":
        return await charge_held(2)
    if case == "unhooked":
        return await post_held("x")
    if case == "committed":
        await write_row("x")
    if case == "done":
        return await write_row("y")
    return await read_held(case)


async def test_the_listing_and_status_give_the_same_advice(store_url: str) -> None:
    """The retry rule lives in ``_core/outcome.advice`` and is restated in the listing's SQL
    (``operator_sql``: unknown without a hook, a hook not yet asked, a repeat): every case of it,
    listed and read one by one, gives the same advice (the reviewer's finding 8)."""
    GATES["held"] = anyio.Event()
    ANSWERS.clear()
    ANSWERS[2] = None  # the hook cannot tell: counts as no hook
    cases = ["hooked", "hook-none", "unhooked", "committed", "read", "done"]
    async with haltwise.Runtime(store_url) as rt:
        for case in cases:
            handle = await rt.start(advice_case, case, task_id=case)
            if case == "done":
                await handle.outcome()
                continue

            async def in_flight(case: str = case) -> bool:
                steps = (await rt.status(case)).steps
                return bool(steps) and steps[-1].status is StepStatus.RUNNING

            await until_async(in_flight, f"{case}: its last call in flight")
            await handle.cancel(force=True)
            assert (await handle.outcome()).state is State.CANCELLED
        await rt.reconcile("hook-none")  # answered None: counts as no hook
        listed = {row.id: row.retry for row in (await rt.list_runs()).runs}
        one_by_one = {case: (await rt.status(case)).retry for case in cases}
        GATES["held"].set()
    assert listed == one_by_one
    assert one_by_one == {
        "hooked": Retry.RESUME,
        "hook-none": Retry.RECONCILE,
        "unhooked": Retry.RECONCILE,
        "committed": Retry.RESUME,
        "read": Retry.RESTART,
        "done": Retry.NONE,
    }
