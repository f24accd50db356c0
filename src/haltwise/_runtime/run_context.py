"""The in-memory state of one run being worked: its journal, cancel request and steps in flight."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._core.exceptions import Cancelled, InputError, NonDeterminismError
from .._core.outcome import StepRecord
from .._core.records import PartialKey, RunSnapshot
from .pause import PauseGate

if TYPE_CHECKING:
    from .._journal.store import Store
    from .runtime import Runtime
    from .tool import Task


Probe = Callable[[str, int], Awaitable[None]]

#: Idempotency keys need to be unique, not secret: one generator seeded from the OS is enough
#: (os.urandom per key costs a system call each time).
_KEYS = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _KEYS.seed(os.urandom(16)))


class Flight(Protocol):
    """A step in flight, as the run sees it: told about cancels, settled by itself."""

    index: int

    def on_cancel(self) -> None:
        """A cancel (forced or not: see the run's ``forced``) was requested for the run."""


@dataclass(eq=False)
class Numbering:
    """Which journaled step a call that begins now is (CONTRACT.md, "Step identity").

    A call made under a call id is the journaled step with that id, whatever order it begins
    in; every other call is the next journaled step that has no call id, in index order. A call
    beyond the journal gets the next index after every journaled one (cleanup steps included,
    which are never replayed).
    """

    in_order: list[int] = field(default_factory=list)
    by_call_id: dict[str, int] = field(default_factory=dict)
    next_new: int = 0
    position: int = 0

    @classmethod
    def of(cls, steps: tuple[StepRecord, ...]) -> Numbering:
        numbering = cls(next_new=max((step.index for step in steps), default=-1) + 1)
        for step in steps:
            if step.cleanup:
                continue
            if step.call_id is None:
                numbering.in_order.append(step.index)
            else:
                numbering.by_call_id[step.call_id] = step.index
        return numbering

    def take(self, call_id: str | None) -> int:
        """The index of the call that begins now (never the same twice in one attempt)."""
        if call_id is None and self.position >= len(self.in_order):
            self.next_new += 1  # beyond the journal: the common case first
            return self.next_new - 1
        index = self.peek(call_id)
        if call_id is not None and call_id in self.by_call_id:
            del self.by_call_id[call_id]
        elif call_id is None and self.position < len(self.in_order):
            self.position += 1
        else:
            self.next_new += 1
        return index

    def peek(self, call_id: str | None) -> int:
        """The index :meth:`take` would return now, without taking it."""
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

    The cancel request lives here as plain attributes, set from the event-loop thread and read by
    worker threads (``cancel_requested()``): a stale read there only delays a cooperative stop.
    """

    run_id: str
    task: Task[..., Any]
    runtime: Runtime
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

    #: monotonic time of the next schedule point between steps (see steps.call_tool)
    next_yield: float = 0.0
    #: seq of the first partial result this attempt adds, and how many the task's own code
    #: emitted so far
    next_partial: int = 0
    task_emits: int = 0
    _seqs: itertools.count[int] | None = None
    cancel_reason: str | None = None
    forced: bool = False
    #: True once Cancelled was raised into the task: the run then ends cancelled, whatever it does
    delivered: bool = False
    #: a cancel that haltwise did not request (asyncio's or anyio's) reached one of its steps
    host_cancelled: bool = False
    #: a worker is handing the run over: stop like a cancel, but record no cancel
    handing_over: bool = False
    poison: NonDeterminismError | None = None
    #: every step begun and not yet settled, by index
    flights: dict[int, Flight] = field(default_factory=dict)
    _all_settled: anyio.Event | None = None
    shield_scopes: list[anyio.CancelScope] = field(default_factory=list)
    #: the cancel scope the task function runs in: a cancel request cancels it (see call_task)
    task_scope: anyio.CancelScope | None = None
    #: the asyncio task that runs the task function
    body_task: asyncio.Task[Any] | None = None
    #: finish bodies running in that task, and whether a cancel of its scope waits for them
    _holds: int = 0
    _scope_cancel_held: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    pause: PauseGate = field(default_factory=PauseGate)

    @classmethod
    def for_snapshot(cls, snapshot: RunSnapshot | None, **fields: Any) -> RunContext:
        """A context that continues ``snapshot``'s journal (a new run's without one)."""
        if snapshot is None:
            return cls(journal={}, **fields)
        steps = snapshot.steps
        return cls(
            journal={step.index: step for step in steps if not step.cleanup},
            numbering=Numbering.of(steps),
            emitted=frozenset(snapshot.partial_keys),
            next_partial=len(snapshot.partials),
            **fields,
        )

    @property
    def cancel_pending(self) -> bool:
        """A cancel was requested and no :func:`haltwise.shield` holds it off right here."""
        return self.cancel_reason is not None and not SHIELDED.get()

    def request_cancel(self, reason: str, *, force: bool) -> None:
        """Act on a cancel request already recorded in the store (in-process delivery).

        The task function's scope is cancelled (a cancel lands at its next await outside steps
        and shields) and every step in flight is told, to settle by its own policy. A cancel
        overrides a pause: a checkpoint waiting in a pause goes on, and raises.
        """
        self.pause.lift()
        first = self.cancel_reason is None
        if first:
            self.cancel_reason = reason
        newly_forced = force and not self.forced
        if newly_forced:
            self.forced = True
            for scope in self.shield_scopes:
                scope.cancel()
        if not (first or newly_forced):
            return
        if self.task_scope is not None:
            if self._holds and not self.forced:
                self._scope_cancel_held = True
            else:
                self.task_scope.cancel()
        for flight in list(self.flights.values()):
            flight.on_cancel()

    def hold_task_scope(self, delta: int) -> None:
        """A finish body began (+1) or ended (-1) in the task function's own task.

        While one runs there, a (not forced) cancel does not cancel the task's scope, which
        would cut it: the scope is cancelled once the last such body has ended.
        """
        self._holds += delta
        if not self._holds and self._scope_cancel_held:
            self._scope_cancel_held = False
            if self.task_scope is not None:
                self.task_scope.cancel()

    def raise_if_cancelled(self) -> None:
        """The checkpoint: raise the poison or :class:`Cancelled` if one is due."""
        if self.poison is not None:
            raise self.poison
        if self.cancel_pending:
            self.delivered = True
            raise Cancelled(self.cancel_reason or "user", task_id=self.run_id)

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
