"""What every ``haltwise`` command shares: exit codes, the shared options, and the helpers.

Every command returns its exit code: ``0`` completed (or the command did its job), ``1`` failed
(and ``audit --strict`` with findings), ``3`` cancelled, ``2`` bad usage or bad input, said in one
line on stderr (``haltwise: error: ...``) with no traceback. ``--json`` prints exactly one JSON
object on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import click

from .._core.exceptions import InputError, group_leaves
from .._core.outcome import Outcome
from .._core.records import parse_json_text
from .._core.states import State
from .._runtime.seat_now import safe_url, scrub, store_url_from
from .text import escape_controls

F = TypeVar("F", bound=Callable[..., Any])

#: Exit code of a run by its final state; a run still active exits 0 (``status``).
EXIT_CODES = {State.COMPLETED: 0, State.FAILED: 1, State.CANCELLED: 3}
#: Exit code for bad usage or bad input.
USAGE = 2


def exit_code(outcome: Outcome) -> int:
    """The exit code for a run's outcome: completed 0, failed 1, cancelled 3, not final 0."""
    return EXIT_CODES.get(outcome.state, 0)


# -- shared options --------------------------------------------------------------------------


#: The store URL the running command uses (set as its ``--store`` is parsed), so that an error
#: can say which store it looked in; the command line runs one command per process.
STORE_IN_USE: list[str] = []


def _note_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    STORE_IN_USE[:] = [store_url_from(value)]
    return value


def store_option(command: F) -> F:
    """``--store URL``: default ``$HALTWISE_STORE``, else ``sqlite:///.haltwise/haltwise.db``."""
    return click.option(
        "--store",
        metavar="URL",
        default=None,
        callback=_note_store,
        help="Store URL (sqlite:///PATH.db or postgresql://...); default $HALTWISE_STORE, "
        "else sqlite:///.haltwise/haltwise.db.",
    )(command)


def looked_in() -> str:
    """``looked in sqlite:///...``: which store an unknown id was looked for in."""
    store = store_in_use()
    return f"looked in {store}" if store else "no store was named"


def store_in_use() -> str | None:
    """The store the command used, as a message may show it (no password); None if none."""
    return safe_url(STORE_IN_USE[0]) if STORE_IN_USE else None


def json_option(command: F) -> F:
    """``--json``: print exactly one JSON object on stdout, nothing else."""
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")(command)


def deadline_option(command: F) -> F:
    """``--deadline SECONDS``: cancel with reason ``deadline`` after that long."""
    return click.option(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="Cancel the run (reason 'deadline') if it has not ended after this many seconds.",
    )(command)


def budget_option(command: F) -> F:
    """``--budget usd=5,tokens=200000,tool_calls=50``: the run's budget (a ``Budget``)."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        from .._core.budget import parse_budget

        return parse_budget(value)

    return click.option(
        "--budget",
        metavar="usd=N,tokens=N,tool_calls=N",
        callback=parse,
        help=(
            "What the run may spend (any of usd=, tokens=, tool_calls=; on_exhaust=cancel|pause); "
            "replaces the task's own budget."
        ),
    )(command)


def parse_assumed(
    ctx: click.Context, param: click.Parameter, values: Sequence[str]
) -> dict[int, Any]:
    """``--assume-done STEP[=JSON]``: step index -> the result it is assumed to have had."""
    assumed: dict[int, Any] = {}
    for value in values:
        index_text, equals, result_text = value.partition("=")
        try:
            index = int(index_text)
        except ValueError:
            raise click.BadParameter(
                f"{value!r}: expected STEP or STEP=JSON, STEP a step number", ctx, param
            ) from None
        if index < 0:
            raise click.BadParameter(f"{value!r}: a step number is >= 0", ctx, param)
        try:
            assumed[index] = parse_json_text(result_text, "the result") if equals else None
        except InputError as error:
            raise click.BadParameter(f"step {index}: {error}", ctx, param) from None
    return assumed


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, option: str = "--older-than") -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or a bare number of seconds) in seconds;
    ``option`` is named in the error."""
    value, unit = text.strip(), "s"
    if value and value[-1].lower() in _UNITS:
        value, unit = value[:-1], value[-1].lower()
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0 or number == float("inf"):
        raise click.BadParameter(
            f"{text!r}: expected a duration such as 30d, 12h, 90m or 45s", param_hint=option
        )
    return number * _UNITS[unit]


# -- helpers shared by the commands ---------------------------------------------------------

T = TypeVar("T")


def run_async(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` in a fresh event loop; an error from inside a task group comes out alone.

    anyio wraps an exception raised inside a task group in an ``ExceptionGroup``; a group holding
    a single exception is unwrapped so that a :class:`HaltwiseError` reaches :func:`run_cli`.
    """
    import anyio  # here: a command that needs no event loop does not import one

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        leaves = group_leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def print_json(value: Any) -> None:
    """The one JSON object of ``--json``, on one line of stdout."""
    click.echo(json.dumps(value))


def warn(text: str) -> None:
    """One line on stderr, without any store password (see :func:`one_line`)."""
    click.echo(f"haltwise: {one_line(text)}", err=True)


def fail(text: str) -> int:
    """The one ``haltwise: error:`` line of a usage error; returns the exit code 2."""
    click.echo(f"haltwise: error: {one_line(text)}", err=True)
    return USAGE


def one_line(text: str) -> str:
    """``text`` fit for one line of a terminal: whitespace runs folded to one space, control
    characters escaped (a message may quote an id or a reason from the journal), and no secret
    of any store URL this process opened."""
    return escape_controls(" ".join(scrub(text).split()))
