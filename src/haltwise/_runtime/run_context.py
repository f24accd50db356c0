"""The in-memory state of one run being worked: its journal, cancel state and steps in flight.

A run reaches the runtime that works it only through :class:`RunHost` (start a child, cancel a
run, how many runs and side steps are active), and its steps through the executor it was given
(:attr:`RunContext.execute`): this module imports neither the runtime nor the step executor.
The other modules read a run's fields and change them only through its methods (or those of
the small state objects it holds: :class:`CancelState`, :class:`PauseGate`), except
``held_until``, which the runtime moves with the run's lease (tests/runtime/test_run_context.py
checks the source for other writes).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Container, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._core.budget import Budget, Spent
from .._core.exceptions import InputError, NonDeterminismError
from .._core.outcome import ErrorInfo, Outcome, StepRecord
from .._core.policy import OnCancel
from .._core.records import PartialKey, RunSnapshot
from .._core.states import State, StepStatus
from .cancel_state import NATIVE_CANCEL, CancelState
from .pause_state import Edge, PauseGate
from .progress import Pulse
from .spans import RunTrace, begin_run, end_run, run_event

if TYPE_CHECKING:
    from .._journal.store import Store
    from .spec import ToolSpec


Probe = Callable[[str, int], Awaitable[None]]
#: What awaiting a tool inside a run does: ``steps.execute_step`` (the runtime hands it to the run)
StepExecutor = Callable[
    ["RunContext", "ToolSpec", tuple[Any, ...], dict[str, Any]], Coroutine[Any, Any, Any]
]

#: the least time between two schedule points between steps (see RunContext.between_steps)
_YIELD_INTERVAL = 0.001

#: Idempotency keys need to be unique, not secret: one generator seeded from the OS is enough
#: (os.urandom per key costs a system call each time).
_KEYS = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _KEYS.seed(os.urandom(16)))


class ChildHandle(Protocol):
    """A child run started by :meth:`RunHost.start_child`, as its parent's step waits for it."""

    async def outcome(self) -> Outcome:
        """Wait until the child run is final; return its outcome."""
        ...  # pragma: no cover - a protocol


class RunTask(Protocol):
    """What a run needs of its task, and nothing more: a :class:`~haltwise.Task` is one (this
    module does not import ``tool``, which imports it)."""

    @property
    def name(self) -> str: ...

    @property
    def on_cancel(self) -> OnCancel: ...

    @property
    def source(self) -> str | None: ...

    @property
    def fn(self) -> Callable[..., Awaitable[Any]]: ...

    def bind_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise :class:`~haltwise.InputError` if the arguments do not fit the task."""


class RunHost(Protocol):
    """What a run needs of the runtime that works it, and nothing more.

    :class:`~haltwise.Runtime` provides it (``runtime.RuntimeHost``); the step executor can be
    driven with any other (tests/runtime/test_step_executor.py drives it with a store alone).
    """

    @property
    def active_runs(self) -> int:
        """How many runs the runtime works right now (a run alone may skip schedule points)."""
        ...  # pragma: no cover - a protocol

    def count_side_steps(self, delta: int) -> None:
        """A step began (+1) or settled (-1) beside its run's own code, concurrently with it:
        the store batches the writes of concurrent writers."""

    async def cancel(self, task_id: str, *, reason: str, force: bool = False) -> object:
        """Record a cancel request for run ``task_id`` and deliver it (``Runtime.cancel``)."""

    async def confirm_held(self, run: RunContext) -> None:
        """Renew ``run``'s lease if this runtime still holds it (one fenced write) and move
        ``run.held_until`` on; raise :class:`~haltwise.LostOwnershipError` if it does not."""

    async def start_child(
        self,
        task: RunTask,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        child_id: str,
        parent: str,
    ) -> ChildHandle:
        """Start child run ``child_id`` of run ``parent``, or pick it up where it stopped."""
        ...  # pragma: no cover - a protocol

    async def pause(self, task_id: str, *, reason: str | None = None) -> object:
        """Request a pause of run ``task_id`` and deliver it (``Runtime.pause``); ``reason``
        (``"budget"``) is the run's reason while it is paused."""

    async def unpause(self, task_id: str) -> object:
        """Undo a pause of run ``task_id`` (``Runtime.unpause``)."""

    def pause_gate(self, task_id: str) -> PauseGate | None:
        """The pause gate of run ``task_id`` if the runtime works it, else None."""

    def run_of(self, task_id: str) -> RunContext | None:
        """Run ``task_id``'s context if the runtime works it, else None (a child run's, whose
        spend counts towards its parent's step)."""

    async def stopped(self, task_id: str) -> None:
        """Wait until the runtime no longer works run ``task_id`` (at once if it does not)."""


