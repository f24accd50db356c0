"""``haltwise serve``: the HTTP API and the live dashboard over the store, on uvicorn.

Prints the dashboard's address alone on stdout (with ``?token=`` when the token was made here,
as Jupyter does; a configured token is never printed). With ``FILE.py`` it also works pending
runs of that file's tasks, as ``haltwise worker`` does. SIGINT or SIGTERM: the event streams
end, the runs worked here are handed over as by a worker, and the server exits 0; a second
signal exits at once (128 + the signal's number).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import click

from .._core.exceptions import HaltwiseError, InputError
from .._runtime.runtime import Runtime
from .._runtime.tool import Task
from .base import run_async, store_option

if TYPE_CHECKING:
    from ..server import Tokens

__all__ = ["serve_command"]


@click.command("serve")
@click.argument("file", metavar="[FILE.py]", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8700, show_default=True, help="Port (0: any)."
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="With FILE.py: how many runs to work at a time.",
)
@click.option(
    "--events-to",
    metavar="URL",
    help="Also deliver the journal's changes to URL as CloudEvents (as 'haltwise events').",
)
@click.option(
    "--events-secret-env",
    metavar="NAME",
    help="With --events-to: sign each request with the secret in this environment variable.",
)
@store_option
def serve_command(
    file: str | None,
    host: str,
    port: int,
    concurrency: int,
    events_to: str | None,
    events_secret_env: str | None,
    store: str | None,
) -> int:
    """Serve the JSON API (/api) and the live dashboard (/) over the store.

    Tokens: $HALTWISE_TOKEN (operator: may cancel, pause, resume, submit) and
    $HALTWISE_READ_TOKEN (read-only); with neither, an operator token is made and the address
    printed with it. A non-loopback --host needs $HALTWISE_TOKEN. With FILE.py the server also
    submits, resumes and works runs of that file's tasks.
    """
    from ..server import Served, Tokens, create_app

    tokens = Tokens.from_env(os.environ)
    if not _loopback(host) and tokens.generated:
        raise InputError(f"--host {host} is not a loopback address: set $HALTWISE_TOKEN first")
    if events_secret_env is not None and events_to is None:
        raise InputError("--events-secret-env needs --events-to")
    events = _events(events_to, events_secret_env, store)
    tasks, source, audit = _load(file) if file else (None, None, None)
    listener = _bind(host, port)

    async def main() -> int:
        async with Runtime(store) as runtime:
            served = Served(runtime, tokens, tasks=tasks, source=source, audit=audit)
            app = create_app(served)
            _announce(listener, tokens)
            await _serve(app, listener, served, concurrency, events)
        return 0

    try:
        return run_async(main)
    except HaltwiseError:
        raise
    except Exception as error:  # the runtime's block ended on an error of its own tasks
        raise HaltwiseError(
            f"serve stopped: its runtime failed ({type(error).__name__}: {error})"
        ) from None


def _load(file: str) -> tuple[dict[str, Task[..., Any]], Path, dict[str, Any]]:
    from .._analysis.audit import audit_tools
    from .._runtime.loader import find_tools, load_module
    from .foreground import worker_names

    module = load_module(file)
    found = {name: obj for name, obj in vars(module).items() if isinstance(obj, Task)}
    if not found:
        raise InputError(f"{file}: no @haltwise.task in this file")
    report = audit_tools(find_tools(module), tasks=found.values(), namespace=vars(module))
    source = Path(module.__file__ or file).resolve()
    return worker_names(file, found), source, report.to_dict()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: refused without a configured token, whatever it resolves to


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by the accepted connections (Linux): a response written in two parts (head,
    # body) is not held back by Nagle's algorithm for the client's delayed ACK (~40 ms).
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    listener.listen(128)
    listener.set_inheritable(True)
    return listener


def _announce(listener: socket.socket, tokens: Tokens) -> None:
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/"
    click.echo(f"{address}?token={tokens.operator}" if tokens.generated else address)
    sys.stdout.flush()
    click.echo(f"haltwise: serving on {address} (Ctrl-C stops)", err=True)


def _events(
    url: str | None, secret_env: str | None, store: str | None
) -> Callable[[], Coroutine[Any, Any, None]] | None:
    """``--events-to``: the sender to run beside the server (checked now: a bad URL or a missing
    secret is a usage error before anything starts). A ``410 Gone`` stops it, not the server."""
    if url is None:
        return None
    from .._events import destination_from
    from .._runtime.seat import open_seat
    from .base import warn
    from .events import send_events

    destination = destination_from(url, secret_env)

    async def send() -> None:
        try:
            async with open_seat(store) as seat:
                await send_events(seat, destination, store)
        except Exception as error:  # the sender stops; the server goes on serving
            warn(f"error: events: {error}")

    return send


async def _serve(
    app: Any,
    listener: socket.socket,
    served: Any,
    concurrency: int,
    events: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    import uvicorn

    from ..server._protocol import TimedH11Protocol

    class Server(uvicorn.Server):
        """uvicorn, with the signals handled by haltwise and the event streams ended first."""

        def capture_signals(self) -> Any:
            import contextlib

            return contextlib.nullcontext()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            served.stopping.set()
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        server_header=False,
        http=TimedH11Protocol,  # read timeouts on headers and bodies (issue 29, item 19)
    )
    server = Server(config)
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(_stop_on_signals, server)
        if events is not None:
            group.start_soon(events)
        async with anyio.create_task_group() as work:
            if served.tasks is not None:
                work.start_soon(_work, served, stop, concurrency)
            try:
                await server.serve(sockets=[listener])
            except anyio.get_cancelled_exc_class():
                if not server.should_exit:
                    await _stop_answering(server)
                raise
            stop.set()  # the worker hands its runs over, then this block ends
        group.cancel_scope.cancel()


async def _stop_answering(server: Any) -> None:
    """Nobody stopped the server, yet it is cancelled: the runtime's block is ending under it
    (one of its tasks failed; the error follows once its runs have stopped). Say so on one
    line and stop answering now: uvicorn, cut short in its loop, would skip its shutdown and
    go on answering for a runtime that no longer works its runs."""
    click.echo("haltwise: serve stopping: its runtime stopped working runs", err=True)
    with anyio.CancelScope(shield=True):
        server.should_exit = True
        await server.shutdown()


async def _work(served: Any, stop: anyio.Event, concurrency: int) -> None:
    from .._runtime.worker import Worker

    worker = Worker(served.runtime, served.tasks, concurrency=concurrency)
    await worker.serve(stop)


async def _stop_on_signals(server: Any) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if server.should_exit:
                os._exit(128 + signum)  # the second signal: at once, as after a crash
            click.echo(f"haltwise: serve stopping ({signal.Signals(signum).name})", err=True)
            server.should_exit = True
