"""``run``, ``cancel``, ``status``, ``resume``, ``list`` and ``audit``: the commands on one run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .._core.exceptions import HaltwiseError, InputError
from .._core.outcome import Outcome
from .._core.records import RunRecord
from .._core.states import State
from .._journal.owner import owner_alive
from .._runtime.runtime import Runtime
from .base import (
    deadline_option,
    exit_code,
    json_option,
    parse_assumed,
    print_json,
    reading,
    run_async,
    store_in_use,
    store_option,
    warn,
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
                handle = await runtime.start_named(
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
@click.argument("task_id", metavar="ID")
@click.option("--reason", default="user", show_default=True, help="Why the run is stopped.")
@click.option("--force", is_flag=True, help="Stop at once: no grace, no compensation.")
@click.option("--wait", is_flag=True, help="Wait until the run is final.")
@store_option
def cancel_command(task_id: str, reason: str, force: bool, wait: bool, store: str | None) -> int:
    """Request a cancel of run ID, from any process."""
    screen = Screen()

    async def main() -> int:
        async with Runtime(store) as runtime:
            before = (await runtime.store.load(task_id)).run
            if before.state.is_final:
                screen.note(f"run {task_id} is already {before.state}; nothing to cancel")
                return 0
            record = await runtime.cancel(task_id, reason=reason, force=force)
            screen.note(_cancel_words(record, force, before.state))
            gone = _owner_gone(record)
            if gone:
                warn(
                    f"{gone}; the cancel completes when the run is taken over "
                    f"(haltwise resume {task_id}, or a worker)"
                )
            if wait and not record.state.is_final:
                screen.outcome(await runtime.outcome(task_id))
        return 0

    return run_async(main)


@click.command("status")
@click.argument("task_id", metavar="ID")
@json_option
@store_option
def status_command(task_id: str, as_json: bool, store: str | None) -> int:
    """Show run ID: state, steps, partial results and retry advice."""

    async def main() -> int:
        async with reading(store) as journal:
            if journal is None:
                raise HaltwiseError(f"no run with id {task_id!r}: there is no store at {where()}")
            snapshot = await journal.load(task_id)
        outcome = snapshot.outcome()
        if as_json:
            print_json(outcome.to_json())
        else:
            notes = (
                _source_words(snapshot.run),
                _owner_words(snapshot.run),
                cancelling_line(snapshot),
                pause_line(snapshot),
            )
            Screen().outcome(outcome, notes=notes)
        return 0

    return run_async(main)


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
@json_option
@store_option
def list_command(state: str | None, as_json: bool, store: str | None) -> int:
    """List the runs in the store, oldest first."""

    async def main() -> list[Outcome] | None:
        async with reading(store) as journal:
            if journal is None:
                return None  # nothing has run with this store yet: reading creates none
            runs = await journal.list_runs(State(state) if state else None)
            return [(await journal.load(run.id)).outcome() for run in runs]

    outcomes = run_async(main)
    if as_json:
        print_json({"runs": [_run_row(outcome) for outcome in outcomes or ()]})
    elif outcomes is None:
        Screen().note(f"no runs: there is no store at {where()}")
    else:
        Screen().runs(outcomes)
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


def _run_row(outcome: Outcome) -> dict[str, Any]:
    return {
        "id": outcome.id,
        "task": outcome.task,
        "state": outcome.state.value,
        "reason": outcome.reason,
        "retry": outcome.retry.value,
    }


def where() -> str:
    """The store the command looked in, for a message."""
    return store_in_use() or "the default place"


def _owner_gone(run: RunRecord) -> str | None:
    """``"its owner (pid ...) is gone"`` for an active run whose owner died, else None."""
    if run.state.is_final or run.owner is None:
        return None
    if owner_alive(run.owner, run.lease_until):
        return None
    return f"its owner ({run.owner.describe()}) is gone"


def _source_words(run: RunRecord) -> str | None:
    """The line ``status`` shows about the file ``resume`` would load the task from."""
    named = journaled_file(run)
    return f"source: {named}" if named is not None else None


def _owner_words(run: RunRecord) -> str | None:
    """The line ``status`` shows about who holds an active run."""
    if run.state.is_final:
        return None
    if run.owner is None:
        return f"owner: none (waiting for a worker, or: haltwise resume {run.id})"
    gone = _owner_gone(run)
    if gone:
        return f"{gone}: continue it with 'haltwise resume {run.id}'"
    return f"owner: {run.owner.describe()}"


def _cancel_words(run: RunRecord, force: bool, before: State) -> str:
    if run.state is State.CANCELLED and before is State.PAUSED:
        return f"run {run.id} was {State.PAUSED}: cancelled at once (nothing was in flight)"
    if run.state is State.CANCELLED:
        return f"run {run.id} was {State.PENDING}: cancelled before it began"
    forced = ", forced" if force else ""
    return f"cancel requested for run {run.id} (reason: {run.reason}{forced}); it is {run.state}"
