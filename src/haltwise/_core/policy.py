"""Tool cancel policies and effects: what a cancel in the middle of a tool call does."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, TypeVar

from .exceptions import PolicyError

#: Seconds a ``finish`` (or undeclared) call may run on after a cancel, and a compensation may take.
DEFAULT_GRACE = 30.0


class CancelPolicy(StrEnum):
    """What a cancel does to a call that is in flight (CONTRACT.md, "Tool policies")."""

    #: interrupted at once (async: at its next await; plain: may poll ``cancel_requested()``)
    INTERRUPTIBLE = "interruptible"
    #: shielded and allowed to finish within ``grace``; its result is journaled
    FINISH = "finish"
    #: interrupted, then ``compensate(*args, **kwargs)`` runs, shielded, within ``grace``
    ROLLBACK = "rollback"


class Effect(StrEnum):
    """What a tool does to the world; drives retry advice and ``audit``."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    #: reaches outside: a paid API, an e-mail, a queue
    EXTERNAL = "external"

    @property
    def repeats_harm(self) -> bool:
        """True if running the call twice may do something twice (``write``/``external``)."""
        return self in (Effect.WRITE, Effect.EXTERNAL)


def effective_cancel(declared: CancelPolicy | str | None) -> CancelPolicy:
    """What a cancel does to a call of a tool that declared ``declared`` (a policy, its journaled
    value, or None): the declared policy, and ``finish`` when none was declared (CONTRACT.md,
    "Tool policies": not declared behaves as ``finish``)."""
    if type(declared) is CancelPolicy:
        return declared  # the common case, without the enum's lookup by value
    return CancelPolicy(declared) if declared else CancelPolicy.FINISH


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a step waits before each retry: ``first`` seconds before the first, then
    ``factor`` times longer each time, never more than ``max``. No jitter: the waits are the
    same in every run (a cancel during one lands at once)."""

    first: float = 1.0
    factor: float = 2.0
    max: float = 30.0

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        return float(min(self.max, self.first * self.factor ** (retry - 1)))


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The declared (or defaulted) policy of one tool.

    ``cancel`` is ``None`` when the tool declared none: it then *behaves* as
    :attr:`CancelPolicy.FINISH` (see :attr:`effective_cancel`) and ``audit`` reports the gap.
    ``effect_declared`` is False when ``effect`` is the cautious default, ``external``.
    """

    cancel: CancelPolicy | None = None
    effect: Effect = Effect.EXTERNAL
    idempotent: bool = False
    compensate: Callable[..., Any] | None = None
    grace: float = DEFAULT_GRACE
    effect_declared: bool = False
    grace_declared: bool = False
    #: seconds a call may run before it is stopped as a cancel of that step alone would stop it,
    #: then recorded ``failed`` with ``StepTimeoutError``; None: no limit
    timeout: float | None = None
    #: failed attempts (an exception, a timeout) retried in the same step, at most this many
    retries: int = 0
    backoff: Backoff = Backoff()
    #: asked what happened to an ``unknown`` step: ``reconcile(*args, **kwargs)`` returns
    #: ``haltwise.Happened(result)``, ``haltwise.NotHappened()`` or None (CONTRACT.md)
    reconcile: Callable[..., Any] | None = None

    @property
    def effective_cancel(self) -> CancelPolicy:
        """The behaviour on cancel: the declared policy, ``finish`` when undeclared."""
        return effective_cancel(self.cancel)

    @property
    def may_defer_settle(self) -> bool:
        """Whether the runtime may go on before this tool's committed settlement is durable.

        True when losing the settlement in a crash is harmless: the step is then seen as
        crashed mid-call, and a step that only reads, or is idempotent, simply runs again.
        """
        return not self.effect.repeats_harm or self.idempotent

    @property
    def may_defer_start(self) -> bool:
        """Whether this tool's step may begin before its start is on the disk (committed, but
        not yet synced: a crash of the machine may lose it, a crash of the process may not).

        True when losing the start is harmless: a step the journal does not hold runs again on
        resume, as a step left ``running`` by a dead owner would if it is interruptible or
        idempotent (and not one to compensate: a takeover compensates a ``rollback`` step it
        finds started). Any later synced commit (a settlement that may not be deferred, a
        partial result, a final transition) syncs the start with it.
        """
        return self.may_defer_settle and self.effective_cancel is not CancelPolicy.ROLLBACK

    @classmethod
    def declare(
        cls,
        *,
        name: str,
        cancel: str | CancelPolicy | None,
        effect: str | Effect | None,
        idempotent: bool,
        compensate: Callable[..., Any] | None,
        grace: float | None,
        timeout: float | None = None,
        retries: int = 0,
        backoff: tuple[float, float, float] | None = None,
        reconcile: Callable[..., Any] | None = None,
    ) -> ToolPolicy:
        """Validate the arguments of ``@haltwise.tool`` and build the policy.

        Raises :class:`PolicyError` (naming the tool) for an unknown ``cancel=`` or ``effect=``,
        a non-callable ``compensate``, a grace that is negative, not a number, or not finite, a
        ``timeout`` that is not a finite number of seconds > 0 or is given to a ``finish`` or
        undeclared tool (such a call cannot be stopped), ``retries`` that is not a whole number
        >= 0, or a ``backoff`` that is not ``(first_s, factor, max_s)`` with
        ``0 <= first_s <= max_s`` and ``factor >= 1``, or a non-callable ``reconcile``.
        ``rollback`` without ``compensate`` is accepted: ``audit`` reports it
        (``rollback-without-compensate``), and a call cancelled mid-way, having nothing to undo
        it, becomes ``unknown``.
        """
        cancel_policy = None if cancel is None else _parse(CancelPolicy, cancel, "cancel", name)
        effect_value = Effect.EXTERNAL if effect is None else _parse(Effect, effect, "effect", name)
        if compensate is not None and not callable(compensate):
            raise PolicyError(f"tool {name!r}: compensate= must be callable", tool=name)
        if reconcile is not None and not callable(reconcile):
            raise PolicyError(f"tool {name!r}: reconcile= must be callable", tool=name)
        if not isinstance(idempotent, bool):
            raise PolicyError(f"tool {name!r}: idempotent= must be True or False", tool=name)
        return cls(
            cancel=cancel_policy,
            effect=effect_value,
            idempotent=idempotent,
            compensate=compensate,
            grace=_parse_grace(grace, name),
            effect_declared=effect is not None,
            grace_declared=grace is not None,
            timeout=_parse_timeout(timeout, cancel_policy, name),
            retries=_parse_retries(retries, name),
            backoff=_parse_backoff(backoff, name),
            reconcile=reconcile,
        )


