"""One journal change as one CloudEvent (CONTRACT.md, "Events out").

Which changes are events: a run's transition into a state (``dev.haltwise.run.STATE``, every
state, ``cancelling`` and ``paused`` included), an approval request and its decision, a budget's
exhaustion. A step's start or settlement and a partial result are not events of their own: they
show in the ``data`` of the next event of their run.

``data`` is the run's ``status --json`` object *as of that change*, not as the run is when the
event is sent: :class:`RunFold` follows a run's changes in order (its steps' statuses, how many
partial results, its latest transition), and :func:`status_as_of` cuts the run's journal, read
after the change, down to what the fold had seen. So a receiver that gets
``dev.haltwise.run.cancelled`` sees the state, reason, retry advice, steps and partial results of
that moment, even when the run was resumed since.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from .._core.outcome import Outcome, StepRecord
from .._core.records import Event
from .._core.states import State, StepStatus
from .._core.views import Change, ChangeKind

__all__ = [
    "EVENT_PREFIX",
    "RunFold",
    "cloud_event",
    "event_type",
    "status_as_of",
]

#: The reverse-DNS prefix of every event type haltwise sends.
EVENT_PREFIX: Final = "dev.haltwise"

#: What ``ChangeKind`` values name an approval and a budget change (the kinds the approvals and
#: budgets add to the change feed); written as values so that this module does not depend on
#: which of them a store already records.
_APPROVAL: Final = "approval"
_BUDGET: Final = "budget"
#: An approval change's status while its request waits for a decision.
_AWAITING: Final = "awaiting"


def event_type(change: Change) -> str | None:
    """The CloudEvent ``type`` of ``change``, or ``None`` when it is not sent as an event."""
    kind = change.kind.value
    if kind == ChangeKind.TRANSITION.value and change.status:
        return f"{EVENT_PREFIX}.run.{change.status}"
    if kind == _APPROVAL:
        asked = change.status == _AWAITING
        return f"{EVENT_PREFIX}.approval.{'requested' if asked else 'decided'}"
    if kind == _BUDGET:
        return f"{EVENT_PREFIX}.budget.exhausted"
    return None


@dataclass(slots=True)
class RunFold:
    """What the changes read so far say of one run: each step's latest status, how many partial
    results, and the journal number of its latest transition (an event's ``seq``)."""

    steps: dict[int, str] = field(default_factory=dict)
    partials: int = 0
    last_event: int | None = None

    def apply(self, change: Change) -> None:
        """Take ``change`` (of this run, in order) into account."""
        kind = change.kind
        if kind is ChangeKind.STEP and change.index is not None and change.status:
            self.steps[change.index] = change.status
        elif kind is ChangeKind.PARTIAL and change.index is not None:
            self.partials = max(self.partials, change.index + 1)
        elif kind is ChangeKind.TRANSITION and change.index is not None:
            self.last_event = change.index

    def copy(self) -> RunFold:
        return RunFold(dict(self.steps), self.partials, self.last_event)


def status_as_of(outcome: Outcome, events: Sequence[Event], fold: RunFold) -> dict[str, Any]:
    """The ``status --json`` object of a run as of the moment ``fold`` describes.

    ``outcome`` and ``events`` are the run as read after that moment (it may have gone on): its
    steps are cut to those the fold saw begin, each with the status it had then; its partial
    results to the fold's count; its state to the latest transition's target, its reason to the
    reason in force then (the latest one given since the run last entered ``running``); result
    and error only if that transition is the run's latest (a later attempt may have replaced
    them). The retry advice is the rule applied to that state and those steps.
    """
    history = [event for event in events if fold.last_event is None or event.seq <= fold.last_event]
    state = history[-1].target if history else outcome.state
    latest = bool(history) and history[-1].seq == (events[-1].seq if events else None)
    steps = tuple(
        _with_status(step, fold.steps[step.index])
        for step in outcome.steps
        if step.index in fold.steps
    )
    then = dataclasses.replace(
        outcome,
        state=state,
        reason=_reason_then(history),
        result=outcome.result if latest and state is State.COMPLETED else None,
        error=outcome.error if latest and state is State.FAILED else None,
        cancel_error=outcome.cancel_error if latest else None,
        partials=outcome.partials[: fold.partials],
        steps=steps,
    )
    return then.to_json()


def _with_status(step: StepRecord, status: str) -> StepRecord:
    # most steps have not moved since: a copy (dataclasses.replace, ~30 us) only for those that did
    return (
        step
        if step.status.value == status
        else dataclasses.replace(step, status=StepStatus(status))
    )


def _reason_then(history: Sequence[Event]) -> str | None:
    for event in reversed(history):
        if event.reason is not None:
            return event.reason
        if event.target is State.RUNNING:
            return None
    return None


def cloud_event(change: Change, source: str, data: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """The headers and body of ``change`` as a CloudEvent in structured JSON mode.

    ``id`` is the change's number in the journal (the same in every delivery of it), ``subject``
    the run's id, ``time`` when the change was committed (the database's clock).
    """
    from cloudevents.core.bindings.http import to_structured_event
    from cloudevents.core.v1.event import CloudEvent

    kind = event_type(change)
    assert kind is not None, change
    event = CloudEvent(
        {
            "id": str(change.seq),
            "source": source,
            "type": kind,
            "subject": change.run_id,
            "time": datetime.fromtimestamp(change.at, tz=UTC),
            "datacontenttype": "application/json",
        },
        data,
    )
    message = to_structured_event(event)
    return dict(message.headers), message.body