class Flight(Protocol):
    """A step in flight, as the run sees it: told about cancels, settled by itself."""

    index: int

    def on_cancel(self) -> None:
        """A cancel (forced or not: see the run's ``cancel.forced``) was requested for the run."""


@dataclass(eq=False)
class Numbering:
    """Which journaled step a call that begins now is (CONTRACT.md, "Step identity").

    A call made under a call id is the journaled step with that id, whatever order it begins
    in; every other call is the next journaled step that has no call id, in index order. A call
    beyond the journal gets the next index after every journaled one (cleanup steps included,
    which are never replayed).

    A call whose id matches no journaled step is the earliest committed step made under a call
    id with the same tool and argument fingerprint that this attempt has not replayed yet, if
    there is one: a provider gives the same call a new id when the model is asked again. (A
    ``failed`` step that replays its error counts as committed here.)
    """

    in_order: list[int] = field(default_factory=list)
    by_call_id: dict[str, int] = field(default_factory=dict)
    next_new: int = 0
    position: int = 0
    #: the committed steps made under a call id, by (tool, fingerprint): index order
    by_match: dict[tuple[str, str | None], list[int]] = field(default_factory=dict)
    #: the call id and match key of each step in :attr:`by_match`
    matched_by: dict[int, tuple[str, tuple[str, str | None]]] = field(default_factory=dict)

    @classmethod
    def of(cls, steps: tuple[StepRecord, ...], run_again: Container[int] = ()) -> Numbering:
        """The numbering of a run whose journal holds ``steps``. ``run_again``: the ``failed``
        steps that run again (the one whose error ended the run, those the caller named); every
        other failed step replays its error as a committed one its result, and is matched by its
        arguments the same way."""
        numbering = cls(next_new=max((step.index for step in steps), default=-1) + 1)
        for step in sorted(steps, key=lambda step: step.index):
            if step.cleanup:
                continue
            if step.call_id is None:
                numbering.in_order.append(step.index)
                continue
            numbering.by_call_id[step.call_id] = step.index
            if step.status is StepStatus.COMMITTED or (
                step.status is StepStatus.FAILED
                and step.error is not None
                and step.index not in run_again
            ):
                key = (step.tool, step.fingerprint)
                numbering.by_match.setdefault(key, []).append(step.index)
                numbering.matched_by[step.index] = (step.call_id, key)
        return numbering

    def take(self, call_id: str | None, tool: str | None = None, print_: str | None = None) -> int:
        """The index of the call that begins now (never the same twice in one attempt);
        ``tool`` and ``print_`` (its arguments' fingerprint) match a call under a fresh id."""
        if call_id is None and self.position >= len(self.in_order):
            self.next_new += 1  # beyond the journal: the common case first
            return self.next_new - 1
        if call_id is not None:
            index = self.by_call_id.pop(call_id, None)
            if index is None and self.by_match:
                index = self._by_arguments(tool, print_)
            if index is not None:
                self._replaying(index)
                return index
        elif self.position < len(self.in_order):
            self.position += 1
            return self.in_order[self.position - 1]
        self.next_new += 1
        return self.next_new - 1

    def _by_arguments(self, tool: str | None, print_: str | None) -> int | None:
        """The earliest unreplayed committed step of ``tool`` with fingerprint ``print_``."""
        candidates = self.by_match.get((tool or "", print_))
        return candidates[0] if candidates else None

    def _replaying(self, index: int) -> None:
        """Step ``index`` (made under a call id) is taken by this attempt: neither its id nor
        its arguments match another call now."""
        matched = self.matched_by.pop(index, None)
        if matched is None:
            return
        cid, key = matched
        self.by_call_id.pop(cid, None)
        candidates = self.by_match[key]
        candidates.remove(index)
        if not candidates:
            del self.by_match[key]

    def peek(self, call_id: str | None) -> int:
        """The index :meth:`take` would return now for a call that is not matched by its
        arguments, without taking it."""
        if call_id is not None:
            index = self.by_call_id.get(call_id)
            if index is not None:
                return index
        elif self.position < len(self.in_order):
            return self.in_order[self.position]
        return self.next_new


