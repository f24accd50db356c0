"""Row <-> record conversion shared by the SQL stores (column names are the same in both)."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any, NamedTuple, TypeVar, final

from .._core.exceptions import BadRow, CorruptRowError
from .._core.outcome import AttemptError, ErrorInfo, StepRecord
from .._core.policy import CancelPolicy, Effect
from .._core.reconcile import HOOK_NOT_ASKED, Reconciled
from .._core.records import Event, Owner, PartialKey, RunRecord, dump_json, load_json
from .._core.states import State, StepStatus
from .schema import TABLES
from .store import UNSET, CancelledRun, JournalRows

RUN_COLUMNS = (
    "id, task, state, inputs, reason, force, result, error, cancel_error, owner, lease_until, "
    "parent, created_at, updated_at, pause, settle_on_cancel"
)
STEP_COLUMNS = (
    "idx, tool, cancel, effect, idempotent, status, attempts, result, error, idem_key, args, "
    "cleanup, call_id, fingerprint, errors, reconciled, usd, tokens, calls"
)


#: every column of a step but its run id: what a fork copies from its source run
STEP_COPY_COLUMNS = ", ".join(
    column.name
    for table in TABLES
    if table.name == "steps"
    for column in table.columns
    if column.name != "run_id"
)


def error_to_text(error: ErrorInfo | None) -> str | None:
    return None if error is None else json.dumps(error.to_json())


def attempt_errors_from_text(text: str | None) -> tuple[AttemptError, ...]:
    """The ``errors`` column of a step (a JSON list of ``{"attempt", "type", "message"}``)."""
    if text is None:
        return ()
    data = load_json(text)
    if not isinstance(data, list):
        raise ValueError(f"a step's errors are a JSON list, not {type(data).__name__}")
    found = []
    for item in data:
        error = error_from_text(json.dumps(item))
        attempt = item.get("attempt") if isinstance(item, dict) else None
        if error is None or type(attempt) is not int:
            raise ValueError('an attempt\'s error needs "attempt", "type" and "message"')
        found.append(AttemptError(attempt, error))
    return tuple(found)


def error_from_text(text: str | None) -> ErrorInfo | None:
    """An error column (``{"type", "message"}``); raises ``ValueError`` if it is not one."""
    if text is None:
        return None
    data = load_json(text)
    if not isinstance(data, dict):
        raise ValueError(f"an error object is a JSON object, not {type(data).__name__}")
    kind, message = data.get("type"), data.get("message")
    if not isinstance(kind, str) or not isinstance(message, str):
        raise ValueError('an error object needs the strings "type" and "message"')
    return ErrorInfo(type=kind, message=message)


# -- reading rows: every column checked, a bad row named -------------------------------------
#
# A row edited by hand (or written by a bug) must never take a command down with a traceback:
# each conversion below raises ValueError/KeyError/TypeError/RecursionError on a bad value,
# and the *_from_row functions turn that into CorruptRowError naming the row and the column.

#: What a conversion of a stored value may raise when the value is bad.
_BAD_VALUE = (ValueError, KeyError, TypeError, RecursionError, AttributeError, OverflowError)
#: A bad row's problem is cut to this many characters (it may quote the row's content).
_PROBLEM_WIDTH = 160

_T = TypeVar("_T")

#: value -> member, a dict lookup: calling the enum costs more, and a load converts every step
_STATES = {state.value: state for state in State}
_EFFECTS = {effect.value: effect for effect in Effect}
_STEP_STATUSES = {status.value: status for status in StepStatus}
_CANCELS: dict[Any, str | None] = {None: None, **{p.value: p.value for p in CancelPolicy}}


def _member(table: dict[Any, _T], what: str) -> Callable[[Any], _T]:
    def convert(value: Any) -> _T:
        try:
            return table[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not {what}") from None

    return convert


_state = _member(_STATES, "a run state")
_effect = _member(_EFFECTS, "an effect")
_status = _member(_STEP_STATUSES, "a step status")
_cancel = _member(_CANCELS, "a cancel policy")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not text")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _optional_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _inputs(text: Any) -> dict[str, Any]:
    data = load_json(_text(text))
    if not isinstance(data, dict):
        raise ValueError(f"the inputs are a JSON object, not {type(data).__name__}")
    expected = {"args": list, "kwargs": dict, "source": str, "code": dict}
    for key, kind in expected.items():
        if key in data and not isinstance(data[key], kind):
            raise ValueError(f"the inputs' {key!r} is not a {kind.__name__}")
    return data


def _owner(text: Any) -> Owner | None:
    if not text:
        return None
    return _owner_of(_text(text))


@functools.lru_cache(maxsize=1024)
def _owner_of(text: str) -> Owner:
    """The owner a row's text names, parsed once per text: every run a process works carries
    the same owner (an ``Owner`` is frozen, so the one object may be shared)."""
    owner = Owner.from_json(text)
    _text(owner.token), _text(owner.host), _number(owner.started)
    return owner


def _json(value: Any) -> Any:
    return None if value is None else load_json(_text(value))


def _flag(value: Any) -> bool:
    if value not in (0, 1):  # True and False compare equal to 1 and 0
        raise ValueError(f"{value!r} is not a boolean")
    return bool(value)


def _problem(column: str, error: BaseException) -> str:
    if isinstance(error, RecursionError):
        detail = "nested too deeply to read"
    elif isinstance(error, KeyError):
        detail = f"missing key {error}"
    else:
        detail = str(error) or type(error).__name__
    text = f"column {column}: {detail}"
    return text if len(text) <= _PROBLEM_WIDTH else text[: _PROBLEM_WIDTH - 1] + "…"


_Checks = Sequence[tuple[str, Callable[[Any], Any]]]


def _checked(table: str, run_id: str, where: str, checks: _Checks, row: Sequence[Any]) -> list[Any]:
    """Convert each value of ``row`` with its column's converter, or raise CorruptRowError."""
    values = []
    for (column, convert), value in zip(checks, row, strict=True):
        try:
            values.append(convert(value))
        except _BAD_VALUE as error:
            raise CorruptRowError([BadRow(table, run_id, where, _problem(column, error))]) from None
    return values


