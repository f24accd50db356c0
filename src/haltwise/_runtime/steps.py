"""One tool call inside a task: journal it, run it under its cancel policy, settle it.

The order is what makes a crash safe: the step's start is durable before the tool body runs,
and its settlement (with the result) is durable before the task sees the result. A replayed
step (``committed`` in the journal) returns its journaled result without running.

A step's index is taken the moment the call begins, before it awaits anything, and the step is
tracked by its run until it has settled (the run is final only once every step has). How a
cancel reaches a tool body depends on where it runs, and this module is the one place that
knows (the asyncio seam):

- an async ``interruptible`` or ``rollback`` body runs in the caller's own task; a cancel
  interrupts it there (the task function's cancel scope when the step runs in the task
  function's own task, a cancel of the caller's task otherwise);
- an async ``finish`` (or undeclared) body runs in a task of its own, and a plain function in a
  thread: the caller waits for it, and a cancel interrupts only that wait, so the body can
  finish within its grace whatever cancelled the caller (haltwise, a framework, ``wait_for``).

A cancellation that haltwise did not request (a host's) is settled by the same policy, then
propagates as it came; one haltwise requested is raised into the task as
:class:`~haltwise.Cancelled`.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import json
import sys
import time
import zlib
from collections.abc import Callable, Coroutine, Mapping
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from .._core.exceptions import (
    Cancelled,
    ReplayedError,
    StepTimeoutError,
    StoreError,
    UnknownStepError,
)
from .._core.outcome import ErrorInfo, StepRecord, blocks_resume
from .._core.policy import CancelPolicy
from .._core.reconcile import HOOK_NOT_ASKED
from .._core.records import JSONText, dump_json, load_json
from .._core.states import StepStatus
from .._journal.store import StepStart
from .approvals import ApprovalRule, ask
from .budget import enforce_budget
from .cancel_state import NATIVE_CANCEL
from .pause import pause_point
from .retries import may_retry
from .run_context import CALL_ID, CURRENT_STEP, SHIELDED, RunContext, StepContext
from .spans import begin_step, compensation_span, end_step, step_current
from .threads import ThreadCall, start_thread

if TYPE_CHECKING:
    from .spec import ToolSpec

_RUN_AGAIN = object()
#: results of these types read back from JSON as the very same value: no need to re-parse
_SAME_AFTER_JSON = frozenset({int, str, bool, float, type(None)})
#: the fingerprint of a call without arguments (the common case, computed once)
_NO_ARGUMENTS = "00000000"
#: argument types whose repr is their value, the same in every process
_SCALARS = frozenset({int, str, float, bool, type(None)})


async def execute_step(
    run: RunContext, spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """What awaiting a tool function (or :func:`haltwise.step`) inside run ``run`` does, outside
    any step (the run's :attr:`~RunContext.execute`)."""
    if run.probe is not None:
        # The point before a step that is never begun: its index must stay free.
        await _probe(run, "before", run.numbering.peek(CALL_ID.get()))
    if run.pause.requested:
        await pause_point(run)
    run.raise_if_cancelled()
    if run.metered and run.over_budget(spec.counts_calls) is not None:
        await enforce_budget(run, spec.counts_calls)  # no step begins once a limit is reached
    flight = _Flight(run, spec, args, kwargs)
    try:
        result = await flight.perform()
    finally:
        run.land(flight.index)
        if flight.counted:
            run.host.count_side_steps(-1)
    if time.monotonic() >= run.next_yield:
        await run.between_steps(flight.replayed)
    if run.probe is not None:
        await _probe(run, "after", flight.index)
    if run.pause.requested:
        await pause_point(run)
    run.raise_if_cancelled()
    if run.metered and run.over_budget() is not None:
        await enforce_budget(run)  # the step's spend reached a limit: stop now
    return result


async def _probe(run: RunContext, kind: str, index: int) -> None:
    """Await the test probe at a cancel point, out of reach of the cancel it may request."""
    assert run.probe is not None
    with anyio.CancelScope(shield=True):
        await run.probe(kind, index)


def fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short fingerprint of a call's arguments, the same in every attempt for equal arguments.

    JSON values are compared by value (dict keys in any order); any other object by its type
    only (its identity changes between attempts), so a fingerprint never refuses a replay that
    passes a fresh framework object of the same kind.
    """
    if not kwargs:
        if not args:
            return _NO_ARGUMENTS
        if _SCALARS.issuperset(map(type, args)):
            # The common case, without the JSON encoder: the repr of these is their value.
            return f"{zlib.crc32(repr(args).encode()):08x}"
    try:
        text = _FINGERPRINT_JSON.encode([args, kwargs])
    except (TypeError, ValueError):  # keys of mixed types, a cycle: compare the shape only
        text = json.dumps([[_opaque(value) for value in args], sorted(map(str, kwargs))])
    return f"{zlib.crc32(text.encode()):08x}"


def _opaque(value: Any) -> str:
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


#: the encoder of a fingerprint's JSON (json.dumps would build one at every call)
_FINGERPRINT_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=_opaque)


def _replay(run: RunContext, journaled: StepRecord, spec: ToolSpec, print_: str) -> Any:
    """A journaled step's replay: its result, its error raised again, or ``_RUN_AGAIN``."""
    if journaled.tool != spec.name:
        raise run.diverge(journaled, spec.name)
    status = journaled.status
    if status is StepStatus.COMMITTED:
        if journaled.fingerprint is not None and journaled.fingerprint != print_:
            raise run.diverge(journaled, spec.name, what="arguments")
        return journaled.result
    if status is StepStatus.FAILED and _went_past(run, journaled):
        if journaled.fingerprint is not None and journaled.fingerprint != print_:
            raise run.diverge(journaled, spec.name, what="arguments")
        assert journaled.error is not None
        replayed = rebuilt_error(journaled.error, spec)
        if isinstance(replayed, TimeoutError):
            run.note_step_error(replayed)  # a tool's timeout, replayed: not a host's
        raise replayed
    if blocks_resume(journaled, run.rerun):
        raise UnknownStepError(run.run_id, journaled.index, journaled.tool)
    return _RUN_AGAIN


def _went_past(run: RunContext, journaled: StepRecord) -> bool:
    """Whether the task saw this failed step's error and went past it (CONTRACT.md, "Resume
    and determinism"): every failed step but the one whose error ended the run, unless the
    caller asked for it to run again (``rerun``)."""
    return (
        journaled.error is not None
        and journaled.index != run.ended_by
        and journaled.index not in run.rerun
    )


#: Exception types a failed step's error may be rebuilt as, by type name, beyond the builtins
#: and the tool's own module. Added to only by :func:`register_replayable_error`.
REPLAYABLE_ERRORS: dict[str, type[BaseException]] = {}


def register_replayable_error(*error_types: type[BaseException]) -> None:
    """Declare exception types a failed step's journaled error may be rebuilt as on resume.

    A step that failed, and that the task went past, replays its error on resume: as its own
    type when that type is found by name (a builtin, a name in the tool's module, or a type
    registered here) and its text comes back the same from its message alone, otherwise as
    :class:`~haltwise.ReplayedError`. For an integration whose framework raises its own types
    from tools (the Pydantic AI adapter registers ``ModelRetry``, so that the model is handed
    the same retry prompt again). The first type registered under a name keeps it. Raises
    :class:`TypeError` for anything but an exception class.
    """
    for error_type in error_types:
        if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
            raise TypeError(f"{error_type!r} is not an exception class")
    for error_type in error_types:
        REPLAYABLE_ERRORS.setdefault(error_type.__name__, error_type)


def rebuilt_error(error: ErrorInfo, spec: ToolSpec) -> BaseException:
    """The journaled ``error`` of a failed step, to raise again on resume.

    Rebuilt as its own type when that type is found by name (an integration's registered
    type, a builtin exception, a name in the tool's module) and its text comes back the same
    from its message alone; otherwise :class:`~haltwise.ReplayedError` with the same text.
    """
    kind = REPLAYABLE_ERRORS.get(error.type) or _named_exception(error.type, spec)
    if kind is not None:
        try:
            rebuilt = kind(error.message)
        except Exception:
            rebuilt = None
        if isinstance(rebuilt, Exception) and str(rebuilt) == error.message:
            return rebuilt
    return ReplayedError(error.type, error.message)


def _named_exception(name: str, spec: ToolSpec) -> type[BaseException] | None:
    module = sys.modules.get(getattr(spec.fn, "__module__", "") or "")
    for where in (vars(builtins), vars(module) if module is not None else {}):
        found = where.get(name)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return None


def _args_json(spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The arguments a ``rollback`` tool's step journals (to compensate after a crash), and a
    tool's with a ``reconcile`` hook (to ask it after a crash)."""
    kept = "to compensate" if spec.effective_cancel is CancelPolicy.ROLLBACK else "to reconcile"
    return dump_json(
        {"args": list(args), "kwargs": kwargs, "tool": spec.key},
        f"the arguments of tool {spec.name!r} (kept {kept} after a crash)",
    )


async def settle(
    run: RunContext,
    index: int,
    status: StepStatus,
    *,
    result: Any = None,
    error: ErrorInfo | None = None,
    durable: bool = True,
    step: StepContext | None = None,
    hooked: bool = False,
) -> None:
    """Journal how a step ended; the store completes it even if a cancel arrives meanwhile.

    ``durable=False`` lets the store commit it with the next write (see ``may_defer_settle``).
    ``step``: the step's context, whose spend the settlement journals.
    ``hooked``: the step's tool has a ``reconcile`` hook (:attr:`ToolSpec.hooked`); a step it
    leaves ``unknown`` is marked as waiting for that hook (the retry advice is then
    ``resume``, which asks it).
    """
    await run.store.settle_step(
        run.run_id,
        index,
        status,
        result=result,
        error=error,
        fence=run.fence,
        durable=durable,
        spend=None if step is None else step.spend_row(),
    )
    if hooked and status is StepStatus.UNKNOWN:
        await run.store.reconcile_step(
            run.run_id, index, status, reconciled=HOOK_NOT_ASKED, fence=run.fence
        )
    if run.trace is not None:
        end_step(run.trace, index, status, error)


class _Phase(Enum):
    """Where a step is; a cancel interrupts the caller only while the body runs, or while it
    waits to retry a failed attempt."""

    BEFORE = auto()
    BODY = auto()
    AFTER = auto()
    #: between a failed attempt (settled ``failed``) and the next: the backoff wait
    WAIT = auto()
    #: its approval request waits for a decision (nothing of the call has run)
    AWAITING = auto()


#: the phases in which a cancel interrupts the caller
_CUT_IN = frozenset({_Phase.BODY, _Phase.WAIT, _Phase.AWAITING})


class _Flight:
    """One step, from the moment its index is taken until it has settled."""

    __slots__ = (
        "args",
        "call_id",
        "caller",
        "counted",
        "failed_as",
        "finishing_here",
        "grace_timer",
        "in_body_task",
        "index",
        "inner",
        "kwargs",
        "native_cancels",
        "phase",
        "policy",
        "print_",
        "replayed",
        "run",
        "shielded",
        "spec",
        "step",
        "thread",
    )

    def __init__(
        self, run: RunContext, spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.run = run
        self.spec = spec
        self.args = args
        self.kwargs = kwargs
        self.policy = spec.effective_cancel
        self.call_id = CALL_ID.get()
        self.shielded = SHIELDED.get()
        body = run.body_task
        # Given the loop, current_task() does not look it up (a getpid() system call each time)
        self.caller = asyncio.current_task(None if body is None else body.get_loop())
        self.in_body_task = self.caller is body
        self.phase = _Phase.BEFORE
        self.replayed = False
        self.counted = False
        self.native_cancels = 0
        #: how the latest attempt was settled after it raised (None: it did not raise)
        self.failed_as: StepStatus | None = None
        #: the body's own task (async finish) or its thread's result, when it runs apart
        self.inner: asyncio.Future[Any] | None = None
        #: a finish body runs in the task function's own task now (see _finish_here)
        self.finishing_here = False
        self.grace_timer: asyncio.TimerHandle | None = None
        self.thread: ThreadCall | None = None
        self.step: StepContext | None = None
        # The index is taken now, synchronously: concurrent calls are numbered in the order
        # they begin, in every attempt.
        self.print_ = fingerprint(args, kwargs)
        self.index = run.numbering.take(self.call_id, spec.name, self.print_)
        run.fly(self)

    # -- what a cancel does ----------------------------------------------------------------

    def on_cancel(self) -> None:
        """The run was asked to stop: interrupt the body (or the wait for it) per the policy.

        A step begun inside a shield is left alone unless the cancel is forced. The task
        function's own task is reached by its cancel scope; any other caller's task is
        cancelled here, and that cancel is taken back once the step has settled.
        """
        forced = self.run.cancel.forced
        if self.phase not in _CUT_IN or (self.shielded and not forced):
            return
        caller = self.caller
        if self.finishing_here and caller is not None:
            # finish, in the task function's own task: cut at once if forced, else after grace
            if forced:
                self._cut()
            elif self.grace_timer is None:
                loop = asyncio.get_running_loop()
                self.grace_timer = loop.call_later(self.spec.policy.grace, self._cut)
            return
        if self.in_body_task or caller is None or caller.cancelling():
            return  # the task scope reaches it, or a cancel is on its way already (a gather's)
        self._cancel_caller(self.on_cancel)

    # -- the step ----------------------------------------------------------------------------

    async def perform(self) -> Any:
        run = self.run
        print_ = self.print_
        journaled = run.journal.get(self.index)
        if journaled is not None:
            replayed = _replay(run, journaled, self.spec, print_)
            if replayed is not _RUN_AGAIN:
                self.replayed = True
                return replayed
        key = journaled.idempotency_key if journaled is not None else run.new_key(self.index)
        approval = self.spec.approval
        if approval is not None and approval.needed(self.args, self.kwargs):
            await self._ask(approval, key, print_)
        retry = 0
        step = StepContext(run, self.index, key, counts_calls=self.spec.counts_calls)
        if journaled is not None:  # run again: what its earlier attempts spent is its own
            step.usd = journaled.usd or 0.0
            step.tokens = journaled.tokens or 0
            step.calls = journaled.calls or 0
        while True:
            self.failed_as = None
            step.polled = False
            step.emits = 0  # an attempt's partial results are the same ones in every attempt
            self.step = step
            await self._start(key, print_, retry + 1)
            outer = CURRENT_STEP.get()  # put back as a value: a waiting step holds no token
            CURRENT_STEP.set(self.step)
            try:
                if run.trace is None:
                    return await self._execute()
                with step_current(run.trace, self.index):
                    return await self._execute()
            except Exception as error:
                if not may_retry(run, self.spec.policy, error, retry, self.failed_as):
                    raise
                if run.metered and run.over_budget(self.spec.counts_calls) is not None:
                    raise  # a retry is a new call: none begins once a limit is reached
            finally:
                CURRENT_STEP.set(outer)
            retry += 1
            await self._wait_to_retry(retry)

    @property
    def awaiting(self) -> bool:
        """Its approval request waits for a decision: the run may pause meanwhile."""
        return self.phase is _Phase.AWAITING

    async def _ask(self, approval: ApprovalRule, key: str, print_: str) -> None:
        """Ask for the call's approval and wait for the decision (see :func:`approvals.ask`):
        the arguments become the edited ones if it was edited; a refusal raises."""
        policy = self.spec.policy
        start = StepStart(
            self.index,
            self.spec.name,
            policy.cancel._value_ if policy.cancel else None,
            policy.effect,
            policy.idempotent,
            key,
            None,
            False,
            self.call_id,
            print_,
        )
        self.phase = _Phase.AWAITING
        try:
            self.args, self.kwargs = await ask(
                self.run, self.spec, start, approval, self.args, self.kwargs
            )
        except NATIVE_CANCEL as cancel:
            self.phase = _Phase.AFTER
            self._propagate(cancel)
        self.phase = _Phase.BEFORE

    async def _wait_to_retry(self, retry: int) -> None:
        """The backoff before retry number ``retry`` (the step is settled ``failed`` meanwhile).

        A cancel ends the wait at once, as it interrupts a body, and is raised as a body's
        would be: never retried.
        """
        self.phase = _Phase.WAIT
        try:
            await anyio.sleep(self.spec.policy.backoff.delay(retry))
        except NATIVE_CANCEL as cancel:
            self.phase = _Phase.AFTER
            self._propagate(cancel)
        self.phase = _Phase.BEFORE

    async def _start(self, key: str, print_: str, attempt: int) -> None:
        """Journal the start (attempt number ``attempt`` of this call: retries count); a cancel
        that came first settles the step before its body runs."""
        run = self.run
        policy = self.spec.policy
        # Positional, in the field order: keyword arguments are matched by name at every call.
        start = StepStart(
            self.index,
            self.spec.name,
            policy.cancel._value_ if policy.cancel else None,  # cancel (.value: a property)
            policy.effect,
            policy.idempotent,
            key,  # idempotency_key
            (  # args
                _args_json(self.spec, self.args, self.kwargs) if self.spec.keeps_args else None
            ),
            run.cancel.requested,  # cleanup
            self.call_id,
            print_,  # fingerprint
        )
        if self.spec.counts_calls:
            run.add_spend(0.0, 0, 1)  # a tool call counts when it begins (each attempt)
        if not self.in_body_task and not self.counted:
            # Beside the task function's own code: the store batches its writes with others.
            self.counted = True
            run.host.count_side_steps(+1)
        try:
            started = await run.store.start_step(
                run.run_id, start, fence=run.fence, durable=not self.spec.defer_start
            )
        except NATIVE_CANCEL:
            # Cancelled while waiting for the write, which happens anyway: the body never ran.
            await _to_the_end(settle(run, self.index, StepStatus.INTERRUPTED, step=self.step))
            raise
        if run.trace is not None:
            begin_step(
                run.trace, run.run_id, self.spec.name, policy, self.index, attempt, self.call_id
            )
        if started.cancel is not None:
            reason, force = started.cancel
            run.request_cancel(reason, force=force)
        elif started.pause and not run.pause.requested:
            run.pause.request()  # another process asked: the run pauses once this step ends
        cancel = run.cancel
        if (cancel.reason is not None and not self.shielded) or cancel.forced:
            # The cancel came first: the body never ran.
            await settle(run, self.index, StepStatus.INTERRUPTED, step=self.step)
            run.raise_if_cancelled()
            raise Cancelled(cancel.reason or "user", task_id=run.run_id)

    async def _execute(self) -> Any:
        run = self.run
        if run.probe is not None:
            await _probe(run, "during", self.index)
        if time.monotonic() >= run.held_until:
            await hold_lease(run)
        self.phase = _Phase.BODY
        try:
            timeout = self.spec.policy.timeout
            if timeout is None and self._body_in_caller():
                value = await self.spec.fn(*self.args, **self.kwargs)  # no frame in between
            else:
                value = await (self._invoke() if timeout is None else self._invoke_within(timeout))
        except StoreError:
            raise  # the journal failed, not the tool: the step stays as last journaled
        except Cancelled as cancel:
            self.phase = _Phase.AFTER
            await self._tool_cancelled(cancel)
        except NATIVE_CANCEL as cancel:
            self.phase = _Phase.AFTER
            # Raised into the task as Cancelled (see _propagate), the CancelledError is not
            # needed any more: dropped here, it does not keep the frames its traceback holds
            # alive while the step settles (10,000 runs cancelled at once would hold them all
            # until their group commit, for the garbage collector to walk again and again).
            interrupted = None if self._delivers_cancelled() else cancel
        except Exception as error:
            self.phase = _Phase.AFTER
            if run.cancel.reason is not None and self.policy is not CancelPolicy.FINISH:
                # A body that turned the cancel into an error of its own was still cancelled.
                await self._settle_cancelled()
                self._propagate(error)
            await self._failed(error)
            raise
        else:
            self.phase = _Phase.AFTER
            if self.native_cancels:
                self._take_back_cancels()
            return await self._commit(value)
        await self._settle_cancelled()
        self._propagate(interrupted)

    async def _apart(self) -> Any:
        """The body, in a task of its own. That task begins a turn of the loop after
        :meth:`_execute` looked at the lease, and this process may stall in between (another
        callback, a long pause): the lease is looked at again as the body begins."""
        await hold_lease(self.run)
        return await self.spec.fn(*self.args, **self.kwargs)

    async def _invoke_within(self, timeout: float) -> Any:
        """:meth:`_invoke`, stopped after the tool's ``timeout`` as a cancel of this step alone
        would stop it; then :class:`StepTimeoutError` (the step is settled as a failure)."""
        with anyio.move_on_after(timeout):
            return await self._invoke()
        if self.policy is CancelPolicy.INTERRUPTIBLE:
            self._abandon()  # a plain function's thread: its late result is dropped
        raise StepTimeoutError(self.run.run_id, self.index, self.spec.name, timeout)

    def _body_in_caller(self) -> bool:
        """Whether the body is awaited right in the caller's task: an async ``interruptible``
        or ``rollback`` body (see the module docstring)."""
        return self.spec.is_async and self.policy is not CancelPolicy.FINISH

    async def _invoke(self) -> Any:
        """Run the body; for a body that runs apart, wait for it (see the module docstring)."""
        spec = self.spec
        if self._body_in_caller():
            return await spec.fn(*self.args, **self.kwargs)
        if spec.is_async and self.in_body_task and _no_scope_between(self.run):
            return await self._finish_here()
        if spec.is_async:
            self.inner = asyncio.ensure_future(self._apart())
            if self.run.cancel.forced and not self.shielded:
                # A forced cancel came first: the body is stopped at its first await, as a
                # body running in the caller's task would be.
                asyncio.get_running_loop().call_soon(self.inner.cancel)
        else:
            self.thread = start_thread(spec.fn, self.args, self.kwargs)
            self.inner = self.thread.result
        await _wait_done(self.inner)
        return self.inner.result()

    async def _finish_here(self) -> Any:
        """A ``finish`` body awaited by the task function itself: run it in this task.

        While it runs, a cancel request holds back the cancel of the task's scope (see
        :meth:`RunContext.request_cancel`) and gives the body ``grace`` (see :meth:`on_cancel`);
        then it is cut by a cancel of this task. Cheaper than a task of its own: a sequential
        step must stay cheap. The one cancel that reaches it otherwise is a host's cancel of
        the task function's own task (an ``asyncio.timeout()`` around the call): the body is
        then cut, and the step ``unknown``.
        """
        run = self.run
        cancel = run.cancel
        scope = cancel.task_scope
        if scope is not None and scope.cancel_called and not cancel.forced:
            return await self._finish_shielded()
        self.finishing_here = True
        cancel.hold_task_scope(+1)
        try:
            if cancel.forced and not self.shielded:
                self._cut()  # a forced cancel came first: stopped at the body's first await
            return await self.spec.fn(*self.args, **self.kwargs)
        finally:
            self.finishing_here = False
            if self.grace_timer is not None:
                self.grace_timer.cancel()
            cancel.hold_task_scope(-1)

    async def _finish_shielded(self) -> Any:
        """:meth:`_finish_here` when the cancel came between the start and the body (the
        task's scope is cancelled already): the body runs shielded, for at most grace."""
        with anyio.move_on_after(self.spec.policy.grace, shield=True) as scope:
            with self.run.cancel.shielding(scope):  # a forced cancel still cuts it
                return await self.spec.fn(*self.args, **self.kwargs)
        raise NATIVE_CANCEL("the grace of a finish step ran out, or the cancel was forced")

    def _cut(self) -> None:
        """Stop a finish body running in the caller's task: cancel that task (taken back later)."""
        if self.caller is not None and self.finishing_here:
            self._cancel_caller(self._cut)

    def _cancel_caller(self, again: Callable[[], None]) -> None:
        """Cancel the caller's task with ``Task.cancel()`` (:meth:`_take_back_cancels` takes it
        back once the step has settled); from the running task itself, ``again`` from the loop.

        A task's cancel of itself lands only at its next await, and until it has landed
        ``uncancel()`` does not withdraw it (Python 3.11, 3.12): a body that returns without
        awaiting (a forced cancel came first, or the body asked for one) would leave it
        pending, to cancel whatever the task awaits next, or to end the task cancelled (a run's
        task so ended cancels the Runtime's task group, and the caller of ``async with``).
        Sent from the loop, a cancel lands at the await the task waits at: in the body if it is
        still there (``again`` checks that it is), nowhere else.
        """
        caller = self.caller
        assert caller is not None
        if caller is asyncio.current_task():
            asyncio.get_running_loop().call_soon(again)
            return
        self.native_cancels += 1
        caller.cancel()

    # -- how the step ends ---------------------------------------------------------------------

    async def _commit(self, value: Any) -> Any:
        index = self.index
        # An unserialisable result raises InputError: the step is settled failed.
        try:
            text = JSONText(dump_json(value, "the result of step %d (%s)", index, self.spec.name))
        except Exception as error:
            await self._failed(error)
            raise
        run = self.run  # the store's own call (not settle()): one coroutine less per step
        await run.store.settle_step(
            run.run_id,
            index,
            StepStatus.COMMITTED,
            result=text,
            fence=run.fence,
            durable=not self.spec.defer_settle,
            spend=None if self.step is None else self.step.spend_row(),
        )
        if run.trace is not None:
            end_step(run.trace, index, StepStatus.COMMITTED)
        # Hand the task the journaled form, so that a replay sees exactly the same value.
        return value if type(value) in _SAME_AFTER_JSON else load_json(text)

    async def _failed(self, error: BaseException) -> None:
        """The body raised: a rollback tool is compensated first (it may have half written);
        if that fails, what it wrote is not known: ``unknown``."""
        await _to_the_end(self._settle_failed(error))

    async def _settle_failed(self, error: BaseException) -> None:
        status = StepStatus.FAILED
        if self.policy is CancelPolicy.ROLLBACK:
            undone = await self._stopped() and await compensate(
                self.run, self.spec, self.args, self.kwargs, index=self.index
            )
            status = StepStatus.FAILED if undone else StepStatus.UNKNOWN
        self.failed_as = status
        if isinstance(error, TimeoutError):
            self.run.note_step_error(error)
        await settle(
            self.run,
            self.index,
            status,
            error=ErrorInfo.of(error),
            hooked=self.spec.hooked,
            step=self.step,
        )

    async def _tool_cancelled(self, cancel: Cancelled) -> NoReturn:
        """The body raised :class:`Cancelled`: a cooperating stop, or the tool cancelling its
        own run (with its reason) when no cancel was requested."""
        run = self.run
        if run.cancel.reason is None:
            with anyio.CancelScope(shield=True):
                await run.host.cancel(run.run_id, reason=cancel.reason)
        self._take_back_cancels()
        await self._settle_cancelled()
        raise run.cancel.deliver(cancel.reason, run.run_id)

    async def _settle_cancelled(self) -> None:
        """Settle the step by its policy after a cancel reached it (haltwise's or a host's).

        Run to its end whatever cancels the caller meanwhile: a step is never left running.
        A step interrupted at once (see :meth:`_interrupted_at_once`) is settled without
        waiting for anything, so nothing can cut that short: no task of its own is needed.
        """
        if self._interrupted_at_once():
            self._abandon()
            await settle(
                self.run, self.index, StepStatus.INTERRUPTED, durable=False, step=self.step
            )
            return
        await _to_the_end(self._settle_by_policy())

    def _interrupted_at_once(self) -> bool:
        """Whether a cancel reaching the step now settles it ``interrupted`` without waiting:
        an ``interruptible`` step, unless it polled ``cancel_requested()`` and the cancel is not
        forced (then it is given grace to stop by itself).

        Its settlement need not be durable before the run goes on (it rides with the run's
        next write, as ``durable=False`` allows): lost in a crash, the step is found
        ``running`` and a takeover settles it ``interrupted`` all the same
        (:func:`~.takeover.orphan_status`). 10,000 runs cancelled at once then pay one commit
        for their settlements and final transitions together.
        """
        if self.policy is not CancelPolicy.INTERRUPTIBLE:
            return False
        polled = self.step is not None and self.step.polled
        return not polled or self.run.cancel.forced or self.shielded

    async def _settle_by_policy(self) -> None:
        status, result = await self._cancelled_status()
        await settle(
            self.run, self.index, status, result=result, hooked=self.spec.hooked, step=self.step
        )

    async def _cancelled_status(self) -> tuple[StepStatus, JSONText | None]:
        """The status a cancel leaves (and the result, for a body that finished anyway)."""
        forced = self.run.cancel.forced or self.shielded
        if self.policy is CancelPolicy.FINISH:
            return await self._finish_within_grace(forced, StepStatus.UNKNOWN)
        if self.policy is CancelPolicy.INTERRUPTIBLE:
            if not self._interrupted_at_once():
                return await self._finish_within_grace(forced, StepStatus.INTERRUPTED)
            self._abandon()
            return StepStatus.INTERRUPTED, None
        if forced or not await self._stopped():
            self._abandon()
            return StepStatus.UNKNOWN, None
        compensated = await compensate(
            self.run, self.spec, self.args, self.kwargs, index=self.index
        )
        return (StepStatus.COMPENSATED if compensated else StepStatus.UNKNOWN), None

    async def _finish_within_grace(
        self, forced: bool, otherwise: StepStatus
    ) -> tuple[StepStatus, JSONText | None]:
        """Let a body that runs apart end within grace; committed if it returned a result.

        An ``interruptible`` plain tool that polled ``cancel_requested()`` is waited for the
        same way, and is ``interrupted`` if it raised :class:`Cancelled` or ran out of time.
        """
        inner = self.inner
        if inner is None:
            return otherwise, None  # an async body in the caller's task: it has stopped
        if not forced:
            with anyio.move_on_after(self.spec.policy.grace, shield=True) as scope:
                with self.run.cancel.shielding(scope):
                    await _wait_done(inner)  # a forced cancel cancels the scope
        if not inner.done() or inner.cancelled() or inner.exception() is not None:
            self._abandon()
            return otherwise, None
        try:
            text = dump_json(inner.result(), f"the result of step {self.index} ({self.spec.name})")
        except Exception:
            return otherwise, None
        return StepStatus.COMMITTED, JSONText(text)

    async def _stopped(self) -> bool:
        """Wait (shielded, within grace) until a plain tool's thread has ended."""
        if self.thread is None:
            return True
        with anyio.move_on_after(self.spec.policy.grace, shield=True):
            await _wait_done(self.thread.finished)
            return True
        return False

    def _abandon(self) -> None:
        """Stop a body that runs apart: cancel its task, or drop its thread's late result."""
        if self.inner is not None and not self.inner.done():
            self.inner.cancel()

    def _take_back_cancels(self) -> None:
        """Undo the cancels :meth:`on_cancel` sent the caller's task (they were for the body)."""
        caller = self.caller
        while self.native_cancels and caller is not None:
            self.native_cancels -= 1
            caller.uncancel()

    def _delivers_cancelled(self) -> bool:
        """Whether a cancellation reaching the step now is raised into the task as
        :class:`Cancelled` (see :meth:`_propagate`); once True, it stays True."""
        return self.run.cancel.reason is not None and not self.shielded and self.in_body_task

    def _propagate(self, cancel: BaseException | None) -> NoReturn:
        """Raise what the caller sees after a cancel settled the step.

        In the task function's own task, a cancel haltwise requested is delivered as
        :class:`Cancelled` (``cancel`` may then be None: it is not raised). Anything else
        propagates as a cancellation, as it came: a host's cancel, a shield's time running
        out, and a haltwise cancel reaching a step in another task (a ``gather`` or task group
        of the task's, which then stop as cancelled, and the task function sees the cancel at
        its await on them).
        """
        run = self.run
        self._take_back_cancels()
        if self._delivers_cancelled():
            raise run.cancel.deliver("user", run.run_id) from None
        if run.cancel.reason is None:
            run.cancel.mark_host()
        assert cancel is not None, "dropped only when it is delivered as Cancelled"
        raise cancel


async def _to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end in a task of its own, whatever cancels the caller meanwhile.

    For the settling of a step after a cancel reached it: neither a second host cancel nor
    anyio's repeated delivery of a task scope's cancel may leave the step half settled. What
    ``work`` raises is raised here.
    """
    task = asyncio.ensure_future(work)
    while not task.done():
        try:
            with anyio.CancelScope(shield=True):
                await _wait_done(task)
        except NATIVE_CANCEL:
            continue  # the caller will see the cancel it was already given
    task.result()


def anyio_task_states() -> Mapping[asyncio.Task[Any], Any] | None:
    """anyio's record of each task's cancel scopes (a private module of anyio's asyncio
    backend), or None if a later anyio moved it: a finish body then runs in a task of its own."""
    try:
        from anyio._backends._asyncio import _task_states
    except ImportError:
        return None
    return _task_states


ANYIO_TASK_STATES = anyio_task_states()


def _no_scope_between(run: RunContext) -> bool:
    """Whether the task function awaits this call directly in the run's own cancel scope, with
    no cancel scope of its own in between (a ``move_on_after``, a ``shield``) that could cut a
    finish body running in its task. Reads anyio's record of the task's scopes (the seam knows
    the backend); anything unexpected answers False, the safe way (a task of its own).
    """
    body = run.body_task
    if body is None or ANYIO_TASK_STATES is None:
        return False
    state = ANYIO_TASK_STATES.get(body)
    return state is not None and state.cancel_scope is run.cancel.task_scope


async def _wait_done(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done; a cancel of the waiter leaves ``future`` running."""
    if future.done():
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        future.remove_done_callback(wake)


async def hold_lease(run: RunContext) -> None:
    """Return once the run is surely still this process's; else raise
    :class:`~haltwise.LostOwnershipError` (the run stops here, its step left to its new owner):
    no step body or compensation begins after the run's lease may have run out here.

    This process may have stalled past its lease (a stop, a long pause) since it last renewed
    it: another may have taken the run over and rerun the step, or undone it. Each
    ``confirm_held`` is a fenced write that renews the lease; one whose answer came back after
    the lease it renewed had run out (a stall while it was in flight) is no proof, and is made
    again. The caller's own comparison (``time.monotonic() >= run.held_until``) may spare the
    call on the way of every step.
    """
    while time.monotonic() >= run.held_until:
        await run.host.confirm_held(run)


async def compensate(
    run: RunContext,
    tool: ToolSpec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    index: int | None = None,
) -> bool:
    """Run the tool's compensation, shielded, within its grace; True if it completed.

    ``index`` is the step it undoes (its span is linked from the compensation's: see .spans).

    A forced cancel still cuts it short (it is registered like a shield), and then it counts as
    not completed: the step becomes ``unknown``. It begins only while the run's lease surely
    holds (:func:`hold_lease`: else :class:`~haltwise.LostOwnershipError`, nothing undone here).
    """
    undo = tool.policy.compensate
    if undo is None or run.cancel.forced:
        return False
    with (
        anyio.move_on_after(tool.policy.grace, shield=True) as scope,
        run.cancel.shielding(scope),
        compensation_span(run.trace, run.run_id, tool.name, index),
    ):
        await hold_lease(run)  # an undo is a side effect too: never done by a lost owner
        try:
            if inspect.iscoroutinefunction(undo):
                await undo(*args, **kwargs)
            else:
                await start_thread(undo, args, kwargs).result
            return True
        except Exception:
            return False
    return False
