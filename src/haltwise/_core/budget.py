"""Budgets: what a run may spend, what it spent, and when a limit is reached (CONTRACT.md,
"Someone else decides: approvals and budgets").

A :class:`Budget` is declared on a task (``@haltwise.task(budget=...)``) or given to one run
(``Runtime.start(..., budget=...)``, ``--budget usd=5,tokens=200000,tool_calls=50``); the run
keeps it in its inputs (``"budget"``), so every process that loads the run knows its limit.
Spend is journaled with the step that spent it (the step's ``usd``, ``tokens`` and ``calls``
columns, written by its settlement); a step's tool calls are its attempts, unless its
settlement says otherwise (a model request counts none; a child step counts its child's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, final

from .exceptions import InputError


class StepSpend(Protocol):
    """What the spend of a journaled step is read from (a :class:`~haltwise.StepRecord`)."""

    @property
    def attempts(self) -> int: ...

    @property
    def usd(self) -> float | None: ...

    @property
    def tokens(self) -> int | None: ...

    @property
    def calls(self) -> int | None: ...


#: the reason of a run cancelled, or paused, because a limit of its budget was reached
BUDGET_REASON = "budget"


class OnExhaust(StrEnum):
    """What a run does once a limit of its budget is reached."""

    #: the run is cancelled with reason ``"budget"`` (in-flight steps settle by their policies)
    CANCEL = "cancel"
    #: the run is paused with reason ``"budget"`` until its limit is raised
    PAUSE = "pause"


#: a model's prices: US dollars per million input tokens, per million output tokens
Prices = Mapping[str, tuple[float, float]]


@final
@dataclass(frozen=True, slots=True)
class Budget:
    """What a run may spend: ``usd`` (US dollars), ``tokens`` (model tokens, input plus
    output), ``tool_calls`` (tool calls begun). A limit left out (None) is no limit.

    A limit is reached when the run's spend is at least the limit (no step begins after that);
    ``tool_calls=N`` lets N calls begin and the next never does. ``on_exhaust`` says what
    happens then (``"cancel"`` or ``"pause"``). ``prices`` maps a model's name to
    ``(usd_per_million_input, usd_per_million_output)``: a model request of a named model costs
    ``usd`` too. Raises
    :class:`~haltwise.InputError` for a value that is not a limit (negative, not a number).
    """

    usd: float | None = None
    tokens: int | None = None
    tool_calls: int | None = None
    on_exhaust: str = "cancel"
    prices: Prices = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_number("usd", self.usd, integer=False)
        _check_number("tokens", self.tokens, integer=True)
        _check_number("tool_calls", self.tool_calls, integer=True)
        try:
            object.__setattr__(self, "on_exhaust", OnExhaust(self.on_exhaust))
        except ValueError:
            raise InputError(
                f"Budget(on_exhaust={self.on_exhaust!r}): expected 'cancel' or 'pause'"
            ) from None
        if not isinstance(self.prices, Mapping):
            raise InputError("Budget(prices=...) is a mapping {model: (usd_in, usd_out)}")
        prices: dict[str, tuple[float, float]] = {}
        for model, pair in self.prices.items():
            if (
                not isinstance(model, str)
                or not isinstance(pair, tuple | list)
                or len(pair) != 2
                or not all(_is_price(value) for value in pair)
            ):
                raise InputError(
                    f"Budget(prices=...): {model!r} needs (usd_per_million_input, "
                    "usd_per_million_output), two numbers >= 0"
                )
            prices[model] = (float(pair[0]), float(pair[1]))
        object.__setattr__(self, "prices", prices)

    def limit_json(self) -> dict[str, Any]:
        """The ``"limit"`` object of ``status --json`` (and what a run keeps in its inputs)."""
        data: dict[str, Any] = {
            "usd": self.usd,
            "tokens": self.tokens,
            "tool_calls": self.tool_calls,
            "on_exhaust": str(self.on_exhaust),
        }
        if self.prices:
            data["prices"] = {model: list(pair) for model, pair in self.prices.items()}
        return data

    @classmethod
    def from_json(cls, data: Any) -> Budget | None:
        """The budget a run keeps in its inputs (None: none, or not a budget)."""
        if not isinstance(data, dict):
            return None
        try:
            prices = {model: tuple(pair) for model, pair in (data.get("prices") or {}).items()}
            return cls(
                usd=data.get("usd"),
                tokens=data.get("tokens"),
                tool_calls=data.get("tool_calls"),
                on_exhaust=data.get("on_exhaust", "cancel"),
                prices=prices,
            )
        except (InputError, AttributeError, TypeError):
            return None

    def raised(self, other: Budget) -> Budget:
        """This budget with the limits ``other`` gives (an unpause raising it): a limit
        ``other`` leaves out stays as it was; ``on_exhaust`` and ``prices`` stay unless
        ``other`` sets them."""
        return Budget(
            usd=other.usd if other.usd is not None else self.usd,
            tokens=other.tokens if other.tokens is not None else self.tokens,
            tool_calls=other.tool_calls if other.tool_calls is not None else self.tool_calls,
            on_exhaust=self.on_exhaust,
            prices={**self.prices, **other.prices},
        )

    def reached(self, usd: float, tokens: int) -> str | None:
        """The first limit of spend that ``usd`` and ``tokens`` reach (``"usd"``,
        ``"tokens"``): no step begins after that. None while both are under their limits.
        (``tool_calls`` is checked as a call begins: :meth:`calls_spent`.)"""
        if self.usd is not None and usd >= self.usd:
            return "usd"
        if self.tokens is not None and tokens >= self.tokens:
            return "tokens"
        return None

    def calls_spent(self, tool_calls: int) -> bool:
        """Whether ``tool_calls`` calls begun leave none to begin (``tool_calls=N`` lets N
        begin and the next never does)."""
        return self.tool_calls is not None and tool_calls >= self.tool_calls

    def price(self, model: str | None, input_tokens: int, output_tokens: int) -> float:
        """What a model request of ``model`` costs by :attr:`prices` (0 if it is not named)."""
        pair = self.prices.get(model) if model else None
        if pair is None:
            return 0.0
        return (input_tokens * pair[0] + output_tokens * pair[1]) / 1_000_000


def _is_price(value: Any) -> bool:
    """A price: a finite number >= 0."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _check_number(name: str, value: Any, *, integer: bool) -> None:
    """Raise :class:`InputError` unless ``value`` is None or a limit (an integer if
    ``integer``)."""
    if value is None:
        return
    fits = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and (isinstance(value, int) or not integer)
        and math.isfinite(value)
        and value >= 0
    )
    if not fits:
        kind = "an integer" if integer else "a number"
        raise InputError(f"Budget({name}={value!r}): expected {kind} >= 0")


