"""The explorer's second witness: what tool bodies really ran and what effects really happened.

The journal says what the runtime *believes*; the recorder says what the tools did. While a
:class:`Recorder` watches (``with recorder.watching():``) every tool's function is wrapped, so
that each time a tool body starts as a step it is counted as an :class:`Execution` (run id, step
index, idempotency key, whether it returned and what). An effect cannot be seen from outside, so
a toolkit reports it: it calls :func:`record_effect` when its effect really happens (a card
charged, a row written, a mail sent) and ``record_effect(..., undo=True)`` when a compensation
really undoes one. Outside a watching recorder both are no-ops, so a toolkit may call
:func:`record_effect` unconditionally, in production too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, final

import anyio

from .._core.exceptions import HaltwiseError
from .._runtime.run_context import CURRENT_STEP, current_run
from .._runtime.spec import TOOLS, ToolSpec, as_spec

__all__ = ["EffectRecord", "Execution", "Recorder", "record_effect", "tagged"]


@final
@dataclass(slots=True, eq=False)
class Execution:
    """One start of a tool body as step ``index`` of run ``run_id``.

    ``attempt`` is 0 for the run's first attempt and n for its n-th resume (as tagged by the
    explorer; 0 when nobody tagged). ``ended`` becomes true when the body returned or raised;
    ``returned`` and ``result`` say which. A plain-function body abandoned by a cancel keeps
    running in its thread, so it may end after the run did.
    """

    run_id: str
    index: int
    tool: str
    key: str
    attempt: int
    ended: bool = False
    returned: bool = False
    result: Any = None


@final
@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One call of :func:`record_effect`: an effect that happened, or (``undo``) was undone.

    ``index`` and ``tool`` name the step whose body reported it; both are ``None`` when it was
    reported outside a tool body (a compensation runs after its step's body has ended).
    """

    name: str
    key: str | None
    undo: bool
    run_id: str | None
    index: int | None
    tool: str | None
    attempt: int


#: (run id, attempt) of what the explorer is driving; inherited by the run's task and threads.
_TAG: ContextVar[tuple[str | None, int]] = ContextVar("haltwise_explore_tag", default=(None, 0))
#: The watched tool call in progress, so that a tool calling a tool is not counted twice.
_CALL: ContextVar[Execution | None] = ContextVar("haltwise_watched_call", default=None)
_ACTIVE: Recorder | None = None
_ACTIVE_LOCK = threading.Lock()


def record_effect(name: str, *, key: str | None = None, undo: bool = False) -> None:
    """Report that an effect named ``name`` really happened now (``undo=True``: was undone).

    Call it from a tool body at the moment its effect takes place, and from a compensation when
    it really removes one; never call it for a call that changed nothing (an idempotent tool
    that recognised a key it already served must not report again: that is exactly what the
    explorer checks). ``key`` identifies the effect; inside a tool body it defaults to the
    step's :func:`haltwise.idempotency_key`. An undo with ``key=None`` undoes the latest effect
    of that name in the same run that is not undone yet; with a key, the latest one with that
    key. Outside a watching :class:`Recorder` this does nothing.
    """
    recorder = _ACTIVE
    if recorder is None:
        return
    step = CURRENT_STEP.get()
    call = _CALL.get()
    tag_run, attempt = _TAG.get()
    run = current_run()
    run_id = step.run.run_id if step else run.run_id if run else tag_run
    if key is None and step is not None and not undo:
        key = step.idempotency_key
    recorder.add_effect(
        EffectRecord(
            name=name,
            key=key,
            undo=undo,
            run_id=run_id,
            index=step.index if step else None,
            tool=call.tool if call else None,
            attempt=attempt,
        )
    )


@contextmanager
def tagged(run_id: str, attempt: int) -> Iterator[None]:
    """Tag what starts inside the block (a run, a resume) as ``attempt`` of ``run_id``."""
    token = _TAG.set((run_id, attempt))
    try:
        yield
    finally:
        _TAG.reset(token)


