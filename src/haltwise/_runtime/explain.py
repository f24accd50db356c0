"""Words and facts for the faces: the retry advice as a sentence, what a cancelling run waits for.

Pure functions of journaled records (and, for a tool's grace, of the tools loaded in this
process), shared by the command line and the HTTP server.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from .._core.budget import Budget, Spent
from .._core.outcome import (
    Outcome,
    Retry,
    StepRecord,
    awaits_hook,
    blocks_resume,
    would_repeat,
)
from .._core.policy import CancelPolicy, effective_cancel
from .._core.records import Event, RunRecord, RunSnapshot
from .._core.states import State, StepStatus
from .._core.views import StepTimes, StepWait

__all__ = [
    "cancel_requested_at",
    "journaled_file",
    "needs_code",
    "retry_words",
    "settle_words",
    "stays_cancelling",
    "waiting_for",
]


def spent_words(spent: Spent) -> str:
    """What a run spent, in a few words (a column of ``list``): ``$0.12 3,000tok 4calls``."""
    return f"${spent.usd:,.4g} {spent.tokens:,}tok {spent.tool_calls:,}calls"


def budget_words(limit: Budget | None, spent: Spent) -> str:
    """What a run spent against its limit: ``$0.36 of $0.50, 3 of 10 tool calls`` (no limit:
    what it spent, and that it has none)."""
    if limit is None:
        return (
            f"${spent.usd:,.4g}, {spent.tokens:,} tokens, {spent.tool_calls:,} tool calls "
            "(no limit)"
        )
    parts = [
        f"${spent.usd:,.4g}" + ("" if limit.usd is None else f" of ${limit.usd:,.4g}"),
        f"{spent.tokens:,}" + ("" if limit.tokens is None else f" of {limit.tokens:,}") + " tokens",
        f"{spent.tool_calls:,}"
        + ("" if limit.tool_calls is None else f" of {limit.tool_calls:,}")
        + " tool calls",
    ]
    return ", ".join(parts) + f" (on exhaust: {limit.on_exhaust})"


#: Where advice is read: ``"cli"`` (the command line: its flags) or ``"api"`` (the HTTP API's
#: ``retry_why`` and the dashboard: the resume body's fields and the Resume button).
Face = Literal["cli", "api"]


def settle_words(index: int, face: Face = "cli", *, hooked: bool = False) -> str:
    """How to settle ``unknown`` step ``index`` and resume, in ``face``'s terms: the one place
    the options are phrased, for every face.

    ``hooked``: the step's tool has a ``reconcile`` hook not yet asked, which resume asks first
    (and ``reconcile`` asks now, resuming nothing); otherwise a person says what happened."""
    if hooked:
        now = "haltwise reconcile ID" if face == "cli" else "POST /api/runs/{id}/reconcile"
        first = "resume" if face == "cli" else "the Resume button"
        return f"{first} asks its tool's reconcile hook what happened first ({now} asks it now)"
    if face == "api":
        return (
            f"resume with the Resume button (or the resume body's "
            f'"assume_done": {{"{index}": its result}} or "rerun": [{index}])'
        )
    return f"resume with --assume-done {index} or --rerun {index}"


def refused_words(task_id: str, steps: Sequence[tuple[int, str]], face: Face = "cli") -> str:
    """A resume refused because of ``unknown`` steps (``(index, tool)``) whose tools are not
    idempotent, with the options that settle each (:func:`settle_words`), in ``face``'s terms."""
    named = "; ".join(
        f"step {index} ({tool}): check whether it happened, then {settle_words(index, face)}"
        for index, tool in steps
    )
    return (
        f"run {task_id!r}: resume refused: steps of tools that are not idempotent may or may "
        f"not have happened; {named}"
    )


def retry_words(outcome: Outcome, face: Face = "cli") -> str:
    """The outcome's retry advice as a sentence a person can act on, in ``face``'s terms.

    ``restart``: "safe to restart from scratch ..."; ``resume``: names the tools a restart would
    repeat, and the steps whose ``reconcile`` hook resume asks first; ``reconcile``: names each
    ``unknown`` step and the resume options that settle it (:func:`settle_words`).
    """
    match outcome.retry:
        case Retry.NONE:
            return "none: the run completed"
        case Retry.RESTART:
            return "safe to restart from scratch (resuming is safe too)"
        case Retry.RESUME:
            asked = [s for s in outcome.steps if awaits_hook(s)]
            hooks = "; ".join(
                f"step {s.index} ({s.tool}): {settle_words(s.index, face, hooked=True)}"
                for s in asked
            )
            repeated = _unique(step.tool for step in outcome.steps if would_repeat(step))
            if not repeated:
                return f"resume: {hooks}"
            words = f"resume: restarting would repeat {', '.join(repeated)}"
            return f"{words}; {hooks}" if hooks else words
        case Retry.RECONCILE:
            blocked = [s for s in outcome.steps if blocks_resume(s)]
            return "; ".join(
                f"reconcile step {s.index} ({s.tool}) first: check whether it happened, then "
                f"{settle_words(s.index, face)}"
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
    from .spec import TOOLS  # here, not at load: a read-only command needs no tool machinery

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


def journaled_file(run: RunRecord) -> Path | None:
    """The file the journal says ``run``'s task lives in (resolved), or None for a module name."""
    source = run.inputs.get("source")
    if isinstance(source, str) and source:
        return Path(source).resolve()
    file_part = run.task.rpartition(":")[0]
    if file_part.endswith(".py") or os.sep in file_part:
        return Path(file_part).resolve()
    return None


def needs_code(snapshot: RunSnapshot) -> tuple[StepRecord, ...]:
    """The steps of a ``cancelling`` run whose settling by their policies needs the task's code:
    a rollback step in flight (its compensation) and a committed one (a saga may undo it). None
    after a forced cancel, which compensates nothing. Without that code a takeover would leave
    them ``unknown`` instead: an orphan in that case is left for a process that has the code."""
    if snapshot.run.force:
        return ()
    return tuple(
        step
        for step in snapshot.steps
        if effective_cancel(step.cancel) is CancelPolicy.ROLLBACK
        and step.status in (StepStatus.RUNNING, StepStatus.COMMITTED)
    )


def stays_cancelling(run: RunRecord, unloaded: str | None = None) -> str:
    """Why ``run``, ``cancelling`` and worked by nobody, stays so in a process that has not
    loaded its task's code, and which command finishes its cancel.

    Settling it would run compensations of its task (a rollback step in flight, or a committed
    one for the saga: see :func:`needs_code`), which only that code can do; a
    forced cancel compensates nothing, so it needs no code. ``unloaded`` is why loading the code
    failed, when it was tried.
    """
    named = journaled_file(run)
    worker = f"haltwise worker {named}" if named is not None else "a worker of its task"
    why = f" ({unloaded})" if unloaded else ""
    return (
        f"run {run.id} stays cancelling: nobody works it, and settling it runs compensations "
        f"of its task {run.task}, whose code is not loaded here{why}; {worker} finishes the "
        "cancel (a forced cancel needs no code: it compensates nothing)"
    )


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
