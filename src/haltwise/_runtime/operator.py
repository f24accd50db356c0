"""The read API's helpers: task names as typed, pages of runs, one run in full, the change feed.

:class:`~haltwise.Runtime` exposes these as ``list_runs``, ``inspect`` and ``changes``; they read
the journal only through the :class:`~haltwise._journal.store.Store` interface.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._core.exceptions import InputError
from .._core.outcome import Outcome
from .._core.policy import OnCancel
from .._core.records import RunRecord
from .._core.states import State
from .._core.views import Change, RunDetail, RunPage, StepWait
from .._journal.operator_sql import decode_cursor, encode_cursor, is_high_water
from .._journal.owner import owner_alive
from .._journal.store import Store
from .code import changed_now
from .explain import (
    cancel_requested_at,
    needs_code,
    retry_words,
    stays_cancelling,
    waiting_for,
)
from .seat_now import nobody_works

if TYPE_CHECKING:
    from .tool import Task

__all__ = [
    "feed",
    "inspect_run",
    "page_of_runs",
    "parse_state",
    "registered_task",
    "resolve_task",
    "stand_in_task",
]

#: How many changes one read of the feed fetches at most.
_FEED_BATCH = 500
#: How long the feed waits for the store to show a change before it looks anyway (seconds): a
#: PostgreSQL store notifies transitions at once, but not every step write.
_FEED_POLL = 0.1
#: A change numbered past a gap is held back this long (seconds of the database's clock after
#: its commit), in case the missing numbers belong to transactions still committing (on
#: PostgreSQL numbers are taken in insert order, commits land in any order). A gap older than
#: this is a rolled-back write or a pruned run: the feed goes on past it.
_GAP_WAIT = 0.5


def parse_state(state: State | str | None) -> State | None:
    """``state`` as a :class:`State`; :class:`InputError` naming the states if it is none."""
    if state is None or isinstance(state, State):
        return state
    try:
        return State(state)
    except ValueError:
        names = ", ".join(member.value for member in State)
        raise InputError(f"unknown state {state!r}: expected one of {names}") from None


async def resolve_task(store: Store, name: str) -> list[str]:
    """The recorded task names ``name`` stands for (CONTRACT.md, ``list --task``).

    A name as ``list`` shows it (``agent.py:research``) stands for itself; a bare function name
    (``research``) for the one recorded name that ends in it. Two such names are ambiguous
    (:class:`InputError` naming them); a name no run records matches nothing.
    """
    names = await store.task_names()
    if name in names:
        return [name]
    matches = sorted(known for known in names if known.rpartition(":")[2] == name)
    if len(matches) > 1:
        raise InputError(f"task {name!r} is ambiguous: it may be {', '.join(matches)}")
    return matches


#: The largest page a listing may ask for (a 20-digit limit overflowed the store's integer).
MAX_LIMIT = 1_000_000_000


async def page_of_runs(
    store: Store,
    *,
    state: State | str | None,
    task: str | None,
    limit: int,
    cursor: str | None,
    progress: bool = False,
) -> RunPage:
    """One page of runs, newest created first, and the cursor of the next (one query); with
    ``progress``, each run's committed and journaled steps counted (``RunSummary.progress``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InputError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit!r}")
    chosen = parse_state(state)
    tasks = None if task is None else await resolve_task(store, task)
    before = None if cursor is None else decode_cursor(cursor)
    rows = await store.run_page(
        states=() if chosen is None else (chosen,),
        tasks=tasks,
        limit=limit + 1,
        before=before,
        progress=progress,
    )
    runs = tuple(rows[:limit])
    more = len(rows) > limit
    last = runs[-1] if runs else None
    return RunPage(
        runs=runs, next=encode_cursor(last.created_at, last.id) if more and last else None
    )


async def inspect_run(store: Store, run_id: str) -> RunDetail:
    """The run with its steps, partials, history, owner (alive or not) and what it waits for."""
    journal = await store.inspect(run_id)
    run = journal.snapshot.run
    outcome = journal.snapshot.outcome()
    if outcome.code is not None:  # whether the file is still the one the run recorded
        outcome = replace(outcome, code=replace(outcome.code, changed=changed_now(outcome.code)))
    now = time.time()
    waiting: tuple[StepWait, ...] = ()
    stays = None
    if run.state is State.CANCELLING:
        waiting = waiting_for(
            outcome.steps,
            journal.step_times,
            requested_at=cancel_requested_at(journal.events),
            forced=run.force,
            now=now,
        )
        orphan = nobody_works(run) and registered_task(run) is None
        if orphan and needs_code(journal.snapshot):
            stays = stays_cancelling(run)
    return RunDetail(
        run=run,
        outcome=outcome,
        owner=run.owner,
        owner_alive=run.owner is not None and owner_alive(run.owner, run.lease_until),
        forced=run.force,
        events=journal.events,
        step_times=journal.step_times,
        waiting=waiting,
        retry_why=retry_words(outcome, "api") if run.state.is_final else _if_now(outcome),
        created_at=run.created_at,
        updated_at=run.updated_at,
        stays_cancelling=stays,
        approvals={record.index: record for record in await store.approvals(run_id)},
    )


def _if_now(outcome: Outcome) -> str:
    return f"the run is still active; if it stopped now: {retry_words(outcome, 'api')}"


async def feed(
    store: Store, since: int | None, run_ids: Collection[str] | None
) -> AsyncIterator[Change]:
    """Every change committed after change ``since`` (after now when ``None``), in order.

    Changes of runs other than ``run_ids`` (when given) are skipped, and so are high-water
    marks (rows that record no change). Never ends by itself.
    """
    cursor = await store.last_change() if since is None else since
    seen: int | None = None
    while True:
        batch, now = await store.changes_after(cursor, limit=_FEED_BATCH)
        held = False
        for change in batch:
            if change.seq != cursor + 1 and now - change.at < _GAP_WAIT:
                held = True
                break
            cursor = change.seq
            if not is_high_water(change) and (run_ids is None or change.run_id in run_ids):
                yield change
        if held or len(batch) < _FEED_BATCH:
            seen = await store.wait_for_change(_FEED_POLL, since=seen)


def registered_task(run: RunRecord) -> Task[..., Any] | None:
    """The task of a journaled run, if one of that name is loaded in this process. (A face that
    may load files loads the run's task first, by its own rules on which files it trusts.)"""
    from .tool import TASKS  # here, not at load: reading needs no tool machinery (see .seat)

    return TASKS.get(run.task)


def stand_in_task(name: str) -> Task[..., Any]:
    """A task object for a run whose code is not at hand: it keeps committed steps on a cancel
    (``on_cancel="keep"``) and is not registered (``TASKS`` is left as it is)."""
    from .tool import Task

    return Task(_not_loaded, OnCancel.KEEP, name, register=False)


async def _not_loaded() -> None:
    raise InputError("this run's task is not loaded in this process")