@final
class Recorder:
    """Counts tool executions per (run id, step index) and the effects tools report.

    Thread-safe: plain-function tools report from worker threads. Use :meth:`watching` to
    wrap the tools; :func:`haltwise.testing.explore` does that for you.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executions: list[Execution] = []
        self._effects: list[EffectRecord] = []

    @property
    def executions(self) -> tuple[Execution, ...]:
        """Every recorded execution, in the order the bodies started."""
        with self._lock:
            return tuple(self._executions)

    @property
    def effects(self) -> tuple[EffectRecord, ...]:
        """Every :func:`record_effect` call, in order."""
        with self._lock:
            return tuple(self._effects)

    def executions_of(self, run_id: str, index: int | None = None) -> list[Execution]:
        """The executions of run ``run_id`` (of its step ``index`` only, if given)."""
        return [
            e for e in self.executions if e.run_id == run_id and (index is None or e.index == index)
        ]

    def count(self, run_id: str, index: int) -> int:
        """How many times the body of step ``index`` of run ``run_id`` started."""
        return len(self.executions_of(run_id, index))

    def keys(self, run_id: str, index: int) -> set[str]:
        """The idempotency keys step ``index`` of run ``run_id`` saw, over all its executions."""
        return {e.key for e in self.executions_of(run_id, index)}

    def live_effects(self, run_id: str, *, until_attempt: int | None = None) -> list[EffectRecord]:
        """The effects of run ``run_id`` that happened and were not undone, oldest first.

        Only records of attempts up to ``until_attempt`` count, if it is given. An undo removes
        the latest live effect of its name (and key, if it has one); an undo that matches
        nothing is ignored.
        """
        live: list[EffectRecord] = []
        for record in self.effects:
            if record.run_id != run_id:
                continue
            if until_attempt is not None and record.attempt > until_attempt:
                continue
            if not record.undo:
                live.append(record)
                continue
            for position in range(len(live) - 1, -1, -1):
                if _undoes(record, live[position]):
                    del live[position]
                    break
        return live

    async def quiesce(self, run_id: str, *, timeout: float) -> bool:
        """Wait until no watched body of run ``run_id`` is still running (abandoned threads).

        True if they all ended within ``timeout`` seconds.
        """
        with anyio.move_on_after(timeout):
            while any(not e.ended for e in self.executions_of(run_id)):
                await anyio.sleep(0.002)
            return True
        return False

    @contextmanager
    def watching(self, tools: Iterable[object] | None = None) -> Iterator[Recorder]:
        """Wrap ``tools`` (default: every tool defined so far) to count their executions.

        The original functions are put back when the block ends, whatever happens in it. Only
        one recorder may watch at a time in a process: a second one raises
        :class:`~haltwise.HaltwiseError`. Tools defined after the block began are not watched.
        """
        global _ACTIVE
        chosen = TOOLS.values() if tools is None else map(as_spec, tools)
        watched = list(dict.fromkeys(chosen))
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                raise HaltwiseError("another haltwise.testing.Recorder is already watching")
            _ACTIVE = self
        originals = [(tool, tool.fn) for tool in watched]
        try:
            for tool, fn in originals:
                tool.fn = self._wrap(tool, fn)
            yield self
        finally:
            for tool, fn in originals:
                tool.fn = fn
            with _ACTIVE_LOCK:
                _ACTIVE = None

    # -- recording -------------------------------------------------------------------------------

    def add_effect(self, record: EffectRecord) -> None:
        """Append one effect record (what :func:`record_effect` calls)."""
        with self._lock:
            self._effects.append(record)

    def add_execution(self, execution: Execution) -> None:
        """Append one execution (what the wrapped tools call when a body starts)."""
        with self._lock:
            self._executions.append(execution)

    def _begin(self, tool: ToolSpec) -> Execution | None:
        step = CURRENT_STEP.get()
        if step is None or _CALL.get() is not None:
            return None  # not a step (called outside a task), or a tool called by a tool
        execution = Execution(
            run_id=step.run.run_id,
            index=step.index,
            tool=tool.name,
            key=step.idempotency_key,
            attempt=_TAG.get()[1],
        )
        self.add_execution(execution)
        return execution

    def _wrap(self, tool: ToolSpec, fn: Callable[..., Any]) -> Callable[..., Any]:
        if tool.is_async:

            @functools.wraps(fn)
            async def watched_async(*args: Any, **kwargs: Any) -> Any:
                call = self._begin(tool)
                if call is None:
                    return await fn(*args, **kwargs)
                token = _CALL.set(call)
                try:
                    return _returned(call, await fn(*args, **kwargs))
                finally:
                    call.ended = True
                    _CALL.reset(token)

            return watched_async

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            call = self._begin(tool)
            if call is None:
                return fn(*args, **kwargs)
            token = _CALL.set(call)
            try:
                return _returned(call, fn(*args, **kwargs))
            finally:
                call.ended = True
                _CALL.reset(token)

        return watched


def _returned(call: Execution, value: Any) -> Any:
    call.returned = True
    call.result = value
    return value


def _undoes(undo: EffectRecord, done: EffectRecord) -> bool:
    return done.name == undo.name and (undo.key is None or done.key == undo.key)
