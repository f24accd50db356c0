"""Bad declarations and bad input: a clear HaltwiseError, and a consistent journal."""

from __future__ import annotations

from typing import Any

import pytest

import haltwise
import toolkit
from _paths import ROOT
from haltwise import State, StepStatus


def noop(*args: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cancel": "sometimes"}, "unknown cancel='sometimes'"),
        ({"effect": "explosive"}, "unknown effect='explosive'"),
        ({"grace": -1}, "grace= must be a finite number"),
        ({"grace": float("inf")}, "grace= must be a finite number"),
        ({"grace": "10"}, "grace= must be a number"),
        ({"compensate": 3, "cancel": "rollback"}, "compensate= must be callable"),
        ({"idempotent": "yes"}, "idempotent= must be True or False"),
    ],
)
def test_bad_tool_declarations_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(haltwise.PolicyError, match=message) as raised:

        @haltwise.tool(**options)
        def some_tool() -> None:
            pass

    assert raised.value.tool == "some_tool"
    assert isinstance(raised.value, haltwise.HaltwiseError)


def test_a_task_must_be_async() -> None:
    with pytest.raises(haltwise.PolicyError, match="needs an async function"):

        @haltwise.task
        def not_async() -> None:
            pass


def test_on_cancel_is_checked() -> None:
    with pytest.raises(haltwise.PolicyError, match="on_cancel"):
        haltwise.task(on_cancel="undo")


def test_undeclared_tool_behaves_as_finish_and_is_marked() -> None:
    policy = toolkit.undeclared.policy
    assert policy.cancel is None
    assert policy.effective_cancel is haltwise.CancelPolicy.FINISH
    assert policy.effect is haltwise.Effect.EXTERNAL and not policy.effect_declared
    assert policy.grace == 30.0 and policy.idempotent is False


def test_cancelled_is_not_an_exception_and_errors_share_one_base() -> None:
    assert issubclass(haltwise.Cancelled, BaseException)
    assert not issubclass(haltwise.Cancelled, Exception)
    for name in haltwise.__all__:
        obj = getattr(haltwise, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, haltwise.HaltwiseError), name


def test_rollback_without_compensate_is_declared_and_left_to_audit() -> None:
    """Issue 15, item 14: audit reports it (the contract's finding); declaring it is no error."""
    policy = toolkit.write_no_undo.policy
    assert policy.cancel is haltwise.CancelPolicy.ROLLBACK and policy.compensate is None


@pytest.mark.anyio
async def test_a_cancelled_rollback_call_with_nothing_to_undo_it_is_unknown(
    store_url: str,
) -> None:
    toolkit.reset()
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(toolkit.one_step, "write_no_undo", task_id="nu")
        await toolkit.between.wait()
        toolkit.go_on.set()
        await toolkit.entered.wait()
        await handle.cancel()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED, StepStatus.UNKNOWN]
    assert outcome.retry is haltwise.Retry.RECONCILE


@pytest.mark.anyio
async def test_checkpoint_outside_a_task_is_an_error() -> None:
    """Issue 15, item 13: as NotInTaskError documents (it used to return silently)."""
    with pytest.raises(haltwise.NotInTaskError, match="checkpoint"):
        await haltwise.checkpoint()


def test_no_deprecated_coroutine_check_in_the_runtime() -> None:
    """Issue 15, item 20: asyncio.iscoroutinefunction is deprecated (3.14); inspect's is used."""
    import pathlib

    source = pathlib.Path(haltwise.__file__).parent
    offenders = [
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        if "asyncio.iscoroutinefunction" in path.read_text()
    ]
    assert offenders == []


def test_the_license_is_an_spdx_string() -> None:
    """Issue 15, item 24: ``license = { text = ... }`` is deprecated by setuptools."""
    import tomllib

    pyproject = ROOT / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text())
    assert data["project"]["license"] == "MIT"
    requires = data["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in requires), requires


def test_emit_and_key_outside_a_task() -> None:
    with pytest.raises(haltwise.NotInTaskError):
        haltwise.emit(1)
    with pytest.raises(haltwise.NotInTaskError):
        haltwise.idempotency_key()
    assert haltwise.cancel_requested() is False


@pytest.mark.anyio
async def test_calling_a_task_directly_is_an_error() -> None:
    with pytest.raises(haltwise.NotInTaskError, match=r"Runtime\.start"):
        await toolkit.three_quick()


@pytest.mark.anyio
async def test_tool_outside_a_task_just_runs() -> None:
    assert await toolkit.quick(5) == 5


@pytest.mark.anyio
async def test_bad_inputs_are_refused_before_anything_is_recorded(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        with pytest.raises(haltwise.InputError, match="not JSON-serialisable"):
            await rt.start(toolkit.three_quick, object(), task_id="bad")
        with pytest.raises(haltwise.InputError, match="unexpected keyword"):
            await rt.start(toolkit.three_quick, task_id="bad", colour="red")
        with pytest.raises(haltwise.InputError, match="deadline"):
            await rt.start(toolkit.three_quick, task_id="bad", deadline=-1)
        with pytest.raises(haltwise.UnknownRunError, match="'bad'"):
            await rt.status("bad")
        with pytest.raises(haltwise.UnknownRunError):
            await rt.cancel("bad")


@pytest.mark.anyio
async def test_non_json_partial_and_result_fail_cleanly(store_url: str) -> None:
    @haltwise.tool(cancel="interruptible", effect="read")
    def gives_a_set() -> set[int]:
        return {1, 2}

    @haltwise.task
    async def emits_junk() -> None:
        await toolkit.quick(1)
        haltwise.emit(object())

    @haltwise.task
    async def returns_junk() -> None:
        await gives_a_set()

    async with haltwise.Runtime(store_url) as rt:
        junk = await (await rt.start(emits_junk, task_id="j1")).outcome()
        bad_result = await (await rt.start(returns_junk, task_id="j2")).outcome()
    assert junk.state is State.FAILED
    assert junk.error is not None and junk.error.type == "InputError"
    assert "partial result is not JSON-serialisable" in junk.error.message
    assert junk.partials == ()
    assert bad_result.state is State.FAILED
    assert bad_result.steps[0].status is StepStatus.FAILED
    assert bad_result.error is not None and "step 0 (gives_a_set)" in bad_result.error.message


@pytest.mark.anyio
async def test_a_failed_run_carries_the_tasks_own_exception(store_url: str) -> None:
    class QuotaExceeded(Exception):
        pass

    @haltwise.task
    async def over_quota() -> None:
        await toolkit.quick(1)
        raise QuotaExceeded("no more tokens today")

    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(over_quota, task_id="f1")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error == haltwise.ErrorInfo("QuotaExceeded", "no more tokens today")
    assert outcome.reason is None


def test_run_is_a_blocking_convenience(tmp_path: Any) -> None:
    outcome = haltwise.run(toolkit.three_quick, 2, store=f"sqlite:///{tmp_path}/r.db")
    assert outcome.state is State.COMPLETED
    assert outcome.result == [0, 1]
    assert outcome.retry is haltwise.Retry.NONE


def test_unusable_store_urls() -> None:
    with pytest.raises(haltwise.StoreError, match="unusable store URL"):
        haltwise.Runtime("mysql://nope")
    with pytest.raises(haltwise.StoreError, match="synchronous"):
        haltwise.Runtime("sqlite:///x.db?synchronous=sometimes")
