"""``cancel``, ``prune``, ``status`` and ``list``: the commands that only read or request.

They work through a :class:`~haltwise._runtime.seat.Seat` and import neither the machinery that
works runs, nor rich, nor the server, so that ``haltwise cancel ID`` reaches the run in little
more than an interpreter's start. Only what needs more pays for it, when it does: a cancel of a
run nobody works is settled by a :class:`~haltwise.Runtime` (its task's file loaded, when this
project trusts it, so that its compensations and saga run), ``--wait`` waits through one, and a
human summary of a run is drawn by :mod:`.render`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import click

from .._core.approvals import ApprovalRecord
from .._core.exceptions import HaltwiseError, InputError, UnknownRunError
from .._core.records import RunRecord
from .._core.states import State
from .._core.views import CancelBatch, RunDetail, RunPage
from .._runtime.explain import journaled_file, stays_cancelling
from .._runtime.operator import MAX_LIMIT
from .._runtime.seat import (
    CancelResult,
    cancel_batch,
    nobody_works,
    open_seat,
    reading,
    safe_url,
)
from .base import (
    fail,
    json_option,
    looked_in,
    parse_duration,
    print_json,
    run_async,
    store_in_use,
    store_option,
    warn,
)
from .text import note

if TYPE_CHECKING:
    from .._core.outcome import Outcome

__all__ = ["cancel_command", "list_command", "prune_command", "status_command"]


@click.command("cancel")
@click.argument("task_ids", metavar="ID...", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Cancel every active run (see --task, --state).")
@click.option("--task", metavar="TASK", help="With --all: only runs of this task.")
@click.option(
    "--state",
    type=click.Choice([state.value for state in State if not state.is_final]),
    help="With --all: only runs in this state.",
)
@click.option("--reason", default="user", show_default=True, help="Why the runs are stopped.")
@click.option("--force", is_flag=True, help="Stop at once: no grace, no compensation.")
@click.option("--wait", is_flag=True, help="Wait until the runs are final.")
@click.option("--dry-run", is_flag=True, help="With --all: list the runs, change nothing.")
@click.option(
    "--before-start",
    is_flag=True,
    help="An ID no run has yet: remember the cancel (see --ttl); a run started with it is "
    "recorded cancelled at once.",
)
@click.option(
    "--ttl",
    metavar="DURATION",
    default="10m",
    show_default=True,
    help="With --before-start: how long the cancel is remembered (30s, 10m, 1h).",
)
@json_option
@store_option
def cancel_command(
    task_ids: tuple[str, ...],
    every: bool,
    task: str | None,
    state: str | None,
    reason: str,
    force: bool,
    wait: bool,
    dry_run: bool,
    before_start: bool,
    ttl: str,
    as_json: bool,
    store: str | None,
) -> int:
    """Request a cancel of runs ID... (or --all), from any process, in one transaction.

    A run nobody works (its owner is gone, or a worker released it) is settled here, by its
    policies, as a takeover would, and recorded cancelled. With --before-start, an ID no run
    has yet is remembered for --ttl: a run started or submitted with it then is recorded
    cancelled at once, and nothing of it runs.
    """
    _check_selection(task_ids, every, task, state, dry_run)
    if before_start and every:
        raise click.UsageError("--before-start names the runs by ID, not --all")
    seconds = parse_duration(ttl, option="--ttl")
    if before_start and not seconds > 0:
        raise click.BadParameter(
            f"{ttl!r}: the cancel must be remembered for some time", param_hint="--ttl"
        )
    remembered: list[str] = []

    async def main() -> tuple[CancelResult, list[RunRecord]]:
        async with open_seat(store) as seat:
            if before_start:
                result, early = await seat.cancel_before_start(
                    task_ids, reason=reason, force=force, ttl=seconds
                )
                remembered.extend(early)
            else:
                result = await seat.request_cancels(
                    None if every else task_ids,
                    task=task,
                    state=state,
                    reason=reason,
                    force=force,
                    dry_run=dry_run,
                )
            for record in result.already_final:
                await seat.inspect(record.id)  # reported as it is: its journal must be readable
            # (a run the request reached is its columns only: an orphan is loaded whole, to
            # load its task and say why it stays cancelling)
            orphans = [] if dry_run else [r.id for r in result.reached if nobody_works(r)]
            return result, [(await seat.inspect(run_id)).run for run_id in orphans]

    result, orphans = run_async(main)
    finished = _Finished()
    if orphans or (wait and result.reached and not dry_run):
        finished = run_async(lambda: _finish_here(store, result, orphans, reason, force, wait))
    batch = cancel_batch(
        result, after=finished.states, settled_here=finished.settled, dry_run=dry_run
    )
    if before_start:
        batch = replace(batch, remembered=tuple(remembered))
    _report_batch(batch, reason, force, as_json)
    for run_id in [] if as_json else remembered:
        note(
            f"run {run_id} does not exist yet: its cancel is remembered for {ttl}; a run "
            "started or submitted with that id before then is recorded cancelled at once"
        )
    for outcome in [] if as_json else finished.waited:
        _summary(outcome)
    return _exit_of(batch, finished, wait)


@dataclass
class _Finished:
    """What the canceller did beyond the request: orphans settled, left, and waited-for runs."""

    states: dict[str, State] = field(default_factory=dict)
    settled: list[str] = field(default_factory=list)
    #: orphans left ``cancelling``: the one line that says why and what finishes them
    left: dict[str, str] = field(default_factory=dict)
    waited: list[Outcome] = field(default_factory=list)


async def _finish_here(
    store: str | None,
    result: CancelResult,
    orphans: list[RunRecord],
    reason: str,
    force: bool,
    wait: bool,
) -> _Finished:
    """Settle the runs nobody works, with their tasks' code when this project trusts their
    files (as ``resume`` would load them), and with ``wait`` wait for every run reached."""
    from .._runtime.runtime import Runtime

    finished = _Finished()
    unloaded = {run.id: _load_task(run) for run in orphans}
    async with Runtime(store) as runtime:
        for run in orphans:
            after = await runtime.cancel(run.id, reason=reason, force=force)
            finished.states[run.id] = after.state
            if after.state.is_final:
                finished.settled.append(run.id)
            elif after.state is State.CANCELLING and not runtime.is_active(run.id):
                finished.left[run.id] = stays_cancelling(run, unloaded[run.id])
        if wait:
            for reached in result.reached:
                if reached.id not in finished.left:
                    finished.waited.append(await runtime.outcome(reached.id))
    return finished


def _load_task(run: RunRecord) -> str | None:
    """Load an orphan's task from the file its journal names, if trusted (see
    :func:`~.foreground.task_of`); the reason it could not be, else None."""
    from .foreground import task_of

    try:
        task_of(run)
    except HaltwiseError as error:
        return str(error)
    return None


def _exit_of(batch: CancelBatch, finished: _Finished, wait: bool) -> int:
    for words in finished.left.values():
        if wait:
            return fail(words)  # it will not become final here: waiting would never end
        warn(words)
    if len(batch.unknown) == 1:
        return fail(f"{UnknownRunError(batch.unknown[0])} ({looked_in()})")
    if batch.unknown:
        named = ", ".join(map(repr, batch.unknown))
        return fail(f"no runs with ids {named} in the store ({looked_in()})")
    return 0


def _check_selection(
    task_ids: tuple[str, ...], every: bool, task: str | None, state: str | None, dry_run: bool
) -> None:
    if every and task_ids:
        raise click.UsageError("name runs by ID or cancel --all, not both")
    if not every and not task_ids:
        raise click.UsageError("name the runs to cancel (ID...), or --all")
    if not every and (task is not None or state is not None or dry_run):
        raise click.UsageError("--task, --state and --dry-run go with --all")


def _report_batch(batch: CancelBatch, reason: str, force: bool, as_json: bool) -> None:
    if as_json:
        print_json(batch.to_json())
        return
    if batch.dry_run:
        for run_id in batch.cancelled:
            note(f"would cancel run {run_id}")
        note(f"{len(batch.cancelled)} run(s) would be cancelled; nothing changed")
        return
    forced = ", forced" if force else ""
    for run_id in batch.cancelled:
        state = batch.states[run_id]
        note(f"cancel requested for run {run_id} (reason: {reason}{forced}); it is {state}")
        if run_id in batch.settled_here:
            note(f"run {run_id}: nobody was working it; settled here by its policies")
        elif state is State.CANCELLED:
            note(f"run {run_id}: nothing was in flight (pending or paused): cancelled at once")
    for run_id in batch.already_final:
        note(f"run {run_id} is already {batch.states[run_id]}; nothing to cancel")
    if not batch.cancelled and not batch.already_final and not batch.unknown:
        note("no active run to cancel")


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


def _summary(outcome: Outcome) -> None:
    from .render import Screen

    Screen().outcome(outcome)


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
