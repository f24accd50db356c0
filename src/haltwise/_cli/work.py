"""``haltwise submit`` and ``haltwise worker``: a queue of runs and the processes that work it."""

from __future__ import annotations

import os
import signal

import anyio
import click

from .._core.budget import Budget
from .._core.exceptions import BadRow, InputError
from .._core.outcome import Outcome
from .._runtime.runtime import Runtime
from .._runtime.tool import Task
from .._runtime.worker import Worker
from .base import budget_option, run_async, store_option
from .foreground import check_fits, claimed_names, parse_input, run_name, source_of
from .text import escape_controls


@click.command("submit")
@click.argument("target", metavar="FILE.py:TASK")
@click.option("--input", "input_json", metavar="JSON", help="A JSON object of keyword arguments.")
@click.option("--id", "task_id", metavar="ID", help="The run's id (default: a new one).")
@budget_option
@store_option
def submit_command(
    target: str,
    input_json: str | None,
    task_id: str | None,
    budget: Budget | None,
    store: str | None,
) -> int:
    """Record a pending run for a worker and print its id alone on stdout.

    An id that exists is printed as it is, and nothing is recorded.
    """
    from .._runtime.loader import load_target

    kwargs = parse_input(input_json)
    module, task = load_target(target)
    if task is None:
        raise InputError(f"{target!r}: name the task to submit as FILE.py:TASK")
    check_fits(task, kwargs, target)

    async def main() -> str:
        async with Runtime(store) as runtime:
            run_id, _ = await runtime.submit(
                task,
                (),
                kwargs,
                task_id=task_id,
                name=run_name(target),
                source=source_of(target, module.__file__),
                budget=budget,
            )
            return run_id

    click.echo(run_async(main))
    return 0


#: The most runs one worker may work at a time (a bigger number is a typo, and overflowed the
#: store's integer when it was passed on as a query limit).
MAX_CONCURRENCY = 10_000


@click.command("worker")
@click.argument("file", metavar="FILE.py")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=MAX_CONCURRENCY),
    default=4,
    show_default=True,
    help="How many runs to work at a time.",
)
@store_option
def worker_command(file: str, concurrency: int, store: str | None) -> int:
    """Work pending runs of the tasks in FILE.py, and take over runs whose owner is gone.

    SIGINT or SIGTERM: stop taking runs, let in-flight steps settle by their policies, hand
    the runs over (they stay running; another worker takes them at once) and exit 0. A second
    signal exits at once, as after a crash (exit code 128 + the signal's number).
    """
    from .._runtime.loader import load_module

    module = load_module(file)
    tasks = {name: obj for name, obj in vars(module).items() if isinstance(obj, Task)}
    if not tasks:
        raise InputError(f"{file}: no @haltwise.task in this file")

    async def main() -> int:
        async with Runtime(store) as runtime:
            worker = Worker(
                runtime,
                claimed_names(file, tasks),
                concurrency=concurrency,
                on_hand_over=_say_handing_over,
                on_bad_row=_say_skipping,
                on_run=_say_run,
            )
            stop = anyio.Event()
            async with anyio.create_task_group() as group:
                group.start_soon(_stop_on_signals, stop)
                await worker.serve(stop)
                group.cancel_scope.cancel()
        return 0

    return run_async(main)


def _say_run(run_id: str, outcome: Outcome | None) -> None:
    """A line on stderr per run this worker starts working and per run that ends here."""
    shown = escape_controls(run_id)
    if outcome is None:
        click.echo(f"haltwise: working run {shown}", err=True)
        return
    reason = f" ({escape_controls(outcome.reason)})" if outcome.reason else ""
    click.echo(f"haltwise: run {shown} {outcome.state.value}{reason}", err=True)


def _say_skipping(row: BadRow) -> None:
    click.echo(f"haltwise: skipping a run: {row.describe()}", err=True)


def _say_handing_over(runs: int) -> None:
    click.echo(f"haltwise: handing over {runs} run(s)", err=True)


async def _stop_on_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if stop.is_set():
                os._exit(128 + signum)  # the second signal: at once, as after a crash
            click.echo(
                f"haltwise: worker stopping ({signal.Signals(signum).name}): handing its runs "
                "over; a second signal exits at once",
                err=True,
            )
            stop.set()
