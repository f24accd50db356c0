"""What the LangChain adapter reads of the LangGraph task running its code (issue 27).

Three things LangGraph hands a node but does not document, all read, never called: the
node's ``PregelExecutableTask`` (its id, path and writers), the superstep's futures (which
tasks failed) and the graph run's background executor (its saves in flight), through the
``CONFIG_KEY_CALL`` partial LangGraph puts into the node's config.
The adapter needs them where LangGraph's public surface stops: to save a cancelled tool call's
result as its task's output when the host cuts the graph run, and to tell that cut from
LangGraph stopping a node because a task beside it failed. Tested against the LangGraph
versions docs/integrations.md names.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import anyio
from langchain_core.messages import ToolMessage
from langgraph._internal._config import patch_configurable
from langgraph._internal._constants import (
    CONFIG_KEY_CALL,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_SEND,
    NS_SEP,
)
from langgraph.config import get_config
from langgraph.pregel._algo import task_path_str
from langgraph.runtime import ExecutionInfo

__all__ = ["save_as_finished", "superstep_task_failed"]


def superstep_task_failed() -> bool:
    """Whether a task of the superstep running this code has raised (not been cancelled):
    LangGraph then cancels the others and raises that failure from ``ainvoke``/``astream``.
    False outside a graph run."""
    futures = _pregel_call().get("futures")
    return any(_failed(future) for future in getattr(futures, "failed", ()))


def _failed(future: Any) -> bool:
    """Whether ``future`` (a task of the superstep) raised, rather than was cancelled."""
    return bool(future.done() and not future.cancelled() and future.exception() is not None)


def _pregel_call() -> dict[str, Any]:
    """What LangGraph gives the node running this code to schedule calls with (its
    ``PregelExecutableTask`` and the superstep's futures, both weakly referenced): read, never
    called; empty outside a graph run."""
    try:
        call = get_config().get("configurable", {}).get(CONFIG_KEY_CALL)
    except RuntimeError:  # not inside a runnable
        return {}
    if not isinstance(call, functools.partial) or not call.args:
        return {}
    futures = call.keywords.get("futures")
    submit = call.keywords.get("submit")
    executor = getattr(submit() if submit is not None else None, "__self__", None)
    return {
        "task": call.args[0](),
        "futures": futures() if futures is not None else None,
        "background": getattr(executor, "tasks", None) or {},
    }


async def _saves_in_flight(background: dict[asyncio.Future[Any], tuple[bool, bool]]) -> None:
    """Wait for the saves LangGraph has begun in the background and not finished.

    With the default durability (``"async"``) LangGraph saves each superstep's checkpoint, and
    each task's writes, in background tasks of the graph run's executor (the ones it does not
    cancel when the run ends: every other is a node). Its loop waits for them as it ends, but a
    host cancel that lands again while it ends (haltwise's own cancel of the run's body, which
    awaits the graph run's task) cuts that wait, and the app then closes the checkpointer under
    them: the checkpoint this superstep runs from could be lost, and a new run would start from
    an older one and repeat the calls made since. So the node waits for them first."""
    pending = [
        future
        for future, (cancel_on_exit, _) in list(background.items())
        if not cancel_on_exit and not future.done()
    ]
    if pending:
        await asyncio.wait(pending)


async def save_as_finished(message: ToolMessage, info: ExecutionInfo | None) -> None:
    """Save ``message`` as the output of the tool-call task running this code, in the thread's
    checkpoint, before the task ends.

    LangGraph keeps a superstep's finished tasks as the checkpoint's pending writes (a task
    with an output write is finished: a new run on the thread applies its writes and does not
    run it again). When the host cancels the graph run, LangGraph commits the writes of a node
    that returns only after its loop has stopped waiting for them, racing the app's closing of
    the checkpointer: so the node's writes (computed by the node's own writers from the output
    ``create_agent``'s ``ToolNode`` gives, ``{"messages": [message]}``) are saved here, through
    the checkpointer's ``aput_writes``, under the task's id. LangGraph's own later save of the
    same writes changes nothing. First, the saves LangGraph has in flight are waited for (see
    :func:`_saves_in_flight`), the checkpoint these writes belong to among them. Without a
    checkpointer, or outside a graph run, nothing is
    saved."""
    task = _pregel_call().get("task")
    if task is None:
        return
    config = get_config()
    saver = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
    if info is None or saver is None or info.checkpoint_id is None:
        return
    writes: list[tuple[str, Any]] = []
    collect = patch_configurable(config, {CONFIG_KEY_SEND: writes.extend})
    for writer in task.writers:
        await writer.ainvoke({"messages": [message]}, collect)
    checkpoint = {
        "configurable": {
            "thread_id": info.thread_id,
            "checkpoint_ns": (info.checkpoint_ns or "").rpartition(NS_SEP)[0],
            "checkpoint_id": info.checkpoint_id,
        }
    }
    with anyio.CancelScope(shield=True):
        await _saves_in_flight(_pregel_call()["background"])
        await saver.aput_writes(checkpoint, writes, task.id, task_path_str(task.path))
