"""Forking a run: what a new run of the same task and inputs replays, and what it runs again.

A fork from step ``N`` of run ``R`` is a new run whose journal starts with ``R``'s steps before
``N``: they replay (their results are returned, their bodies do not run), as committed steps do
on resume. From ``N`` on the task runs anew, with new idempotency keys, so every committed
``write`` or ``external`` step of ``R`` from ``N`` on will happen again: :func:`plan_fork` names
them before anything runs. The source run is not changed.

Partial results: those emitted inside the replayed steps are copied with them (a replayed step
does not emit again), numbered first, in their order; those of the task's own code are emitted
again as it replays. So a fork's list holds the same partials as its source's up to step ``N``,
but the copied ones come before the task's own where the source interleaved them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from .._core.exceptions import InputError
from .._core.outcome import StepRecord
from .._core.records import RunSnapshot
from .._core.states import StepStatus


@final
@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork of run ``source`` from step ``from_step`` will do.

    ``replayed``: the source's steps before ``from_step`` (cleanup steps of a cancel included,
    as the source's journal has them). ``repeated``: its committed steps from ``from_step`` on
    whose effect is ``write`` or ``external``: the fork runs them again.
    """

    source: str
    from_step: int
    replayed: tuple[StepRecord, ...]
    repeated: tuple[StepRecord, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "from_step": self.from_step,
            "will_repeat": [
                {"index": step.index, "tool": step.tool, "effect": step.effect.value}
                for step in self.repeated
            ],
        }


def plan_fork(snapshot: RunSnapshot, from_step: int) -> ForkPlan:
    """The plan of a fork of ``snapshot``'s run from step ``from_step``.

    Raises :class:`~haltwise.InputError` if ``from_step`` is not a step number from 0 to the
    number of steps the run has (that many: everything replays), or if a step before it is not
    committed (only a committed step has a result to replay: fork from that step instead).
    """
    run_id = snapshot.run.id
    steps = snapshot.steps
    if isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 0:
        raise InputError(f"from_step must be a step number >= 0, not {from_step!r}")
    if from_step > len(steps):
        raise InputError(
            f"run {run_id!r} has {len(steps)} steps; fork from step 0 to {len(steps)}",
            task_id=run_id,
        )
    replayed = tuple(step for step in steps if step.index < from_step)
    for step in replayed:
        if step.status is not StepStatus.COMMITTED and not step.cleanup:
            raise InputError(
                f"run {run_id!r}: step {step.index} ({step.tool}) is {step.status}, so it has "
                f"no result to replay; fork from step {step.index} or earlier",
                task_id=run_id,
            )
    repeated = tuple(
        step
        for step in steps
        if step.index >= from_step
        and step.status is StepStatus.COMMITTED
        and not step.cleanup
        and step.effect.repeats_harm
    )
    return ForkPlan(run_id, from_step, replayed, repeated)
