"""A tool's ``reconcile=`` hook and its answers (CONTRACT.md, "Tool policies").

A step left ``unknown`` (grace ran out, a forced cancel, a crash mid-call) may or may not have
had its effect. A tool that can find out (a payment provider asked by idempotency key) declares
``reconcile=fn``; ``fn(*args, **kwargs)`` answers :class:`Happened` (with the call's result),
:class:`NotHappened`, or ``None`` when it cannot tell. Each answer, and each answer an operator
gives (``--assume-done``, ``--rerun``), is journaled with the step as a :class:`Reconciled`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, final

__all__ = ["HOOK_NOT_ASKED", "Answer", "By", "Happened", "NotHappened", "Reconciled"]


@final
@dataclass(frozen=True, slots=True)
class Happened:
    """A ``reconcile`` hook's answer: the call happened, and ``result`` is what it returned.

    The step becomes ``committed`` with ``result`` (JSON-serialisable), which a resume replays.
    """

    result: Any = None


@final
@dataclass(frozen=True, slots=True)
class NotHappened:
    """A ``reconcile`` hook's answer: the call did not happen. The step becomes
    ``interrupted`` and runs again on resume (with the same idempotency key)."""


class Answer(StrEnum):
    """What a reconcile (by a hook or an operator) found out about an ``unknown`` step."""

    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    #: the hook returned None or raised: the step stays ``unknown``
    UNKNOWN = "unknown"


class By(StrEnum):
    """Who answered: the tool's ``reconcile`` hook, or an operator (``--assume-done``,
    ``--rerun``, the dashboard, the API's resume body)."""

    HOOK = "hook"
    OPERATOR = "operator"


#: The journal's mark on an ``unknown`` step whose tool has a ``reconcile`` hook that has not
#: been asked yet (the retry advice is then ``resume``: resume asks it first). Compared as text
#: by the listing's SQL (``_journal/operator_sql``), so it is one fixed string.
HOOK_NOT_ASKED = '{"hook":"not asked"}'


@final
@dataclass(frozen=True, slots=True)
class Reconciled:
    """One journaled answer about a step: who gave it (``"hook"``: the tool's ``reconcile``
    hook; ``"operator"``: ``--assume-done`` / ``--rerun`` or their API and dashboard forms),
    what it was (``"happened"``, ``"not_happened"``, ``"unknown"``: the hook could not tell),
    and when (epoch seconds)."""

    by: str
    answer: str
    at: float

    def to_json(self) -> dict[str, Any]:
        """The ``"reconciled"`` object of a step in ``status --json``."""
        return {"by": self.by, "answer": self.answer, "at": self.at}

    def to_text(self) -> str:
        """The text the journal keeps in the step's ``reconciled`` column."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Reconciled | None:
        """The answer a ``reconciled`` column holds; None for :data:`HOOK_NOT_ASKED`. Raises
        ``ValueError`` (or ``KeyError``) for text that is neither."""
        if text == HOOK_NOT_ASKED:
            return None
        data = json.loads(text)
        at = data["at"]
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise ValueError(f"{at!r} is not a time")
        return cls(By(data["by"]).value, Answer(data["answer"]).value, float(at))
