"""Errors as the API answers them: ``{"error": {"code", "message"}}`` with the contract's status.

400 malformed, 401 no or wrong token, 403 a read-only token asking for a change or a
cross-origin cookie request, 404 unknown run or task, 409 a run held by a live owner, a refused
resume, a run id reused with another task or input, or a decision on an approval request that
is not awaiting, 413 a body over 1 MiB, 422 a body that
does not fit. Messages never hold a token.
"""

from __future__ import annotations

from typing import final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._core.exceptions import (
    ApprovalConflictError,
    CodeChangedError,
    HaltwiseError,
    IdempotencyConflictError,
    InputError,
    ResumeRefusedError,
    RunOwnedError,
    StoreError,
    UnknownRunError,
)
from .._runtime.explain import refused_words

__all__ = ["ApiError", "error_response", "from_haltwise"]


@final
class ApiError(Exception):
    """An answer other than success: HTTP ``status``, a short ``code`` and a one-line message."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = " ".join(message.split())
        #: headers the answer carries (``Allow`` on a 405)
        self.headers = dict(headers or {})


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": error.code, "message": error.message}},
        status_code=error.status,
        headers=error.headers or None,
    )


def from_haltwise(error: HaltwiseError, *, input_status: int = 422) -> ApiError:
    """The API error for a library error; ``input_status`` for bad input (400 in a query)."""
    text = str(error)
    if isinstance(error, UnknownRunError):
        return ApiError(404, "unknown_run", text)
    if isinstance(error, RunOwnedError):
        return ApiError(409, "run_owned", text)
    if isinstance(error, ResumeRefusedError):  # with the resume body's fields that settle it
        return ApiError(
            409, "resume_refused", refused_words(error.task_id or "", error.steps, "api")
        )
    if isinstance(error, CodeChangedError):
        return ApiError(409, "code_changed", text)
    if isinstance(error, ApprovalConflictError):
        return ApiError(409, "approval_conflict", text)
    if isinstance(error, IdempotencyConflictError):
        return ApiError(409, "idempotency_conflict", text)
    if isinstance(error, StoreError):
        return ApiError(503, "store_unavailable", text)
    if isinstance(error, InputError):
        return ApiError(input_status, "malformed" if input_status == 400 else "unfit", text)
    return ApiError(422, "refused", text)


async def on_api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error_response(error)


async def on_haltwise_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HaltwiseError)
    return error_response(from_haltwise(error))
