"""A runtime that stalled past its lease and comes back: the runs taken over from it are not its.

A process stalls (a long pause, a lost network) until its lease runs out; another takes its run
over and works it. When the stale one comes back and shuts down, the deadline of its start
fires, or its attempt cancels itself, it must not cancel the run its new owner works (found by
the runtime state machine's come_back rule): its own cancels are fenced by its ownership, as its
other writes are. Both stores.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import State, StepStatus
from haltwise._core.records import Owner
from haltwise._journal import open_store
from haltwise._journal.check import check_store
from haltwise._journal.store import NewRun, StepStart, Store
from toolkit import Gate

pytestmark = pytest.mark.anyio

starts: Counter[str] = Counter()
ends: Counter[str] = Counter()
entered = {"a": Gate(), "b": Gate()}
release = Gate()


@haltwise.tool(cancel="interruptible", effect="read")
async def look(where: str) -> str:
    attempt = "a" if not starts["look"] else "b"
    starts["look"] += 1
    entered[attempt].set()
    await release.wait(timeout=60)
    ends["look"] += 1
    return where


@haltwise.task(name="stale_owner:lookup")
async def lookup() -> str:
    return await look("here")


def _reset() -> None:
    global release
    starts.clear()
    ends.clear()
    entered.update(a=Gate(), b=Gate())
    release = Gate()


async def _stall_past_the_lease(url: str, run_id: str, owner: Owner) -> None:
    """What the store sees of a process that stalled until its lease ran out: the run held by
    an owner that is gone as far as anyone can tell (another host, lease expired). Its token is
    another, as the stalled runtime is in fact still running here and renewing its leases."""
    store = haltwise.Runtime(url).store
    await store.open()
    try:
        gone = Owner(token=uuid.uuid4().hex, host="stalled.invalid", pid=owner.pid, started=0.0)
        claimed = await store.claim(
            run_id, gone, lease_until=time.time() - 1, expected_owner=owner.token
        )
        assert claimed
    finally:
        await store.close()


async def _take_over_while(url: str, stale: haltwise.Runtime, run_id: str, then: Any) -> None:
    """Have run ``run_id`` of ``stale`` taken over by a new runtime, ``await then()`` while the
    new owner works it (its tool in flight), then let it complete there."""
    await _stall_past_the_lease(url, run_id, stale.owner)
    async with haltwise.Runtime(url) as fresh:
        await fresh.resume(run_id)
        await entered["b"].wait(timeout=60)
        await then()
        record = await fresh.status(run_id)
        assert record.state is State.RUNNING, record
        release.set()
        outcome = await fresh.outcome(run_id)
    assert outcome.state is State.COMPLETED, outcome
    assert outcome.result == "here"
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED]
    assert (await check_store(url)).ok


async def test_a_stale_runtime_shutting_down_does_not_cancel_the_run_taken_from_it(
    store_url: str,
) -> None:
    _reset()
    stale = haltwise.Runtime(store_url)
    left = anyio.Event()

    async def leave() -> None:
        with anyio.fail_after(60):
            await left.wait()

    async def stale_process(*, task_status: Any) -> None:
        async with stale:
            await stale.start(lookup, task_id="r")
            await entered["a"].wait(timeout=60)
            task_status.started()
            await leave_now.wait()
        left.set()  # its shutdown stopped its own attempt here, writing nothing

    leave_now = anyio.Event()
    async with anyio.create_task_group() as group:
        await group.start(stale_process)

        async def shut_the_stale_one_down() -> None:
            leave_now.set()
            await leave()

        await _take_over_while(store_url, stale, "r", shut_the_stale_one_down)
    assert starts["look"] == 2 and ends["look"] == 1  # the stale attempt was interrupted


async def test_the_deadline_of_a_stale_start_does_not_cancel_the_run_taken_from_it(
    store_url: str,
) -> None:
    _reset()
    deadline = 3.0  # the takeover below takes milliseconds: it happens well before
    async with haltwise.Runtime(store_url) as stale:
        begun = time.monotonic()
        await stale.start(lookup, task_id="r", deadline=deadline)
        await entered["a"].wait(timeout=60)

        async def wait_for_the_stale_deadline() -> None:
            assert time.monotonic() - begun < deadline, "the takeover came after the deadline"
            with anyio.fail_after(60):
                while stale.is_active("r"):  # its deadline stops the attempt here
                    await anyio.sleep(0.02)

        await _take_over_while(store_url, stale, "r", wait_for_the_stale_deadline)
    assert starts["look"] == 2 and ends["look"] == 1


gives_up = Gate()


@haltwise.task(name="stale_owner:gives_up_in_the_first_attempt")
async def gives_up_in_the_first_attempt() -> str:
    """The first attempt waits, then cancels its own run; any later one does the lookup."""
    if not starts["gives_up"]:
        starts["gives_up"] += 1
        entered["a"].set()
        await gives_up.wait(timeout=60)
        raise haltwise.Cancelled("gave up")
    return await look("here")


async def test_a_stale_attempt_cancelling_itself_does_not_cancel_the_run_taken_from_it(
    store_url: str,
) -> None:
    global gives_up
    _reset()
    gives_up = Gate()
    starts["look"] = 1  # the lookup below is the second attempt's ("b")
    async with haltwise.Runtime(store_url) as stale:
        await stale.start(gives_up_in_the_first_attempt, task_id="r")
        await entered["a"].wait(timeout=60)

        async def let_the_stale_attempt_give_up() -> None:
            gives_up.set()
            with anyio.fail_after(60):
                while stale.is_active("r"):
                    await anyio.sleep(0.02)

        await _take_over_while(store_url, stale, "r", let_the_stale_attempt_give_up)


# -- a write of the last owner that lands while its run is being taken over ------------------


class LandsBeforeTheClaim:
    """A takeover reads the run, then claims it. A write of the last owner can commit between
    the two: one it sent before it died (a dead client's statement still commits on the
    server), or one of a stalled owner that comes back just then. This makes one land there: the
    last owner's start of step ``index`` (a non-idempotent ``finish`` tool), written through a
    store of its own, fenced by its token, just before the takeover's claim."""

    def __init__(self, runtime: haltwise.Runtime, old: Store, run_id: str, owner: Owner) -> None:
        self.landed = False
        claim = runtime.store.claim

        async def claim_after_the_write(*args: Any, **kwargs: Any) -> bool:
            if not self.landed:
                self.landed = True
                start = StepStart(1, "record", "finish", haltwise.Effect.WRITE, False, "k1")
                await old.start_step(run_id, start, fence=owner.token)
            return await claim(*args, **kwargs)

        runtime.store.claim = claim_after_the_write  # type: ignore[method-assign]


