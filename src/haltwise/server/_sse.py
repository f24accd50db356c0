"""Server-Sent Events from the journal's change feed, with ids for a reconnect.

Each change is one event: ``id`` its ``seq``, ``event`` its kind (``transition``, ``step``,
``partial``, ``approval``: a request made or decided), ``data`` its JSON
(:meth:`~haltwise._core.views.Change.to_json`). A client that reconnects with
``Last-Event-ID: N`` (or ``?since=N``) gets every change after ``N``, so it misses nothing; a
new client gets the changes from its connection on. A comment every 15 s keeps idle connections
open; the stream ends when the client leaves or the server stops.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import final

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .._core.views import Change
from ._bodies import whole_number

__all__ = ["EventStream", "since_of"]

#: The largest change number a client may name (18 digits: an int64 holds it).
MAX_CHANGE = 10**18 - 1
#: Seconds between keep-alive comments on an idle stream.
_KEEPALIVE = 15.0


def since_of(request: Request) -> int | None:
    """The change a stream starts after: ``Last-Event-ID``, else ``?since=``, else None (now)."""
    text = request.headers.get("last-event-id") or request.query_params.get("since")
    if text is None or text == "":
        return None
    return whole_number(text, "Last-Event-ID (or since)", low=0, high=MAX_CHANGE)


def encode(change: Change) -> bytes:
    data = json.dumps(change.to_json(), separators=(",", ":"))
    return f"id: {change.seq}\nevent: {change.kind.value}\ndata: {data}\n\n".encode()


@final
class EventStream(Response):
    """A ``text/event-stream`` of ``changes`` until the client leaves or ``stopping`` is set."""

    def __init__(self, changes: AsyncIterator[Change], stopping: anyio.Event) -> None:
        super().__init__(media_type="text/event-stream")
        self.changes = changes
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-store"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        lock = anyio.Lock()

        async def emit(data: bytes) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": data, "more_body": True})

        with contextlib.suppress(OSError):
            async with anyio.create_task_group() as group:
                for part in (self._pump, self._keepalive):
                    group.start_soon(_until_done, group, part, emit)
                group.start_soon(_until_done, group, _disconnect, receive)
                group.start_soon(_until_done, group, _stopped, self.stopping)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, emit: Callable[[bytes], Awaitable[None]]) -> None:
        await emit(b"retry: 1000\n: connected\n\n")
        async for change in self.changes:
            await emit(encode(change))

    async def _keepalive(self, emit: Callable[[bytes], Awaitable[None]]) -> None:
        while True:
            await anyio.sleep(_KEEPALIVE)
            await emit(b": keep-alive\n\n")


async def _until_done(
    group: anyio.abc.TaskGroup, part: Callable[..., Awaitable[None]], *args: object
) -> None:
    """Run ``part``; when it returns (or fails to send), end the whole stream."""
    with contextlib.suppress(OSError):
        await part(*args)
    group.cancel_scope.cancel()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stopped(stopping: anyio.Event) -> None:
    await stopping.wait()
