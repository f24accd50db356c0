"""The JSON bodies the API takes, as pydantic models (their schemas are the OpenAPI document's).

Bodies are read up to 1 MiB (413 beyond); a body that is not JSON is 400; one that does not fit
its model (a wrong type, a missing or unknown field) is 422.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import ClientDisconnect, Request

from .._core.exceptions import InputError
from .._core.records import MAX_STEP, parse_json_text
from .._core.states import State
from ._errors import ApiError

__all__ = [
    "BODY_LIMIT",
    "NO_NUL",
    "ActiveState",
    "BulkCancelBody",
    "CancelBody",
    "DecisionBody",
    "EmptyBody",
    "ForkBody",
    "ResumeBody",
    "SubmitBody",
    "UnpauseBody",
    "read_body",
    "whole_number",
]

#: The largest body the API reads (bytes).
BODY_LIMIT = 1024 * 1024

_M = TypeVar("_M", bound=BaseModel)
#: the states a bulk cancel may name: every state that is not final (states.FINAL_STATES)
_ACTIVE_STATES = {state.name: state.value for state in State if not state.is_final}
ActiveState = StrEnum("ActiveState", _ACTIVE_STATES)  # type: ignore[misc]

#: A text the journal can hold: no NUL character (no store keeps one; PostgreSQL refuses it).
#: The pattern is in the OpenAPI document, so a client knows it before it sends.
NO_NUL = r"^[^\x00]*$"


def _whole_number(value: object) -> object:
    """JSON Schema's ``integer``: an int, or a number with no fraction (``659.0``); never a
    boolean or a string. Anything else is handed on for the int check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number")
    return value


#: A step number as JSON Schema's ``integer`` means it (so ``659.0`` is one).
StepNumber = Annotated[int, Field(ge=0, le=MAX_STEP), BeforeValidator(_whole_number)]
#: A run id given in a body: 1 to 1000 characters, no NUL.
RunId = Annotated[StrictStr, Field(min_length=1, max_length=1000, pattern=NO_NUL)]
#: A cancel's reason: 1 to 10,000 characters, no NUL.
Reason = Annotated[StrictStr, Field(min_length=1, max_length=10_000, pattern=NO_NUL)]


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

    reason: Reason = "user"
    force: StrictBool = False
    #: a stop pressed before the run exists: an unknown id's cancel is remembered for ``ttl``
    before_start: StrictBool = False
    #: seconds (with ``before_start``)
    ttl: float = Field(600.0, gt=0, allow_inf_nan=False)


class BulkCancelBody(_Body):
    """``POST /api/cancel``: ``ids``, or ``task`` and/or ``state``, or ``all``."""

    ids: list[StrictStr] | None = Field(None, max_length=100_000)
    task: StrictStr | None = Field(None, min_length=1)
    state: ActiveState | None = None
    all: StrictBool = False
    reason: Reason = "user"
    force: StrictBool = False
    dry_run: StrictBool = False


class SubmitBody(_Body):
    """``POST /api/runs``: a pending run of ``task`` with keyword arguments ``input``."""

    task: StrictStr = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    id: RunId | None = None


class _Decision(StrEnum):
    APPROVE = "approve"
    REFUSE = "refuse"


class DecisionBody(_Body):
    """``POST /api/runs/{id}/approvals/{step}``: approve (``edit``: the arguments the call runs
    with instead, by name) or refuse the step's pending approval request."""

    decision: _Decision
    edit: dict[str, Any] | None = None
    by: StrictStr | None = Field(None, max_length=1000)
    note: StrictStr | None = Field(None, max_length=10_000)


class ResumeBody(_Body):
    """``POST /api/runs/{id}/resume``: what happened to each ``unknown`` step."""

    #: step number (decimal digits, as JSON keys are text) -> the result the step is taken to have
    assume_done: dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Any] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )
    rerun: list[StepNumber] = Field(default_factory=list)
    deadline: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: resume although the task's file changed since the run started
    allow_code_change: StrictBool = False


class ForkBody(_Body):
    """``POST /api/runs/{id}/fork``: a new run whose steps before ``from_step`` are replayed
    from this one (``haltwise fork``); ``dry_run`` only lists what would run again."""

    from_step: StepNumber
    id: RunId | None = None
    dry_run: StrictBool = False
    deadline: float | None = Field(None, gt=0, allow_inf_nan=False)


def whole_number(text: str, what: str, *, low: int, high: int) -> int:
    """``text`` (a query parameter or a header) as a whole number from ``low`` to ``high``, in
    ASCII digits only: ``str.isdigit`` also takes ``\u00b2`` (which ``int`` refuses) and ``\u0661``
    (an Arabic-Indic one, which ``int`` reads as 1). Anything else is a 400 naming ``what``."""
    if text.isascii() and text.isdigit() and len(text) <= 18 and low <= int(text) <= high:
        return int(text)
    raise ApiError(400, "malformed", f"{what} must be a whole number from {low} to {high}")


async def read_body(request: Request, model: type[_M]) -> _M:
    """The request's JSON body as ``model`` (an empty body is ``{}``)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > BODY_LIMIT:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > BODY_LIMIT:
                raise _too_large()
            chunks.append(chunk)
    except ClientDisconnect:  # gone, or timed out (server/_protocol.py): nobody reads the answer
        raise ApiError(408, "timeout", "the body was not read in time") from None
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
        raise ApiError(422, "unfit", _problems(error)) from None


#: How many of a body's problems a 422 names (the rest are counted).
_SHOWN_PROBLEMS = 10


def _problems(error: PydanticValidationError) -> str:
    """Every problem of the body, ``field: what`` joined by ``; `` (the first ten, then how
    many more), so a client fixes them all at once."""
    problems = error.errors(include_url=False, include_input=False)
    parts = []
    for problem in problems[:_SHOWN_PROBLEMS]:
        where = ".".join(str(part) for part in problem["loc"]) or "the body"
        parts.append(f"{where}: {problem['msg']}")
    more = len(problems) - _SHOWN_PROBLEMS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _too_large() -> ApiError:
    return ApiError(413, "too_large", f"the body is over {BODY_LIMIT} bytes")
