"""Keeping store passwords out of every message.

A store URL may carry a password in its user part (``postgresql://u:PASSWORD@host/db``), in its
query (``?password=PASSWORD``, or any parameter whose name says pass/secret/token/key), or, typed
by mistake, as a libpq ``key=value`` string (``host=h password=PASSWORD``); a driver that rejects
the URL may quote any part of it, percent-encoded or not. So no message shows a URL as it is:

- :func:`safe_url` is what a message may show of a URL (scheme, user, host, port, path; never a
  password, never the query);
- :func:`redact` removes from a text every secret of a URL, in every spelling found in it;
- :func:`remember` notes the secrets of every store URL this process opened (:func:`open_store`
  calls it), and :func:`scrub` removes all of them from any text: the command line passes every
  message it prints through it, so a message built anywhere cannot leak one.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["redact", "remember", "safe_url", "scrub", "secrets_of"]

#: What replaces a secret in a message.
MASK = "***"
#: A query or conninfo parameter with such a name holds a secret.
_SECRET_NAME = re.compile(r"pass|secret|token|key|auth|cred", re.IGNORECASE)
#: ``name=value`` pairs of a libpq conninfo string (value bare or single-quoted).
_CONNINFO_PAIR = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")

_REMEMBERED: set[str] = set()
_LOCK = threading.Lock()


def secrets_of(url: str) -> set[str]:
    """Every spelling of every secret ``url`` holds: raw and percent-decoded."""
    found: set[str] = set()
    _, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    userinfo, at, _ = netloc.rpartition("@")
    if at and ":" in userinfo:
        found.add(userinfo.split(":", 1)[1])
    query = url.partition("?")[2]
    for pair in query.split("&"):
        name, equals, value = pair.partition("=")
        if equals and _SECRET_NAME.search(name):
            found.add(value)
    for name, value in parse_qsl(query, keep_blank_values=True):
        if _SECRET_NAME.search(name):
            found.add(value)
    for name, value in _CONNINFO_PAIR.findall(url):
        if _SECRET_NAME.search(name):
            found.update({value, value.strip("'")})
    found |= {unquote(secret) for secret in found}
    return {secret for secret in found if secret}


def redact(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` replaced by ``***`` (longest first)."""
    return _mask(text, secrets_of(url))


def safe_url(url: str) -> str:
    """What a message may show of ``url``: no password, no query (``postgresql://u@h:5432/db``)."""
    if "://" not in url:
        return "(not a URL)" if secrets_of(url) else url
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        user = f"{unquote(parts.username)}@" if parts.username else ""
        host = parts.hostname or ""
    except ValueError:
        return f"{url.partition('://')[0]}://(unreadable address)"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def remember(url: str) -> None:
    """Note ``url``'s secrets, so that :func:`scrub` removes them from any later message."""
    secrets = secrets_of(url)
    if secrets:
        with _LOCK:
            _REMEMBERED.update(secrets)


def scrub(text: str) -> str:
    """``text`` without any secret of a store URL this process has opened."""
    with _LOCK:
        secrets = set(_REMEMBERED)
    return _mask(text, secrets) if secrets else text


def _mask(text: str, secrets: set[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