async def _run_left_mid_step(store: Store, run_id: str, task: str) -> Owner:
    """A ``running`` run of ``task`` whose owner is gone (another host, lease run out), with its
    step 0 committed; that owner."""
    gone = Owner(token=uuid.uuid4().hex, host="gone.invalid", pid=1, started=0.0)
    inputs: dict[str, Any] = {"args": [], "kwargs": {}}
    await store.create_run(
        NewRun(id=run_id, task=task, inputs=inputs, state=State.RUNNING, owner=gone, lease_until=0)
    )
    start = StepStart(0, "look", "interruptible", haltwise.Effect.READ, False, "k0")
    await store.start_step(run_id, start, fence=gone.token)
    await store.settle_step(run_id, 0, StepStatus.COMMITTED, result=0, fence=gone.token)
    return gone


@pytest.mark.parametrize("how", ["cancel", "resume"])
async def test_a_step_the_last_owner_journals_while_its_run_is_taken_over_is_settled(
    store_url: str, how: str
) -> None:
    # The fleet test's run101 (CI, session 9): the canceller of a run nobody worked settled the
    # steps it had read before its claim, and the step the dead victim's last statement started
    # meanwhile stayed ``running`` in a ``cancelled`` run (advice restart, not reconcile).
    old = open_store(store_url)
    await old.open()
    try:
        async with haltwise.Runtime(store_url) as runtime:
            gone = await _run_left_mid_step(old, "r", "stale_owner:not_loaded_here")
            landed = LandsBeforeTheClaim(runtime, old, "r", gone)
            if how == "cancel":
                record = await runtime.cancel("r", reason="late")
                assert record.state is State.CANCELLED, record
            else:
                with pytest.raises(haltwise.ResumeRefusedError):
                    await runtime.resume("r", task=lookup)
            assert landed.landed
            snapshot = await runtime.store.load("r")
    finally:
        await old.close()
    statuses = [(s.index, s.tool, s.status) for s in snapshot.steps]
    assert statuses == [(0, "look", StepStatus.COMMITTED), (1, "record", StepStatus.UNKNOWN)]
    assert snapshot.outcome().retry is haltwise.Retry.RECONCILE
    assert snapshot.run.state is (State.CANCELLED if how == "cancel" else State.FAILED)
    assert (await check_store(store_url)).ok
