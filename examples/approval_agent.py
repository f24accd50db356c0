"""An agent whose paid call needs a person's approval (README, "Approvals").

``charge_card`` is declared ``approval="required"``: each call first journals a request (the step
is ``awaiting``, the run stays ``running``) and waits for a decision from anywhere:

    haltwise list --awaiting                         # the pending requests
    haltwise approve RUN STEP --by ops               # the call runs, once
    haltwise approve RUN STEP --edit '{"amount_eur": 20}' --by ops   # runs with 20 instead
    haltwise refuse RUN STEP --by ops --note "too expensive"         # the task sees why

Run alone (``python examples/approval_agent.py``), it plays the approver itself, in the same
process: the first order is approved with an edit, the second refused, the third is waiting when
it is cancelled (the request becomes ``cancelled``: no later decision applies).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import haltwise

CHARGES: list[int] = []


@haltwise.tool(cancel="interruptible", effect="read")
async def quote(item: str) -> int:
    """What the item costs, in euros."""
    return {"tea": 12, "car": 25_000}.get(item, 40)


@haltwise.tool(cancel="finish", effect="external", idempotent=True, approval="required")
async def charge_card(amount_eur: int, item: str) -> str:
    """Charge the customer's card (a paid call: a person approves it first)."""
    CHARGES.append(amount_eur)  # a real payment API would get haltwise.idempotency_key()
    return f"charged {amount_eur} EUR for {item}"


@haltwise.task
async def buy(item: str) -> str:
    price = await quote(item)
    try:
        return await charge_card(price, item)
    except haltwise.ApprovalRefused as refused:
        return f"not bought: {refused}"


async def first_request(rt: haltwise.Runtime, run_id: str) -> haltwise.ApprovalRecord:
    while True:
        for request in await rt.approvals():
            if request.run_id == run_id:
                return request
        await asyncio.sleep(0.01)


async def main() -> None:
    store = Path(tempfile.mkdtemp()) / "approvals.db"
    async with haltwise.Runtime(f"sqlite:///{store}") as rt:
        tea = await rt.start(buy, "tea", task_id="order-tea")
        request = await first_request(rt, "order-tea")
        print(f"awaiting: {request.run_id} step {request.index} {request.tool} {request.arguments}")
        await rt.decide("order-tea", request.index, edit={"amount_eur": 10}, by="ops")
        print(f"order-tea: {(await tea.outcome()).result}")

        car = await rt.start(buy, "car", task_id="order-car")
        request = await first_request(rt, "order-car")
        await rt.decide("order-car", request.index, approve=False, by="ops", note="too expensive")
        print(f"order-car: {(await car.outcome()).result}")

        late = await rt.start(buy, "lamp", task_id="order-lamp")
        request = await first_request(rt, "order-lamp")
        await late.cancel(reason="user")
        outcome = await late.outcome()
        [record] = await rt.approvals("order-lamp")
        print(f"order-lamp: {outcome.state.value}, request {record.state.value}")
        try:
            await rt.decide("order-lamp", request.index, by="ops")
        except haltwise.ApprovalConflictError as conflict:
            print(f"a late decision is refused: {conflict}")
    print(f"charges: {CHARGES}")


if __name__ == "__main__":
    asyncio.run(main())
