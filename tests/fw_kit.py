"""The tools every framework test gives its agent, with side effects counted and gates to hold them.

``lookup`` is quick. ``GATED[policy]`` is the tool of that cancel policy that announces itself in
flight (``Kit.entered[name]``) and waits for ``Kit.release[name]``, so a test cancels exactly while
it runs, without sleeping. ``effects`` counts each effect when it happens (a gated tool counts on
its way out, so an interrupted call counts nothing); ``undone`` counts compensations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import _wait
import haltwise
from toolkit import Gate

PATIENCE = 30.0


class Kit:
    """Counters and gates, fresh for every test (see :func:`reset`)."""

    effects: Counter[str] = Counter()
    undone: Counter[str] = Counter()
    entered: dict[str, Gate] = {}
    release: dict[str, Gate] = {}


def reset() -> None:
    Kit.effects = Counter()
    Kit.undone = Counter()
    Kit.entered = {name: Gate() for name in GATED_NAMES}
    Kit.release = {name: Gate() for name in GATED_NAMES}


async def _held(name: str, value: str) -> str:
    Kit.entered[name].set()
    await Kit.release[name].wait(timeout=PATIENCE)
    Kit.effects[name] += 1
    return value


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup(item: str) -> str:
    """Look an item up."""
    Kit.effects["lookup"] += 1
    return f"{item} costs 5"


@haltwise.tool(cancel="interruptible", effect="read")
async def browse(item: str) -> str:
    """Browse a shop for an item (slow)."""
    return await _held("browse", f"{item} found")


@haltwise.tool(cancel="finish", effect="external", grace=20)
async def charge(amount: int) -> str:
    """Charge the card."""
    return await _held("charge", f"charged {amount}")


def _undo_reserve(item: str) -> None:
    Kit.undone["reserve"] += 1


@haltwise.tool(cancel="rollback", effect="write", compensate=_undo_reserve, grace=20)
async def reserve(item: str) -> str:
    """Reserve an item."""
    return await _held("reserve", f"reserved {item}")


#: the gated tool of each cancel policy, and the arguments a model passes it
GATED: dict[str, tuple[haltwise.Tool[..., Any], dict[str, Any]]] = {
    "interruptible": (browse, {"item": "tea"}),
    "finish": (charge, {"amount": 5}),
    "rollback": (reserve, {"item": "tea"}),
}
GATED_NAMES = [tool.name for tool, _ in GATED.values()]
ALL_TOOLS = [lookup, browse, charge, reserve]


async def until(condition: Callable[[], bool]) -> None:
    """Wait (polling, with a deadline) until ``condition()`` holds (``_wait.until``)."""
    await _wait.until(condition, timeout=PATIENCE)


def statuses(outcome: haltwise.Outcome) -> list[tuple[str, str]]:
    """The run's steps as ``(tool, status)`` pairs."""
    return [(step.tool, step.status.value) for step in outcome.steps]


#: the status a gated call of each policy has after a (not forced) cancel while it runs
CANCELLED_STATUS = {
    "interruptible": "interrupted",
    "finish": "committed",
    "rollback": "compensated",
}
#: how often the gated tool's effect happened after a cancel and a resume, per policy
EFFECTS_AFTER_RESUME = {"interruptible": 1, "finish": 1, "rollback": 1}


# -- the scenarios every framework test runs, with the framework's own script ---------------------

#: the steps of the normal run: lookup, then charge, then the answer
NORMAL_STEPS = [
    ("model", "committed"),
    ("lookup", "committed"),
    ("model", "committed"),
    ("charge", "committed"),
    ("model", "committed"),
]


async def normal_run(store: str, task: haltwise.Task[..., Any]) -> haltwise.Outcome:
    """Run ``task("buy tea")`` with every gate open: one step per model request and tool call."""
    for gate in Kit.release.values():
        gate.set()
    async with haltwise.Runtime(store) as runtime:
        outcome = await (await runtime.start(task, "buy tea", task_id="n1")).outcome()
    assert outcome.state is haltwise.State.COMPLETED, outcome
    assert outcome.result == "bought tea"
    assert statuses(outcome) == NORMAL_STEPS
    assert Kit.effects == {"lookup": 1, "charge": 1}
    return outcome


