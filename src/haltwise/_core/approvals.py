"""Approvals: a person decides before a call runs (CONTRACT.md, "Someone else decides").

The vocabulary only: the states of a request, the request as the journal holds it, the decision
a task sees, and the one rule of deciding (:func:`check_decidable`: a decision is used once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, final

from .exceptions import ApprovalConflictError, InputError

__all__ = [
    "ApprovalRecord",
    "ApprovalState",
    "Decision",
    "check_decidable",
    "check_edit",
    "decided_state",
]


class ApprovalState(StrEnum):
    """The state of one approval request."""

    #: journaled, waiting for a decision
    AWAITING = "awaiting"
    #: approved: the call runs with the arguments it asked for
    APPROVED = "approved"
    #: approved with edited arguments: the call runs with those
    EDITED = "edited"
    #: refused: the call never runs
    REFUSED = "refused"
    #: nobody decided within the request's timeout: refused
    EXPIRED = "expired"
    #: the run was cancelled while the request waited: no later decision applies
    CANCELLED = "cancelled"

    @property
    def allows_call(self) -> bool:
        """Whether the call runs (approved, as asked or edited)."""
        return self in (ApprovalState.APPROVED, ApprovalState.EDITED)


@final
@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval request as the journal holds it: bound to the run, the step, the tool and
    the fingerprint of the arguments the task asked for; ``arguments`` are those (by parameter
    name) for the approver to see, ``edited`` the ones an edit ran the call with."""

    run_id: str
    index: int
    tool: str
    fingerprint: str | None
    arguments: dict[str, Any]
    state: ApprovalState
    requested_at: float
    timeout_at: float | None
    by: str | None = None
    at: float | None = None
    note: str | None = None
    edited: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The step's ``"approval"`` object in ``status --json``."""
        return {"state": self.state.value, "by": self.by, "at": self.at, "note": self.note}


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`haltwise.approval` returns: whether the request was approved, by whom, the
    approver's note, and the payload (the edited one, if it was edited)."""

    approved: bool
    by: str | None
    note: str | None
    payload: Any


def decided_state(approve: bool, edit: object) -> ApprovalState:
    """The state a decision records: approved, edited (approved with an edit) or refused."""
    if not approve:
        return ApprovalState.REFUSED
    return ApprovalState.EDITED if edit is not None else ApprovalState.APPROVED


def check_decidable(run_id: str, index: int, record: ApprovalRecord | None) -> None:
    """A decision is used once: refuse one on a request that is not awaiting, naming what
    happened to it (:class:`ApprovalConflictError`)."""
    if record is None:
        raise ApprovalConflictError(
            f"run {run_id!r} step {index}: no approval request awaits a decision there",
            task_id=run_id,
        )
    if record.state is ApprovalState.AWAITING:
        return
    who = f" by {record.by}" if record.by else ""
    raise ApprovalConflictError(
        f"run {run_id!r} step {index}: the approval request is {record.state.value}{who}; "
        "a decision is used once",
        task_id=run_id,
        state=record.state.value,
    )


def check_edit(tool: str, schema: str, arguments: dict[str, Any]) -> None:
    """Refuse (:class:`~haltwise.InputError`, one line naming the first misfit) edited
    ``arguments`` that do not fit ``schema``, the JSON schema of the tool's parameters recorded
    with its request: any process validates an edit so, without importing the tool. A name
    the schema does not list is refused too. (jsonschema: the reference validator of the JSON
    Schema dialect pydantic writes, ``$defs`` and ``$ref`` included.)"""
    import jsonschema  # here: only a decision with an edit needs it

    described = json.loads(schema)
    known = described.get("properties")
    if isinstance(known, dict):
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise InputError(f"tool {tool!r} has no parameter {unknown[0]!r}")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(described).iter_errors(arguments)
    )
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path) or "the arguments"
        message = " ".join(error.message.split())
        if len(message) > 200:
            message = message[:197] + "..."
        raise InputError(f"the arguments do not fit tool {tool!r}: {where}: {message}")
