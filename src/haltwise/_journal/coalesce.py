"""Concurrent calls of one kind of store operation, made as one statement each round.

Many runs started together make the same operation at the same moment (a hundred runs' creation,
say). Each as a statement of its own costs the server a parse, a plan and an executor start
per run and the client a pooled connection per run; a :class:`Coalescer` makes them one
statement instead: the calls made while the event loop runs its ready callbacks (every run
started in one go) are taken together once those callbacks have run, and the calls made while
that statement is under way form the next one. One call alone is not delayed beyond that
(its statement starts in the next turn of the loop).

Each caller waits for the statement that holds its own call and gets its own result, so what
its coroutine's return promised (a durable write, say) is as true as with a statement of its
own. If a statement fails as a whole, each of its calls is made again alone, so that one bad
call fails only its own caller (with the error it would have had alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .._core.exceptions import StoreError

_I = TypeVar("_I")
_R = TypeVar("_R")


class Coalescer(Generic[_I, _R]):
    """Calls ``many(items)`` (which returns one result per item, in order) for the items
    submitted meanwhile, one statement at a time, and ``one(item)`` for an item alone (a round
    of one, or the retry of a round that failed). Methods are called on one event loop."""

    def __init__(
        self,
        many: Callable[[Sequence[_I]], Awaitable[Sequence[_R]]],
        one: Callable[[_I], Awaitable[_R]],
    ) -> None:
        self._many = many
        self._one = one
        self._queue: list[tuple[_I, asyncio.Future[_R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: _I) -> _R:
        """``item``'s result, once the statement holding it has returned. A caller cancelled
        while waiting stops waiting; its call is still made (or fails) with the others (its
        future is then cancelled, and its result dropped: no shield needed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_R] = loop.create_future()
        self._queue.append((item, done))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await done

    async def wait(self) -> None:
        """Return once no call is queued or under way."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        batch: list[tuple[_I, asyncio.Future[_R]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._round(batch)
        except BaseException:  # cancelled (the loop closing): no caller waits forever
            for _, done in (*batch, *self._queue):
                if not done.done():
                    done.set_exception(
                        StoreError("the store stopped before the operation was made")
                    )
            raise
        finally:
            self._task = None

    async def _round(self, batch: list[tuple[_I, asyncio.Future[_R]]]) -> None:
        if len(batch) > 1:
            try:
                results = await self._many([item for item, _ in batch])
            except Exception:  # each call again alone: its own error, if any
                pass
            else:
                for (_, done), result in zip(batch, results, strict=True):
                    _resolve(done, result)
                return
        for item, done in batch:
            try:
                result = await self._one(item)
            except Exception as error:  # the caller's own error, raised where it waits
                if not done.done():
                    done.set_exception(error)
            else:
                _resolve(done, result)


def _resolve(done: asyncio.Future[_R], result: _R) -> None:
    if not done.done():
        done.set_result(result)
