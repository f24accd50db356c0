"""``Coalescer``: calls made meanwhile as one statement, and how many statements at once.

The statements here are coroutines that record the calls they were given and, for the call
``"held"``, wait for a gate: the coalescer is the thing under test, the store's statements are
exercised with it in tests/journal/test_store_contract.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import anyio
import pytest

from haltwise._journal.coalesce import Coalescer

pytestmark = pytest.mark.anyio


class Statements:
    """A ``many`` and a ``one`` that upper-case their calls; a round holding ``"held"`` waits
    for :attr:`gate`."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def many(self, items: Sequence[str]) -> list[str]:
        return await self._made(list(items))

    async def one(self, item: str) -> str:
        return (await self._made([item]))[0]

    async def _made(self, items: list[str]) -> list[str]:
        self.rounds.append(items)
        if "held" in items:
            self.started.set()
            await self.gate.wait()
        return [item.upper() for item in items]


@pytest.mark.parametrize("rounds", [1, 2])
async def test_a_call_made_while_a_statement_is_under_way_waits_only_with_one_round(
    rounds: int,
) -> None:
    statements = Statements()
    coalescer = Coalescer(statements.many, statements.one, rounds=rounds)
    held = asyncio.ensure_future(coalescer.submit("held"))
    with anyio.fail_after(10):
        await statements.started.wait()
    later = asyncio.ensure_future(coalescer.submit("later"))
    also = asyncio.ensure_future(coalescer.submit("also"))  # queued with it: the same round
    if rounds == 2:  # the second statement is made at once, and returns first
        with anyio.fail_after(10):
            assert await asyncio.gather(later, also) == ["LATER", "ALSO"]
        assert not held.done()
    statements.gate.set()
    with anyio.fail_after(10):
        assert await asyncio.gather(held, later, also) == ["HELD", "LATER", "ALSO"]
        await coalescer.wait()
    assert statements.rounds == [["held"], ["later", "also"]]


async def test_no_more_statements_at_once_than_rounds() -> None:
    statements = Statements()
    coalescer = Coalescer(statements.many, statements.one, rounds=2)
    first = asyncio.ensure_future(coalescer.submit("held"))
    with anyio.fail_after(10):
        await statements.started.wait()
    statements.started.clear()
    second = asyncio.ensure_future(coalescer.submit("held"))
    with anyio.fail_after(10):
        await statements.started.wait()  # two rounds under way, both held
    third = asyncio.ensure_future(coalescer.submit("third"))
    for _ in range(20):  # loop turns enough for a third statement to start, were it allowed
        await asyncio.sleep(0)
    assert statements.rounds == [["held"], ["held"]] and not third.done()
    statements.gate.set()
    with anyio.fail_after(10):
        assert await asyncio.gather(first, second, third) == ["HELD", "HELD", "THIRD"]
        await coalescer.wait()
    assert statements.rounds == [["held"], ["held"], ["third"]]
