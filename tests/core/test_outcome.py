"""Retry advice, one rule at a time, and the JSON object."""

from __future__ import annotations

import pytest

from haltwise import Effect, Outcome, Retry, State, StepRecord, StepStatus
from haltwise._core.outcome import retry_advice


def step(status: StepStatus, effect: Effect = Effect.READ, idempotent: bool = False) -> StepRecord:
    return StepRecord(0, "t", "finish", effect, idempotent, status, 1)


@pytest.mark.parametrize(
    ("state", "steps", "expected"),
    [
        (State.COMPLETED, [step(StepStatus.UNKNOWN)], Retry.NONE),
        (State.CANCELLED, [step(StepStatus.UNKNOWN)], Retry.RECONCILE),
        (State.FAILED, [step(StepStatus.UNKNOWN, idempotent=True)], Retry.RESTART),
        # an unknown step of an idempotent write: a resume reruns it with its key, a new run
        # would do it again with a new one (issue 14, item 10)
        (State.FAILED, [step(StepStatus.UNKNOWN, Effect.WRITE, idempotent=True)], Retry.RESUME),
        (
            State.CANCELLED,
            [step(StepStatus.UNKNOWN, Effect.EXTERNAL, idempotent=True)],
            Retry.RESUME,
        ),
        (
            State.CANCELLED,
            [step(StepStatus.COMMITTED, Effect.WRITE), step(StepStatus.UNKNOWN)],
            Retry.RECONCILE,
        ),
        (State.CANCELLED, [step(StepStatus.COMMITTED, Effect.WRITE)], Retry.RESUME),
        (State.FAILED, [step(StepStatus.COMMITTED, Effect.EXTERNAL)], Retry.RESUME),
        (State.CANCELLED, [step(StepStatus.COMMITTED, Effect.READ)], Retry.RESTART),
        (State.CANCELLED, [step(StepStatus.COMPENSATED, Effect.WRITE)], Retry.RESTART),
        (State.CANCELLED, [step(StepStatus.INTERRUPTED, Effect.EXTERNAL)], Retry.RESTART),
        (State.CANCELLED, [], Retry.RESTART),
    ],
)
def test_retry_rule(state: State, steps: list[StepRecord], expected: Retry) -> None:
    assert retry_advice(state, steps) is expected


def test_json_object_has_the_contract_fields() -> None:
    outcome = Outcome(
        id="t1",
        task="agent.py:research",
        state=State.CANCELLED,
        reason="user",
        partials=({"hit": "a"},),
        steps=(
            StepRecord(0, "search", "interruptible", Effect.READ, False, StepStatus.COMMITTED, 1),
        ),
    )
    assert outcome.to_json() == {
        "id": "t1",
        "task": "agent.py:research",
        "state": "cancelled",
        "reason": "user",
        "retry": "restart",
        "result": None,
        "error": None,
        "partials": [{"hit": "a"}],
        "steps": [
            {
                "index": 0,
                "tool": "search",
                "cancel": "interruptible",
                "effect": "read",
                "idempotent": False,
                "status": "committed",
                "attempts": 1,
            }
        ],
        # spend is counted also without a limit (a step's tool calls: its attempts)
        "budget": {"limit": None, "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 1}},
    }
