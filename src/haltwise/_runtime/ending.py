"""How a run ends: the contract's rules on delivered cancels, failures and takeovers.

A run that was delivered a cancel ends ``cancelled`` whatever its task function then does; a
run that is ``cancelling`` never ends ``failed`` (the error is kept as ``cancel_error``); a
failure racing a cancel request ends ``cancelled`` too. Every final transition also releases
the run (final runs have no owner).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, overload

import anyio

from .._core.exceptions import (
    Cancelled,
    HaltwiseError,
    InputError,
    InvalidTransitionError,
    ResumeRefusedError,
    StoreError,
    UnknownStepError,
)
from .._core.outcome import ErrorInfo
from .._core.policy import OnCancel
from .._core.records import JSONText, RunSnapshot, dump_json
from .._core.states import State
from .._journal.shield import shielded
from .._journal.store import UNSET, WriteDone
from .approvals import cancel_awaiting_requests
from .cancel_state import HOST_CANCEL_ERRORS, NATIVE_CANCEL
from .run_context import CALL_ID, CURRENT_RUN, CURRENT_STEP, SHIELDED, RunContext
from .takeover import run_saga, settle_orphans

#: The reason of a run cancelled by a cancellation that haltwise did not request.
HOST_REASON = "host"
#: The reason of a run cancelled by a host's timeout (its TimeoutError left the task function).
TIMEOUT_REASON = "timeout"
#: the states a final transition may leave (shared sets: 10,000 runs ending at once make
#: none of their own while their transitions wait for the group commit)
_RUNNING = frozenset({State.RUNNING})
_CANCELLING = frozenset({State.CANCELLING})
_RUNNING_OR_CANCELLING = frozenset({State.RUNNING, State.CANCELLING})


@dataclass(frozen=True, slots=True)
class Ending:
    """How the task function ended: returned ``value``, or raised ``error``.

    ``host`` is the reason the run is cancelled with when the task function's end is a
    cancellation haltwise did not request: ``"host"`` when one reached the task function (a
    framework's own cancel, ``Task.cancel()`` of its task, also when it caught that and
    returned), ``"timeout"`` when a host's timeout's :class:`TimeoutError` left it. A
    :class:`~haltwise.Cancelled` the task function raised is kept without its traceback: only
    its type and reason matter to how the run ends, and the frames a traceback holds would
    otherwise live until the final state is written.
    """

    value: Any = None
    error: BaseException | None = None
    host: str | None = None


async def call_task(ctx: RunContext, inputs: dict[str, Any]) -> Ending:
    """Run the task function in the run's own cancel scope, which a cancel request cancels.

    So a cancel lands at any await of the task's own code outside steps and shields. A
    cancellation that neither that scope nor the runtime's shutdown caused is the host's: it is
    caught here (never escaping into the runtime) and becomes a ``"host"`` cancel of the run.
    """
    # The values to put back afterwards, kept as values rather than as tokens: a waiting run
    # holds no token objects (10,000 waiting runs are 50,000 objects fewer for the collector).
    outer_run, outer_step, outer_call, outer_shield = (
        CURRENT_RUN.get(),
        CURRENT_STEP.get(),
        CALL_ID.get(),
        SHIELDED.get(),
    )
    CURRENT_RUN.set(ctx)
    # A child run is launched from inside its parent's step: it must not inherit that step,
    # nor its call id or shield.
    CURRENT_STEP.set(None)
    CALL_ID.set(None)
    SHIELDED.set(False)
    body = asyncio.current_task()
    cancelling = body.cancelling() if body is not None else 0
    landed: BaseException | None = None
    try:
        with anyio.CancelScope() as scope:
            ctx.enter_body(body, scope)
            try:
                value = await ctx.task.fn(*inputs.get("args", ()), **inputs.get("kwargs", {}))
                if body is not None and body.cancelling() > cancelling:
                    if scope.cancel_called:
                        ctx.cancel.mark_delivered()  # the cancel landed in the task: it returned
                    else:
                        # The host cancelled the task function's task; it caught that and
                        # returned: the run was cancelled all the same.
                        _take_back(body, cancelling)
                        return Ending(
                            error=NATIVE_CANCEL("cancelled by its host"), host=HOST_REASON
                        )
                return Ending(value=value)
            except NATIVE_CANCEL as cancel:
                if not scope.cancel_called:
                    if anyio.current_effective_deadline() == -math.inf:
                        ctx.cancel.force()  # the runtime itself is being cancelled
                        raise
                    _take_back(body, cancelling)  # someone cancelled the task function's task
                    return Ending(error=cancel, host=HOST_REASON)
                # A cancel was requested: this is it landing, whatever CancelledError carries it
                # (a framework may raise one afresh, or its own, once ours reached it). Not
                # re-raised: the scope would let one through that does not carry its message.
                landed = cancel
            except Cancelled as cancelled:
                return Ending(error=cancelled.with_traceback(None))  # see Ending.error
            except BaseException as error:
                if _host_timeout(ctx, error):
                    return Ending(error=error, host=TIMEOUT_REASON)
                return Ending(error=error)
        if landed is not None and anyio.current_effective_deadline() == -math.inf:
            ctx.cancel.force()  # the runtime itself is being cancelled too
            raise landed
        _take_back(body, cancelling)  # a host's cancel that landed with ours is settled by it
        return Ending(error=Cancelled(ctx.cancel.reason or "user", task_id=ctx.run_id))
    finally:
        ctx.leave_body()
        CURRENT_STEP.set(outer_step)
        CALL_ID.set(outer_call)
        SHIELDED.set(outer_shield)
        CURRENT_RUN.set(outer_run)


def _host_timeout(ctx: RunContext, error: BaseException) -> bool:
    """Whether ``error``, leaving the task function, is a host's timeout (``asyncio.wait_for``,
    ``asyncio.timeout``, anyio ``fail_after``, a framework's ``timeout=``): a
    :class:`TimeoutError` that no step raised (a tool's own failure is the tool's error)."""
    if not isinstance(error, TimeoutError) or isinstance(error, HaltwiseError):
        return False
    seen = ctx.step_errors
    cause: BaseException | None = error
    for _ in range(64):  # a chain is short; a cycle is not followed forever
        if cause is None:
            break
        if any(cause is step_error for step_error in seen):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def _take_back(body: asyncio.Task[Any] | None, cancelling: int) -> None:
    """Undo the native cancels of the task function's task beyond the ``cancelling`` it had:
    they were settled as the run's cancel, and must not linger into the runtime."""
    while body is not None and body.cancelling() > cancelling:
        body.uncancel()


