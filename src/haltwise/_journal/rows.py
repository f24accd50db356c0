"""Row <-> record conversion shared by the SQL stores (column names are the same in both)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.outcome import ErrorInfo, StepRecord
from .._core.policy import Effect
from .._core.records import Event, Owner, PartialKey, RunRecord, dump_json, load_json
from .._core.states import State, StepStatus
from .store import UNSET

RUN_COLUMNS = (
    "id, task, state, inputs, reason, force, result, error, cancel_error, owner, lease_until, "
    "parent, created_at, updated_at"
)
STEP_COLUMNS = (
    "idx, tool, cancel, effect, idempotent, status, attempts, result, error, idem_key, args, "
    "cleanup, call_id, fingerprint"
)


def error_to_text(error: ErrorInfo | None) -> str | None:
    return None if error is None else json.dumps(error.to_json())


def error_from_text(text: str | None) -> ErrorInfo | None:
    if text is None:
        return None
    data = json.loads(text)
    return ErrorInfo(type=data["type"], message=data["message"])


def run_from_row(row: Mapping[str, Any]) -> RunRecord:
    return RunRecord(
        id=row["id"],
        task=row["task"],
        state=State(row["state"]),
        inputs=json.loads(row["inputs"]),
        reason=row["reason"],
        force=bool(row["force"]),
        result=load_json(row["result"]),
        error=error_from_text(row["error"]),
        cancel_error=error_from_text(row["cancel_error"]),
        owner=Owner.from_json(row["owner"]) if row["owner"] else None,
        lease_until=row["lease_until"],
        parent=row["parent"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


#: value -> member, a dict lookup: calling the enum costs more, and a load converts every step
_EFFECTS = {effect.value: effect for effect in Effect}
_STEP_STATUSES = {status.value: status for status in StepStatus}


def step_from_row(row: Sequence[Any]) -> StepRecord:
    """A step from a row of ``STEP_COLUMNS``, in that order.

    By position, not by name: a load converts every step of the run, and looking columns up by
    name cost about a third of it.
    """
    (
        index,
        tool,
        cancel,
        effect,
        idempotent,
        status,
        attempts,
        result,
        error,
        key,
        args,
        cleanup,
        call_id,
        fingerprint,
    ) = row
    return StepRecord(
        index=index,
        tool=tool,
        cancel=cancel,
        effect=_EFFECTS[effect],
        idempotent=bool(idempotent),
        status=_STEP_STATUSES[status],
        attempts=attempts,
        result=None if result is None else json.loads(result),
        error=error_from_text(error),
        idempotency_key=key,
        args=None if args is None else json.loads(args),
        cleanup=bool(cleanup),
        call_id=call_id,
        fingerprint=fingerprint,
    )


#: The columns of a partial result that say where it came from (see :func:`partial_key`).
PARTIAL_COLUMNS = "value, step, ordinal, seq"


def partial_key(step: int | None, ordinal: int | None, seq: int) -> PartialKey:
    """Who emitted a partial: ``(step index or None for the task's own code, ordinal)``.

    A row written before schema version 3 has neither: it counts as the task's own ``seq``-th.
    """
    return (step, seq if ordinal is None else ordinal)


def event_from_row(row: Mapping[str, Any]) -> Event:
    return Event(
        run_id=row["run_id"],
        seq=row["seq"],
        source=State(row["source"]) if row["source"] else None,
        target=State(row["target"]),
        reason=row["reason"],
        at=row["at"],
    )


def transition_fields(
    target: State,
    *,
    reason: Any,
    result: Any,
    error: Any,
    cancel_error: Any,
    owner: Any,
    lease_until: Any,
) -> dict[str, Any]:
    """The run columns a :meth:`Store.transition` writes (arguments left ``UNSET`` are kept).

    Entering ``running`` clears ``force``: a resumed run starts with no cancel pending.
    """
    fields: dict[str, Any] = {"state": target.value}
    if reason is not UNSET:
        fields["reason"] = reason
    if result is not UNSET:
        fields["result"] = dump_json(result, "the task's result")
    if error is not UNSET:
        fields["error"] = error_to_text(error)
    if cancel_error is not UNSET:
        fields["cancel_error"] = error_to_text(cancel_error)
    if owner is not UNSET:
        fields["owner"] = owner.to_json() if owner else None
        fields["owner_token"] = owner.token if owner else None
    if lease_until is not UNSET:
        fields["lease_until"] = lease_until
    if target is State.RUNNING:
        fields["force"] = False
    return fields
