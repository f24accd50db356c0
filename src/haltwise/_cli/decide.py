"""``haltwise approve`` and ``haltwise refuse``: decide a pending approval request, on a
:class:`~haltwise._runtime.seat.Seat` (light: nothing that works runs is imported).
CONTRACT.md, "Someone else decides"."""

from __future__ import annotations

import json
from typing import Any

import click

from .._core.approvals import ApprovalRecord
from .._core.exceptions import InputError
from .._runtime.seat import open_seat
from .base import json_option, print_json, run_async, store_option
from .text import note

__all__ = ["approve_command", "refuse_command"]


def _decide(
    task_id: str,
    step: int,
    *,
    approve: bool,
    edit: dict[str, Any] | None,
    by: str | None,
    note_text: str | None,
    store: str | None,
) -> ApprovalRecord:
    async def main() -> ApprovalRecord:
        async with open_seat(store) as seat:
            return await seat.decide(
                task_id, step, approve=approve, edit=edit, by=by, note=note_text
            )

    return run_async(main)


def _tell(record: ApprovalRecord, as_json: bool) -> int:
    if as_json:
        print_json({"run": record.run_id, "step": record.index, "approval": record.to_json()})
    else:
        who = f" by {record.by}" if record.by else ""
        note(f"run {record.run_id} step {record.index} ({record.tool}): {record.state.value}{who}")
    return 0


def _edit_json(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InputError(f"--edit is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise InputError("--edit must be a JSON object of the call's arguments by name")
    return value


@click.command("approve")
@click.argument("task_id", metavar="ID")
@click.argument("step", type=click.IntRange(min=0))
@click.option("--edit", "edit", metavar="JSON", help="Run the call with these arguments instead.")
@click.option("--by", metavar="WHO", help="Who decides (journaled with the decision).")
@click.option("--note", "note_text", metavar="TEXT", help="A note journaled with the decision.")
@json_option
@store_option
def approve_command(
    task_id: str,
    step: int,
    edit: str | None,
    by: str | None,
    note_text: str | None,
    as_json: bool,
    store: str | None,
) -> int:
    """Approve the pending approval request of step STEP of run ID: the call runs (with the
    --edit arguments, by name, if given; the others keep their value). A request that is not
    awaiting (decided already, expired, cancelled) is refused: exit 2."""
    record = _decide(
        task_id,
        step,
        approve=True,
        edit=_edit_json(edit),
        by=by,
        note_text=note_text,
        store=store,
    )
    return _tell(record, as_json)


@click.command("refuse")
@click.argument("task_id", metavar="ID")
@click.argument("step", type=click.IntRange(min=0))
@click.option("--by", metavar="WHO", help="Who decides (journaled with the decision).")
@click.option("--note", "note_text", metavar="TEXT", help="Why (the task and the model see it).")
@json_option
@store_option
def refuse_command(
    task_id: str, step: int, by: str | None, note_text: str | None, as_json: bool, store: str | None
) -> int:
    """Refuse the pending approval request of step STEP of run ID: the call does not run, the
    task sees ApprovalRefused. A request that is not awaiting is refused: exit 2."""
    record = _decide(
        task_id, step, approve=False, edit=None, by=by, note_text=note_text, store=store
    )
    return _tell(record, as_json)
