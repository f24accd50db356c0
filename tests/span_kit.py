"""The tasks and tools of tests/runtime/test_spans.py, importable by the processes it starts."""

from __future__ import annotations

from typing import Any

import anyio

import haltwise
import toolkit

#: An argument value no span attribute may hold.
SECRET_ARG = "card-4242-secret"


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup(card: str) -> str:
    return f"found {len(card)}"


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.01)
async def too_slow() -> None:
    await anyio.sleep(5)


@haltwise.tool(cancel="interruptible", effect="read", retries=1, backoff=(0.0, 1.0, 0.0))
async def flaky(counter: list[int]) -> str:
    toolkit.calls["flaky"] += 1
    if toolkit.calls["flaky"] == 1:
        raise RuntimeError("first try fails")
    return "ok"


@haltwise.task(name="span_kit:paying")
async def paying(tool_name: str) -> Any:
    await lookup(SECRET_ARG)
    return await toolkit.TOOLS[tool_name](SECRET_ARG)


@haltwise.task(name="span_kit:boom")
async def boom() -> None:
    await lookup(SECRET_ARG)
    raise ValueError("broken on purpose")


@haltwise.task(name="span_kit:timing_out")
async def timing_out() -> str:
    try:
        await too_slow()
    except haltwise.StepTimeoutError:
        return "timed out"
    return "never"


@haltwise.task(name="span_kit:retrying")
async def retrying() -> str:
    return await flaky([])
