"""Approvals in a run: a call that needs one asks, waits for the decision, and runs (or not).

CONTRACT.md, "Someone else decides". The request is journaled as the call's step (status
``awaiting``) before anything of the call runs, bound to the run, the step, the tool and the
fingerprint of the arguments asked for; the decision is a compare-and-set on the request
(:meth:`~haltwise._journal.store.Store.decide_approval`), so it is used once whoever makes it.

Waiting costs what a run waiting in a tool costs: a request sleeps on its run's pause gate,
with no timer unless it has a timeout and no polling of its own. The runtime's watcher (the one
that sees other processes' cancels: ``PRAGMA data_version`` on SQLite, ``LISTEN`` on PostgreSQL)
reads the change feed's ``approval`` rows when the store changed (and at each heartbeat) and
wakes the requests decided (:func:`deliver_decisions`); a decision made in this process wakes its
request at once. A woken request reads its one row by key.
"""

from __future__ import annotations

import inspect
import json
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio

from .._core.approvals import (
    ApprovalRecord,
    ApprovalState,
    Decision,
)
from .._core.exceptions import (
    ApprovalExpired,
    ApprovalRefused,
    LostOwnershipError,
    PolicyError,
    SchemaError,
)
from .._core.outcome import ErrorInfo
from .._core.states import StepStatus
from .._core.views import ChangeKind
from .._journal.store import ApprovalRequest, StepStart, Store
from .describe import parameters_schema
from .pause import pause_point
from .spans import run_event

if TYPE_CHECKING:
    from .._core.outcome import StepRecord
    from .run_context import RunContext
    from .spec import ToolSpec

__all__ = [
    "ApprovalRule",
    "ask",
    "cancel_awaiting_requests",
    "decided_payload",
    "decision_of",
    "deliver_decisions",
    "refusal",
    "refused_decision",
    "rule",
    "woken",
]

