"""``Runtime.changes()``: where the feed starts, and that a mark misses nothing.

``since=None`` means "from the feed's first iteration": the first step of ``async for`` reads
the store's newest change number, so a change committed between the call and that step is not
yielded. A ``since`` mark (the ``seq`` of a change seen) starts exactly after it.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import Change

pytestmark = pytest.mark.anyio


@haltwise.task(name="changes:noop")
async def noop() -> str:
    return "ok"


async def finished(runtime: haltwise.Runtime, run_id: str) -> None:
    handle = await runtime.start(noop, task_id=run_id)
    await handle.outcome()


async def first_change(feed: Any, seen: list[Change], got: anyio.Event) -> None:
    async with aclosing(feed) as changes:
        async for change in changes:
            seen.append(change)
            got.set()
            return


async def test_from_now_starts_at_the_first_iteration_not_at_the_call(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as runtime:
        feed = runtime.changes()
        await finished(runtime, "before")  # after the call, before the first iteration
        seen: list[Change] = []
        got = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(first_change, feed, seen, got)
            with anyio.fail_after(60):
                attempt = 0
                while not got.is_set():  # runs until the feed has read its start and sees one
                    await finished(runtime, f"after-{attempt}")
                    attempt += 1
                    with anyio.move_on_after(0.2):
                        await got.wait()
        assert seen[0].run_id.startswith("after-"), seen[0]


async def test_a_mark_misses_nothing_committed_after_it(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as runtime:
        await finished(runtime, "first")
        mark = None
        async with aclosing(runtime.changes(0, run_id="first")) as changes:  # type: ignore[type-var]
            async for change in changes:
                mark = change.seq  # the first run's last change is its final transition
                if change.status == "completed":
                    break
        assert mark is not None
        await finished(runtime, "second")  # committed before the feed below is iterated
        runs = []
        async with aclosing(runtime.changes(mark)) as changes:  # type: ignore[type-var]
            with anyio.fail_after(60):
                async for change in changes:
                    assert change.seq > mark
                    runs.append(change.run_id)
                    if change.run_id == "second" and change.status == "completed":
                        break
        assert set(runs) == {"second"}
