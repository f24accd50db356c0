"""Approvals in Python, on both stores (CONTRACT.md, "Someone else decides"): a call that needs
one journals its request as its step (``awaiting``), waits, and runs once approved (with edited
arguments if edited), never when refused or expired; a decision is used once; a cancel while
awaiting lands at once; a pause does not wait for the request; resume replays decisions."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

import haltwise
from _wait import until, until_state
from haltwise import ApprovalState, State, StepStatus
from haltwise._journal.check import verify
from haltwise._runtime.steps import fingerprint

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]

#: what the paid tool did: (amount, to, idempotency key)
LEDGER: list[tuple[int, str, str]] = []


@pytest.fixture(autouse=True)
def _clean_ledger() -> None:
    LEDGER.clear()


@haltwise.tool(cancel="finish", effect="external", idempotent=True, approval="required")
async def pay(amount: int, to: str) -> str:
    LEDGER.append((amount, to, haltwise.idempotency_key()))
    return f"paid {amount} to {to}"


@haltwise.tool(
    cancel="finish", effect="external", approval="required", approval_timeout=0.3, name="hurry"
)
async def pay_soon(amount: int) -> str:
    LEDGER.append((amount, "soon", haltwise.idempotency_key()))
    return "paid"


@haltwise.tool(cancel="finish", effect="external", approval=lambda amount: amount > 100)
async def pay_if_big(amount: int) -> str:
    LEDGER.append((amount, "big?", haltwise.idempotency_key()))
    return f"paid {amount}"


@haltwise.task
async def buy(amount: int = 5) -> str:
    try:
        return await pay(amount, "bob")
    except haltwise.ApprovalRefused as refused:
        return f"refused: {refused}"


@haltwise.task
async def buy_soon() -> str:
    try:
        return await pay_soon(7)
    except haltwise.ApprovalExpired as expired:
        return f"expired: {expired}"


@haltwise.task
async def two_buys() -> list[str]:
    return [await pay_if_big(50), await pay_if_big(500)]


@haltwise.tool(
    cancel="finish", effect="external", approval="required", approval_timeout=600, name='say "hi"'
)
async def say(text: str) -> str:
    return text


@haltwise.task
async def greet() -> str:
    return await say('he said "hi"\n')


@haltwise.task
async def ask_person() -> dict[str, Any]:
    decision = await haltwise.approval("ship it", payload={"version": 3})
    return {"approved": decision.approved, "by": decision.by, "payload": decision.payload}


async def awaiting(rt: haltwise.Runtime, run_id: str, step: int = 0) -> None:
    async def there() -> bool:
        return any(r.run_id == run_id and r.index == step for r in await rt.approvals())

    await until(there, f"{run_id} step {step} awaiting approval")


async def test_approve_runs_the_call_once_and_the_step_shows_the_decision(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="a1")
        await awaiting(rt, "a1")
        detail = (await rt.inspect("a1")).to_json()
        step = detail["steps"][0]
        assert (step["status"], step["approval"]["state"]) == ("awaiting", "awaiting")
        assert detail["state"] == "running", "a run waiting for approval stays running"
        assert LEDGER == []
        [pending] = json.loads(await rt.approvals_json())["approvals"]
        assert pending["arguments"] == {"amount": 5, "to": "bob"}
        assert (pending["run"], pending["step"], pending["tool"]) == ("a1", 0, "pay")
        [record] = await rt.approvals()
        assert (pending["requested_at"], pending["timeout_at"]) == (record.requested_at, None)
        record = await rt.decide("a1", 0, by="ops", note="fine")
        assert record.state is ApprovalState.APPROVED
        outcome = await handle.outcome()
        status = (await rt.inspect("a1")).status_json()
        report = await verify(rt.store)
    assert outcome.result == "paid 5 to bob"
    assert [(a, t) for a, t, _ in LEDGER] == [(5, "bob")]
    approval = status["steps"][0]["approval"]
    assert (approval["state"], approval["by"], approval["note"]) == ("approved", "ops", "fine")
    assert approval["at"] is not None
    assert status["steps"][0]["status"] == "committed"
    assert report.ok, report.findings


async def test_an_edit_runs_the_call_with_the_edited_arguments(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, 500, task_id="a1")
        await awaiting(rt, "a1")
        await rt.decide("a1", 0, edit={"amount": 50}, by="ops")
        outcome = await handle.outcome()
        [record] = await rt.approvals("a1")
    assert outcome.result == "paid 50 to bob"
    assert [(a, t) for a, t, _ in LEDGER] == [(50, "bob")]
    assert record.state is ApprovalState.EDITED
    assert record.edited == {"amount": 50, "to": "bob"}
    assert record.arguments == {"amount": 500, "to": "bob"}
    # the step keeps the fingerprint of the call the task asked for: what a replay matches
    assert outcome.steps[0].fingerprint == fingerprint((500, "bob"), {})


async def test_refuse_reaches_the_task_and_the_call_never_runs(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="a1")
        await awaiting(rt, "a1")
        await rt.decide("a1", 0, approve=False, by="ops", note="too expensive")
        outcome = await handle.outcome()
        status = (await rt.inspect("a1")).status_json()
    assert outcome.result == "refused: [haltwise] refused by ops: too expensive"
    assert LEDGER == []
    step = status["steps"][0]
    assert step["status"] == "refused"
    assert step["error"]["type"] == "ApprovalRefused"
    assert step["approval"]["state"] == "refused"


async def test_a_request_not_decided_in_time_expires(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(buy_soon, task_id="a1")).outcome()
        [record] = await rt.approvals("a1")
        with pytest.raises(haltwise.ApprovalConflictError, match="expired"):
            await rt.decide("a1", 0)
    assert outcome.result.startswith("expired: ")
    assert record.state is ApprovalState.EXPIRED
    assert LEDGER == []


async def test_a_decision_is_used_once(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="a1")
        await awaiting(rt, "a1")
        await rt.decide("a1", 0, approve=False, by="ann")
        with pytest.raises(haltwise.ApprovalConflictError, match="refused by ann") as second:
            await rt.decide("a1", 0, by="bob")
        assert second.value.state == "refused"
        with pytest.raises(haltwise.ApprovalConflictError, match="no approval request"):
            await rt.decide("a1", 3)
        with pytest.raises(haltwise.UnknownRunError):
            await rt.decide("nope", 0)
        await handle.outcome()
        [record] = await rt.approvals("a1")
    assert (record.state, record.by) == (ApprovalState.REFUSED, "ann")
    assert LEDGER == []


async def test_approval_fn_asks_only_for_the_calls_it_names(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(two_buys, task_id="a1")
        await awaiting(rt, "a1", step=1)
        assert [a for a, _, _ in LEDGER] == [50], "the small call did not ask"
        await rt.decide("a1", 1)
        outcome = await handle.outcome()
    assert outcome.result == ["paid 50", "paid 500"]
    assert [r.index for r in await _requests(store_url, "a1")] == [1]


async def _requests(url: str, run_id: str) -> list[haltwise.ApprovalRecord]:
    async with haltwise.Runtime(url) as rt:
        return await rt.approvals(run_id)


async def test_haltwise_approval_returns_a_decision(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        first = await rt.start(ask_person, task_id="a1")
        await awaiting(rt, "a1")
        [pending] = await rt.approvals()
        assert pending.arguments == {"payload": {"version": 3}}
        await rt.decide("a1", 0, edit={"payload": {"version": 4}}, by="lead")
        second = await rt.start(ask_person, task_id="a2")
        await awaiting(rt, "a2")
        await rt.decide("a2", 0, approve=False, by="lead", note="not today")
        approved, refused = await first.outcome(), await second.outcome()
    assert approved.result == {"approved": True, "by": "lead", "payload": {"version": 4}}
    assert refused.result == {"approved": False, "by": "lead", "payload": {"version": 3}}


async def test_a_cancel_while_awaiting_lands_at_once_and_a_resume_asks_anew(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="a1")
        await awaiting(rt, "a1")
        await rt.cancel("a1", reason="user")
        outcome = await handle.outcome()
        [record] = await rt.approvals("a1")
        with pytest.raises(haltwise.ApprovalConflictError, match="cancelled"):
            await rt.decide("a1", 0)
        assert outcome.state is State.CANCELLED
        assert outcome.steps[0].status is StepStatus.INTERRUPTED
        assert record.state is ApprovalState.CANCELLED
        resumed = await rt.resume("a1")
        await awaiting(rt, "a1")
        await rt.decide("a1", 0, by="ops")
        again = await resumed.outcome()
        report = await verify(rt.store)
    assert again.result == "paid 5 to bob"
    assert len(LEDGER) == 1
    assert report.ok, report.findings


async def test_a_pause_does_not_wait_for_an_awaiting_request(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="a1")
        await awaiting(rt, "a1")
        await rt.pause("a1")
        paused = await until_state(rt, "a1", State.PAUSED)
        assert paused.steps[0].status is StepStatus.AWAITING
        await rt.decide("a1", 0, by="ops")  # while paused: takes effect on unpause
        await anyio.sleep(0)
        assert LEDGER == []
        await until(lambda: rt.is_paused("a1"), "a1 paused in the runtime")
        assert LEDGER == [], "nothing runs while paused"
        await rt.unpause("a1")
        outcome = await handle.outcome()
    assert outcome.result == "paid 5 to bob"
    assert len(LEDGER) == 1


async def test_the_pending_list_is_the_journal_s_requests_as_json(store_url: str) -> None:
    """GET /api/approvals' object, built by the store: the same values as the records, times
    in full precision, a deadline when there is one, names and arguments quoted right."""
    async with haltwise.Runtime(store_url) as rt:
        first = await rt.start(greet, task_id='q"1\\')
        await awaiting(rt, 'q"1\\')
        second = await rt.start(buy, task_id="q2")
        await awaiting(rt, "q2")
        listed = json.loads(await rt.approvals_json())["approvals"]
        records = await rt.approvals()
        assert listed == [
            {
                "run": r.run_id,
                "step": r.index,
                "tool": r.tool,
                "arguments": r.arguments,
                "requested_at": r.requested_at,
                "timeout_at": r.timeout_at,
            }
            for r in records
        ]
        assert [item["run"] for item in listed] == ['q"1\\', "q2"]
        assert listed[0]["tool"] == 'say "hi"'
        assert listed[0]["arguments"] == {"text": 'he said "hi"\n'}
        assert listed[0]["timeout_at"] == pytest.approx(listed[0]["requested_at"] + 600, abs=5)
        for handle in (first, second):
            await rt.cancel(handle.id)
            await handle.outcome()
        assert json.loads(await rt.approvals_json()) == {"approvals": []}


@haltwise.tool(cancel="finish", effect="external", approval="required")
async def dose(level: float, levels: list[float]) -> str:
    return "dosed"


@haltwise.task
async def dose_unknown() -> str:
    return await dose(float("nan"), [1.5, float("inf")])


def _strict(constant: str) -> Any:
    raise ValueError(f"not JSON: {constant}")  # what a browser's JSON.parse refuses


async def test_a_request_whose_arguments_json_cannot_hold_lists_them_as_text(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(dose_unknown, task_id="nan")
        await awaiting(rt, "nan")
        listed = json.loads(await rt.approvals_json(), parse_constant=_strict)["approvals"]
        assert listed[0]["arguments"] == {"level": "nan", "levels": [1.5, "inf"]}
        await rt.cancel(handle.id)
        await handle.outcome()


async def test_only_the_runs_owner_cancels_its_request(store_url: str) -> None:
    """A process that lost the run (its fence is stale) cancelling the request on its way out
    must change nothing: the new owner waits on that request, and a decision still completes
    the run (Store.cancel_approval is fenced, as its step's half always was)."""
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(buy, task_id="fenced")
        await awaiting(rt, "fenced")
        await rt.store.cancel_approval("fenced", 0, fence="the fence of a process that lost it")
        step = (await rt.inspect("fenced")).to_json()["steps"][0]
        assert (step["status"], step["approval"]["state"]) == ("awaiting", "awaiting")
        await rt.decide("fenced", 0, by="ops")
        outcome = await handle.outcome()
        report = await verify(rt.store)
    assert outcome.result == "paid 5 to bob"
    assert len(LEDGER) == 1
    assert report.ok, report.findings


async def test_a_step_number_no_store_can_hold_has_no_request(store_url: str) -> None:
    """Found by the API's fuzzing: a step past 64 bits made SQLite raise OverflowError (and
    the request hung); it is a step with no request, as any other."""
    async with haltwise.Runtime(store_url) as rt:
        await (await rt.start(buy, task_id="big")).cancel()
        with pytest.raises(haltwise.ApprovalConflictError):
            await rt.decide("big", 2**67, approve=False)
