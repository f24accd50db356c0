"""``haltwise events --to URL``: the journal's changes delivered as CloudEvents until stopped.

One line on stderr when it starts, for every failed try and, every ten seconds, how far it got.
SIGINT or SIGTERM: the position is saved and the command exits 0; a second signal exits at once
(128 + the signal's number: the position of the last half second is lost, and those events are
sent again by the next start). ``410 Gone`` from the receiver: one line, exit 1.
"""

from __future__ import annotations

import os
import signal

import anyio
import click

from .._core.exceptions import DeliveryGoneError
from .._events import Destination, Sender, destination_from
from .._runtime.seat import Seat, open_seat, safe_url, store_url_from
from .base import one_line, run_async, store_option, warn

__all__ = ["events_command", "send_events"]


@click.command("events")
@click.option("--to", "url", required=True, metavar="URL", help="Where to POST the events.")
@click.option(
    "--secret-env",
    metavar="NAME",
    help="Sign each request (Standard Webhooks) with the secret in this environment variable.",
)
@click.option(
    "--from-start",
    is_flag=True,
    help="Send the whole journal, from its first change (overrides the kept position).",
)
@store_option
def events_command(url: str, secret_env: str | None, from_start: bool, store: str | None) -> int:
    """Deliver every run transition, approval and budget exhaustion to URL as a CloudEvent.

    At least once and in order for each run; failed tries are retried with backoff (at most
    60 s apart). The position is kept in the store for URL: a sender started again goes on from
    the first change not acknowledged; the first start for URL begins with the changes made
    after it.
    """
    destination = destination_from(url, secret_env)

    async def main() -> None:
        async with open_seat(store) as seat, anyio.create_task_group() as group:
            group.start_soon(_stop_on_signals, group.cancel_scope)
            await send_events(seat, destination, store, from_start=from_start)
            group.cancel_scope.cancel()

    try:
        run_async(main)
    except DeliveryGoneError as error:
        click.echo(f"haltwise: error: {one_line(str(error))}", err=True)
        return 1
    return 0


async def send_events(
    seat: Seat, destination: Destination, store: str | None, *, from_start: bool = False
) -> None:
    """Deliver the store's changes to ``destination`` until cancelled (also ``serve
    --events-to``), each line of progress or failure on stderr."""
    source = safe_url(store_url_from(store))
    await Sender(seat, destination, source=source, log=warn).run(from_start=from_start)


async def _stop_on_signals(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if scope.cancel_called:
                os._exit(128 + signum)  # the second signal: at once, as after a crash
            warn(f"events: stopping ({signal.Signals(signum).name}); the position is saved")
            scope.cancel()