_E = TypeVar("_E", bound=Enum)


def _parse(enum: type[_E], value: object, option: str, name: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in enum)
        raise PolicyError(
            f"tool {name!r}: unknown {option}={value!r}; expected one of {allowed}", tool=name
        ) from None


def _parse_grace(grace: float | None, name: str) -> float:
    if grace is None:
        return DEFAULT_GRACE
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise PolicyError(f"tool {name!r}: grace= must be a number of seconds", tool=name)
    if not 0 <= grace < float("inf"):
        raise PolicyError(
            f"tool {name!r}: grace= must be a finite number of seconds >= 0, not {grace}",
            tool=name,
        )
    return float(grace)


def _seconds(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and not math.isnan(value)


def _parse_timeout(timeout: float | None, cancel: CancelPolicy | None, name: str) -> float | None:
    if timeout is None:
        return None
    if not _seconds(timeout) or not 0 < timeout < math.inf:
        raise PolicyError(
            f"tool {name!r}: timeout= must be a finite number of seconds > 0, not {timeout!r}",
            tool=name,
        )
    if cancel not in (CancelPolicy.INTERRUPTIBLE, CancelPolicy.ROLLBACK):
        declared = f"cancel={cancel.value!r}" if cancel else "no cancel= (so 'finish')"
        raise PolicyError(
            f"tool {name!r}: timeout= needs a call that can be stopped, and it has {declared}; "
            "declare cancel='interruptible' or 'rollback'",
            tool=name,
        )
    return float(timeout)


def _parse_retries(retries: int, name: str) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise PolicyError(
            f"tool {name!r}: retries= must be a whole number >= 0, not {retries!r}", tool=name
        )
    return retries


def _parse_backoff(backoff: tuple[float, float, float] | None, name: str) -> Backoff:
    if backoff is None:
        return Backoff()
    wrong = PolicyError(
        f"tool {name!r}: backoff= must be (first_s, factor, max_s) with 0 <= first_s <= max_s "
        f"and factor >= 1, all finite, not {backoff!r}",
        tool=name,
    )
    if not isinstance(backoff, tuple | list) or len(backoff) != 3:
        raise wrong
    first, factor, most = backoff
    if not all(_seconds(v) and math.isfinite(v) for v in backoff):
        raise wrong
    if not (0 <= first <= most and factor >= 1):
        raise wrong
    return Backoff(float(first), float(factor), float(most))


class OnCancel(StrEnum):
    """What a task does with its committed steps when it is cancelled."""

    #: committed steps stay committed (the default)
    KEEP = "keep"
    #: compensate every committed ``rollback`` step, in reverse order (a saga)
    COMPENSATE = "compensate"
