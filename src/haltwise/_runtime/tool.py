"""``@haltwise.tool`` and ``@haltwise.task``: the declarations the runtime acts on.

A tool call finds its run through the context variable (:data:`CURRENT_RUN`) and hands itself
to that run's step executor (:attr:`RunContext.execute`): this module does not import the
executor.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

from .._core.approvals import Decision
from .._core.budget import Budget
from .._core.exceptions import ApprovalExpired, ApprovalRefused, NotInTaskError, PolicyError
from .._core.policy import CancelPolicy, Effect, OnCancel, ToolPolicy
from .approvals import decided_payload, decision_of, refused_decision
from .approvals import rule as approval_rule
from .run_context import CURRENT_RUN, CURRENT_STEP
from .spans import REQUESTED_MODEL
from .spec import Tool, ToolSpec, qualified_name

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


def tool_function(spec: ToolSpec) -> Tool[..., Any]:
    """The ``async def`` that stands for ``spec``: calling it inside a task is a step."""
    from .describe import describe, tool_schema

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await call_tool(spec, args, kwargs)

    def schema(format: str = "openai") -> dict[str, Any]:
        return tool_schema(spec, format=format)  # type: ignore[arg-type]

    functools.update_wrapper(call, spec.fn)
    schema.__doc__ = Tool.schema.__doc__
    made = cast("Tool[..., Any]", call)
    attributes = {
        "policy": spec.policy,
        "name": spec.name,
        "description": describe(spec),
        "schema": schema,
        "__haltwise_tool__": spec,
    }
    for attribute, value in attributes.items():
        setattr(made, attribute, value)
    return made


def call_tool(
    spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Coroutine[Any, Any, Any]:
    """What awaiting a tool function (or :func:`haltwise.step`) awaits: one step of the current
    run (its executor's coroutine: no frame in between); outside a task, or inside another
    step (a tool calling a tool: the inner call is part of the outer step), just the function.
    """
    run = CURRENT_RUN.get()
    if run is None or CURRENT_STEP.get() is not None:
        return _call_plainly(spec, args, kwargs)
    return run.execute(run, spec, args, kwargs)


async def _call_plainly(spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if spec.is_async:
        return await spec.fn(*args, **kwargs)
    return spec.fn(*args, **kwargs)


#: Every task declared in this process, by name (what a run records as its ``task``).
TASKS: dict[str, Task[..., Any]] = {}


def register_task(task: Task[..., Any]) -> None:
    """Add ``task`` to :data:`TASKS`; a different function under a taken name is refused.

    A run is resumed by its task's name, so two tasks of one name in a process would make a
    resume run whichever came last: :class:`~haltwise.PolicyError` at the second declaration.
    The same function declared again (its module loaded again) replaces the earlier one, and so
    does a task of another file with the same file name (``dir1/agent.py`` then ``dir2/agent.py``,
    both ``agent.py:research``): such runs record their file, and are resumed from it.
    """
    earlier = TASKS.get(task.name)
    other_file = task.source is not None and earlier is not None and earlier.source != task.source
    if (
        earlier is not None
        and not other_file
        and qualified_name(earlier.fn) != qualified_name(task.fn)
    ):
        raise PolicyError(
            f"a task named {task.name!r} is already declared ({qualified_name(earlier.fn)}); "
            f"{qualified_name(task.fn)} needs another name (@haltwise.task(name=...))"
        )
    TASKS[task.name] = task


class Task(Generic[P, R]):
    """An async function whose runs are journaled, cancellable and resumable.

    Start it with :meth:`haltwise.Runtime.start` or :func:`haltwise.run`. Awaited inside another
    task's run, it runs as a child run ``PARENT_ID/STEP_INDEX``: one step of the parent,
    journaled and resumed with it, cancelled (reason ``"parent"``) when the parent is. Called
    outside any run it raises :class:`~haltwise.NotInTaskError`.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]],
        on_cancel: OnCancel,
        name: str,
        *,
        source: str | None = None,
        register: bool = True,
        budget: Budget | None = None,
    ) -> None:
        self.fn = fn
        self.on_cancel = on_cancel
        self.name = name
        #: what each run of the task may spend, unless its start gives its own (None: no limit)
        self.budget = budget
        #: the absolute path of the script or file that defines the task when it is not an
        #: importable module (``python agent.py``, a file the command line loaded): runs record
        #: it, so that ``haltwise resume`` can load the task again
        self.source = source
        self.signature = inspect.signature(fn)
        self._as_step: Tool[..., Any] | None = None
        functools.update_wrapper(self, fn)
        if register:
            register_task(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        if CURRENT_RUN.get() is None:
            raise NotInTaskError(
                f"task {self.name!r} was called directly; start it with Runtime.start() "
                "or haltwise.run()"
            )
        if self._as_step is None:
            from .children import CHILD_POLICY, child_body

            spec = ToolSpec(
                child_body(self), CHILD_POLICY, self.name, register=False, counts_calls=False
            )
            self._as_step = tool_function(spec)
        return self._as_step(*args, **kwargs)

    def bind_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise :class:`~haltwise.InputError` if the arguments do not fit the task's parameters."""
        from .._core.exceptions import InputError

        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise InputError(f"task {self.name!r}: {error}") from None

    def __repr__(self) -> str:
        return f"<haltwise.Task {self.name} on_cancel={self.on_cancel.value}>"


@overload
def tool(fn: Callable[P, Awaitable[R]], /) -> Tool[P, R]: ...
@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    cancel: str | CancelPolicy | None = None,
    effect: str | Effect | None = None,
    idempotent: bool = False,
    compensate: Callable[..., Any] | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    retries: int = 0,
    backoff: tuple[float, float, float] | None = None,
    reconcile: Callable[..., Any] | None = None,
    name: str | None = None,
    approval: str | Callable[..., bool] | None = None,
    approval_timeout: float | None = None,
) -> Callable[[Callable[P, Any]], Tool[P, Any]]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    cancel: str | CancelPolicy | None = None,
    effect: str | Effect | None = None,
    idempotent: bool = False,
    compensate: Callable[..., Any] | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    retries: int = 0,
    backoff: tuple[float, float, float] | None = None,
    reconcile: Callable[..., Any] | None = None,
    name: str | None = None,
    approval: str | Callable[..., bool] | None = None,
    approval_timeout: float | None = None,
) -> Any:
    """Declare a tool and its cancel policy (CONTRACT.md, "Tool policies").

    ``cancel``: ``"interruptible"``, ``"finish"`` or ``"rollback"``; left out, the tool behaves
    as ``"finish"`` and ``audit`` reports it. ``effect``: ``"none"``, ``"read"``, ``"write"`` or
    ``"external"`` (the default, the cautious assumption). ``idempotent=True`` promises that a
    second call with the same :func:`haltwise.idempotency_key` is harmless. ``compensate`` (needed
    by ``rollback``) is called with the same arguments as the tool, shielded, within ``grace``
    seconds (default 30).

    ``timeout`` (seconds; ``interruptible`` and ``rollback`` tools only): a call that runs
    longer is stopped as a cancel of that step alone would stop it (interrupted; a rollback
    call is then compensated) and the step is ``failed`` with
    :class:`~haltwise.StepTimeoutError`, which the task sees as an ordinary exception.
    ``retries``: a failed attempt (an exception, a timeout) is run again in the same step, at
    most that many times, with the same idempotency key, after a wait of ``backoff =
    (first_s, factor, max_s)`` (default ``(1, 2, 30)``: 1 s, 2 s, 4 s ... at most 30 s; no
    jitter). A rollback call's failed attempt is compensated before the next; a cancel is never
    retried, and one that arrives during the wait lands at once; an attempt whose compensation
    failed (``unknown``) is not retried.

    ``reconcile`` finds out what happened to a step left ``unknown`` (grace ran out, a forced
    cancel, a crash mid-call): called with the same arguments as the tool (plain or async;
    :func:`haltwise.idempotency_key` inside it gives the step's key), it returns
    :class:`~haltwise.Happened` ``(result)`` (the step becomes ``committed`` with that
    result), :class:`~haltwise.NotHappened` ``()`` (``interrupted``: it runs again on resume)
    or None when it cannot tell (an exception counts as None: the step stays ``unknown``).
    Resume, a worker's takeover, ``haltwise reconcile`` and the API ask it before they refuse.

    ``approval="required"`` (or a function of the call's arguments returning whether this call
    needs one): inside a run, the call first journals an approval request as its step (status
    ``awaiting``) and waits for a decision (``haltwise approve`` / ``refuse``,
    :meth:`Runtime.decide`, the API, the dashboard); approved, it runs (with the edited
    arguments if edited); refused, the step is ``refused`` and the call raises
    :class:`~haltwise.ApprovalRefused`. ``approval_timeout`` (seconds): a request not decided
    by then is ``expired`` (:class:`~haltwise.ApprovalExpired`); without it a request waits
    until decided or the run is cancelled. CONTRACT.md, "Someone else decides". Bad
    declarations raise :class:`~haltwise.PolicyError` here, at once.
    """

    def decorate(function: Callable[..., Any]) -> Tool[..., Any]:
        if not callable(function):
            raise PolicyError(f"@haltwise.tool needs a function, not {function!r}")
        tool_name = name or function.__name__
        policy = _policy(
            tool_name,
            cancel,
            effect,
            idempotent,
            compensate,
            grace,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            reconcile=reconcile,
        )
        needs = approval_rule(tool_name, approval, approval_timeout)
        return tool_function(ToolSpec(function, policy, tool_name, approval=needs))

    return decorate if fn is None else decorate(fn)


