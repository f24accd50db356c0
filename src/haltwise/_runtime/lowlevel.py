"""The runtime's seams beyond its public API, as ``trio.lowlevel`` is trio's: what the command
line, the MCP server, :mod:`haltwise.testing` and the worker need of a :class:`Runtime` that a
user's code does not.

Every module outside ``_runtime`` uses a runtime through its public methods and these functions
only (``tests/test_faces.py`` checks that none touches a runtime underscore): a change of the
runtime's insides then stops here.

- :func:`launch`: start a run with explicit arguments, the name the run records, the file that
  defines its task, and (for :mod:`haltwise.testing`) a probe at each cancel point;
- :func:`worked_here`, :func:`progress`, :func:`active_runs`: what a face may ask of the runs
  this process works;
- :func:`begin_hand_over`, :func:`hand_over`, :func:`claimed`, :func:`adopt`: the worker's
  narrow protocol (a worker's SIGTERM, the runs it claims and takes over).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._core.budget import Budget
    from .progress import Pulse
    from .run_context import Probe
    from .runtime import Runtime, TaskHandle
    from .tool import Task

__all__ = [
    "active_runs",
    "adopt",
    "begin_hand_over",
    "claimed",
    "hand_over",
    "launch",
    "progress",
    "worked_here",
]


async def launch(
    runtime: Runtime,
    task: Task[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    task_id: str | None = None,
    deadline: float | None = None,
    name: str | None = None,
    source: str | None = None,
    probe: Probe | None = None,
    budget: Budget | None = None,
) -> TaskHandle:
    """:meth:`Runtime.start` with explicit arguments, and what a face knows beyond the task.

    ``name`` is the task name the run records (the command line's ``FILE.py:TASK``, so that a
    resume in another directory finds the task); ``source`` the absolute path of the file that
    defines the task (kept in the run's inputs as ``"source"``); ``probe`` is awaited at every
    cancel point of the run (:mod:`haltwise.testing`'s explorer). As with ``start``, the run is
    durable (``running``) when this returns, and an existing ``task_id`` starts nothing: its
    handle is returned.
    """
    return await runtime._start_named(
        task,
        args,
        dict(kwargs or {}),
        task_id=task_id,
        deadline=deadline,
        name=name,
        source=source,
        probe=probe,
        budget=budget,
    )


def worked_here(runtime: Runtime, task_id: str) -> bool:
    """Whether ``runtime`` works run ``task_id``, or stopped working it because its journal
    could not be written (its outcome then says so in one line)."""
    return runtime._worked_here(task_id)


def progress(runtime: Runtime, task_id: str) -> Pulse | None:
    """The progress notice of run ``task_id`` if ``runtime`` works it right now (given each
    time the run journals a partial result), else None (follow the change feed instead)."""
    run = runtime._active.get(task_id)
    return None if run is None else run.progress


def active_runs(runtime: Runtime) -> int:
    """How many runs ``runtime`` works right now."""
    return runtime._active_runs


def begin_hand_over(runtime: Runtime) -> int:
    """Tell every run ``runtime`` works to stop without being cancelled (a worker's SIGTERM);
    return how many were told. :func:`hand_over` waits for them."""
    return runtime._begin_hand_over()


async def hand_over(runtime: Runtime) -> None:
    """Stop working every run here without cancelling it, and wait until each is released.

    Each step in flight settles by its policy as for a cancel (interruptible steps are
    interrupted, finish steps finish within their grace, rollback steps are compensated), then
    the run is released: it stays ``running`` (or ``paused``) with no owner, and another worker
    or a ``resume`` takes it over at once. A run that completes meanwhile is recorded completed.
    """
    await runtime._hand_over()


def claimed(runtime: Runtime, task_id: str, leased_at: float) -> None:
    """The worker claimed run ``task_id`` for ``runtime`` with a write that began at
    ``leased_at`` (``time.monotonic()``): the run's lease surely holds from then, once
    :func:`adopt` launches it."""
    runtime._leased_at[task_id] = leased_at


async def adopt(runtime: Runtime, task_id: str, task: Task[..., Any]) -> TaskHandle | None:
    """Take over a run for a worker: a ``pending`` run it claimed, or one whose owner is gone.

    Unlike :meth:`Runtime.resume`, a ``cancelling`` run is only finished (recorded
    ``cancelled``), and a run with an ``unknown`` step that may not run again is recorded
    ``failed`` (error type ``UnknownStepError``); both return None, as does a final run. A
    ``paused`` run stays paused. Raises :class:`~haltwise.RunOwnedError` if a live owner holds
    the run or another process took it first.
    """
    return await runtime._adopt(task_id, task)
