"""The JSON bodies the API takes, as pydantic models (their schemas are the OpenAPI document's).

Bodies are read up to 1 MiB (413 beyond); a body that is not JSON is 400; one that does not fit
its model (a wrong type, a missing or unknown field) is 422.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request

from .._core.exceptions import InputError
from .._core.records import parse_json_text
from .._core.states import State
from ._errors import ApiError

__all__ = [
    "BODY_LIMIT",
    "BulkCancelBody",
    "CancelBody",
    "EmptyBody",
    "ForkBody",
    "ResumeBody",
    "SubmitBody",
    "UnpauseBody",
    "read_body",
]

#: The largest body the API reads (bytes).
BODY_LIMIT = 1024 * 1024

_M = TypeVar("_M", bound=BaseModel)
#: the states a bulk cancel may name: every state that is not final (states.FINAL_STATES)
_ACTIVE_STATES = {state.name: state.value for state in State if not state.is_final}
_Active = StrEnum("_Active", _ACTIVE_STATES)  # type: ignore[misc]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmptyBody(_Body):
    """``POST /api/runs/{id}/pause`` and ``/unpause``: no fields (an empty body is fine)."""


class BudgetLimits(_Body):
    """A budget's limits raised by an unpause: the ones given replace the run's."""

    usd: float | None = Field(None, ge=0, allow_inf_nan=False)
    tokens: StrictInt | None = Field(None, ge=0)
    tool_calls: StrictInt | None = Field(None, ge=0)


class UnpauseBody(_Body):
    """``POST /api/runs/{id}/unpause``: optionally, the budget raised as the run goes on (a run
    paused with reason ``budget``); an empty body is fine."""

    budget: BudgetLimits | None = None


class CancelBody(_Body):
    """``POST /api/runs/{id}/cancel``."""

    reason: StrictStr = Field("user", min_length=1, max_length=10_000)
    force: StrictBool = False
    #: a stop pressed before the run exists: an unknown id's cancel is remembered for ``ttl``
    before_start: StrictBool = False
    #: seconds (with ``before_start``)
    ttl: float = Field(600.0, gt=0, allow_inf_nan=False)


class BulkCancelBody(_Body):
    """``POST /api/cancel``: ``ids``, or ``task`` and/or ``state``, or ``all``."""

    ids: list[StrictStr] | None = Field(None, max_length=100_000)
    task: StrictStr | None = Field(None, min_length=1)
    state: _Active | None = None
    all: StrictBool = False
    reason: StrictStr = Field("user", min_length=1, max_length=10_000)
    force: StrictBool = False
    dry_run: StrictBool = False


class SubmitBody(_Body):
    """``POST /api/runs``: a pending run of ``task`` with keyword arguments ``input``."""

    task: StrictStr = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    id: StrictStr | None = Field(None, min_length=1, max_length=1000)


class ResumeBody(_Body):
    """``POST /api/runs/{id}/resume``: what happened to each ``unknown`` step."""

    assume_done: dict[str, Any] = Field(default_factory=dict)
    rerun: list[StrictInt] = Field(default_factory=list)
    deadline: float | None = Field(None, gt=0, allow_inf_nan=False)


class ForkBody(_Body):
    """``POST /api/runs/{id}/fork``: a new run whose steps before ``from_step`` are replayed
    from this one (``haltwise fork``); ``dry_run`` only lists what would run again."""

    from_step: StrictInt = Field(ge=0)
    id: StrictStr | None = Field(None, min_length=1, max_length=1000)
    dry_run: StrictBool = False
    deadline: float | None = Field(None, gt=0, allow_inf_nan=False)


async def read_body(request: Request, model: type[_M]) -> _M:
    """The request's JSON body as ``model`` (an empty body is ``{}``)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > BODY_LIMIT:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > BODY_LIMIT:
            raise _too_large()
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        raise ApiError(400, "malformed", f"the body is not valid JSON: {error}") from None
    try:
        # one parser for every JSON a user hands in: 5,000-digit integers, nesting deeper than
        # the parser recurses and NaN are refused here, in one line (issue 15, item 6)
        value = parse_json_text(text, "the body") if text.strip() else {}
    except InputError as error:
        raise ApiError(400, "malformed", str(error)) from None
    try:
        return model.model_validate(value)
    except PydanticValidationError as error:
        raise ApiError(422, "unfit", _first_problem(error)) from None


def _first_problem(error: PydanticValidationError) -> str:
    problems = error.errors(include_url=False, include_input=False)
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"]) or "the body"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _too_large() -> ApiError:
    return ApiError(413, "too_large", f"the body is over {BODY_LIMIT} bytes")
