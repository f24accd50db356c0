"""The runtime: starts, drives, cancels and resumes runs against a store.

It knows no store by name (only the :class:`~haltwise._journal.store.Store` interface) and no
terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, final, overload

import anyio
from anyio.abc import TaskGroup

from .._core.approvals import ApprovalRecord
from .._core.budget import Budget
from .._core.exceptions import (
    CodeChangedError,
    HaltwiseError,
    IdempotencyConflictError,
    InputError,
    LostOwnershipError,
    ResumeRefusedError,
    RunOwnedError,
    StoreError,
    StoreGoneError,
    UnknownRunError,
)
from .._core.outcome import Outcome, ended_by
from .._core.records import RunRecord, RunSnapshot, dump_json
from .._core.states import State, StepStatus
from .._core.views import CancelBatch, Change, RunDetail, RunPage
from .._journal import open_store
from .._journal.owner import DEFAULT_LEASE, Leased, held_by_live_owner, new_owner
from .._journal.shield import shielded
from .._journal.store import CancelledRun, ForkOf, NewRun, Store
from . import spans
from .approvals import deliver_decisions, woken
from .cancel_state import CancelState, outside_any_task
from .code import check_code, version_of
from .ending import (
    call_task,
    fail_refused,
    finish,
    settle_takeover,
)
from .explain import needs_code
from .fork import ForkPlan, plan_fork
from .operator import registered_task, stand_in_task
from .pause import deliver_pause_signals, relay_to_children
from .pause_state import PauseGate
from .reconcile import ask_hooks, record_operator_answers
from .run_context import Probe, RunContext, RunTask
from .seat import DEFAULT_BEFORE_START_TTL, Seat, cancel_batch, nobody_works
from .seat_now import check_no_nul
from .steps import execute_step
from .takeover import refuse_unknown
from .tool import TASKS, Task

#: a run as a cancel request returned it: one run's record, or one run of a bulk request
_Cancelled = TypeVar("_Cancelled", RunRecord, CancelledRun)


@final
class TaskHandle:
    """A handle on one run, by id; valid whether or not this runtime is working the run."""

    def __init__(self, runtime: Runtime, task_id: str) -> None:
        self._runtime = runtime
        self.id = task_id

    async def cancel(self, reason: str = "user", *, force: bool = False) -> None:
        """Request a cancel; returns once the request is durable, not when the run stopped.

        ``force=True`` stops at once: ``finish`` steps are not waited for and no compensation
        runs (the in-flight step becomes ``unknown``, an interruptible one ``interrupted``).
        Cancelling a run that is already final does nothing.
        """
        await self._runtime.cancel(self.id, reason=reason, force=force)

    async def pause(self) -> None:
        """Request a pause (see :meth:`Runtime.pause`); returns once the request is durable."""
        await self._runtime.pause(self.id)

    async def unpause(self) -> None:
        """Undo a pause (see :meth:`Runtime.unpause`)."""
        await self._runtime.unpause(self.id)

    async def outcome(self) -> Outcome:
        """Wait until the run is in a final state and return its outcome (through any pause).

        Raises :class:`~haltwise.StoreError`, on every call, if this runtime stopped working the
        run because its journal could not be written (see :meth:`Runtime.outcome`).
        """
        return await self._runtime.outcome(self.id)

    async def status(self) -> Outcome:
        """The run as it is now (possibly not final), without waiting."""
        return await self._runtime.status(self.id)

    def __repr__(self) -> str:
        return f"<haltwise.TaskHandle {self.id}>"


@final
class Runtime:
    """Runs tasks against a store. Use as ``async with haltwise.Runtime(url) as rt:``.

    ``store`` is a URL (``sqlite:///path.db``, ``postgresql://...``); ``None`` means
    ``$HALTWISE_STORE``, else ``sqlite:///.haltwise/haltwise.db``. ``lease`` is how long
    another host must wait, without a heartbeat from this process, before taking its runs over.

    Leaving the ``async with`` block cancels the runs still active here with reason
    ``"shutdown"`` (each settling by its policies) and waits for them to end.
    """

    def __init__(self, store: str | None = None, *, lease: float = DEFAULT_LEASE) -> None:
        if (
            isinstance(lease, bool)
            or not isinstance(lease, int | float)
            or not 0 < lease < math.inf
        ):
            raise InputError(f"lease must be a finite number of seconds > 0, not {lease!r}")
        self.store: Store = open_store(store)
        #: the requests and the read API (one home for their rules; see :mod:`.seat`)
        self._seat = Seat(self.store)
        self.lease = lease
        self.owner = new_owner()
        self._active: dict[str, RunContext] = {}
        #: runs being taken over here, not yet launched (see :meth:`_one_owner`): set once the
        #: taking ends, launched or not
        self._taking: dict[str, anyio.Event] = {}
        #: run -> monotonic time taken before the write that last gave it a lease here, until
        #: the run is launched (its ``held_until`` starts from it; see :meth:`_lease_for`)
        self._leased_at: dict[str, float] = {}
        #: runs whose journal could not be written: their outcome() raises this error once
        self._broken: dict[str, StoreError] = {}
        self._task_group: TaskGroup | None = None
        self._wake = anyio.Event()
        #: how many runs were launched here (the watcher reads the requests again when it moved)
        self._launches = 0
        #: steps running beside their run's own code (see count_concurrent_steps)
        self._side_steps = 0
        self._host = RuntimeHost(self)
        #: told when a final write the runs' tasks did not wait for is done (see _drive)
        self._on_written = self._written
        #: the tasks handling final writes that failed (see _written)
        self._handling: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Runtime:
        await self.store.open()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._watch)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group = self._task_group
        assert task_group is not None, "Runtime used without async with"
        try:
            with anyio.CancelScope(shield=True):
                unrecorded = await self._shut_down_runs()
                for run in list(self._active.values()):
                    await run.done.wait()
            task_group.cancel_scope.cancel()
            # The block's own exception propagates as it is, not wrapped in an ExceptionGroup.
            await task_group.__aexit__(None, None, None)
            if unrecorded is not None and exc is None:
                raise unrecorded
            return None
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True):
                await self.store.close()

    async def _shut_down_runs(self) -> StoreError | None:
        """Cancel every run worked here with reason ``"shutdown"`` (the block's end).

        Once the store fails to record one (it is unreachable), that run and every one left
        are handed over instead, without recording more cancels (see :meth:`_hand_over`; each
        run's release is still tried, and a failed one leaves the run to its lease): each one's
        last durable state stands, as after a crash, and a later resume or worker takes it over.
        Returns that store error (None: every cancel was recorded); ``__aexit__`` raises it
        only if the block raised nothing, never in place of the block's own exception.
        """
        failed: StoreError | None = None
        for run_id in list(self._active):
            if failed is None:
                try:
                    await self._cancel_own(run_id, reason="shutdown")
                    continue
                except StoreError as error:
                    failed = error
            ctx = self._active.get(run_id)
            if ctx is not None:
                _hand_over_here(ctx)
        return failed

    # -- public operations ---------------------------------------------------------------------

    async def start(
        self,
        task: Task[..., Any],
        /,
        *args: Any,
        task_id: str | None = None,
        deadline: float | None = None,
        budget: Budget | None = None,
        **kwargs: Any,
    ) -> TaskHandle:
        """Start a run of ``task(*args, **kwargs)`` and return its handle at once.

        The run is durable (``running``) when this returns. If ``task_id`` already exists, no
        second run starts: the handle of the existing run is returned. ``deadline`` (seconds)
        cancels the run with reason ``"deadline"`` if it has not ended by then; it covers this
        start only. ``budget`` (a :class:`~haltwise.Budget`) replaces the task's own for this
        run. Raises :class:`~haltwise.InputError` if the arguments do not fit the task or
        are not JSON-serialisable.
        """
        return await self._start_named(
            task, args, kwargs, task_id=task_id, deadline=deadline, budget=budget
        )

    async def _start_named(
        self,
        task: Task[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        task_id: str | None = None,
        deadline: float | None = None,
        name: str | None = None,
        source: str | None = None,
        probe: Probe | None = None,
        parent: str | None = None,
        budget: Budget | None = None,
    ) -> TaskHandle:
        """:meth:`start` with explicit arguments, the name the run records (the CLI's
        ``FILE.py:TASK``) and the absolute path of the file that defines the task (kept in the
        run's inputs as ``"source"``, so that ``resume`` can load it from any directory).
        ``probe`` is for :mod:`haltwise.testing`: awaited at every cancel point of the run."""
        self._require_entered()
        if not isinstance(task, Task):
            raise InputError(f"{task!r} is not a @haltwise.task")
        task.bind_inputs(args, kwargs)
        inputs: dict[str, Any] = {"args": list(args), "kwargs": kwargs}
        source = source or task.source
        if source is not None:
            inputs["source"] = source
        code = version_of(task)
        if code is not None:
            inputs["code"] = code
        _add_budget(inputs, task, budget)
        # The task sees its inputs as they come back from the journal, from the first attempt
        # on: a tuple is a list, a dict's int keys are strings, on every attempt alike
        # (issue 15, item 5), so a resume cannot take another path than the first attempt.
        inputs = json.loads(dump_json(inputs, f"the inputs of task {task.name!r}"))
        _check_deadline(deadline)
        run_id = task_id if task_id is not None else uuid.uuid4().hex
        if not run_id or not isinstance(run_id, str):
            raise InputError("task_id must be a non-empty string")
        check_no_nul(run_id, "a run id")
        if run_id in self._active:
            same_call((await self.store.load(run_id)).run, name or task.name, inputs, parent=parent)
            return TaskHandle(self, run_id)
        # Created running, ours, in one transaction: no moment at which it is pending.
        new = NewRun(
            id=run_id,
            task=name or task.name,
            inputs=inputs,
            state=State.RUNNING,
            owner=self.owner,
            lease_until=self._lease_for(run_id),
            parent=parent,
        )
        existing, created = await self.store.create_run(new)
        if not created or existing.state is State.CANCELLED:
            self._leased_at.pop(run_id, None)
            if not created:
                same_call(existing, new.task, inputs, parent=parent)
            return TaskHandle(self, run_id)  # (created cancelled: a cancel pressed before it)
        ctx = self._context(run_id, task, None, {}, frozenset(), probe)
        if "budget" in inputs:
            ctx.set_budget(Budget.from_json(inputs["budget"]))
        self._launch(ctx, inputs, deadline)
        return TaskHandle(self, run_id)

    async def resume(
        self,
        task_id: str,
        *,
        deadline: float | None = None,
        assume_done: Mapping[int, Any] | None = None,
        rerun: Collection[int] | None = None,
        task: Task[..., Any] | None = None,
        probe: Probe | None = None,
        allow_code_change: bool = False,
    ) -> TaskHandle:
        """Continue run ``task_id`` from its journal; return its handle once it is running again.

        A ``completed`` run runs nothing; a ``paused`` run is unpaused (:meth:`unpause`). A run
        whose owner died is taken over: its orphaned
        steps are settled by their policies and, if it was ``cancelling``, the cancel is finished
        (``cancelled``, saga included) before it resumes; a cancel that lands while it is being
        taken over is acted on once it runs, as any cancel of a running run. Refuses with
        :class:`~haltwise.RunOwnedError` while a live owner holds it, and with
        :class:`~haltwise.ResumeRefusedError` while an ``unknown`` step of a non-idempotent tool
        is not covered by ``assume_done`` (``{index: result}``: it happened, replay this result)
        or ``rerun`` (indexes to run again). ``task`` defaults to the task registered under the
        run's recorded name.

        Refuses with :class:`~haltwise.CodeChangedError` when the file the run's task was loaded
        from differs now from the version the run recorded when it started (it names the file
        and both digests), unless ``allow_code_change``: the run then goes on with the code as
        it is now, and the event of its resume says so.
        """
        self._require_entered()
        _check_deadline(deadline)
        done = dict(assume_done or {})
        again = frozenset(rerun or ())
        snapshot = await self.store.load(task_id)
        run = snapshot.run
        if run.state is State.PAUSED:
            await self.unpause(task_id, task=task)  # resuming a paused run means unpausing it
            return TaskHandle(self, task_id)
        with self._one_owner(task_id):
            if snapshot.run.owner is not None and snapshot.run.owner.token == self.owner.token:
                snapshot = await self.store.load(task_id)  # as it is now that it is ours alone
            run = snapshot.run
            if run.state is State.COMPLETED:
                return TaskHandle(self, task_id)
            the_task = self._task_of(run, task)
            _check_step_indexes(task_id, snapshot, done, again)
            note = check_code(run, allow_code_change=allow_code_change)
            snapshot = await self._take_over(snapshot, the_task, done, again)
            await self._continue(snapshot, the_task, done, again, deadline, probe, note=note)
        return TaskHandle(self, task_id)

    @contextlib.contextmanager
    def _one_owner(self, run_id: str) -> Iterator[None]:
        """Reserve run ``run_id`` for the one path of this process that takes it over (a
        resume, a worker's adoption, an unpause, a parent's resume of its child) until that
        path launched it or gave up: a run is never driven twice in one process. Raises
        :class:`~haltwise.RunOwnedError` if it is worked here, or being taken over here."""
        if run_id in self._active or run_id in self._taking:
            raise RunOwnedError(run_id, f"this runtime ({self.owner.describe()})")
        taken = self._taking[run_id] = anyio.Event()
        try:
            yield
        finally:
            del self._taking[run_id]
            taken.set()

    async def _taken_here(self, run_id: str) -> None:
        """Wait until no path of this process is taking run ``run_id`` over."""
        while (taking := self._taking.get(run_id)) is not None:
            await taking.wait()

    @staticmethod
    def _task_of(run: RunRecord, task: Task[..., Any] | None) -> Task[..., Any]:
        the_task = task or TASKS.get(run.task)
        if the_task is None:
            raise HaltwiseError(
                f"run {run.id!r} is of task {run.task!r}, which is not loaded in this process",
                task_id=run.id,
            )
        return the_task

    async def reconcile(self, task_id: str, *, task: Task[..., Any] | None = None) -> Outcome:
        """Ask the ``reconcile`` hooks of run ``task_id``'s ``unknown`` steps what happened and
        journal the answers (``haltwise reconcile ID``); the run's outcome afterwards.

        A hook is asked for each ``unknown`` step of a tool loaded in this process that
        declares one (an idempotent tool's too: a ``Happened`` spares the call a resume would
        make again). Only a final run is asked about: a run still active (being worked, paused,
        or left by a dead owner) has its hooks asked by whoever resumes or takes it over, and
        is refused here before any hook is called (an answer could not be journaled into a run
        another owner holds): :class:`~haltwise.RunOwnedError` while a live owner holds it
        (HTTP 409), else :class:`~haltwise.InputError`. ``task`` defaults to the task
        registered under the run's name. Raises :class:`~haltwise.UnknownRunError` for an
        unknown id, and :class:`~haltwise.HaltwiseError` if the run's task is not loaded here.
        """
        self._require_entered()
        snapshot = await self.store.load(task_id)
        state = snapshot.run.state
        owner = snapshot.run.owner
        if not state.is_final and owner is not None and held_by_live_owner(snapshot.run):
            raise RunOwnedError(task_id, owner.describe())
        if not state.is_final:
            raise InputError(
                f"run {task_id!r} is {state.value}: reconcile asks the hooks of a final run; "
                "this one's are asked by whoever resumes it or takes it over",
                task_id=task_id,
            )
        ctx = self._context(task_id, self._task_of(snapshot.run, task), snapshot, {}, frozenset())
        snapshot = await ask_hooks(ctx, snapshot, ())
        return snapshot.outcome()

    async def fork_plan(
        self, task_id: str, *, from_step: int, new_id: str | None = None
    ) -> ForkPlan:
        """What :meth:`fork` would do: the steps it replays and the committed ``write`` and
        ``external`` steps it runs again. Raises :class:`~haltwise.InputError` as :meth:`fork`."""
        plan = plan_fork(await self.store.load(task_id), from_step)
        if new_id is not None:
            with contextlib.suppress(UnknownRunError):
                await self.store.load(new_id)
                raise InputError(f"a run with id {new_id!r} exists already", task_id=new_id)
        return plan

    async def fork(
        self,
        task_id: str,
        *,
        from_step: int,
        new_id: str | None = None,
        task: Task[..., Any] | None = None,
        deadline: float | None = None,
    ) -> TaskHandle:
        """Start a new run of run ``task_id``'s task and inputs, its steps before ``from_step``
        replayed from that run (not run), the rest run anew; return the new run's handle.

        The source run is not changed; the new run's creation event says what it was forked
        from. Everything committed from ``from_step`` on with effect ``write`` or ``external``
        happens again (see :meth:`fork_plan`). ``new_id`` defaults to a new id. Raises
        :class:`~haltwise.InputError` if ``from_step`` is out of range or a step before it is
        not committed, or if ``new_id`` exists; ``task`` defaults to the registered task.
        """
        _check_deadline(deadline)
        snapshot = await self.store.load(task_id)
        plan_fork(snapshot, from_step)
        source = snapshot.run
        the_task = self._task_of(source, task)
        run_id = new_id if new_id is not None else uuid.uuid4().hex
        if not run_id or not isinstance(run_id, str):
            raise InputError("a fork's id must be a non-empty string")
        new = NewRun(
            id=run_id,
            task=source.task,
            inputs=source.inputs,
            state=State.RUNNING,
            owner=self.owner,
            lease_until=self._lease_for(run_id),
            fork=ForkOf(task_id, from_step),
        )
        _, created = await self.store.create_run(new)
        if not created:
            raise InputError(f"a run with id {run_id!r} exists already", task_id=run_id)
        snapshot = await self.store.load(run_id)
        ctx = self._context(run_id, the_task, snapshot, {}, frozenset())
        self._launch(ctx, source.inputs, deadline)
        return TaskHandle(self, run_id)

    async def _adopt(self, task_id: str, task: Task[..., Any]) -> TaskHandle | None:
        """Take over a run for a worker: a ``pending`` run, or one whose owner is gone.

        Unlike :meth:`resume`, a ``cancelling`` run is only finished (recorded ``cancelled``),
        and a run with an ``unknown`` step that may not run again is recorded ``failed`` with
        error type ``UnknownStepError``; both return None, as does a run whose task's file is not
        the recorded one (:class:`~haltwise.CodeChangedError`: it is left for a worker of that
        code, or ``resume`` with ``allow_code_change``). A run cancelled while it is being
        taken over is launched, and ends as a run cancelled while it runs (see
        :meth:`_continue`). A final run returns None too.
        Raises :class:`~haltwise.RunOwnedError` if a live owner holds it or another process
        took it first.
        """
        self._require_entered()
        with self._one_owner(task_id):
            snapshot = await self.store.load(task_id)
            if snapshot.run.state.is_final:
                return None
            was_cancelling = snapshot.run.state is State.CANCELLING
            try:
                if not was_cancelling:  # (finishing a cancel is not resuming)
                    check_code(snapshot.run, allow_code_change=False)
                snapshot = await self._take_over(snapshot, task, {}, frozenset())
            except (ResumeRefusedError, CodeChangedError):
                return None
            if was_cancelling:
                await self.store.release(task_id, self.owner.token)
                return None
            await self._continue(snapshot, task, {}, frozenset(), None, None, unpause=False)
        return TaskHandle(self, task_id)

    async def _take_over(
        self,
        snapshot: RunSnapshot,
        task: Task[..., Any],
        done: Mapping[int, Any],
        again: frozenset[int],
    ) -> RunSnapshot:
        """Own the run, settle what its last owner left, refuse on unresolved unknown steps.

        What it left is read once the run is ours: a write of the last owner can commit between
        ``snapshot`` and the claim (a statement a dead process sent before it died still
        commits on the server; a stalled owner may come back just then), none after it (every
        step write is fenced, atomically with its commit). The run's state stays as
        ``snapshot`` read it: a cancel requested since is acted on once the run runs (see
        :meth:`_continue`).
        """
        if await self._take(snapshot):
            journal = await self.store.load(snapshot.run.id)
            snapshot = replace(journal, run=snapshot.run)
        ctx = self._context(snapshot.run.id, task, snapshot, dict(done), again)
        try:
            snapshot = await settle_takeover(ctx, snapshot)
            snapshot = await ask_hooks(ctx, snapshot, {*done, *again})
            refuse_unknown(snapshot, done, again)
        except ResumeRefusedError as refused:
            await fail_refused(ctx, snapshot, refused)
            raise
        return snapshot

    async def _continue(
        self,
        snapshot: RunSnapshot,
        task: Task[..., Any],
        done: dict[int, Any],
        again: frozenset[int],
        deadline: float | None,
        probe: Probe | None,
        *,
        unpause: bool = True,
        note: str | None = None,
    ) -> RunRecord:
        """Record the caller's word on unknown steps, go back to ``running`` and launch.

        Returns the run as launched (owned here; ``running`` unless it stays paused or is
        ``cancelling``), read before its code runs: what it does next may already have been
        journaled by the time the caller looks again.

        A ``paused`` run goes back to ``running`` only if ``unpause``; otherwise (a worker taking
        it over) it stays paused, waiting at its first checkpoint, as a pause requested before
        the takeover makes it pause there. A run ``cancelling`` here was cancelled while it was
        being taken over (after the takeover's snapshot was read): it is ours now and launched
        as it is, and the watcher delivers its cancel (it reads the requests of every run
        launched since it last looked); its steps settle by their policies and it ends
        ``cancelled`` as any run cancelled while it runs.
        """
        task_id = snapshot.run.id
        fence = self.owner.token
        if done or again:
            answering = self._context(task_id, task, snapshot, done, again)
            await record_operator_answers(answering, snapshot, done, again)
        state = snapshot.run.state
        # The failed step whose error ended the run runs again; the others replay their errors.
        ended = ended_by(
            state,
            snapshot.run.error if state is State.FAILED else snapshot.run.cancel_error,
            snapshot.steps,
        )
        if state not in (State.RUNNING, State.CANCELLING) and (
            unpause or state is not State.PAUSED
        ):
            await self.store.transition(
                task_id,
                State.RUNNING,
                expected={State.PENDING, State.CANCELLED, State.FAILED, State.PAUSED},
                reason=None,
                cancel_error=None,  # of the attempt that ended: not this one's
                fence=fence,
                note=note,  # the resume allowed a code change: its event says so
            )
        snapshot = await self.store.load(task_id)
        ctx = self._context(task_id, task, snapshot, done, again, probe, ended)
        ctx.pause.restore(snapshot.run)
        self._launch(ctx, snapshot.run.inputs, deadline)
        return snapshot.run

    async def _hand_over(self) -> None:
        """Stop working every run here without cancelling it (a worker's SIGTERM).

        Each in-flight step settles by its policy as for a cancel (interruptible steps are
        interrupted, finish steps finish within their grace, rollback steps are compensated),
        then the run is released: it stays ``running`` with no owner, and another worker or a
        ``resume`` takes it over at once. A run that completes meanwhile is recorded completed.
        """
        self._begin_hand_over()
        for ctx in list(self._active.values()):
            await ctx.done.wait()

    def _count_concurrent_steps(self, delta: int) -> None:
        """A step began (+1) or settled (-1) beside its run's own code, concurrently with it.

        The store is told how many things write at once: with more than one, it batches their
        writes (group commit) instead of committing each at once.
        """
        self._side_steps += delta
        self.store.set_concurrency(len(self._active) + self._side_steps)

    @property
    def _active_runs(self) -> int:
        """How many runs this runtime is working right now."""
        return len(self._active)

    def _begin_hand_over(self) -> int:
        """The first half of :meth:`hand_over`: tell every run here to stop; return how many."""
        for ctx in self._active.values():
            _hand_over_here(ctx)
        return len(self._active)

    async def submit(
        self,
        task: Task[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        name: str | None = None,
        source: str | None = None,
        budget: Budget | None = None,
    ) -> tuple[str, bool]:
        """Record a ``pending`` run for a worker; return its id and whether it is new.

        Nothing runs here. An id that exists is returned as it is, and nothing is recorded.
        ``budget`` replaces the task's own for this run.
        """
        kwargs = dict(kwargs or {})
        task.bind_inputs(args, kwargs)
        inputs: dict[str, Any] = {"args": list(args), "kwargs": kwargs}
        source = source or task.source
        if source is not None:
            inputs["source"] = source
        code = version_of(task)
        if code is not None:
            inputs["code"] = code
        _add_budget(inputs, task, budget)
        run_id = task_id if task_id is not None else uuid.uuid4().hex
        if not run_id:
            raise InputError("task_id must be a non-empty string")
        check_no_nul(run_id, "a run id")
        record, created = await self.store.create_run(
            NewRun(id=run_id, task=name or task.name, inputs=inputs)
        )
        if not created:
            same_call(record, name or task.name, json.loads(dump_json(inputs, "the inputs")))
        return record.id, created

    @overload
    async def cancel(
        self,
        task_id: str,
        *,
        reason: str = ...,
        force: bool = ...,
        before_start: Literal[False] = ...,
    ) -> RunRecord: ...
    @overload
    async def cancel(
        self,
        task_id: str,
        *,
        reason: str = ...,
        force: bool = ...,
        before_start: bool,
        ttl: float = ...,
    ) -> RunRecord | None: ...
    async def cancel(
        self,
        task_id: str,
        *,
        reason: str = "user",
        force: bool = False,
        before_start: bool = False,
        ttl: float = DEFAULT_BEFORE_START_TTL,
    ) -> RunRecord | None:
        """Record a cancel request for ``task_id`` (any process may hold the run).

        Returns the run as it is right after the request: ``cancelled`` for a ``pending`` run,
        ``cancelling`` for a running one, unchanged for a final one. A run nobody works (its
        owner is gone, or it was released) is settled here by its policies and returned
        ``cancelled``; if that needs a compensation from a task not loaded in this process, it
        is returned ``cancelling``, left for a process that has the code.
        Raises :class:`~haltwise.UnknownRunError` for an unknown id.

        ``before_start=True`` is a stop pressed before the run exists: for an id no run has
        yet, the cancel is remembered for ``ttl`` seconds (default 600) and None is returned; a
        run started or submitted with that id within that time is recorded ``cancelled`` at
        once (``pending -> cancelled``, this reason, nothing run), and :meth:`start` returns
        its handle. An id that exists is cancelled as usual. Raises
        :class:`~haltwise.InputError` for a ``ttl`` that is not a finite number of seconds > 0.
        """
        if not before_start:
            record = await self._seat.request_cancel(task_id, reason, force=force)
            return await self._after_cancel(record)
        _, remembered = await self._seat.cancel_before_start(
            [task_id], reason=reason, force=force, ttl=ttl
        )
        if remembered:
            return None
        # the run exists (it may have begun meanwhile): its cancel is recorded; deliver it here,
        # or settle the run if nobody works it, as for any cancel (asking again changes nothing)
        return await self.cancel(task_id, reason=reason, force=force)

    async def _cancel_own(
        self, task_id: str, *, reason: str, force: bool = False
    ) -> RunRecord | None:
        """A cancel this runtime makes of a run it works (its shutdown, a deadline of its start,
        the run cancelling itself); the run as it is afterwards.

        Recorded only while this runtime still holds the run. One that another process took
        over meanwhile (this one stalled past its lease: a long pause, a lost network) is not
        cancelled there, as a dead owner's would not be: it is only stopped here, where nothing
        it does can be written any more (None).
        """
        try:
            record = await self._seat.request_cancel(
                task_id, reason, force=force, fence=self.owner.token
            )
        except LostOwnershipError:
            ctx = self._active.get(task_id)
            if ctx is not None:
                ctx.request_cancel(reason, force=force)
            return None
        return await self._after_cancel(record)

    async def _after_cancel(self, record: _Cancelled) -> _Cancelled | RunRecord:
        """Deliver a recorded cancel here, or settle the run if nobody works it."""
        if self._deliver(record) or not self._orphaned(record):
            return record
        return await self._settle_orphan(record.id)

    def _deliver(self, record: RunRecord | CancelledRun) -> bool:
        """Deliver a recorded cancel to the run if it is worked here (False if it is not)."""
        ctx = self._active.get(record.id)
        if ctx is None:
            return False
        wanted = record.state in (State.CANCELLING, State.CANCELLED)
        if wanted and ctx.cancel.would_change(record.force):  # (the watcher may have been first)
            # cancelling: settle what is in flight; cancelled (it was paused): stop its task
            ctx.request_cancel(record.reason or "user", force=record.force)
        return True

    def _orphaned(self, run: Leased) -> bool:
        """A ``cancelling`` run that nobody works: released, or its owner is gone (a run this
        runtime holds is worked: working it, or taking it over right now)."""
        return nobody_works(run, self.owner.token)

    async def _settle_orphan(self, task_id: str) -> RunRecord:
        """Finish the cancel of a run nobody works, as a takeover would (CONTRACT.md, cancel):
        settle its steps by their policies, run its saga, record ``cancelled``; then cancel its
        child runs that were in flight, with reason ``"parent"`` (each settled here in turn if
        nobody works it either).

        A run whose task is not loaded here is settled only if that needs none of its code (no
        compensation to run, see :func:`~.explain.needs_code`); otherwise it is left
        ``cancelling`` for a process that has the code (a worker of its file takes it over)."""
        snapshot = await self.store.load(task_id)
        task = registered_task(snapshot.run)
        if task is None:
            if needs_code(snapshot):
                return snapshot.run
            task = stand_in_task(snapshot.run.task)  # steps settle by their journaled policies
        with contextlib.suppress(RunOwnedError):  # another process took it first: it finishes
            await self._adopt(task_id, task)
        # Its steps as settled, read after the claim: one its last owner started after
        # `snapshot` was read may hold a child too (see _take_over).
        settled = await self.store.load(task_id)
        children = [step.index for step in settled.steps if step.status in _MAY_HOLD_A_CHILD]
        for index in children:
            await self._cancel_child(task_id, f"{task_id}/{index}", force=settled.run.force)
        return (await self.store.load(task_id)).run if children else settled.run

    async def _cancel_child(self, parent: str, child_id: str, *, force: bool) -> None:
        """Cancel ``child_id`` with reason ``"parent"`` if it is an active child run of
        ``parent`` (the step may be any other tool: then there is no such run)."""
        try:
            child = (await self.store.load(child_id)).run
        except UnknownRunError:
            return
        if child.parent == parent and not child.state.is_final:
            await self.cancel(child_id, reason="parent", force=force)

    async def cancel_many(
        self,
        ids: Sequence[str] | None = None,
        *,
        task: str | None = None,
        state: State | str | None = None,
        reason: str = "user",
        force: bool = False,
        dry_run: bool = False,
    ) -> CancelBatch:
        """Cancel several runs in one transaction: the runs ``ids``, or (``ids=None``) every
        active run of ``task`` (a name as :meth:`list_runs` takes it) in ``state``.

        Each run is cancelled as by :meth:`cancel` (and a run nobody works is settled here);
        ``dry_run`` changes nothing and reports which runs would be cancelled.
        """
        result = await self._seat.request_cancels(
            ids, task=task, state=state, reason=reason, force=force, dry_run=dry_run
        )
        states: dict[str, State] = {}
        settled = []
        here = [] if dry_run else [record for record in result.reached if self.is_active(record.id)]
        if here:  # one callback of the event loop delivers them all (see outside_any_task)
            await outside_any_task(lambda: [self._deliver(record) for record in here])
        worked = {record.id for record in here}
        for record in result.reached:
            done = dry_run or record.id in worked
            after = record if done else await self._after_cancel(record)
            states[record.id] = after.state
            if self._orphaned(record) and after.state.is_final:
                settled.append(record.id)
        return cancel_batch(result, after=states, settled_here=settled, dry_run=dry_run)

    async def prune(
        self, older_than: float, *, state: State | str | None = None, dry_run: bool = False
    ) -> list[str]:
        """Delete the final runs that ended more than ``older_than`` seconds ago (with their
        steps, partial results and history) and return their ids; ``state`` narrows it to one
        final state. An active run is never deleted. ``dry_run`` deletes nothing."""
        return await self._seat.prune(older_than, state=state, dry_run=dry_run)

    # -- the read API ----------------------------------------------------------------------------

    async def inspect(self, task_id: str) -> RunDetail:
        """Run ``task_id`` in full: its outcome so far (steps, partials, retry advice), its owner
        and whether that owner is alive, its transitions with their times, and, while it is
        ``cancelling``, the steps it waits for with their policy and the grace left.
        Raises :class:`~haltwise.UnknownRunError` for an unknown id."""
        return await self._seat.inspect(task_id)

    async def list_runs(
        self,
        *,
        state: State | str | None = None,
        task: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        progress: bool = False,
    ) -> RunPage:
        """Up to ``limit`` runs, newest created first, in one query; ``page.next`` is the
        ``cursor`` of the next page (``None`` on the last). ``task`` is a name as the listing
        shows it (``agent.py:research``) or its bare function name when that is unambiguous.
        ``progress=True`` also counts each run's ``committed`` and journaled steps
        (:attr:`RunSummary.progress`: two more index probes a run, so only when asked)."""
        return await self._seat.list_runs(
            state=state, task=task, limit=limit, cursor=cursor, progress=progress
        )

    def changes(
        self, since: int | None = None, *, run_id: str | None = None
    ) -> AsyncIterator[Change]:
        """The journal's changes (transitions, step starts and settlements, partial results)
        committed after change number ``since``, in order, as they happen, by any process
        sharing the store; only run ``run_id``'s when given. Each :class:`Change` has a
        ``seq``: pass the last one seen as ``since`` to miss nothing (``0``: every change the
        store still holds).

        ``since=None`` starts at the feed's first iteration, not at this call: the first step
        of ``async for`` reads the newest change number, and only later changes are yielded
        (an async iterator reads nothing before it is iterated). To start at a known point,
        pass the ``seq`` of a change already seen."""
        return self._seat.changes(since, run_id=run_id)

    async def pause(self, task_id: str) -> RunRecord:
        """Ask run ``task_id`` to pause at its next checkpoint (any process may hold the run).

        Nothing is cancelled: steps in flight run to their end whatever their policy (the run
        stays ``running``, with ``pause`` set, until they have), then the run is ``paused``,
        waiting at that checkpoint with its owner, until :meth:`unpause` or a cancel (which ends
        it ``cancelled`` at once, unless it has something to settle: a child run paused with it,
        or an ``on_cancel="compensate"`` saga to run; it is then ``cancelling`` until its owner,
        or the canceller if nobody works it, has settled that). A ``pending`` run pauses at its
        first checkpoint once it runs. A parent's pause pauses its child runs in flight (and
        theirs): the parent is paused once they are, its child step still waiting for them;
        :meth:`unpause` of the parent unpauses them. Returns the run as it is right after the
        request; a run that is ``cancelling``, ``paused`` or final is left as it is. Raises
        :class:`~haltwise.UnknownRunError` for an unknown id.
        """
        return await self._pause(task_id)

    async def _pause(self, task_id: str, *, reason: str | None = None) -> RunRecord:
        """:meth:`pause`, recording ``reason`` (``"budget"``) as the run's while it lasts."""
        record = await self._seat.request_pause(task_id, reason=reason)
        ctx = self._active.get(task_id)
        if ctx is not None and record.pause and not ctx.pause.requested:
            ctx.pause.request()
            await relay_to_children(ctx)
        return record

    async def unpause(
        self,
        task_id: str,
        *,
        task: Task[..., Any] | None = None,
        budget: Budget | None = None,
    ) -> RunRecord:
        """Undo a pause: a ``paused`` run goes back to ``running`` and continues where it waits.

        ``budget`` raises the run's budget in the same write (a run paused with reason
        ``"budget"``): its limits replace the run's, those it leaves out stay. A run paused for
        its budget and unpaused with no limit raised pauses again at its next step.

        A paused run whose owner is gone (it died, or a worker handed the run over) is taken over
        and continued here from its journal, as :meth:`resume` does (``task`` defaults to the
        task registered under the run's name). A pause requested but not yet in effect is
        withdrawn. Any other run is left as it is. Returns the run as the unpause left it: a run
        taken over is returned as launched here (``running``, owned here), not as its code,
        already going on, may have changed it since.
        """
        snapshot = await self.store.load(task_id)
        run = snapshot.run
        if run.state is State.PAUSED and not (
            task_id in self._active or task_id in self._taking or held_by_live_owner(run)
        ):
            the_task = self._task_of(run, task)
            with self._one_owner(task_id):
                snapshot = await self._take_over(snapshot, the_task, {}, frozenset())
                if budget is not None:  # ours now: the unpause raises the budget as it goes on
                    await self._seat.request_unpause(task_id, budget=budget)
                    snapshot = await self.store.load(task_id)
                return await self._continue(snapshot, the_task, {}, frozenset(), None, None)
        record = await self._seat.request_unpause(task_id, budget=budget)
        ctx = self._active.get(task_id)
        if ctx is not None and budget is not None:
            ctx.set_budget(Budget.from_json(record.inputs.get("budget")))
        if ctx is not None and not record.pause:
            ctx.pause.lift()
            await relay_to_children(ctx)
        return record

    async def decide(
        self,
        id: str,
        step: int,
        approve: bool = True,
        edit: Mapping[str, Any] | None = None,
        by: str | None = None,
        note: str | None = None,
    ) -> ApprovalRecord:
        """Decide the approval request of step ``step`` of run ``id`` (CONTRACT.md, "Someone
        else decides"), from any process: approve it (``edit``: the arguments, by name, that
        the call runs with instead; the ones not named keep their value) or refuse it
        (``approve=False``). The decision is journaled with ``by``, the time and ``note``, and
        reaches the run's owner wherever it runs. A decision is used once: one on a request
        that is not awaiting (decided already, expired, cancelled, or no request at that step)
        raises :class:`~haltwise.ApprovalConflictError` naming what happened to it. Returns
        the request as decided. An edit is validated against the JSON schema of the tool's
        parameters recorded with the request (:class:`~haltwise.InputError` if it does not fit),
        in whatever process decides.
        """
        record = await self._seat.decide(id, step, approve=approve, edit=edit, by=by, note=note)
        woken(self.store, id, step)
        return record

    async def approvals(self, id: str | None = None) -> list[ApprovalRecord]:
        """The approval requests awaiting a decision in the store, oldest first; with ``id``,
        that run's requests in every state."""
        return await self._seat.approvals(id)

    async def approvals_json(self) -> str:
        """The requests awaiting a decision as JSON text: the object of ``GET /api/approvals``
        and ``haltwise list --awaiting --json``, ``{"approvals": [{"run", "step", "tool",
        "arguments", "requested_at", "timeout_at"}]}``, oldest first, built by the store in
        one query."""
        return await self._seat.pending_approvals_json()

    def is_paused(self, task_id: str) -> bool:
        """Whether run ``task_id`` is worked here and waiting in a pause."""
        ctx = self._active.get(task_id)
        return ctx is not None and ctx.pause.paused

    async def status(self, task_id: str) -> Outcome:
        """The run's outcome as journaled now (its state may not be final)."""
        return (await self.store.load(task_id)).outcome()

    async def outcome(self, task_id: str) -> Outcome:
        """Wait for the run to reach a final state and return its outcome.

        A ``cancelling`` run that nobody works any more (its owner died meanwhile, or released
        it) is settled here, as :meth:`cancel` would: waiting for it never hangs, unless its
        settling needs code this process has not loaded (a compensation), which a worker of its
        file then brings.

        Raises :class:`~haltwise.StoreError` if this runtime stopped working the run because
        its journal could not be written (a full disk, a lost database): every call raises it,
        until the run is resumed here. A run this runtime does not work is waited for until
        whoever works it records a final state.
        """
        ctx = self._active.get(task_id)
        if ctx is not None:
            await ctx.done.wait()
        broken = self._broken.get(task_id)
        if broken is not None:
            raise StoreError(
                f"run {task_id!r} stopped because its journal could not be written ({broken}); "
                "its last durable state stands: resume it once the store is usable",
                task_id=task_id,
            )
        while True:
            snapshot = await self.store.load(task_id)
            if snapshot.run.state.is_final:
                return snapshot.outcome()
            # its owner died while we waited: settle it here, if its code is at hand
            orphaned = self._orphaned(snapshot.run)
            if orphaned and (await self._settle_orphan(task_id)).state.is_final:
                continue
            await self.store.wait_for_change(0.5)

    def is_active(self, task_id: str) -> bool:
        """Whether this runtime is working run ``task_id`` right now."""
        return task_id in self._active

    def _worked_here(self, task_id: str) -> bool:
        """Whether this runtime works run ``task_id``, or stopped working it because its journal
        could not be written (:meth:`outcome` says so then)."""
        return task_id in self._active or task_id in self._broken

    def handle(self, task_id: str) -> TaskHandle:
        """A handle on run ``task_id`` (not checked until used)."""
        return TaskHandle(self, task_id)

    # -- ownership and takeover ----------------------------------------------------------------

    def _lease_until(self) -> float:
        return time.time() + self.lease

    def _lease_for(self, run_id: str) -> float:
        """The ``lease_until`` of a write that gives this runtime run ``run_id``; the moment
        it is taken (before the write) is when the run's lease surely holds from."""
        self._leased_at[run_id] = time.monotonic()
        return self._lease_until()

    async def _take(self, snapshot: RunSnapshot) -> bool:
        """Claim the run from the owner ``snapshot`` shows; False if it was ours already."""
        run = snapshot.run
        owner = run.owner
        if owner is not None and owner.token == self.owner.token:
            if run.id in self._leased_at:
                return False  # claimed for us already (a worker's claim_pending)
            # Ours, no longer worked (its journal failed under it): released, then claimed
            # afresh, so that its failed attempt's unwritten settlements are the store's past.
            await self.store.release(run.id, self.owner.token)
            owner = None
        if owner is not None and held_by_live_owner(run):
            raise RunOwnedError(run.id, owner.describe())
        claimed = await self.store.claim(
            run.id,
            self.owner,
            lease_until=self._lease_for(run.id),
            expected_owner=owner.token if owner else None,
        )
        if not claimed:
            raise RunOwnedError(run.id, "another process that took it over first")
        return True

    # -- driving a run --------------------------------------------------------------------------

    def _context(
        self,
        run_id: str,
        task: Task[..., Any],
        snapshot: RunSnapshot | None,
        assume_done: dict[int, Any],
        rerun: frozenset[int],
        probe: Probe | None = None,
        ended: int | None = None,
    ) -> RunContext:
        return RunContext.for_snapshot(
            snapshot,
            run_id=run_id,
            task=task,
            host=self._host,
            execute=execute_step,
            store=self.store,
            fence=self.owner.token,
            assume_done=assume_done,
            rerun=rerun,
            probe=probe,
            ended_by=ended,
        )

    def _require_entered(self) -> None:
        """Refuse to run anything before ``async with``: checked before any write, so that no
        run is left ``running`` in the journal, owned by this live process, that nobody works."""
        if self._task_group is None:
            raise HaltwiseError("use the Runtime as 'async with haltwise.Runtime(...) as rt:'")

    def _launch(self, ctx: RunContext, inputs: dict[str, Any], deadline: float | None) -> None:
        self._require_entered()
        assert self._task_group is not None
        if ctx.run_id in self._active:  # one owner of a run in a process (see _one_owner)
            raise RunOwnedError(ctx.run_id, f"this runtime ({self.owner.describe()})")
        self._broken.pop(ctx.run_id, None)  # worked again here: a new chance for its journal
        # A run leased here by a path that did not note when: its first body confirms it.
        ctx.held_until = self._leased_at.pop(ctx.run_id, -math.inf) + self.lease
        self._active[ctx.run_id] = ctx
        self.store.set_concurrency(len(self._active) + self._side_steps)
        ctx.open_trace()  # in the caller's context: its current span is the run span's parent
        self._launches += 1
        self._wake.set()
        self._task_group.start_soon(
            self._drive, ctx, inputs, deadline, name=f"haltwise run {ctx.run_id}"
        )

    async def _drive(self, ctx: RunContext, inputs: dict[str, Any], deadline: float | None) -> None:
        """Work the run: its task function, its steps settled, its final write.

        A final transition the store can submit with a callback (``Store.transition_then``)
        is not waited for here: this task ends at once, and the run's work here ends once the
        write is committed (:meth:`_written`). 10,000 runs cancelled together then leave no
        task, coroutine or context of theirs waiting for the commit, and none to wake up after.
        """
        ends_when_written = False
        try:
            if ctx.trace is not None:
                await self._keep_trace(ctx, ctx.trace)
            with spans.run_current(ctx.trace):
                if deadline is None:
                    ending = await call_task(ctx, inputs)
                else:
                    async with anyio.create_task_group() as timers:
                        timers.start_soon(self._deadline, ctx, deadline)
                        ending = await call_task(ctx, inputs)
                        timers.cancel_scope.cancel()
            written = await finish(ctx, ending, partial(self._on_written, ctx))
            del ending  # not kept while the final write waits (see finish)
            if written is None:
                ends_when_written = True
                return
            with shielded():
                await written
        except StoreError as error:
            await self._write_failed(ctx, error)
        finally:
            if not ends_when_written:
                self._stop_working(ctx)

    def _written(self, ctx: RunContext, _record: object, error: BaseException | None) -> None:
        """The final write :meth:`_drive` did not wait for is committed, or raised ``error``:
        then it is handled as :meth:`_drive` handles a failed write, in a task of its own
        (this is called from the store's commit, outside any task)."""
        if error is None:
            self._stop_working(ctx)
            return
        task = asyncio.get_running_loop().create_task(self._after_failed_write(ctx, error))
        self._handling.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(self._handling.discard)

    async def _after_failed_write(self, ctx: RunContext, error: BaseException) -> None:
        try:
            if isinstance(error, StoreError):
                await self._write_failed(ctx, error)
            else:  # raised into the runtime's task group, as out of _drive
                assert self._task_group is not None  # (__aexit__ waits for every run's end)
                self._task_group.start_soon(_raise, error)
        finally:
            self._stop_working(ctx)

    async def _write_failed(self, ctx: RunContext, error: StoreError) -> None:
        """A write of the run raised ``error``: the run is another's (it was taken over), or
        the journal could not be written (a full disk, a lost database). Then its last durable
        state stands, exactly as after a crash: a later resume takes it over."""
        if isinstance(error, LostOwnershipError):
            return  # another process took the run over; it is theirs to finish
        self._broken[ctx.run_id] = error
        with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
            await self.store.release(ctx.run_id, ctx.fence)

    async def _keep_trace(self, ctx: RunContext, trace: spans.RunTrace) -> None:
        """Keep this attempt's span context in the journal, and link its span to the previous
        attempt's (only while spans are recorded: one small write per attempt)."""
        try:
            earlier = await self.store.swap_trace(ctx.run_id, spans.trace_context(trace))
        except StoreError:
            return  # a link lost is no reason to stop a run; its own writes will say
        spans.link_earlier(trace, earlier)

    def _stop_working(self, ctx: RunContext) -> None:
        """The run is no longer worked here (its final write is committed, or it stopped)."""
        ctx.close_trace()
        if self._active.pop(ctx.run_id, None) is not None and ctx.cancel.reason is not None:
            CancelState.acting -= 1
        self.store.set_concurrency(len(self._active) + self._side_steps)
        ctx.done.set()

    async def _deadline(self, ctx: RunContext, seconds: float) -> None:
        """Cancel the run with reason ``"deadline"`` once ``seconds`` have passed.

        A cancel the store cannot record now (unreachable: a restarting database) is tried
        again every :data:`_STORE_RETRY` seconds for as long as the run is worked here, as the
        watcher retries its reads: the run goes on meanwhile (its own writes wait for the store,
        or fail and stop it as after a crash, which ends this task). The store's error never
        leaves this task: raised out of the run's task group into the runtime's, it used to end
        the runtime's block under its caller (a server's runs all cancelled with reason
        ``"shutdown"``, issue 28 item 6).
        """
        await anyio.sleep(seconds)
        while True:
            try:
                await self._cancel_own(ctx.run_id, reason="deadline")
                return
            except StoreError:
                await anyio.sleep(_STORE_RETRY)

    # -- the watcher: cross-process cancels and leases ----------------------------------------

    async def _watch(self) -> None:
        """Deliver other processes' cancel requests and renew leases, until the runtime ends.

        A store that is unreachable for a while (a lost database connection) is retried: the
        runs go on meanwhile, and their own writes wait for the store. A store that is gone for
        good (its file deleted or replaced) stops every run here at once: each ends with that
        error (see :meth:`outcome`), its last durable state standing.
        """
        # Every run this runtime works took a fresh lease as it was launched (``_lease_for``),
        # so the first renewal is due a third of a lease after the start (a renewal at once
        # rewrote every run row just created, in the middle of a burst of runs); after a store
        # error, at once.
        next_beat = time.time() + self.lease / 3
        while True:
            try:
                await self._watch_until_error(next_beat)
            except StoreGoneError:
                for ctx in list(self._active.values()):
                    ctx.request_cancel("store lost", force=True)  # its next write fails
                await anyio.sleep(_STORE_RETRY)
            except StoreError:
                await anyio.sleep(_STORE_RETRY)
            next_beat = 0.0

    async def _watch_until_error(self, next_beat: float) -> None:
        seen: int | None = None
        #: (the store's change count, runs launched here) when the watcher last read the
        #: requests; None: read at the next tick
        looked: tuple[int, int] | None = None
        while True:
            if not self._active:
                self._wake = anyio.Event()
                with anyio.move_on_after(self.lease / 3):
                    await self._wake.wait()
            was, seen = (
                seen,
                await self.store.wait_for_change(min(0.25, self.lease / 3), since=seen),
            )
            beat = time.time() >= next_beat
            if seen != was or beat:  # (at a heartbeat too: a wake-up lost is found then)
                await deliver_decisions(self.store)  # decided approval requests waited on here
            if self._active and (looked != (seen, self._launches) or beat):
                looked = (seen, self._launches)
                if not await self._deliver_requests():
                    looked = None
            if beat:
                next_beat = time.time() + self.lease / 3
                await self._heartbeat()

    async def _deliver_requests(self) -> bool:
        """Deliver the cancel and pause requests other processes recorded for the runs worked
        here; False if some could not be acted on now (the watcher reads them again next tick).

        The watcher calls it only when the store may hold something new for them: it saw a
        commit of another connection (or cannot tell), a run was launched here since it last
        read, or a heartbeat is due (a safety net: at least every ``lease / 3`` seconds). So an
        idle process with many runs waiting reads nothing per tick. The cancels are delivered
        from one callback of the event loop (see :func:`~.cancel_state.outside_any_task`).
        """
        # The runs whose cancel is acted on here already (a reason recorded): only a forced
        # request of theirs may be news, and the store passes the others by (10,000 just
        # cancelled here, none news).
        acting = (
            [run_id for run_id, ctx in self._active.items() if ctx.cancel.reason is not None]
            if CancelState.acting > 0
            else []
        )
        requests = await self.store.cancel_requests(self._active.keys(), acting=acting)
        due = [
            (ctx, reason, force)
            for run_id, (reason, force) in requests.items()
            if (ctx := self._active.get(run_id)) is not None and ctx.cancel.would_change(force)
        ]

        def deliver() -> None:
            for ctx, reason, force in due:
                if ctx.cancel.would_change(force):  # (an in-process cancel may have been first)
                    ctx.request_cancel(reason, force=force)

        if due:
            await outside_any_task(deliver)
        return await deliver_pause_signals(self.store, self._active)

    async def _heartbeat(self) -> None:
        """Renew the lease of every run this runtime holds.

        A run's ``held_until`` moves on only if its lease still held when the renewal was
        confirmed: after a stall past it (this process stopped, or its heartbeats failed), the
        run may be another's, and its next step body waits for ``confirm_held``.
        """
        since = time.monotonic()
        await self.store.heartbeat(self.owner.token, self._lease_until())
        confirmed = time.monotonic()
        held_until = since + self.lease
        for ctx in self._active.values():
            if confirmed < ctx.held_until < held_until:
                ctx.held_until = held_until


@final
class RuntimeHost:
    """A :class:`Runtime` as the runs it works see it (the :class:`~.run_context.RunHost`
    protocol): start a child, cancel, pause or unpause a run, a run's pause gate, how many runs
    and side steps are active."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def active_runs(self) -> int:
        return self._runtime._active_runs

    def count_side_steps(self, delta: int) -> None:
        self._runtime._count_concurrent_steps(delta)

    async def confirm_held(self, run: RunContext) -> None:
        runtime = self._runtime
        owner = runtime.owner
        since = time.monotonic()
        held = await runtime.store.claim(
            run.run_id, owner, lease_until=runtime._lease_until(), expected_owner=owner.token
        )
        if not held:
            raise LostOwnershipError(
                f"run {run.run_id!r} is no longer held by this process", task_id=run.run_id
            )
        run.held_until = max(run.held_until, since + runtime.lease)

    async def cancel(self, task_id: str, *, reason: str, force: bool = False) -> RunRecord | None:
        """A run worked here is cancelled as this runtime's own act (see ``_cancel_own``);
        any other as by anyone (``Runtime.cancel``)."""
        runtime = self._runtime
        if runtime.is_active(task_id):
            return await runtime._cancel_own(task_id, reason=reason, force=force)
        return await runtime.cancel(task_id, reason=reason, force=force)

    async def pause(self, task_id: str, *, reason: str | None = None) -> RunRecord:
        return await self._runtime._pause(task_id, reason=reason)

    async def unpause(self, task_id: str) -> RunRecord:
        return await self._runtime.unpause(task_id)

    def pause_gate(self, task_id: str) -> PauseGate | None:
        ctx = self._runtime._active.get(task_id)
        return None if ctx is None else ctx.pause

    def run_of(self, task_id: str) -> RunContext | None:
        return self._runtime._active.get(task_id)

    async def stopped(self, task_id: str) -> None:
        ctx = self._runtime._active.get(task_id)
        if ctx is not None:
            await ctx.done.wait()

    async def start_child(
        self,
        task: RunTask,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        child_id: str,
        parent: str,
    ) -> TaskHandle:
        """Start child run ``child_id`` of ``parent``, or pick it up where it stopped.

        Only a run that ``parent`` created is picked up: a run with that id started by anyone
        else (a user-given id such as ``p2/0``) raises :class:`~haltwise.HaltwiseError`.
        """
        runtime = self._runtime
        task = cast("Task[..., Any]", task)  # a child step's task is a Task (see tool.Task)
        # A worker's scan may be taking the child over as an orphan right now: it is driven by
        # that path alone, and this parent waits for it (below, as for any child worked here).
        await runtime._taken_here(child_id)
        try:
            snapshot = await runtime.store.load(child_id)
        except UnknownRunError:
            return await runtime._start_named(task, args, kwargs, task_id=child_id, parent=parent)
        if snapshot.run.parent != parent:
            raise HaltwiseError(
                f"run {child_id!r} exists and was not created by run {parent!r}: "
                "it cannot be adopted as that run's child",
                task_id=parent,
            )
        if runtime.is_active(child_id):
            return TaskHandle(runtime, child_id)
        if snapshot.run.state is State.COMPLETED:
            return TaskHandle(runtime, child_id)
        return await runtime.resume(child_id, task=task)


def _hand_over_here(ctx: RunContext) -> None:
    """Tell the run to stop here without being cancelled: its steps in flight settle by their
    policies, then it is released (see :meth:`Runtime._hand_over`)."""
    ctx.cancel.begin_hand_over()
    ctx.request_cancel("handover", force=False)


#: the statuses of a child step whose child run may still be active (in flight; interrupted by a
#: hand-over, which hands the child over too; forced)
_MAY_HOLD_A_CHILD = frozenset({StepStatus.RUNNING, StepStatus.INTERRUPTED, StepStatus.UNKNOWN})


#: seconds between two tries of a runtime task's write or read the store failed (unreachable)
_STORE_RETRY = 0.5


async def _raise(error: BaseException) -> None:
    raise error


def _add_budget(inputs: dict[str, Any], task: Task[..., Any], budget: Budget | None) -> None:
    """Keep the run's budget (``budget``, else its task's) in its inputs, where every process
    that loads the run finds it."""
    if budget is None:
        budget = task.budget
    elif not isinstance(budget, Budget):
        raise InputError(f"budget must be a haltwise.Budget, not {budget!r}")
    if budget is not None:
        inputs["budget"] = budget.limit_json()


def same_call(
    existing: RunRecord, task: str, inputs: dict[str, Any], *, parent: str | None = None
) -> None:
    """A start with an id that exists returns that run only for the same task and inputs
    (CONTRACT.md, "Python API"); otherwise :class:`~haltwise.IdempotencyConflictError`.

    ``inputs`` as the journal keeps them (JSON); where the task's file was loaded from is not
    part of the call. A child run (``parent``) is matched by its id alone: its parent's journal
    already says which call it is.
    """
    if parent is not None:
        return
    if existing.task != task:
        raise IdempotencyConflictError(existing.id, f"another task ({existing.task})")

    def call(values: dict[str, Any]) -> tuple[Any, Any]:
        return values.get("args", []), values.get("kwargs", {})

    if call(existing.inputs) != call(inputs):
        raise IdempotencyConflictError(existing.id, "other inputs")


def _check_deadline(deadline: float | None) -> None:
    if deadline is None:
        return
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise InputError("deadline must be a number of seconds")
    if not deadline > 0 or math.isinf(deadline):
        raise InputError(f"deadline must be a finite number of seconds > 0, not {deadline}")


def _check_step_indexes(
    task_id: str, snapshot: RunSnapshot, done: Mapping[int, Any], again: frozenset[int]
) -> None:
    known = {step.index: step for step in snapshot.steps}
    for index in (*done, *again):
        if index not in known:
            raise InputError(f"run {task_id!r} has no step {index}", task_id=task_id)
        if known[index].status is StepStatus.COMMITTED:
            raise InputError(
                f"run {task_id!r}: step {index} ({known[index].tool}) is already committed",
                task_id=task_id,
            )
    both = set(done) & again
    if both:
        raise InputError(f"step {min(both)} cannot be both assumed done and rerun", task_id=task_id)
    for index in done:
        dump_json(done[index], f"the assumed result of step {index}")