#: the decision the current step was approved by (what :func:`haltwise.approval`'s step returns)
DECIDED: ContextVar[ApprovalRecord | None] = ContextVar("haltwise_decided", default=None)


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """What ``@haltwise.tool(approval=..., approval_timeout=...)`` declares."""

    #: ``"required"``, or ``fn(*args, **kwargs) -> bool``: whether this call needs one
    need: Literal["required"] | Callable[..., bool]
    #: seconds a request waits for a decision before it is ``expired``; None: until decided
    timeout: float | None

    def needed(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        if self.need == "required":
            return True
        assert callable(self.need)
        return bool(self.need(*args, **kwargs))


def rule(tool: str, approval: object, timeout: float | None) -> ApprovalRule | None:
    """The rule of a declaration, validated (:class:`~haltwise.PolicyError` if bad)."""
    if approval is None or approval is False:
        if timeout is not None:
            raise PolicyError(
                f"tool {tool!r}: approval_timeout= needs approval= as well", tool=tool
            )
        return None
    if approval != "required" and not callable(approval):
        raise PolicyError(
            f"tool {tool!r}: approval= must be 'required' or a function of the call's "
            f"arguments returning a bool, not {approval!r}",
            tool=tool,
        )
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise PolicyError(f"tool {tool!r}: approval_timeout= must be > 0 seconds", tool=tool)
    need: Any = approval
    return ApprovalRule(need, None if timeout is None else float(timeout))


# -- waiting ------------------------------------------------------------------------------------


class _Waiting:
    """The requests waited on in this process over one store (each by the run waiting on it),
    and how far the change feed was read for them."""

    __slots__ = ("__weakref__", "by_step", "seq")

    def __init__(self) -> None:
        self.by_step: dict[tuple[str, int], RunContext] = {}
        self.seq: int | None = None

    def wake(self, run_id: str, index: int) -> None:
        run = self.by_step.get((run_id, index))
        if run is not None:
            run.pause.wake()  # the gate's event: what the waiting request sleeps on


_WAITING: weakref.WeakKeyDictionary[Store, _Waiting] = weakref.WeakKeyDictionary()


def _waiting(store: Store) -> _Waiting:
    found = _WAITING.get(store)
    if found is None:
        found = _WAITING[store] = _Waiting()
    return found


async def deliver_decisions(store: Store) -> None:
    """Wake the requests waited on here that were decided since the change feed was last read:
    the runtime's watcher calls it when the store changed, and at each heartbeat (a wake-up
    lost is found then: the feed is read from where it was left). One read of the feed, however
    many requests wait; a pause request wakes its run's request through the run's pause gate."""
    waiting = _WAITING.get(store)
    if waiting is None or not waiting.by_step or waiting.seq is None:
        return
    while True:
        changes, _ = await store.changes_after(waiting.seq, limit=1000)
        for change in changes:
            if change.kind is ChangeKind.APPROVAL and change.index is not None:
                waiting.wake(change.run_id, change.index)
        if changes:
            waiting.seq = changes[-1].seq
        if len(changes) < 1000:
            break


def _arguments(spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (what the approver sees and may edit)."""
    try:
        bound = inspect.signature(spec.fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {"args": list(args), **kwargs}
    return dict(bound.arguments)


#: each tool's parameters schema as recorded with its requests (made once per tool)
_SCHEMAS: dict[int, tuple[ToolSpec, str | None]] = {}


def _schema(spec: ToolSpec) -> str | None:
    """The JSON schema (text) of the tool's parameters, recorded with each request so that any
    process validates an edit without importing the tool; names it does not list are refused
    (None: pydantic cannot describe the parameters; then an edit is not validated)."""
    kept = _SCHEMAS.get(id(spec))
    if kept is not None and kept[0] is spec:
        return kept[1]
    try:
        schema: dict[str, Any] | None = parameters_schema(spec)
    except SchemaError:
        schema = None
    text = None if schema is None else json.dumps(schema, separators=(",", ":"))
    _SCHEMAS[id(spec)] = (spec, text)
    return text


def _text(arguments: Mapping[str, Any]) -> str:
    """The arguments as the request keeps and lists them: strict JSON (``GET /api/approvals``
    passes this text through into its body), a value JSON has no form for as its ``repr``
    (``NaN`` and the infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"``)."""
    try:
        return json.dumps(arguments, default=repr, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a float JSON cannot hold
        return json.dumps(_finite(arguments), default=repr, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def refusal(run_id: str, record: ApprovalRecord) -> ApprovalRefused:
    """The exception a refused or expired request raises into the task."""
    if record.state is ApprovalState.EXPIRED:
        return ApprovalExpired(
            f"[haltwise] approval of {record.tool} expired: nobody decided in time",
            task_id=run_id,
            index=record.index,
        )
    words = f"[haltwise] refused by {record.by or 'someone'}"
    return ApprovalRefused(
        f"{words}: {record.note}" if record.note else words,
        task_id=run_id,
        index=record.index,
        by=record.by,
        note=record.note,
    )


async def ask(
    run: RunContext,
    spec: ToolSpec,
    start: StepStart,
    approval: ApprovalRule,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Journal the call's request (or find the one journaled: a takeover, a resume), wait for
    its decision, and return the arguments the call runs with (the edited ones if edited).

    A refusal or expiry settles the step ``refused`` and raises :class:`ApprovalRefused`
    (:class:`ApprovalExpired`). A cancel while waiting makes the request ``cancelled`` (unless
    a decision came first) and settles the step ``interrupted``, then propagates. A pause while
    waiting pauses the run here (nothing of the call has run); a decision made meanwhile takes
    effect on unpause.
    """
    index = start.index
    timeout_at = None if approval.timeout is None else time.time() + approval.timeout
    arguments = _text(_arguments(spec, args, kwargs))
    request = ApprovalRequest(start, arguments, timeout_at, _schema(spec))
    found = await run.store.request_approval(run.run_id, request, fence=run.fence)
    del request  # (what a waiting request holds is its run's frames: kept small)
    if found is None:
        raise LostOwnershipError(
            f"run {run.run_id!r}: another owner holds the run now", task_id=run.run_id
        )
    record = found
    if record.state is ApprovalState.AWAITING:
        run.progress.pulse()  # (whoever follows the run's progress sees the step awaiting)
        asked = {"haltwise.step.index": index, "gen_ai.tool.name": spec.name}
        run_event(run.trace, "haltwise.approval.requested", asked)
        timeout_at = record.timeout_at
        del record, found
        record = await _wait(run, index, timeout_at)
        decided = {**asked, "haltwise.approval.state": record.state.value}
        run_event(run.trace, "haltwise.approval.decided", decided)
    if record.state is ApprovalState.CANCELLED:
        # only the run's owner cancels a request (Store.cancel_approval is fenced), and it was
        # not this process: the run was taken over meanwhile. Never a refusal: nobody refused.
        raise LostOwnershipError(
            f"run {run.run_id!r}: another owner holds the run now", task_id=run.run_id
        )
    if record.state.allows_call:
        DECIDED.set(record)
        if record.edited is None:
            return args, kwargs
        return (), dict(record.edited)
    error = refusal(run.run_id, record)
    with anyio.CancelScope(shield=True):
        await run.store.settle_step(
            run.run_id,
            index,
            StepStatus.REFUSED,
            error=ErrorInfo(type(error).__name__, str(error)),
            fence=run.fence,
        )
    raise error


async def _wait(run: RunContext, index: int, timeout_at: float | None) -> ApprovalRecord:
    """Wait until the step's request is decided (or expires: ``timeout_at``) and return it.

    The request sleeps on its run's pause gate (no object of its own but its entry in the
    store's :class:`_Waiting`, no timer unless it has a timeout); a decision wakes the gate
    (the watcher's :func:`deliver_decisions`, or :func:`woken` in this process), as does a
    pause request. Each wake is one read of the request by key.
    """
    waiting = _waiting(run.store)
    key = (run.run_id, index)
    waiting.by_step[key] = run
    try:
        if waiting.seq is None:
            waiting.seq = await run.store.last_change()
        while True:
            changed = run.pause.next_change()  # taken before the read: no wake is missed
            found = await run.store.approval(run.run_id, index)
            if found is None:
                raise LostOwnershipError(
                    f"run {run.run_id!r} step {index}: its approval request is gone",
                    task_id=run.run_id,
                )
            if found.state is not ApprovalState.AWAITING:
                return found
            del found
            if run.pause.requested and not run.pause.paused:
                await pause_point(run)
                continue
            if timeout_at is None:
                await changed.wait()
                continue
            left = timeout_at - time.time()
            if left <= 0:
                decided, _ = await run.store.decide_approval(
                    run.run_id, index, ApprovalState.EXPIRED, by=None, note=None, edited=None
                )
                if decided is None:
                    continue  # (gone: the read above says so)
                return decided
            with anyio.move_on_after(left):
                await changed.wait()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await run.store.cancel_approval(run.run_id, index, fence=run.fence)
        raise
    finally:
        if waiting.by_step.get(key) is run:
            del waiting.by_step[key]


async def cancel_awaiting_requests(run: RunContext, steps: Sequence[StepRecord]) -> None:
    """The run is cancelled while nobody waits on its requests (its owner is gone): each step
    still ``awaiting`` has its request ``cancelled`` and itself ``interrupted``, in one write
    (:meth:`~haltwise._journal.store.Store.cancel_approval`), as a cancel while waiting would."""
    for step in steps:
        if step.status is StepStatus.AWAITING:
            await run.store.cancel_approval(run.run_id, step.index, fence=run.fence)


# -- deciding -------------------------------------------------------------------------------------


def woken(store: Store, run_id: str, index: int) -> None:
    """A decision was made in this process: wake its request if it is waited on here."""
    waiting = _WAITING.get(store)
    if waiting is not None:
        waiting.wake(run_id, index)


async def decided_payload(payload: Any = None) -> dict[str, Any]:
    """The body of :func:`haltwise.approval`'s step: the decision it was approved by, as its
    result (journaled, so a replay returns the same :class:`Decision`)."""
    record = DECIDED.get()
    return {
        "payload": payload,
        "by": None if record is None else record.by,
        "note": None if record is None else record.note,
    }


def decision_of(result: Mapping[str, Any]) -> Decision:
    """The :class:`Decision` of an approved :func:`haltwise.approval` step's result."""
    return Decision(
        approved=True, by=result.get("by"), note=result.get("note"), payload=result.get("payload")
    )


def refused_decision(refused: ApprovalRefused, payload: Any) -> Decision:
    """The :class:`Decision` of a refused :func:`haltwise.approval` request."""
    return Decision(approved=False, by=refused.by, note=refused.note, payload=payload)
