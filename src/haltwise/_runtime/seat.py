"""The operator's seat: what a process that works no run may read of the journal and ask of it.

A :class:`Seat` over a store offers the read API (:meth:`~Seat.inspect`, :meth:`~Seat.list_runs`,
:meth:`~Seat.changes`) and the requests (cancel, pause, unpause, prune), and nothing that works
a run: opening one starts no watcher and takes no owner, and this module imports neither the step
executor nor the takeover, so that a command that only reads or requests (``haltwise cancel ID``,
``status``, ``list``, ``pause``) starts in a fraction of the time a :class:`~haltwise.Runtime`
takes. The runtime makes its own requests through a seat, so every rule here has one home.

What a seat cannot do is settle a run that nobody works (:func:`nobody_works`): that takes the
runtime's takeover (:meth:`~haltwise.Runtime.cancel` of such a run settles it by its policies).
The faces (command line, server) reach the journal only through a seat or a runtime; the few
journal words they need (a URL's default and its form without password, whether a run is held
by a live owner) are re-exported here.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, final

from .._core.approvals import (
    ApprovalRecord,
    ApprovalState,
    check_decidable,
    check_edit,
    decided_state,
)
from .._core.budget import Budget
from .._core.exceptions import InputError, NoStoreError
from .._core.records import MAX_STEP, RunRecord, dump_json
from .._core.states import State
from .._core.views import Change, RunDetail, RunPage
from .._journal import open_store, store_url_from
from .._journal.operator_sql import is_high_water
from .._journal.owner import held_by_live_owner
from .._journal.secrets import safe_url, scrub
from .._journal.store import CancelResult, Store
from .operator import feed, inspect_run, page_of_runs, parse_state, resolve_task
from .seat_now import cancel_batch, check_no_nul, check_reason, nobody_works

if TYPE_CHECKING:
    from .._journal.check import CheckReport

__all__ = [
    "DEFAULT_BEFORE_START_TTL",
    "CancelResult",
    "Seat",
    "cancel_batch",
    "check_journal",
    "check_no_nul",
    "check_reason",
    "check_ttl",
    "held_by_live_owner",
    "nobody_works",
    "open_seat",
    "reading",
    "safe_url",
    "scrub",
    "store_url_from",
]


@final
class Seat:
    """The read API and the requests over one open store (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def inspect(self, task_id: str) -> RunDetail:
        """Run ``task_id`` in full (see :meth:`haltwise.Runtime.inspect`)."""
        return await inspect_run(self._store, task_id)

    async def list_runs(
        self,
        *,
        state: State | str | None = None,
        task: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        progress: bool = False,
    ) -> RunPage:
        """A page of runs, newest created first (see :meth:`haltwise.Runtime.list_runs`)."""
        return await page_of_runs(
            self._store, state=state, task=task, limit=limit, cursor=cursor, progress=progress
        )

    def changes(
        self, since: int | None = None, *, run_id: str | None = None
    ) -> AsyncIterator[Change]:
        """The journal's changes (see :meth:`haltwise.Runtime.changes`)."""
        return feed(self._store, since, None if run_id is None else {run_id})

    async def changes_between(
        self, after: int, upto: int, *, limit: int
    ) -> tuple[list[Change], int | None]:
        """A bounded read of the past, where :meth:`changes` follows the journal for ever: up to
        ``limit`` changes numbered above ``after`` and at most ``upto``, ascending (high-water
        marks left out), and the number to read after next (``None``: nothing is left)."""
        batch, _ = await self._store.changes_after(after, limit=limit)
        inside = [change for change in batch if change.seq <= upto]
        more = len(inside) == len(batch) == limit
        return [c for c in inside if not is_high_water(c)], inside[-1].seq if more else None

    async def last_change(self) -> int:
        """The number of the journal's latest change (0 if none)."""
        return await self._store.last_change()

    async def delivery_position(self, destination: str) -> int | None:
        """The last change ``destination`` acknowledged (``haltwise events``); None if none."""
        return await self._store.delivery_position(destination)

    async def save_delivery_position(self, destination: str, position: int) -> None:
        """Record durably that every change up to ``position`` reached ``destination``."""
        await self._store.save_delivery_position(destination, position)

    async def wait_for_change(self, timeout: float, since: int | None = None) -> int:
        """Wait up to ``timeout`` seconds for the journal to change after mark ``since``; return
        the mark to pass next time (``None`` the first time: waits for any change from now)."""
        return await self._store.wait_for_change(timeout, since=since)

    async def request_cancel(
        self, task_id: str, reason: str, *, force: bool, fence: str | None = None
    ) -> RunRecord:
        """Record a cancel of one run (see :meth:`haltwise.Runtime.cancel`); the run as it is
        right after. Delivering it to a run worked here, or settling an orphan, is the caller's.
        ``fence``: only while that owner holds the run (see :meth:`Store.request_cancel`)."""
        check_reason(reason)
        check_no_nul(task_id, "a run id")
        return await self._store.request_cancel(task_id, reason, force=force, fence=fence)

    async def remember_cancel(self, task_id: str, reason: str, ttl: float) -> bool:
        """Remember a cancel of ``task_id`` for ``ttl`` seconds, before its run exists (see
        :meth:`haltwise.Runtime.cancel` with ``before_start``); False if the run exists."""
        check_reason(reason)
        check_no_nul(task_id, "a run id")
        check_ttl(ttl)
        return await self._store.remember_cancel(task_id, reason, time.time() + ttl)

    async def cancel_before_start(
        self, ids: Sequence[str], *, reason: str, force: bool, ttl: float
    ) -> tuple[CancelResult, tuple[str, ...]]:
        """A stop pressed before the runs ``ids`` may exist (``cancel --before-start``, see
        :meth:`haltwise.Runtime.cancel`): the cancel of those that exist is recorded as usual
        (:meth:`request_cancels`, one transaction); each id no run has is remembered for ``ttl``
        seconds (:meth:`remember_cancel`); an id whose run began in between (its cancel could
        not be remembered: the run exists now) is cancelled as usual too, in a second request.

        Returns the requests' result, whose ``unknown`` holds only ids that were neither
        cancelled nor remembered (a run that began and was pruned meanwhile), and the ids
        remembered. Delivering the cancels, or settling a run nobody works, is the caller's."""
        check_ttl(ttl)
        result = await self.request_cancels(ids, reason=reason, force=force)
        remembered: list[str] = []
        began: list[str] = []
        for run_id in result.unknown:
            remembering = await self.remember_cancel(run_id, reason, ttl)
            (remembered if remembering else began).append(run_id)
        if not began:
            return replace(result, unknown=()), tuple(remembered)
        again = await self.request_cancels(began, reason=reason, force=force)
        merged = CancelResult(
            reached=result.reached + again.reached,
            already_final=result.already_final + again.already_final,
            unknown=again.unknown,
        )
        return merged, tuple(remembered)

    async def request_cancels(
        self,
        ids: Sequence[str] | None = None,
        *,
        task: str | None = None,
        state: State | str | None = None,
        reason: str = "user",
        force: bool = False,
        dry_run: bool = False,
    ) -> CancelResult:
        """Record the cancel of several runs in one transaction (see
        :meth:`haltwise.Runtime.cancel_many`, which also settles the runs nobody works)."""
        check_reason(reason)
        chosen = parse_state(state)
        if chosen is not None and chosen.is_final:
            raise InputError(f"a {chosen} run cannot be cancelled: name an active state")
        if ids is not None and (task is not None or chosen is not None):
            raise InputError("name runs by id, or by task and state, not both")
        for text in [*(ids or ()), task or ""]:
            check_no_nul(text, "a run id or task name")
        tasks = None if task is None else await resolve_task(self._store, task)
        return await self._store.request_cancels(
            ids=None if ids is None else list(dict.fromkeys(ids)),
            states=() if chosen is None else (chosen,),
            tasks=tasks,
            reason=reason,
            force=force,
            dry_run=dry_run,
        )

    async def approvals(self, task_id: str | None = None) -> list[ApprovalRecord]:
        """The pending approval requests, oldest first; with ``task_id``, that run's requests
        in every state."""
        return await self._store.approvals(task_id)

    async def pending_approvals_json(self) -> str:
        """The object of ``GET /api/approvals`` as JSON text (see
        :meth:`~haltwise._journal.store.Store.pending_approvals_json`)."""
        return await self._store.pending_approvals_json()

    async def decide(
        self,
        task_id: str,
        step: int,
        *,
        approve: bool,
        edit: Mapping[str, Any] | None = None,
        by: str | None = None,
        note: str | None = None,
    ) -> ApprovalRecord:
        """Decide the approval request of step ``step`` (see :meth:`haltwise.Runtime.decide`)."""
        check_no_nul(task_id, "a run id")
        if edit is not None and not approve:
            raise InputError("an edit goes with an approval, not a refusal", task_id=task_id)
        if edit is not None and not isinstance(edit, Mapping):
            raise InputError("the edit must be a JSON object of arguments", task_id=task_id)
        for text, what in ((by, "by"), (note, "a note")):
            if text is not None:
                check_no_nul(text, what)
        # (a step past the journal's numbers has no request: see MAX_STEP)
        in_range = isinstance(step, int) and 0 <= step <= MAX_STEP
        current = await self._store.approval(task_id, step) if in_range else None
        if current is None:
            await self._store.load(task_id)  # an unknown run: UnknownRunError
        check_decidable(task_id, step, current)
        assert current is not None
        run = (await self._store.load(task_id)).run
        if run.state.is_final:
            # Its owner was gone when the run ended (a cancel settled by the canceller): the
            # request ends with its run, durably, and no decision applies.
            record, _ = await self._store.decide_approval(
                task_id, step, ApprovalState.CANCELLED, by=None, note=None, edited=None
            )
            check_decidable(task_id, step, record)
        edited = None
        if edit is not None:
            merged = {**current.arguments, **edit}
            schema = await self._store.approval_schema(task_id, step)
            if schema is not None:  # (a request made before schema 18 has none)
                check_edit(current.tool, schema, merged)
            edited = dump_json(merged, "the edited arguments")
        record, won = await self._store.decide_approval(
            task_id, step, decided_state(approve, edit), by=by, note=note, edited=edited
        )
        if not won:
            check_decidable(task_id, step, record)  # raises: another decision came first
        assert record is not None
        return record

    async def request_pause(self, task_id: str, *, reason: str | None = None) -> RunRecord:
        """Record a pause request (see :meth:`haltwise.Runtime.pause`); the run right after.
        ``reason`` (``"budget"``) is the run's reason while the pause lasts."""
        check_no_nul(task_id, "a run id")
        return await self._store.request_pause(task_id, reason=reason)

    async def request_unpause(self, task_id: str, *, budget: Budget | None = None) -> RunRecord:
        """Withdraw a pause, or record ``paused -> running`` (see
        :meth:`haltwise.Runtime.unpause`, which also continues a paused orphan). ``budget``
        raises the run's budget in the same write: its limits replace the run's (those it
        leaves out stay)."""
        check_no_nul(task_id, "a run id")
        if budget is None:
            return await self._store.request_unpause(task_id)
        if not isinstance(budget, Budget):
            raise InputError(f"budget must be a haltwise.Budget, not {budget!r}")
        snapshot = await self._store.load(task_id)
        current = Budget.from_json(snapshot.run.inputs.get("budget"))
        raised = budget if current is None else current.raised(budget)
        return await self._store.request_unpause(task_id, budget=raised.limit_json())

    async def prune(
        self, older_than: float, *, state: State | str | None = None, dry_run: bool = False
    ) -> list[str]:
        """Delete old final runs (see :meth:`haltwise.Runtime.prune`); their ids."""
        if isinstance(older_than, bool) or not isinstance(older_than, int | float):
            raise InputError("older_than must be a number of seconds")
        if not older_than >= 0 or math.isinf(older_than):
            raise InputError(
                f"older_than must be a finite number of seconds >= 0, not {older_than}"
            )
        chosen = parse_state(state)
        if chosen is not None and not chosen.is_final:
            raise InputError(f"prune deletes final runs only, not {chosen} ones")
        return await self._store.prune(
            ended_before=time.time() - older_than,
            states=() if chosen is None else (chosen,),
            dry_run=dry_run,
        )


@asynccontextmanager
async def open_seat(url: str | None) -> AsyncIterator[Seat]:
    """A seat over the store at ``url`` (created if there is none), closed on exit."""
    store = open_store(url, works_runs=False)
    await store.open()
    try:
        yield Seat(store)
    finally:
        await _close(store)


@asynccontextmanager
async def reading(url: str | None) -> AsyncIterator[Seat | None]:
    """A seat over the store at ``url`` opened read-only, for a command that only looks.

    Reading never creates a store, nor waits behind another process's write lock; ``None``
    when there is no store there (a mistyped path), which the command then says.
    """
    store = open_store(url, read_only=True, works_runs=False)
    try:
        await store.open()
    except NoStoreError:
        yield None
        return
    try:
        yield Seat(store)
    finally:
        await _close(store)


async def _close(store: Store) -> None:
    import anyio

    with anyio.CancelScope(shield=True):
        await store.close()


async def check_journal(url: str | None) -> CheckReport:
    """``haltwise check``: verify the store at ``url`` (see :func:`haltwise.verify_store`)."""
    from .._journal.check import check_store

    return await check_store(url)


#: how long a cancel pressed before its run exists is remembered (``cancel --before-start``)
DEFAULT_BEFORE_START_TTL = 600.0


def check_ttl(ttl: object) -> None:
    """How long a cancel is remembered before its run exists: a finite number of seconds > 0."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise InputError(f"ttl must be a finite number of seconds > 0, not {ttl!r}")
