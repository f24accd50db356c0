"""Records the journal hands back: runs, owners, events and snapshots (frozen, no I/O)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

from .budget import Budget
from .code import CodeVersion
from .exceptions import InputError
from .outcome import ErrorInfo, Outcome, StepRecord
from .states import State

#: Who emitted a partial result: ``(index of the step whose tool emitted it, or None for the task's
#: own code; its ordinal among that emitter's partial results)``. The same in every attempt, so a
#: replay recognises a partial result it already made.
PartialKey = tuple[int | None, int]


@final
@dataclass(frozen=True, slots=True)
class Owner:
    """Who is working a run: a process on a host, identified beyond pid reuse.

    ``token`` is unique per runtime instance and is what the store compares (fencing);
    ``pid``, ``host`` and ``started`` (the process start time, from the OS) let another process on
    the same host tell at once whether the owner is still alive.
    """

    token: str
    host: str
    pid: int
    started: float

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def to_json(self) -> str:
        return json.dumps(
            {"token": self.token, "host": self.host, "pid": self.pid, "started": self.started}
        )

    @classmethod
    def from_json(cls, text: str) -> Owner:
        data = load_json(text)
        return cls(
            token=data["token"], host=data["host"], pid=int(data["pid"]), started=data["started"]
        )


@final
@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as journaled (without its steps and partial results)."""

    id: str
    task: str
    state: State
    inputs: dict[str, Any]
    reason: str | None = None
    force: bool = False
    #: a pause was requested and not undone (stays set while the run is ``paused``)
    pause: bool = False
    #: set while the run is ``paused`` when a cancel has something to settle (a step still in
    #: flight: a child run paused with it; its saga to run): the cancel then makes it
    #: ``cancelling`` for its owner (or, if nobody works it, the canceller) to finish, instead of
    #: ending it ``cancelled`` at once
    settle_on_cancel: bool = False
    result: Any = None
    error: ErrorInfo | None = None
    cancel_error: ErrorInfo | None = None
    owner: Owner | None = None
    lease_until: float | None = None
    parent: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0


@final
@dataclass(frozen=True, slots=True)
class Event:
    """One recorded transition of a run (``source`` is ``None`` for the run's creation)."""

    run_id: str
    seq: int
    source: State | None
    target: State
    reason: str | None
    at: float


@final
@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """A run with its steps (by index) and partial results (in order), read in one transaction.

    ``partial_keys`` says, for each partial result in the same order, who emitted it (see
    :data:`PartialKey`); empty when the caller does not need it.
    """

    run: RunRecord
    steps: tuple[StepRecord, ...]
    partials: tuple[Any, ...]
    partial_keys: tuple[PartialKey, ...] = ()

    def outcome(self) -> Outcome:
        run = self.run
        return Outcome(
            id=run.id,
            task=run.task,
            state=run.state,
            reason=run.reason,
            result=run.result if run.state is State.COMPLETED else None,
            error=run.error if run.state is State.FAILED else None,
            cancel_error=run.cancel_error,
            partials=self.partials,
            steps=self.steps,
            code=CodeVersion.from_inputs(run.inputs),
            budget=Budget.from_json(run.inputs.get("budget")),
        )


#: The largest step number the journal deals in (it fits a 32-bit int): the API's bodies
#: refuse a larger one, and a decision names no request past it (SQLite's own integers end at
#: 2**63 - 1: a larger number would be an OverflowError, not an answer).
MAX_STEP = 2**31 - 1

#: what dump_json encodes with: json.dumps(value, separators=(",", ":"), allow_nan=False) builds
#: this encoder afresh at every call, ~1-2 us of a step's CPU (the output is the same)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class JSONText(str):
    """A value already serialised by :func:`dump_json`: a store writes it as it is."""

    __slots__ = ()


def dump_json(value: Any, what: str, *details: object) -> str:
    """Serialise ``value`` for the journal, or raise :class:`InputError` saying what it was:
    ``what``, or ``what % details`` if ``details`` are given (formatted only then: a step's
    result is serialised at every step, and fails almost never).

    A :class:`JSONText` is returned unchanged, so a value is never serialised twice.
    """
    if isinstance(value, JSONText):
        return str(value)  # a plain str for the database drivers
    kind = type(value)
    if kind is int:  # what the encoder writes for these, without building its C encoder
        return int.__repr__(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as error:
        raise InputError(f"{_named(what, details)} is not JSON-serialisable: {error}") from None
    except RecursionError:
        raise InputError(f"{_named(what, details)} is nested too deeply to be journaled") from None


def _named(what: str, details: tuple[object, ...]) -> str:
    return what % details if details else what


#: json.loads's own scanner, without the two regular-expression passes around it
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def load_json(text: str | None) -> Any:
    """``json.loads(text)`` (None for None), faster for what the journal writes: compact JSON
    with nothing around it. Anything else is left to ``json.loads``, which raises as it does."""
    if text is None:
        return None
    try:
        value, end = _SCAN(text, 0)
    except Exception:  # not JSON, or not text: json.loads says what is wrong
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def parse_json_text(text: str, what: str) -> Any:
    """Parse JSON a user gave (``--input``, ``--assume-done``, a request body).

    Raises :class:`InputError` naming ``what`` for text that is not JSON, and for JSON the
    journal could not hold: an integer longer than Python converts (4,300 digits), nesting
    deeper than the parser recurses, ``NaN`` or ``Infinity``. The message is one line.
    """
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise InputError(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except ValueError as error:  # an integer with too many digits, NaN, Infinity
        detail = str(error)
        if "integer string conversion" in detail:
            detail = f"an integer longer than {sys.get_int_max_str_digits()} digits"
        raise InputError(f"{what} holds a value the journal cannot keep: {detail}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
