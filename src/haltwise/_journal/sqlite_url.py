"""A SQLite store's URL: ``sqlite:///PATH.db`` and its options, read without opening anything.

Kept apart from :mod:`.sqlite` (which needs the event loop's machinery) so that a request
written at once (:mod:`.quick`) reads a URL exactly as the store does.
"""

from __future__ import annotations

import math
from urllib.parse import parse_qs, urlsplit

from .._core.exceptions import StoreError
from .secrets import safe_url

#: The longest busy timeout SQLite can hold (its milliseconds are a 32-bit integer), seconds.
_MAX_BUSY_TIMEOUT = 2_147_483


def parse_url(url: str) -> tuple[str, str, float]:
    """The file's path, its ``synchronous`` setting (upper case) and its busy timeout (seconds)
    of ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` (options ``?synchronous=`` one of
    full, normal, extra, off, default full; ``?busy_timeout=SECONDS``, default 60); any other
    form or option is a :class:`StoreError` naming the URL without its secrets."""
    parts = urlsplit(url)
    shown = safe_url(url)
    if parts.netloc not in ("", "localhost") or not parts.path or parts.path == "/":
        raise StoreError(f"unusable SQLite store URL {shown!r}: expected sqlite:///PATH.db")
    # sqlite:///rel.db -> "/rel.db" -> "rel.db"; sqlite:////abs.db -> "//abs.db" -> "/abs.db"
    path = parts.path[1:]
    if "\x00" in path:
        raise StoreError(f"unusable SQLite store URL {shown!r}: the path holds a NUL character")
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    synchronous = options.pop("synchronous", "full").upper()
    if synchronous not in ("FULL", "NORMAL", "EXTRA", "OFF"):
        raise StoreError(
            f"unusable SQLite store URL {shown!r}: synchronous={synchronous.lower()!r}"
        )
    busy_timeout = _busy_timeout(options.pop("busy_timeout", "60"), shown)
    if options:
        raise StoreError(
            f"unusable SQLite store URL {shown!r}: unknown option {next(iter(options))!r}"
        )
    return path, synchronous, busy_timeout


def _busy_timeout(text: str, shown: str) -> float:
    """``?busy_timeout=SECONDS``: a number from 0 to what SQLite can hold (not nan, not inf)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= _MAX_BUSY_TIMEOUT:
        raise StoreError(
            f"unusable SQLite store URL {shown!r}: busy_timeout={text[:20]!r} is not a number "
            f"of seconds from 0 to {_MAX_BUSY_TIMEOUT}"
        )
    return seconds