async def finish(
    ctx: RunContext, ending: Ending, then: WriteDone | None = None
) -> Awaitable[Any] | None:
    """Settle every step still in flight (a run is final only once all have; shielded, and
    with no shield nor wait when none is), then return the final write the contract's rules on
    delivered cancels and failures call for, not yet awaited, or None: submitted with ``then``
    (see :func:`final_write`). The caller awaits it once it has let go of ``ending``, so that
    10,000 final transitions waiting for one group commit keep neither their endings nor this
    frame.
    """
    if _steps_to_stop(ctx, ending):
        with shielded():
            await stop_steps(ctx, ending)
    return final_write(ctx, ending, then)


def _steps_to_stop(ctx: RunContext, ending: Ending) -> bool:
    """Whether :func:`stop_steps` has anything to do (else :func:`finish` waits for nothing)."""
    return bool(ctx.flights) or _own_cancel_reason(ctx, ending) is not None


def final_write(
    ctx: RunContext, ending: Ending, then: WriteDone | None = None
) -> Awaitable[Any] | None:
    """The final write once :func:`stop_steps` is done: not yet awaited, or None: submitted
    with ``then`` (where the store can, see ``Store.transition_then``)."""
    error = ctx.poison or ending.error
    if isinstance(error, StoreError):
        raise error  # the journal failed under the task, not the task: as after a crash
    cancel = ctx.cancel
    if cancel.handing_over and (cancel.delivered or error is not None) and ctx.poison is None:
        return ctx.store.release(ctx.run_id, ctx.fence)
    cancel_like = isinstance(error, Cancelled | NATIVE_CANCEL)
    if cancel.delivered or cancel.forced or (cancel.reason is not None and error is not None):
        return cancelled_write(ctx, None if cancel_like else error, then=then)
    if error is not None:
        return finish_failed(ctx, error)
    try:
        result = JSONText(dump_json(ending.value, f"the result of task {ctx.task.name!r}"))
    except InputError as bad_result:
        return finish_failed(ctx, bad_result)
    fields = {
        "expected": _RUNNING_OR_CANCELLING,
        "result": result,  # serialised once: the store writes the text as it is
        "owner": None,
        "lease_until": None,
    }
    return _final_transition(ctx, State.COMPLETED, fields, then)


@overload
def _final_transition(
    ctx: RunContext, target: State, fields: dict[str, Any], then: None = None
) -> Awaitable[Any]: ...
@overload
def _final_transition(
    ctx: RunContext, target: State, fields: dict[str, Any], then: WriteDone | None
) -> Awaitable[Any] | None: ...
def _final_transition(
    ctx: RunContext, target: State, fields: dict[str, Any], then: WriteDone | None = None
) -> Awaitable[Any] | None:
    """The run's transition to ``target`` (with ``fields``, fenced by its owner): submitted
    with ``then`` if given and the store can (None), else the store's write, not awaited."""
    store = ctx.store
    ctx.record_end(target)
    if then is not None and store.transition_then(
        then, ctx.run_id, target, fence=ctx.fence, **fields
    ):
        return None
    return store.transition(ctx.run_id, target, fence=ctx.fence, returning=False, **fields)


