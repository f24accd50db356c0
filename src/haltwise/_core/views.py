"""What the read API hands the faces (command line, HTTP server): frozen records, no I/O.

:class:`RunSummary` is one row of ``list`` (``{"id", "task", "state", "reason", "retry"}``),
:class:`RunPage` a page of them with the cursor of the next page, :class:`RunDetail` one run as
``GET /api/runs/{id}`` shows it, :class:`Change` one entry of the journal's change feed, and
:class:`CancelBatch` what a bulk cancel did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, final

from .approvals import ApprovalRecord
from .budget import Spent
from .outcome import Outcome, Retry, StepRecord
from .records import Event, Owner, RunRecord
from .states import State


class ChangeKind(StrEnum):
    """What a :class:`Change` is about."""

    #: the run moved to another state (``status`` is the new state)
    TRANSITION = "transition"
    #: a step began or settled (``index`` is the step, ``status`` its new status)
    STEP = "step"
    #: a partial result became durable (``index`` is its place in the run's list)
    PARTIAL = "partial"
    #: an approval request was made or decided (``index`` is the step, ``status`` the
    #: request's state: ``awaiting``, ``approved``, ``edited``, ``refused``, ``expired``,
    #: ``cancelled``)
    APPROVAL = "approval"
    #: the run's budget is exhausted (``status`` is ``"exhausted"``): it is cancelled or paused
    #: with reason ``"budget"`` next
    BUDGET = "budget"


@final
@dataclass(frozen=True, slots=True)
class Change:
    """One committed change of the journal, numbered by ``seq`` (ascending, store-wide).

    Besides ``index`` and ``status`` (whose meaning depends on ``kind``), a change read from the
    feed carries what it is about, so a reader need not fetch the run: a transition its
    ``source`` state (None for a run's creation) and ``reason``; a step its ``tool``; a partial
    result its ``value`` (``has_value`` False when the row is gone, as after a prune).
    """

    seq: int
    run_id: str
    kind: ChangeKind
    index: int | None
    status: str | None
    at: float
    source: str | None = None
    reason: str | None = None
    tool: str | None = None
    value: Any = None
    has_value: bool = False

    def to_json(self) -> dict[str, Any]:
        """``{"seq", "run", "kind", "index", "status", "at"}`` and, by kind, what the change is
        about: a transition ``"from"``, ``"to"``, ``"reason"``; a step ``"step"`` (its index),
        ``"tool"``; a partial result ``"position"`` (its place in the run's list), ``"value"``."""
        data: dict[str, Any] = {
            "seq": self.seq,
            "run": self.run_id,
            "kind": self.kind.value,
            "index": self.index,
            "status": self.status,
            "at": self.at,
        }
        if self.kind is ChangeKind.TRANSITION:
            data.update({"from": self.source, "to": self.status, "reason": self.reason})
        elif self.kind is ChangeKind.STEP:
            data.update({"step": self.index, "tool": self.tool})
        elif self.kind is ChangeKind.PARTIAL:
            data["position"] = self.index
            if self.has_value:
                data["value"] = self.value
        return data


@final
@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run as ``list`` shows it; ``retry`` is the advice of the run as it is now."""

    id: str
    task: str
    state: State
    reason: str | None
    retry: Retry
    created_at: float
    updated_at: float
    #: what the run spent, by its journal (``_core/budget.Spent``; a listing sums its steps)
    spent: Spent = field(default_factory=Spent)
    #: ``(done, known)``: its ``committed`` steps and the steps journaled so far (a run still
    #: going may begin more), when the listing was asked for them (``progress=True``), else None
    progress: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The row of ``list --json``: ``{"id", "task", "state", "reason", "retry", "spent"}``
        (``spent``: ``{"usd", "tokens", "tool_calls"}``, as ``status --json``'s budget)."""
        return {
            "id": self.id,
            "task": self.task,
            "state": self.state.value,
            "reason": self.reason,
            "retry": self.retry.value,
            "spent": self.spent.to_json(),
        }


@final
@dataclass(frozen=True, slots=True)
class RunPage:
    """Runs, newest created first, and the cursor of the next page (``None``: the last page)."""

    runs: tuple[RunSummary, ...]
    next: str | None

    def to_json(self) -> dict[str, Any]:
        return {"runs": [run.to_json() for run in self.runs], "next": self.next}


@final
@dataclass(frozen=True, slots=True)
class StepWait:
    """A step a ``cancelling`` run waits for: its policy, its grace and how much of it is left.

    ``grace`` is ``None`` when the tool is not loaded in this process (its grace is unknown);
    ``grace_left`` is ``None`` then too, and for a forced cancel (which waits for nothing).
    """

    index: int
    tool: str
    policy: str
    grace: float | None
    grace_left: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tool": self.tool,
            "policy": self.policy,
            "grace": self.grace,
            "grace_left": self.grace_left,
        }


@final
@dataclass(frozen=True, slots=True)
class StepTimes:
    """When a step's last attempt began and, if it has, when it settled (epoch seconds)."""

    started_at: float
    settled_at: float | None


@final
@dataclass(frozen=True, slots=True)
class RunDetail:
    """One run with everything an operator needs: the outcome so far, who holds it, its history.

    ``owner_alive`` says whether the owner (if any) still works it; ``waiting`` lists, for a
    ``cancelling`` run, the steps still in flight; ``retry_why`` is the retry advice as a sentence.
    ``stays_cancelling`` is set for a ``cancelling`` run that nobody works and that the reading
    process cannot settle (its settling runs compensations of a task whose code it has not
    loaded): why, and which command finishes the cancel; None otherwise.
    """

    run: RunRecord
    outcome: Outcome
    owner: Owner | None
    owner_alive: bool
    forced: bool
    events: tuple[Event, ...]
    step_times: dict[int, StepTimes]
    waiting: tuple[StepWait, ...]
    retry_why: str
    created_at: float
    updated_at: float
    stays_cancelling: str | None = None
    #: the run's approval requests by step (CONTRACT.md, "Someone else decides")
    approvals: Mapping[int, ApprovalRecord] = field(default_factory=dict)

    def status_json(self) -> dict[str, Any]:
        """The ``status --json`` object: the outcome's, each step with the times of its last
        attempt (``started_at``, ``settled_at``: epoch seconds, ``settled_at`` null while it
        runs) and, for a step that asked for approval, its ``"approval"``."""
        data = self.outcome.to_json()
        data["steps"] = [self._step_json(step) for step in self.outcome.steps]
        return data

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` object (:meth:`status_json`) plus ``owner``, ``events``,
        ``waiting``, ``stays_cancelling`` and timings: ``GET /api/runs/{id}``'s."""
        data = self.status_json()
        code = self.outcome.code
        if code is not None and code.changed is not None:
            data["code"]["changed"] = code.changed  # the file on disk is not the recorded one
        data["owner"] = (
            None
            if self.owner is None
            else {"host": self.owner.host, "pid": self.owner.pid, "alive": self.owner_alive}
        )
        data["events"] = [
            {
                "from": event.source.value if event.source else None,
                "to": event.target.value,
                "reason": event.reason,
                "at": event.at,
            }
            for event in self.events
        ]
        data["forced"] = self.forced
        data["waiting"] = [wait.to_json() for wait in self.waiting]
        data["retry_why"] = self.retry_why
        data["stays_cancelling"] = self.stays_cancelling
        data["created_at"] = self.created_at
        data["updated_at"] = self.updated_at
        return data

    def _step_json(self, step: StepRecord) -> dict[str, Any]:
        data = step.to_json()
        times = self.step_times.get(step.index)
        if step.error is not None:
            data.setdefault("error", step.error.to_json())
        record = self.approvals.get(step.index)
        if record is not None:
            data["approval"] = record.to_json()
        data["started_at"] = times.started_at if times else None
        data["settled_at"] = times.settled_at if times else None
        return data


@final
@dataclass(frozen=True, slots=True)
class CancelBatch:
    """What a bulk cancel did (or, with ``dry_run``, would do), in one transaction.

    ``cancelled`` are the runs the request reached (now ``cancelling`` or ``cancelled``),
    ``already_final`` the named runs that were final already, ``unknown`` the ids not in the store.
    """

    cancelled: tuple[str, ...]
    already_final: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    dry_run: bool = False
    #: the state of each run named above (not of ``unknown``) once the request was made
    states: dict[str, State] = field(default_factory=dict)
    #: the runs nobody worked, settled by the cancel itself (as a takeover would)
    settled_here: tuple[str, ...] = ()
    #: with ``before_start``: the ids no run had, whose cancel is remembered (else None)
    remembered: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"cancelled", "already_final", "unknown"}``, or ``{"would_cancel"}`` for a dry run."""
        if self.dry_run:
            return {"would_cancel": list(self.cancelled)}
        data: dict[str, Any] = {
            "cancelled": list(self.cancelled),
            "already_final": list(self.already_final),
            "unknown": list(self.unknown),
        }
        if self.remembered is not None:
            data["remembered"] = list(self.remembered)  # cancel --before-start
        return data