@dataclass(eq=False)
class RunContext:
    """Everything the runtime knows about a run it is working in this process.

    ``host`` is the runtime as the run sees it (:class:`RunHost`); ``execute`` runs a tool call
    as a step of this run; ``cancel`` is the run's cancel state (:class:`CancelState`).
    ``probe``, ``assume_done``, ``rerun`` and ``ended_by`` are given when the context is made
    and never change; the fields below them change only through the methods named at each.
    """

    run_id: str
    task: RunTask
    host: RunHost
    execute: StepExecutor
    store: Store
    fence: str
    journal: dict[int, StepRecord]
    numbering: Numbering = field(default_factory=Numbering)
    #: who emitted each journaled partial result: a replay does not emit those again
    emitted: frozenset[PartialKey] = frozenset()
    assume_done: dict[int, Any] = field(default_factory=dict)
    rerun: frozenset[int] = frozenset()
    #: for haltwise.testing: awaited at each cancel point, ("before" | "during" | "after", step)
    probe: Probe | None = None
    #: the ``failed`` step whose error ended the run (it runs again; every other failed step
    #: replays its error: see ``outcome.ended_by``)
    ended_by: int | None = None

    #: monotonic time of the next schedule point between steps (read by steps.execute_step;
    #: moved on by :meth:`between_steps`)
    next_yield: float = 0.0
    #: monotonic time until which the run's lease surely holds (measured from before the
    #: write that set it); no step body begins after it before ``host.confirm_held`` says the
    #: run is still this runtime's (see steps._Flight._execute). A run worked without a
    #: runtime has no lease to lose.
    held_until: float = math.inf
    #: seq of the first partial result this attempt adds, and how many the task's own code
    #: emitted so far (counted by :meth:`next_task_origin`)
    next_partial: int = 0
    task_emits: int = 0
    _seqs: itertools.count[int] | None = None
    cancel: CancelState = field(default_factory=CancelState)
    #: the task's code diverged from its journal (:meth:`diverge`): every later checkpoint
    #: raises this, and the run ends ``failed`` with it whatever a cancel asked
    poison: NonDeterminismError | None = None
    #: every TimeoutError a step raised to the task, replays included (a tool's TimeoutError is
    #: not a host's timeout: see ending.call_task); added to by :meth:`note_step_error`
    step_errors: list[BaseException] = field(default_factory=list)
    #: every step begun and not yet settled, by index
    flights: dict[int, Flight] = field(default_factory=dict)
    _all_settled: anyio.Event | None = None
    #: the asyncio task that runs the task function, while it runs (:meth:`enter_body`)
    body_task: asyncio.Task[Any] | None = None
    #: set once the run is no longer worked here (an :class:`~.pause_state.Edge`: ~100 bytes
    #: where an ``anyio.Event`` is ~760; 10,000 runs waiting hold one each)
    done: Edge = field(default_factory=Edge)
    pause: PauseGate = field(default_factory=PauseGate)
    #: the child steps in flight whose child run is worked here: step index -> its pause gate
    children: dict[int, PauseGate] = field(default_factory=dict)
    #: pulsed each time the run journals a partial result (see progress.Pulse)
    progress: Pulse = field(default_factory=Pulse)
    #: the run's budget (None: none) and which of its limits of spend (``"usd"``, ``"tokens"``)
    #: the spend below reached (None: none), both changed only by :meth:`set_budget` and
    #: :meth:`add_spend`; ``metered``: a budget of this run or of a parent run worked here
    #: applies (the step executor looks no further when it is False)
    budget: Budget | None = None
    over: str | None = None
    metered: bool = False
    #: what the run spent: its journal's sum when the context was made, plus what this attempt
    #: spent since (its child runs' spend included), changed only by :meth:`add_spend`
    spent_usd: float = 0.0
    spent_tokens: int = 0
    spent_calls: int = 0
    #: the step of the parent run (worked here) that waits for this child run: the child's
    #: spend counts towards it, and so towards the parent's budget (:meth:`link_parent`)
    spend_to: StepContext | None = None
    #: this attempt's spans while they are recorded (see .spans), else None
    trace: RunTrace | None = None
    #: the final state this attempt recorded, with a failure's error (see ending.final_write)
    ended: tuple[State, ErrorInfo | None] | None = None

    @classmethod
    def for_snapshot(cls, snapshot: RunSnapshot | None, **fields: Any) -> RunContext:
        """A context that continues ``snapshot``'s journal (a new run's without one)."""
        if snapshot is None:
            return cls(journal={}, **fields)
        steps = snapshot.steps
        spent = Spent.of(steps)
        run_again = {fields.get("ended_by"), *fields.get("rerun", ())}
        run = cls(
            journal={step.index: step for step in steps if not step.cleanup},
            numbering=Numbering.of(steps, run_again),
            emitted=frozenset(snapshot.partial_keys),
            next_partial=len(snapshot.partials),
            spent_usd=spent.usd,
            spent_tokens=spent.tokens,
            spent_calls=spent.tool_calls,
            **fields,
        )
        run.set_budget(Budget.from_json(snapshot.run.inputs.get("budget")))
        return run

    # -- the budget ----------------------------------------------------------------------------

    def set_budget(self, budget: Budget | None) -> None:
        """The run's budget is ``budget`` from now on (its start, an unpause that raised it)."""
        self.budget = budget
        self.over = None if budget is None else budget.reached(self.spent_usd, self.spent_tokens)
        self.metered = budget is not None or self.spend_to is not None

    def add_spend(self, usd: float, tokens: int, calls: int) -> None:
        """The run spent this (a step's model request, ``haltwise.spend``, a tool call begun,
        a child run's spend): count it, see whether a limit is reached now (:attr:`over`: the
        next step's check acts on it), and count it towards the parent run's step too."""
        self.spent_usd += usd
        self.spent_tokens += tokens
        self.spent_calls += calls
        budget = self.budget
        if budget is not None and self.over is None and (usd or tokens):
            # (only spend reaches a limit of spend: a tool call begun is checked as the next
            # one begins, see over_budget)
            self.over = budget.reached(self.spent_usd, self.spent_tokens)
        parent = self.spend_to
        if parent is not None and (usd or tokens or calls):
            parent.add_spend(usd, tokens, calls)

    def over_budget(self, call: bool = False) -> RunContext | None:
        """The run whose limit stops a step from beginning now, this one or a parent run worked
        here (the nearest): a limit of spend reached, or with ``call`` (the step is a tool
        call) no tool call left; None if none does."""
        run: RunContext | None = self
        while run is not None:
            if run.over is not None:
                return run
            budget = run.budget
            if call and budget is not None and budget.calls_spent(run.spent_calls):
                return run
            step = run.spend_to
            run = None if step is None else step.run
        return None

    def link_parent(self, step: StepContext) -> None:
        """This child run is waited for by ``step`` of its parent (worked here): its spend
        counts towards that step (and the parent's budget). What the child spent before (its
        journal's sum) replaces what the step had journaled of it."""
        if self.spend_to is step:
            return
        self.spend_to = step
        self.metered = True
        delta_usd = self.spent_usd - step.usd
        delta_tokens = self.spent_tokens - step.tokens
        delta_calls = self.spent_calls - step.calls
        step.add_spend(delta_usd, delta_tokens, delta_calls)

    @property
    def cancel_pending(self) -> bool:
        """A cancel was requested and no :func:`haltwise.shield` holds it off right here."""
        return self.cancel.reason is not None and not SHIELDED.get()

    def request_cancel(self, reason: str, *, force: bool) -> None:
        """Act on a cancel request already recorded in the store (in-process delivery).

        The task function's scope is cancelled (a cancel lands at its next await outside steps
        and shields) and every step in flight is told, to settle by its own policy (see
        :meth:`CancelState.record`). A cancel overrides a pause: a checkpoint waiting in a pause
        goes on, and raises.
        """
        self.pause.lift()
        if self.cancel.record(reason, force=force):
            if self.trace is not None:
                run_event(
                    self.trace,
                    "haltwise.cancel.requested",
                    {"haltwise.cancel.reason": reason, "haltwise.cancel.force": force},
                )
            for flight in list(self.flights.values()):
                flight.on_cancel()

    def record_end(self, state: State, error: ErrorInfo | None = None) -> None:
        """The final state this attempt is writing (with a failure's error): what its span
        says when the run stops being worked here (see :mod:`.spans`)."""
        self.ended = (state, error)

    def open_trace(self) -> None:
        """Open this attempt's run span, a child of the caller's current span (None when spans
        are not recorded)."""
        self.trace = begin_run(self.run_id, self.task.name)

    def close_trace(self) -> None:
        """End this attempt's run span (if any) with what the attempt recorded."""
        trace, self.trace = self.trace, None
        if trace is not None:
            state, error = self.ended or (None, None)
            end_run(trace, state, error, self.cancel.reason, self.journal)

    def raise_if_cancelled(self) -> None:
        """The checkpoint: raise the poison or :class:`Cancelled` if one is due."""
        if self.poison is not None:
            raise self.poison
        if self.cancel.reason is not None and self.cancel_pending:  # (no call when none is)
            raise self.cancel.deliver("user", self.run_id)

    def diverge(
        self, journaled: StepRecord, requested: str, *, what: str = "tool"
    ) -> NonDeterminismError:
        """Poison the run: its code calls ``requested`` (or, with ``what="arguments"``, the same
        tool with other arguments) where its journal holds ``journaled``. Returns the
        :class:`NonDeterminismError` for the caller to raise; from now on every checkpoint
        raises it too (:attr:`poison`)."""
        self.poison = NonDeterminismError(
            self.run_id, journaled.index, journaled.tool, requested, what=what
        )
        return self.poison

    async def between_steps(self, replayed: bool) -> None:
        """A schedule point between steps, for other runs, the watcher and in-process cancels.

        The step executor calls it once :attr:`next_yield` has passed. Needed only where a step
        may not yield by itself: a replayed step, or the SQLite store's fast path (one run
        active); otherwise it returns at once. At most one per ``_YIELD_INTERVAL``: a run that
        yields at every step spends ~5% of a trivial step on it. A cancel landing here is the
        checkpoint's (:meth:`raise_if_cancelled`).
        """
        if self.host.active_runs > 1 and not replayed:
            return
        self.next_yield = time.monotonic() + _YIELD_INTERVAL
        try:
            await anyio.lowlevel.checkpoint()
        except NATIVE_CANCEL:
            self.raise_if_cancelled()
            raise

    # -- the task function ---------------------------------------------------------------------

    def enter_body(self, body: asyncio.Task[Any] | None, scope: anyio.CancelScope) -> None:
        """The task function begins, in the asyncio task ``body``, inside ``scope``: the scope
        a cancel request cancels (:meth:`CancelState.enter_task_scope`)."""
        self.body_task = body
        self.cancel.enter_task_scope(scope)

    def leave_body(self) -> None:
        """The task function has ended (returned, raised or been cancelled)."""
        self.cancel.leave_task_scope()
        self.body_task = None

    def note_step_error(self, error: BaseException) -> None:
        """A step failed with ``error`` (a TimeoutError), which the task now sees."""
        self.step_errors.append(error)

    # -- steps in flight -----------------------------------------------------------------------

    def fly(self, flight: Flight) -> None:
        """Track a step from the moment its index is taken until it has settled."""
        self.flights[flight.index] = flight

    def land(self, index: int) -> None:
        """The step has settled (or never started): stop tracking it."""
        self.flights.pop(index, None)
        if self.pause.requested:
            self.pause.wake()  # a checkpoint waiting for the steps to end may pause the run now
        if not self.flights and self._all_settled is not None:
            self._all_settled.set()
            self._all_settled = None

    async def all_settled(self) -> None:
        """Wait until no step of the run is in flight (a run is final only then)."""
        while self.flights:
            if self._all_settled is None:
                self._all_settled = anyio.Event()
            await self._all_settled.wait()

    # -- partial results ---------------------------------------------------------------------

    def next_task_origin(self) -> PartialKey:
        """Who a partial result emitted now by the task's own code (outside any step) is: no
        step, the task's next ordinal (a replay emits the same origins in the same order)."""
        ordinal = self.task_emits
        self.task_emits = ordinal + 1
        return (None, ordinal)

    def next_partial_seq(self, origin: PartialKey) -> int | None:
        """The seq for a partial result emitted now by ``origin``, or None if the journal already
        holds it (a replay). Safe from tools' threads: each seq is handed out once."""
        if origin in self.emitted:
            return None
        if self._seqs is None:
            self._seqs = itertools.count(self.next_partial)
        return next(self._seqs)

    def new_key(self, index: int) -> str:
        # A random part keeps keys distinct across stores that reuse the same run id.
        return f"{self.run_id}:{index}:{_KEYS.getrandbits(64):016x}"


