"""The in-memory state of one run being worked: its journal, cancel request and active step."""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .._core.exceptions import Cancelled, NonDeterminismError
from .._core.outcome import StepRecord
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
    journaled_partials: int
    assume_done: dict[int, Any] = field(default_factory=dict)
    rerun: frozenset[int] = frozenset()
    #: for haltwise.testing: awaited at each cancel point, ("before" | "during" | "after", step)
    probe: Probe | None = None

    next_step: int = 0
    #: monotonic time of the next schedule point between steps (see _steps.call_tool)
    next_yield: float = 0.0
    #: step indexes an earlier attempt used for cleanup after its cancel: this attempt skips them
    cleanup_indexes: frozenset[int] = frozenset()
    next_partial: int = 0
    cancel_reason: str | None = None
    forced: bool = False
    #: True once Cancelled was raised into the task: the run then ends cancelled, whatever it does
    delivered: bool = False
    #: a worker is handing the run over: stop like a cancel, but record no cancel
    handing_over: bool = False
    poison: NonDeterminismError | None = None
    active_step: StepCancelHook | None = None
    shield_depth: int = 0
    shield_scopes: list[anyio.CancelScope] = field(default_factory=list)
    task_scope: anyio.CancelScope | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    pause: PauseGate = field(default_factory=PauseGate)

    @property
    def cancel_pending(self) -> bool:
        """A cancel was requested and no :func:`haltwise.shield` holds it off right now."""
        return self.cancel_reason is not None and self.shield_depth == 0

    def request_cancel(self, reason: str, *, force: bool) -> None:
        """Act on a cancel request already recorded in the store (in-process delivery).

        A cancel overrides a pause: a checkpoint waiting in a pause goes on, and raises.
        """
        self.pause.lift()
        first = self.cancel_reason is None
        if first:
            self.cancel_reason = reason
        if force and not self.forced:
            self.forced = True
            for scope in self.shield_scopes:
                scope.cancel()
            if self.task_scope is not None:
                self.task_scope.cancel()
            return
        if first and self.active_step is not None and self.shield_depth == 0:
            self.active_step.on_cancel()

    def raise_if_cancelled(self) -> None:
        """The checkpoint: raise the poison or :class:`Cancelled` if one is due."""
        if self.poison is not None:
            raise self.poison
        if self.cancel_pending:
            self.delivered = True
            raise Cancelled(self.cancel_reason or "user", task_id=self.run_id)

    def peek_step(self) -> int:
        """The index :meth:`allocate_step` will return next."""
        index = self.next_step
        while index in self.cleanup_indexes:
            index += 1
        return index

    def allocate_step(self) -> int:
        """The next step index in call order, skipping earlier attempts' cleanup steps."""
        index = self.peek_step()
        self.next_step = index + 1
        return index

    def new_key(self, index: int) -> str:
        # A random part keeps keys distinct across stores that reuse the same run id.
        return f"{self.run_id}:{index}:{_KEYS.getrandbits(64):016x}"


@dataclass(eq=False, slots=True)
class StepCancelHook:
    """How the step in flight reacts to a (non-forced) cancel; set by the step executor."""

    on_cancel: Callable[[], None]


@dataclass(eq=False, slots=True)
class StepContext:
    """What a tool body can ask about the step it runs as."""

    run: RunContext
    index: int
    idempotency_key: str
    #: set when the tool polled cancel_requested(): it cooperates, so it is waited for
    polled: bool = False


CURRENT_RUN: ContextVar[RunContext | None] = ContextVar("haltwise_run", default=None)
CURRENT_STEP: ContextVar[StepContext | None] = ContextVar("haltwise_step", default=None)


def current_run() -> RunContext | None:
    """The run of the calling task, or None outside a task."""
    return CURRENT_RUN.get()
