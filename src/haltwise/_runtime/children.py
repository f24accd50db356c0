"""Child tasks: a task awaiting another task runs it as a child run, one step of the parent.

The child step is an ``interruptible`` step with effect ``external`` (the cautious assumption:
the child's own steps may write). Its body starts the child run ``PARENT_ID/STEP_INDEX`` (or
resumes it, on the parent's resume) and waits for it. A cancel of the parent interrupts that
wait: the child is then cancelled with reason ``"parent"`` (forced if the parent's cancel was)
and the parent's step is settled once the child's run has ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .._core.exceptions import ChildRunError
from .._core.policy import CancelPolicy, Effect, ToolPolicy
from .._core.states import State
from .run_context import CURRENT_STEP

if TYPE_CHECKING:
    from .tool import Task, Tool

_CHILD_POLICY = ToolPolicy(
    cancel=CancelPolicy.INTERRUPTIBLE,
    effect=Effect.EXTERNAL,
    effect_declared=True,
)


def child_step(task: Task[..., Any]) -> Tool[..., Any]:
    """The tool that stands for ``task`` as a step of its parent (not registered in TOOLS)."""
    from .tool import ToolSpec, tool_function

    async def run_child(*args: Any, **kwargs: Any) -> Any:
        return await _run_child(task, args, kwargs)

    run_child.__name__ = task.name
    return tool_function(ToolSpec(run_child, _CHILD_POLICY, task.name, register=False))


async def _run_child(task: Task[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    step = CURRENT_STEP.get()
    assert step is not None, "a child step runs inside its parent's step"
    parent = step.run
    host = parent.host
    child_id = f"{parent.run_id}/{step.index}"
    handle = await host.start_child(task, args, kwargs, child_id, parent.run_id)
    try:
        outcome = await handle.outcome()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await host.cancel(child_id, reason="parent", force=parent.cancel.forced)
            await handle.outcome()
        raise
    if outcome.state is State.COMPLETED:
        return outcome.result
    raise ChildRunError(child_id, outcome.state.value, outcome.error or outcome.cancel_error)