def _policy(
    name: str,
    cancel: str | CancelPolicy | None,
    effect: str | Effect | None,
    idempotent: bool,
    compensate: Callable[..., Any] | None,
    grace: float | None,
    *,
    timeout: float | None,
    retries: int,
    backoff: tuple[float, float, float] | None,
    reconcile: Callable[..., Any] | None = None,
) -> ToolPolicy:
    """The policy the keywords of :func:`tool` (and :func:`step`) declare, validated."""
    return ToolPolicy.declare(
        name=name,
        cancel=cancel,
        effect=effect,
        idempotent=idempotent,
        compensate=compensate,
        grace=grace,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        reconcile=reconcile,
    )


#: haltwise.approval() steps' specs, by (name, timeout)
_APPROVAL_SPECS: dict[tuple[str, float | None], ToolSpec] = {}


async def approval(name: str, *, payload: Any = None, timeout: float | None = None) -> Decision:
    """Ask for a decision that is no tool call (CONTRACT.md, "Someone else decides"): its
    request is a step of its own, named ``name``, showing ``payload`` (JSON) to the approver.

    Returns a :class:`~haltwise.Decision` when approved (``payload`` the edited one if the
    approver edited it) or refused (``approved=False``); raises
    :class:`~haltwise.ApprovalExpired` when nobody decided within ``timeout`` seconds (None:
    wait until decided or the run is cancelled). Replayed on resume like any step. Outside a
    task it raises :class:`~haltwise.NotInTaskError`.
    """
    if CURRENT_RUN.get() is None or CURRENT_STEP.get() is not None:
        raise NotInTaskError("haltwise.approval() is only available inside a running task")
    spec = _APPROVAL_SPECS.get((name, timeout))
    if spec is None:
        policy = _policy(
            name, "interruptible", "none", True, None, None, timeout=None, retries=0, backoff=None
        )
        needs = approval_rule(name, "required", timeout)
        spec = ToolSpec(decided_payload, policy, name, register=False, approval=needs)
        if len(_APPROVAL_SPECS) < _STEP_SPECS_MAX:
            _APPROVAL_SPECS[(name, timeout)] = spec
    try:
        result = await call_tool(spec, (), {"payload": payload})
    except ApprovalExpired:
        raise
    except ApprovalRefused as refused:
        return refused_decision(refused, payload)
    return decision_of(result)


