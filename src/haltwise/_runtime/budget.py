"""A run's budget at work: the check before every step, what a reached limit does, and what a
task or an adapter records as spend (CONTRACT.md, "Someone else decides: approvals and budgets").

The spend itself is counted by the run's context (:meth:`RunContext.add_spend`: a tool call as
it begins, a step's ``haltwise.spend``, a model request's tokens, a child run's spend) and
journaled with the step that spent it (its settlement's ``spend``); :attr:`RunContext.over`
says which limit the count reached. The step executor calls :func:`enforce_budget` before a
step begins and after one settled while a limit of the run, or of a parent run worked here, is
reached: no step begins after that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .._core.budget import BUDGET_REASON, Budget, OnExhaust
from .._core.exceptions import Cancelled, InputError
from .pause import pause_point
from .run_context import CURRENT_RUN, CURRENT_STEP
from .spans import run_event

if TYPE_CHECKING:
    from .run_context import RunContext


async def enforce_budget(run: RunContext, call: bool = False) -> None:
    """Stop ``run`` because a limit is reached (its own, or a parent run's worked here):
    ``on_exhaust="cancel"`` cancels the run whose limit it is with reason ``"budget"`` (a child
    run with it, reason ``"parent"``) and raises :class:`Cancelled`; ``"pause"`` pauses it with
    reason ``"budget"`` (a parent's pause pauses its child runs) and waits at this checkpoint
    until the pause is over. Returns once no limit stops the step (raised by an unpause).
    ``call``: the step about to begin is a tool call (see :meth:`RunContext.over_budget`)."""
    noted: set[str] = set()
    while True:
        holder = run.over_budget(call)
        if holder is None:
            return
        budget = holder.budget
        assert budget is not None
        host = run.host
        if holder.run_id not in noted:
            noted.add(holder.run_id)
            await run.store.record_budget_exhausted(holder.run_id)  # the feed's budget event
            run_event(
                run.trace,
                "haltwise.budget.exhausted",
                {
                    "haltwise.run.id": holder.run_id,
                    "haltwise.budget.on_exhaust": str(budget.on_exhaust),
                },
            )
        if budget.on_exhaust == OnExhaust.CANCEL or run.cancel.reason is not None:
            await host.cancel(holder.run_id, reason=BUDGET_REASON)
            if holder is not run:
                await host.cancel(run.run_id, reason="parent")
            run.raise_if_cancelled()
            raise Cancelled(run.cancel.reason or BUDGET_REASON, task_id=run.run_id)
        await host.pause(holder.run_id, reason=BUDGET_REASON)
        if not run.pause.requested:
            await host.pause(run.run_id)  # (a parent's pause reaches its child through it)
        if not run.pause.requested:
            # Neither paused nor cancelled (the run is not pausable now): no step begins.
            await host.cancel(holder.run_id, reason=BUDGET_REASON)
            run.raise_if_cancelled()
            raise Cancelled(BUDGET_REASON, task_id=run.run_id)
        await pause_point(run)
        run.raise_if_cancelled()
        # Unpaused: with its limit raised by whoever unpaused it (this process or another).
        record = (await run.store.load(holder.run_id)).run
        holder.set_budget(Budget.from_json(record.inputs.get("budget")))


def spend(*, usd: float = 0.0, tokens: int = 0) -> None:
    """Count ``usd`` (US dollars) and ``tokens`` towards the current run's budget, journaled with
    the step that spends them (its settlement). Inside a step (a tool body) only; outside any
    task it does nothing. Raises :class:`~haltwise.InputError` for a negative or non-numeric
    amount, or a call in a task's own code outside any step (there is no step to journal it
    with). A limit reached stops the run before its next step begins."""
    # (exact types first: the call is on a step's path; a subclass takes the longer way)
    if type(usd) not in _AMOUNTS or not usd >= 0:
        _check_amount("usd", usd, number=True)
    if type(tokens) is not int or tokens < 0:
        _check_amount("tokens", tokens, number=False)
    step = CURRENT_STEP.get()
    if step is None:
        if CURRENT_RUN.get() is None:
            return
        raise InputError(
            "haltwise.spend() is journaled with the step that spends: call it inside a step "
            "(a tool body or haltwise.step), not in the task's own code"
        )
    step.add_spend(float(usd), tokens, 0)


#: the exact types ``spend`` takes without a closer look (``bool`` is not one of them)
_AMOUNTS: Final = frozenset({float, int})


def _check_amount(name: str, value: Any, *, number: bool) -> None:
    """Raise :class:`~haltwise.InputError` unless ``value`` is an amount ``spend`` takes as
    its ``name``: a number >= 0 (``number``), else an integer >= 0; never a bool."""
    kinds = (int, float) if number else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value >= 0:
        expected = "a number" if number else "an integer"
        raise InputError(f"haltwise.spend({name}={value!r}): expected {expected} >= 0")


def model_usage(model: str | None, input_tokens: int, output_tokens: int) -> None:
    """A model request (the current step) used these tokens: count them, and their price when
    the run's budget (or the nearest parent run's with prices) names ``model``. Outside a step
    it does nothing (the adapters call it in their model request's step)."""
    step = CURRENT_STEP.get()
    if step is None:
        return
    input_tokens = max(int(input_tokens or 0), 0)
    output_tokens = max(int(output_tokens or 0), 0)
    usd = 0.0
    run: RunContext | None = step.run
    while run is not None:
        budget = run.budget
        if budget is not None and budget.prices:
            usd = budget.price(model, input_tokens, output_tokens)
            break
        parent = run.spend_to
        run = None if parent is None else parent.run
    step.add_spend(usd, input_tokens + output_tokens, 0)