def parse_budget(text: str) -> Budget:
    """``usd=5,tokens=200000,tool_calls=50[,on_exhaust=pause]`` (``--budget``) as a budget;
    :class:`~haltwise.InputError` naming what does not fit."""
    values: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        value = value.strip()
        if not sep or not value:
            raise InputError(f"--budget {text!r}: {part!r} is not NAME=VALUE")
        if name in values:
            raise InputError(f"--budget {text!r}: {name} is given twice")
        if name == "on_exhaust":
            values[name] = value
        elif name in ("tokens", "tool_calls"):
            try:
                values[name] = int(value)
            except ValueError:
                raise InputError(f"--budget {text!r}: {name} is an integer") from None
        elif name == "usd":
            try:
                values[name] = float(value)
            except ValueError:
                raise InputError(f"--budget {text!r}: usd is a number") from None
        else:
            raise InputError(
                f"--budget {text!r}: unknown limit {name!r} (usd, tokens, tool_calls, on_exhaust)"
            )
    if not values:
        raise InputError("--budget needs at least one of usd=, tokens=, tool_calls=")
    return Budget(**values)


@final
@dataclass(frozen=True, slots=True)
class Spent:
    """What a run spent, as its journal says (the ``"spent"`` object of ``status --json``)."""

    usd: float = 0.0
    tokens: int = 0
    tool_calls: int = 0

    @classmethod
    def of(cls, steps: Iterable[StepSpend]) -> Spent:
        """The sum of the steps' journaled spend (a step's tool calls: see :func:`step_calls`)."""
        usd = 0.0
        tokens = 0
        calls = 0
        for step in steps:
            usd += step.usd or 0.0
            tokens += step.tokens or 0
            calls += step_calls(step)
        return cls(usd, tokens, calls)

    def to_json(self) -> dict[str, Any]:
        return {"usd": round(self.usd, 9), "tokens": self.tokens, "tool_calls": self.tool_calls}


def step_calls(step: StepSpend) -> int:
    """The tool calls a journaled step counts: its ``calls`` if its settlement wrote them (a
    model request: 0; a child step: its child run's), else one per attempt begun."""
    return step.attempts if step.calls is None else step.calls


def budget_json(limit: Budget | None, spent: Spent) -> dict[str, Any]:
    """The ``"budget"`` object of ``status --json`` and the API (also without a limit)."""
    return {"limit": None if limit is None else limit.limit_json(), "spent": spent.to_json()}
