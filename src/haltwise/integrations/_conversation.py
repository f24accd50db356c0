"""Closing the tool calls a cancelled conversation leaves without a result, from the journal.

A framework that is cancelled while tool calls are in flight keeps the model's calls in its
conversation but not their results. Sent to a model as it is, such a conversation is rejected, or
(Pydantic AI) the calls are marked "interrupted" and the model calls them again: a committed
charge is made twice. The adapters close every such call: a committed call gets its journaled
result, any other one a text saying what became of it.

What a call became is read from a run's outcome (its steps carry the call id they were made
under): the outcome the caller passes, and, inside a task, the current run's own journal
(:func:`calls_in`, :func:`journaled_call`): the same answer in every process. The OpenAI Agents
and Pydantic AI adapters read nothing else. :func:`settled_calls` adds a bounded in-process
record of the calls this process saw commit, kept by :func:`call_tool` (the LangChain adapter's
wrappers). (Reading the current run's journal goes through the run context: the public API has
no read of a run from inside it.)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import anyio

import haltwise

from .._runtime.task_api import journaled_outcome
from ._common import call_id as call_id_scope

__all__ = [
    "SettledCall",
    "call_tool",
    "calls_in",
    "current_run_outcome",
    "journaled_call",
    "remember_committed",
    "remember_from_journal",
    "settled_calls",
    "unsettled_text",
]

#: How many committed calls the in-process record keeps (the oldest are forgotten first).
_RECORD_SIZE = 10_000
_COMMITTED: OrderedDict[str, Any] = OrderedDict()


@dataclass(frozen=True, slots=True)
class SettledCall:
    """What became of one tool call: its step status, and its result when committed."""

    status: haltwise.StepStatus
    result: Any = None


def remember_committed(call_id: str, result: Any) -> None:
    """Record that the call ``call_id`` committed with ``result`` (called by the tool wrappers)."""
    _COMMITTED[call_id] = result
    _COMMITTED.move_to_end(call_id)
    while len(_COMMITTED) > _RECORD_SIZE:
        _COMMITTED.popitem(last=False)


async def current_run_outcome() -> haltwise.Outcome | None:
    """The current run as journaled now (inside a task), else ``None``."""
    return await journaled_outcome()


async def remember_from_journal(call_id: str) -> None:
    """Record ``call_id``'s journaled result if it committed (after a cancel the framework made:
    a ``finish`` call may have committed although the wrapper sees only the cancel)."""
    with anyio.CancelScope(shield=True):
        outcome = await current_run_outcome()
    call = settled_calls(outcome).get(call_id)
    if call is not None and call.status is haltwise.StepStatus.COMMITTED:
        remember_committed(call_id, call.result)


async def call_tool(
    tool: haltwise.Tool[..., Any], call_id: str | None, *args: Any, **kwargs: Any
) -> Any:
    """``await tool(*args, **kwargs)`` as the framework's call ``call_id`` (one step keyed by it),
    recording what the call became for :func:`settled_calls`: its result when it commits, its
    journaled status when a cancel (haltwise's or the framework's) stops it."""
    try:
        with call_id_scope(call_id):
            value = await tool(*args, **kwargs)
    except (haltwise.Cancelled, anyio.get_cancelled_exc_class()):
        if call_id:
            await remember_from_journal(call_id)
        raise
    if call_id:
        remember_committed(call_id, value)
    return value


async def journaled_call(call_id: str) -> SettledCall | None:
    """What the current run's journal says became of the call ``call_id`` (None: nothing, or
    outside a task). Read shielded: for a call a cancel has just stopped."""
    with anyio.CancelScope(shield=True):
        outcome = await current_run_outcome()
    return calls_in(outcome).get(call_id)


def calls_in(*outcomes: haltwise.Outcome | None) -> dict[str, SettledCall]:
    """Every call id the outcomes' steps were made under, and what became of each (the later
    outcome wins)."""
    known: dict[str, SettledCall] = {}
    for outcome in outcomes:
        for step in outcome.steps if outcome is not None else ():
            if step.call_id is not None:
                known[step.call_id] = SettledCall(step.status, step.result)
    return known


def settled_calls(*outcomes: haltwise.Outcome | None) -> dict[str, SettledCall]:
    """Every call id known to have settled, from the outcomes' steps and the in-process record."""
    known = {
        cid: SettledCall(haltwise.StepStatus.COMMITTED, value) for cid, value in _COMMITTED.items()
    }
    for outcome in outcomes:
        for step in outcome.steps if outcome is not None else ():
            cid = getattr(step, "call_id", None)
            if cid is not None:
                known[cid] = SettledCall(step.status, step.result)
    return known


def unsettled_text(call: SettledCall | None) -> str:
    """The result given to a call that has no journaled result, saying what became of it."""
    if call is None or call.status in (
        haltwise.StepStatus.INTERRUPTED,
        haltwise.StepStatus.RUNNING,
        haltwise.StepStatus.AWAITING,
    ):
        return (
            "[haltwise] interrupted: the run was cancelled before this call finished; "
            "it had no effect"
        )
    if call.status is haltwise.StepStatus.COMPENSATED:
        return (
            "[haltwise] compensated: the run was cancelled during this call and its effect "
            "was undone"
        )
    if call.status is haltwise.StepStatus.FAILED:
        return "[haltwise] failed: this call raised an error"
    if call.status is haltwise.StepStatus.REFUSED:
        return "[haltwise] refused: this call was not approved; it did not run"
    return (
        "[haltwise] unknown: the run was cancelled during this call and whether it took effect "
        "is not known; check before calling it again"
    )
