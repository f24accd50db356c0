"""``haltwise check`` and ``haltwise explore``: is the journal sound, and is the task?"""

from __future__ import annotations

import functools
import json

import anyio
import click

from .._core.exceptions import InputError
from .._runtime.seat import check_journal
from .base import json_option, run_async, store_option
from .foreground import parse_input
from .render import Screen, explore_progress


@click.command("check")
@json_option
@store_option
def check_command(as_json: bool, store: str | None) -> int:
    """Verify the store: transitions follow the table, steps are settled or held by a live
    owner, partial results are contiguous. Exit 0 if sound, 1 with the findings if not."""

    async def main() -> int:
        report = await check_journal(store)
        if as_json:
            click.echo(json.dumps(report.to_json()))
        else:
            Screen().findings(report)
        return 0 if report.ok else 1

    return run_async(main)


@click.command("explore")
@click.argument("target", metavar="FILE.py:TASK")
@click.option("--input", "input_json", metavar="JSON", help="A JSON object of keyword arguments.")
@click.option(
    "--pause",
    "pauses",
    is_flag=True,
    help="Also pause at every point, then unpause: nothing may be lost or repeated.",
)
@json_option
@store_option
def explore_command(
    target: str, input_json: str | None, pauses: bool, as_json: bool, store: str | None
) -> int:
    """Cancel the task at every checkpoint and in the middle of every step (plainly and with
    force), each in a scratch store, resume where the advice allows, and check the
    invariants. The --store is left untouched; the tools run for real. Exit 0 if all hold."""
    from .._analysis.explore_render import render_rich
    from .._runtime.loader import load_target
    from ..testing import explore_async

    kwargs = parse_input(input_json)
    _, task = load_target(target)
    if task is None:
        raise InputError(f"{target!r}: name the task to explore as FILE.py:TASK")
    with explore_progress() as progress:
        explore = functools.partial(
            explore_async, task, kwargs=kwargs, name=target, pauses=pauses, progress=progress
        )
        report = anyio.run(explore)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        render_rich(report, Screen().console)
    return 0 if report.ok else 1
