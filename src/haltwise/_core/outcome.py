"""Outcomes, step records and the retry-advice rule (CONTRACT.md, "Outcome and retry advice")."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, final

from .budget import Budget, Spent, budget_json
from .policy import CancelPolicy, Effect, effective_cancel
from .reconcile import Reconciled
from .states import State, StepStatus


class Retry(StrEnum):
    """What the caller should do next with a run that did not complete."""

    #: the run completed; nothing to retry
    NONE = "none"
    #: a step is ``unknown``, its tool is not idempotent and has no ``reconcile`` hook left to
    #: ask: someone must check the world first
    RECONCILE = "reconcile"
    #: a committed step wrote or reached outside (restarting from scratch would repeat it), or
    #: every ``unknown`` step that blocks a resume has a ``reconcile`` hook not yet asked
    RESUME = "resume"
    #: nothing would be repeated: starting over is safe (so is resuming)
    RESTART = "restart"


@final
@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An exception as the journal keeps it: its type name and its text."""

    type: str
    message: str

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        return cls(type=type(error).__name__, message=str(error))

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message}


@final
@dataclass(frozen=True, slots=True)
class AttemptError:
    """How one earlier attempt of a step failed: its attempt number (1 for the first)."""

    attempt: int
    error: ErrorInfo

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, **self.error.to_json()}


@final
@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step (one tool call) as journaled.

    ``cancel`` is ``None`` for a tool with no declared policy. ``attempts`` counts how many times
    the tool body was started for this step, over every attempt and resume of the run.
    ``idempotency_key`` is the same for this step in every attempt.
    """

    index: int
    tool: str
    cancel: str | None
    effect: Effect
    idempotent: bool
    status: StepStatus
    attempts: int
    result: Any = None
    error: ErrorInfo | None = None
    idempotency_key: str = ""
    #: the call's arguments ``{"args": [...], "kwargs": {...}}``, journaled for rollback tools
    args: Any = None
    #: made after a cancel was delivered (cleanup inside ``haltwise.shield``): part of that
    #: cancellation, so a resume does not replay it and numbers its own steps around it
    cleanup: bool = False
    #: the tool-call id it was made under (``haltwise.call_id``): a replay matches it by this
    call_id: str | None = None
    #: a fingerprint of its arguments: a replay with other arguments is non-deterministic
    fingerprint: str | None = None
    #: how the earlier attempts that failed did (a retry's, or before a resume), oldest first;
    #: ``error`` is the latest attempt's
    earlier_errors: tuple[AttemptError, ...] = ()
    #: an ``unknown`` step whose tool has a ``reconcile`` hook not asked yet (resume asks it)
    hook_pending: bool = False
    #: the latest answer about what happened, by the tool's hook or an operator
    reconciled: Reconciled | None = None
    #: what the step spent (journaled by its settlement; None: nothing): US dollars, model
    #: tokens, and the tool calls it counts when its settlement says (else its attempts: see
    #: ``budget.step_calls``)
    usd: float | None = None
    tokens: int | None = None
    calls: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "index": self.index,
            "tool": self.tool,
            "cancel": self.cancel,
            "effect": self.effect.value,
            "idempotent": self.idempotent,
            "status": self.status.value,
            "attempts": self.attempts,
        }
        if self.status in _CARRIES_ERROR and self.error is not None:
            data["error"] = self.error.to_json()  # CONTRACT.md: a failed step carries its own
        if self.earlier_errors:
            data["earlier_errors"] = [item.to_json() for item in self.earlier_errors]
        if self.reconciled is not None:
            data["reconciled"] = self.reconciled.to_json()
        if self.hook_pending or (self.reconciled is not None and self.reconciled.by == "hook"):
            data["reconcile_hook"] = True  # its tool has one (the dashboard offers to ask it)
        return data


#: the statuses whose step shows its error (a refused step: the refusal the task saw)
_CARRIES_ERROR = frozenset({StepStatus.FAILED, StepStatus.REFUSED})


def retry_advice(state: State, steps: Sequence[StepRecord]) -> Retry:
    """The contract's retry rule over a run's steps (see :func:`advice`)."""
    return advice(
        state,
        unknown_unsafe=any(blocks_resume(s) and not s.hook_pending for s in steps),
        repeats_harm=any(would_repeat(s) for s in steps),
        awaits_hook=any(awaits_hook(s) for s in steps),
    )


def ended_by(state: State, error: ErrorInfo | None, steps: Sequence[StepRecord]) -> int | None:
    """The index of the ``failed`` step whose error ended the run, or None.

    ``error`` is what the task function raised: a ``failed`` run's error, or a ``cancelled``
    run's ``cancel_error``. That step is the latest ``failed`` one whose error is the same (type
    and text); on resume it runs again, while every other ``failed`` step replays its error
    (the task saw it and went past it: CONTRACT.md, "Resume and determinism").
    """
    if error is None or state not in (State.FAILED, State.CANCELLED):
        return None
    for step in sorted(steps, key=lambda step: step.index, reverse=True):
        if step.status is StepStatus.FAILED and step.error == error:
            return step.index
    return None


def blocks_resume(step: StepRecord, resolved: Container[int] = ()) -> bool:
    """An ``unknown`` step of a non-idempotent tool that the caller did not resolve (``resolved``:
    the indexes assumed done or to be run again): a resume is refused while one is, and the
    advice is ``reconcile`` (CONTRACT.md, "Tool policies")."""
    return step.status is StepStatus.UNKNOWN and not step.idempotent and step.index not in resolved


def awaits_hook(step: StepRecord) -> bool:
    """A step that blocks a resume (:func:`blocks_resume`) whose tool has a ``reconcile`` hook
    not asked yet: resume asks it before it refuses. A hook that answered ``None`` or raised
    counts as no hook (CONTRACT.md, "Tool policies")."""
    return step.hook_pending and blocks_resume(step)


def would_repeat(step: StepRecord) -> bool:
    """A restart from scratch would do this step's effect again."""
    done = step.status is StepStatus.COMMITTED or (
        step.status is StepStatus.UNKNOWN and step.idempotent
    )
    return done and step.effect.repeats_harm


