"""The integrity check behind ``haltwise check``: does the journal keep the contract's promises?"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, final

import anyio

from .._core.exceptions import CorruptRowError, NoStoreError
from .._core.outcome import StepRecord
from .._core.records import Event, RunRecord
from .._core.states import State, StepStatus, is_allowed
from . import open_store
from .owner import held_by_live_owner
from .store import JournalRows, Store


@final
@dataclass(frozen=True, slots=True)
class Finding:
    """One broken promise in a store: which run, a stable ``code``, and a readable message."""

    run: str
    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"run": self.run, "code": self.code, "message": self.message}


@final
@dataclass(frozen=True, slots=True)
class CheckReport:
    """The result of :func:`verify`: ``ok`` when there are no findings."""

    runs: int
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "runs": self.runs, "findings": [f.to_json() for f in self.findings]}


async def verify(store: Store) -> CheckReport:
    """Check every run of an open store.

    Findings (``code``): ``bad-creation`` (the first event is not the run's creation),
    ``bad-transition`` (an event the state table forbids, or one that does not start where the
    previous ended), ``state-mismatch`` (the run's state is not where its events end),
    ``orphaned-step`` (a step left ``running`` with no live owner: the run awaits takeover),
    ``owned-final-run`` (a final run still has an owner), ``step-running-while-paused`` (a
    ``paused`` run with a step in flight, other than a child run paused with it), ``step-gap``
    (step indexes are not 0..n-1),
    ``partial-gap`` (partial results are not numbered 0..n-1), ``step-ran-again`` (a step
    began again after it committed: its effect may have happened twice), ``step-started-twice``
    (a step began again with no settlement of its attempt in between: two attempts may have
    run at once; see :func:`_check_starts`) and ``unreadable-row``
    (a row that does not parse: a bad state, JSON that is not JSON, a bad owner...; the run's
    other checks are skipped where they would need that row).

    Everything is read in one snapshot of the store (:meth:`Store.read_journal`), so a write
    that commits while ``check`` reads (a live runtime's) is seen whole or not at all.
    """
    return verify_journal(await store.read_journal())


def verify_journal(journal: JournalRows) -> CheckReport:
    """:func:`verify` of a journal already read (one snapshot of a store)."""
    findings = [Finding(row.run_id, "unreadable-row", row.describe()) for row in journal.bad]
    #: runs whose own row or an event does not parse: their history cannot be checked
    unreadable = {row.run_id for row in journal.bad if row.table in ("runs", "events")}
    events_by_run: dict[str, list[Event]] = {}
    for event in journal.events:
        events_by_run.setdefault(event.run_id, []).append(event)
    bad_steps = {row.run_id for row in journal.bad if row.table == "steps"}
    #: the active child runs, each as (its parent, its id)
    children = {
        (run.parent, run.id) for run in journal.runs if run.parent and not run.state.is_final
    }
    for run in journal.runs:
        if run.id not in unreadable:
            findings.extend(_check_events(run, events_by_run.get(run.id, [])))
        findings.extend(_check_partials(run.id, journal.partial_seqs.get(run.id, [])))
        findings.extend(_check_owner(run))
        if run.id not in bad_steps:
            findings.extend(_check_steps(run, journal.steps.get(run.id, ()), children))
        findings.extend(_check_starts(run.id, journal.step_changes.get(run.id, ())))
    bad_runs = sum(1 for row in journal.bad if row.table == "runs")
    return CheckReport(runs=len(journal.runs) + bad_runs, findings=tuple(findings))


async def check_store(url: str | None) -> CheckReport:
    """Open the store at ``url`` (as everywhere: ``$HALTWISE_STORE``, else the default SQLite
    file), read-only, run :func:`verify` and close it. A store whose own meta row does not parse
    cannot be opened: that row is then the one finding. Where there is no store, there is
    nothing to check (and none is created)."""
    store = open_store(url, read_only=True)
    try:
        await store.open()
    except NoStoreError:
        return CheckReport(runs=0, findings=())  # reading creates no store: nothing to check
    except CorruptRowError as error:
        return CheckReport(runs=0, findings=tuple(_unreadable(error)))
    try:
        return await verify(store)
    finally:
        await store.close()


def verify_store(url: str | None = None) -> CheckReport:
    """:func:`check_store`, blocking."""
    return anyio.run(check_store, url)


def _unreadable(error: CorruptRowError) -> Iterator[Finding]:
    for row in error.rows:
        yield Finding(row.run_id, "unreadable-row", row.describe())


def _check_events(run: RunRecord, events: Sequence[Event]) -> Iterator[Finding]:
    if not events or events[0].source is not None or events[0].target is not State.PENDING:
        yield Finding(run.id, "bad-creation", "the first event is not the run's creation")
        return
    for before, event in itertools.pairwise(events):
        if event.source is not before.target or event.source is None:
            yield Finding(
                run.id,
                "bad-transition",
                f"event {event.seq} starts at {event.source} but the run was {before.target}",
            )
        elif not is_allowed(event.source, event.target):
            yield Finding(
                run.id,
                "bad-transition",
                f"event {event.seq}: {event.source} -> {event.target} is not allowed",
            )
    if events[-1].target is not run.state:
        yield Finding(
            run.id,
            "state-mismatch",
            f"the run is {run.state} but its events end at {events[-1].target}",
        )


def _check_partials(run_id: str, seqs: Sequence[int]) -> Iterator[Finding]:
    if list(seqs) != list(range(len(seqs))):
        yield Finding(run_id, "partial-gap", f"partial results are numbered {list(seqs)}")


def _check_owner(run: RunRecord) -> Iterator[Finding]:
    if run.state.is_final and run.owner is not None:
        yield Finding(
            run.id, "owned-final-run", f"{run.state} but still owned by {run.owner.describe()}"
        )


def _check_steps(
    run: RunRecord, steps: Sequence[StepRecord], children: Collection[tuple[str, str]]
) -> Iterator[Finding]:
    """Step findings; a step that is a child run (in ``children``: (parent, id) of every active
    child run) may stay ``running`` in a paused run: its child was paused with it."""
    indexes = [step.index for step in steps]
    if indexes != list(range(len(indexes))):
        yield Finding(run.id, "step-gap", f"step indexes are {indexes}")
    live = held_by_live_owner(run)
    for step in steps:
        child = (run.id, f"{run.id}/{step.index}")
        if (
            step.status is StepStatus.RUNNING
            and run.state is State.PAUSED
            and child not in children
        ):
            yield Finding(
                run.id,
                "step-running-while-paused",
                f"step {step.index} ({step.tool}) is running but the run is paused; a run "
                "pauses only once its steps in flight have ended",
            )
        elif step.status is StepStatus.RUNNING and run.state.is_final:
            yield Finding(
                run.id,
                "step-running-in-final-run",
                f"step {step.index} ({step.tool}) is running but the run is {run.state}: it "
                "ended while that step's settlement was not durable, and nothing takes a final "
                "run over; find out whether the step's effect happened and reconcile it by hand",
            )
        elif step.status is StepStatus.RUNNING and not live:
            yield Finding(
                run.id,
                "orphaned-step",
                f"step {step.index} ({step.tool}) was left running by an owner that is "
                "gone; resume or a worker will settle it",
            )


def _check_starts(run_id: str, changes: Sequence[tuple[int, str]]) -> Iterator[Finding]:
    """Findings from the order of a run's step starts and settlements (the change feed).

    The step row keeps one idempotency key and an attempt count, and an earlier attempt's
    own row only when it failed, so a step driven twice (issue 28: a child run taken over by
    two paths of one process, its charge made under two keys) is invisible in the rows. The
    feed keeps every start (``running``) and settlement in commit order: a committed step is
    never run again (it replays), and every attempt is settled before the next begins (a
    takeover settles a dead owner's attempt first). A run journaled before the feed existed
    has no changes, and nothing is found."""
    last: dict[int, str] = {}
    for index, status in changes:
        before = last.get(index)
        last[index] = status
        if status != StepStatus.RUNNING.value:
            continue
        if before == StepStatus.COMMITTED.value:
            yield Finding(
                run_id,
                "step-ran-again",
                f"step {index} began again after it committed: its effect may have happened "
                "twice; check the world (the call's idempotency key) and reconcile by hand",
            )
        elif before == StepStatus.RUNNING.value:
            yield Finding(
                run_id,
                "step-started-twice",
                f"step {index} began again before its attempt was settled: two attempts may "
                "have run at once; check the world for a repeated effect",
            )
