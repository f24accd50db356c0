"""A streamed model request as one step from its start, its events passed on as they come.

A step's body is a coroutine: it returns once, with the value to journal. A streamed request
returns many events to a consumer (the framework's run loop) while it runs. So the step runs in
a task of its own (the asyncio seam of the integrations: the frameworks are asyncio, and an
async generator cannot hold an anyio task group open across its yields), and its body hands
each event of the model's stream to the consumer through an unbounded in-memory channel.

- The step (``interruptible``, ``read``) begins before the model is asked, so a cancel while
  the model streams lands at once and settles it ``interrupted``; the consumer then sees the
  cancellation the step raised.
- It is journaled when the model's stream has ended, with the value the body returns (the
  complete response as JSON).
- A replay (the step committed in the journal) yields no event: :attr:`StreamedStep.value` is
  the journaled value and :attr:`StreamedStep.replayed` is True, and the adapter hands the
  framework the complete response rebuilt from it, without asking the model.
- When the consumer stops early (a framework's own cancel of its task, or it closes the
  stream), a body still streaming is cancelled (a host cancel of that step: it settles
  ``interrupted``), and the consumer waits for the step to settle before it goes on: a step is
  never left running behind it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Generic, TypeVar, final

import anyio

from ._common import MODEL_STEP, model_request

__all__ = ["StreamedStep"]

E = TypeVar("E")


@final
class StreamedStep(Generic[E]):
    """One streamed model request of the current run (see the module docstring).

    ``body(emit)`` asks the model, calls ``emit(event)`` for each event of its stream as it
    arrives, and returns the JSON value to journal once the stream has ended. ``request`` is
    what the model is asked, fingerprinted as ``model_request`` does. Iterate
    :meth:`events` once; afterwards :attr:`value` holds the journaled value and
    :attr:`replayed` says whether it came from the journal (no event was yielded then).
    """

    def __init__(
        self,
        body: Callable[[Callable[[E], None]], Awaitable[Any]],
        *,
        name: str = MODEL_STEP,
        request: Any = None,
        model: Any = None,
    ) -> None:
        self._body = body
        self._name = name
        self._request = request
        self._model = model
        self._streaming = False
        self.value: Any = None
        self.replayed = True

    async def events(self) -> AsyncGenerator[E, None]:
        """The model's events as they arrive; what the step raised, once they stop. Iterate it
        under ``contextlib.aclosing`` so that a consumer leaving early stops the step at once."""
        send, receive = anyio.create_memory_object_stream[E](math.inf)

        async def ask() -> Any:
            self.replayed, self._streaming = False, True
            try:
                return await self._body(send.send_nowait)
            finally:
                self._streaming = False

        async def request() -> Any:
            with send:
                return await model_request(
                    ask, name=self._name, request=self._request, model=self._model
                )

        step = asyncio.ensure_future(request())
        try:
            with receive:
                async for event in receive:
                    yield event
        except BaseException:
            # The consumer was cancelled or closed the stream: stop the model, let it settle.
            if self._streaming:
                step.cancel()
            await _settled(step)
            raise
        # The channel closed: the step has returned (or raised); a cancel of the consumer now
        # must not reach it.
        self.value = await asyncio.shield(step)


async def _settled(step: asyncio.Future[Any]) -> None:
    """Wait until ``step`` is done, whatever cancels the waiter meanwhile (its outcome is left
    in ``step``): the consumer re-raises the cancellation it was given once the step settled."""
    while not step.done():
        try:
            with anyio.CancelScope(shield=True):
                await asyncio.wait({step})
        except asyncio.CancelledError:
            continue
    if not step.cancelled():
        step.exception()  # retrieved: a step that failed while cancelled is not logged as lost