@dataclass(eq=False, slots=True)
class StepContext:
    """What a tool body can ask about the step it runs as."""

    run: RunContext
    index: int
    idempotency_key: str
    #: set when the tool polled cancel_requested(): it cooperates, so it is waited for
    polled: bool = False
    #: how many partial results the step emitted so far (its next one's ordinal)
    emits: int = 0
    #: what the step spent, over its attempts (journaled with its settlement: see
    #: :meth:`spend_row`); ``calls`` is written only for a step that is no tool call (a model
    #: request, a child step: ``counts_calls`` False), whose tool calls are not its attempts
    usd: float = 0.0
    tokens: int = 0
    calls: int = 0
    counts_calls: bool = True

    def add_spend(self, usd: float, tokens: int, calls: int) -> None:
        """The step spent this (see :func:`haltwise.spend`); its run spent it too."""
        self.usd += usd
        self.tokens += tokens
        self.calls += calls
        self.run.add_spend(usd, tokens, calls)

    def spend_row(self) -> tuple[float | None, int | None, int | None] | None:
        """What the step's settlement writes of its spend; None: nothing (a tool call that
        spent nothing but itself: its calls are its attempts)."""
        if self.counts_calls:
            if not (self.usd or self.tokens):
                return None
            return (self.usd, self.tokens, None)
        return (self.usd, self.tokens, self.calls)

    def next_origin(self) -> PartialKey:
        """Who a partial result emitted now inside this step is: this step, its next ordinal."""
        ordinal = self.emits
        self.emits = ordinal + 1
        return (self.index, ordinal)


