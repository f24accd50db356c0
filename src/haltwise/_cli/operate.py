"""``prune``, ``status`` and ``list``: commands that only read or request (``cancel`` has its
own module, :mod:`.cancel`).

They work through a :class:`~haltwise._runtime.seat.Seat` and import neither the machinery that
works runs, nor the server; a human summary of a run is drawn by :mod:`.render` (rich) only
when one is printed.
"""

from __future__ import annotations

import json

import click

from .._core.approvals import ApprovalRecord
from .._core.exceptions import HaltwiseError, InputError
from .._core.states import State
from .._core.views import RunDetail, RunPage
from .._runtime.explain import journaled_file
from .._runtime.operator import MAX_LIMIT
from .._runtime.seat import open_seat, reading, safe_url
from .base import (
    json_option,
    parse_duration,
    print_json,
    run_async,
    store_in_use,
    store_option,
)
from .text import note

__all__ = ["list_command", "prune_command", "status_command"]


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="DURATION",
    help="Delete final runs that ended longer ago than this: 30d, 12h, 90m, 45s.",
)
@click.option(
    "--state",
    type=click.Choice([state.value for state in State if state.is_final]),
    help="Only runs in this final state.",
)
@click.option("--dry-run", is_flag=True, help="List the runs, delete nothing.")
@json_option
@store_option
def prune_command(
    older_than: str, state: str | None, dry_run: bool, as_json: bool, store: str | None
) -> int:
    """Delete final runs (steps, partial results, history) that ended long enough ago.

    An active run is never deleted.
    """
    seconds = parse_duration(older_than)

    async def main() -> list[str]:
        async with open_seat(store) as seat:
            return await seat.prune(seconds, state=state, dry_run=dry_run)

    ids = run_async(main)
    if as_json:
        print_json({"would_prune" if dry_run else "pruned": ids})
    elif dry_run:
        for run_id in ids:
            note(f"would prune run {run_id}")
        note(f"{len(ids)} run(s) would be pruned; nothing deleted")
    else:
        note(f"pruned {len(ids)} run(s)")
    return 0


@click.command("status")
@click.argument("task_id", metavar="ID")
@json_option
@store_option
def status_command(task_id: str, as_json: bool, store: str | None) -> int:
    """Show run ID: state, steps, partial results and retry advice."""

    async def main() -> RunDetail:
        async with reading(store) as seat:
            if seat is None:
                refuse_missing_folder(store)
                raise HaltwiseError(f"no run with id {task_id!r}: there is no store at {where()}")
            return await seat.inspect(task_id)

    detail = run_async(main)
    if as_json:
        print_json(detail.status_json())
        return 0
    from .._core.records import RunSnapshot
    from .render import Screen, cancelling_line, pause_line

    waiting = cancelling_line(detail.outcome.state, detail.forced, detail.waiting)
    snapshot = RunSnapshot(detail.run, detail.outcome.steps, detail.outcome.partials)
    notes = (_source_words(detail), _owner_words(detail), waiting, pause_line(snapshot))
    Screen().outcome(detail.outcome, notes=notes)
    return 0


@click.command("list")
@click.option(
    "--state",
    type=click.Choice([state.value for state in State]),
    help="Only runs in this state.",
)
@click.option("--task", metavar="TASK", help="Only runs of this task (agent.py:research).")
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=MAX_LIMIT),
    default=100,
    show_default=True,
    help="At most this many runs.",
)
@click.option(
    "--awaiting", is_flag=True, help="List the approval requests awaiting a decision instead."
)
@json_option
@store_option
def list_command(
    state: str | None,
    task: str | None,
    limit: int,
    awaiting: bool,
    as_json: bool,
    store: str | None,
) -> int:
    """List the runs in the store, newest created first (--awaiting: the pending approval
    requests, oldest first)."""
    if awaiting:
        return _list_awaiting(as_json, store)

    async def main() -> RunPage | None:
        async with reading(store) as seat:
            if seat is None:
                refuse_missing_folder(store)
                return None  # nothing has run with this store yet: reading creates none
            return await seat.list_runs(state=state, task=task, limit=limit)

    page = run_async(main)
    if as_json:
        print_json({"runs": [run.to_json() for run in page.runs] if page else []})
    elif page is None:
        note(f"no runs: there is no store at {where()}")
    else:
        from .render import Screen

        Screen().runs(page.runs)
    return 0


# -- helpers of these commands ----------------------------------------------------------------


def _list_awaiting(as_json: bool, store: str | None) -> int:
    """``list --awaiting``: the object of ``GET /api/approvals``, or one line a request."""

    async def main() -> list[ApprovalRecord]:
        async with reading(store) as seat:
            return [] if seat is None else await seat.approvals()

    async def main_json() -> str:
        async with reading(store) as seat:
            return '{"approvals": []}' if seat is None else await seat.pending_approvals_json()

    if as_json:
        click.echo(json.dumps(json.loads(run_async(main_json))))  # (one line, as print_json)
        return 0
    pending = run_async(main)
    if not pending:
        note("no approval request awaits a decision")
    for record in pending:
        arguments = json.dumps(record.arguments)
        click.echo(f"{record.run_id}\t{record.index}\t{record.tool}\t{arguments}")
    return 0


def refuse_missing_folder(store: str | None) -> None:
    """Raise :class:`InputError` naming the folder when the store named by ``--store`` or
    ``$HALTWISE_STORE`` is a SQLite file in a folder that does not exist: a typo in a path, not
    a project where nothing has run yet (the default store's folder is made by the first run).
    Nothing is created."""
    import os
    from pathlib import Path
    from urllib.parse import urlsplit

    named = store or os.environ.get("HALTWISE_STORE")
    if not named or not named.startswith("sqlite:"):
        return
    folder = Path(urlsplit(named).path[1:]).parent
    if not folder.is_dir():
        raise InputError(
            f"--store {safe_url(named)}: there is no store there (no folder {str(folder)!r})"
        )


def where() -> str:
    """The store the command looked in, for a message."""
    return store_in_use() or "the default place"


def _source_words(detail: RunDetail) -> str | None:
    """The line ``status`` shows about the file ``resume`` would load the task from."""
    named = journaled_file(detail.run)
    code = detail.outcome.code
    if code is not None:
        changed = " (changed since the run started: resume refuses it)" if code.changed else ""
        return f"source: {code.file}, sha256 {code.digest[:12]}{changed}"
    return f"source: {named}" if named is not None else None


def _owner_words(detail: RunDetail) -> str | None:
    """The line ``status`` shows about who holds an active run."""
    run_id, owner = detail.outcome.id, detail.owner
    if detail.outcome.state.is_final:
        return None
    if owner is None:
        return f"owner: none (waiting for a worker, or: haltwise resume {run_id})"
    if not detail.owner_alive:
        return (
            f"its owner ({owner.describe()}) is gone: continue it with 'haltwise resume {run_id}'"
        )
    return f"owner: {owner.describe()}"
