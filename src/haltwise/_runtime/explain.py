"""Words and facts for the faces: the retry advice as a sentence, what a cancelling run waits for.

Pure functions of journaled records (and, for a tool's grace, of the tools loaded in this
process), shared by the command line and the HTTP server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._core.outcome import Outcome, Retry, StepRecord, blocks_resume, would_repeat
from .._core.policy import CancelPolicy, effective_cancel
from .._core.records import Event
from .._core.states import State, StepStatus
from .._core.views import StepTimes, StepWait

__all__ = ["cancel_requested_at", "retry_words", "waiting_for"]


def retry_words(outcome: Outcome) -> str:
    """The outcome's retry advice as a sentence a person can act on.

    ``restart``: "safe to restart from scratch ..."; ``resume``: names the tools a restart would
    repeat; ``reconcile``: names each ``unknown`` step and the resume options that settle it.
    """
    match outcome.retry:
        case Retry.NONE:
            return "none: the run completed"
        case Retry.RESTART:
            return "safe to restart from scratch (resuming is safe too)"
        case Retry.RESUME:
            repeated = _unique(step.tool for step in outcome.steps if would_repeat(step))
            return f"resume: restarting would repeat {', '.join(repeated)}"
        case Retry.RECONCILE:
            blocked = [s for s in outcome.steps if blocks_resume(s)]
            return "; ".join(
                f"reconcile step {s.index} ({s.tool}) first: check whether it happened, then "
                f"resume with --assume-done {s.index} or --rerun {s.index}"
                for s in blocked
            )


def cancel_requested_at(events: Sequence[Event]) -> float | None:
    """When the run last entered ``cancelling`` (epoch seconds), if it did."""
    for event in reversed(events):
        if event.target is State.CANCELLING:
            return event.at
    return None


def waiting_for(
    steps: Sequence[StepRecord],
    times: dict[int, StepTimes],
    *,
    requested_at: float | None,
    forced: bool,
    now: float,
) -> tuple[StepWait, ...]:
    """The in-flight steps of a ``cancelling`` run, each with its policy and the grace left.

    A step's grace runs from the later of the cancel request and the step's start (the grace
    left is ``None`` without those times). The grace is known only for tools loaded in this
    process; a forced cancel leaves no grace at all.
    """
    from .tool import TOOLS  # here, not at load: a read-only command needs no tool machinery

    waits = []
    for step in steps:
        if step.status is not StepStatus.RUNNING:
            continue
        policy = effective_cancel(step.cancel)
        tool = TOOLS.find(step.tool)
        grace = tool.policy.grace if tool is not None else None
        left = None
        counting = grace is not None and not forced and policy is not CancelPolicy.INTERRUPTIBLE
        if counting and grace is not None and step.index in times and requested_at is not None:
            since = max(requested_at, times[step.index].started_at)
            left = max(0.0, grace - (now - since))
        waits.append(
            StepWait(
                index=step.index,
                tool=step.tool,
                policy=step.cancel or "undeclared (finish)",
                grace=grace,
                grace_left=left,
            )
        )
    return tuple(waits)


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
