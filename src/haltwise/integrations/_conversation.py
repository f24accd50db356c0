"""Closing the tool calls a cancelled conversation leaves without a result, from the journal.

A framework that is cancelled while tool calls are in flight keeps the model's calls in its
conversation but not their results. Sent to a model as it is, such a conversation is rejected, or
(Pydantic AI) the calls are marked "interrupted" and the model calls them again: a committed
charge is made twice. The adapters close every such call: a committed call gets its journaled
result, any other one a text saying what became of it.

What a call became is read from the run's outcome (its steps carry the call id they were made
under) and, for calls this process saw commit, from a bounded in-process record kept by the
adapters' tool wrappers (so that a conversation reused in the same process needs no outcome).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import haltwise

__all__ = ["SettledCall", "remember_committed", "settled_calls", "unsettled_text"]

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


def settled_calls(outcome: haltwise.Outcome | None = None) -> dict[str, SettledCall]:
    """Every call id known to have settled, from ``outcome``'s steps and the in-process record."""
    known = {
        cid: SettledCall(haltwise.StepStatus.COMMITTED, value) for cid, value in _COMMITTED.items()
    }
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
    return (
        "[haltwise] unknown: the run was cancelled during this call and whether it took effect "
        "is not known; check before calling it again"
    )