def saga_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps an ``on_cancel="compensate"`` saga undoes, in the order it undoes them: the
    committed ``rollback`` steps, newest first (CONTRACT.md, "Tool policies")."""
    undone = [
        step
        for step in steps
        if step.status is StepStatus.COMMITTED
        and effective_cancel(step.cancel) is CancelPolicy.ROLLBACK
    ]
    return sorted(undone, key=lambda step: step.index, reverse=True)


def advice(
    state: State, *, unknown_unsafe: bool, repeats_harm: bool, awaits_hook: bool = False
) -> Retry:
    """The contract's retry rule: the first of none, reconcile, resume, restart that applies.

    ``unknown_unsafe``: a step is ``unknown``, its tool is not idempotent and it has no
    ``reconcile`` hook left to ask; ``repeats_harm``: a ``committed`` step, or an ``unknown``
    step of an idempotent tool, has effect ``write`` or ``external``; ``awaits_hook``: an
    ``unknown`` step of a non-idempotent tool has a hook not asked yet (with no step
    ``unknown_unsafe``, every such step has one: resume asks them first). (A listing computes
    the three in SQL, from the same definitions.)
    """
    if state is State.COMPLETED:
        return Retry.NONE
    if state is State.PAUSED:
        return Retry.RESUME
    if unknown_unsafe:
        return Retry.RECONCILE
    if repeats_harm or awaits_hook:
        return Retry.RESUME
    return Retry.RESTART


@final
@dataclass(frozen=True, slots=True)
class Outcome:
    """The state of a run with everything a caller needs to decide what to do next.

    ``result`` is set only for ``completed`` runs and ``error`` only for ``failed`` ones.
    ``cancel_error`` is what the task raised while it was being cancelled, if anything.
    ``reason`` says why it stopped early (``"user"``, ``"deadline"``, ``"shutdown"``,
    ``"parent"`` or the caller's text), ``None`` if nobody asked it to stop.
    """

    id: str
    task: str
    state: State
    reason: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    cancel_error: ErrorInfo | None = None
    partials: tuple[Any, ...] = ()
    steps: tuple[StepRecord, ...] = field(default=())
    #: the run's budget (None: none; its spend is counted all the same: the sum of its steps'
    #: journaled spend, a child step's being its child run's, in ``to_json``'s ``"budget"``)
    budget: Budget | None = None

    @property
    def retry(self) -> Retry:
        """Retry advice, derived from the state and the steps (never stored separately)."""
        return retry_advice(self.state, self.steps)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object of the command line."""
        data: dict[str, Any] = {
            "id": self.id,
            "task": self.task,
            "state": self.state.value,
            "reason": self.reason,
            "retry": self.retry.value,
            "result": self.result,
            "error": self.error.to_json() if self.error else None,
            "partials": list(self.partials),
            "steps": [step.to_json() for step in self.steps],
            "budget": budget_json(self.budget, Spent.of(self.steps)),
        }
        if self.cancel_error is not None:
            data["cancel_error"] = self.cancel_error.to_json()
        return data
