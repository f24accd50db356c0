"""Every exception haltwise raises, in one place.

Cancellation is not an error, so it stands outside the error tree::

    BaseException
    └── Cancelled                 a cancel was delivered at a checkpoint (like trio.Cancelled)

    Exception
    └── HaltwiseError             base of the library's own errors
        ├── PolicyError           a bad @haltwise.tool / @haltwise.task declaration (.tool)
        ├── InputError            task inputs or a partial/tool result that is not JSON (.task_id)
        ├── UnknownRunError       no run with that id in the store (.task_id)
        ├── IdempotencyConflictError  a task_id that exists with another task or inputs (.task_id)
        ├── RunOwnedError         a live owner holds the run; resume refused (.task_id, .owner)
        ├── ResumeRefusedError    resume refused until unknown steps are resolved (.task_id, .steps)
        ├── InvalidTransitionError  a transition the table forbids (.task_id, .source, .target)
        ├── NonDeterminismError   the task asked for another tool than the journal holds
        ├── StepTimeoutError      a step ran longer than its tool's timeout= (.task_id, .index)
        ├── UnknownStepError      a run taken over has an unknown step it may not run again
        ├── CodeChangedError      resume refused: the task's file is not the recorded one (.file)
        ├── ChildRunError         a child task's run failed or was cancelled on its own (.task_id)
        ├── ApprovalRefused       a call's approval was refused (.by, .note, .index)
        │   └── ApprovalExpired   nobody decided within the request's timeout
        ├── ApprovalConflictError  a decision on a request that is not awaiting (.state)
        ├── StoreError            the store is unusable: bad URL, not a haltwise store, I/O error
        │   ├── SchemaVersionError  the store was written by a newer haltwise
        │   ├── LostOwnershipError  a write fenced off: another owner holds the run (.task_id)
        │   ├── NoStoreError      a read-only opening found no store at that place (.url)
        │   ├── StoreGoneError    the store's file was deleted or replaced while in use
        │   └── CorruptRowError   a journal row does not parse (.rows: which, .readable: the rest)
        ├── NotInTaskError        emit()/checkpoint()/idempotency_key() outside a task or tool
        ├── LoadError             a FILE.py or module cannot be loaded, or has no such task
        ├── SchemaError           a tool's parameters cannot be described as JSON schema
        ├── ReplayedError         a failed step's error replayed on resume, its own type not
        │                         found here (.type: that type's name; its text: the error's)
        └── DeliveryGoneError     an events receiver answered 410 Gone: delivery stopped
    └── McpToolError              a remote MCP tool answered with an error (.tool): the tool's own
                                  failure, as any tool's (a step failed), not a HaltwiseError

A failed run's outcome carries the task's *own* exception type and text, not these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final


class Cancelled(BaseException):
    """Raised at a checkpoint once a cancel has been requested for the current run.

    Derives from :class:`BaseException` so that ``except Exception`` cannot swallow it.
    Cancellation is level-triggered: every later checkpoint of the run raises it again, except
    inside :func:`haltwise.shield`. A task may catch it to clean up, but the run still ends
    ``cancelled``.
    """

    def __init__(self, reason: str = "user", *, task_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.task_id = task_id


class HaltwiseError(Exception):
    """Base class of every error haltwise itself raises."""

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id

    def __str__(self) -> str:
        return self.message


class PolicyError(HaltwiseError):
    """A ``@haltwise.tool`` or ``@haltwise.task`` declaration is invalid (raised at decoration)."""

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class InputError(HaltwiseError, ValueError):
    """A value given to haltwise is unusable: task inputs, a partial result or a tool result
    that cannot be journaled (not JSON, wrong arguments), or an argument out of its range (a
    deadline, a lease, a shield's seconds, a worker's concurrency). Also a :class:`ValueError`,
    so code that caught the bare ``ValueError`` some of these used to be keeps working."""


class UnknownRunError(HaltwiseError):
    """The store has no run with that id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no run with id {task_id!r} in the store", task_id=task_id)


class IdempotencyConflictError(HaltwiseError):
    """A run was started with a ``task_id`` that exists already with another task or other
    inputs: a reused key never answers another call with that run's result (``.task_id``)."""

    def __init__(self, task_id: str, what: str) -> None:
        super().__init__(
            f"a run with id {task_id!r} exists already with {what}; "
            "use another id, or the same task and inputs to get that run",
            task_id=task_id,
        )


class RunOwnedError(HaltwiseError):
    """A live owner holds the run, so it cannot be resumed or started here."""

    def __init__(self, task_id: str, owner: str) -> None:
        super().__init__(f"run {task_id!r} is held by a live owner: {owner}", task_id=task_id)
        self.owner = owner


class ResumeRefusedError(HaltwiseError):
    """Resume refused: some steps are ``unknown`` and their tools are not idempotent.

    ``steps`` holds ``(index, tool)`` pairs. Say what happened with ``assume_done`` or ``rerun``.
    """

    def __init__(self, task_id: str, steps: Sequence[tuple[int, str]]) -> None:
        named = ", ".join(f"step {index} ({tool})" for index, tool in steps)
        super().__init__(
            f"run {task_id!r}: {named} may or may not have happened and is not idempotent; "
            "check the world, then resume saying it happened (assume_done, with its result) "
            "or that it runs again (rerun)",
            task_id=task_id,
        )
        self.steps = tuple(steps)


