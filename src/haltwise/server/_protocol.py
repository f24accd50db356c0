"""uvicorn's h11 protocol with read timeouts: a client must finish its request's headers within
:data:`READ_TIMEOUT` seconds of starting them, and may not leave its body idle that long.

uvicorn has a keep-alive timeout (between requests) but none while a request is being read, so
a client that never ends its headers (which needs no token: nothing is authorised before them)
or its body held its connection for ever. When the time is up, a request whose body was being
read is answered 408 (the application sees the client leave); a connection whose headers never
ended is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["READ_TIMEOUT", "TimedH11Protocol"]

#: Seconds a client has to finish its headers, and the longest its body may go without a byte.
READ_TIMEOUT = 10.0


class TimedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with the read timeouts of this module."""

    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm()  # the body's idle time starts again with every byte
        elif state is h11.IDLE:
            if self._read_timer is None:
                self._arm()  # headers begun after a keep-alive wait: their time starts now
        else:
            self._disarm()  # the request is read (or the connection is done with)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(READ_TIMEOUT, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY and self.cycle is not None:
            self.cycle.disconnected = True  # the application's receive() says the client left
            self.cycle.message_event.set()
        if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.SEND_BODY:
            try:
                head = h11.Response(
                    status_code=408,
                    headers=[(b"content-type", b"application/json"), (b"connection", b"close")],
                )
                body = b'{"error":{"code":"timeout","message":"the request was not read in time"}}'
                self.transport.write(self.conn.send(head))
                self.transport.write(self.conn.send(h11.Data(data=body)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:
                pass
        self.transport.close()
