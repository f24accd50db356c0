"""Tokens and the dashboard's session cookie (CONTRACT.md, "HTTP API and dashboard").

``$HALTWISE_TOKEN`` is the operator's token (may cancel, pause, resume, submit),
``$HALTWISE_READ_TOKEN`` a read-only one; with neither set, ``serve`` makes an operator token. A
request carries ``Authorization: Bearer TOKEN`` or the session cookie that ``GET /?token=...``
sets (``HttpOnly``, ``SameSite=Strict``; its value is derived from the token, never the token
itself). A state-changing request authorised by the cookie must come from the same origin.
Tokens are compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import final
from urllib.parse import urlsplit

from starlette.requests import Request

from .._core.exceptions import InputError
from ._errors import ApiError

__all__ = ["SESSION_COOKIE", "Role", "Tokens", "authorise"]

#: The name of the dashboard's session cookie.
SESSION_COOKIE = "haltwise_session"
OPERATOR_ENV = "HALTWISE_TOKEN"
READ_ENV = "HALTWISE_READ_TOKEN"


class Role(Enum):
    """What a token may do."""

    READ = "read"
    OPERATOR = "operator"


@final
@dataclass(frozen=True, slots=True)
class Tokens:
    """The tokens a server accepts; ``generated`` if the operator token was made here."""

    operator: str
    read: str | None
    generated: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Tokens:
        """The tokens of ``$HALTWISE_TOKEN`` and ``$HALTWISE_READ_TOKEN``, or a new operator one."""
        operator = environ.get(OPERATOR_ENV) or None
        read = environ.get(READ_ENV) or None
        if operator is not None and read is not None and hmac.compare_digest(operator, read):
            raise InputError(f"${OPERATOR_ENV} and ${READ_ENV} must differ")
        if operator is None:
            return cls(operator=secrets.token_urlsafe(24), read=read, generated=True)
        return cls(operator=operator, read=read, generated=False)

    def role_of_token(self, token: str) -> Role | None:
        """The role ``token`` grants (both compared, in constant time), or None."""
        is_operator = hmac.compare_digest(token.encode(), self.operator.encode())
        is_reader = self.read is not None and hmac.compare_digest(
            token.encode(), self.read.encode()
        )
        if is_operator:
            return Role.OPERATOR
        return Role.READ if is_reader else None

    def session_for(self, role: Role) -> str:
        """The session cookie's value for ``role``: a digest of its token."""
        token = self.operator if role is Role.OPERATOR else self.read
        assert token is not None
        return hmac.new(token.encode(), b"haltwise-session", hashlib.sha256).hexdigest()

    def role_of_session(self, value: str) -> Role | None:
        operator = hmac.compare_digest(value.encode(), self.session_for(Role.OPERATOR).encode())
        reader = self.read is not None and hmac.compare_digest(
            value.encode(), self.session_for(Role.READ).encode()
        )
        if operator:
            return Role.OPERATOR
        return Role.READ if reader else None


def authorise(request: Request, tokens: Tokens, *, change: bool) -> Role:
    """The caller's role; :class:`ApiError` 401 without a valid token, 403 if ``change`` is
    asked with a read-only token or by a cookie from another origin."""
    role, by_cookie = _credentials(request, tokens)
    if role is None:
        raise ApiError(401, "unauthorized", "a valid token is needed (Authorization: Bearer)")
    if change and role is not Role.OPERATOR:
        raise ApiError(403, "forbidden", "this token may read, not change")
    if change and by_cookie and not same_origin(request):
        raise ApiError(403, "cross_origin", "a change authorised by cookie must be same-origin")
    return role


def _credentials(request: Request, tokens: Tokens) -> tuple[Role | None, bool]:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, False
        return tokens.role_of_token(token.strip()), False
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        return tokens.role_of_session(cookie), True
    return None, False


def same_origin(request: Request) -> bool:
    """True if the request's ``Origin`` (else ``Referer``) is this server's own origin."""
    host = request.headers.get("host")
    if not host:
        return False
    expected = f"{request.url.scheme}://{host}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        return origin.lower() == expected
    referer = request.headers.get("referer")
    if referer is None:
        return False
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}".lower() == expected