#: haltwise.step() declarations seen so far, by their arguments (bounded: see _step_spec)
_STEP_SPECS: dict[tuple[Any, ...], ToolSpec] = {}
_STEP_SPECS_MAX = 1024


async def step(
    fn: Callable[..., Any],
    /,
    *args: Any,
    name: str | None = None,
    cancel: str | CancelPolicy | None = None,
    effect: str | Effect | None = None,
    idempotent: bool = False,
    compensate: Callable[..., Any] | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    retries: int = 0,
    backoff: tuple[float, float, float] | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` as one step of the current run, under the policy given here.

    The keywords are those of :func:`tool` (``name`` defaults to ``fn``'s ``__name__``); the
    step is journaled, replayed on resume and settled on a cancel exactly as a call of a
    decorated tool would be. This is how a call that is not a module-level tool becomes a step:
    a model request (``cancel="interruptible", effect="read"``), a remote MCP call. ``fn`` may
    be async or plain (a plain one runs in a worker thread). Outside a task it just calls
    ``fn`` (and awaits it if it is async). A bad declaration raises
    :class:`~haltwise.PolicyError`.
    """
    spec = _step_spec(
        fn, name, (cancel, effect, idempotent, compensate, grace, timeout, retries, backoff)
    )
    return await call_tool(spec, args, kwargs)


async def model_step(
    fn: Callable[..., Any], /, *args: Any, name: str, model: str | None = None
) -> Any:
    """``await fn(*args)`` as a model request: an :func:`adapter_step` whose tokens are its spend
    (see ``budget.model_usage``); ``model`` names the model asked, for its span
    (``chat {model}``)."""
    token = REQUESTED_MODEL.set(model)
    try:
        return await adapter_step(fn, *args, name=name)
    finally:
        REQUESTED_MODEL.reset(token)


async def adapter_step(fn: Callable[..., Any], /, *args: Any, name: str) -> Any:
    """``await fn(*args)`` as one step (``interruptible``, ``read``) that an adapter takes for
    its own bookkeeping (a model request, an OpenAI Agents session's length): journaled and
    replayed as any step, but not a tool call of the run's budget (CONTRACT.md, "Budgets":
    tool calls are the agent's)."""
    spec = _step_spec(
        fn, name, ("interruptible", "read", False, None, None, None, 0, None), counts_calls=False
    )
    return await call_tool(spec, args, {})


def _step_spec(
    fn: Callable[..., Any],
    name: str | None,
    declared: tuple[Any, ...],
    *,
    counts_calls: bool = True,
) -> ToolSpec:
    """The spec of a haltwise.step() call, declared once per distinct set of arguments.

    ``declared``: the policy keywords of :func:`step`, in the order of :func:`_policy`'s.
    """
    key: tuple[Any, ...] = (fn, name, *declared, counts_calls)
    try:
        found = _STEP_SPECS.get(key)
    except TypeError:  # an unhashable callable: declared afresh each time
        key, found = (), None
    if found is not None:
        return found
    if not callable(fn):
        raise PolicyError(f"haltwise.step() needs a callable, not {fn!r}")
    step_name = name or getattr(fn, "__name__", None) or type(fn).__name__
    cancel, effect, idempotent, compensate, grace, timeout, retries, backoff = declared
    policy = _policy(
        step_name,
        cancel,
        effect,
        idempotent,
        compensate,
        grace,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
    )
    # Registered only if a takeover may need it to compensate after a crash.
    spec = ToolSpec(
        fn, policy, step_name, register=policy.compensate is not None, counts_calls=counts_calls
    )
    if key:
        if len(_STEP_SPECS) >= _STEP_SPECS_MAX:
            _STEP_SPECS.clear()  # bound methods of short-lived objects must not pile up
        _STEP_SPECS[key] = spec
    return spec


@overload
def task(fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
@overload
def task(
    *,
    on_cancel: str | OnCancel = "keep",
    name: str | None = None,
    budget: Budget | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Task[P, R]]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    on_cancel: str | OnCancel = OnCancel.KEEP,
    name: str | None = None,
    budget: Budget | None = None,
) -> Any:
    """Declare an async function as a task: its runs are journaled, cancellable and resumable.

    ``on_cancel="keep"`` (default) leaves committed steps committed when the run is cancelled;
    ``"compensate"`` runs the compensations of its committed ``rollback`` steps in reverse order.
    A task that is not an ``async def`` raises :class:`~haltwise.PolicyError`. Its ``name``
    (default ``module:qualname``) is what runs record and what ``resume`` looks it up by.
    ``budget`` (a :class:`~haltwise.Budget`) is what each run may spend, unless its start gives
    its own (CONTRACT.md, "Budgets"); anything else raises :class:`~haltwise.PolicyError`.
    """
    if budget is not None and not isinstance(budget, Budget):
        raise PolicyError(f"@haltwise.task(budget=...) needs a haltwise.Budget, not {budget!r}")
    try:
        policy = OnCancel(on_cancel)
    except ValueError:
        raise PolicyError(
            f"unknown on_cancel={on_cancel!r}; expected 'keep' or 'compensate'"
        ) from None

    def decorate(function: Callable[..., Any]) -> Task[..., Any]:
        if not inspect.iscoroutinefunction(function):
            label = getattr(function, "__name__", function)
            raise PolicyError(
                f"@haltwise.task needs an async function; {label!r} is not one (write 'async def')"
            )
        default_name, source = _name_and_source(function)
        return Task(function, policy, name or default_name, source=source, budget=budget)

    return decorate if fn is None else decorate(fn)


#: The module names files get when the command line loads them (see loader.module_name_for).
_LOADED_FILE_PREFIX = "haltwise_user_"


def _name_and_source(function: Callable[..., Any]) -> tuple[str, str | None]:
    """A task's default name (``module:qualname``) and its source file.

    A task defined in a script (``python agent.py``: module ``__main__``) or in a file the
    command line loaded (an internal module name) is named after its file, ``agent.py:quick``,
    as the command line names it, and its file's path is kept: a name like
    ``__main__:research`` could not be resumed from any other process.
    """
    module_name = function.__module__
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file and (module_name == "__main__" or module_name.startswith(_LOADED_FILE_PREFIX)):
        path = Path(file).resolve()
        return f"{path.name}:{function.__qualname__}", str(path)
    return f"{module_name}:{function.__qualname__}", None
