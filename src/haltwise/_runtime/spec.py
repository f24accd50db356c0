"""What the runtime knows of a declared tool (:class:`ToolSpec`), the registry of every tool
declared in this process, and the :class:`Tool` protocol a tool function satisfies.

This module imports nothing of the runtime: the run's context, the step executor, the tool
description (``describe``) and the child step (``children``) all read tools from here, and
``tool`` (the decorators) builds on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from .._core.policy import CancelPolicy, ToolPolicy

P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)


class ToolRegistry:
    """Every tool declared in this process, by its qualified key (see :attr:`ToolSpec.key`).

    Tool names need not be unique: two modules may each declare a tool ``insert``. The journal
    shows a step's tool by name; a rollback step also records its tool's key, so that a takeover
    compensates with exactly the function that ran (:meth:`find`), never with a namesake. A
    tool declared again under the same key (a module loaded again) replaces the earlier one.
    """

    def __init__(self) -> None:
        self._by_key: dict[str, ToolSpec] = {}
        self._keys_by_name: dict[str, dict[str, None]] = {}

    def add(self, spec: ToolSpec) -> None:
        self._by_key[spec.key] = spec
        self._keys_by_name.setdefault(spec.name, {})[spec.key] = None

    def find(self, name: str, key: str | None = None) -> ToolSpec | None:
        """The tool of that key if given and declared; else the only tool of that name.

        None when no tool of the name is declared, or several are and ``key`` does not say
        which: a caller then knows nothing of the tool rather than something of the wrong one.
        """
        if key is not None and key in self._by_key:
            return self._by_key[key]
        keys = self._keys_by_name.get(name, {})
        return self._by_key[next(iter(keys))] if len(keys) == 1 else None

    def values(self) -> list[ToolSpec]:
        return list(self._by_key.values())


#: Every tool declared in this process: compensations after a takeover find them here.
TOOLS = ToolRegistry()


class ToolSpec:
    """What the runtime knows about one tool: its function, its policy and its name.

    ``fn`` is the function as written (async or plain); :func:`haltwise.testing.explore` swaps it
    for a counting wrapper while it runs, which is why the tool function looks it up per call.
    """

    __slots__ = (
        "approval",
        "counts_calls",
        "defer_settle",
        "defer_start",
        "effective_cancel",
        "fn",
        "hooked",
        "is_async",
        "keeps_args",
        "key",
        "name",
        "policy",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        policy: ToolPolicy,
        name: str,
        *,
        register: bool = True,
        approval: Any = None,
        counts_calls: bool = True,
    ) -> None:
        self.fn = fn
        #: the tool's approval rule (``approvals.ApprovalRule``), None when it needs none
        self.approval = approval
        #: each attempt of a call is a tool call of the run's budget (a model request and a
        #: child step are not: the child's own calls count)
        self.counts_calls = counts_calls
        self.policy = policy
        self.name = name
        self.is_async = is_async_callable(fn)
        #: the policy's behaviour on cancel and whether a committed settlement may ride with the
        #: next write: read at every step, so worked out once here
        self.effective_cancel = policy.effective_cancel
        self.defer_settle = policy.may_defer_settle
        #: whether the step's start may begin the body before it is synced to the disk
        self.defer_start = policy.may_defer_start
        #: a step left ``unknown`` has a ``reconcile`` hook to ask (an idempotent one's too: a
        #: ``Happened`` saves the call), which is called with the call's arguments: they are
        #: journaled, as a rollback tool's are (for its compensation after a crash)
        self.hooked = policy.reconcile is not None
        self.keeps_args = self.effective_cancel is CancelPolicy.ROLLBACK or self.hooked
        #: ``name@module:qualname``: what tells this tool from others of the same name
        self.key = f"{name}@{qualified_name(fn)}"
        if register:
            TOOLS.add(self)

    def __repr__(self) -> str:
        cancel = self.policy.cancel.value if self.policy.cancel else "undeclared"
        return f"<haltwise tool {self.name} cancel={cancel} effect={self.policy.effect.value}>"


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function (or of a callable object's class)."""
    owner = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(owner, '__module__', '?')}:{getattr(owner, '__qualname__', '?')}"


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def``, or an object whose
    ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not callable()
    )


@runtime_checkable
class Tool(Protocol[P, R_co]):
    """A tool, as ``@haltwise.tool`` returns it: a real ``async def`` function.

    It keeps the decorated function's name, docstring and signature (``functools.wraps``), so
    ``inspect.iscoroutinefunction(tool)`` is True and ``inspect.signature(tool)`` is the
    function's own: any framework can introspect it. Awaited inside a running task, a call is
    one step, journaled and executed under the policy (a plain function in a worker thread);
    outside a task it simply runs the function. ``isinstance(obj, haltwise.Tool)`` is True for
    such functions.

    Attributes: ``policy`` (the :class:`~haltwise.CancelPolicy`, effect, grace...), ``name``,
    ``description`` (the docstring plus one sentence on what a cancel does to a call, for the
    model) and ``schema(format)`` (``"openai"`` or ``"mcp"``, see :meth:`schema`).
    """

    policy: ToolPolicy
    name: str
    description: str
    __haltwise_tool__: ToolSpec

    def schema(self, format: str = "openai") -> dict[str, Any]:
        """The tool as OpenAI function calling (``"openai"``) or MCP ``tools/list`` (``"mcp"``,
        with hints derived from ``effect`` and ``idempotent``) want it."""
        ...  # pragma: no cover - a protocol

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]: ...


def spec_of(tool: object) -> ToolSpec | None:
    """The :class:`ToolSpec` behind a tool function (or the spec itself), else None."""
    if isinstance(tool, ToolSpec):
        return tool
    spec = getattr(tool, "__haltwise_tool__", None)
    return spec if isinstance(spec, ToolSpec) else None


def as_spec(tool: object) -> ToolSpec:
    """:func:`spec_of`, for callers that were handed a tool: anything else is a TypeError."""
    spec = spec_of(tool)
    if spec is None:
        raise TypeError(f"{tool!r} is not a @haltwise.tool")
    return spec
