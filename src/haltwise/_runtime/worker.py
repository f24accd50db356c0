"""A worker: works pending runs of its tasks and takes over runs whose owner is gone.

Several workers, in several processes or on several machines, can share one store: a pending
run is claimed by exactly one of them (the store's ``claim_pending`` is atomic; on PostgreSQL
``FOR UPDATE SKIP LOCKED``), and a run whose owner died is taken over by exactly one (an
owner compare-and-set). Stopping a worker hands its runs over instead of cancelling them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from .._core.exceptions import (
    BadRow,
    CorruptRowError,
    InputError,
    RunOwnedError,
    StoreError,
    UnknownRunError,
)
from .._core.outcome import Outcome
from .._core.records import RunRecord
from .._core.states import State
from .._journal.owner import owner_alive
from . import lowlevel
from .runtime import Runtime, TaskHandle
from .tool import Task

#: How often (seconds) a worker looks for work when the store shows no change.
POLL_INTERVAL = 0.5
#: The least time (seconds) between two looks for runs whose owner is gone.
ORPHAN_SCAN_INTERVAL = 0.25


class Worker:
    """Works the runs of ``tasks`` (a mapping from the names runs record to the tasks).

    At most ``concurrency`` runs at a time. :meth:`serve` returns once ``stop`` is set and
    every run it holds has been handed over (see :func:`.lowlevel.hand_over`).
    """

    def __init__(
        self,
        runtime: Runtime,
        tasks: Mapping[str, Task[..., Any]],
        *,
        concurrency: int = 4,
        on_hand_over: Callable[[int], None] | None = None,
        on_bad_row: Callable[[BadRow], None] | None = None,
        on_run: Callable[[str, Outcome | None], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise InputError("concurrency must be at least 1")
        self.runtime = runtime
        self.tasks = dict(tasks)
        self.concurrency = concurrency
        #: called with the number of runs being handed over, once they were told to stop
        self.on_hand_over = on_hand_over
        #: called once for each journal row that does not parse: the worker skips its run
        self.on_bad_row = on_bad_row
        #: called with a run's id and None when this worker starts working it (a pending run
        #: claimed, or a run taken over), and with its outcome once it has ended here
        self.on_run = on_run
        self._bad_rows: set[BadRow] = set()
        self.handles: dict[str, TaskHandle] = {}
        self._next_scan = 0.0

    async def serve(self, stop: anyio.Event) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._loop, stop)
            await stop.wait()
            group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            stopping = lowlevel.begin_hand_over(self.runtime)
            if self.on_hand_over is not None:
                self.on_hand_over(stopping)
            await lowlevel.hand_over(self.runtime)

    async def _loop(self, stop: anyio.Event) -> None:
        store = self.runtime.store
        seen: int | None = None
        while not stop.is_set():
            try:
                await self.work_once()
                seen = await store.wait_for_change(POLL_INTERVAL, since=seen)
            except StoreError:
                # The store is unreachable for now (a lost connection): try again shortly.
                # Runs held here go on; their writes wait for the store.
                await anyio.sleep(POLL_INTERVAL)

    def _busy(self) -> int:
        """How many of the ``concurrency`` slots are taken: a paused run holds none (it keeps
        its owner, this worker, but only waits)."""
        self.handles = {
            run_id: handle
            for run_id, handle in self.handles.items()
            if self.runtime.is_active(run_id)
        }
        return sum(not self.runtime.is_paused(run_id) for run_id in self.handles)

    async def work_once(self) -> None:
        """Claim what there is room for: orphaned runs first, then pending ones.

        Looking for orphans reads every active run of the store, so it is done at most every
        ``ORPHAN_SCAN_INTERVAL`` seconds; pending runs are claimed on every change.
        """
        await self._report_ended()
        now = time.monotonic()
        if self._busy() < self.concurrency and now >= self._next_scan:
            self._next_scan = now + ORPHAN_SCAN_INTERVAL
            for run_id in await self._orphans():
                if self._busy() >= self.concurrency:
                    return
                await self._adopt(run_id)
        free = self.concurrency - self._busy()
        if free <= 0:
            return
        leased_at = time.monotonic()
        claimed = await self._readable(
            self.runtime.store.claim_pending(
                self.runtime.owner,
                self.tasks,
                lease_until=time.time() + self.runtime.lease,
                limit=free,
            )
        )
        for record in claimed:
            lowlevel.claimed(self.runtime, record.id, leased_at)
            await self._adopt(record.id)

    async def _report_ended(self) -> None:
        """Tell :attr:`on_run` of each run worked here that has ended since the last look."""
        if self.on_run is None:
            return
        for run_id, handle in list(self.handles.items()):
            if not self.runtime.is_active(run_id):
                del self.handles[run_id]
                try:
                    outcome: Outcome | None = await handle.status()
                except (UnknownRunError, CorruptRowError):
                    outcome = None  # pruned meanwhile, or unreadable: `check` says which
                self.on_run(run_id, outcome)

    async def _orphans(self) -> list[str]:
        store = self.runtime.store
        found = []
        for state in (State.CANCELLING, State.RUNNING, State.PAUSED, State.PENDING):
            for run in await self._readable(store.list_runs(state)):
                if run.task not in self.tasks or self.runtime.is_active(run.id):
                    continue
                if run.owner is None:
                    # Handed over (running, paused), or never claimed (pending: claim_pending's
                    # job).
                    if state is not State.PENDING:
                        found.append(run.id)
                elif run.owner.token == self.runtime.owner.token:
                    found.append(run.id)  # ours, no longer worked: its journal failed under it
                elif not owner_alive(run.owner, run.lease_until):
                    found.append(run.id)  # includes a pending run claimed by a worker that died
        return found

    async def _readable(self, listing: Awaitable[list[RunRecord]]) -> list[RunRecord]:
        """The runs of a listing whose rows parse; the others are reported and skipped.

        A claimed run whose row does not parse stays claimed by this worker (so that it does
        not hold up the queue); ``check`` reports it, and it is worked once its row is mended.
        """
        try:
            return await listing
        except CorruptRowError as error:
            self._skip(error)
            return list(error.readable)

    def _skip(self, error: CorruptRowError) -> None:
        for row in error.rows:
            if row not in self._bad_rows:
                self._bad_rows.add(row)
                if self.on_bad_row is not None:
                    self.on_bad_row(row)

    async def _adopt(self, run_id: str) -> None:
        try:
            snapshot = await self.runtime.store.load(run_id)
            handle = await lowlevel.adopt(self.runtime, run_id, self.tasks[snapshot.run.task])
        except (RunOwnedError, UnknownRunError):
            return  # another worker was quicker
        except CorruptRowError as error:
            self._skip(error)
            return
        if handle is not None:
            self.handles[run_id] = handle
            if self.on_run is not None:
                self.on_run(run_id, None)
