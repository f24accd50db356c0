"""Step timeouts and retries with backoff, on both stores: attempts counted, effects counted."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import State, StepStatus
from haltwise._analysis.audit import audit_tools

pytestmark = pytest.mark.anyio

#: what the tools did, in order: ("name", attempt) for a body start, ("undo", ...) for an undo
EVENTS: list[tuple[str, Any]] = []
KEYS: dict[str, list[str]] = {}
FAILS: Counter[str] = Counter()  # how many of the next calls of a tool fail
FAST = (0.001, 2.0, 0.01)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    EVENTS.clear()
    KEYS.clear()
    FAILS.clear()


def _attempt(name: str) -> None:
    EVENTS.append((name, len([e for e in EVENTS if e[0] == name]) + 1))
    KEYS.setdefault(name, []).append(haltwise.idempotency_key())
    if FAILS[name] > 0:
        FAILS[name] -= 1
        raise ConnectionError(f"{name} is down")


@haltwise.tool(cancel="interruptible", effect="read", retries=3, backoff=FAST)
async def flaky_read(x: int) -> int:
    _attempt("flaky_read")
    return x


def _undo_write(x: int) -> None:
    EVENTS.append(("undo", x))


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo_write, retries=2, backoff=FAST)
async def flaky_write(x: int) -> int:
    _attempt("flaky_write")
    return x


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.05)
async def slow_read(seconds: float) -> str:
    EVENTS.append(("slow_read", seconds))
    await anyio.sleep(seconds)
    return "read"


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo_write, timeout=0.05)
async def slow_write(x: int) -> int:
    EVENTS.append(("slow_write", x))
    await anyio.sleep(30)
    return x


RELEASE = threading.Event()


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.05)
def slow_plain() -> str:
    EVENTS.append(("slow_plain", 1))
    RELEASE.wait(30)
    return "late"


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.1, retries=1, backoff=FAST)
async def slow_then_fast() -> str:
    _attempt("slow_then_fast")
    if len(KEYS["slow_then_fast"]) == 1:
        await anyio.sleep(30)
    return "fast"


@haltwise.task
async def one(tool_name: str, *args: Any) -> Any:
    tools = {
        "flaky_read": flaky_read,
        "flaky_write": flaky_write,
        "slow_read": slow_read,
        "slow_write": slow_write,
        "slow_plain": slow_plain,
        "slow_then_fast": slow_then_fast,
    }
    return await tools[tool_name](*args)


@haltwise.task
async def catches_timeout() -> str:
    try:
        return await slow_read(30)
    except haltwise.StepTimeoutError as timed_out:
        assert isinstance(timed_out, haltwise.HaltwiseError)
        return f"gave up on step {timed_out.index}"


async def run_one(store_url: str, task: Any, *args: Any) -> haltwise.Outcome:
    async with haltwise.Runtime(store_url) as rt:
        return await (await rt.start(task, *args)).outcome()


# -- timeouts ------------------------------------------------------------------------------------


async def test_a_timeout_stops_the_call_and_fails_the_step_not_the_run(store_url: str) -> None:
    outcome = await run_one(store_url, catches_timeout)
    assert outcome.state is State.COMPLETED
    assert outcome.result == "gave up on step 0"
    (step,) = outcome.steps
    assert (step.status, step.attempts) == (StepStatus.FAILED, 1)
    assert step.error is not None and step.error.type == "StepTimeoutError"
    assert "ran longer than its timeout of 0.05 s" in step.error.message


async def test_an_unhandled_timeout_fails_the_run_as_an_ordinary_exception(store_url: str) -> None:
    outcome = await run_one(store_url, one, "slow_read", 30)
    assert outcome.state is State.FAILED, "a timeout is a failure, not a cancel"
    assert outcome.error is not None and outcome.error.type == "StepTimeoutError"
    assert outcome.reason is None


async def test_a_rollback_call_that_times_out_is_compensated(store_url: str) -> None:
    outcome = await run_one(store_url, one, "slow_write", 7)
    assert outcome.state is State.FAILED
    assert outcome.steps[0].status is StepStatus.FAILED
    assert EVENTS == [("slow_write", 7), ("undo", 7)]


async def test_a_plain_function_that_times_out_is_abandoned(store_url: str) -> None:
    RELEASE.clear()
    try:
        outcome = await run_one(store_url, one, "slow_plain")
    finally:
        RELEASE.set()
    assert outcome.state is State.FAILED
    assert outcome.steps[0].status is StepStatus.FAILED
    assert outcome.error is not None and outcome.error.type == "StepTimeoutError"


# -- retries -------------------------------------------------------------------------------------


async def test_a_failed_attempt_is_retried_in_the_same_step_with_the_same_key(
    store_url: str,
) -> None:
    FAILS["flaky_read"] = 2
    outcome = await run_one(store_url, one, "flaky_read", 5)
    assert outcome.state is State.COMPLETED
    assert outcome.result == 5
    (step,) = outcome.steps
    assert (step.index, step.status, step.attempts) == (0, StepStatus.COMMITTED, 3)
    assert [(e.attempt, e.error.type) for e in step.earlier_errors] == [
        (1, "ConnectionError"),
        (2, "ConnectionError"),
    ]
    assert step.to_json()["earlier_errors"][0] == {
        "attempt": 1,
        "type": "ConnectionError",
        "message": "flaky_read is down",
    }
    assert len(set(KEYS["flaky_read"])) == 1 and len(KEYS["flaky_read"]) == 3


async def test_retries_run_out_and_the_last_error_fails_the_step(store_url: str) -> None:
    FAILS["flaky_read"] = 10
    outcome = await run_one(store_url, one, "flaky_read", 5)
    assert outcome.state is State.FAILED
    (step,) = outcome.steps
    assert (step.status, step.attempts) == (StepStatus.FAILED, 4), "1 attempt + 3 retries"
    assert step.error is not None and step.error.type == "ConnectionError"
    assert [e.attempt for e in step.earlier_errors] == [1, 2, 3]


async def test_a_rollback_attempt_is_compensated_before_the_next(store_url: str) -> None:
    FAILS["flaky_write"] = 2
    outcome = await run_one(store_url, one, "flaky_write", 9)
    assert outcome.state is State.COMPLETED
    assert EVENTS == [
        ("flaky_write", 1),
        ("undo", 9),
        ("flaky_write", 2),
        ("undo", 9),
        ("flaky_write", 3),
    ]


async def test_a_timed_out_attempt_is_retried(store_url: str) -> None:
    outcome = await run_one(store_url, one, "slow_then_fast")
    assert outcome.state is State.COMPLETED
    assert outcome.result == "fast"
    (step,) = outcome.steps
    assert step.attempts == 2
    assert [e.error.type for e in step.earlier_errors] == ["StepTimeoutError"]


async def test_a_cancel_during_the_backoff_lands_at_once_and_is_never_retried(
    store_url: str,
) -> None:
    failed_once = anyio.Event()

    @haltwise.tool(cancel="interruptible", effect="read", retries=5, backoff=(60, 2, 60))
    async def down() -> None:
        EVENTS.append(("down", 1))
        failed_once.set()
        raise ConnectionError("down")

    @haltwise.task
    async def waits() -> None:
        await down()

    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(waits)
        await failed_once.wait()
        await handle.cancel()
        with anyio.fail_after(20):  # the backoff would wait 60 s
            outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert EVENTS == [("down", 1)]
    (step,) = outcome.steps
    assert (step.status, step.attempts) == (StepStatus.FAILED, 1)


async def test_a_cancel_in_flight_is_never_retried(store_url: str) -> None:
    inside = anyio.Event()

    @haltwise.tool(cancel="interruptible", effect="read", retries=5, backoff=FAST)
    async def hangs() -> None:
        EVENTS.append(("hangs", 1))
        inside.set()
        await anyio.sleep(30)

    @haltwise.task
    async def waits() -> None:
        await hangs()

    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(waits)
        await inside.wait()
        await handle.cancel()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert EVENTS == [("hangs", 1)]
    assert outcome.steps[0].status is StepStatus.INTERRUPTED


async def test_steps_concurrent_with_a_retrying_one_each_settle(store_url: str) -> None:
    FAILS["flaky_read"] = 1

    @haltwise.task
    async def both() -> list[int]:
        return list(await asyncio.gather(flaky_read(1), flaky_read(2)))

    outcome = await run_one(store_url, both)
    assert outcome.state is State.COMPLETED
    assert outcome.result == [1, 2]
    assert sorted(s.attempts for s in outcome.steps) == [1, 2]


async def test_haltwise_step_takes_timeout_and_retries(store_url: str) -> None:
    calls = Counter[str]()

    async def model(prompt: str) -> str:
        calls["model"] += 1
        if calls["model"] == 1:
            raise TimeoutError("the model API timed out")
        return prompt.upper()

    @haltwise.task
    async def asks() -> str:
        return str(
            await haltwise.step(
                model,
                "hi",
                name="model",
                cancel="interruptible",
                effect="read",
                timeout=5,
                retries=1,
                backoff=FAST,
            )
        )

    outcome = await run_one(store_url, asks)
    assert (outcome.state, outcome.result) == (State.COMPLETED, "HI")
    assert outcome.steps[0].attempts == 2


async def test_a_resumed_failed_step_keeps_its_earlier_errors(store_url: str) -> None:
    FAILS["flaky_read"] = 4  # 1 attempt + 3 retries all fail; the resume's attempt works
    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(one, "flaky_read", 1, task_id="r")).outcome()
        assert failed.state is State.FAILED
        done = await (await rt.resume("r")).outcome()
    assert done.state is State.COMPLETED
    step = done.steps[0]
    assert step.attempts == 5
    assert [e.attempt for e in step.earlier_errors] == [1, 2, 3, 4]


# -- declarations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"cancel": "finish", "timeout": 1}, "timeout= needs a call that can be stopped"),
        ({"timeout": 1}, "no cancel= (so 'finish')"),
        ({"cancel": "interruptible", "timeout": 0}, "timeout= must be a finite number"),
        ({"cancel": "interruptible", "timeout": float("inf")}, "timeout= must be a finite"),
        ({"cancel": "interruptible", "timeout": True}, "timeout= must be a finite"),
        ({"retries": -1}, "retries= must be a whole number"),
        ({"retries": 1.5}, "retries= must be a whole number"),
        ({"retries": 1, "backoff": (1, 0.5, 10)}, "backoff= must be (first_s, factor, max_s)"),
        ({"retries": 1, "backoff": (5, 2, 1)}, "backoff= must be"),
        ({"retries": 1, "backoff": (1, 2)}, "backoff= must be"),
    ],
)
def test_bad_timeouts_retries_and_backoffs_are_refused_at_declaration(
    keywords: dict[str, Any], words: str
) -> None:
    with pytest.raises(haltwise.PolicyError) as refused:
        haltwise.tool(effect="read", **keywords)(lambda: None)
    assert words in str(refused.value)


async def test_haltwise_step_refuses_a_timeout_on_a_finish_call() -> None:
    with pytest.raises(haltwise.PolicyError, match="timeout= needs a call that can be stopped"):
        await haltwise.step(lambda: 1, cancel="finish", timeout=1)


def test_audit_reports_retries_on_a_non_idempotent_external_tool() -> None:
    @haltwise.tool(cancel="finish", effect="external", grace=5, retries=2)
    def charge() -> None: ...

    @haltwise.tool(cancel="finish", effect="external", grace=5, retries=2, idempotent=True)
    def charge_once() -> None: ...

    report = audit_tools([charge, charge_once])
    # (charge, with no reconcile hook, is also issue 32's no-reconcile: a forced cancel of it
    # needs a person; charge_once is idempotent, so neither finding is its)
    assert {(f.tool, f.code.value) for f in report.findings} == {
        ("charge", "retries-repeat-effect"),
        ("charge", "no-reconcile"),
    }
