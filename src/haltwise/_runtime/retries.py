"""When a step's failed attempt is run again (``retries=`` on a tool or ``haltwise.step``).

The attempts of a step share its index and idempotency key; each is journaled (``attempts``
counts them, ``errors`` keeps how the earlier ones failed) and settled before the next begins,
so a crash between attempts leaves a ``failed`` step that a resume runs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.exceptions import HaltwiseError, StepTimeoutError
from .._core.policy import ToolPolicy
from .._core.states import StepStatus

if TYPE_CHECKING:
    from .run_context import RunContext


def may_retry(
    run: RunContext,
    policy: ToolPolicy,
    error: BaseException,
    retries_done: int,
    settled: StepStatus | None,
) -> bool:
    """Whether the attempt that raised ``error`` is run again.

    Yes while retries are left, the attempt was settled ``failed`` (a rollback call whose
    compensation failed is ``unknown``: what it wrote is not known, so it is not repeated) and
    no cancel was requested (a cancel is never retried). The tool's own exceptions and
    :class:`StepTimeoutError` are retried; haltwise's other errors (a journal that cannot be
    written, a result that is not JSON) would fail the same way again, and are not.
    """
    if retries_done >= policy.retries or settled is not StepStatus.FAILED:
        return False
    if run.cancel.requested:
        return False
    return isinstance(error, StepTimeoutError) or not isinstance(error, HaltwiseError)
