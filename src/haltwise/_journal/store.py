"""The journal interface: the few operations a store must offer, and the values they exchange.

The URL -> store factory is the package's entry (:func:`haltwise._journal.open_store`).

The runtime talks only to :class:`Store`; it never writes SQL. Every write is durable when its
coroutine returns (committed with the store's durable setting). Writes that concern a run being
worked take ``fence``: the owner token the caller believes holds the run. The store refuses the
write with :class:`~haltwise.LostOwnershipError` if the run's owner changed meanwhile, so a
process that lost a run (lease expired, taken over) can never write into it again.

Two rules every store keeps, because the runtime relies on them:

- A write whose caller is cancelled while waiting still happens (or fails) as a whole; the
  caller just stops waiting. The runtime shields the writes it must see through.
- A write made with ``durable=False`` (see :meth:`Store.settle_step`) that later fails is
  reported by raising its error from the next operation made on the same store object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, final

from .._core.approvals import ApprovalRecord
from .._core.exceptions import BadRow
from .._core.outcome import ErrorInfo, StepRecord
from .._core.policy import Effect
from .._core.records import Event, Owner, PartialKey, RunRecord, RunSnapshot
from .._core.states import State, StepStatus
from .._core.views import Change, RunSummary, StepTimes

#: what a step spent, as its settlement writes it: (usd, tokens, calls); see ``_core/budget``
Spend = tuple[float | None, int | None, int | None]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: Sentinel for "leave this field as it is" where ``None`` already means "clear it".
UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class NewRun:
    """What :meth:`Store.create_run` records: a run in ``state`` (``pending`` or ``running``).

    A run created ``running`` (a runtime starting it at once) has two events, its creation as
    ``pending`` and its start, recorded in the same transaction: its history reads as if it had
    been created and then started, with no moment at which it was ``pending``.

    A fork (``fork`` set) gets, in the same transaction, a copy of the steps of run ``fork.source``
    before ``fork.from_step`` (they replay, as committed steps do on resume), and its creation
    event's reason says what it was forked from.
    """

    id: str
    task: str
    inputs: dict[str, Any]
    state: State = State.PENDING
    owner: Owner | None = None
    lease_until: float | None = None
    parent: str | None = None
    fork: ForkOf | None = None

    @property
    def note(self) -> str | None:
        """The reason recorded with the run's creation event."""
        if self.fork is None:
            return None
        return f"fork of {self.fork.source} from step {self.fork.from_step}"


@dataclass(frozen=True, slots=True)
class ForkOf:
    """Where a forked run comes from: its source run, and the first step it runs anew."""

    source: str
    from_step: int


@dataclass(frozen=True, slots=True)
class PauseSignal:
    """A run's state and pause request, as :meth:`Store.pause_signals` reads them."""

    state: State
    pause: bool
    reason: str | None
    force: bool


@dataclass(frozen=True, slots=True)
class StepStarted:
    """What :meth:`Store.start_step` reads back in the transaction that journals the start."""

    #: how many times the step's body was started, this one included
    attempts: int
    #: the run's ``(reason, force)`` if it is ``cancelling``, else None
    cancel: tuple[str, bool] | None = None
    #: a pause of the run is requested (and it is not ``cancelling``: a cancel wins), read in
    #: the statement that journals the start: a pause requested by another process reaches a
    #: stepping run at its next step, before the store's watcher has looked.
    pause: bool = False


@dataclass(frozen=True, slots=True)
class StepStart:
    """The journal entry written before a tool body runs."""

    index: int
    tool: str
    cancel: str | None
    effect: Effect
    idempotent: bool
    idempotency_key: str
    #: the call's arguments as JSON ``{"args": [...], "kwargs": {...}}``, kept for rollback
    #: tools so that a compensation can run after a crash; ``None`` for other tools
    args: str | None = None
    #: called after a cancel was delivered (cleanup in a shield): not replayed on resume
    cleanup: bool = False
    #: the framework's tool-call id the call was made under (``haltwise.call_id``), if any
    call_id: str | None = None
    #: a fingerprint of the call's arguments, compared on replay
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """An approval request as the step executor journals it (see
    :meth:`Store.request_approval`): the step's identity as :class:`StepStart` has it, the
    arguments for the approver (JSON text, by parameter name), the deadline (epoch
    seconds, None: none) and the JSON schema of the tool's parameters (text; None: none could
    be made), which any process validates an edit against without importing the tool."""

    step: StepStart
    arguments: str
    timeout_at: float | None
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class RunJournal:
    """One run with its steps, partials, transitions and step times, read in one transaction."""

    snapshot: RunSnapshot
    events: tuple[Event, ...]
    step_times: dict[int, StepTimes]


