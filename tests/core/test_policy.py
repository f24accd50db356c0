"""Which steps may begin before their start is synced to the disk (``ToolPolicy``)."""

from __future__ import annotations

from typing import Any

import pytest

from haltwise._core.policy import ToolPolicy


def undo(*args: Any) -> None:
    """A compensation."""


@pytest.mark.parametrize(
    ("cancel", "effect", "idempotent", "deferrable"),
    [
        ("interruptible", "read", False, True),  # lost: it runs again, as an interrupted one
        ("finish", "none", False, True),
        ("finish", "external", True, True),  # lost: it runs again with the same key
        ("finish", "external", False, False),  # a takeover must find it: unknown, not rerun
        ("interruptible", "write", False, False),  # its settlement is not deferred either
        ("rollback", "write", True, False),  # a takeover must find it to compensate it
        (None, "read", False, True),
        (None, None, False, False),  # undeclared: external, not idempotent
    ],
)
def test_a_start_may_be_deferred_only_where_losing_it_is_harmless(
    cancel: str | None, effect: str | None, idempotent: bool, deferrable: bool
) -> None:
    policy = ToolPolicy.declare(
        name="t",
        cancel=cancel,
        effect=effect,
        idempotent=idempotent,
        compensate=undo if cancel == "rollback" else None,
        grace=None,
    )
    assert policy.may_defer_start is deferrable
    if deferrable:
        assert policy.may_defer_settle, "a start deferred, its settlement too"
