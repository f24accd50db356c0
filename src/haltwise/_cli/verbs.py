"""``pause``, ``unpause`` and ``fork``: the stopping verbs beyond cancel (CONTRACT.md).

``pause ID`` records the request and returns (``--wait``: until the run is paused or final);
``unpause ID`` undoes it, and continues in the foreground a paused run whose owner is gone
(exit code by its final state, signals as for ``run``). Asking either of a run it does not apply
to (final, cancelling, not paused) says so and exits 0, as ``cancel`` of a final run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .._core.records import RunRecord
from .._core.states import State
from .._runtime.seat import Seat, held_by_live_owner, open_seat
from .base import deadline_option, exit_code, json_option, print_json, run_async, store_option
from .text import note

if TYPE_CHECKING:
    from .._core.budget import Budget
    from .._runtime.fork import ForkPlan

__all__ = ["fork_command", "pause_command", "unpause_command"]


@click.command("pause")
@click.argument("task_id", metavar="ID")
@click.option("--wait", is_flag=True, help="Wait until the run is paused (or final).")
@json_option
@store_option
def pause_command(task_id: str, wait: bool, as_json: bool, store: str | None) -> int:
    """Ask run ID to pause at its next checkpoint, from any process; nothing is cancelled.

    Steps in flight run to their end whatever their policy, then the run waits, paused, until
    'haltwise unpause ID'. A cancel of a paused run ends it cancelled at once, or, when it has
    something to settle (a child run paused with it, an on_cancel="compensate" saga to run),
    makes it cancelling until that is done.
    """

    async def main() -> int:
        async with open_seat(store) as seat:
            record = await seat.request_pause(task_id)
            if wait and record.pause:
                record = await _until_paused(seat, task_id)
        _tell(record, _pause_words(record), as_json)
        return 0

    return run_async(main)


@click.command("unpause")
@click.argument("task_id", metavar="ID")
@click.option(
    "--budget",
    metavar="usd=N,tokens=N,tool_calls=N",
    help="Raise the run's budget as it goes on (a run paused with reason 'budget'); "
    "the limits given replace the run's, the others stay.",
)
@json_option
@store_option
def unpause_command(task_id: str, budget: str | None, as_json: bool, store: str | None) -> int:
    """Undo a pause of run ID: it goes on where it waits.

    A paused run whose owner is gone is continued here from its journal, in the foreground
    (signals as for 'run'; exit code by its final state). A run paused for its budget and
    unpaused without --budget raising the limit it reached pauses again at its next step.
    """
    from .._core.budget import parse_budget

    raised = None if budget is None else parse_budget(budget)

    async def main() -> int:
        async with open_seat(store) as seat:
            run = (await seat.inspect(task_id)).run
            if run.state is not State.PAUSED or held_by_live_owner(run):
                record = await seat.request_unpause(task_id, budget=raised)
                _tell(record, _unpause_words(run, record), as_json)
                return 0
        # its owner is gone: it goes on here
        return await _continue_here(store, run, as_json, budget=raised)

    return run_async(main)


@click.command("fork")
@click.argument("task_id", metavar="ID")
@click.option(
    "--from-step",
    "from_step",
    type=click.IntRange(min=0),
    required=True,
    metavar="N",
    help="The first step the fork runs anew; the steps before it are replayed from ID.",
)
@click.option("--id", "new_id", metavar="NEW", help="The fork's id (default: a new one).")
@click.option("--dry-run", is_flag=True, help="Only say what would run again; start nothing.")
@deadline_option
@json_option
@store_option
def fork_command(
    task_id: str,
    from_step: int,
    new_id: str | None,
    dry_run: bool,
    deadline: float | None,
    as_json: bool,
    store: str | None,
) -> int:
    """Start a new run of ID's task and inputs from step N, in the foreground.

    Steps before N are ID's own, replayed (not run); the rest run anew. First it lists the
    committed write and external steps from N on, which the fork makes happen again;
    --dry-run stops there. ID itself is not changed. Signals and exit code as for 'run'.
    """

    from .._runtime.runtime import Runtime
    from .foreground import signals_as_cancels, task_of
    from .render import Screen

    async def main() -> int:
        async with Runtime(store) as runtime:
            plan = await runtime.fork_plan(task_id, from_step=from_step, new_id=new_id)
            if dry_run:
                _show_plan(plan, new_id, as_json, final=True)
                return 0
            task = task_of((await runtime.inspect(task_id)).run)
            _show_plan(plan, new_id, as_json, final=False)
            async with signals_as_cancels(runtime, quiet=as_json) as foreground:
                handle = await runtime.fork(
                    task_id, from_step=from_step, new_id=new_id, task=task, deadline=deadline
                )
                outcome = await foreground.follow(handle.id, Screen())
        if as_json:
            print_json({**outcome.to_json(), "fork": plan.to_json()})
        else:
            Screen().outcome(outcome)
        return exit_code(outcome)

    return run_async(main)


def _show_plan(plan: ForkPlan, new_id: str | None, as_json: bool, *, final: bool) -> None:
    """Say what the fork runs again: on stdout, before anything runs (JSON: at the end,
    inside the one object, except for --dry-run)."""
    if as_json:
        if final:
            print_json({**plan.to_json(), "id": new_id})
        return
    head = f"fork of run {plan.source} from step {plan.from_step}"
    if plan.from_step:
        head += f": steps 0-{plan.from_step - 1} replayed from it"
    if not plan.repeated:
        note(f"{head}; no committed write or external step runs again")
        return
    note(f"{head}; these committed steps will run again:")
    for step in plan.repeated:
        note(f"  step {step.index} {step.tool} ({step.effect.value})")


async def _continue_here(
    store: str | None, run: RunRecord, as_json: bool, *, budget: Budget | None = None
) -> int:
    """Continue a paused run whose owner is gone, here in the foreground (as ``resume``)."""
    from .._runtime.runtime import Runtime
    from .foreground import signals_as_cancels, task_of
    from .render import Screen

    task = task_of(run)
    async with Runtime(store) as runtime, signals_as_cancels(runtime, quiet=as_json) as foreground:
        await runtime.unpause(run.id, task=task, budget=budget)
        outcome = await foreground.follow(run.id, Screen())
    if as_json:
        print_json(outcome.to_json())
    else:
        Screen().outcome(outcome)
    return exit_code(outcome)


async def _until_paused(seat: Seat, task_id: str) -> RunRecord:
    seen: int | None = None
    while True:
        run = (await seat.inspect(task_id)).run
        if run.state is State.PAUSED or run.state.is_final or not run.pause:
            return run
        seen = await seat.wait_for_change(0.5, since=seen)


def _tell(record: RunRecord, words: str, as_json: bool) -> None:
    if as_json:
        print_json(_record_json(record))
    else:
        note(words)


def _record_json(record: RunRecord) -> dict[str, Any]:
    return {"id": record.id, "state": record.state.value, "pause": record.pause}


def _pause_words(run: RunRecord) -> str:
    if run.state is State.PAUSED:
        return f"run {run.id} is paused; 'haltwise unpause {run.id}' continues it"
    if run.pause:
        return (
            f"pause requested for run {run.id} (it is {run.state}); it pauses at its next "
            "checkpoint once its steps in flight have ended"
        )
    if run.state is State.CANCELLING:
        return f"run {run.id} is cancelling; nothing to pause"
    return f"run {run.id} is already {run.state}; nothing to pause"


def _unpause_words(before: RunRecord, after: RunRecord) -> str:
    if before.state is State.PAUSED and after.state is State.RUNNING:
        return f"run {after.id} unpaused; it is running again"
    if before.pause and not after.pause:
        return f"pause request for run {after.id} withdrawn before it took effect"
    return f"run {after.id} is {after.state}, not paused; nothing to unpause"
