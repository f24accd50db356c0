"""The public surface: every name the contract promises, each documented, nothing private."""

from __future__ import annotations

import inspect

import haltwise
import haltwise.testing

CONTRACT_NAMES = {
    "tool",
    "task",
    "emit",
    "checkpoint",
    "cancel_requested",
    "idempotency_key",
    "shield",
    "Runtime",
    "TaskHandle",
    "run",
    "State",
    "Retry",
    "Outcome",
    "Cancelled",
    "HaltwiseError",
}


def test_the_contract_names_are_exported() -> None:
    assert set(haltwise.__all__) >= CONTRACT_NAMES
    for name in haltwise.__all__:
        assert hasattr(haltwise, name), name
        assert not name.startswith("_"), name


def test_every_public_object_has_a_docstring() -> None:
    for name in haltwise.__all__:
        obj = getattr(haltwise, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"haltwise.{name} has no docstring"


def test_public_objects_claim_the_package() -> None:
    for name in haltwise.__all__:
        module = getattr(getattr(haltwise, name), "__module__", "haltwise")
        assert module.startswith("haltwise"), (name, module)


def test_states_and_advice_are_the_contract_words() -> None:
    assert [s.value for s in haltwise.State] == [
        "pending",
        "running",
        "cancelling",
        "paused",
        "cancelled",
        "completed",
        "failed",
    ]
    assert {r.value for r in haltwise.Retry} == {"none", "reconcile", "resume", "restart"}
    assert {s.value for s in haltwise.StepStatus} == {
        "running",
        "committed",
        "interrupted",
        "compensated",
        "unknown",
        "failed",
        "awaiting",
        "refused",
    }


def test_the_testing_module_is_public() -> None:
    assert callable(haltwise.testing.explore)
    assert callable(haltwise.testing.record_effect)
