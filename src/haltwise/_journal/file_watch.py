"""Waking the SQLite store's change detection when its files are written, not on a clock.

Another process's commit appends to the store's write-ahead log (``PATH-wal``); a checkpoint
writes the database file; a deletion or a replacement of either changes the directory. On
Linux, :class:`FileWatch` watches the store's directory with inotify (through ``ctypes``: the
standard library has no binding, and two calls need no package) for those events on the
store's own files, so a process waiting for another's cancel request sleeps until a write
happens instead of waking every few milliseconds to look. Where inotify is not available
(another system, a limit on watches reached), :func:`open_watch` returns None and the store
polls as before.

An event only says "look now": the store still decides what changed by ``PRAGMA data_version``
and the files' identities, so a spurious wake costs one look and a missed event (none is known,
for a local file system; SQLite's write-ahead log needs every process on one host) is caught by
the store's slower safety poll.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any, Final

import anyio

_IN_NONBLOCK: Final = 0o4000
_IN_CLOEXEC: Final = 0o2000000
_IN_MODIFY: Final = 0x002
_IN_ATTRIB: Final = 0x004
_IN_MOVED_FROM: Final = 0x040
_IN_MOVED_TO: Final = 0x080
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_Q_OVERFLOW: Final = 0x4000
_MASK: Final = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_HEADER: Final = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


class FileWatch:
    """An inotify watch of one directory, woken by events on the files named ``prefix...``
    (the database, its ``-wal`` and ``-journal``), or on the directory itself.

    One task at a time reads the descriptor; others waiting meanwhile wait for that read
    (:meth:`wait`). :meth:`nudge` wakes every waiter at once (something in this process wants a
    look sooner than a file event would come).
    """

    __slots__ = ("_fd", "_nudged", "_prefix", "_reader", "_woken")

    def __init__(self, fd: int, prefix: bytes) -> None:
        self._fd = fd
        self._prefix = prefix
        #: the scope of the task reading the descriptor now, if any
        self._reader: anyio.CancelScope | None = None
        #: set when the current read ends (an event, a nudge, the reader's timeout)
        self._woken = anyio.Event()
        self._nudged = False  # the current read was ended by a nudge

    async def wait(self, timeout: float) -> bool:
        """Return when one of the watched files changed (since the last drain), on a
        :meth:`nudge`, or after ``timeout`` seconds, whichever comes first: True if woken
        before the timeout."""
        if self._reader is not None:  # another task reads: wait for its read to end
            woken = self._woken
            with anyio.move_on_after(timeout):
                await woken.wait()
                return True
            return False
        with anyio.move_on_after(timeout) as scope:
            self._reader = scope
            try:
                while not self._drain():
                    await anyio.wait_readable(self._fd)
                return True
            finally:
                self._reader = None
                self._woken.set()
                self._woken = anyio.Event()
        nudged, self._nudged = self._nudged, False
        return nudged

    def nudge(self) -> None:
        """Wake every waiter now (called on the event loop's thread)."""
        if self._reader is not None:
            self._nudged = True
            self._reader.cancel()

    def _drain(self) -> bool:
        """Read every pending event; True if one concerns the store's files (or was lost)."""
        relevant = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return relevant
            except OSError:
                return True  # cannot tell: look
            offset = 0
            while offset + _HEADER.size <= len(data):
                _wd, mask, _cookie, size = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size : offset + _HEADER.size + size]
                offset += _HEADER.size + size
                if mask & (_IN_Q_OVERFLOW | _IN_DELETE_SELF | _IN_MOVE_SELF) or name.startswith(
                    self._prefix
                ):
                    relevant = True

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_watch(path: str) -> FileWatch | None:
    """A :class:`FileWatch` of the SQLite database ``path``'s files, or None where inotify is
    not available (the caller then polls)."""
    if not sys.platform.startswith("linux") or not hasattr(anyio, "wait_readable"):
        return None  # (anyio < 4.7 has no wait for a file descriptor)
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    absolute = os.path.abspath(path)
    directory = os.fsencode(os.path.dirname(absolute))
    if libc.inotify_add_watch(fd, directory, _MASK) < 0:
        os.close(fd)
        return None
    return FileWatch(fd, os.fsencode(os.path.basename(absolute)))


_LIBC: list[Any] = []


def _libc() -> Any:
    """The C library's inotify functions (the process's own symbols: no search, no subprocess),
    or None. ``ctypes`` is imported here, on the first watch, not by the commands that never
    wait for a change."""
    if not _LIBC:
        import ctypes

        try:
            libc: Any = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        except (OSError, AttributeError):
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]
