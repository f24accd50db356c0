"""Asking a tool's ``reconcile`` hook what happened to an ``unknown`` step (CONTRACT.md, "Tool
policies"), and journaling the answer with the step.

Resume, a worker's takeover, ``haltwise reconcile`` and ``POST /api/runs/{id}/reconcile`` ask
before they refuse (:func:`ask_hooks`); an operator's ``--assume-done`` / ``--rerun`` answers are
journaled the same way (:func:`record_operator_answers`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Container, Mapping
from typing import Any

import anyio

from .._core.outcome import StepRecord
from .._core.reconcile import Answer, By, Happened, NotHappened, Reconciled
from .._core.records import RunSnapshot, dump_json
from .._core.states import StepStatus
from .run_context import CURRENT_STEP, RunContext, StepContext
from .spec import TOOLS, ToolSpec
from .threads import start_thread

__all__ = ["ask_hooks", "hook_of", "record_operator_answers"]

#: the step status each answer leaves
_STATUS = {
    Answer.HAPPENED: StepStatus.COMMITTED,
    Answer.NOT_HAPPENED: StepStatus.INTERRUPTED,
    Answer.UNKNOWN: StepStatus.UNKNOWN,
}


def hook_of(step: StepRecord) -> ToolSpec | None:
    """The tool (loaded in this process) whose ``reconcile`` hook can answer for ``step``, or
    None: no such tool here, it has no hook, or its call's arguments were not journaled."""
    call = step.args if isinstance(step.args, dict) else None
    tool = TOOLS.find(step.tool, call.get("tool") if call else None)
    if tool is None or not tool.hooked or call is None:
        return None
    return tool


async def ask_hooks(run: RunContext, snapshot: RunSnapshot, skip: Container[int]) -> RunSnapshot:
    """Ask the hook of every ``unknown`` step (not in ``skip``: the steps the caller answered
    for) whose tool has one, and journal each answer; the run's journal afterwards
    (``snapshot`` itself when no hook was asked). An idempotent tool's step is asked too: a
    ``Happened`` spares the call that a resume would otherwise make again with its key.

    ``Happened(result)`` makes the step ``committed`` with that result, ``NotHappened()``
    ``interrupted``; ``None``, an exception, a result that is not JSON, or a hook still running
    after the tool's grace leaves it ``unknown`` (answer ``"unknown"``). An answer is written
    only while the step is still ``unknown`` and the run final or held by ``run``'s fence
    (:meth:`Store.reconcile_step`): two processes asking at once record one answer.
    """
    asked = False
    for step in snapshot.steps:
        asking = step.status is StepStatus.UNKNOWN and step.index not in skip
        tool = hook_of(step) if asking else None
        if tool is None:
            continue
        answer, result = await _ask(run, tool, step)
        reconciled = Reconciled(By.HOOK.value, answer.value, time.time())
        await run.store.reconcile_step(
            run.run_id,
            step.index,
            _STATUS[answer],
            result=result,
            reconciled=reconciled.to_text(),
            fence=run.fence,
        )
        asked = True
    return await run.store.load(run.run_id) if asked else snapshot


async def _ask(run: RunContext, tool: ToolSpec, step: StepRecord) -> tuple[Answer, Any]:
    hook = tool.policy.reconcile
    assert hook is not None  # hook_of
    call: dict[str, Any] = step.args
    args, kwargs = tuple(call.get("args", ())), dict(call.get("kwargs", {}))
    token = CURRENT_STEP.set(StepContext(run, step.index, step.idempotency_key))
    try:
        with anyio.move_on_after(tool.policy.grace):
            if inspect.iscoroutinefunction(hook):
                said = await hook(*args, **kwargs)
            else:
                said = await start_thread(hook, args, kwargs).result
            if isinstance(said, Happened):
                dump_json(said.result, f"the result reconcile gave for step {step.index}")
                return Answer.HAPPENED, said.result
            if isinstance(said, NotHappened):
                return Answer.NOT_HAPPENED, None
    except Exception:
        pass  # a hook that raised could not tell
    finally:
        CURRENT_STEP.reset(token)
    return Answer.UNKNOWN, None


async def record_operator_answers(
    run: RunContext, snapshot: RunSnapshot, done: Mapping[int, Any], again: Container[int]
) -> None:
    """Journal the caller's word on steps (``assume_done``: it happened, with that result;
    ``rerun``: it did not): an ``unknown`` step becomes ``committed`` or ``interrupted`` with
    ``"reconciled": {"by": "operator", ...}``; a step in another status assumed done is
    settled ``committed`` as before (a rerun one simply runs again)."""
    now = time.time()
    for step in snapshot.steps:
        if step.index in done:
            answer, result = Answer.HAPPENED, done[step.index]
        elif step.index in again:
            answer, result = Answer.NOT_HAPPENED, None
        else:
            continue
        written = step.status is StepStatus.UNKNOWN and await run.store.reconcile_step(
            run.run_id,
            step.index,
            _STATUS[answer],
            result=result,
            reconciled=Reconciled(By.OPERATOR.value, answer.value, now).to_text(),
            fence=run.fence,
        )
        if not written and answer is Answer.HAPPENED:
            await run.store.settle_step(
                run.run_id, step.index, StepStatus.COMMITTED, result=result, fence=run.fence
            )