async def stop_steps(ctx: RunContext, ending: Ending) -> None:
    """Turn a cancel the run gave itself into a recorded one, then wait for every step to settle.

    The task (or a tool) raising :class:`Cancelled` with no cancel requested cancels the run
    with its reason; a host's cancellation that reached the task function, or one that reached
    a step before the task function raised, cancels it with reason ``"host"``. Either way the
    steps still in flight are then settled by their policies.
    """
    reason = _own_cancel_reason(ctx, ending)
    if reason is not None:
        await ctx.host.cancel(ctx.run_id, reason=reason)
        ctx.cancel.mark_delivered()
    await ctx.all_settled()


def _own_cancel_reason(ctx: RunContext, ending: Ending) -> str | None:
    error = ending.error
    if ctx.cancel.reason is not None or ctx.cancel.handing_over or ctx.poison is not None:
        return None
    if ending.host is not None:
        return ending.host
    if ctx.cancel.host and error is not None:
        return HOST_REASON
    if error is not None and isinstance(error, tuple(HOST_CANCEL_ERRORS)):
        return HOST_REASON
    if isinstance(error, Cancelled):
        return error.reason or "user"
    return None


async def finish_failed(ctx: RunContext, error: BaseException) -> None:
    """Record ``failed``, or ``cancelled`` if a cancel request won the race."""
    ctx.record_end(State.FAILED, ErrorInfo.of(error))
    try:
        await ctx.store.transition(
            ctx.run_id,
            State.FAILED,
            expected=_RUNNING,
            error=ErrorInfo.of(error),
            owner=None,
            lease_until=None,
            fence=ctx.fence,
        )
    except InvalidTransitionError:
        # A cancel was recorded meanwhile: a cancelling run never ends failed.
        await cancelled_write(ctx, cancel_error=error)


@overload
def cancelled_write(
    ctx: RunContext, cancel_error: BaseException | None, *, release: bool = True, then: None = None
) -> Awaitable[Any]: ...
@overload
def cancelled_write(
    ctx: RunContext, cancel_error: BaseException | None, *, release: bool = True, then: WriteDone
) -> Awaitable[Any] | None: ...
def cancelled_write(
    ctx: RunContext,
    cancel_error: BaseException | None,
    *,
    release: bool = True,
    then: WriteDone | None = None,
) -> Awaitable[Any] | None:
    """Run the saga if the task asks for one (not after a forced cancel), record ``cancelled``:
    not yet awaited (with no saga to run, the store's own write: no frame of ours waits with it
    for the group commit), or None: submitted with ``then`` (see :func:`_final_transition`).

    ``release=False`` keeps the run owned (a resume that finishes a cancel, then continues).
    """
    if _has_saga(ctx):
        return _saga_then_cancelled(ctx, cancel_error, release=release)
    return _final_transition(ctx, State.CANCELLED, _cancelled(cancel_error, release), then)


def _has_saga(ctx: RunContext) -> bool:
    """Whether the run's cancel runs its saga first (the task asks, the cancel is not forced)."""
    return ctx.task.on_cancel is OnCancel.COMPENSATE and not ctx.cancel.forced


async def _saga_then_cancelled(
    ctx: RunContext, cancel_error: BaseException | None, *, release: bool
) -> None:
    await run_saga(ctx, (await ctx.store.load(ctx.run_id)).steps)
    await _final_transition(ctx, State.CANCELLED, _cancelled(cancel_error, release))


def _cancelled(cancel_error: BaseException | None, release: bool) -> dict[str, Any]:
    """The fields of the transition to ``cancelled`` (``release``: the run then has no owner)."""
    return {
        "expected": _CANCELLING,
        "cancel_error": ErrorInfo.of(cancel_error) if cancel_error else None,
        "owner": None if release else UNSET,
        "lease_until": None if release else UNSET,
    }


async def settle_takeover(ctx: RunContext, snapshot: RunSnapshot) -> RunSnapshot:
    """Settle orphaned steps; a ``cancelling`` run is finished (``cancelled``), still ours,
    its requests still awaiting a decision ``cancelled`` first (each with its step
    ``interrupted``, in one write), so that none outlives its run."""
    await settle_orphans(ctx, snapshot.steps)
    if snapshot.run.state is State.CANCELLING:
        await cancel_awaiting_requests(ctx, snapshot.steps)
        if snapshot.run.force:
            ctx.cancel.force()
        await cancelled_write(ctx, cancel_error=None, release=False)
    return await ctx.store.load(ctx.run_id)


async def fail_refused(ctx: RunContext, snapshot: RunSnapshot, refused: ResumeRefusedError) -> None:
    """A refused resume leaves the run final and unowned, never half taken over."""
    if snapshot.run.state is State.RUNNING:
        index, tool = refused.steps[0]
        await ctx.store.transition(
            ctx.run_id,
            State.FAILED,
            expected={State.RUNNING},
            error=ErrorInfo.of(UnknownStepError(ctx.run_id, index, tool)),
            owner=None,
            lease_until=None,
            fence=ctx.fence,
        )
    else:
        await ctx.store.release(ctx.run_id, ctx.fence)