CURRENT_RUN: ContextVar[RunContext | None] = ContextVar("haltwise_run", default=None)
CURRENT_STEP: ContextVar[StepContext | None] = ContextVar("haltwise_step", default=None)
#: the call id that steps begun here are matched by on replay (``haltwise.call_id``)
CALL_ID: ContextVar[str | None] = ContextVar("haltwise_call_id", default=None)
#: True inside ``haltwise.shield``: checkpoints do not raise, steps begin as if no cancel
SHIELDED: ContextVar[bool] = ContextVar("haltwise_shielded", default=False)


def current_run() -> RunContext | None:
    """The run of the calling task, or None outside a task."""
    return CURRENT_RUN.get()


@contextmanager
def call_id(value: str) -> Iterator[None]:
    """Match the steps begun inside this block by ``value`` on replay (CONTRACT.md, "Steps").

    A framework's tool-call id is the natural choice: on resume, the call the model made under
    that id is the journaled step with that id, whatever order the parallel calls begin in.
    Steps begun outside any ``call_id`` block are matched by their order among the run's steps
    without a call id. The id applies to the steps begun directly in the block, including in
    tasks it creates (they copy the context). Raises :class:`~haltwise.InputError` for a value
    that is not a non-empty string. Outside a task it does nothing.
    """
    if not isinstance(value, str) or not value:
        raise InputError("haltwise.call_id() needs a non-empty string")
    token = CALL_ID.set(value)
    try:
        yield
    finally:
        CALL_ID.reset(token)


def current_task_id() -> str | None:
    """The id of the run the calling code belongs to (in its task or its tools), else None."""
    run = CURRENT_RUN.get()
    return None if run is None else run.run_id