async def cancel_in_tool_then_resume(
    store: str, task: haltwise.Task[..., Any], policy: str, last_answer_only: Callable[[], None]
) -> haltwise.Outcome:
    """Cancel inside the gated tool of ``policy``, then resume with ``last_answer_only()``'s
    script (only the final answer): the tool settles by its policy, nothing is repeated."""
    gated, _ = GATED[policy]
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(task, "buy tea", task_id="p1")
        await Kit.entered[gated.name].wait(timeout=PATIENCE)
        await handle.cancel(reason="user")
        Kit.release[gated.name].set()  # a finish call may end now; the others were interrupted
        cancelled = await handle.outcome()
        assert cancelled.state is haltwise.State.CANCELLED, cancelled
        assert cancelled.reason == "user"
        assert statuses(cancelled) == [*NORMAL_STEPS[:3], (gated.name, CANCELLED_STATUS[policy])]
        last_answer_only()
        resumed = await (await runtime.resume("p1")).outcome()
    assert resumed.state is haltwise.State.COMPLETED, resumed
    assert resumed.result == "bought tea"
    assert Kit.effects == {"lookup": 1, gated.name: 1}
    assert Kit.undone == ({"reserve": 1} if policy == "rollback" else {})
    assert statuses(resumed)[-2:] == [(gated.name, "committed"), ("model", "committed")]
    return resumed


async def cancel_while_answering(
    store: str, task: haltwise.Task[..., Any], answering: Gate, last_answer_only: Callable[[], None]
) -> haltwise.Outcome:
    """Cancel while the model is answering (``answering`` set by the script): it lands at once;
    the resume asks the model (``last_answer_only()``'s script) again."""
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(task, "buy tea", task_id="m1")
        await answering.wait(timeout=PATIENCE)
        await handle.cancel(reason="user")
        outcome = await handle.outcome()
        assert outcome.state is haltwise.State.CANCELLED
        assert statuses(outcome) == [("model", "interrupted")]
        last_answer_only()
        resumed = await (await runtime.resume("m1")).outcome()
    assert resumed.result == "bought tea"
    return resumed


#: the three calls of the parallel turn: (tool, arguments, call id)
PARALLEL_CALLS = [
    ("lookup", {"item": "tea"}, "p-lookup"),
    ("charge", {"amount": 5}, "p-charge"),
    ("browse", {"item": "tea"}, "p-browse"),
]


async def parallel_calls_cancelled(
    store: str, task: haltwise.Task[..., Any], last_answer_only: Callable[[], None]
) -> haltwise.Outcome:
    """The model's first turn makes :data:`PARALLEL_CALLS` at once; cancel while charge
    (finish) and browse (interruptible) are both in flight, then resume by call id."""
    async with haltwise.Runtime(store) as runtime:
        handle = await runtime.start(task, "buy tea", task_id="par")
        await Kit.entered["charge"].wait(timeout=PATIENCE)
        await Kit.entered["browse"].wait(timeout=PATIENCE)
        await handle.cancel(reason="user")
        Kit.release["charge"].set()
        cancelled = await handle.outcome()
        assert cancelled.state is haltwise.State.CANCELLED, cancelled
        assert sorted(statuses(cancelled)) == [
            ("browse", "interrupted"),
            ("charge", "committed"),
            ("lookup", "committed"),
            ("model", "committed"),
        ]
        Kit.release["browse"].set()
        last_answer_only()
        resumed = await (await runtime.resume("par")).outcome()
    assert resumed.result == "bought tea"
    assert Kit.effects == {"lookup": 1, "charge": 1, "browse": 1}
    return resumed


def assert_host_cancel_honoured_finish(outcome: haltwise.Outcome) -> None:
    """The framework's own cancel while charge (finish) ran: a haltwise cancel, reason host,
    the charge finished and journaled, nothing done twice."""
    assert outcome.state is haltwise.State.CANCELLED, outcome
    assert outcome.reason == "host"
    assert statuses(outcome)[-1] == ("charge", "committed")
    assert Kit.effects == {"lookup": 1, "charge": 1}
