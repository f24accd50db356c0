"""Real agents: concurrent steps, cancels from the host, step identity, the step API.

Written without any agent framework, with the patterns the frameworks use: ``asyncio.gather``
and anyio task groups of tools, ``asyncio.create_task(...).cancel()``, ``asyncio.wait_for``.
Side effects are counted per tool (``concurrent_kit``); every run is checked with
``verify_store`` and resumed to show that nothing committed runs twice.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from typing import Any

import anyio
import pytest

import concurrent_kit as kit
import haltwise
from haltwise import Retry, State, StepStatus
from toolkit import Gate

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kit.reset()


async def check_store(url: str) -> None:
    report = await anyio.to_thread.run_sync(haltwise.verify_store, url)
    assert report.ok, report.findings


async def wait_statuses(
    rt: haltwise.Runtime, run_id: str, wanted: dict[str, StepStatus], timeout: float = 20
) -> None:
    """Poll the journal (with a deadline) until each named tool's step has its status."""
    with anyio.fail_after(timeout):
        while True:
            steps = {s.tool: s.status for s in (await rt.status(run_id)).steps}
            if all(steps.get(tool) is status for tool, status in wanted.items()):
                return
            await anyio.sleep(0.005)


def by_tool(outcome: haltwise.Outcome) -> dict[str, StepStatus]:
    return {step.tool: step.status for step in outcome.steps}


# -- every policy at once, cancelled mid-flight ----------------------------------------------


@haltwise.task(name="concurrent:gathered")
async def gathered() -> list[Any]:
    return list(await asyncio.gather(*(kit.TOOLS[n](i) for i, n in enumerate(kit.NAMES))))


@haltwise.task(name="concurrent:grouped")
async def grouped() -> list[Any]:
    results: dict[int, Any] = {}

    async def one(i: int, name: str) -> None:
        results[i] = await kit.TOOLS[name](i)

    async with anyio.create_task_group() as group:
        for i, name in enumerate(kit.NAMES):
            group.start_soon(one, i, name)
    return [results[i] for i in range(len(kit.NAMES))]


@pytest.mark.parametrize("task", [gathered, grouped], ids=["gather", "task-group"])
async def test_concurrent_steps_each_settle_by_their_own_policy(
    store_url: str, task: haltwise.Task[..., Any]
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(task, task_id="fan")
        await kit.wait_all_entered()
        await handle.cancel()
        # The interruptible and async rollback steps settle at once, the others wait.
        await wait_statuses(
            rt,
            "fan",
            {
                "look": StepStatus.INTERRUPTED,
                "look_plain": StepStatus.INTERRUPTED,
                "write": StepStatus.COMPENSATED,
            },
        )
        assert (await rt.status("fan")).state is State.CANCELLING, "final only once all settled"
        kit.release.set()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert [s.tool for s in outcome.steps] == list(kit.NAMES), "numbered in the order begun"
    assert by_tool(outcome) == kit.SETTLED
    assert kit.undone == Counter({"write": 1, "write_plain": 1})
    assert outcome.retry is Retry.RESUME
    await check_store(store_url)

    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.resume("fan")).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == [f"{name}-{i}" for i, name in enumerate(kit.NAMES)]
    for name, status in kit.SETTLED.items():
        expected = 1 if status is StepStatus.COMMITTED else 2
        assert kit.calls[name] == expected, name
    await check_store(store_url)