_RUN_CHECKS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("id", _text),
    ("task", _text),
    ("state", _state),
    ("inputs", _inputs),
    ("reason", _optional_text),
    ("force", _flag),
    ("result", _json),
    ("error", error_from_text),
    ("cancel_error", error_from_text),
    ("owner", _owner),
    ("lease_until", _optional_number),
    ("parent", _optional_text),
    ("created_at", _number),
    ("updated_at", _number),
    ("pause", _flag),
    ("settle_on_cancel", _flag),
)
_RUN_NAMES = tuple(column for column, _ in _RUN_CHECKS)


def run_columns(run_id: Any, names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """Some columns of a run's row, converted as :func:`run_from_row` converts them;
    :class:`CorruptRowError` names the run and the column that does not parse."""
    checks = tuple((name, _RUN_CONVERTERS[name]) for name in names)
    return _checked("runs", str(run_id), "", checks, values)


def run_written(run: RunRecord, fields: Mapping[str, Any]) -> RunRecord:
    """``run`` as an update of its row with the column values ``fields`` leaves it, each value
    read back as :func:`run_from_row` reads its column (``owner_token`` goes with ``owner``):
    a write that knows the row it updates need not read it back."""
    # dataclasses.replace, without its per-field checks, by position (a run is written back
    # this way 10,000 times in a bulk cancel of 10,000 runs: 3.8 -> 2.6 us each)
    values = list(_RUN_VALUES(run))
    try:  # the common case: every value is as a write of this module leaves it
        for name, value in fields.items():
            if name != "owner_token":
                values[_RUN_POSITIONS[name]] = _RUN_CONVERTERS[name](value)
    except _BAD_VALUE:  # name the column that does not parse
        names = [name for name in fields if name != "owner_token"]
        run_columns(run.id, names, [fields[name] for name in names])
        raise
    return RunRecord(*values)


#: every field of a RunRecord (all set by its constructor, in this order)
_RUN_FIELDS = tuple(field.name for field in dataclass_fields(RunRecord))
#: a RunRecord's field values, in the order of _RUN_FIELDS
_RUN_VALUES = operator.attrgetter(*_RUN_FIELDS)
_RUN_POSITIONS = {name: index for index, name in enumerate(_RUN_FIELDS)}


def run_from_row(row: Mapping[str, Any]) -> RunRecord:
    """A run from a row with the columns of ``RUN_COLUMNS``; :class:`CorruptRowError` if any
    value does not parse (the error names the run and the column)."""
    try:
        return _run_from_plain_row(row)
    except _BAD_VALUE:
        pass  # something unusual: the converters below say whether it parses, and if not where
    run_id = row["id"]
    values = _checked("runs", str(run_id), "", _RUN_CHECKS, [row[column] for column in _RUN_NAMES])
    return RunRecord(**dict(zip(_RUN_NAMES, values, strict=True)))


_RUN_CONVERTERS = dict(_RUN_CHECKS)


def _run_from_plain_row(row: Mapping[str, Any]) -> RunRecord:
    """:func:`run_from_row`'s common case in one pass, without a call per plain column (a run is
    read three or four times in its life: this is a good part of its fixed cost).

    Every value is checked at least as strictly as its converter in ``_RUN_CHECKS`` checks it
    (the JSON columns by the same converters); a value out of the common case (an integer
    time, say) raises, and the caller converts the row column by column instead.
    tests/journal/test_bad_rows.py checks that both read every column alike.
    """
    run_id, task, reason, parent = row["id"], row["task"], row["reason"], row["parent"]
    force, pause, settle = row["force"], row["pause"], row["settle_on_cancel"]
    created, updated, lease = row["created_at"], row["updated_at"], row["lease_until"]
    if not (
        type(run_id) is str
        and type(task) is str
        and (reason is None or type(reason) is str)
        and (parent is None or type(parent) is str)
        and force in (0, 1)
        and pause in (0, 1)
        and settle in (0, 1)
        and type(created) is float
        and created == created  # not NaN
        and type(updated) is float
        and updated == updated
        and (lease is None or (type(lease) is float and lease == lease))
    ):
        raise ValueError("a run column holds a value out of the common case")
    error, cancel_error = row["error"], row["cancel_error"]
    return RunRecord(  # positional, in the field order (see step_from_row)
        run_id,
        task,
        _STATES[row["state"]],
        _inputs(row["inputs"]),
        reason,
        bool(force),
        bool(pause),
        bool(settle),  # settle_on_cancel
        _json(row["result"]),
        None if error is None else error_from_text(error),
        None if cancel_error is None else error_from_text(cancel_error),
        _owner(row["owner"]),
        lease,  # lease_until
        parent,
        created,  # created_at
        updated,  # updated_at
    )


#: the columns of a run a bulk cancel request reads (:class:`CancelledRun`'s fields, in order)
CANCELLED_COLUMNS = CancelledRun._fields
#: the same, as a SELECT list (as :data:`RUN_COLUMNS`)
CANCELLED_SELECT = ", ".join(CANCELLED_COLUMNS)


def cancelled_from_row(row: Sequence[Any]) -> CancelledRun:
    """A :class:`CancelledRun` from a row of its columns (:data:`CANCELLED_COLUMNS`), by
    position, each converted as :func:`run_from_row` converts it (:class:`CorruptRowError`
    names the run and the column that does not parse)."""
    run_id, state, reason, force, settle, owner, lease = row
    try:  # the common case in one pass, as _run_from_plain_row
        if (
            type(run_id) is str
            and (reason is None or type(reason) is str)
            and force in (0, 1)
            and settle in (0, 1)
            and (lease is None or (type(lease) is float and lease == lease))
        ):
            return CancelledRun(
                run_id, _STATES[state], reason, bool(force), bool(settle), _owner(owner), lease
            )
    except _BAD_VALUE:
        pass  # the converters below say whether it parses, and if not where
    return CancelledRun._make(run_columns(run_id, CANCELLED_COLUMNS, row))


#: what the rules of a transition read of a run (a :class:`~haltwise._core.rules.RunHead`), in order
HEAD_COLUMNS = ("id", "state", "reason", "pause", "owner")


@final
class HeadRow(NamedTuple):
    """A :class:`~haltwise._core.rules.RunHead` read from its columns (:data:`HEAD_COLUMNS`)."""

    id: str
    state: State
    reason: str | None
    pause: bool
    owner: Owner | None


def head_from_row(row: Sequence[Any]) -> HeadRow:
    """A :class:`HeadRow` from a row of :data:`HEAD_COLUMNS`, by position, each converted as
    :func:`run_from_row` converts it (:class:`CorruptRowError` names the run and the column
    that does not parse). A final group of 10,000 transitions reads 10,000 of them."""
    run_id, state, reason, pause, owner = row
    try:  # the common case in one pass, as _run_from_plain_row
        if type(run_id) is str and (reason is None or type(reason) is str) and pause in (0, 1):
            return HeadRow(run_id, _STATES[state], reason, bool(pause), _owner(owner))
    except _BAD_VALUE:
        pass  # the converters below say whether it parses, and if not where
    return HeadRow._make(run_columns(run_id, HEAD_COLUMNS, row))


def cancelled_written(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a :class:`CancelledRun` that an update of its row with the column values
    ``fields`` changes, each read back as :func:`run_from_row` reads its column (for
    ``CancelledRun._replace``)."""
    return {
        name: _RUN_CONVERTERS[name](value)
        for name, value in fields.items()
        if name in CancelledRun._fields
    }


_STEP_CHECKS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("idx", _integer),
    ("tool", _text),
    ("cancel", _cancel),
    ("effect", _effect),
    ("idempotent", _flag),
    ("status", _status),
    ("attempts", _integer),
    ("result", _json),
    ("error", error_from_text),
    ("idem_key", _text),
    ("args", _json),
    ("cleanup", _flag),
    ("call_id", _optional_text),
    ("fingerprint", _optional_text),
    ("errors", lambda text: attempt_errors_from_text(text)),
    ("reconciled", lambda text: None if text is None else Reconciled.from_text(_text(text))),
    ("usd", lambda value: None if value is None else float(value)),
    ("tokens", lambda value: None if value is None else _integer(value)),
    ("calls", lambda value: None if value is None else _integer(value)),
)


def step_from_row(row: Sequence[Any]) -> StepRecord:
    """A step from a row of ``STEP_COLUMNS``, in that order; raises on a bad value (unnamed:
    :func:`steps_from_rows` names the row).

    By position, not by name: a load converts every step of the run, and looking columns up by
    name cost about a third of it. This is the fast path: one check per column, no call for
    the columns that are plain values.
    """
    (
        index,
        tool,
        cancel,
        effect,
        idempotent,
        status,
        attempts,
        result,
        error,
        key,
        args,
        cleanup,
        call_id,
        fingerprint,
        errors,
        reconciled,
        usd,
        tokens,
        calls,
    ) = row
    if (
        type(index) is not int
        or type(attempts) is not int
        or type(tool) is not str
        or type(key) is not str
        or cancel not in _CANCELS
        or not (call_id is None or type(call_id) is str)
        or not (fingerprint is None or type(fingerprint) is str)
        or not (tokens is None or type(tokens) is int)
        or not (calls is None or type(calls) is int)
    ):
        raise ValueError("a step column holds a value of the wrong type")
    # Positional, in the field order (the row's): a dataclass's keyword arguments are matched
    # by name at every call, ~40% of constructing one (a load makes one per step).
    return StepRecord(
        index,
        tool,
        cancel,
        _EFFECTS[effect],
        bool(idempotent),
        _STEP_STATUSES[status],
        attempts,
        None if result is None else load_json(result),
        None if error is None else error_from_text(error),
        key,
        None if args is None else load_json(args),
        bool(cleanup),
        call_id,
        fingerprint,
        () if errors is None else attempt_errors_from_text(errors),
        reconciled == HOOK_NOT_ASKED,
        None if reconciled is None else Reconciled.from_text(reconciled),
        None if usd is None else float(usd),
        tokens,
        calls,
    )


#: The columns of a partial result that say where it came from (see :func:`partial_key`).
PARTIAL_COLUMNS = "value, step, ordinal, seq"


def partial_key(step: int | None, ordinal: int | None, seq: int) -> PartialKey:
    """Who emitted a partial: ``(step index or None for the task's own code, ordinal)``.

    A row written before schema version 3 has neither: it counts as the task's own ``seq``-th.
    """
    return (step, seq if ordinal is None else ordinal)


def steps_from_rows(run_id: str, rows: Sequence[Sequence[Any]]) -> tuple[StepRecord, ...]:
    """Every step of run ``run_id`` from its rows; :class:`CorruptRowError` naming the bad ones."""
    try:
        return tuple(map(step_from_row, rows))
    except _BAD_VALUE:
        pass
    bad: list[BadRow] = []
    for position, row in enumerate(rows):
        try:
            step_from_row(row)
        except _BAD_VALUE:
            where = f"step {row[0]}" if type(row[0]) is int else f"step #{position}"
            try:
                _checked("steps", run_id, where, _STEP_CHECKS, row)
                bad.append(BadRow("steps", run_id, where, "a column holds a bad value"))
            except CorruptRowError as error:
                bad.extend(error.rows)
    raise CorruptRowError(bad)


def journal_from_rows(
    runs: Iterable[Any],
    events: Iterable[Any],
    steps: Iterable[Sequence[Any]],
    partials: Iterable[Sequence[Any]],
    step_changes: Iterable[Sequence[Any]] = (),
) -> JournalRows:
    """:class:`JournalRows` from the rows of one snapshot: every run (``RUN_COLUMNS``), every
    event, every step (its run id, then ``STEP_COLUMNS``, by run and index) and every partial's
    ``(run id, seq, value)`` (by run and seq), and the feed's step changes ``(run id, index,
    status)`` in commit order. Rows that do not parse go to ``bad``."""
    bad: list[BadRow] = []
    parsed: dict[str, tuple[StepRecord, ...]] = {}
    for run_id, rows in _by_run(steps).items():
        try:
            parsed[run_id] = steps_from_rows(run_id, [row[1:] for row in rows])
        except CorruptRowError as error:
            bad.extend(error.rows)
    seqs: dict[str, list[int]] = {}
    for run_id, rows in _by_run(partials).items():
        seqs[run_id] = [row[1] for row in rows]
        try:
            partials_from_rows(run_id, [row[2] for row in rows])
        except CorruptRowError as error:
            bad.extend(error.rows)
    changes: dict[str, list[tuple[int, str]]] = {}
    for run_id, index, status in step_changes:
        changes.setdefault(run_id, []).append((int(index), str(status)))
    return JournalRows(
        runs=tuple(_parse_all(run_from_row, runs, bad)),
        events=tuple(_parse_all(event_from_row, events, bad)),
        steps=parsed,
        partial_seqs=seqs,
        bad=tuple(bad),
        step_changes=changes,
    )


def _by_run(rows: Iterable[Sequence[Any]]) -> dict[str, list[Sequence[Any]]]:
    """Rows whose first column is a run id, grouped by it (in their order)."""
    grouped: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return grouped


def _parse_all(parse: Callable[[Any], _T], rows: Iterable[Any], bad: list[BadRow]) -> list[_T]:
    """The rows that parse; the others' :class:`BadRow` appended to ``bad``."""
    try:
        return read_all(parse, rows)
    except CorruptRowError as error:
        bad.extend(error.rows)
        return list(error.readable)


def partials_from_rows(run_id: str, values: Sequence[Any]) -> tuple[Any, ...]:
    """Run ``run_id``'s partial results from their stored texts, in order."""
    try:
        return tuple(map(load_json, values))
    except _BAD_VALUE:
        pass
    bad: list[BadRow] = []
    for seq, value in enumerate(values):
        try:
            _json(value)
        except _BAD_VALUE as error:
            bad.append(BadRow("partials", run_id, f"partial {seq}", _problem("value", error)))
    raise CorruptRowError(bad)


_EVENT_CHECKS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("run_id", _text),
    ("seq", _integer),
    ("source", lambda value: None if value is None else _state(value)),
    ("target", _state),
    ("reason", _optional_text),
    ("at", _number),
)
_EVENT_NAMES = tuple(column for column, _ in _EVENT_CHECKS)


def event_from_row(row: Mapping[str, Any]) -> Event:
    """An event from its row; :class:`CorruptRowError` naming it if a value does not parse."""
    where = f"event {row['seq']}"
    values = _checked(
        "events", str(row["run_id"]), where, _EVENT_CHECKS, [row[name] for name in _EVENT_NAMES]
    )
    return Event(**dict(zip(_EVENT_NAMES, values, strict=True)))


def each_read(parse: Callable[[Any], _T], read: Callable[[], Iterable[Any]]) -> Iterator[_T]:
    """Each row of ``read()`` parsed, one at a time (no row nor list of them kept); if one does
    not parse, the rows are read again and :class:`CorruptRowError` raised as :func:`read_all`
    raises it (naming every bad row, the others as its ``readable``)."""
    try:
        for row in read():
            yield parse(row)
    except CorruptRowError:
        read_all(parse, read())
        raise


def read_all(parse: Callable[[Any], _T], rows: Iterable[Any]) -> list[_T]:
    """``parse`` every row; if some do not parse, raise :class:`CorruptRowError` naming them
    all, with the rows that did parse as its ``readable``."""
    good: list[_T] = []
    bad: list[BadRow] = []
    for row in rows:
        try:
            good.append(parse(row))
        except CorruptRowError as error:
            bad.extend(error.rows)
    if bad:
        raise CorruptRowError(bad, good)
    return good


#: a transition's field that only its event records, as the event's reason (``note=``)
EVENT_NOTE = "_event_note"


def transition_fields(
    target: State,
    *,
    reason: Any = UNSET,
    result: Any = UNSET,
    error: Any = UNSET,
    cancel_error: Any = UNSET,
    owner: Any = UNSET,
    lease_until: Any = UNSET,
    settle_on_cancel: Any = UNSET,
    note: str | None = None,
) -> dict[str, Any]:
    """The run columns a :meth:`Store.transition` writes (arguments left ``UNSET`` are kept).

    Entering ``running`` clears ``force``: a resumed run starts with no cancel pending.
    ``note``: the reason the transition's event records instead of the run's (what a resume
    allowed: ``allow_code_change``); the run's ``reason`` column is not changed by it.
    """
    fields: dict[str, Any] = {"state": target.value}
    if reason is not UNSET:
        fields["reason"] = reason
    if result is not UNSET:
        fields["result"] = dump_json(result, "the task's result")
    if error is not UNSET:
        fields["error"] = error_to_text(error)
    if cancel_error is not UNSET:
        fields["cancel_error"] = error_to_text(cancel_error)
    if owner is not UNSET:
        fields["owner"] = owner.to_json() if owner else None
        fields["owner_token"] = owner.token if owner else None
    if lease_until is not UNSET:
        fields["lease_until"] = lease_until
    if settle_on_cancel is not UNSET:
        fields["settle_on_cancel"] = settle_on_cancel
    if note is not None:
        fields[EVENT_NOTE] = note
    if target is State.RUNNING:
        fields["force"] = False
    return fields
