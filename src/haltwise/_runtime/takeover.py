"""Settling what a run's previous attempt left behind: orphaned steps, sagas, the final state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._core.exceptions import ResumeRefusedError
from .._core.outcome import StepRecord, blocks_resume, saga_steps
from .._core.policy import CancelPolicy, effective_cancel
from .._core.records import RunSnapshot
from .._core.states import StepStatus
from .reconcile import hook_of
from .run_context import RunContext
from .spec import TOOLS
from .steps import compensate, settle


def step_policy(step: StepRecord) -> CancelPolicy:
    """The behaviour a journaled step was started under (undeclared behaves as ``finish``)."""
    return effective_cancel(step.cancel)


def orphan_status(step: StepRecord) -> StepStatus | None:
    """What a step left ``running`` by a dead owner becomes, or None for "compensate first"."""
    policy = step_policy(step)
    if policy is CancelPolicy.INTERRUPTIBLE:
        return StepStatus.INTERRUPTED
    if policy is CancelPolicy.ROLLBACK:
        return None
    return StepStatus.UNKNOWN


async def compensate_journaled(run: RunContext, step: StepRecord) -> StepStatus:
    """Run the compensation of a journaled rollback step with its journaled arguments."""
    call: Any = step.args
    if not isinstance(call, dict):
        return StepStatus.UNKNOWN
    tool = TOOLS.find(step.tool, call.get("tool"))
    if tool is None:
        return StepStatus.UNKNOWN
    args, kwargs = tuple(call.get("args", ())), dict(call.get("kwargs", {}))
    done = await compensate(run, tool, args, kwargs, index=step.index)
    return StepStatus.COMPENSATED if done else StepStatus.UNKNOWN


async def settle_orphans(run: RunContext, steps: Sequence[StepRecord]) -> None:
    """Settle every step a dead owner left ``running``, by its policy (CONTRACT.md)."""
    for step in steps:
        if step.status is not StepStatus.RUNNING:
            continue
        status = orphan_status(step)
        if status is None:
            status = await compensate_journaled(run, step)
        await settle(run, step.index, status, hooked=hook_of(step) is not None)


async def run_saga(run: RunContext, steps: Sequence[StepRecord]) -> None:
    """``on_cancel="compensate"``: undo committed rollback steps, newest first."""
    for step in saga_steps(steps):
        await settle(run, step.index, await compensate_journaled(run, step))


def refuse_unknown(snapshot: RunSnapshot, done: Mapping[int, Any], again: frozenset[int]) -> None:
    """Raise :class:`ResumeRefusedError` while an ``unknown`` step of a non-idempotent tool is
    neither assumed done nor to be rerun (CONTRACT.md, "Tool policies")."""
    resolved = {*done, *again}
    blocked = [(step.index, step.tool) for step in snapshot.steps if blocks_resume(step, resolved)]
    if blocked:
        raise ResumeRefusedError(snapshot.run.id, blocked)