async def test_a_forced_cancel_stops_every_concurrent_step_at_once(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(gathered, task_id="forced")
        await kit.wait_all_entered()
        await handle.cancel(force=True)
        with anyio.fail_after(15):
            outcome = await handle.outcome()
    kit.release.set()
    assert outcome.state is State.CANCELLED
    statuses = by_tool(outcome)
    assert statuses["look"] is StepStatus.INTERRUPTED
    assert statuses["charge"] is StepStatus.UNKNOWN
    assert statuses["write"] is StepStatus.UNKNOWN
    assert kit.undone == Counter(), "a forced cancel runs no compensation"
    assert StepStatus.RUNNING not in statuses.values()
    await check_store(store_url)


# -- cancels that come from the host ----------------------------------------------------------

cancel_sent = Gate()


@haltwise.task(name="concurrent:spawn_and_cancel")
async def spawn_and_cancel(name: str) -> str:
    call = asyncio.create_task(kit.TOOLS[name]("x"))
    await kit.entered[name].wait()
    call.cancel()
    cancel_sent.set()
    try:
        await call
    except asyncio.CancelledError:
        return "cancelled"
    return "not cancelled"


@pytest.mark.parametrize("name", kit.NAMES)
async def test_task_cancel_of_a_tool_call_is_settled_by_its_policy(
    store_url: str, name: str
) -> None:
    global cancel_sent
    cancel_sent = Gate()
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(spawn_and_cancel, name, task_id="spawned")
        await cancel_sent.wait()
        if name not in kit.FINISHING:
            await wait_statuses(rt, "spawned", {name: kit.SETTLED[name]})
        kit.release.set()
        outcome = await handle.outcome()
    # The task caught the host's cancel of its call and went on: it completed.
    assert outcome.state is State.COMPLETED
    assert outcome.result == "cancelled"
    assert by_tool(outcome) == {name: kit.SETTLED[name]}
    assert kit.calls[name] == 1
    await check_store(store_url)


@haltwise.task(name="concurrent:bounded")
async def bounded() -> str:
    result: str = await asyncio.wait_for(kit.charge("w"), timeout=0.05)
    return result


async def test_wait_for_around_a_finish_tool_lets_it_finish(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(bounded, task_id="w")
        await kit.entered["charge"].wait()
        # Timers of one loop fire in deadline order: wait_for's 0.05 s have passed after this.
        await anyio.sleep(0.2)
        assert (await rt.status("w")).steps[0].status is StepStatus.RUNNING
        kit.release.set()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "timeout"
    assert outcome.cancel_error is not None and outcome.cancel_error.type == "TimeoutError"
    assert outcome.steps[0].status is StepStatus.COMMITTED
    assert outcome.retry is Retry.RESUME
    await check_store(store_url)
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.resume("w")).outcome()
    assert outcome.state is State.COMPLETED and outcome.result == "charge-w"
    assert kit.calls["charge"] == 1, "the committed charge is replayed, not repeated"


@haltwise.task(name="concurrent:scoped")
async def scoped() -> str:
    with anyio.fail_after(0.05):
        result: str = await kit.charge("s")
    return result


async def test_an_anyio_timeout_around_a_finish_tool_lets_it_finish(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(scoped, task_id="s")
        await kit.entered["charge"].wait()
        await anyio.sleep(0.2)  # the task's 0.05 s deadline (same loop) has passed
        assert (await rt.status("s")).steps[0].status is StepStatus.RUNNING
        kit.release.set()
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED and outcome.reason == "timeout"
    assert outcome.steps[0].status is StepStatus.COMMITTED
    assert kit.done["charge"] == 1


@haltwise.task(name="concurrent:reraises")
async def reraises() -> str:
    inner = asyncio.create_task(asyncio.sleep(30))
    await asyncio.sleep(0)
    inner.cancel()
    await inner  # the CancelledError escapes the task function
    return "never"


@haltwise.task(name="concurrent:steady")
async def steady() -> str:
    first = await kit.look("a")
    return f"{first}, then done"


async def test_a_cancelled_error_escaping_a_task_cancels_only_that_run(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        other = await rt.start(steady, task_id="steady")
        await kit.entered["look"].wait()
        escaped = await (await rt.start(reraises, task_id="escapes")).outcome()
        assert escaped.state is State.CANCELLED
        assert escaped.reason == "host"
        assert rt.is_active("steady"), "the other run goes on"
        kit.release.set()
        outcome = await other.outcome()
        assert outcome.state is State.COMPLETED
        # The runtime itself is still usable.
        again = await (await rt.start(steady, task_id="steady2")).outcome()
    assert again.state is State.COMPLETED
    await check_store(store_url)


@haltwise.task(name="concurrent:sleeper")
async def sleeper() -> str:
    await kit.look("before")
    await anyio.sleep(60)  # a model call that is not a step, say
    return "slept"


async def test_a_cancel_lands_at_an_await_outside_steps(store_url: str) -> None:
    kit.release.set()
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(sleeper, task_id="s")
        await wait_statuses(rt, "s", {"look": StepStatus.COMMITTED})
        await handle.cancel()
        with anyio.fail_after(10):  # far less than the 60 s sleep
            outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED and outcome.reason == "user"


# -- the task cancelling itself -----------------------------------------------------------------


@haltwise.task(name="concurrent:gives_up")
async def gives_up() -> str:
    kit.release.set()
    await kit.look("one")
    raise haltwise.Cancelled("budget")


@haltwise.tool(cancel="interruptible", effect="read")
async def refuses() -> str:
    raise haltwise.Cancelled("quota")


@haltwise.task(name="concurrent:tool_gives_up")
async def tool_gives_up() -> str:
    return await refuses()


async def test_raising_cancelled_cancels_the_run_with_its_reason(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        by_task = await (await rt.start(gives_up, task_id="t")).outcome()
        by_tool_call = await (await rt.start(tool_gives_up, task_id="u")).outcome()
    assert by_task.state is State.CANCELLED and by_task.reason == "budget"
    assert by_task.error is None
    assert by_tool_call.state is State.CANCELLED and by_tool_call.reason == "quota"
    assert by_tool_call.steps[0].status is StepStatus.INTERRUPTED
    await check_store(store_url)


# -- step identity ----------------------------------------------------------------------------

TOPIC = {"value": "cats"}
go_on = Gate()
paused = Gate()
searches: Counter[str] = Counter()


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> str:
    searches[query] += 1
    return f"results for {query}"


@haltwise.task(name="concurrent:asks")
async def asks() -> str:
    found = await search(TOPIC["value"])
    paused.set()
    await go_on.wait()
    return found


async def pause_and_cancel(
    rt: haltwise.Runtime, task: haltwise.Task[..., Any], run_id: str
) -> None:
    global go_on, paused
    go_on, paused = Gate(), Gate()
    handle = await rt.start(task, task_id=run_id)
    await paused.wait()
    await handle.cancel()
    assert (await handle.outcome()).state is State.CANCELLED
    go_on.set()


async def test_replay_with_other_arguments_is_non_deterministic(store_url: str) -> None:
    searches.clear()
    TOPIC["value"] = "cats"
    async with haltwise.Runtime(store_url) as rt:
        await pause_and_cancel(rt, asks, "nd")
        TOPIC["value"] = "dogs"
        outcome = await (await rt.resume("nd")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "NonDeterminismError"
    assert "step 0 (" in outcome.error.message and "other arguments" in outcome.error.message
    assert searches == Counter({"cats": 1}), "never answered with another call's result"


ORDER = {"value": ["a", "b", "c"]}


@haltwise.task(name="concurrent:parallel_calls")
async def parallel_calls() -> dict[str, str]:
    async def one(call: str) -> str:
        with haltwise.call_id(f"call_{call}"):
            return await search(call)

    calls = ORDER["value"]
    results = await asyncio.gather(*(one(call) for call in calls))
    paused.set()
    await go_on.wait()
    return dict(zip(calls, results, strict=True))


async def test_call_ids_match_parallel_calls_begun_in_another_order(store_url: str) -> None:
    searches.clear()
    ORDER["value"] = ["a", "b", "c"]
    async with haltwise.Runtime(store_url) as rt:
        await pause_and_cancel(rt, parallel_calls, "ids")
        ORDER["value"] = ["c", "a", "b"]
        outcome = await (await rt.resume("ids")).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.result == {q: f"results for {q}" for q in "abc"}
    assert searches == Counter({"a": 1, "b": 1, "c": 1}), "each call replayed, none repeated"
    assert [s.call_id for s in outcome.steps] == ["call_a", "call_b", "call_c"]


model_calls: Counter[str] = Counter()


async def fake_model(prompt: str) -> dict[str, str]:
    model_calls[prompt] += 1
    return {"answer": f"the answer to {prompt}"}


@haltwise.task(name="concurrent:agent")
async def agent(prompt: str) -> str:
    reply = await haltwise.step(
        fake_model, prompt, name="model", cancel="interruptible", effect="read"
    )
    paused.set()
    await go_on.wait()
    return str(reply["answer"])


async def test_a_model_call_through_step_is_not_asked_again_on_resume(store_url: str) -> None:
    model_calls.clear()
    global go_on, paused
    go_on, paused = Gate(), Gate()
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(agent, "hi", task_id="m")
        await paused.wait()
        await handle.cancel()
        cancelled = await handle.outcome()
        go_on.set()
        assert cancelled.retry is Retry.RESTART, "a read changes nothing in the world"
        assert cancelled.steps[0].tool == "model"
        outcome = await (await rt.resume("m")).outcome()
    assert outcome.state is State.COMPLETED and outcome.result == "the answer to hi"
    assert model_calls == Counter({"hi": 1})
    # Outside a task, step() simply calls the function.
    assert await haltwise.step(fake_model, "x", cancel="interruptible") == {
        "answer": "the answer to x"
    }


# -- partial results inside steps -------------------------------------------------------------

first_attempt = {"value": True}


@haltwise.tool(cancel="interruptible", effect="read")
async def emitting(i: int) -> int:
    haltwise.emit({"tool": i})
    if i == 3 and first_attempt["value"]:
        paused.set()
        await go_on.wait()  # interrupted here in the first attempt, after emitting
    return i


@haltwise.task(name="concurrent:streams")
async def streams() -> int:
    total = 0
    for i in range(5):
        total += await emitting(i)
    await haltwise.aemit("done")
    return total


async def test_partials_emitted_inside_steps_survive_a_cancel_and_resume(store_url: str) -> None:
    first_attempt["value"] = True
    async with haltwise.Runtime(store_url) as rt:
        await pause_and_cancel(rt, streams, "p")
        cancelled = await rt.status("p")
        assert cancelled.partials == tuple({"tool": i} for i in range(4))
        assert cancelled.steps[3].status is StepStatus.INTERRUPTED
        first_attempt["value"] = False
        outcome = await (await rt.resume("p")).outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.partials == (*({"tool": i} for i in range(5)), "done")
    await check_store(store_url)


# -- rollback tools that raise --------------------------------------------------------------

notes: list[str] = []
undo_fails = {"value": False}


def remove_note(text: str) -> None:
    if undo_fails["value"]:
        raise OSError("the undo failed too")
    notes.remove(text)


@haltwise.tool(cancel="rollback", effect="write", compensate=remove_note)
def write_then_fail(text: str) -> None:
    notes.append(text)
    raise RuntimeError("disk full after the write")


@haltwise.task(name="concurrent:half_writes")
async def half_writes() -> None:
    await write_then_fail("n1")


@pytest.mark.parametrize("fails", [False, True], ids=["undone", "undo-fails"])
async def test_a_raising_rollback_tool_is_compensated_first(store_url: str, fails: bool) -> None:
    notes.clear()
    undo_fails["value"] = fails
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(half_writes, task_id="h")).outcome()
    assert outcome.state is State.FAILED
    assert outcome.error is not None and outcome.error.type == "RuntimeError"
    if fails:
        assert outcome.steps[0].status is StepStatus.UNKNOWN
        assert notes == ["n1"]
        assert outcome.retry is Retry.RECONCILE
    else:
        assert outcome.steps[0].status is StepStatus.FAILED
        assert notes == [], "the half-done write was undone"


# -- children, the tool function, the small API ----------------------------------------------


@haltwise.task(name="concurrent:child")
async def small() -> str:
    return "a planted run's result"


@haltwise.task(name="concurrent:parent")
async def big() -> str:
    return await small()


async def test_a_parent_adopts_only_a_child_it_created(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        planted = await (await rt.start(small, task_id="p2/0")).outcome()
        assert planted.state is State.COMPLETED
        outcome = await (await rt.start(big, task_id="p2")).outcome()
        assert outcome.state is State.FAILED
        assert outcome.error is not None and "not created by run 'p2'" in outcome.error.message
        fresh = await (await rt.start(big, task_id="p3")).outcome()
    assert fresh.state is State.COMPLETED and fresh.result == "a planted run's result"


async def test_a_tool_is_a_real_async_function() -> None:
    assert inspect.iscoroutinefunction(kit.charge)
    assert inspect.iscoroutinefunction(kit.charge_plain), "a plain tool is awaited too"
    assert list(inspect.signature(kit.charge).parameters) == ["value"]
    assert kit.charge.__name__ == "charge"
    assert kit.charge.policy.cancel is haltwise.CancelPolicy.FINISH
    assert "Cancellation:" in kit.charge.description
    assert kit.charge.schema("openai")["function"]["name"] == "charge"
    assert kit.charge.schema("mcp")["name"] == "charge"
    assert isinstance(kit.charge, haltwise.Tool)
    assert not isinstance(fake_model, haltwise.Tool)
    kit.release.set()
    assert await kit.charge(1) == "charge-1", "outside a task it just runs"


ids_seen: list[str | None] = []


@haltwise.tool(cancel="interruptible", effect="none")
def whose() -> str | None:
    return haltwise.current_task_id()


@haltwise.task(name="concurrent:who")
async def who() -> list[str | None]:
    return [haltwise.current_task_id(), await whose()]


async def test_current_task_id(store_url: str) -> None:
    assert haltwise.current_task_id() is None
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(who, task_id="me")).outcome()
    assert outcome.result == ["me", "me"]
    with pytest.raises(haltwise.InputError), haltwise.call_id(""):
        pass
