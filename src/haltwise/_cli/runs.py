"""``run``, ``resume`` and ``audit``: the commands that run a task or load its file.

(The commands that only read or request, ``cancel``, ``status``, ``list``, ``prune``, are in
:mod:`.operate`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .._core.budget import Budget
from .._core.exceptions import InputError
from .._core.outcome import Outcome
from .._core.states import State, StepStatus
from .._runtime import lowlevel
from .._runtime.runtime import Runtime
from .base import (
    budget_option,
    deadline_option,
    exit_code,
    json_option,
    parse_assumed,
    print_json,
    run_async,
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
from .render import Screen
from .signals import RELAY


@click.command("run")
@click.argument("target", metavar="FILE.py:TASK")
@click.option("--input", "input_json", metavar="JSON", help="A JSON object of keyword arguments.")
@click.option("--id", "task_id", metavar="ID", help="The run's id (default: a new one).")
@deadline_option
@budget_option
@json_option
@store_option
def run_command(
    target: str,
    input_json: str | None,
    task_id: str | None,
    deadline: float | None,
    budget: Budget | None,
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
                existing = await existing_run(runtime, task_id, run_name(target), kwargs)
                if existing is not None:
                    return _report(existing, as_json)
            check_fits(task, kwargs, target)
            async with signals_as_cancels(runtime, quiet=as_json) as foreground:
                handle = await lowlevel.launch(
                    runtime,
                    task,
                    (),
                    kwargs,
                    task_id=task_id,
                    deadline=deadline,
                    name=run_name(target),
                    source=source,
                    budget=budget,
                )
                await check_ours(runtime, handle.id)
                outcome = await foreground.follow(handle.id, Screen())
        return _report(outcome, as_json)

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
@click.option(
    "--allow-code-change",
    is_flag=True,
    help="Resume although the task's file changed since the run started (recorded in its events).",
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
    allow_code_change: bool,
    deadline: float | None,
    as_json: bool,
    store: str | None,
) -> int:
    """Continue run ID from its journal, in the foreground (signals as for 'run').

    The task is loaded from the file the journal names if that lies in the current project;
    a file outside it runs only if named as FILE.py (the journal alone never decides what
    runs), and a FILE.py other than the journal's only with --moved. A file whose content
    is not the one the run recorded when it started is refused (exit 2, naming the file and
    both digests) unless --allow-code-change.
    """
    RELAY.install()  # from now on a signal is queued for the run, never a KeyboardInterrupt

    async def main() -> int:
        async with Runtime(store) as runtime:
            detail = await runtime.inspect(task_id)
            if detail.run.state is State.COMPLETED:
                return _report(detail.outcome, as_json)
            task = task_of(detail.run, file, moved=moved, allow_code_change=allow_code_change)
            async with signals_as_cancels(runtime, quiet=as_json) as foreground:
                handle = await runtime.resume(
                    task_id,
                    deadline=deadline,
                    assume_done=assume_done,
                    rerun=set(rerun),
                    task=task,
                    allow_code_change=allow_code_change,
                )
                outcome = await foreground.follow(handle.id, Screen())
        return _report(outcome, as_json)

    return run_async(main)


@click.command("reconcile")
@click.argument("task_id", metavar="ID")
@click.argument("file", metavar="[FILE.py]", required=False)
@click.option(
    "--moved",
    is_flag=True,
    help="FILE.py is where the run's file moved to: load it although the journal names another.",
)
@json_option
@store_option
def reconcile_command(
    task_id: str, file: str | None, moved: bool, as_json: bool, store: str | None
) -> int:
    """Ask the reconcile hooks of run ID's unknown steps what happened, and journal the answers.

    Exit 0 if no step is left unknown, 1 otherwise; 2 for a run still active (its hooks are
    asked by whoever resumes it or takes it over). The task's file is loaded as 'resume'
    loads it. Nothing is resumed.
    """

    async def main() -> int:
        async with Runtime(store) as runtime:
            detail = await runtime.inspect(task_id)
            task = task_of(detail.run, file, moved=moved)
            outcome = await runtime.reconcile(task_id, task=task)
        if as_json:
            print_json(outcome.to_json())
        else:
            Screen().outcome(outcome)
        return 1 if any(step.status is StepStatus.UNKNOWN for step in outcome.steps) else 0

    return run_async(main)


@click.command("audit")
@click.argument("target", metavar="FILE.py")
@json_option
@click.option("--markdown", is_flag=True, help="Print a Markdown section for a design review.")
@click.option("--strict", is_flag=True, help="Exit 1 if there is any finding (but no-budget ones).")
@click.option(
    "--strict-budget", is_flag=True, help="With --strict, exit 1 on a no-budget finding too."
)
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
    strict_budget: bool,
    deadline: float | None,
    store: str | None,
) -> int:
    """Show every tool in FILE.py with its cancel policy, and the gaps (reads no store)."""
    from .._analysis.audit import audit_tools
    from .._runtime.loader import find_tasks, find_tools, load_target

    if as_json and markdown:
        raise click.UsageError("--json and --markdown exclude each other")
    module, _ = load_target(target)
    try:
        report = audit_tools(
            find_tools(module),
            deadline=deadline,
            tasks=find_tasks(module),
            namespace=vars(module),
        )
    except ValueError as error:
        raise InputError(str(error)) from None
    if as_json:
        click.echo(report.to_json())
    elif markdown:
        click.echo(report.to_markdown())
    else:
        Screen().audit(report)
    return 1 if strict and report.fails(strict_budget=strict_budget) else 0


# -- helpers of these commands ----------------------------------------------------------------


def _report(outcome: Outcome, as_json: bool) -> int:
    if as_json:
        print_json(outcome.to_json())
    else:
        Screen().outcome(outcome)
    return exit_code(outcome)
