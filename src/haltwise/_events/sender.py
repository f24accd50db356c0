"""``haltwise events``: deliver the journal's changes to a URL as CloudEvents, at least once.

The promises (CONTRACT.md, "Events out") and how each is kept:

- **At least once.** A change counts as delivered only when the receiver answered 2xx. The
  position kept in the journal (:meth:`Seat.save_delivery_position`) is the highest number below
  which every event was acknowledged (the *watermark*), so a sender started again, after a
  SIGKILL too, sends again from the first change not acknowledged: a receiver may see an event
  twice, always with the same ``id`` (the change's number) and ``webhook-id``.
- **In order for each run.** Events go out on a few *lanes* (concurrent connections); every
  change of a run takes the same lane (by a hash of the run id), and a lane sends one event at a
  time, the next only once the last was acknowledged. A run's event waiting for retries holds
  back the runs that share its lane, never the other lanes.
- **Retries.** A non-2xx answer, or none (refused, reset, 10 s without the whole answer: see
  :mod:`.post`), is tried again after
  0.5 s, then twice as long each time, at most 60 s apart, until the sender is stopped; each
  failure is one line on the log. ``410 Gone`` stops the whole sender with
  :class:`~haltwise.DeliveryGoneError` (the command exits 1): the receiver asked for no more.
- **Where to begin.** The first start for a URL begins after the changes made before it (its
  position is recorded at once, so that a crash before the first delivery loses nothing);
  a later one at the kept position; ``from_start`` at the journal's first change, whatever was
  kept.
- **Signatures.** With a secret, every request carries ``webhook-id``, ``webhook-timestamp`` and
  ``webhook-signature`` as Standard Webhooks specifies (the ``standardwebhooks`` package signs,
  so that what it verifies is exactly what was signed); the timestamp is the try's own.

The position is written at most every :data:`_SAVE_EVERY` seconds while events are acknowledged,
and once more when the sender stops (SIGINT, SIGTERM, 410): what a SIGKILL loses is only that
last half second, which is sent again.
"""

from __future__ import annotations

import collections
import os
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, final
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from .._core.exceptions import (
    DeliveryGoneError,
    InputError,
    StoreError,
    UnknownRunError,
    group_leaves,
)
from .._core.views import Change, RunDetail
from .cloud import RunFold, cloud_event, event_type, status_as_of
from .post import Failure, Poster, Target, poster_for, tls_context

if TYPE_CHECKING:
    from .._runtime.seat import Seat

__all__ = ["Destination", "Sender", "destination_from"]

#: Concurrent connections (each run's events always take the same one).
LANES: Final = 8
#: Events read ahead of their lane's delivery, per lane.
_LANE_BUFFER: Final = 256
#: The first wait before a failed event is tried again, and the longest (CONTRACT.md: 60 s).
_FIRST_BACKOFF: Final = 0.5
_MAX_BACKOFF: Final = 60.0
#: How often the position is written while events are acknowledged, and progress logged.
_SAVE_EVERY: Final = 0.5
_PROGRESS_EVERY: Final = 10.0
#: Runs a lane keeps as last read (see Sender._lane).
_CACHED: Final = 256
#: Changes read per query while catching up with the runs' history at start.
_HISTORY_BATCH: Final = 5000


@final
@dataclass(frozen=True, slots=True)
class Destination:
    """Where events go: ``url`` as given (the key of the kept position), ``shown`` as messages
    show it (no password, no query string: either may hold a secret), and the Standard Webhooks
    ``secret`` (``None``: requests are not signed)."""

    url: str
    shown: str
    secret: str | None