class InvalidTransitionError(HaltwiseError):
    """A state transition the contract's table forbids was attempted."""

    def __init__(self, task_id: str, source: str, target: str) -> None:
        super().__init__(
            f"run {task_id!r}: transition {source} -> {target} is not allowed", task_id=task_id
        )
        self.source = source
        self.target = target


class StepTimeoutError(HaltwiseError):
    """A step ran longer than its tool's ``timeout=``: it was stopped as a cancel of that step
    alone would stop it, then recorded ``failed``. The task sees it as an ordinary exception
    (it may catch it); the run is not cancelled."""

    def __init__(self, task_id: str, index: int, tool: str, timeout: float) -> None:
        super().__init__(
            f"run {task_id!r}: step {index} ({tool}) ran longer than its timeout of {timeout:g} s",
            task_id=task_id,
        )
        self.index = index
        self.tool = tool
        self.timeout = timeout


class NonDeterminismError(HaltwiseError):
    """On replay the task made a different call at a step than the journal holds.

    ``what`` says what differs: ``"tool"`` (``journaled`` and ``requested`` are the two tool
    names) or ``"arguments"`` (the same tool, called with arguments whose fingerprint differs
    from the journal's; the arguments themselves are never put in the message).
    """

    def __init__(
        self, task_id: str, index: int, journaled: str, requested: str, *, what: str = "tool"
    ) -> None:
        if what == "arguments":
            detail = (
                f"step {index} ({journaled}) is called with other arguments than the journal holds"
            )
        else:
            detail = (
                f"step {index} is {journaled!r} in the journal but the task now calls {requested!r}"
            )
        super().__init__(
            f"run {task_id!r}: {detail}; the task is not deterministic on resume",
            task_id=task_id,
        )
        self.index = index
        self.journaled = journaled
        self.requested = requested
        self.what = what


class UnknownStepError(HaltwiseError):
    """A step is ``unknown`` and its tool may not run again without the caller's word."""

    def __init__(self, task_id: str, index: int, tool: str) -> None:
        super().__init__(
            f"run {task_id!r}: step {index} ({tool}) is unknown and not idempotent; "
            "reconcile it, then resume saying it happened (assume_done) or that it runs again "
            "(rerun)",
            task_id=task_id,
        )
        self.index = index
        self.tool = tool


class CodeChangedError(HaltwiseError):
    """Resume (or a worker's takeover) refused: the file run ``task_id``'s task was loaded from
    is not the one the run recorded when it started (CONTRACT.md, "Resume and determinism").

    ``file`` is the file, ``recorded`` and ``current`` its SHA-256 digests (hex) then and now
    (``current`` is None if the file is gone). Resume with ``allow_code_change=True``
    (``--allow-code-change``) to run it with the code as it is now.
    """

    def __init__(self, task_id: str, file: str, recorded: str, current: str | None) -> None:
        now = current if current is not None else "gone (it cannot be read)"
        super().__init__(
            f"run {task_id!r}: its task's file {file} changed since the run started (recorded "
            f"sha256 {recorded}, now {now}); resume it with allow_code_change to run the code "
            "as it is now",
            task_id=task_id,
        )
        self.file = file
        self.recorded = recorded
        self.current = current


class ChildRunError(HaltwiseError):
    """A child task's run ended without completing, and its parent did not cancel it.

    Raised in the parent at the ``await child(...)``; ``task_id`` is the child's run id and
    ``state`` its final state; ``error`` is the child's error (or cancel error), if any.
    """

    def __init__(self, task_id: str, state: str, error: object | None) -> None:
        detail = f": {getattr(error, 'type', '')}: {getattr(error, 'message', '')}" if error else ""
        super().__init__(f"child run {task_id!r} ended {state}{detail}", task_id=task_id)
        self.state = state
        self.error = error


