"""The sender's HTTP: one POST at a time on a connection of its own, answered in a few words.

A delivery is one small POST whose answer is only read for its status, and a lane sends one at a
time (see :mod:`.sender`). :class:`DirectPoster` speaks HTTP/1.1 itself on a kept-alive anyio
stream through ``h11`` (the protocol library under httpx and uvicorn): about 120 us of CPU a
request, where an httpx client spends ~580 on its layers and pool (measured in
``bench/bench_telemetry.py events``), so the sender keeps up with the journal. httpx stays for
what the direct connection does not do: a URL the environment routes through a proxy
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, minus ``NO_PROXY``) gets a
:class:`ProxiedPoster`.

Both answer :meth:`Poster.post` the same way: ``None`` when the receiver answered 2xx, else a
:class:`Failure` (the status code, if any, and what went wrong in a few words:
``"503 Service Unavailable"``, ``"no answer (ConnectionRefusedError)"``), never raising for the
receiver's or the network's faults.
"""

from __future__ import annotations

import base64
import ssl
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, final
from urllib.parse import unquote, urlsplit

import anyio
import h11
from anyio.abc import ByteStream

if TYPE_CHECKING:
    import httpx

__all__ = ["DirectPoster", "Failure", "Poster", "ProxiedPoster", "Target", "poster_for"]

#: How long a receiver may take to answer one request, from connecting to the answer's end.
TIMEOUT: Final = 10.0
_READ_SIZE: Final = 65536
#: The errors of a connection or an exchange that mean "no answer" (never the caller's fault).
_NO_ANSWER: Final = (
    OSError,  # refused, reset, unreachable, a TLS failure (ssl.SSLError is one)
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    anyio.ClosedResourceError,
    h11.ProtocolError,
    TimeoutError,
)


@final
@dataclass(frozen=True, slots=True)
class Failure:
    """A try the receiver did not acknowledge: its status ``code`` (``None``: no answer; the
    code decides, never the reason phrase, which a receiver may leave out or word its own way)
    and what went wrong in a few words, for the log."""

    code: int | None
    words: str

    @classmethod
    def answered(cls, code: int, reason: str) -> Failure:
        return cls(code, f"{code} {reason}".strip())

    @classmethod
    def no_answer(cls, error: BaseException) -> Failure:
        return cls(None, f"no answer ({type(error).__name__})")


class Poster(Protocol):
    """One connection's worth of deliveries, one at a time."""

    async def post(self, headers: dict[str, str], body: bytes) -> Failure | None: ...

    async def aclose(self) -> None: ...


