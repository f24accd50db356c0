"""``haltwise cancel``: a cancel requested from any process, the command typed under pressure.

Runs named by id are cancelled by :func:`~haltwise._runtime.seat_now.request_cancels_now`: one
transaction on one plain connection, before any event loop exists, so that ``haltwise cancel
ID`` imports neither asyncio, nor anyio, nor a store's machinery, nor rich (the import set is
checked by ``tests/cli/test_cancel_imports.py``). A seat is opened only for what that path
leaves (``--all``, ``--before-start``, a store to create or upgrade) and to look at what the
request found (a final run's journal, a run nobody works); a :class:`~haltwise.Runtime` only to
settle a run nobody works, or to ``--wait``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import click

from .._core.exceptions import HaltwiseError, UnknownRunError
from .._core.states import State
from .._runtime.seat_now import CancelResult, cancel_batch, nobody_works, request_cancels_now
from .base import (
    fail,
    json_option,
    looked_in,
    parse_duration,
    print_json,
    run_async,
    store_option,
    warn,
)
from .text import note

if TYPE_CHECKING:
    from .._core.outcome import Outcome
    from .._core.records import RunRecord
    from .._core.views import CancelBatch

__all__ = ["cancel_command"]


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
    # The common case (runs named by id) is written at once, without an event loop; a seat
    # is opened only for what that path leaves (see request_cancels_now), and to look at
    # what the request found: a final run's journal, a run nobody works.
    result = (
        None
        if every or before_start
        else request_cancels_now(store, task_ids, reason=reason, force=force)
    )

    async def main(quick: CancelResult | None) -> tuple[CancelResult, list[RunRecord]]:
        from .._runtime.seat import open_seat

        async with open_seat(store) as seat:
            result = quick
            if result is None and before_start:
                result, early = await seat.cancel_before_start(
                    task_ids, reason=reason, force=force, ttl=seconds
                )
                remembered.extend(early)
            elif result is None:
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

    orphans: list[RunRecord] = []
    if result is None or result.already_final or any(map(nobody_works, result.reached)):
        result, orphans = run_async(lambda: main(result))
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
    from .._runtime.explain import stays_cancelling
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


def _summary(outcome: Outcome) -> None:
    from .render import Screen

    Screen().outcome(outcome)
