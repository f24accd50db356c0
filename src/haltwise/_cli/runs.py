"""``run``, ``cancel``, ``status``, ``resume``, ``list`` and ``audit``: the commands on one run."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import click

from .._core.exceptions import HaltwiseError, InputError, UnknownRunError
from .._core.outcome import Outcome
from .._core.records import RunSnapshot
from .._core.states import State
from .._core.views import CancelBatch, RunDetail, RunPage
from .._journal.owner import held_by_live_owner
from .._runtime.operator import MAX_LIMIT, inspect_run, page_of_runs
from .._runtime.runtime import Runtime
from .base import (
    deadline_option,
    exit_code,
    fail,
    json_option,
    looked_in,
    parse_assumed,
    parse_duration,
    print_json,
    reading,
    run_async,
    store_in_use,
    store_option,
)
from .foreground import (
    check_fits,
    check_ours,
    existing_run,
    parse_input,
    run_name,
    signals_as_cancels,
    source_of,
    task_of,
)
from .render import Screen, cancelling_line, pause_line
from .signals import RELAY
from .sources import journaled_file


@click.command("run")
@click.argument("target", metavar="FILE.py:TASK")
@click.option("--input", "input_json", metavar="JSON", help="A JSON object of keyword arguments.")
@click.option("--id", "task_id", metavar="ID", help="The run's id (default: a new one).")
@deadline_option
@json_option
@store_option
def run_command(
    target: str,
    input_json: str | None,
    task_id: str | None,
    deadline: float | None,
    as_json: bool,
    store: str | None,
) -> int:
    """Run a task in the foreground until it ends.

    Ctrl-C (SIGINT) cancels it with reason 'user', SIGTERM with reason 'shutdown'; a second
    signal forces the cancel. If --id names a run that exists and is final, nothing runs and
    that run is reported.
    """
    from .._runtime.loader import load_target

    RELAY.install()  # from now on a signal is queued for the run, never a KeyboardInterrupt
    kwargs = parse_input(input_json)
    module, task = load_target(target)
    if task is None:
        raise InputError(f"{target!r}: name the task to run as FILE.py:TASK")
    source = source_of(target, module.__file__)

    async def main() -> int:
        async with Runtime(store) as runtime:
            if task_id is not None:
                existing = await existing_run(runtime, task_id)
                if existing is not None:
                    return _report(existing, as_json)
            check_fits(task, kwargs, target)
            async with signals_as_cancels(runtime, quiet=as_json) as foreground:
                handle = await runtime._start_named(
                    task,
                    (),
                    kwargs,
                    task_id=task_id,
                    deadline=deadline,
                    name=run_name(target),
                    source=source,
                )
                await check_ours(runtime, handle.id)
                outcome = await foreground.follow(handle.id, Screen())
        return _report(outcome, as_json)

    return run_async(main)


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
    as_json: bool,
    store: str | None,
) -> int:
    """Request a cancel of runs ID... (or --all), from any process, in one transaction.

    A run nobody works (its owner is gone, or a worker released it) is settled here, by its
    policies, as a takeover would, and recorded cancelled.
    """
    _check_selection(task_ids, every, task, state, dry_run)

    async def main() -> tuple[CancelBatch, list[Outcome]]:
        async with Runtime(store) as runtime:
            for run_id in task_ids:
                await _load_if_orphaned(runtime, run_id)
            batch = await runtime.cancel_many(
                None if every else task_ids,
                task=task,
                state=state,
                reason=reason,
                force=force,
                dry_run=dry_run,
            )
            for run_id in batch.already_final:
                await runtime.inspect(run_id)  # reported as it is: its journal must be readable
            waited = [await runtime.outcome(run_id) for run_id in batch.cancelled if wait]
            return batch, waited

    batch, waited = run_async(main)
    if as_json:
        print_json(batch.to_json())
    else:
        _say_cancelled(batch, reason, force)
        for outcome in waited:
            Screen().outcome(outcome)
    if len(batch.unknown) == 1:
        return fail(f"{UnknownRunError(batch.unknown[0])} ({looked_in()})")
    if batch.unknown:
        named = ", ".join(map(repr, batch.unknown))
        return fail(f"no runs with ids {named} in the store ({looked_in()})")
    return 0


async def _load_if_orphaned(runtime: Runtime, run_id: str) -> None:
    """Load the task of a run nobody works, if its file is trusted (see :func:`task_of`), so
    that the cancel settles it with its compensations and saga; otherwise it settles without."""
    try:
        run = (await runtime.inspect(run_id)).run
    except UnknownRunError:
        return  # reported with the others
    if run.state.is_final or held_by_live_owner(run):
        return
    with contextlib.suppress(HaltwiseError):
        task_of(run)


def _check_selection(
    task_ids: tuple[str, ...], every: bool, task: str | None, state: str | None, dry_run: bool
) -> None:
    if every and task_ids:
        raise click.UsageError("name runs by ID or cancel --all, not both")
    if not every and not task_ids:
        raise click.UsageError("name the runs to cancel (ID...), or --all")
    if not every and (task is not None or state is not None or dry_run):
        raise click.UsageError("--task, --state and --dry-run go with --all")


def _say_cancelled(batch: CancelBatch, reason: str, force: bool) -> None:
    screen = Screen()
    if batch.dry_run:
        for run_id in batch.cancelled:
            screen.note(f"would cancel run {run_id}")
        screen.note(f"{len(batch.cancelled)} run(s) would be cancelled; nothing changed")
        return
    forced = ", forced" if force else ""
    for run_id in batch.cancelled:
        state = batch.states[run_id]
        screen.note(f"cancel requested for run {run_id} (reason: {reason}{forced}); it is {state}")
        if run_id in batch.settled_here:
            screen.note(f"run {run_id}: nobody was working it; settled here by its policies")
        elif state is State.CANCELLED:
            screen.note(
                f"run {run_id}: nothing was in flight (pending or paused): cancelled at once"
            )
    for run_id in batch.already_final:
        screen.note(f"run {run_id} is already {batch.states[run_id]}; nothing to cancel")
    if not batch.cancelled and not batch.already_final and not batch.unknown:
        screen.note("no active run to cancel")


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
        async with Runtime(store) as runtime:
            return await runtime.prune(seconds, state=state, dry_run=dry_run)

    ids = run_async(main)
    if as_json:
        print_json({"would_prune" if dry_run else "pruned": ids})
    elif dry_run:
        screen = Screen()
        for run_id in ids:
            screen.note(f"would prune run {run_id}")
        screen.note(f"{len(ids)} run(s) would be pruned; nothing deleted")
    else:
        Screen().note(f"pruned {len(ids)} run(s)")
    return 0


@click.command("status")
@click.argument("task_id", metavar="ID")
@json_option
@store_option
def status_command(task_id: str, as_json: bool, store: str | None) -> int:
    """Show run ID: state, steps, partial results and retry advice."""

    async def main() -> RunDetail:
        async with reading(store) as journal:
            if journal is None:
                raise HaltwiseError(f"no run with id {task_id!r}: there is no store at {where()}")
            return await inspect_run(journal, task_id)

    detail = run_async(main)
    if as_json:
        print_json(detail.outcome.to_json())
    else:
        waiting = cancelling_line(detail.outcome.state, detail.forced, detail.waiting)
        snapshot = RunSnapshot(detail.run, detail.outcome.steps, detail.outcome.partials)
        notes = (_source_words(detail), _owner_words(detail), waiting, pause_line(snapshot))
        Screen().outcome(detail.outcome, notes=notes)
    return 0


@click.command("resume")
@click.argument("task_id", metavar="ID")
@click.argument("file", metavar="[FILE.py]", required=False)
@click.option(
    "--moved",
    is_flag=True,
    help="FILE.py is where the run's file moved to: load it although the journal names another.",
)
@click.option(
    "--assume-done",
    "assume_done",
    metavar="STEP[=JSON]",
    multiple=True,
    callback=parse_assumed,
    help="Count an unknown step as done, with this result (null if omitted). Repeatable.",
)
@click.option(
    "--rerun",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="STEP",
    help="Run an unknown step again. Repeatable.",
)
@deadline_option
@json_option
@store_option
def resume_command(
    task_id: str,
    file: str | None,
    moved: bool,
    assume_done: dict[int, Any],
    rerun: Sequence[int],
    deadline: float | None,
    as_json: bool,
    store: str | None,
) -> int:
    """Continue run ID from its journal, in the foreground (signals as for 'run').

    The task is loaded from the file the journal names if that lies in the current project;
    a file outside it runs only if named as FILE.py (the journal alone never decides what
    runs), and a FILE.py other than the journal's only with --moved.
    """
    RELAY.install()  # from now on a signal is queued for the run, never a KeyboardInterrupt

    async def main() -> int:
        async with Runtime(store) as runtime:
            snapshot = await runtime.store.load(task_id)
            if snapshot.run.state is State.COMPLETED:
                return _report(snapshot.outcome(), as_json)
            task = task_of(snapshot.run, file, moved=moved)
            async with signals_as_cancels(runtime, quiet=as_json) as foreground:
                handle = await runtime.resume(
                    task_id,
                    deadline=deadline,
                    assume_done=assume_done,
                    rerun=set(rerun),
                    task=task,
                )
                outcome = await foreground.follow(handle.id, Screen())
        return _report(outcome, as_json)

    return run_async(main)


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
@json_option
@store_option
def list_command(
    state: str | None, task: str | None, limit: int, as_json: bool, store: str | None
) -> int:
    """List the runs in the store, newest created first."""

    async def main() -> RunPage | None:
        async with reading(store) as journal:
            if journal is None:
                return None  # nothing has run with this store yet: reading creates none
            return await page_of_runs(journal, state=state, task=task, limit=limit, cursor=None)

    page = run_async(main)
    if as_json:
        print_json({"runs": [run.to_json() for run in page.runs] if page else []})
    elif page is None:
        Screen().note(f"no runs: there is no store at {where()}")
    else:
        Screen().runs(page.runs)
    return 0


@click.command("audit")
@click.argument("target", metavar="FILE.py")
@json_option
@click.option("--markdown", is_flag=True, help="Print a Markdown section for a design review.")
@click.option("--strict", is_flag=True, help="Exit 1 if there is any finding.")
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="The deadline runs get: a grace longer than it is a finding.",
)
@store_option
def audit_command(
    target: str,
    as_json: bool,
    markdown: bool,
    strict: bool,
    deadline: float | None,
    store: str | None,
) -> int:
    """Show every tool in FILE.py with its cancel policy, and the gaps (reads no store)."""
    from .._analysis.audit import audit_tools
    from .._runtime.loader import find_tools, load_target

    if as_json and markdown:
        raise click.UsageError("--json and --markdown exclude each other")
    module, _ = load_target(target)
    try:
        report = audit_tools(find_tools(module), deadline=deadline)
    except ValueError as error:
        raise InputError(str(error)) from None
    if as_json:
        click.echo(report.to_json())
    elif markdown:
        click.echo(report.to_markdown())
    else:
        Screen().audit(report)
    return 1 if strict and report.findings else 0


# -- helpers of these commands ----------------------------------------------------------------


def _report(outcome: Outcome, as_json: bool) -> int:
    if as_json:
        print_json(outcome.to_json())
    else:
        Screen().outcome(outcome)
    return exit_code(outcome)


def where() -> str:
    """The store the command looked in, for a message."""
    return store_in_use() or "the default place"


def _source_words(detail: RunDetail) -> str | None:
    """The line ``status`` shows about the file ``resume`` would load the task from."""
    named = journaled_file(detail.run)
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
