"""Child tasks: a task awaiting another task runs it as a child run, one step of the parent.

The child step is an ``interruptible`` step with effect ``external`` (the cautious assumption:
the child's own steps may write). Its body starts the child run ``PARENT_ID/STEP_INDEX`` (or
resumes it, on the parent's resume) and waits for it. A cancel of the parent interrupts that
wait: the child is then cancelled with reason ``"parent"`` (forced if the parent's cancel was)
and the parent's step is settled once the child's run has ended (a worker handing the parent
over hands the child over too: it is not cancelled). While it waits, the parent's
pause and unpause are relayed to the child: a paused parent's child is paused too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._core.exceptions import ChildRunError, HaltwiseError
from .._core.policy import CancelPolicy, Effect, ToolPolicy
from .._core.states import State
from .pause import pause_if_at_rest, relay_to_children
from .run_context import CURRENT_STEP

if TYPE_CHECKING:
    from .._core.outcome import Outcome
    from .run_context import ChildHandle, RunContext, RunTask

#: the policy of a child step (see the module docstring)
CHILD_POLICY = ToolPolicy(
    cancel=CancelPolicy.INTERRUPTIBLE,
    effect=Effect.EXTERNAL,
    effect_declared=True,
)


def child_body(task: RunTask) -> Callable[..., Awaitable[Any]]:
    """The body of the step that stands for ``task`` in its parent (``tool.Task`` makes it a
    tool of :data:`CHILD_POLICY`, not registered in TOOLS)."""

    async def run_child(*args: Any, **kwargs: Any) -> Any:
        return await _run_child(task, args, kwargs)

    run_child.__name__ = task.name
    return run_child


async def _run_child(task: RunTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    step = CURRENT_STEP.get()
    assert step is not None, "a child step runs inside its parent's step"
    parent = step.run
    host = parent.host
    child_id = f"{parent.run_id}/{step.index}"
    handle = await host.start_child(task, args, kwargs, child_id, parent.run_id)
    child = host.run_of(child_id)
    if child is not None:
        child.link_parent(step)  # its spend counts towards this step, and the parent's budget
    gate = host.pause_gate(child_id)
    if gate is not None:
        gate.follow(parent.pause)  # the parent looks again whenever its child's pause changes
        parent.children[step.index] = gate
        await relay_to_children(parent)  # paused meanwhile: so is the child
    try:
        outcome = await _wait_relaying_pause(parent, handle)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            if parent.cancel.handing_over:
                await host.stopped(child_id)  # handed over with its parent, not cancelled
            else:
                await host.cancel(child_id, reason="parent", force=parent.cancel.forced)
                await handle.outcome()
        raise
    finally:
        parent.children.pop(step.index, None)
        if gate is not None:
            gate.unfollow()
    if outcome.state is State.COMPLETED:
        return outcome.result
    raise ChildRunError(child_id, outcome.state.value, outcome.error or outcome.cancel_error)


async def _wait_relaying_pause(parent: RunContext, handle: ChildHandle) -> Outcome:
    """Wait for the child's outcome; meanwhile, each time the parent's pause changes (or its
    child's: that wakes the parent's gate too), record the parent paused if it is at rest."""
    async with anyio.create_task_group() as watch:
        watch.start_soon(_pause_when_at_rest, parent)
        outcome = await handle.outcome()
        watch.cancel_scope.cancel()
    return outcome


async def _pause_when_at_rest(parent: RunContext) -> None:
    """A parent waiting in a child step reaches no checkpoint: once its pause is requested and
    its child is paused, this records it paused (:func:`pause_if_at_rest`)."""
    while True:
        changed = parent.pause.next_change()
        try:
            await pause_if_at_rest(parent)
        except HaltwiseError:
            return  # the store failed or the run was lost: the parent's own code finds out
        await changed.wait()