def destination_from(
    url: str, secret_env: str | None = None, environ: Mapping[str, str] | None = None
) -> Destination:
    """A checked :class:`Destination`; :class:`InputError` (one line) for a URL that is not
    ``http(s)://HOST...``, a secret variable that is not set, or a secret that is not base64."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--to {_shown(url)!r}: expected an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise InputError(
            f"--to {_shown(url)!r}: the port is not a number from 0 to 65535"
        ) from None
    secret = None
    if secret_env is not None:
        secret = (os.environ if environ is None else environ).get(secret_env)
        if not secret:
            raise InputError(f"--secret-env {secret_env}: the variable {secret_env} is not set")
        _signer(secret)
    return Destination(url, _shown(url), secret)


def _shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.username:
        host = f"{parts.username}@{host}"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _signer(secret: str) -> Any:
    from standardwebhooks.webhooks import Webhook

    try:
        return Webhook(secret)
    except Exception:  # the package raises several types for a bad secret
        raise InputError(
            "the webhook secret is not valid: expected base64, optionally prefixed whsec_"
        ) from None


@dataclass(frozen=True, slots=True)
class _Item:
    change: Change
    fold: RunFold


@final
class Sender:
    """Delivers the journal's changes to one :class:`Destination` (see the module docstring).

    ``source`` is the CloudEvents ``source`` of every event (the store, as messages show it);
    ``log`` takes each line of progress or failure, and prints it as one line without secrets
    (the command line's ``warn`` does: a store's error may span lines or quote its URL).
    """

    def __init__(
        self,
        seat: Seat,
        destination: Destination,
        *,
        source: str,
        log: Callable[[str], None],
        lanes: int = LANES,
    ) -> None:
        self._seat = seat
        self._to = destination
        self._source = source
        self._log = log
        self._lanes = lanes
        self._signer = None if destination.secret is None else _signer(destination.secret)
        self._pending: collections.deque[int] = collections.deque()
        self._acked: set[int] = set()
        self._dispatched = 0
        self._saved = 0
        self._delivered = 0

    async def run(self, *, from_start: bool = False) -> None:
        """Deliver until cancelled (the position saved on the way out), or until the receiver
        answers ``410 Gone`` (:class:`~haltwise.DeliveryGoneError`). A store that fails (a lost
        connection, a locked file) is tried again, 0.5 s later and then twice as long each
        time, at most 60 s apart, from the position kept: each failure is one line."""
        delay = _FIRST_BACKOFF
        while True:
            try:
                await self._attempt(from_start)
                return
            except StoreError as error:
                self._log(
                    f"events: the store failed ({type(error).__name__}: {error}); "
                    f"trying again in {delay:g} s"
                )
            await anyio.sleep(delay)
            delay = min(_MAX_BACKOFF, delay * 2)
            from_start = False  # a restart goes on from the position kept

    async def _attempt(self, from_start: bool) -> None:
        try:
            await self._deliver_all(from_start)
        except BaseExceptionGroup as group:  # a lane's or the dispatcher's error, alone
            errors = [
                e for e in group_leaves(group) if not isinstance(e, anyio.get_cancelled_exc_class())
            ]
            if len(errors) == 1 and isinstance(errors[0], Exception):
                raise errors[0] from None
            raise

    async def _deliver_all(self, from_start: bool) -> None:
        self._pending.clear()
        self._acked.clear()
        start = await self._start(from_start)
        folds = await self._history(start)
        self._log(f"events: delivering to {self._to.shown} after change {start}")
        target = Target.parse(self._to.url)
        context = tls_context() if target.tls else None
        posters = [poster_for(target, context) for _ in range(self._lanes)]
        try:
            async with anyio.create_task_group() as group:
                lanes: list[ObjectSendStream[_Item]] = []
                for poster in posters:
                    send, receive = anyio.create_memory_object_stream[_Item](_LANE_BUFFER)
                    lanes.append(send)
                    group.start_soon(self._lane, poster, receive)
                group.start_soon(self._keep_position)
                await self._dispatch(start, folds, lanes)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                for poster in posters:
                    await poster.aclose()
                await self._save()

    async def _start(self, from_start: bool) -> int:
        kept = await self._seat.delivery_position(self._to.url)
        start = 0 if from_start else kept
        if start is None:
            start = await self._seat.last_change()
        if start != kept:
            await self._seat.save_delivery_position(self._to.url, start)
        self._dispatched = self._saved = start
        return start

    async def _history(self, upto: int) -> dict[str, RunFold]:
        """Every run's fold as of change ``upto``: the events sent next carry the steps and
        partial results their runs had journaled before it."""
        folds: dict[str, RunFold] = {}
        cursor: int | None = 0
        while cursor is not None and cursor < upto:
            batch, cursor = await self._seat.changes_between(cursor, upto, limit=_HISTORY_BATCH)
            for change in batch:
                folds.setdefault(change.run_id, RunFold()).apply(change)
        return folds

    async def _dispatch(
        self, start: int, folds: dict[str, RunFold], lanes: list[ObjectSendStream[_Item]]
    ) -> None:
        async for change in self._seat.changes(start):
            fold = folds.setdefault(change.run_id, RunFold())
            fold.apply(change)
            if event_type(change) is not None:
                self._pending.append(change.seq)
                lane = lanes[zlib.crc32(change.run_id.encode()) % len(lanes)]
                await lane.send(_Item(change, fold.copy()))
            self._dispatched = change.seq

    async def _lane(self, poster: Poster, items: ObjectReceiveStream[_Item]) -> None:
        # A run read for one event serves its next ones when it was read after them: a run's
        # events take one lane, so only this lane reads it (the cache stays small: cleared
        # when it holds _CACHED runs).
        read: dict[str, tuple[int, RunDetail | None]] = {}
        async with items:
            async for item in items:
                change = item.change
                seen = read.get(change.run_id)
                if seen is None or seen[0] < change.seq:
                    if len(read) >= _CACHED:
                        read.clear()
                    seen = read[change.run_id] = (self._dispatched, await self._read(change))
                await self._deliver(poster, item, seen[1])
                self._acked.add(change.seq)
                self._delivered += 1

    async def _read(self, change: Change) -> RunDetail | None:
        """The run as it is now (None: pruned since)."""
        try:
            return await self._seat.inspect(change.run_id)
        except UnknownRunError:
            return None

    async def _deliver(self, poster: Poster, item: _Item, detail: RunDetail | None) -> None:
        change = item.change
        if detail is None:  # pruned since: only what the change itself says
            data: dict[str, Any] = {"id": change.run_id, "pruned": True}
        else:
            data = status_as_of(detail.outcome, detail.events, item.fold)
        headers, body = cloud_event(change, self._source, data)
        tries = 0
        while True:
            failure = await self._post(poster, str(change.seq), headers, body)
            if failure is None:
                return
            if failure.code == 410:
                raise DeliveryGoneError(
                    f"{self._to.shown} answered 410 Gone to change {change.seq}: "
                    "delivery stopped (the receiver wants no more events)"
                )
            delay = min(_MAX_BACKOFF, _FIRST_BACKOFF * 2**tries)
            tries += 1
            self._log(
                f"events: change {change.seq} (run {change.run_id!r}) not delivered to "
                f"{self._to.shown}: {failure.words}; trying again in {delay:g} s"
            )
            await anyio.sleep(delay)

    async def _post(
        self, poster: Poster, message_id: str, headers: dict[str, str], body: bytes
    ) -> Failure | None:
        """One try: ``None`` when acknowledged, else how it failed."""
        sent = dict(headers)
        if self._signer is not None:
            now = datetime.now(tz=UTC)
            sent["webhook-id"] = message_id
            sent["webhook-timestamp"] = str(int(now.timestamp()))
            sent["webhook-signature"] = self._signer.sign(message_id, now, body)
        return await poster.post(sent, body)

    def _watermark(self) -> int:
        while self._pending and self._pending[0] in self._acked:
            self._acked.discard(self._pending.popleft())
        return self._pending[0] - 1 if self._pending else self._dispatched

    async def _save(self) -> None:
        position = self._watermark()
        if position > self._saved:
            await self._seat.save_delivery_position(self._to.url, position)
            self._saved = position

    async def _keep_position(self) -> None:
        said = time.monotonic()
        reported = 0
        while True:
            await anyio.sleep(_SAVE_EVERY)
            await self._save()
            if self._delivered != reported and time.monotonic() - said >= _PROGRESS_EVERY:
                reported, said = self._delivered, time.monotonic()
                self._log(
                    f"events: {reported} event(s) delivered to {self._to.shown}, "
                    f"every change up to {self._saved} acknowledged"
                )