@final
@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL's requests go, parsed once: ``host``/``port`` to connect to, ``tls``, the
    request ``path`` (with its query), the ``Host`` header, and Basic credentials from the URL's
    ``user:password@`` (percent-decoded, as httpx does), sent as ``Authorization``."""

    url: str
    host: str
    port: int
    tls: bool
    path: str
    host_header: str
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Target:
        """``url`` is checked already (:func:`~haltwise._events.sender.destination_from`)."""
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        default = 443 if tls else 80
        port = parts.port or default
        shown_host = f"[{host}]" if ":" in host else host
        host_header = shown_host if port == default else f"{shown_host}:{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(url, host, port, tls, path, host_header, authorization)


def poster_for(target: Target, tls_context: ssl.SSLContext | None) -> Poster:
    """A :class:`ProxiedPoster` when the environment routes ``target`` through a proxy, else a
    :class:`DirectPoster`. ``tls_context`` (shared by every lane: building one reads the CA
    file) is needed for an ``https`` target only."""
    scheme = "https" if target.tls else "http"
    proxies = urllib.request.getproxies()
    if (scheme in proxies or "all" in proxies) and not urllib.request.proxy_bypass(target.host):
        return ProxiedPoster(target)
    return DirectPoster(target, tls_context)


def tls_context() -> ssl.SSLContext:
    """What an ``https`` receiver's certificate is checked against: ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` when set (as Python's ``ssl`` and OpenSSL read them), else certifi's
    bundle (httpx's default, so that a sender verifies what it verified before)."""
    import os

    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


@final
class DirectPoster:
    """One kept-alive HTTP/1.1 connection to ``target``, opened on the first POST and again
    after the receiver closed it (an HTTP/1.0 answer, ``Connection: close``) or anything
    failed. A POST on a connection that was kept open and failed before any byte of an answer
    arrived is sent once more at once on a new connection: the receiver may have closed the
    idle connection as the request went out (an event may then arrive twice, with one id, as
    at-least-once allows)."""

    def __init__(self, target: Target, tls_context: ssl.SSLContext | None) -> None:
        self._target = target
        self._tls = tls_context
        self._stream: ByteStream | None = None
        self._protocol = h11.Connection(h11.CLIENT)
        self._answering = False  # an answer's first byte arrived for the POST in progress

    async def post(self, headers: dict[str, str], body: bytes) -> Failure | None:
        reused = self._stream is not None
        self._answering = False
        try:
            with anyio.fail_after(TIMEOUT):
                return await self._exchange(headers, body)
        except _NO_ANSWER as error:
            await self.aclose()
            if reused and not self._answering and not isinstance(error, TimeoutError):
                return await self.post(headers, body)  # not reused now: at most once more
            return Failure.no_answer(error)

    async def _exchange(self, headers: dict[str, str], body: bytes) -> Failure | None:
        stream = await self._connected()
        protocol = self._protocol
        fields = [
            ("host", self._target.host_header),
            ("content-length", str(len(body))),
            *headers.items(),
        ]
        if self._target.authorization is not None:
            fields.append(("authorization", self._target.authorization))
        request = h11.Request(method="POST", target=self._target.path, headers=fields)
        data = protocol.send(request) or b""
        data += (protocol.send(h11.Data(data=body)) or b"") + (
            protocol.send(h11.EndOfMessage()) or b""
        )
        await stream.send(data)  # one write: headers and body in one segment
        code, reason = 0, ""
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                data = await self._received(stream)
                self._answering = self._answering or bool(data)
                protocol.receive_data(data)
            elif isinstance(event, h11.Response):
                code, reason = event.status_code, event.reason.decode("latin-1")
            elif isinstance(event, h11.EndOfMessage):
                break
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
        else:  # the receiver closes this connection (or did not say it keeps it)
            await self.aclose()
        return None if 200 <= code < 300 else Failure.answered(code, reason)

    async def _received(self, stream: ByteStream) -> bytes:
        try:
            return await stream.receive(_READ_SIZE)
        except anyio.EndOfStream:
            return b""  # h11 reads the end of the stream as the answer's end, or an error

    async def _connected(self) -> ByteStream:
        if self._stream is None:
            target = self._target
            stream: ByteStream = await anyio.connect_tcp(target.host, target.port)
            if target.tls:
                from anyio.streams.tls import TLSStream

                assert self._tls is not None
                stream = await TLSStream.wrap(
                    stream, hostname=target.host, ssl_context=self._tls, standard_compatible=False
                )
            self._stream = stream
            self._protocol = h11.Connection(h11.CLIENT)
        return self._stream

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


@final
class ProxiedPoster:
    """The same POST through an httpx client (one connection), which honours the proxy the
    environment names for the URL."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._client: httpx.AsyncClient | None = None

    async def post(self, headers: dict[str, str], body: bytes) -> Failure | None:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=TIMEOUT, limits=httpx.Limits(max_connections=1)
            )
        try:
            response = await self._client.post(self._target.url, content=body, headers=headers)
        except httpx.HTTPError as error:
            return Failure.no_answer(error)
        if 200 <= response.status_code < 300:
            return None
        return Failure.answered(response.status_code, response.reason_phrase)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()