class ApprovalRefused(HaltwiseError):
    """The call's approval was refused (CONTRACT.md, "Someone else decides"): the call did not
    run, its step is ``refused``. ``by`` and ``note`` are the decision's; ``index`` the step."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        index: int | None = None,
        by: str | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id)
        self.index = index
        self.by = by
        self.note = note


class ApprovalExpired(ApprovalRefused):
    """Nobody decided on the request within its timeout: the request is ``expired`` and the
    call did not run."""


class ApprovalConflictError(HaltwiseError):
    """A decision on a request that is not awaiting (decided already, expired, cancelled, or no
    request at that step): refused, naming what happened to the request (``state``: its state,
    or None when there is none). Exit 2, HTTP 409."""

    def __init__(self, message: str, *, task_id: str | None = None, state: str | None = None):
        super().__init__(message, task_id=task_id)
        self.state = state


class StoreError(HaltwiseError):
    """The store cannot be used: a bad URL, a file that is not a haltwise store, an I/O error."""


class SchemaVersionError(StoreError):
    """The store was written by a newer version of haltwise than this one."""


class LostOwnershipError(StoreError):
    """A write was fenced off: another owner holds the run now (its lease expired, or another
    process took it over), so this process may never write into it again."""


@final
class NoStoreError(StoreError):
    """A store opened read-only (``status``, ``list``, ``check``) does not exist there.

    Reading never creates a store. ``url`` is the store's URL as a message may show it.
    """

    def __init__(self, url: str) -> None:
        super().__init__(f"there is no store at {url}")
        self.url = url


@final
class StoreGoneError(StoreError):
    """The SQLite store's file was deleted or replaced while this process had it open.

    Nothing written after that is durable anywhere another process can see, so every later
    operation of the store raises this, and the runtime stops its runs at once.
    """


@final
@dataclass(frozen=True, slots=True)
class BadRow:
    """One journal row that does not parse.

    ``table`` is the table (``runs``, ``steps``, ``partials``, ``events``, ``haltwise_meta``),
    ``run_id`` the run it belongs to (``""`` for the meta table), ``where`` the row within the
    run (``""`` for the run's own row, ``"step 3"``, ``"partial 0"``, ``"event 17"``) and
    ``problem`` what is wrong with it, naming the column.
    """

    table: str
    run_id: str
    where: str
    problem: str

    def describe(self) -> str:
        """``run 'r1' (runs row), column state: 'bogus' is not a run state``."""
        where = f" {self.where}" if self.where else ""
        owner = f"run {self.run_id!r}{where}" if self.run_id else self.where
        return f"{owner} ({self.table} row), {self.problem}"


@final
class CorruptRowError(StoreError):
    """The journal holds rows that do not parse (edited by hand, or written by a bug).

    ``rows`` names each one (at least one); the message names the first. A listing that met
    such rows raises this after reading the others: ``readable`` holds the records it could
    read, in order (empty for an operation on one run), so that ``check`` can report the bad
    rows as findings and a worker can skip them and go on with the rest.
    """

    def __init__(self, rows: Sequence[BadRow], readable: Sequence[Any] = ()) -> None:
        first = rows[0]
        more = f" (and {len(rows) - 1} more unreadable rows)" if len(rows) > 1 else ""
        super().__init__(
            f"unreadable row in the store: {first.describe()}{more}; "
            "'haltwise check' lists every such row",
            task_id=first.run_id or None,
        )
        self.rows = tuple(rows)
        self.readable = tuple(readable)


class NotInTaskError(HaltwiseError):
    """A function that needs a running task or tool was called outside one."""


@final
class LoadError(HaltwiseError):
    """A file or module could not be loaded, or the named task is not in it.

    Raised for a missing or unreadable file, a syntax error (the message names ``file:line``),
    an exception raised while the file was being imported (named with the line in the file
    where it arose), a module name that cannot be imported, a task name the module does not
    define, and an attribute that is not a ``@haltwise.task``. The message is always one line.
    ``target`` is the file path or module name concerned.
    """

    def __init__(self, message: str, *, target: str) -> None:
        super().__init__(" ".join(message.split()))
        self.target = target


@final
class SchemaError(HaltwiseError):
    """A tool's parameters cannot be described as JSON schema.

    Raised when an annotation cannot be evaluated (for instance a name imported only under
    ``TYPE_CHECKING``) or names a type pydantic cannot put in a JSON schema. ``tool`` is the
    tool's name.
    """

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class ReplayedError(HaltwiseError):
    """A failed step's journaled error, raised again on resume in place of an exception whose
    type cannot be rebuilt in this process (CONTRACT.md, "Resume and determinism"): its text
    is the error's text, :attr:`type` the name of the error's type."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type = type_name


class DeliveryGoneError(HaltwiseError):
    """The receiver of ``haltwise events`` answered ``410 Gone``: it wants no more events, and
    the sender stops (the command exits 1). Its position stays before the refused change."""


class McpToolError(Exception):
    """A remote MCP tool answered with an error result, or the call failed on the protocol.

    Raised by the tools of :func:`haltwise.integrations.mcp.remote_tools`: it is the remote
    tool's own failure (its step is recorded ``failed``, and a framework shows it to the model as
    any tool's error), not one of haltwise's, so it is no :class:`HaltwiseError`. ``tool`` is the
    remote tool's name.
    """

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"MCP tool {tool!r}: {message}")
        self.tool = tool


def install_hint(extra: str) -> str:
    """How to install the optional extra ``extra``, as an error message says it: haltwise is
    not on PyPI yet, so the line also says how from a checkout."""
    return (
        f"pip install 'haltwise[{extra}]' (from a checkout of haltwise: "
        f"pip install -e '.[{extra}]')"
    )


def group_leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """Every exception inside ``group`` and its nested groups, in order (anyio wraps what a
    task group's children raise: a caller that wants the one error takes it from here)."""
    found: list[BaseException] = []
    for error in group.exceptions:
        found.extend(group_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return found
