"""The cancel state of one run worked in this process: the request, and where it is delivered.

One object per run (:attr:`RunContext.cancel`), written only through its methods: the request
(reason, forced), what became of it (delivered into the task, a host's cancel reached a step, a
hand-over), and the cancel scopes a request cancels (the task function's scope, the shields).
Set from the event-loop thread; worker threads only read ``reason`` (a stale read there only
delays a cooperative stop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio

from .._core.exceptions import Cancelled

#: The native cancel exception: the runtime is asyncio-only, and the step path names this
#: constant rather than calling ``anyio.get_cancelled_exc_class()`` each time.
NATIVE_CANCEL = asyncio.CancelledError

#: Exception types by which a framework says that *it* cancelled the agent (Pydantic AI's
#: ``RunCancelled``): such an error reaching the task function is a host cancel of the run,
#: wherever the framework's cancel landed. Added to only by :func:`register_host_cancel`.
HOST_CANCEL_ERRORS: list[type[BaseException]] = []


def register_host_cancel(*error_types: type[BaseException]) -> None:
    """Declare exception types by which a framework says that it cancelled the agent.

    Such an error leaving a task function ends the run ``cancelled`` with reason ``"host"`` (the
    steps in flight settled by their policies first), never ``failed``, wherever the framework's
    cancel landed: in a step or in the framework's own code between two steps (CONTRACT.md,
    "Cancels from the host"). Subclasses count too. For an integration to call when it is
    imported (the Pydantic AI adapter registers ``RunCancelled``); registering a type twice
    changes nothing. Raises :class:`TypeError` for anything but an exception class.
    """
    for error_type in error_types:
        if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
            raise TypeError(f"{error_type!r} is not an exception class")
    for error_type in error_types:
        if error_type not in HOST_CANCEL_ERRORS:
            HOST_CANCEL_ERRORS.append(error_type)


@dataclass(eq=False, slots=True)
class CancelState:
    """A run's cancel request and the scopes it reaches (CONTRACT.md, "Cancellation").

    ``reason`` is None until a cancel is requested; ``forced`` once a forced one was (or the
    runtime itself is being cancelled). ``delivered``: :class:`Cancelled` was raised into the
    task, so the run ends cancelled whatever it then does. ``host``: a cancellation haltwise did
    not request (asyncio's, anyio's) reached one of the run's steps. ``handing_over``: a worker
    is handing the run over: it stops like a cancel, but no cancel is recorded.
    """

    #: process-wide: how many runs have a cancel recorded (a reason) and are still worked (the
    #: runtime counts one off as a run with a reason stops being worked): the runtime's watcher
    #: lists the runs whose cancel it acts on already only while there may be some
    acting: ClassVar[int] = 0

    reason: str | None = None
    forced: bool = False
    delivered: bool = False
    host: bool = False
    handing_over: bool = False
    #: the cancel scope the task function runs in (see ending.call_task), while it runs
    task_scope: anyio.CancelScope | None = None
    #: the shields in effect (haltwise.shield, a finish body's grace, a compensation): a
    #: forced cancel cancels them
    _shields: list[anyio.CancelScope] = field(default_factory=list)
    #: finish bodies running in the task function's own task, and whether a cancel of its
    #: scope waits for them
    _holds: int = 0
    _scope_cancel_held: bool = False
    #: cooperative stops in progress (see :meth:`hold_for`): how each is stopped, and whether
    #: it holds the task's scope under a forced cancel too
    _stoppers: dict[Callable[[], None], bool] = field(default_factory=dict)

    @property
    def requested(self) -> bool:
        """Whether a cancel was requested (or the run is forced to stop)."""
        return self.reason is not None or self.forced

    def would_change(self, force: bool) -> bool:
        """Whether a request (``force`` or not) would change anything: the first one, or the
        first forced one."""
        return self.reason is None or (force and not self.forced)

    def record(self, reason: str, *, force: bool) -> bool:
        """Note a request; True if it changed anything (then the steps in flight are told).

        The first reason stays. A forced request cancels every shield; the task function's
        scope is cancelled, unless a finish body runs in its task and the cancel is not forced
        (then once that body has ended, see :meth:`hold_task_scope`).
        """
        changed = self.would_change(force)
        if self.reason is None:
            self.reason = reason
            CancelState.acting += 1
        if force and not self.forced:
            self.forced = True
            for scope in self._shields:
                scope.cancel()
        if changed:
            for stop in list(self._stoppers):
                stop()
        if changed and self.task_scope is not None:
            if self._held():
                self._scope_cancel_held = True
            else:
                self.task_scope.cancel()
        return changed

    def _held(self) -> bool:
        """Whether the cancel of the task's scope waits (see :meth:`hold_task_scope` and
        :meth:`hold_for`)."""
        if self.forced:
            return any(self._stoppers.values())
        return bool(self._holds or self._stoppers)

    def force(self) -> None:
        """Settle as forced from now on, with no request to record: a takeover of a run whose
        cancel was forced, a runtime that is itself being cancelled. Shields begun from now on
        are cut at once (:meth:`shielding`); the ones in effect are left to end."""
        self.forced = True

    def deliver(self, fallback: str, run_id: str) -> Cancelled:
        """The :class:`Cancelled` to raise into the task now (the run then ends cancelled)."""
        self.delivered = True
        return Cancelled(self.reason or fallback, task_id=run_id)

    def mark_delivered(self) -> None:
        """The cancel reached the task another way (it landed at an await of the task's own
        code, or the run cancelled itself): the run ends cancelled."""
        self.delivered = True

    def mark_host(self) -> None:
        """A cancellation haltwise did not request reached one of the run's steps."""
        self.host = True

    def unmark_host(self) -> None:
        """The cancellation that reached a step (:meth:`mark_host`) was the framework stopping
        that call because another call it ran beside failed: that failure, not a cancel, ends
        the run."""
        self.host = False

    def begin_hand_over(self) -> None:
        """A worker hands the run over: stop like a cancel, recording none."""
        self.handing_over = True

    # -- the scopes a cancel reaches -----------------------------------------------------------

    def enter_task_scope(self, scope: anyio.CancelScope) -> None:
        """The task function runs in ``scope`` from now on; cancelled at once if a cancel came
        first."""
        self.task_scope = scope
        if self.reason is not None:
            scope.cancel()

    def leave_task_scope(self) -> None:
        self.task_scope = None

    def hold_task_scope(self, delta: int) -> None:
        """A finish body began (+1) or ended (-1) in the task function's own task.

        While one runs there, a (not forced) cancel does not cancel the task's scope, which
        would cut it: the scope is cancelled once the last such body has ended.
        """
        self._holds += delta
        self._release_held()

    def hold_for(self, stop: Callable[[], None], *, through_force: bool = False) -> None:
        """Work in the task that must stop cooperatively began: a call to a remote service
        whose cancel must still be sent (:func:`~.task_api.remote_call`), a framework's run that
        must write its own state before it stops (LangGraph's drain).

        Until :meth:`release_for`, a cancel request calls ``stop`` (at once if one was made
        already: then the task's scope is cancelled already too) and holds back the cancel of
        the task's scope, which would also cut that work's own tasks; ``through_force``: also
        under a forced cancel (the work bounds itself then).
        """
        self._stoppers[stop] = through_force
        if self.reason is not None:
            stop()

    def release_for(self, stop: Callable[[], None]) -> None:
        """The work of :meth:`hold_for` has stopped (or ended): the held cancel goes on."""
        self._stoppers.pop(stop, None)
        self._release_held()

    def _release_held(self) -> None:
        if self._held() or not self._scope_cancel_held:
            return
        self._scope_cancel_held = False
        if self.task_scope is not None:
            self.task_scope.cancel()

    @contextmanager
    def shielding(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Register the shield ``scope`` for the block: a forced cancel cancels it (at once if
        the run is forced already)."""
        if self.forced:
            scope.cancel()
        self._shields.append(scope)
        try:
            yield
        finally:
            self._shields.remove(scope)


async def outside_any_task(callback: Callable[[], Any]) -> None:
    """Call ``callback`` from the event loop itself, outside any task, and wait until it ran.

    For delivering many cancels at once: anyio's ``CancelScope.cancel`` called from a task
    formats that task's repr (its coroutine and where it waits) into the cancel's reason, some
    tens of microseconds per call, which a bulk cancel of 10,000 runs would pay 10,000 times;
    called from a callback of the loop it formats nothing. (asyncio here: anyio has no way to
    schedule a plain callback; the runtime runs on asyncio, see ``ending.call_task``.)
    """
    loop = asyncio.get_running_loop()
    ran: asyncio.Future[None] = loop.create_future()

    def call() -> None:
        try:
            callback()
        except BaseException as error:  # handed to the waiting task, raised there
            ran.set_exception(error)
        else:
            ran.set_result(None)

    loop.call_soon(call)
    await ran
