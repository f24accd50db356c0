"""Resume: replay of committed steps, unknown steps, idempotency keys, non-determinism."""

from __future__ import annotations

import pytest

import haltwise
import toolkit
from haltwise import Retry, State, StepStatus

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]


async def cancel_in_flight(rt: haltwise.Runtime, tool: str, run_id: str) -> haltwise.Outcome:
    handle = await rt.start(toolkit.one_step, tool, task_id=run_id)
    await toolkit.between.wait()
    toolkit.go_on.set()
    await toolkit.entered.wait()
    await handle.cancel()
    return await handle.outcome()


async def test_resume_never_reruns_a_committed_step(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancel_in_flight(rt, "read_async", "r1")
        assert outcome.state is State.CANCELLED
        toolkit.release.set()
        outcome = await (await rt.resume("r1")).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["a", "b", "c"]
    assert toolkit.calls["quick"] == 2, "step 0 ran once; step 2 ran once"
    assert toolkit.calls["read_async"] == 2, "the interrupted step runs again"
    assert [s.attempts for s in outcome.steps] == [1, 2, 1]
    assert outcome.partials == ({"step": 0}, {"step": 1}), "replay adds no duplicate partials"


async def test_partials_survive_failure_and_continue_on_resume(store_url: str) -> None:
    attempts = {"n": 0}

    @haltwise.tool(cancel="interruptible", effect="read")
    def flaky(x: int) -> int:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise ValueError("the index is down")
        return x

    @haltwise.task
    async def gather() -> list[int]:
        got = []
        for i in range(3):
            got.append(await toolkit.quick(i))
            haltwise.emit(i)
        got.append(await flaky(9))
        haltwise.emit(9)
        return got

    async with haltwise.Runtime(store_url) as rt:
        failed = await (await rt.start(gather, task_id="p1")).outcome()
        assert failed.state is State.FAILED
        assert failed.error == haltwise.ErrorInfo("ValueError", "the index is down")
        assert failed.partials == (0, 1, 2)
        assert failed.steps[-1].status is StepStatus.FAILED
        done = await (await rt.resume("p1")).outcome()
    assert done.state is State.COMPLETED
    assert done.partials == (0, 1, 2, 9)
    assert toolkit.calls["quick"] == 3


async def test_unknown_step_refuses_resume_until_told(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancel_in_flight(rt, "charge_short_grace", "u1")
        assert outcome.retry is Retry.RECONCILE
        with pytest.raises(haltwise.ResumeRefusedError) as refused:
            await rt.resume("u1")
        assert refused.value.steps == ((1, "charge_short_grace"),)
        assert "step 1 (charge_short_grace)" in str(refused.value)
        still = await rt.status("u1")
        assert still.state is State.CANCELLED, "a refused resume changes nothing"
        toolkit.release.set()
        outcome = await (await rt.resume("u1", assume_done={1: "paid"})).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == ["a", "paid", "c"]
    assert toolkit.calls["charge_short_grace"] == 1


async def test_rerun_runs_an_unknown_step_again(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await cancel_in_flight(rt, "charge_short_grace", "u2")
        toolkit.release.set()
        outcome = await (await rt.resume("u2", rerun={1})).outcome()
    assert outcome.state is State.COMPLETED
    assert toolkit.calls["charge_short_grace"] == 2


async def test_idempotent_unknown_step_reruns_with_the_same_key(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await cancel_in_flight(rt, "charge_idempotent", "k1")
        step = outcome.steps[1]
        assert step.status is StepStatus.UNKNOWN
        # an unknown step of an idempotent external tool: a restart (new keys) would repeat it
        assert outcome.retry is Retry.RESUME
        toolkit.release.set()
        outcome = await (await rt.resume("k1")).outcome()
    assert outcome.state is State.COMPLETED
    used = toolkit.keys["charge_idempotent"]
    assert len(used) == 2 and used[0] == used[1]
    assert used[0] == step.idempotency_key


async def test_keys_differ_between_steps_and_runs(store_url: str) -> None:
    seen: list[str] = []

    @haltwise.tool(cancel="finish", effect="external", idempotent=True)
    def keyed() -> None:
        seen.append(haltwise.idempotency_key())

    @haltwise.task
    async def twice() -> None:
        await keyed()
        await keyed()

    async with haltwise.Runtime(store_url) as rt:
        await (await rt.start(twice, task_id="a")).outcome()
        await (await rt.start(twice, task_id="b")).outcome()
    assert len(set(seen)) == 4


async def test_non_determinism_fails_the_run_and_runs_nothing_more(store_url: str) -> None:
    branch = {"first": True}

    @haltwise.task
    async def wobbly() -> str:
        await toolkit.quick(0)
        if branch["first"]:
            await toolkit.read_async("x")
        else:
            await toolkit.quick_external("y")
        await toolkit.quick_write("z")
        return "ok"

    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(wobbly, task_id="n1")
        await toolkit.entered.wait()
        await handle.cancel()
        await handle.outcome()
        branch["first"] = False
        outcome = await (await rt.resume("n1")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "NonDeterminismError"
    assert "step 1" in outcome.error.message
    assert toolkit.calls["quick_external"] == 0
    assert toolkit.calls["quick_write"] == 0


async def test_non_determinism_cannot_be_swallowed(store_url: str) -> None:
    branch = {"first": True}

    @haltwise.task
    async def swallower() -> str:
        await toolkit.quick(0)
        try:
            await (toolkit.read_async("x") if branch["first"] else toolkit.quick_external("y"))
        except Exception:
            pass
        await toolkit.quick_write("z")
        return "ok"

    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(swallower, task_id="n2")
        await toolkit.entered.wait()
        await handle.cancel()
        await handle.outcome()
        branch["first"] = False
        outcome = await (await rt.resume("n2")).outcome()
    assert outcome.state is State.FAILED
    assert toolkit.calls["quick_write"] == 0


async def test_resume_of_a_completed_run_runs_nothing(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        first = await (await rt.start(toolkit.three_quick, task_id="c1")).outcome()
        again = await (await rt.resume("c1")).outcome()
    assert first == again
    assert toolkit.calls["quick"] == 3


async def test_a_task_id_started_twice_runs_once(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        one = await rt.start(toolkit.three_quick, task_id="twice")
        two = await rt.start(toolkit.three_quick, task_id="twice")
        assert one.id == two.id
        await one.outcome()
        with pytest.raises(haltwise.IdempotencyConflictError, match="'twice'"):
            await rt.start(toolkit.three_quick, 7, task_id="twice")
        outcome = await (await rt.start(toolkit.three_quick, task_id="twice")).outcome()
    assert outcome.result == [0, 1, 2]
    assert toolkit.calls["quick"] == 3


async def test_resume_arguments_are_checked(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await cancel_in_flight(rt, "charge_short_grace", "v1")
        with pytest.raises(haltwise.InputError, match="no step 7"):
            await rt.resume("v1", rerun={7})
        with pytest.raises(haltwise.InputError, match="already committed"):
            await rt.resume("v1", rerun={0})
        with pytest.raises(haltwise.UnknownRunError, match="nope"):
            await rt.resume("nope")
        assert (await rt.status("v1")).state is State.CANCELLED
