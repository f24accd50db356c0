"""haltwise: stop multi-step agent tasks early, on purpose, as a designed outcome.

The public API is re-exported here; the modules behind it are private (``_name.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._core.approvals import ApprovalRecord as ApprovalRecord
    from ._core.approvals import ApprovalState as ApprovalState
    from ._core.approvals import Decision as Decision
    from ._core.budget import Budget as Budget
    from ._core.budget import Spent as Spent
    from ._core.exceptions import ApprovalConflictError as ApprovalConflictError
    from ._core.exceptions import ApprovalExpired as ApprovalExpired
    from ._core.exceptions import ApprovalRefused as ApprovalRefused
    from ._core.exceptions import BadRow as BadRow
    from ._core.exceptions import Cancelled as Cancelled
    from ._core.exceptions import ChildRunError as ChildRunError
    from ._core.exceptions import CorruptRowError as CorruptRowError
    from ._core.exceptions import DeliveryGoneError as DeliveryGoneError
    from ._core.exceptions import HaltwiseError as HaltwiseError
    from ._core.exceptions import IdempotencyConflictError as IdempotencyConflictError
    from ._core.exceptions import InputError as InputError
    from ._core.exceptions import InvalidTransitionError as InvalidTransitionError
    from ._core.exceptions import LoadError as LoadError
    from ._core.exceptions import LostOwnershipError as LostOwnershipError
    from ._core.exceptions import NonDeterminismError as NonDeterminismError
    from ._core.exceptions import NoStoreError as NoStoreError
    from ._core.exceptions import NotInTaskError as NotInTaskError
    from ._core.exceptions import PolicyError as PolicyError
    from ._core.exceptions import ReplayedError as ReplayedError
    from ._core.exceptions import ResumeRefusedError as ResumeRefusedError
    from ._core.exceptions import RunOwnedError as RunOwnedError
    from ._core.exceptions import SchemaError as SchemaError
    from ._core.exceptions import SchemaVersionError as SchemaVersionError
    from ._core.exceptions import StepTimeoutError as StepTimeoutError
    from ._core.exceptions import StoreError as StoreError
    from ._core.exceptions import StoreGoneError as StoreGoneError
    from ._core.exceptions import UnknownRunError as UnknownRunError
    from ._core.exceptions import UnknownStepError as UnknownStepError
    from ._core.outcome import AttemptError as AttemptError
    from ._core.outcome import ErrorInfo as ErrorInfo
    from ._core.outcome import Outcome as Outcome
    from ._core.outcome import Retry as Retry
    from ._core.outcome import StepRecord as StepRecord
    from ._core.policy import CancelPolicy as CancelPolicy
    from ._core.policy import Effect as Effect
    from ._core.policy import OnCancel as OnCancel
    from ._core.reconcile import Happened as Happened
    from ._core.reconcile import NotHappened as NotHappened
    from ._core.reconcile import Reconciled as Reconciled
    from ._core.records import Event as Event
    from ._core.records import Owner as Owner
    from ._core.records import RunRecord as RunRecord
    from ._core.records import RunSnapshot as RunSnapshot
    from ._core.states import State as State
    from ._core.states import StepStatus as StepStatus
    from ._core.views import CancelBatch as CancelBatch
    from ._core.views import Change as Change
    from ._core.views import ChangeKind as ChangeKind
    from ._core.views import RunDetail as RunDetail
    from ._core.views import RunPage as RunPage
    from ._core.views import RunSummary as RunSummary
    from ._core.views import StepTimes as StepTimes
    from ._core.views import StepWait as StepWait
    from ._journal.check import CheckReport as CheckReport
    from ._journal.check import Finding as Finding
    from ._journal.check import verify_store as verify_store
    from ._runtime.budget import spend as spend
    from ._runtime.cancel_state import register_host_cancel as register_host_cancel
    from ._runtime.fork import ForkPlan as ForkPlan
    from ._runtime.run_api import run as run
    from ._runtime.run_context import call_id as call_id
    from ._runtime.run_context import current_task_id as current_task_id
    from ._runtime.runtime import Runtime as Runtime
    from ._runtime.runtime import TaskHandle as TaskHandle
    from ._runtime.spec import Tool as Tool
    from ._runtime.steps import register_replayable_error as register_replayable_error
    from ._runtime.task_api import aemit as aemit
    from ._runtime.task_api import cancel_current_run as cancel_current_run
    from ._runtime.task_api import cancel_requested as cancel_requested
    from ._runtime.task_api import checkpoint as checkpoint
    from ._runtime.task_api import emit as emit
    from ._runtime.task_api import idempotency_key as idempotency_key
    from ._runtime.task_api import shield as shield
    from ._runtime.tool import Task as Task
    from ._runtime.tool import approval as approval
    from ._runtime.tool import step as step
    from ._runtime.tool import task as task
    from ._runtime.tool import tool as tool

#: Where each public name lives, imported on first use (PEP 562): ``import haltwise`` alone costs
#: almost nothing, so a command that only reads or requests (``haltwise cancel ID``) starts fast.
#: ``tests/test_public_surface.py`` checks that this table and the imports above name the same.
_LAZY: dict[str, tuple[str, ...]] = {
    "._core.approvals": ("ApprovalRecord", "ApprovalState", "Decision"),
    "._core.budget": ("Budget", "Spent"),
    "._core.exceptions": (
        "ApprovalConflictError",
        "ApprovalExpired",
        "ApprovalRefused",
        "BadRow",
        "Cancelled",
        "ChildRunError",
        "CorruptRowError",
        "DeliveryGoneError",
        "HaltwiseError",
        "IdempotencyConflictError",
        "InputError",
        "InvalidTransitionError",
        "LoadError",
        "LostOwnershipError",
        "NoStoreError",
        "NonDeterminismError",
        "NotInTaskError",
        "PolicyError",
        "ReplayedError",
        "ResumeRefusedError",
        "RunOwnedError",
        "SchemaError",
        "SchemaVersionError",
        "StepTimeoutError",
        "StoreError",
        "StoreGoneError",
        "UnknownRunError",
        "UnknownStepError",
    ),
    "._core.outcome": ("AttemptError", "ErrorInfo", "Outcome", "Retry", "StepRecord"),
    "._core.policy": ("CancelPolicy", "Effect", "OnCancel"),
    "._core.reconcile": ("Happened", "NotHappened", "Reconciled"),
    "._core.records": ("Event", "Owner", "RunRecord", "RunSnapshot"),
    "._core.states": ("State", "StepStatus"),
    "._core.views": (
        "CancelBatch",
        "Change",
        "ChangeKind",
        "RunDetail",
        "RunPage",
        "RunSummary",
        "StepTimes",
        "StepWait",
    ),
    "._journal.check": ("CheckReport", "Finding", "verify_store"),
    "._runtime.budget": ("spend",),
    "._runtime.fork": ("ForkPlan",),
    "._runtime.run_context": ("call_id", "current_task_id"),
    "._runtime.run_api": ("run",),
    "._runtime.runtime": ("Runtime", "TaskHandle"),
    "._runtime.cancel_state": ("register_host_cancel",),
    "._runtime.steps": ("register_replayable_error",),
    "._runtime.task_api": (
        "aemit",
        "cancel_current_run",
        "cancel_requested",
        "checkpoint",
        "emit",
        "idempotency_key",
        "shield",
    ),
    "._runtime.spec": ("Tool",),
    "._runtime.tool": ("Task", "approval", "step", "task", "tool"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__version__ = "0.1.0"


__all__ = [
    "ApprovalConflictError",
    "ApprovalExpired",
    "ApprovalRecord",
    "ApprovalRefused",
    "ApprovalState",
    "AttemptError",
    "BadRow",
    "Budget",
    "CancelBatch",
    "CancelPolicy",
    "Cancelled",
    "Change",
    "ChangeKind",
    "CheckReport",
    "ChildRunError",
    "CorruptRowError",
    "Decision",
    "DeliveryGoneError",
    "Effect",
    "ErrorInfo",
    "Event",
    "Finding",
    "ForkPlan",
    "HaltwiseError",
    "Happened",
    "IdempotencyConflictError",
    "InputError",
    "InvalidTransitionError",
    "LoadError",
    "LostOwnershipError",
    "NoStoreError",
    "NonDeterminismError",
    "NotHappened",
    "NotInTaskError",
    "OnCancel",
    "Outcome",
    "Owner",
    "PolicyError",
    "Reconciled",
    "ReplayedError",
    "ResumeRefusedError",
    "Retry",
    "RunDetail",
    "RunOwnedError",
    "RunPage",
    "RunRecord",
    "RunSnapshot",
    "RunSummary",
    "Runtime",
    "SchemaError",
    "SchemaVersionError",
    "Spent",
    "State",
    "StepRecord",
    "StepStatus",
    "StepTimeoutError",
    "StepTimes",
    "StepWait",
    "StoreError",
    "StoreGoneError",
    "Task",
    "TaskHandle",
    "Tool",
    "UnknownRunError",
    "UnknownStepError",
    "aemit",
    "approval",
    "call_id",
    "cancel_current_run",
    "cancel_requested",
    "checkpoint",
    "current_task_id",
    "emit",
    "idempotency_key",
    "register_host_cancel",
    "register_replayable_error",
    "run",
    "shield",
    "spend",
    "step",
    "task",
    "tool",
    "verify_store",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (and kept here from then on)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'haltwise' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