@dataclass(frozen=True, slots=True)
class JournalRows:
    """Every run, transition and step of a store and each run's partial-result numbers, read
    in one snapshot (for ``check``): a write committed meanwhile is in it whole or not at all.

    ``bad`` names the rows that did not parse; they are left out of the rest (a run whose
    step rows do not all parse has no entry in ``steps``).
    """

    runs: tuple[RunRecord, ...]
    events: tuple[Event, ...]
    #: run id -> its steps, by index (runs without steps have no entry)
    steps: dict[str, tuple[StepRecord, ...]]
    #: run id -> its partial results' sequence numbers, ascending
    partial_seqs: dict[str, list[int]]
    bad: tuple[BadRow, ...] = ()
    #: run id -> its steps' starts and settlements from the change feed, in commit order:
    #: ``(index, status)`` (``running``: a start). Runs journaled before the feed have none.
    step_changes: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


@final
class CancelledRun(NamedTuple):
    """A run as a bulk cancel request read it and left it: what the request planned its write
    from and what its caller acts on (deliver the cancel to the run worked here, settle it if
    nobody works it). A run's columns only, not a whole :class:`RunRecord`: a request on
    10,000 runs reads no inputs and builds no record (a caller that needs one loads it)."""

    id: str
    state: State
    reason: str | None
    force: bool
    settle_on_cancel: bool
    owner: Owner | None
    lease_until: float | None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What :meth:`Store.request_cancels` did: the runs it reached (as they are afterwards),
    the named runs that were already final, and the named ids the store does not hold."""

    reached: tuple[CancelledRun, ...]
    already_final: tuple[CancelledRun, ...] = ()
    unknown: tuple[str, ...] = ()


#: told how a write submitted with :meth:`Store.transition_then` went: (its value, its error)
WriteDone = Callable[[Any, BaseException | None], None]


class Store(Protocol):
    """A durable journal of runs, steps, partial results and transitions."""

    url: str

    async def open(self) -> None:
        """Connect and create or check the schema. Raises :class:`StoreError` if unusable."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        """Record ``run``; return the run as recorded and whether it is new (an id that exists
        is returned as it is). A run (not a fork) whose id has a remembered cancel (see
        :meth:`remember_cancel`) that has not expired is created ``cancelled`` instead, the
        cancel's reason its reason: a caller launches nothing of a run created final."""

    def transition(
        self,
        run_id: str,
        target: State,
        *,
        expected: Collection[State],
        reason: str | None = UNSET,
        result: Any = UNSET,
        error: ErrorInfo | None = UNSET,
        cancel_error: ErrorInfo | None = UNSET,
        owner: Owner | None = UNSET,
        lease_until: float | None = UNSET,
        settle_on_cancel: bool = UNSET,
        fence: str | None = None,
        returning: bool = True,
        note: str | None = None,
    ) -> Awaitable[RunRecord | None]:
        """Compare-and-set the run's state to ``target`` and record the event, in one transaction.

        Awaited, it returns the run as written; with ``returning=False``, None (a caller that
        does not read the run spares the store building it: a group of such transitions reads
        only the columns the rules need). (An awaitable rather than a coroutine: a store may
        hand back what waits for its commit itself; it may submit the write at the call.)

        Succeeds only if the current state is in ``expected`` and the table allows
        ``current -> target``; otherwise raises :class:`~haltwise.InvalidTransitionError` and
        changes nothing. Fields left ``UNSET`` keep their value. ``settle_on_cancel`` goes with
        entering ``paused`` (see :attr:`RunRecord.settle_on_cancel`); leaving ``paused`` clears it.
        ``note``: the reason the event records in place of the run's (the run's ``reason`` is
        not set by it; see ``rows.transition_fields``).
        """

    def transition_then(self, then: WriteDone, run_id: str, target: State, **fields: Any) -> bool:
        """:meth:`transition` (``fields``: its keyword arguments, ``expected`` among them) with
        ``returning=False``, submitted now and not awaited: ``then(None, error)`` is called once
        it is committed (``error`` None) or failed, on the event loop's thread, right where the
        store learns it (it must not raise). False, with nothing submitted, if this store has
        no such way: then await :meth:`transition` instead.

        For a caller that needs nothing after the write but to learn how it went (a run's
        final transition): it need not wait with a task of its own for the commit.
        """

    async def request_cancel(
        self, run_id: str, reason: str, *, force: bool, fence: str | None = None
    ) -> RunRecord:
        """Record a cancel request atomically and return the run as it is afterwards.

        ``pending`` -> ``cancelled``; ``running`` -> ``cancelling`` with ``reason`` and ``force``;
        ``paused`` -> ``cancelled``, or ``cancelling`` when its owner said it has something to
        settle (:attr:`RunRecord.settle_on_cancel`); ``cancelling`` keeps its reason and only
        gains ``force``; a final run is left as it is. With ``fence`` (an owner token), only
        while that owner holds the run: otherwise :class:`~haltwise.LostOwnershipError`, and
        nothing changes (a runtime's own cancels).
        """

    async def claim(
        self, run_id: str, owner: Owner, *, lease_until: float, expected_owner: str | None
    ) -> bool:
        """Make ``owner`` the run's owner if the current owner token is ``expected_owner``."""

    async def release(self, run_id: str, owner_token: str) -> None:
        """Clear the run's owner if it is ``owner_token``."""

    async def heartbeat(self, owner_token: str, lease_until: float) -> int:
        """Extend the lease of every run ``owner_token`` holds; return how many."""

    async def claim_pending(
        self, owner: Owner, tasks: Collection[str], *, lease_until: float, limit: int
    ) -> list[RunRecord]:
        """Claim up to ``limit`` unowned ``pending`` runs of ``tasks`` (for workers)."""

    async def start_step(
        self, run_id: str, step: StepStart, *, fence: str, durable: bool = True
    ) -> StepStarted:
        """Journal that the step's tool body is about to run (status ``running``, attempts + 1).

        With ``durable=False`` the start is committed (visible to every reader, kept through a
        crash of the process) but may return before it is synced to the disk: a crash of the
        machine may lose it, never without also losing every later write that was not synced
        either (the journal stays a prefix of what was written). A store may always treat it as
        ``True``.

        Completes even if the caller is cancelled meanwhile (the store shields its own wait), so
        the caller always knows whether the step is journaled. Returns the step's attempts and,
        if the run is ``cancelling`` in the store, its ``(reason, force)``, read in the same
        transaction: a cancel recorded by another process is then acted on before the tool body
        runs, at no extra cost (and, on SQLite, whether a pause is requested: see
        :class:`StepStarted`).
        """

    async def settle_step(
        self,
        run_id: str,
        index: int,
        status: StepStatus,
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        fence: str,
        durable: bool = True,
        spend: Spend | None = None,
    ) -> None:
        """Record how a step ended; like :meth:`start_step`, completes even if the caller is
        cancelled meanwhile.

        ``spend`` is what the step spent, ``(usd, tokens, calls)`` (see ``_core/budget``),
        written in the same statement as the settlement; None leaves what an earlier
        settlement of the step wrote (a takeover's settlement of an orphaned step).

        With ``durable=False`` the store may return before the write is durable, provided it
        commits the write before (or together with) the next operation of this store object and
        otherwise within some tens of milliseconds of :meth:`wait_for_change` being called (the
        runtime's watcher calls it all the time). A store may always treat it as ``True``.
        """

    async def reconcile_step(
        self,
        run_id: str,
        index: int,
        status: StepStatus,
        *,
        result: Any = None,
        reconciled: str,
        fence: str | None,
    ) -> bool:
        """Write what a reconcile found out into step ``index`` of ``run_id``, only while the
        step is ``unknown`` and the run is ``cancelled`` or ``failed``, or held by ``fence``:
        its new ``status`` (``committed`` with ``result``, ``interrupted``, or ``unknown``
        still) and the ``reconciled`` column's text (``_core.reconcile``). True if written;
        False if the step was no longer ``unknown`` or another owner holds the run."""

    async def remember_cancel(self, run_id: str, reason: str, expires_at: float) -> bool:
        """Remember a cancel pressed before run ``run_id`` exists (``cancel --before-start``),
        until ``expires_at`` (epoch seconds; a later one for the same id replaces it), and drop
        the remembered cancels that expired. False, remembering nothing, if the run exists.

        A run created with that id before then (:meth:`create_run`) is created ``cancelled``
        with ``reason`` (events ``pending``, then ``pending -> cancelled``): nothing runs."""

    async def append_partial(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        """Record the ``seq``-th partial result (0-based) and who emitted it (``origin``, by
        default ``(None, seq)``); a replayed seq is left unchanged."""

    def append_partial_blocking(
        self, run_id: str, seq: int, value: Any, *, fence: str, origin: PartialKey | None = None
    ) -> None:
        """:meth:`append_partial` for synchronous callers (``emit``): blocks until durable.

        Callable from the event-loop thread and from worker threads alike.
        """

    async def load(self, run_id: str) -> RunSnapshot:
        """The run with its steps and partials. Raises :class:`~haltwise.UnknownRunError`."""

    async def list_runs(self, state: State | None = None) -> list[RunRecord]:
        """All runs (optionally in one state), oldest first."""

    async def read_journal(self) -> JournalRows:
        """Every run, event and step and the partials' numbers, in one snapshot (``check``)."""

    async def events(self, run_id: str | None = None) -> list[Event]:
        """Recorded transitions, of one run or all, in order."""

    async def cancel_requests(
        self, run_ids: Collection[str], *, acting: Sequence[str] = ()
    ) -> dict[str, tuple[str, bool]]:
        """Among ``run_ids`` (a set, or a mapping's keys: looked into, not copied), those in
        ``cancelling``: ``{id: (reason, force)}``; of those also
        in ``acting`` (runs whose cancel the caller acts on already: it has recorded a reason
        for them), only the ones whose request is forced (for such a run only a forced request
        may still change what the caller does). An id in ``acting`` but not in ``run_ids`` is
        not listed."""

    async def request_pause(self, run_id: str, *, reason: str | None = None) -> RunRecord:
        """Record a pause request atomically and return the run as it is afterwards.

        ``reason`` (``"budget"``) is recorded as the run's reason with a request it makes.

        A ``pending`` or ``running`` run gains ``pause`` (its state does not change: the runtime
        working it moves it to ``paused`` at its next checkpoint with nothing in flight, through
        :meth:`transition`); any other run is left as it is.
        """

    async def request_unpause(
        self, run_id: str, *, budget: dict[str, Any] | None = None
    ) -> RunRecord:
        """Undo a pause atomically and return the run as it is afterwards.

        ``budget`` (a budget's ``limit_json``) replaces the run's budget in its inputs in the
        same write, whatever the unpause does (a run paused for budget, raised).

        ``paused`` -> ``running`` (an event, the request cleared, the owner kept); a ``pending``
        or ``running`` run with a pause requested loses the request; any other run is left as
        it is. A run the unpause changes loses its reason too, whoever wrote it: a run that
        may be paused carries only a pause's (``"budget"``), since the runtime's resume clears
        the reason of the attempt that ended.
        """

    async def pause_signals(
        self, run_ids: Collection[str], *, watched: Collection[str]
    ) -> dict[str, PauseSignal]:
        """Among ``run_ids`` (a set, or a mapping's keys: looked into, not copied), those with
        a pause requested, plus every run of ``watched``.

        What the runtime's watcher needs to act on other processes' pause, unpause and cancel
        requests for runs it holds; ``watched`` are the runs it holds with a pause requested.
        """

    async def run_page(
        self,
        *,
        states: Collection[State],
        tasks: Collection[str] | None,
        limit: int,
        before: tuple[float, str] | None,
        progress: bool = False,
    ) -> list[RunSummary]:
        """Up to ``limit`` runs, newest created first (ties: id descending), in one query.
        With ``progress``, each summary has its ``progress`` (committed and journaled steps).

        Only runs in ``states`` (every state when empty) and of ``tasks`` (recorded names; every
        task when ``None``), created before the run ``before`` = ``(created_at, id)`` if given.
        Each summary's retry advice is computed by the database from the run's steps.
        """

    async def task_names(self) -> list[str]:
        """The task names the store's runs record, each once."""

    async def inspect(self, run_id: str) -> RunJournal:
        """The run with its steps, partials, events and step times; :class:`UnknownRunError`."""

    async def request_cancels(
        self,
        *,
        ids: Sequence[str] | None,
        states: Collection[State],
        tasks: Collection[str] | None,
        reason: str,
        force: bool,
        dry_run: bool = False,
    ) -> CancelResult:
        """:meth:`request_cancel` for many runs in one transaction.

        ``ids`` names the runs; with ``ids=None`` every active run in ``states`` (all active
        states when empty) of ``tasks`` (when not ``None``) is chosen. ``dry_run`` reads the
        same runs and writes nothing (``reached`` then holds them as they are).
        """

    async def prune(
        self, *, ended_before: float, states: Collection[State], dry_run: bool = False
    ) -> list[str]:
        """Delete the final runs (in ``states``, every final state when empty) whose last change
        is older than ``ended_before`` (epoch seconds), with their steps, partials, events and
        changes, in one transaction; return their ids. An active run is never deleted."""

    async def changes_after(self, seq: int, *, limit: int) -> tuple[list[Change], float]:
        """Up to ``limit`` changes numbered above ``seq``, ascending, and the database's clock
        now (the clock the changes' ``at`` was read from)."""

    async def last_change(self) -> int:
        """The number of the latest change (0 if none)."""

    async def swap_trace(self, run_id: str, traceparent: str) -> str | None:
        """Keep ``traceparent`` as the span context of the run's latest attempt, in one
        transaction with reading the one it replaces (None: none was kept)."""

    async def request_approval(
        self, run_id: str, request: ApprovalRequest, *, fence: str
    ) -> ApprovalRecord | None:
        """Journal an approval request as the step's (status ``awaiting``) in one transaction,
        unless the step has one already that was not cancelled (a takeover or a resume waits
        on the same request; a cancelled one is asked anew), only while ``fence`` holds the
        run; return the step's request as it now is (an ``ApprovalRecord``; None when the
        fence no longer holds and no request exists). Records an ``approval`` change when it
        made one."""
        ...

    async def decide_approval(
        self,
        run_id: str,
        index: int,
        state: str,
        *,
        by: str | None,
        note: str | None,
        edited: str | None,
    ) -> tuple[ApprovalRecord | None, bool]:
        """Decide the step's request, compare-and-set: only a request still ``awaiting`` is
        decided (to ``state``), in one transaction with its ``approval`` change (and, on
        PostgreSQL, a notification that wakes the run's owner). Returns the request as it now
        is (an ``ApprovalRecord``, None if there is none) and whether this call decided it."""
        ...

    async def approvals(
        self, run_id: str | None = None, *, limit: int = 100_000
    ) -> list[ApprovalRecord]:
        """The approval requests of one run (every state, by step), or without ``run_id``
        every request still awaiting in the store, oldest first (at most ``limit``)."""
        ...

    async def approval(self, run_id: str, index: int) -> ApprovalRecord | None:
        """The request of step ``index`` of the run, in whatever state (None: it has none);
        one read by key, what a waiting run reads when woken."""
        ...

    async def approval_schema(self, run_id: str, index: int) -> str | None:
        """The JSON schema (text) of the tool's parameters recorded with the step's request
        (None: no request, or none recorded)."""
        ...

    async def pending_approvals_json(self, *, limit: int = 100_000) -> str:
        """The body of ``GET /api/approvals`` as JSON text, ``{"approvals": [...]}``: every
        request still awaiting, oldest first (at most ``limit``), each ``{"run", "step",
        "tool", "arguments", "requested_at", "timeout_at"}``. Built by the database in one
        query, the stored argument text passed through (nothing decoded in Python)."""
        ...

    async def cancel_approval(self, run_id: str, index: int, *, fence: str) -> None:
        """The run's cancel reached the step's awaiting request: in one transaction the request
        becomes ``cancelled`` (unless a decision came first: compare-and-set, with its
        ``approval`` change) and the step, if still ``awaiting``, ``interrupted`` (with its
        ``step`` change), only while ``fence`` holds the run (else nothing changes)."""
        ...

    async def delivery_position(self, destination: str) -> int | None:
        """The number of the last change acknowledged by ``destination`` (a URL: see
        ``haltwise events``), or ``None`` if no sender has delivered there yet."""

    async def save_delivery_position(self, destination: str, position: int) -> None:
        """Record, durably, that every change up to ``position`` reached ``destination``."""

    async def record_budget_exhausted(self, run_id: str) -> None:
        """Record in the change feed that run ``run_id``'s budget is exhausted (kind
        ``budget``, status ``exhausted``): the run is then cancelled or paused for it."""

    def set_concurrency(self, active_runs: int) -> None:
        """A hint: how many runs this process works on the store now.

        A store may use it to favour latency when one run is active and batching when many are.
        """

    async def wait_for_change(self, timeout: float, since: int | None = None) -> int:
        """Wait until another connection may have committed something, or ``timeout`` passed.

        Returns the store's count of changes seen so far. A caller that passes back the count
        it got last time (``since``) returns at once if changes came meanwhile, so several
        waiters on one store (a worker and its runtime's watcher) each see every change.
        Without ``since`` it waits for the next change. The count moves on every commit of
        another connection (at least); a store that cannot tell right now (PostgreSQL without
        its listener) moves it at every return, so an unchanged count means nothing was
        committed meanwhile (the runtime's watcher reads the requests only when it moved).
        """
