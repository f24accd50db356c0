"""Concurrent calls of one kind of store operation, made as one statement each round.

Many runs started together make the same operation at the same moment (a hundred runs' creation,
say). Each as a statement of its own costs the server a parse, a plan and an executor start
per run and the client a pooled connection per run; a :class:`Coalescer` makes them one
statement instead: the calls made while the event loop runs its ready callbacks (every run
started in one go) are taken together once those callbacks have run, and the calls made while
that statement is under way form the next one, made at once if fewer than ``rounds``
statements are under way (two halves of a hundred runs ending apart: the second half's
statement need not wait for the first's), else once one returns. One call alone is not
delayed beyond that (its statement starts in the next turn of the loop).

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
    submitted meanwhile, up to ``rounds`` statements at a time, and ``one(item)`` for an item
    alone (a round of one, or the retry of a round that failed). Two rounds under way at once
    may hold calls of the same run: only for calls that are each right whatever the other
    does meanwhile (a read; a write applied only if the row is still the version it was
    planned from). Methods are called on one event loop."""

    def __init__(
        self,
        many: Callable[[Sequence[_I]], Awaitable[Sequence[_R]]],
        one: Callable[[_I], Awaitable[_R]],
        rounds: int = 1,
    ) -> None:
        self._many = many
        self._one = one
        self._rounds = rounds
        self._queue: list[tuple[_I, asyncio.Future[_R]]] = []
        #: a drain made and not yet started (it takes every call queued until it starts)
        self._starting: asyncio.Task[None] | None = None
        #: the drains made and not yet ended
        self._drains: set[asyncio.Task[None]] = set()

    async def submit(self, item: _I) -> _R:
        """``item``'s result, once the statement holding it has returned. A caller cancelled
        while waiting stops waiting; its call is still made (or fails) with the others (its
        future is then cancelled, and its result dropped: no shield needed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_R] = loop.create_future()
        self._queue.append((item, done))
        if self._starting is None and len(self._drains) < self._rounds:
            self._starting = task = loop.create_task(self._drain())
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        return await done

    async def wait(self) -> None:
        """Return once no call is queued or under way."""
        while self._drains:
            await asyncio.shield(next(iter(self._drains)))

    async def _drain(self) -> None:
        self._starting = None  # a call queued from now on may start another drain
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
