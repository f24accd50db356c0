"""A run worked in the foreground of ``haltwise run`` / ``resume``: signals, live view, checks.

SIGINT (Ctrl-C) cancels the run with reason ``"user"``, SIGTERM with reason ``"shutdown"``; a
second signal of either kind forces the cancel (``finish`` steps are not waited for, no
compensation runs). The signal handler (:mod:`.signals`) is installed before anything is
loaded and stays for the whole command, so a signal that arrives while the run is starting is
queued, not lost, one that arrives after it ended is absorbed, and none turns into a
``KeyboardInterrupt``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio

from .._core.exceptions import (
    HaltwiseError,
    InputError,
    RunOwnedError,
    StoreError,
    UnknownRunError,
)
from .._core.outcome import Outcome
from .._core.records import RunRecord, RunSnapshot, parse_json_text
from .._runtime import lowlevel
from .._runtime.runtime import Runtime
from .._runtime.seat import held_by_live_owner
from .._runtime.tool import Task
from .render import LiveView, Screen
from .signals import RELAY, SIGNAL_REASONS
from .sources import trusted_spec

__all__ = [
    "SIGNAL_REASONS",
    "Foreground",
    "check_fits",
    "check_ours",
    "existing_run",
    "parse_input",
    "run_name",
    "signals_as_cancels",
    "source_of",
    "task_of",
    "worker_names",
]

#: How often the live view reads the journal (seconds).
_REFRESH = 0.1


class Foreground:
    """Relays signals to one run of ``runtime`` and waits for its outcome.

    Create it with :func:`signals_as_cancels`; call :meth:`follow` once the run has started.
    """

    def __init__(self, runtime: Runtime, received: AsyncIterator[int], *, quiet: bool) -> None:
        self._runtime = runtime
        self._received = received
        self._quiet = quiet
        self._run_id: str | None = None
        self._count = 0

    async def follow(self, run_id: str, screen: Screen) -> Outcome:
        """Wait until run ``run_id`` (worked by this runtime) is final; show it live meanwhile."""
        self._run_id = run_id
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._relay)
            with screen.live() as view:
                if screen.interactive:
                    tasks.start_soon(self._refresh, run_id, view)
                outcome = await self._runtime.outcome(run_id)
            tasks.cancel_scope.cancel()
        return outcome

    async def _relay(self) -> None:
        async for signum in self._received:
            await self._on_signal(signum)

    async def _on_signal(self, signum: int) -> None:
        assert self._run_id is not None
        self._count += 1
        force = self._count > 1
        reason = SIGNAL_REASONS.get(signal.Signals(signum), "user")
        await self._runtime.cancel(self._run_id, reason=reason, force=force)
        if not self._quiet:
            _tell(
                "cancel forced: stopping now"
                if force
                else f"cancelling ({reason}); send the signal again to force"
            )

    async def _refresh(self, run_id: str, view: LiveView) -> None:
        while True:
            # A store error here is the run's to report (see check_ours): the view waits.
            with suppress(StoreError):
                detail = await self._runtime.inspect(run_id)
                view.show(RunSnapshot(detail.run, detail.outcome.steps, detail.outcome.partials))
            await anyio.sleep(_REFRESH)


@asynccontextmanager
async def signals_as_cancels(runtime: Runtime, *, quiet: bool) -> AsyncIterator[Foreground]:
    """Turn SIGINT/SIGTERM into cancels of the run the yielded :class:`Foreground` follows.

    Signals received before :meth:`Foreground.follow` names the run are queued and acted on then
    (the handler is :data:`~.signals.RELAY`, installed here if the command has not already).
    ``quiet`` suppresses the one-line notes on stderr (for ``--json``).
    """
    RELAY.install()
    yield Foreground(runtime, RELAY.signals(), quiet=quiet)


def _tell(text: str) -> None:
    print(f"haltwise: {text}", file=sys.stderr, flush=True)


# -- what run and resume check before they start ---------------------------------------


def parse_input(text: str | None) -> dict[str, Any]:
    """``--input``: a JSON object of keyword arguments; raises :class:`InputError` otherwise."""
    if text is None:
        return {}
    value = parse_json_text(text, "--input")
    if not isinstance(value, dict):
        raise InputError(
            f"--input must be a JSON object of keyword arguments, not {type(value).__name__}"
        )
    return value


def check_fits(task: Task[..., Any], kwargs: dict[str, Any], target: str) -> None:
    """Raise :class:`InputError` naming ``target`` if ``kwargs`` do not fit the task."""
    try:
        task.signature.bind(**kwargs)
    except TypeError as error:
        raise InputError(f"--input does not fit {target}: {error}") from None


def run_name(target: str) -> str:
    """The task name a run records for ``FILE.py:TASK``: the file's name and the task's.

    ``dir/agent.py:research`` records ``agent.py:research``, whatever directory it was typed
    from, so that a worker given ``agent.py`` anywhere recognises the runs of its tasks (the
    file's absolute path is kept separately, for ``resume``). A module spec is kept as typed.
    """
    file_part, _, attribute = target.rpartition(":")
    if file_part.endswith(".py") or os.sep in file_part:
        return f"{Path(file_part).name}:{attribute}"
    return target


def worker_names(file: str, module_tasks: dict[str, Task[..., Any]]) -> dict[str, Task[..., Any]]:
    """The names under which runs of ``file``'s tasks are recorded (see :func:`run_name`)."""
    return {run_name(f"{file}:{attribute}"): task for attribute, task in module_tasks.items()}


def claimed_names(file: str, module_tasks: dict[str, Task[..., Any]]) -> dict[str, Task[..., Any]]:
    """The names a worker of ``file`` claims runs by: the command line's (:func:`worker_names`,
    ``agent.py:research``) and each task's own name, which Python records for a run it
    submits after importing the file as a module (``Runtime.submit(research)`` in code that
    did ``from agent import research`` records ``agent:research``)."""
    names = worker_names(file, module_tasks)
    for attribute, task in module_tasks.items():
        names.setdefault(f"{Path(file).stem}:{attribute}", task)
    return names


def source_of(target: str, module_file: str | None) -> str | None:
    """The absolute path to record for ``resume`` when ``target`` names a file, else None."""
    file_part = target.rpartition(":")[0]
    if module_file is None or not (file_part.endswith(".py") or os.sep in file_part):
        return None
    return str(Path(module_file).resolve())


def task_of(run: RunRecord, file: str | None = None, *, moved: bool = False) -> Task[..., Any]:
    """Load the task of a journaled run: from ``file`` if the caller named one, else from the
    file the journal names if it lies in the current project, else from its module name (see
    :mod:`.sources` for what is refused)."""
    from .._runtime.loader import load_target

    _, task = load_target(trusted_spec(run, file, moved=moved))
    if task is None:
        raise InputError(f"run {run.id!r}: cannot tell its task from {run.task!r}")
    return task


async def existing_run(
    runtime: Runtime, task_id: str, task: str, kwargs: dict[str, Any]
) -> Outcome | None:
    """For ``run --id``: the outcome of a final run with that id, None if there is no such run.

    Raises :class:`HaltwiseError` (exit 2) if the run exists and is not final, naming its owner,
    and :class:`~haltwise.IdempotencyConflictError` (exit 2) if it is final and of another task
    (``task``, the name the run records) or other inputs (``kwargs``).
    """
    from .._core.records import dump_json
    from .._runtime.runtime import same_call

    try:
        detail = await runtime.inspect(task_id)
    except UnknownRunError:
        return None
    run = detail.run
    if run.state.is_final:
        same_call(run, task, {"args": [], "kwargs": json.loads(dump_json(kwargs, "the input"))})
        return detail.outcome
    if run.owner is not None and held_by_live_owner(run):
        raise RunOwnedError(task_id, run.owner.describe())
    raise HaltwiseError(_not_final_words(run), task_id=task_id)


async def check_ours(runtime: Runtime, task_id: str) -> None:
    """After ``start``: refuse to follow a run another process created meanwhile (same id).

    A store that fails this read while the run is worked here is left for the run to meet: its
    own writes go to the same store, and its outcome then says in one line that its journal
    could not be written (:meth:`Runtime.outcome`), whichever of the two met the failure first.
    """
    try:
        run = (await runtime.inspect(task_id)).run
    except StoreError:
        if lowlevel.worked_here(runtime, task_id):
            return
        raise
    if run.owner is not None and run.owner.token != runtime.owner.token:
        raise RunOwnedError(task_id, run.owner.describe())


def _not_final_words(run: RunRecord) -> str:
    if run.owner is None:
        return (
            f"run {run.id!r} exists and is {run.state}, waiting for a worker; "
            f"run it here with: haltwise resume {run.id}"
        )
    return (
        f"run {run.id!r} exists and is {run.state}, but its owner ({run.owner.describe()}) is "
        f"gone; continue it with: haltwise resume {run.id}"
    )
